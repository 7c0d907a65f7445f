"""The packaged services under a real systemd, as PID 1, on a booted Debian 13 node.

One guest boot per session (``systemdguest.py``): Debian 13's kernel and
initrd from the cached root, ``init=/lib/systemd/systemd``, a root image with systemd, LVM,
QEMU, a stand-in for Proxmox's qmeventd.service (enabled), and the freshly
built .deb installed by dpkg (its postinst enables pvestord and, qmeventd
being unmasked, leaves qmeventd-py disabled; nothing starts them but the
boot). In the guest, a oneshot unit ordered after both services
(``guest_check.py``) records what systemd says of them, hands the event
socket over as docs/operations.md says, grows a thin disk through them (VG
on a second virtio disk, qcow2 on a 256 MiB LV, a QEMU connected to
qmeventd-py's socket, qemu-io writes past the write threshold) and reads
the journal; then it upgrades, removes, reinstalls and purges the package
with dpkg. It reports one JSON line on the second serial port and powers
the guest off. These tests assert on that report.

Cost, measured on the 2-core machine (TCG), three runs: warm cache, ~70 s on
top of the session's .deb build: the image 10-12 s (copy, dpkg -i, mkfs.ext4
-d), the guest 57-72 s from QEMU start to power off (both units active 19-34 s
after the kernel started; the threshold armed ~2 s after the VM started; the
LV extended <1 s after the writes, lvextend 1.7-2.3 s). Cold cache: add the
systemd root, 15-21 s (apt in a chroot; ~75 MB of .debs with debootstrap's,
from this machine's mirror), and debootstrap's own root, 29 s, which
test_install.py needs anyway.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest

from tests.packaging import systemdguest
from tests.packaging.conftest import Figures, needs_root

MiB = 1024 * 1024
#: Whole guest run: boot, the check (its own waits are bounded), power off.
GUEST_TIMEOUT = 35 * 60.0
UNITS = ("pvestord.service", "qmeventd-py.service")

#: What the node's /etc/pve/storage.cfg says (guest_check.py makes the VG).
STORAGE_CFG = """\
lvm: thin1
\tvgname pvsd
\tcontent images
\tpvestord-chunksize 256M
\tpvestord-chunk-percentage 0.5
\tpvestord-initial-size 256M
"""


@pytest.fixture(scope="module")
def node_run(deb: Path, tmp_path_factory: pytest.TempPathFactory,
             figures: Figures) -> systemdguest.BootResult:
    """One boot of the node, to its power off: the check's report and the journal."""
    needs_root()
    root, took = systemdguest.systemd_root()
    figures.values["systemd root (apt)"] = "cached" if took is None else f"{took:.0f} s"
    work = tmp_path_factory.mktemp("systemd-node")
    start = time.monotonic()
    image = systemdguest.node_image(root, deb, STORAGE_CFG, work)
    figures.values["node image (copy, dpkg -i, mkfs.ext4 -d)"] = (
        f"{time.monotonic() - start:.0f} s")
    result = systemdguest.boot(image, work / "out", timeout=GUEST_TIMEOUT)
    figures.values["systemd guest run (boot to power off)"] = f"{result.duration:.0f} s"
    got: dict[str, Any] = result.report
    active = [float(got.get("units_at_boot", {}).get(u, {}).get(
        "ActiveEnterTimestampMonotonic", 0)) / 1e6 for u in UNITS]
    figures.values["units active after boot (monotonic)"] = ", ".join(
        f"{u} {s:.1f} s" for u, s in zip(UNITS, active, strict=True))
    figures.values["systemd guest console"] = str(result.console_log)
    return result


@pytest.fixture(scope="module")
def report(node_run: systemdguest.BootResult) -> dict[str, Any]:
    return node_run.report


def _tails(report: dict[str, Any]) -> str:
    return "\n".join(f"--- {u}\n{t}" for u, t in report.get("journal_tail", {}).items())


def test_every_check_step_ran(report: dict[str, Any]) -> None:
    """A step of the in-guest check that failed, with its traceback."""
    assert report["errors"] == [], "\n".join(report["errors"]) + "\n" + _tails(report)


def test_systemd_is_pid_1(report: dict[str, Any]) -> None:
    assert report["pid1"] == "systemd"


