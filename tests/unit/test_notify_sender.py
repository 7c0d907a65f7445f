"""The daemon's events reach Proxmox's notification system, once each.

The real sender (pvestord.adapters.notify) runs the packaged Perl program
(packaging/notify/notify.pl) in a real perl process; ``PVE::Notify`` is a
STAND-IN (tests/unit/standins/PVE/Notify.pm, on PERL5LIB) that records each
``notify()`` call instead of sending it. The events come from the engine's
own parts where they are detected: the storage configuration source (a
vanished section), the status publisher (a capacity crossing), the extender
(a VM seen paused for room, from its QMP run state), the pass
deadline (a VG marked unhealthy).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from pvestord.adapters import keptsections, vgspace
from pvestord.adapters.config import parse_storage_config
from pvestord.adapters.notify import Notifier
from pvestord.adapters.qmp import RunState
from pvestord.adapters.settings import DaemonSettings
from pvestord.engine import publisher, status
from pvestord.engine.configsource import StorageConfigSource
from pvestord.engine.extender import Extender
from pvestord.engine.memory import Notices
from pvestord.engine.passes import Passes
from pvestord.policy import BlockDevice, capacity
from pvestord.policy.notices import VmPaused

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "packaging" / "notify" / "notify.pl"
STANDINS = Path(__file__).resolve().parent / "standins"
SECTION = "pvestord: thin1\n\tvgname vg1\n\tshared 1\n\tpvestord-chunksize 2G\n"
OTHERS = "dir: local\n\tpath /var/lib/vz\n"
GiB = 1 << 30


@pytest.fixture
def sent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The stand-in's record of notify() calls."""
    record = tmp_path / "notify.jsonl"
    monkeypatch.setenv("PERL5LIB", str(STANDINS))
    monkeypatch.setenv("PVESTORD_TEST_NOTIFY_LOG", str(record))
    return record


def calls(record: Path) -> list[dict[str, Any]]:
    if not record.exists():
        return []
    return [json.loads(line) for line in record.read_text().splitlines()]


def rewrite(path: Path, text: str, step: int) -> None:
    """With a later mtime: a change for the source's stat."""
    path.write_text(text)
    later = path.stat().st_mtime_ns + step * 1_000_000_000
    os.utime(path, ns=(later, later))


async def test_a_vanished_storage_is_notified_once(tmp_path: Path, sent: Path) -> None:
    cfg = tmp_path / "storage.cfg"
    cfg.write_text(OTHERS + "\n" + SECTION)
    notifier = Notifier(SCRIPT)
    source = StorageConfigSource(cfg, kept_file=tmp_path / keptsections.FILE_NAME,
                                 notices=Notices("n1", notifier))
    source.get()
    for step in range(1, 4):  # the file read again and again without it
        rewrite(cfg, OTHERS + "\n" * step, step)
        source.get()
    await notifier.drain()
    [call] = calls(sent)
    assert call["template"] == "pvestord-storage-vanished"
    assert call["severity"] == "error"
    assert call["fields"] == {"type": "pvestord", "hostname": "n1",
                              "event": "storage-vanished", "storage": "thin1"}
    assert call["data"]["restore"].startswith("pvestord storage restore")
    assert call["data"]["fqdn"] == "standin-node.example"  # Proxmox's common data kept


