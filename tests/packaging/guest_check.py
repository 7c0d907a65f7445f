"""The check run inside the systemd guest (``tests/packaging/systemdguest.py``).

Run by ``pvestord-check.service`` once pvestord and qmeventd-py are up, with
Debian's python3 and nothing of ours but ``tests.harness.qemu`` (copied in):

1. what systemd says of both units and of the stand-in qmeventd.service at
   boot (state, restarts, status text, enablement, when they became active),
   then the admin's hand-over of the event socket (mask qmeventd, enable
   qmeventd-py, both --now) and the units after it;
2. a thin disk growing under the services: a VG on the second virtio disk, a
   qcow2 on a small LV of the thin storage in /etc/pve/storage.cfg, a QEMU
   started as qemu-server starts one (pidfile and QMP socket under
   /var/run/qemu-server, a monitor connected to /var/run/qmeventd.sock), the
   write threshold armed by pvestord, writes past it, the LV extended;
3. the journal's structured fields for the VM;
4. the package's life cycle on the node, each step by dpkg as apt runs it:
   an upgrade (the same .deb again), a removal, a fresh install with
   qmeventd unmasked, and a purge; after each, which units run, who listens
   on the event socket, and what is left of the package.

Everything it saw goes into one JSON line on /dev/ttyS1, which the host
captures; the host asserts. A step that fails is reported with its error,
never papered over.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tests.harness.qemu import Disk, QemuVM

REPORT_PORT = "/dev/ttyS1"
REPORT_PREFIX = "PVESTORD-CHECK "
UNITS = ("pvestord.service", "qmeventd-py.service")
#: The stand-in for Proxmox's qmeventd (systemdguest.QMEVENTD_UNIT).
QMEVENTD = "qmeventd.service"
SHOW_PROPERTIES = ("ActiveState", "SubState", "NRestarts", "StatusText", "UnitFileState",
                   "Result", "MainPID", "ActiveEnterTimestampMonotonic", "NotifyAccess",
                   "WatchdogUSec")

EVENT_SOCKET = "/var/run/qmeventd.sock"
#: The .deb the host put in the guest (systemdguest.GUEST_DEB).
DEB = "/opt/pvestord-check/pvestord.deb"
#: dpkg under emulation: unpacking and byte-compiling the package.
DPKG_TIMEOUT = 300.0
#: Files of the package that a purge removes (a conffile and the private modules).
PACKAGE_FILES = ("/etc/lvm/profile/pvestord.profile", "/usr/lib/pvestord", "/usr/bin/pvestord")
LIFE_CYCLE = (
    ("upgrade", ["dpkg", "-i", DEB]),
    ("remove", ["dpkg", "-r", "pvestord"]),
    ("install", ["dpkg", "-i", DEB]),
    ("purge", ["dpkg", "-P", "pvestord"]),
)

# Must match the storage.cfg the host wrote (test_systemd_boot.STORAGE_CFG).
VG = "pvsd"
PV = "/dev/vdb"
VMID = 101
LV = f"vm-{VMID}-disk-0.qcow2"
MiB = 1024 * 1024
LV_SIZE = 256 * MiB
CHUNK = 256 * MiB
THRESHOLD = LV_SIZE - CHUNK // 2
VIRTUAL = 4096 * MiB
WRITE = 4 * MiB
#: Past the threshold by a quarter chunk, still inside the LV.
WRITTEN = THRESHOLD + CHUNK // 4

COMMAND_TIMEOUT = 120.0
SETTLE_TIMEOUT = 120.0
ARM_TIMEOUT = 120.0
EXTEND_TIMEOUT = 180.0


def sh(argv: Sequence[str], *, timeout: float = COMMAND_TIMEOUT) -> str:
    done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout,  # noqa: S603
                          stdin=subprocess.DEVNULL, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: exit {done.returncode}: {done.stderr.strip()}")
    return done.stdout


def wait_for(what: str, probe: Callable[[], bool], timeout: float) -> float:
    """Seconds until ``probe()`` was true; raises after ``timeout``."""
    start = time.monotonic()
    while not probe():
        if time.monotonic() - start > timeout:
            raise TimeoutError(f"{what}: not within {timeout:.0f} s")
        time.sleep(0.5)
    return time.monotonic() - start


def unit_properties(unit: str) -> dict[str, str]:
    text = sh(["systemctl", "show", "-p", ",".join(SHOW_PROPERTIES), unit])
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def is_enabled(unit: str) -> str:
    """``systemctl is-enabled``'s answer (it exits non-zero for disabled and masked)."""
    done = subprocess.run(["systemctl", "is-enabled", unit], capture_output=True,  # noqa: S603
                          text=True, timeout=COMMAND_TIMEOUT, stdin=subprocess.DEVNULL,
                          check=False)
    return done.stdout.strip()


