"""The pass's rules on queue entries and resuming, as pure functions
(the node-guest tier exercises them whole; here each rule is tried alone).

An entry leaves the queue only when its work is done or moot
(:func:`pvestord.policy.entry_fate`); a VM paused for room runs again only
when nothing blocks it (:func:`pvestord.policy.may_resume`).
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from pvestord.policy import (
    BlockDevice,
    DriveIdentity,
    EntryFate,
    Reason,
    another_round,
    entry_fate,
    may_resume,
    needing_more,
    requests_from,
    resume_blocker,
)

NAMES = ["file0", "fmt0", "file1", "fmt1", "drive-scsi0", "ghost"]
names = st.sampled_from(NAMES)
name_sets = st.sets(names)


@given(st.lists(st.tuples(names, st.sampled_from(Reason))))
def test_merged_requests_keep_the_strongest_reason_per_node(
        entries: list[tuple[str, Reason]]) -> None:
    merged = requests_from(entries)
    assert set(merged) == {name for name, _ in entries}
    for name, reason in merged.items():
        assert reason.strength == max(r.strength for n, r in entries if n == name)


@given(names, name_sets, name_sets, name_sets, st.sampled_from(Reason))
def test_an_entry_leaves_only_when_done_or_moot(node: str, known: set[str], drives: set[str],
                                                failed: set[str], reason: Reason) -> None:
    fate = entry_fate(node, known_nodes=known, drives=drives, failed=failed, reason=reason)
    if node not in known and reason is Reason.JOB:
        assert fate is EntryFate.DONE  # the job ended before its pass: not worth a warning
    elif node not in known:
        assert fate is EntryFate.NO_SUCH_NODE  # moot: the VM has no such node
    elif node in failed:
        assert fate is EntryFate.RETRY  # its own drive failed
    elif not failed:
        assert fate is EntryFate.DONE  # nothing failed: its work is done
    elif node in drives:
        assert fate is EntryFate.DONE  # another drive failed, not this one
    else:
        # A root or format node: its work may have been the failed drive's.
        assert fate is EntryFate.RETRY


def test_entry_fates_by_example() -> None:
    known = {"file0", "fmt0", "drive-scsi0"}
    assert entry_fate("ghost", known_nodes=known, drives={"file0"},
                      failed=set()) is EntryFate.NO_SUCH_NODE
    assert entry_fate("drive-scsi0", known_nodes=known, drives={"file0"},
                      failed={"file0"}) is EntryFate.RETRY
    assert entry_fate("drive-scsi0", known_nodes=known, drives={"file0"},
                      failed=set()) is EntryFate.DONE


DEVICES = [BlockDevice("scsi0", "drive-scsi0", frozenset({"/dev/san/vm-1-disk-0.qcow2"})),
           BlockDevice("scsi1", "drive-scsi1", frozenset({"/dev/san/vm-1-disk-1.qcow2"})),
           BlockDevice("scsi2", "drive-scsi2",
                       frozenset({"/var/lib/vz/images/1/vm-1-disk-2.qcow2"}))]
THIN = [DriveIdentity("/dev/san/vm-1-disk-0.qcow2", frozenset({"file0", "fmt0"})),
        DriveIdentity("/dev/san/vm-1-disk-1.qcow2", frozenset({"file1", "fmt1"}))]


@given(st.booleans(), st.booleans(), st.lists(st.sampled_from(DEVICES), unique=True),
       st.lists(st.sampled_from(THIN), unique=True), st.booleans())
def test_a_vm_resumes_only_paused_with_room_and_nothing_blocking(
        paused: bool, need_more: bool, nospace: list[BlockDevice],
        failing: list[DriveIdentity], unowned: bool) -> None:
    usable = [d for d in THIN if d not in failing]
    verdict = may_resume(paused_for_room=paused, need_more=need_more, nospace=nospace,
                         usable=usable, failing=failing, unowned_pause=unowned)
    if not paused or need_more:
        assert verdict.resume is False and verdict.blocker is None
    else:
        blocker = resume_blocker(nospace, usable, failing, unowned_pause=unowned)
        assert verdict.resume == (blocker is None)
        assert verdict.blocker == blocker
    if verdict.resume:
        # Every device out of space is a thin drive that got room.
        assert not failing or not unowned
        assert all(d is not DEVICES[2] for d in nospace)


def test_a_full_device_that_is_not_thin_keeps_the_vm_paused() -> None:
    verdict = may_resume(paused_for_room=True, need_more=False, nospace=[DEVICES[2]],
                         usable=THIN, failing=[], unowned_pause=False)
    assert not verdict.resume and verdict.blocker is not None
    assert verdict.blocker.device == "scsi2"
    assert may_resume(paused_for_room=True, need_more=False, nospace=DEVICES[:2],
                      usable=THIN, failing=[], unowned_pause=False).resume


@given(st.booleans(), st.booleans(), st.booleans(), st.booleans())
def test_another_round_when_more_is_needed_or_still_paused_after_growing(
        need_more: bool, paused: bool, resumed: bool, extended: bool) -> None:
    again = another_round(need_more=need_more, paused_for_room=paused, resumed=resumed,
                          extended=extended)
    if need_more:
        assert again
    elif not extended or not paused or resumed:
        # Nothing grown this round, or the VM runs: the pass is over.
        assert not again
    else:
        assert again


@given(st.lists(names, unique=True), name_sets)
def test_only_a_drive_the_pass_may_grow_needs_more(past_threshold: list[str],
                                                   may_not_grow: set[str]) -> None:
    waits_for = needing_more(past_threshold, may_not_grow)
    growable = [d for d in past_threshold if d not in may_not_grow]
    assert waits_for == (growable[0] if growable else None)


def test_a_drive_held_back_keeps_no_paused_vm_waiting() -> None:
    # file0 is held back by the VG's reserve or left alone during a rename;
    # file1, the drive the VM paused on, got its chunk.
    assert needing_more(["file0"], {"file0"}) is None
    assert needing_more(["file0", "file1"], {"file0"}) == "file1"
