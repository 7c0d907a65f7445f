"""The live reduction's pure rules, its pause notes and the tags the pass remembers.

The reduction itself (QMP ``stop``, ``qemu-img check -U``, ``lvreduce``,
``cont``) runs against a real QEMU on a real LV in the node guest
(tests/integration/node/test_live_reduce.py).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pvestord import policy
from pvestord.adapters import pausemarks
from pvestord.adapters.lvm import LvInfo
from pvestord.adapters.pausemarks import Note
from pvestord.adapters.settings import DaemonSettings
from pvestord.engine.lvfigures import LvFigures
from pvestord.policy.capacity import COPY_TAG
from pvestord.policy.sizes import GiB, MiB
from pvestord.policy.volumes import (
    live_reduction_refused,
    live_reduction_target,
    shrink_target,
)

extents = st.sampled_from([1 * MiB, 4 * MiB, 32 * MiB])
chunks = st.sampled_from([64 * MiB, 256 * MiB, 1 * GiB])


@given(st.integers(1, 4096), extents, st.integers(0, 80 * GiB), st.integers(0, 80 * GiB),
       chunks, st.integers(0, 4 * GiB), st.floats(0.01, 0.99))
def test_a_live_reduction_keeps_every_written_byte_and_a_threshold_above_it(
        count: int, extent: int, image_end: int, written_end: int, chunk: int,
        initial: int, percentage: float) -> None:
    lv_size = count * extent
    target = live_reduction_target(lv_size, image_end, written_end, chunk, initial, extent)
    assert target <= lv_size
    assert target % extent == 0
    if target < lv_size:
        # Neither end is cut, whichever is the larger, and the guest's next
        # writes past the data cross a threshold before the LV's end.
        assert target >= max(image_end, written_end) + chunk
        assert policy.threshold(target, chunk, percentage) >= max(image_end, written_end)
    assert target == shrink_target(lv_size, max(image_end, written_end), chunk, initial,
                                   extent)


def test_a_mirrored_disk_of_300_mib_goes_back_to_its_data_and_a_chunk() -> None:
    lv_size = policy.maximum_size(8 * GiB + 1310720, 4 * MiB)
    # qemu-img check's end a little below what QEMU wrote (a discarded tail).
    target = live_reduction_target(lv_size, 290 * MiB, 300 * MiB + 917504, 256 * MiB,
                                   256 * MiB, 4 * MiB)
    assert target == 560 * MiB


states = st.sampled_from(["running", "paused", "io-error", "inmigrate", "postmigrate",
                          "prelaunch", "suspended"])


@given(states, st.integers(0, 3), st.integers(0, 2), st.one_of(st.none(), st.integers(100, 103)),
       st.sampled_from([None, "backup", "snapshot", "migrate", "suspending"]))
def test_only_an_unlocked_running_vm_with_no_job_or_export_is_paused_for_its_own_disk(
        status: str, jobs: int, exports: int, lv_vmid: int | None, lock: str | None) -> None:
    refused = live_reduction_refused(status=status, jobs=jobs, exports=exports,
                                     lv_vmid=lv_vmid, vmid=101, config_lock=lock)
    allowed = (status == "running" and jobs == 0 and exports == 0 and lv_vmid == 101
               and lock is None)
    assert (refused is None) == allowed
    if refused is not None:
        assert refused  # a reason to log


def test_each_refusal_says_why() -> None:
    def why(**changes: object) -> str | None:
        args: dict[str, object] = {"status": "running", "jobs": 0, "exports": 0,
                                   "lv_vmid": 101, "vmid": 101}
        args.update(changes)
        return live_reduction_refused(**args)  # type: ignore[arg-type]

    assert why() is None
    assert why(status="paused") == "the VM is paused, not running"
    assert why(jobs=1) == "1 block job of the VM runs"
    assert why(jobs=2) == "2 block jobs of the VM run"
    assert why(exports=1) == "1 block export of the VM may write"
    assert why(config_lock="backup") == ("its config is locked (backup): qemu-server is at "
                                         "work on it")
    assert why(lv_vmid=102) == "the LV is not one of this VM's disks"


def test_a_pause_note_names_the_qemu_it_was_written_for(tmp_path: Path) -> None:
    folder = pausemarks.folder_beside(tmp_path / "vg-health")
    assert folder == tmp_path / "paused-for-reduction"
    qemu = os.getpid()  # a live process stands for the QEMU
    assert pausemarks.noted(folder, 101, qemu) is Note.NONE
    pausemarks.clear(folder, 101)  # nothing noted: no error
    pausemarks.note(folder, 101, qemu)
    pausemarks.note(folder, 101, qemu)  # noted again: one note
    assert pausemarks.noted(folder, 101, qemu) is Note.OURS
    assert pausemarks.noted(folder, 1010, qemu) is Note.NONE
    # The VM's QEMU is another process now (stopped and started again):
    # the note is of the one that ended, and resumes nothing.
    assert pausemarks.noted(folder, 101, os.getppid()) is Note.STALE
    pausemarks.clear(folder, 101)
    assert pausemarks.noted(folder, 101, qemu) is Note.NONE


def test_a_pause_is_not_noted_for_a_qemu_that_is_gone(tmp_path: Path) -> None:
    gone = subprocess.Popen(["true"])
    gone.wait(timeout=30)
    with pytest.raises(OSError):
        pausemarks.note(tmp_path, 101, gone.pid)
    assert pausemarks.noted(tmp_path, 101, os.getpid()) is Note.NONE


def test_a_note_that_cannot_be_read_resumes_nothing(tmp_path: Path) -> None:
    (tmp_path / "101").mkdir()  # a folder where the note would be
    assert pausemarks.noted(tmp_path, 101, os.getpid()) is Note.STALE


def _info(lv: str, tags: tuple[str, ...]) -> LvInfo:
    return LvInfo("san1", lv, 4 * GiB, 4 * MiB, 0, True, True, tags)


def test_the_pass_remembers_which_lvs_are_copy_targets() -> None:
    figures = LvFigures(DaemonSettings(), None)
    figures.remember(_info("vm-101-disk-0.qcow2", ("pvestord-max-1", COPY_TAG)))
    figures.remember(_info("vm-1010-disk-0.qcow2", (COPY_TAG,)))
    figures.remember(_info("vm-102-disk-0.qcow2", ()))
    assert figures.copy_target("san1", "vm-101-disk-0.qcow2")
    assert not figures.copy_target("san1", "vm-102-disk-0.qcow2")
    assert not figures.copy_target("san1", "vm-103-disk-0.qcow2")  # never read
    assert figures.has_copy_targets(101) and figures.has_copy_targets(1010)
    assert not figures.has_copy_targets(102) and not figures.has_copy_targets(10)
    figures.reduced("san1", "vm-101-disk-0.qcow2", 560 * MiB)
    figures.untagged("san1", "vm-101-disk-0.qcow2")
    assert figures.size("san1", "vm-101-disk-0.qcow2") == 560 * MiB
    assert not figures.copy_target("san1", "vm-101-disk-0.qcow2")
    assert not figures.has_copy_targets(101)
    # A tagged disk detached from its VM is forgotten when the VM's disks are
    # listed without it; another VM's are kept.
    figures.remember(_info("vm-101-disk-1.qcow2", (COPY_TAG,)))
    assert figures.has_copy_targets(101)
    figures.keep_tags_of(101, {("san1", "vm-101-disk-0.qcow2")})
    assert not figures.has_copy_targets(101)
    assert figures.has_copy_targets(1010)
