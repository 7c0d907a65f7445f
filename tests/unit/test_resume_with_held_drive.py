"""A VM paused on ENOSPC is resumed although another of its thin drives is
past its threshold, when the pass may not grow that drive now (held back by
the VG's reserve, or left alone while qemu-server renames the VM's LVs).

The re-arm and resume step is the engine's own
(:func:`pvestord.engine.settle.rearm_and_resume`); the QMP session is a
stand-in (:class:`RecordingMonitor`) that records what pvestord asks QEMU.
"""

from __future__ import annotations

from pathlib import Path
from typing import cast

from pvestord.adapters.config import parse_storage_config
from pvestord.adapters.qmp import RunState, ThinDriveView, VmMonitor
from pvestord.adapters.vms import LocalVm
from pvestord.engine.drive import Drive, VmOutcome
from pvestord.engine.memory import OncePerChange
from pvestord.engine.settle import PausedJobs, rearm_and_resume
from pvestord.policy import BlockDevice

GiB = 1 << 30
MiB = 1 << 20
VMID = 101
STORAGE = parse_storage_config("pvestord: thin1\n\tvgname san\n\tpvestord-chunksize 1G\n",
                               "storage.cfg").get("thin1")


class RecordingMonitor:
    """Stands in for a QMP session with the VM: records the thresholds set
    and whether the VM was told to continue."""

    def __init__(self) -> None:
        self.thresholds: dict[str, int] = {}
        self.continued = False

    async def set_threshold(self, node: str, threshold: int) -> None:
        self.thresholds[node] = threshold

    async def cont(self) -> None:
        self.continued = True

    async def resume_job(self, job_id: str) -> None:
        raise AssertionError(f"no job to resume, asked for {job_id}")


def drive(n: int, *, allocation: int) -> Drive:
    path = f"/dev/san/vm-{VMID}-disk-{n}.qcow2"
    view = ThinDriveView(f"file{n}", f"fmt{n}", path, virtual_size=32 * GiB,
                         allocation=allocation, threshold=0)
    return Drive(view, "san", f"vm-{VMID}-disk-{n}.qcow2", STORAGE, maximum=33 * GiB,
                 extent_size=4 * MiB, lv_size=2 * GiB)


#: Drive 0, past its threshold, and drive 1, the one the VM paused on, just grown.
PAST, GROWN = drive(0, allocation=2 * GiB - MiB), drive(1, allocation=GiB)
PAUSED_ON_GROWN = RunState(
    running=False, status="io-error", failed_devices=(),
    nospace_devices=(BlockDevice("scsi1", "drive-scsi1", frozenset({GROWN.view.path})),))


async def settle(may_not_grow: set[str]) -> tuple[RecordingMonitor, VmOutcome, bool]:
    monitor, outcome = RecordingMonitor(), VmOutcome()
    said = OncePerChange()
    again = await rearm_and_resume(
        cast(VmMonitor, monitor), LocalVm(VMID, 1, Path("/nonexistent")), [PAST, GROWN],
        PAUSED_ON_GROWN, outcome, extended=True, said=said, jobs=PausedJobs(said),
        may_not_grow=may_not_grow)
    return monitor, outcome, again


async def test_a_drive_the_pass_may_not_grow_does_not_keep_the_vm_paused() -> None:
    monitor, outcome, again = await settle({"file0"})
    assert monitor.continued, "VM kept paused by a drive the pass may not grow"
    assert outcome.resumed and outcome.waits_for is None
    assert not again
    assert "file0" not in monitor.thresholds  # past it: nothing to arm


async def test_a_drive_the_pass_may_grow_gets_another_round_first() -> None:
    monitor, outcome, again = await settle(set())
    assert not monitor.continued
    assert outcome.waits_for == "file0" and again