def hand_over(report: dict[str, Any]) -> None:
    """The admin's switch from qmeventd to qmeventd-py, as docs/operations.md gives it."""
    sh(["systemctl", "mask", "--now", QMEVENTD])
    sh(["systemctl", "enable", "--now", "qmeventd-py.service"])
    report["handed_over_after_s"] = round(wait_for(
        "qmeventd-py active after the hand-over",
        lambda: unit_properties("qmeventd-py.service")["ActiveState"] == "active",
        SETTLE_TIMEOUT), 1)
    report["units_after_hand_over"] = {u: unit_properties(u) for u in (*UNITS, QMEVENTD)}


def journal(unit: str, *matches: str) -> list[dict[str, Any]]:
    text = sh(["journalctl", "--no-pager", "-o", "json", "-u", unit, *matches])
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def children(pid: int) -> list[str]:
    """The command names of ``pid``'s child processes."""
    names = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:  # gone meanwhile
            continue
        # comm is in parentheses and may hold spaces: the fields after it are fixed.
        comm, rest = text[text.index("(") + 1:text.rindex(")")], text[text.rindex(")") + 2:]
        if int(rest.split()[1]) == pid:
            names.append(comm)
    return sorted(names)


def lv_size() -> int:
    out = sh(["lvs", "--noheadings", "--units", "b", "--nosuffix", "-o", "lv_size",
              f"{VG}/{LV}"])
    return int(out.strip())


def grow_a_thin_disk(report: dict[str, Any]) -> None:
    sh(["pvcreate", "-q", PV])
    sh(["vgcreate", "-q", VG, PV])
    sh(["lvcreate", "-q", "-y", "-n", LV, "-L", f"{LV_SIZE}b", VG])
    path = f"/dev/{VG}/{LV}"
    sh(["qemu-img", "create", "-q", "-f", "qcow2", path, str(VIRTUAL)])
    report["lv_size_before"] = lv_size()
    sh(["mkdir", "-p", "/var/run/qemu-server"])
    vm = QemuVM(VMID, "/var/run/qemu-server", disks=[Disk(path, "fmt0", "file0")],
                event_socket="/var/run/qmeventd.sock", log_path=f"/var/log/qemu-{VMID}.log",
                launch_timeout=60.0)
    with vm:
        report["threshold_armed_after_s"] = round(wait_for(
            "write threshold armed by pvestord",
            lambda: vm.named_node("file0")["write_threshold"] == THRESHOLD, ARM_TIMEOUT), 1)
        report["threshold_armed"] = vm.named_node("file0")["write_threshold"]
        errors = []
        for offset in range(0, WRITTEN, WRITE):
            result = vm.write_pattern("fmt0", offset, WRITE, 0x5A, check=False, timeout=60)
            if not result.ok:
                errors.append(f"offset {offset}: {result.error}")
        report["write_errors"] = errors
        report["written"] = WRITTEN
        report["extended_after_s"] = round(wait_for(
            "LV extended", lambda: lv_size() > LV_SIZE, EXTEND_TIMEOUT), 1)
        report["lv_size_after"] = lv_size()
        wait_for("threshold re-armed",
                 lambda: vm.named_node("file0")["write_threshold"] > THRESHOLD, ARM_TIMEOUT)
        report["threshold_rearmed"] = vm.named_node("file0")["write_threshold"]
        report["read_back_ok"] = vm.read_verify("fmt0", 0, WRITTEN, 0x5A)
        report["pvestord_pid_still"] = unit_properties("pvestord.service")["MainPID"]
        # The extension ran in pvestord's lvm shell, which stays for the next.
        report["pvestord_children"] = children(int(report["pvestord_pid_still"]))
        report["queue_after"] = sh(["pvestord", "queue", "list", "--json"]).strip()
    report["qemu_output_tail"] = vm.output[-5:]


def event_socket_listens() -> bool:
    """Whether something accepts connections on qmeventd's socket, as QEMU connects."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
        client.settimeout(5)
        try:
            client.connect(EVENT_SOCKET)
        except OSError:
            return False
    return True


def daemon_processes() -> list[str]:
    """Command lines of pvestord or qmeventd-py processes still running."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            argv = cmdline.read_bytes().split(b"\0")
        except OSError:  # gone meanwhile
            continue
        text = " ".join(a.decode(errors="replace") for a in argv if a)
        if any(Path(a.decode(errors="replace")).name in ("pvestord", "qmeventd-py")
               for a in argv[:2] if a):
            found.append(text)
    return sorted(found)