def test_pvestord_started_at_boot_enabled_and_ready(report: dict[str, Any]) -> None:
    """Enabled by the package, started by the boot, READY=1 received, no restart."""
    unit = "pvestord.service"
    assert report["is_enabled_at_boot"][unit] == report["is_enabled"][unit] == "enabled"
    for when in ("units_at_boot", "units_after"):
        props = report[when][unit]
        # Type=notify: "active" only after systemd received READY=1.
        assert (props["ActiveState"], props["SubState"]) == ("active", "running"), (when, props)
        assert props["NRestarts"] == "0", (when, props)
        assert props["WatchdogUSec"] == "30s", props
    assert int(report["units_at_boot"][unit]["ActiveEnterTimestampMonotonic"]) > 0
    # The same process all along: no crash and restart in between.
    assert report["units_at_boot"][unit]["MainPID"] == report["units_after"][unit]["MainPID"]


def test_no_two_units_fight_for_the_event_socket_at_boot(report: dict[str, Any]) -> None:
    """qmeventd.service was enabled and not masked when the package was installed:
    the package left qmeventd-py disabled, so the boot started
    qmeventd alone, with no conflicting start job."""
    assert report["is_enabled_at_boot"]["qmeventd.service"] == "enabled"
    assert report["is_enabled_at_boot"]["qmeventd-py.service"] == "disabled"
    qmeventd = report["units_at_boot"]["qmeventd.service"]
    assert (qmeventd["ActiveState"], qmeventd["SubState"]) == ("active", "running"), qmeventd
    assert qmeventd["NRestarts"] == "0", qmeventd
    ours = report["units_at_boot"]["qmeventd-py.service"]
    assert (ours["ActiveState"], ours["ActiveEnterTimestampMonotonic"]) == ("inactive", "0")


def test_the_documented_hand_over_switches_the_socket(report: dict[str, Any]) -> None:
    """``systemctl mask --now qmeventd`` then ``systemctl enable --now qmeventd-py``
    (docs/operations.md): qmeventd-py enabled, ready and serving; qmeventd masked."""
    assert report["is_enabled"]["qmeventd.service"] == "masked"
    assert report["is_enabled"]["qmeventd-py.service"] == "enabled"
    after = report["units_after_hand_over"]
    assert after["qmeventd.service"]["ActiveState"] == "inactive", after["qmeventd.service"]
    for props in (after["qmeventd-py.service"], report["units_after"]["qmeventd-py.service"]):
        assert (props["ActiveState"], props["SubState"]) == ("active", "running"), props
        assert props["NRestarts"] == "0", props
        assert props["WatchdogUSec"] == "30s", props
    assert (after["qmeventd-py.service"]["MainPID"]
            == report["units_after"]["qmeventd-py.service"]["MainPID"])


def test_pvestord_reports_status(report: dict[str, Any]) -> None:
    status = report["units_after"]["pvestord.service"]["StatusText"]
    assert status.startswith("queue depth 0,"), status


def test_qmeventd_reports_status(report: dict[str, Any]) -> None:
    """``systemctl status qmeventd-py`` says how many QEMUs are connected and
    how many entries it queued (the disk grew, so at least one)."""
    status = report["units_after"]["qmeventd-py.service"]["StatusText"]
    assert re.fullmatch(r"\d+ VM\(s\) connected, [1-9]\d* queue entries added", status), status


def test_thin_disk_grew_under_systemd(report: dict[str, Any]) -> None:
    assert report["lv_size_before"] == 256 * MiB
    # Armed by pvestord's reconcile: LV size - chunksize x chunk-percentage.
    assert report["threshold_armed"] == 128 * MiB
    assert report["write_errors"] == []
    assert report["lv_size_after"] == 512 * MiB
    assert report["threshold_rearmed"] == 512 * MiB - 128 * MiB
    assert report["read_back_ok"] is True
    assert report["queue_after"] == "[]"


def test_the_extension_ran_in_pvestords_lvm_shell(report: dict[str, Any]) -> None:
    """The package's LVM profile is found: the shell runs, no fallback to processes."""
    assert "lvm" in report["pvestord_children"], report["pvestord_children"]
    messages = report["pvestord_messages"]
    assert any("LVM commands in a shell per VG" in m for m in messages), messages
    assert not [m for m in messages if "as separate processes" in m], messages


def test_journal_has_the_extension_with_its_fields(report: dict[str, Any]) -> None:
    """``journalctl -u pvestord VMID=101`` finds the extension, sizes as fields."""
    extensions = [e for e in report["journal_vmid"] if "NEW_SIZE" in e]
    assert extensions, report["journal_vmid"]
    first = extensions[0]
    assert first["_SYSTEMD_UNIT"] == "pvestord.service"
    assert first["SYSLOG_IDENTIFIER"] == "pvestord"
    assert (first["VMID"], first["BLOCK_NODE"], first["VG"]) == ("101", "file0", "pvsd")
    assert first["LV"] == "vm-101-disk-0.qcow2"  # the LV name; VG holds the group
    assert (first["OLD_SIZE"], first["NEW_SIZE"]) == (str(256 * MiB), str(512 * MiB))
    assert int(first["DURATION_MS"]) > 0
    assert first["REASON"] == "threshold"


