"""Debian 13 (Proxmox VE 9) with systemd as PID 1 and our package installed, booted under QEMU.

Unlike the node guest (``tests/harness/nodeguest.py``: virtme-ng, a root
shared read-only, a shell as PID 1), this guest boots its own root file
system, so systemd runs as PID 1 and starts the units the package enabled,
exactly as on a Proxmox node after a reboot.

Three layers, each made from the one before:

1. ``debroot.base_root(debroot.TRIXIE)``: debootstrap's Debian 13 minbase, cached.
2. :func:`systemd_root`: a copy with :data:`PACKAGES` installed by apt, Debian
   13's kernel and initrd among them, cached under ``/var/cache/pvestord-test/``
   keyed by the package list and the base root, so only the first run
   downloads and installs.
3. :func:`node_image`: per run, a copy of (2) with a stand-in for Proxmox's
   ``qmeventd.service`` installed and enabled first (as on every Proxmox
   node), then the freshly built .deb installed by ``dpkg -i`` in a chroot
   (its postinst enables pvestord.service, and leaves qmeventd-py.service
   disabled because qmeventd is not masked), the in-guest check, its unit and
   the .deb itself (the check upgrades, removes and purges it), made into an
   ext4 image by ``mkfs.ext4 -d`` (no loop mount).

:func:`boot` runs the root's own kernel and initrd with
``init=/lib/systemd/systemd`` on that image, a blank second disk for the
volume group, the console on the first serial port and the check's one-line
JSON report on the second; the check unit powers the guest off when it is
done. TCG unless the machine has real hardware KVM.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import subprocess
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pvestord.adapters.command import run
from tests.harness import debroot
from tests.harness.nodeguest import BLACKLIST, hardware_kvm_usable

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]

#: What a Proxmox node has that the test needs: systemd as init, udev (LVM
#: waits on it), kmod (dm-mod is loaded on demand), Debian 13's kernel (its
#: initrd has virtio_blk and ext4; its modules are in the root), QEMU for a
#: VM, and the package's own dependencies so that ``dpkg -i`` needs no network.
PACKAGES = (
    "systemd", "systemd-sysv", "udev", "kmod", "procps", "linux-image-amd64",
    "lvm2", "qemu-utils", "qemu-system-x86", "seabios",
    "python3", "python3-systemd", "python3-pyinotify", "python3-pyasyncore",
)
RELEASE = debroot.TRIXIE

#: Copying the prepared root, ``dpkg -i``, ``mkfs.ext4 -d``.
IMAGE_TIMEOUT = 600.0
#: Free space left in the root image beyond its files.
IMAGE_SLACK = 512 * 1024 * 1024
#: The second disk, the volume group's only PV (sparse).
VG_DISK_SIZE = 2 * 1024 * 1024 * 1024

CHECK_DIR = "/opt/pvestord-check"
CHECK_UNIT = "pvestord-check.service"
#: The .deb in the guest, for the check's upgrade, removal and purge.
GUEST_DEB = f"{CHECK_DIR}/pvestord.deb"
#: The prefix of the check's report line on the second serial port.
REPORT_PREFIX = "PVESTORD-CHECK "

#: Proxmox's qmeventd comes with qemu-server, which cannot be installed here:
#: this stand-in holds the same socket under the same unit name, so the boot
#: shows whether the package left two enabled units fighting for it.
QMEVENTD_UNIT = "qmeventd.service"
QMEVENTD_SOCKET = "/var/run/qmeventd.sock"
_STANDIN_SERVER = (f"import signal, socket; s = socket.socket(socket.AF_UNIX); "
                   f"s.bind('{QMEVENTD_SOCKET}'); s.listen(); signal.pause()")
_QMEVENTD_STANDIN_TEXT = f"""\
[Unit]
Description=Stand-in for Proxmox's qmeventd (no qemu-server here): listens on its socket
Before=pve-guests.service

[Service]
ExecStartPre=/bin/rm -f {QMEVENTD_SOCKET}
ExecStart=/usr/bin/python3 -c "{_STANDIN_SERVER}"

[Install]
WantedBy=multi-user.target
"""

_CHECK_UNIT_TEXT = f"""\
[Unit]
Description=pvestord systemd test: the units, a thin disk growing, a report on ttyS1
# Starts once both daemons are up (Type=notify: READY=1 received) or failed.
After=pvestord.service qmeventd-py.service
# The guest's work is done either way: power off (an orderly shutdown, which
# stops both daemons) so QEMU exits.
SuccessAction=poweroff
FailureAction=poweroff