def package_status() -> str:
    """dpkg's status word for pvestord: installed, config-files, not-installed."""
    done = subprocess.run(["dpkg-query", "-W", "-f=${db:Status-Status}", "pvestord"],
                          capture_output=True, text=True, timeout=COMMAND_TIMEOUT,
                          stdin=subprocess.DEVNULL, check=False)
    return done.stdout.strip() or "not-installed"


def units_settled() -> bool:
    return all(unit_properties(u)["ActiveState"] not in ("activating", "deactivating",
                                                         "reloading")
               for u in (*UNITS, QMEVENTD))


def life_cycle(report: dict[str, Any]) -> None:
    """Upgrade, remove, install and purge the package as apt would, and after
    each what the node is left with."""
    steps = report["life_cycle"] = []
    for name, argv in LIFE_CYCLE:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=DPKG_TIMEOUT,  # noqa: S603
                              stdin=subprocess.DEVNULL, check=False)
        wait_for(f"units settled after {name}", units_settled, SETTLE_TIMEOUT)
        step: dict[str, Any] = {
            "step": name, "returncode": done.returncode,
            "output": (done.stdout + done.stderr).splitlines()[-20:],
            "units": {u: unit_properties(u) for u in (*UNITS, QMEVENTD)},
            "is_enabled": {u: is_enabled(u) for u in (*UNITS, QMEVENTD)},
            "package": package_status(),
            "files_left": [f for f in PACKAGE_FILES if Path(f).exists()],
            "daemon_processes": daemon_processes(),
        }
        try:
            wait_for(f"a listener on {EVENT_SOCKET} after {name}", event_socket_listens,
                     SETTLE_TIMEOUT)
            step["event_socket_listens"] = True
        except TimeoutError:
            step["event_socket_listens"] = False
        steps.append(step)


def extension_fields(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    keep = ("MESSAGE", "VMID", "BLOCK_NODE", "LV", "VG", "OLD_SIZE", "NEW_SIZE", "DURATION_MS",
            "REASON", "PRIORITY", "SYSLOG_IDENTIFIER", "_SYSTEMD_UNIT")
    return [{k: e[k] for k in keep if k in e} for e in entries]


def main() -> int:
    report: dict[str, Any] = {"errors": []}
    try:
        report["uptime_at_check_s"] = float(Path("/proc/uptime").read_text().split()[0])
        report["pid1"] = Path("/proc/1/comm").read_text().strip()
        # After= both units: they are active (READY=1 seen) or have failed;
        # wait out any restart in progress.
        wait_for("units settled", lambda: all(
            unit_properties(u)["ActiveState"] not in ("activating", "reloading")
            for u in UNITS), SETTLE_TIMEOUT)
        report["units_at_boot"] = {u: unit_properties(u) for u in (*UNITS, QMEVENTD)}
        report["is_enabled_at_boot"] = {u: is_enabled(u) for u in (*UNITS, QMEVENTD)}
        hand_over(report)
        report["is_enabled"] = {u: is_enabled(u) for u in (*UNITS, QMEVENTD)}
    except Exception:
        report["errors"].append(traceback.format_exc())
    try:
        grow_a_thin_disk(report)
    except Exception:
        report["errors"].append(traceback.format_exc())
    try:
        report["units_after"] = {u: unit_properties(u) for u in UNITS}
        # pvestord logs the extension after lvextend returns: let it land.
        wait_for("extension in the journal", lambda: any(
            "NEW_SIZE" in e for e in journal("pvestord.service", f"VMID={VMID}")), 60)
        report["journal_vmid"] = extension_fields(
            journal("pvestord.service", f"VMID={VMID}"))
        report["journal_qmeventd_vmid"] = extension_fields(
            journal("qmeventd-py.service", f"VMID={VMID}"))[-5:]
        report["pvestord_messages"] = [str(e.get("MESSAGE", ""))
                                       for e in journal("pvestord.service")]
    except Exception:
        report["errors"].append(traceback.format_exc())
    for unit in UNITS:
        report.setdefault("journal_tail", {})[unit] = sh(
            ["journalctl", "--no-pager", "-o", "short-monotonic", "-n", "30", "-u", unit])
    try:
        life_cycle(report)
    except Exception:
        report["errors"].append(traceback.format_exc())
    line = REPORT_PREFIX + json.dumps(report, sort_keys=True) + "\n"
    with open(REPORT_PORT, "w") as port:
        port.write(line)
    print(line, flush=True)
    return 1 if report["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