def test_qmeventd_py_queued_the_threshold_event(report: dict[str, Any]) -> None:
    queued = [e for e in report["journal_qmeventd_vmid"] if e.get("REASON") == "threshold"]
    assert queued, report["journal_qmeventd_vmid"]
    assert queued[0]["_SYSTEMD_UNIT"] == "qmeventd-py.service"
    assert (queued[0]["VMID"], queued[0]["BLOCK_NODE"]) == ("101", "file0")


@pytest.mark.parametrize(("unit", "last_words"), [("pvestord.service", "pvestord stopped"),
                                                  ("qmeventd-py.service", "stopping")])
def test_unit_stopped_cleanly_at_power_off(node_run: systemdguest.BootResult, unit: str,
                                           last_words: str) -> None:
    """The check powered the node off: systemd stopped the daemon with SIGTERM, no kill."""
    entries = systemdguest.journal_entries(node_run.journal_dir, "-u", unit)
    daemon = [e["MESSAGE"] for e in entries if e.get("_SYSTEMD_UNIT") == unit]
    by_systemd = [e["MESSAGE"] for e in entries if e.get("_PID") == "1"]
    assert last_words in daemon, daemon[-5:]
    assert f"{unit}: Deactivated successfully." in by_systemd, by_systemd
    assert not [m for m in by_systemd if "SIGKILL" in m or "timed out" in m or "Killing" in m]


def _step(report: dict[str, Any], name: str) -> dict[str, Any]:
    steps = {s["step"]: s for s in report.get("life_cycle", [])}
    assert name in steps, (sorted(steps), report["errors"])
    step: dict[str, Any] = steps[name]
    assert step["returncode"] == 0, step["output"]
    return step


def _running(step: dict[str, Any], unit: str) -> bool:
    props = step["units"][unit]
    return (props["ActiveState"], props["SubState"]) == ("active", "running")


def test_an_upgrade_restarts_both_daemons_and_keeps_the_hand_over(
        report: dict[str, Any]) -> None:
    """``apt upgrade`` of pvestord: the running daemons run the new code at
    once (new processes, no failure), qmeventd stays masked, and the event
    socket has a listener. An upgrade used to stop both and start neither."""
    step = _step(report, "upgrade")
    for unit in UNITS:
        assert _running(step, unit), step["units"][unit]
        assert step["units"][unit]["MainPID"] != report["units_after"][unit]["MainPID"], unit
    assert step["is_enabled"] == {"pvestord.service": "enabled",
                                  "qmeventd-py.service": "enabled",
                                  "qmeventd.service": "masked"}
    assert step["event_socket_listens"] is True


def test_a_removal_gives_the_event_socket_back_to_qmeventd(report: dict[str, Any]) -> None:
    """``apt remove pvestord`` after the hand-over: both daemons stopped and
    gone, qmeventd unmasked and serving the socket again (``qm cleanup`` and
    vzdump need it), the conffile kept until a purge."""
    step = _step(report, "remove")
    assert step["package"] == "config-files"
    assert step["daemon_processes"] == []
    for unit in UNITS:
        assert step["units"][unit]["ActiveState"] == "inactive", step["units"][unit]
    assert step["is_enabled"]["qmeventd.service"] == "enabled"
    assert _running(step, "qmeventd.service"), step["units"]["qmeventd.service"]
    assert step["event_socket_listens"] is True
    assert step["files_left"] == ["/etc/lvm/profile/pvestord.profile"]
    assert any("unmasked qmeventd.service" in line for line in step["output"]), step["output"]


def test_a_reinstall_beside_qmeventd_leaves_it_the_socket(report: dict[str, Any]) -> None:
    """Installing again where qmeventd is unmasked: qmeventd-py stays disabled,
    nothing is started, qmeventd keeps serving."""
    step = _step(report, "install")
    assert step["package"] == "installed"
    assert step["is_enabled"]["qmeventd-py.service"] == "disabled"
    assert step["is_enabled"]["pvestord.service"] == "enabled"
    assert step["daemon_processes"] == []
    assert _running(step, "qmeventd.service")
    assert step["event_socket_listens"] is True


def test_a_purge_leaves_nothing_of_the_package_and_qmeventd_serving(
        report: dict[str, Any]) -> None:
    step = _step(report, "purge")
    assert step["package"] == "not-installed"
    assert step["files_left"] == []
    assert step["daemon_processes"] == []
    assert _running(step, "qmeventd.service")
    assert step["event_socket_listens"] is True
