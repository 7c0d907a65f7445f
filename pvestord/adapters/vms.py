"""Which VMs run on this node, found as qemu-server leaves them.

qemu-server starts QEMU with ``-pidfile <run_dir>/<vmid>.pid`` and a QMP socket
``<run_dir>/<vmid>.qmp``. A VM runs here when its pidfile names a live process
whose command line still carries that pidfile argument: a bare "pid alive"
check would be fooled by a pid recycled after QEMU died without removing the
file.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from pvestord.policy.proxmox import pidfile_name, pidfile_vmid


@dataclass(frozen=True)
class LocalVm:
    vmid: int
    pid: int
    qmp_socket: Path


def _cmdline(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return [arg.decode(errors="replace") for arg in raw.split(b"\0") if arg]


def local_vm(run_dir: Path, vmid: int) -> LocalVm | None:
    """The VM ``vmid`` if it runs on this node, else None."""
    pidfile = run_dir / pidfile_name(vmid)
    try:
        pid = int(pidfile.read_text().strip())
    except (OSError, ValueError):
        return None
    argv = _cmdline(pid)
    if argv is None or not _names_pidfile(argv, pidfile):
        return None
    return LocalVm(vmid, pid, run_dir / f"{vmid}.qmp")


def _names_pidfile(argv: list[str], pidfile: Path) -> bool:
    wanted = str(pidfile)
    for i, arg in enumerate(argv):
        if arg in ("-pidfile", "--pidfile") and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith(("-pidfile=", "--pidfile=")):
            value = arg.split("=", 1)[1]
        else:
            continue
        if value == wanted or Path(value).resolve() == pidfile.resolve():
            return True
    return False


def local_vms(run_dir: Path) -> Iterator[LocalVm]:
    """Every VM running on this node, by ascending VMID."""
    try:
        names = sorted(p.name for p in run_dir.iterdir())
    except OSError:
        return
    vmids = sorted(vmid for name in names if (vmid := pidfile_vmid(name)) is not None)
    for vmid in vmids:
        vm = local_vm(run_dir, vmid)
        if vm is not None:
            yield vm
