"""An LV left suspended by an ``lvextend`` killed between its suspend and its
resume (docs/operations.md, "An LV left suspended").

Real daemons, real QEMU, real LVM on a loop VG, and
``tests/harness/lvm_faulty``'s ``suspend-hang`` rule: the ``lvextend`` loads
an inactive table one chunk larger than the live one (as the killed command
had, its metadata not yet committed), suspends the LV's device and hangs
until pvestord kills it at ``--lvm-timeout``. The device is left suspended:
every guest I/O on it queues, and QEMU still says ``running``.

What must hold: pvestord finds the LV suspended once its command was killed,
and resumes it from the committed metadata (``lvchange --refresh``), not by
making the larger inactive table live; guest I/O goes through again; once
LVM behaves, the drive is extended as usual and the table matches the
metadata.

On the old code nothing looked at the device-mapper state: with the rule
kept, every retry suspended the device again and was killed, and no
``DM_STATE=resumed`` record ever came (the wait for it times out).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.harness.daemons import NodeBed
from tests.harness.faultbed import (
    CHUNK,
    LV0,
    Workload,
    fault_bed,
    final_checks,
    node,
    settled,
    thin_vm,
)
from tests.harness.faults import FaultLog, FaultRecord, LvmFaults, Stopwatch
from tests.harness.lvmbed import VG, sh
from tests.harness.polling import wait_until

#: Short, so that the kill comes soon; an lvs on a loaded guest fits in it.
LVM_TIMEOUT = 10.0


@pytest.fixture
def bed(vg: VG, tmp_path: Path, out_dir: Path) -> NodeBed:
    return fault_bed(vg, tmp_path, out_dir)


def dm_name(vg: str, lv: str) -> str:
    return f"{vg.replace('-', '--')}-{lv.replace('-', '--')}"


def suspended(name: str) -> bool:
    return sh("dmsetup", "info", "-c", "--noheadings", "-o", "suspended",
              name).strip() == "Suspended"


def test_an_lv_left_suspended_by_a_killed_lvextend_is_resumed(
        bed: NodeBed, vg: VG, faults: LvmFaults, fault_log: FaultLog) -> None:
    vm, lv = thin_vm(bed, vg, 941)
    name = dm_name(vg.name, lv)
    test = "test_an_lv_left_suspended_by_a_killed_lvextend_is_resumed"
    with vm, node(bed, faults, "--lvm-timeout", str(LVM_TIMEOUT)) as running:
        work = Workload(vm)
        settled(bed, vm, vg, lv, LV0)
        faults.rule("lvextend", f"before suspend-hang {vg.name}")
        work.cross_threshold()
        # The kill moment is hit, not slept into: the wrapper says it suspended.
        wait_until(lambda: (faults.folder / "lvextend.suspended").exists(), 120,
                   "the lvextend suspended the LV and hangs")
        assert suspended(name)
        clock = Stopwatch()
        running.pvestord.wait_record("the LV resumed", 120, DM_STATE="resumed",
                                     VMID="941", LV=lv)
        # Cleared at once: a retry that reads the rule from here on runs the
        # real lvextend.
        faults.clear()
        # Resumed from the metadata: never the larger inactive table the killed
        # command had loaded (AHEAD). Table first: the metadata only grows.
        table = vg.device_size(lv)
        assert table <= vg.lv_size(lv), "a table larger than the metadata was made live"
        work.write_one()  # guest I/O goes through again
        settled(bed, vm, vg, lv, LV0 + CHUNK)
        assert not suspended(name)
        fault_log.record(FaultRecord(
            "lvextend killed between suspend and resume",
            f"the lvextend loaded a table one chunk larger, suspended the LV's device and "
            f"hung until killed (pvestord run --lvm-timeout {LVM_TIMEOUT:g}), every time "
            "until the rule was removed",
            "the kill was noted, the LV found suspended with no change of ours on it and "
            "resumed with dmsetup clear and lvchange --refresh (the table matched the "
            "metadata, not the larger inactive one); guest I/O went through; extended once "
            "lvextend behaved; no write failed", clock(), test))
        final_checks(vm, vg, lv, work)
