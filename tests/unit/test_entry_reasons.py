"""Which thin drives a queue entry's node-name applies to: a thin drive's name
to that drive only; a name that is no thin drive's to every thin drive for a
pause on ENOSPC or a block job, and to none for anything else (a typo in
``pvestord extend`` must not extend every drive)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from pvestord.policy import Reason, reason_for

DRIVES = [{"file0", "fmt0"}, {"file1", "fmt1"}]
THIN_NODES = {"file0", "fmt0", "file1", "fmt1"}


def reasons(requests: dict[str, Reason]) -> list[Reason | None]:
    return [reason_for(names, requests, THIN_NODES) for names in DRIVES]


def test_a_name_of_a_thin_drive_applies_to_that_drive_only() -> None:
    assert reasons({"file1": Reason.MANUAL}) == [None, Reason.MANUAL]
    assert reasons({"fmt0": Reason.THRESHOLD}) == [Reason.THRESHOLD, None]


def test_only_nospace_falls_back_to_every_thin_drive() -> None:
    # BLOCK_IO_ERROR names the device's root node (a throttle filter in PVE 9).
    assert reasons({"drive-scsi0": Reason.NOSPACE}) == [Reason.NOSPACE, Reason.NOSPACE]
    # A typo in `pvestord extend`, or a manual entry for a non-thin node: nothing.
    assert reasons({"file-typo": Reason.MANUAL}) == [None, None]
    assert reasons({"drive-scsi2": Reason.THRESHOLD}) == [None, None]
    assert reasons({"file-typo": Reason.ARM}) == [None, None]


def test_reconcile_looks_at_every_drive() -> None:
    assert [reason_for(names, None, THIN_NODES) for names in DRIVES] == [Reason.ARM, Reason.ARM]


names = st.sampled_from(["file0", "fmt0", "file1", "fmt1", "drive-scsi0", "file-typo"])
requests = st.dictionaries(names, st.sampled_from(Reason), max_size=6)


@given(requests)
def test_a_drive_gets_the_strongest_reason_that_applies_to_it(asked: dict[str, Reason]) -> None:
    for drive in DRIVES:
        reason = reason_for(drive, asked, THIN_NODES)
        named = [r for n, r in asked.items() if n in drive]
        fallback = [r for n, r in asked.items() if n not in THIN_NODES and r.reaches_every_drive]
        if not named and not fallback:
            assert reason is None  # never another drive's request
        else:
            assert reason is not None
            assert reason.strength == max(r.strength for r in named + fallback)


@given(requests)
def test_only_nospace_and_job_reach_drives_they_do_not_name(asked: dict[str, Reason]) -> None:
    unnamed = {n: r for n, r in asked.items() if n not in THIN_NODES}
    reaching = {r for r in unnamed.values() if r in (Reason.NOSPACE, Reason.JOB)}
    for drive in DRIVES:
        reason = reason_for(drive, unnamed, THIN_NODES)
        assert reason in (None, Reason.NOSPACE, Reason.JOB)
        assert reason == max(reaching, key=lambda r: r.strength, default=None)