async def test_capacity_crossings_are_notified_once_each(
        sent: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Free GiB per reading of a 100 GiB VG (warn below 10 %, critical below 5 %):
    # warn, warn, critical, critical, warn (eased), critical (again), ok, warn.
    readings = iter([9, 8, 4, 3, 8, 4, 50, 9])
    expected = ["warning", "error", "error", "warning"]
    template = capacity.Account("vg1", 100 * GiB, 0, 0, 0, 0, 1.0, None, None, None)

    async def read_account(vg: str, **_: Any) -> capacity.Account:
        return replace(template, free=next(readings) * GiB)

    monkeypatch.setattr(vgspace, "read_account", read_account)
    notifier = Notifier(SCRIPT)
    config = parse_storage_config(SECTION, "storage.cfg")
    pub = publisher.Publisher("n1", status.Activity(), lambda: config,
                              notices=Notices("n1", notifier))
    for _ in range(8):
        await pub.refresh_accounts()
    await notifier.drain()
    found = calls(sent)
    # Sent concurrently (a pass never waits for one): in any order.
    assert sorted(c["severity"] for c in found) == sorted(expected)
    assert {c["template"] for c in found} == {"pvestord-low-space"}
    critical = next(c for c in found if c["severity"] == "error")
    assert critical["fields"] == {"type": "pvestord", "hostname": "n1", "event": "low-space",
                                  "vg": "vg1", "level": "critical"}


async def test_a_vg_marked_unhealthy_is_notified_once_per_mark(
        tmp_path: Path, sent: Path) -> None:
    notifier = Notifier(SCRIPT)
    settings = DaemonSettings(vg_health_dir=tmp_path / "vg-unhealthy")
    passes = Passes(settings, config=lambda: parse_storage_config(SECTION, "storage.cfg"),
                    changing=lambda vmid: True, abandon=lambda vmid: None,
                    notices=Notices("n1", notifier))
    passes._vgs_of = lambda vmid: ["vg1"]  # type: ignore[method-assign]

    async def abandon_one(vmid: int) -> None:
        task = asyncio.get_running_loop().create_task(asyncio.sleep(3600))
        passes.running[vmid] = task
        passes._overdue(vmid, task)
        await asyncio.gather(task, return_exceptions=True)

    await abandon_one(101)
    await abandon_one(102)  # the same VG, still marked: the same mark
    (tmp_path / "vg-unhealthy" / "vg1").unlink()  # the operator checked it
    await abandon_one(103)
    await notifier.drain()
    found = calls(sent)
    assert [c["template"] for c in found] == ["pvestord-vg-unhealthy"] * 2
    reasons = sorted(c["data"]["reason"].split(":")[0] for c in found)
    assert reasons == ["VM 101", "VM 103"]
    assert found[0]["data"]["mark"] == str(tmp_path / "vg-unhealthy" / "vg1")
    assert found[0]["severity"] == "error"


def run_state(paused_on: str | None) -> RunState:
    """What QMP says of a VM: paused on ENOSPC on device ``paused_on``, or running."""
    if paused_on is None:
        return RunState(running=True, status="running", nospace_devices=(),
                        failed_devices=())
    return RunState(running=False, status="io-error", failed_devices=(),
                    nospace_devices=(BlockDevice(paused_on, None, frozenset()),))


async def test_a_pause_for_room_is_notified_once_per_pause(sent: Path) -> None:
    notifier = Notifier(SCRIPT)
    extender = Extender(DaemonSettings(node="n1", lvm_shell=False),
                        lambda: parse_storage_config(SECTION, "storage.cfg"),
                        notices=Notices("n1", notifier))
    # The rounds of three passes see VM 101 paused; it runs; it pauses again.
    for paused_on in ["drive-scsi0"] * 5 + [None, None, "drive-scsi1", "drive-scsi1"]:
        extender.note_pause(101, run_state(paused_on))
    extender.note_pause(102, run_state(None))  # another VM, running: nothing
    await notifier.drain()
    found = calls(sent)
    assert sorted(c["data"]["drives"] for c in found) == ["drive-scsi0", "drive-scsi1"]
    assert found[0]["fields"]["vmid"] == "101" and found[0]["severity"] == "warning"


async def test_without_pve_notify_notifications_are_off_said_once(
        sent: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("PERL5LIB", "")  # plain Debian: no PVE::Notify
    caplog.set_level(logging.DEBUG, logger="pvestord.adapters.notify")
    notifier = Notifier(SCRIPT)
    notices = Notices("n1", notifier)
    notices.seen(VmPaused(101, ()))
    await notifier.drain()
    notices.seen(VmPaused(102, ()))
    await notifier.drain()
    assert not notifier.available
    off = [r for r in caplog.records if "notifications are off" in r.getMessage()
           and r.levelno == logging.INFO]
    assert len(off) == 1
    assert not any(r.levelno >= logging.WARNING for r in caplog.records)


async def test_a_failing_send_is_logged_and_does_not_raise(
        sent: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("PVESTORD_TEST_NOTIFY_FAIL", "1")
    notifier = Notifier(SCRIPT)
    Notices("n1", notifier).seen(VmPaused(101, ()))
    await notifier.drain()
    [warning] = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert "stand-in told to fail" in warning.getMessage()
    assert notifier.available  # a target's failure is not a missing PVE::Notify


async def test_without_the_installed_program_notifications_are_off(
        tmp_path: Path, sent: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A daemon run from a source tree (the tests' own daemons) sends nothing."""
    caplog.set_level(logging.INFO, logger="pvestord.adapters.notify")
    notifier = Notifier(tmp_path / "absent.pl")
    notices = Notices("n1", notifier)
    notices.seen(VmPaused(101, ()))
    notices.seen(VmPaused(102, ()))
    await notifier.drain()
    assert not notifier.available and calls(sent) == []
    assert len([r for r in caplog.records if "notifications are off" in r.getMessage()]) == 1
