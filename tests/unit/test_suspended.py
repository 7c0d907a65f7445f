"""LVs left suspended by a killed change: the pure rule, the
``dmsetup``/``lvchange`` order of the resume, and the daemon's check.

The rule is tested with hypothesis. The adapter runs stand-in ``lvm`` and
``dmsetup`` scripts (``PVESTORD_LVM``, ``PVESTORD_DMSETUP``) that record their
arguments. The check runs with stand-ins for the two adapter calls
(``dm.devices``, ``dm.resume_left_suspended``): no real device is suspended
on the test machine.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pvestord.adapters import dm, tally
from pvestord.adapters.config import parse_storage_config
from pvestord.engine.failures import Failures
from pvestord.engine.lvmchanges import LvmChanges
from pvestord.engine.suspension import SuspendedLvs
from pvestord.errors import CommandError
from pvestord.policy.binding import dm_name
from pvestord.policy.suspended import DmDevice, SuspendedLv, judge, ours, parse_dm_info

NAME = st.from_regex(r"[A-Za-z0-9+_.][A-Za-z0-9+_.-]{0,20}", fullmatch=True).filter(
    lambda n: n not in (".", ".."))
DISK = st.builds(lambda vmid, tail: f"vm-{vmid}-{tail}.qcow2",
                 st.integers(100, 999999), st.from_regex(r"disk-[0-9]{1,2}", fullmatch=True))


@given(NAME, DISK, st.booleans())
def test_a_dm_info_line_gives_back_its_lv(vg: str, lv: str, suspended: bool) -> None:
    name = dm_name(vg, lv)
    line = f"{name}:{'Suspended' if suspended else 'Active'}\n"
    assert parse_dm_info("garbage\n" + line) == [DmDevice(name, suspended)]
    found = ours(parse_dm_info(line), [vg])
    assert found == ([SuspendedLv(vg, lv, name, int(lv.split("-")[1]))] if suspended else [])
    assert ours(parse_dm_info(line), [vg + "x"]) == []


LVS = st.lists(st.builds(lambda vg, vmid: SuspendedLv(vg, f"vm-{vmid}-disk-0.qcow2",
                                                      dm_name(vg, f"vm-{vmid}-disk-0.qcow2"),
                                                      vmid),
                         st.sampled_from(["san", "san-b"]), st.integers(100, 105)),
               unique_by=lambda lv: lv.dm_name)


@given(LVS, st.floats(0, 1000), st.dictionaries(st.sampled_from(
    [dm_name(vg, f"vm-{i}-disk-0.qcow2") for vg in ("san", "san-b") for i in range(100, 106)]),
    st.floats(0, 1000)), st.sets(st.integers(100, 105)), st.sets(st.sampled_from(["san", "san-b"])),
    st.booleans(), st.floats(0.1, 100))
def test_the_rule_resumes_only_what_is_left_over(
        suspended: list[SuspendedLv], now: float, seen: dict[str, float], changing: set[int],
        unhealthy: set[str], all_killed: bool, grace: float) -> None:
    killed = {lv.dm_name for lv in suspended} if all_killed else set()
    verdict = judge(suspended, now=now, seen=seen, changing=changing, unhealthy=unhealthy,
                    killed=killed, grace=grace)
    resumed = {lv.dm_name for lv in verdict.resume}
    # Every suspended LV is either resumed or waiting, never both.
    assert resumed | set(verdict.waiting) == {lv.dm_name for lv in suspended}
    assert not resumed & set(verdict.waiting)
    # Only the ones still suspended are remembered, from their first sighting.
    assert set(verdict.seen) == {lv.dm_name for lv in suspended}
    for lv in suspended:
        first = seen.get(lv.dm_name, now)
        assert verdict.seen[lv.dm_name] == first
        free = lv.vmid not in changing and lv.vg not in unhealthy
        due = lv.dm_name in killed or now - first >= grace
        assert (lv.dm_name in resumed) == (free and due)


def test_a_first_sighting_waits_out_the_grace_then_resumes() -> None:
    lv = SuspendedLv("san", "vm-100-disk-0.qcow2", "san-vm--100--disk--0.qcow2", 100)
    first = judge([lv], now=10.0, seen={}, changing=(), unhealthy=(), grace=30.0)
    assert first.resume == () and lv.dm_name in first.waiting
    later = judge([lv], now=40.0, seen=first.seen, changing=(), unhealthy=(), grace=30.0)
    assert later.resume == (lv,)


def stand_in(path: Path, body: str) -> str:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return str(path)


async def test_the_resume_drops_the_inactive_table_then_refreshes_from_the_metadata(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = tmp_path / "calls"
    monkeypatch.setenv("PVESTORD_LVM", stand_in(tmp_path / "lvm", f'echo "lvm $*" >> {calls}\n'))
    monkeypatch.setenv("PVESTORD_DMSETUP",
                       stand_in(tmp_path / "dmsetup", f'echo "dmsetup $*" >> {calls}\n'))
    how = await dm.resume_left_suspended("san", "vm-100-disk-0.qcow2",
                                         "san-vm--100--disk--0.qcow2", lvm_timeout=5.0)
    assert how == "dmsetup clear and lvchange --refresh"
    clear, line = calls.read_text().splitlines()
    # The inactive table dropped first: nothing can make it live.
    assert clear == "dmsetup clear san-vm--100--disk--0.qcow2"
    assert line.startswith("lvm lvchange ") and "--refresh" in line
    assert line.endswith("san/vm-100-disk-0.qcow2")


async def test_a_failed_refresh_drops_the_inactive_table_before_resuming(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = tmp_path / "calls"
    monkeypatch.setenv("PVESTORD_LVM", stand_in(tmp_path / "lvm", f'echo "lvm $*" >> {calls}\n'
                                                "echo 'cannot' >&2; exit 5\n"))
    monkeypatch.setenv("PVESTORD_DMSETUP",
                       stand_in(tmp_path / "dmsetup", f'echo "dmsetup $*" >> {calls}\n'))
    how = await dm.resume_left_suspended("san", "vm-100-disk-0.qcow2",
                                         "san-vm--100--disk--0.qcow2", lvm_timeout=5.0)
    assert how.startswith("dmsetup clear and resume")
    lines = calls.read_text().splitlines()
    assert lines[0] == "dmsetup clear san-vm--100--disk--0.qcow2"
    assert lines[1].startswith("lvm lvchange ")
    assert lines[2:] == ["dmsetup resume san-vm--100--disk--0.qcow2"]


async def test_a_resume_that_fails_is_reported(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PVESTORD_LVM", stand_in(tmp_path / "lvm", "exit 5\n"))
    monkeypatch.setenv("PVESTORD_DMSETUP", stand_in(tmp_path / "dmsetup", "exit 1\n"))
    with pytest.raises(dm.DmError, match="left suspended"):
        await dm.resume_left_suspended("san", "vm-100-disk-0.qcow2",
                                       "san-vm--100--disk--0.qcow2", lvm_timeout=5.0)


CFG = "pvestord: thin1\n\tvgname san\n\tshared 1\n"
LV = "vm-100-disk-0.qcow2"
DM = dm_name("san", LV)


class DmStandIn:
    """Stands in for ``dm.devices`` and ``dm.resume_left_suspended``: one
    device, suspended until resumed (or for good, with ``fails``)."""

    def __init__(self, fails: bool = False) -> None:
        self.suspended = True
        self.fails = fails
        self.resumes: list[str] = []

    async def devices(self, **_: object) -> list[DmDevice]:
        return [DmDevice(DM, self.suspended), DmDevice("other-thing", True)]

    async def resume(self, vg: str, lv: str, name: str, **_: object) -> str:
        self.resumes.append(name)
        if self.fails:
            raise dm.DmError("stand-in failure")
        self.suspended = False
        return "stand-in"


def check_with(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stand: DmStandIn,
               changes: LvmChanges) -> tuple[SuspendedLvs, Failures]:
    monkeypatch.setattr(dm, "devices", stand.devices)
    monkeypatch.setattr(dm, "resume_left_suspended", stand.resume)
    failures = Failures(reconcile=lambda vmid: None, wake=lambda: None)
    config = parse_storage_config(CFG, "storage.cfg")
    return SuspendedLvs(lambda: config, changes, failures, tmp_path / "marks",
                        lvm_timeout=5.0), failures


async def test_a_change_of_ours_killed_leaves_its_lv_resumed_at_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    woken = asyncio.Event()
    changes = LvmChanges(on_killed=woken.set)
    stand = DmStandIn()
    check, _ = check_with(tmp_path, monkeypatch, stand, changes)
    # Running: a suspension is ours to leave alone.
    with pytest.raises(CommandError), changes.running(100, "drive-scsi0", ("san", LV)):
        await check.check()
        assert stand.resumes == []
        raise CommandError(["lvm", "lvextend"], None, "", timed_out=True, timeout=1.0)
    assert woken.is_set()
    await check.check()  # no grace: the kill says whose suspension it is
    assert stand.resumes == [DM]


async def test_a_suspension_seen_first_is_left_alone_until_it_lasts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    stand = DmStandIn()
    check, _ = check_with(tmp_path, monkeypatch, stand, LvmChanges())
    await check.check()
    assert stand.resumes == [] and DM in check.seen
    check.seen[DM] -= check.grace  # as if first seen a grace ago
    await check.check()
    assert stand.resumes == [DM]


async def test_a_failed_resume_is_an_error_in_the_status_and_counted(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    stand = DmStandIn(fails=True)
    changes = LvmChanges()
    check, failures = check_with(tmp_path, monkeypatch, stand, changes)
    before = tally.EVENTS["dm_resume_failed"]
    with pytest.raises(CommandError), changes.running(100, "drive-scsi0", ("san", LV)):
        raise CommandError(["lvm", "lvextend"], None, "", timed_out=True, timeout=1.0)
    await check.check()
    assert tally.EVENTS["dm_resume_failed"] == before + 1
    assert any("could not be resumed" in str(e) for e in failures.errors.values())
    assert DM in check.failed


async def test_a_marked_vg_is_not_resumed(tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    stand = DmStandIn()
    changes = LvmChanges()
    check, _ = check_with(tmp_path, monkeypatch, stand, changes)
    check.health.mark("san", "a stuck lvm")
    with pytest.raises(CommandError), changes.running(100, "drive-scsi0", ("san", LV)):
        raise CommandError(["lvm", "lvextend"], None, "", timed_out=True, timeout=1.0)
    await check.check()
    assert stand.resumes == []



def test_the_metrics_count_resumes_and_failed_resumes() -> None:
    from pvestord.engine import metrics
    text = metrics.render({
        "extensions": {"made": 0, "failed": 0, "latency_buckets_ms": [], "latency_counts": [],
                       "latency_sum_ms": 0, "lock_wait_ms_total": 0},
        "paused_vms": 0, "queue_length": 0, "lvm_shell_restarts": 0, "vgs": {},
        "tally": {"events": {"dm_resumed": 2, "dm_resume_failed": 1}}})
    assert "pvestord_lv_resumed_total 2" in text
    assert "pvestord_lv_resume_failures_total 1" in text


async def test_the_devices_are_read_from_sysfs_without_a_process(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for index, (name, state) in enumerate([(DM, "1"), ("other", "0")]):
        folder = tmp_path / f"dm-{index}" / "dm"
        folder.mkdir(parents=True)
        (folder / "name").write_text(name + "\n")
        (folder / "suspended").write_text(state + "\n")
    (tmp_path / "sda").mkdir()
    # No dmsetup may run: a stand-in that fails says so.
    monkeypatch.setenv("PVESTORD_DMSETUP", stand_in(tmp_path / "dmsetup", "exit 1\n"))
    assert await dm.devices(sysfs=tmp_path) == [DmDevice(DM, True), DmDevice("other", False)]


async def test_no_dmsetup_resume_while_the_inactive_table_may_still_be_loaded(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = tmp_path / "calls"
    monkeypatch.setenv("PVESTORD_LVM", stand_in(tmp_path / "lvm", "exit 5\n"))
    monkeypatch.setenv("PVESTORD_DMSETUP", stand_in(
        tmp_path / "dmsetup", f'echo "dmsetup $*" >> {calls}\n[ "$1" = clear ] && exit 1\n'
        "exit 0\n"))
    with pytest.raises(dm.DmError, match="inactive table could not be dropped"):
        await dm.resume_left_suspended("san", "vm-100-disk-0.qcow2",
                                       "san-vm--100--disk--0.qcow2", lvm_timeout=5.0)
    assert calls.read_text().splitlines() == ["dmsetup clear san-vm--100--disk--0.qcow2"]