[Service]
Type=oneshot
Environment=PYTHONPATH={CHECK_DIR}
ExecStart=/usr/bin/python3 -m tests.packaging.guest_check
StandardOutput=journal+console
StandardError=journal+console
# Longer than the check's own bounded waits can add up to in a slow run (the
# thin disk and the four dpkg steps), shorter than the host's timeout for the
# whole run: a stuck check fails and powers off.
TimeoutStartSec=1800

[Install]
WantedBy=multi-user.target
"""


class SystemdGuestError(Exception):
    """The guest did not boot, did not report, or did not finish in time."""


def kernel_and_initrd(root: Path) -> tuple[Path, Path]:
    """The root's own kernel and the initrd Debian made for it."""
    kernels = sorted((root / "boot").glob("vmlinuz-*-amd64"))
    if not kernels:
        raise SystemdGuestError(f"no kernel in {root}/boot: linux-image-amd64 is in PACKAGES")
    kernel = kernels[-1]
    initrd = kernel.with_name("initrd.img-" + kernel.name.removeprefix("vmlinuz-"))
    if not initrd.is_file():
        raise SystemdGuestError(f"no {initrd} for {kernel}: initramfs-tools did not make it")
    return kernel, initrd


def systemd_root() -> tuple[Path, float | None]:
    """The cached root with PACKAGES; seconds it took (None: cached)."""
    return debroot.derived_root(RELEASE, "systemd", PACKAGES)


@dataclass(frozen=True)
class NodeImage:
    root_image: Path
    vg_disk: Path
    kernel: Path
    initrd: Path


def _directory_bytes(path: Path) -> int:
    total = 0
    for dirpath, _, names in os.walk(path):
        for name in names:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
    return total


def node_image(base: Path, deb: Path, storage_cfg: str, work: Path) -> NodeImage:
    """The per-run root image: ``base`` plus our package, the check and its unit."""
    root = debroot.copy_root(base, work / "root")
    try:
        # Where qemu-server installs it, so that the admin can mask it.
        (root / "usr/lib/systemd/system" / QMEVENTD_UNIT).write_text(_QMEVENTD_STANDIN_TEXT)
        debroot.chroot(root, ["systemctl", "enable", QMEVENTD_UNIT])
        shutil.copy2(deb, root / "tmp" / deb.name)
        # dpkg, not apt: every dependency is in the cached root, and a missing
        # one must fail here rather than be fetched.
        installed = debroot.chroot(root, ["dpkg", "-i", f"/tmp/{deb.name}"],
                                   timeout=IMAGE_TIMEOUT)
        (work / "dpkg-i.log").write_text(installed.stdout + installed.stderr)
        (root / "tmp" / deb.name).unlink()
        check = root / CHECK_DIR.lstrip("/")
        check.mkdir(parents=True)
        # The check imports tests.harness.qemu as in the tree.
        for rel in ("tests/__init__.py", "tests/harness/__init__.py", "tests/harness/qemu.py",
                    "tests/packaging/__init__.py", "tests/packaging/guest_check.py"):
            (check / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / rel, check / rel)
        shutil.copy2(deb, root / GUEST_DEB.lstrip("/"))
        (root / "etc/systemd/system" / CHECK_UNIT).write_text(_CHECK_UNIT_TEXT)
        debroot.chroot(root, ["systemctl", "enable", CHECK_UNIT])
        (root / "etc/pve").mkdir(parents=True, exist_ok=True)
        (root / "etc/pve/storage.cfg").write_text(storage_cfg)
        (root / "etc/hostname").write_text("pvenode1\n")
        (root / "etc/fstab").write_text("/dev/vda / ext4 rw,errors=remount-ro 0 1\n")
        # No login prompt on the console: nobody logs in.
        debroot.chroot(root, ["systemctl", "mask", "serial-getty@ttyS0.service",
                              "getty@tty1.service"])
        image = work / "root.img"
        size = _directory_bytes(root) + IMAGE_SLACK
        run(["mkfs.ext4", "-q", "-F", "-L", "pvenode1", "-d", str(root), str(image),
             f"{size // 1024}k"], timeout=IMAGE_TIMEOUT)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    vg_disk = work / "vg.img"
    with vg_disk.open("wb") as f:
        f.truncate(VG_DISK_SIZE)
    return NodeImage(image, vg_disk, *kernel_and_initrd(base))


@dataclass(frozen=True)
class BootResult:
    returncode: int
    duration: float
    console_log: Path
    report: dict[str, Any]
    #: The guest's persistent journal, copied out of the image after power off.
    journal_dir: Path


