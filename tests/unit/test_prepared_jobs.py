"""The record of the snapshot deletes the storage plugin prepared, and the rule
that reads it (pvestord.adapters.preparedjobs, policy.prepared_for_delete)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pvestord.adapters import preparedjobs
from pvestord.adapters.lvm import LvmError
from pvestord.policy import prepared_for_delete
from pvestord.policy.blockjobs import PREPARED_SLACK

ages = st.floats(min_value=0, max_value=10 * 86400, allow_nan=False)


@given(lock_age=ages)
def test_a_target_never_recorded_is_unprepared(lock_age: float) -> None:
    assert not prepared_for_delete(None, lock_age)


@given(lock_age=ages, earlier=ages)
def test_a_record_made_after_the_lock_was_written_is_prepared(lock_age: float,
                                                              earlier: float) -> None:
    assert prepared_for_delete(max(lock_age - earlier, 0.0), lock_age)


@given(lock_age=ages, before=st.floats(min_value=PREPARED_SLACK + 0.001, max_value=86400))
def test_a_record_older_than_the_lock_is_an_earlier_delete(lock_age: float,
                                                          before: float) -> None:
    # An earlier task's record: this job was not prepared.
    assert not prepared_for_delete(lock_age + before, lock_age)


def test_a_record_is_dated_when_made_and_again_when_made_again(tmp_path: Path) -> None:
    assert preparedjobs.age(tmp_path, "vg_san1", "vm-100-disk-0.qcow2") is None
    preparedjobs.note(tmp_path, "vg_san1", "vm-100-disk-0.qcow2")
    path = tmp_path / "vg_san1" / "vm-100-disk-0.qcow2"
    long_ago = time.time() - 7200
    os.utime(path, (long_ago, long_ago))
    age = preparedjobs.age(tmp_path, "vg_san1", "vm-100-disk-0.qcow2")
    assert age is not None and age >= 7200
    preparedjobs.note(tmp_path, "vg_san1", "vm-100-disk-0.qcow2")
    age = preparedjobs.age(tmp_path, "vg_san1", "vm-100-disk-0.qcow2")
    assert age is not None and age < 7200


@pytest.mark.parametrize(("vg", "lv"), [("../etc", "x"), ("vg", "../../passwd"), ("vg", "")])
def test_names_that_are_not_lvm_names_are_refused(tmp_path: Path, vg: str, lv: str) -> None:
    with pytest.raises(LvmError):
        preparedjobs.note(tmp_path, vg, lv)
    assert list(tmp_path.iterdir()) == []


def test_the_folder_is_beside_the_vg_marks() -> None:
    assert preparedjobs.folder_beside(Path("/run/pvestord/vg-unhealthy")) == Path(
        "/run/pvestord/prepared-jobs")