def qemu_argv(image: NodeImage, report_path: Path, *, memory: str, cpus: int) -> list[str]:
    append = " ".join([
        "root=/dev/vda", "rw", "init=/lib/systemd/systemd", "console=ttyS0",
        f"modprobe.blacklist={BLACKLIST}", "systemd.show_status=1", "panic=-1",
    ])
    argv = [
        "qemu-system-x86_64", "-machine", "q35", "-m", memory, "-smp", str(cpus),
        "-nodefaults", "-display", "none", "-no-reboot",
        "-kernel", str(image.kernel), "-initrd", str(image.initrd), "-append", append,
        "-drive", f"file={image.root_image},if=virtio,format=raw,cache=unsafe",
        "-drive", f"file={image.vg_disk},if=virtio,format=raw,cache=unsafe",
        "-serial", "stdio",
        "-chardev", f"file,id=report,path={report_path}", "-serial", "chardev:report",
        "-nic", "none",
    ]
    argv[1:1] = ["-accel", "kvm", "-cpu", "host"] if hardware_kvm_usable() else ["-accel", "tcg"]
    return argv


def boot(image: NodeImage, out: Path, *, timeout: float, memory: str = "2G",
         cpus: int = 2, echo: bool = False) -> BootResult:
    """Boot the node, wait for it to power off, and return the check's report."""
    out.mkdir(parents=True, exist_ok=True)
    console_log = out / "console.log"
    report_path = out / "report.txt"
    report_path.unlink(missing_ok=True)
    argv = qemu_argv(image, report_path, memory=memory, cpus=cpus)
    tail: deque[str] = deque(maxlen=40)
    start = time.monotonic()
    timed_out = False
    # A pipe, not a file, for the console (docs/testing.md, "The node guest": QEMU's file
    # chardevs on an inherited fd garble the log).
    with console_log.open("w") as log, subprocess.Popen(  # noqa: S603 - argument list
        argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        start_new_session=True,
    ) as proc:
        assert proc.stdout is not None
        fd = proc.stdout.fileno()
        pending = b""
        while True:
            ready, _, _ = select.select([fd], [], [], 0.5)
            chunk = os.read(fd, 65536) if ready else b""
            if chunk:
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for raw in lines:
                    line = raw.decode(errors="replace").rstrip("\r")
                    log.write(line + "\n")
                    tail.append(line)
                    if echo:
                        print(line, flush=True)
                log.flush()
            elif ready or proc.poll() is not None:
                break
            if time.monotonic() - start > timeout:
                timed_out = True
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, 9)
                break
        proc.wait(timeout=30)
    duration = time.monotonic() - start
    console = "\n".join(tail)
    if timed_out:
        raise SystemdGuestError(f"guest did not power off within {timeout:.0f} s; killed. "
                                f"Last console lines:\n{console}\n(full console: {console_log})")
    report = read_report(report_path)
    if report is None:
        raise SystemdGuestError(
            f"guest exited ({proc.returncode}) after {duration:.0f} s without a report. "
            f"Last console lines:\n{console}\n(full console: {console_log}; "
            f"command: {' '.join(argv)})")
    return BootResult(proc.returncode, duration, console_log, report,
                      copy_journal(image, out / "journal"))


def copy_journal(image: NodeImage, dest: Path) -> Path:
    """The guest's /var/log/journal, read out of its image with debugfs (no mount)."""
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    run(["debugfs", "-R", f"rdump /var/log/journal {dest}", str(image.root_image)],
        timeout=IMAGE_TIMEOUT)
    return dest / "journal"


def journal_entries(journal_dir: Path, *matches: str) -> list[dict[str, Any]]:
    """``journalctl -o json`` on the guest's journal, read on the host."""
    text = run(["journalctl", "--no-pager", "-o", "json", "-D", str(journal_dir), *matches],
               timeout=IMAGE_TIMEOUT).stdout
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def read_report(path: Path) -> dict[str, Any] | None:
    """The check's JSON report from the second serial port's capture, if any."""
    if not path.is_file():
        return None
    for line in path.read_text(errors="replace").splitlines():
        line = line.strip("\r\n\x00")
        if line.startswith(REPORT_PREFIX):
            report: dict[str, Any] = json.loads(line.removeprefix(REPORT_PREFIX))
            return report
    return None


if __name__ == "__main__":
    path, seconds = systemd_root()
    print(f"{path}: " + ("cached" if seconds is None else f"made in {seconds:.0f} s"))
