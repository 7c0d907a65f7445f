"""The extension policy: examples from docs/design.md, then properties with hypothesis."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from pvestord.policy import (
    Arm,
    AtMaximum,
    BlockDevice,
    BlockedBecause,
    Decision,
    DriveIdentity,
    DriveState,
    Extend,
    ExtendPastMaximum,
    ExtensionState,
    Nothing,
    NotThin,
    Reason,
    ResumeBlocker,
    TableState,
    classify,
    decide,
    device_filenames,
    device_on,
    enospc_is_new,
    exceeded,
    extend_target,
    maximum_size,
    may_pass_maximum,
    paused_out_of_room,
    resume_blocker,
    table_state,
    threshold,
    wanted_headroom,
)
from pvestord.policy.sizes import GiB, MiB

EXTENT = 4 * MiB


def drive(**changes: object) -> DriveState:
    """The issue's main test drive: 8 GiB qcow2, 256 MiB LV, chunks of 256M at 0.5."""
    base = DriveState(lv_size=256 * MiB, allocation=0, threshold=0, virtual_size=8 * GiB,
                      maximum=maximum_size(8591507456, EXTENT), extent_size=EXTENT,
                      chunksize=256 * MiB, chunk_percentage=0.5)
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


# --- examples -------------------------------------------------------------------

def test_formulas() -> None:
    assert threshold(2 * GiB, GiB, 0.5) == 1536 * MiB
    assert threshold(256 * MiB, GiB, 0.5) == 0  # clamped: cannot be armed
    assert wanted_headroom(GiB, 0.1) == 107374183  # rounded up
    assert maximum_size(8591507456, EXTENT) == 8196 * MiB
    assert maximum_size(8 * GiB, EXTENT) == 8 * GiB
    # One chunk past the LV end, in extents.
    assert extend_target(256 * MiB, 200 * MiB, 256 * MiB, 8 * GiB, EXTENT) == 512 * MiB
    # One chunk past an allocation beyond the end (a shrunk LV), aligned up.
    assert extend_target(256 * MiB, 300 * MiB + 1, 256 * MiB, 8 * GiB, EXTENT) == 560 * MiB
    # Capped at the maximum, never below the current size.
    assert extend_target(8000 * MiB, 0, GiB, 8196 * MiB, EXTENT) == 8196 * MiB
    assert extend_target(9 * GiB, 0, GiB, 8 * GiB, EXTENT) == 9 * GiB


def test_fresh_drive_gets_armed() -> None:
    assert decide(drive()) == Arm(128 * MiB)
    assert classify(drive()) is ExtensionState.IDLE


def test_armed_drive_with_headroom_needs_nothing() -> None:
    state = drive(threshold=128 * MiB, allocation=100 * MiB, reason=Reason.THRESHOLD)
    assert decide(state) == Nothing()
    assert classify(state) is ExtensionState.ARMED


def test_wrong_threshold_is_rearmed() -> None:
    assert decide(drive(threshold=200 * MiB, allocation=10 * MiB)) == Arm(128 * MiB)


def test_past_threshold_extends_at_once_instead_of_arming() -> None:
    state = drive(allocation=130 * MiB)  # nothing armed (e.g. after a VM restart)
    assert exceeded(state)
    assert classify(state) is ExtensionState.EXCEEDED
    assert decide(state) == Extend(512 * MiB)
    # The next look, at the new size, arms the threshold of the grown LV.
    assert decide(dataclasses.replace(state, lv_size=512 * MiB)) == Arm(384 * MiB)


def test_allocation_exactly_at_threshold_is_not_exceeded() -> None:
    # QEMU fires on a write that ends past the threshold.
    assert decide(drive(allocation=128 * MiB, threshold=128 * MiB)) == Nothing()


def test_lv_smaller_than_wanted_headroom_counts_as_exceeded() -> None:
    state = drive(lv_size=EXTENT, chunksize=GiB)
    assert exceeded(state)
    decision = decide(state)
    assert decision == Extend(GiB + EXTENT)


def test_nospace_pause_extends_and_resumes_even_below_threshold() -> None:
    # wr_highest_offset counts successful writes only: a big failed write
    # leaves the allocation low.
    state = drive(allocation=10 * MiB, threshold=128 * MiB, paused_nospace=True,
                  reason=Reason.NOSPACE)
    assert classify(state) is ExtensionState.EXCEEDED
    assert decide(state) == Extend(512 * MiB)


def test_stale_nospace_entry_without_pause_is_judged_by_headroom() -> None:
    assert decide(drive(allocation=10 * MiB, threshold=128 * MiB,
                        reason=Reason.NOSPACE)) == Nothing()


def test_manual_extends_one_chunk_even_with_headroom() -> None:
    state = drive(allocation=0, threshold=128 * MiB, reason=Reason.MANUAL)
    assert decide(state) == Extend(512 * MiB)


def test_last_step_reaches_the_maximum_without_threshold() -> None:
    top = maximum_size(8591507456, EXTENT)
    state = drive(lv_size=8 * GiB, allocation=8 * GiB - 100 * MiB, threshold=8 * GiB - 128 * MiB)
    assert decide(state) == Extend(top)
    at_max = drive(lv_size=top, allocation=8 * GiB, threshold=0)
    assert decide(at_max) == AtMaximum(disarm=False)
    assert classify(at_max) is ExtensionState.AT_MAXIMUM
    assert decide(dataclasses.replace(at_max, threshold=1)) == AtMaximum(disarm=True)


def test_nospace_at_maximum_gets_one_more_chunk() -> None:
    top = maximum_size(8591507456, EXTENT)
    state = drive(lv_size=top, allocation=top, paused_nospace=True, reason=Reason.NOSPACE)
    assert decide(state) == ExtendPastMaximum(top + 256 * MiB, resume=True)
    assert classify(state) is ExtensionState.EXCEEDED
    # And again if a write fails at the new end once more (the failed write
    # counts in the allocation): the image proves it needs it.
    again = dataclasses.replace(state, lv_size=top + 256 * MiB, allocation=top + 257 * MiB)
    assert decide(again) == ExtendPastMaximum(top + 516 * MiB, resume=True)
    # Not when the allocation is where it was: that ENOSPC was answered.
    assert decide(dataclasses.replace(again, allocation=top)) == AtMaximum(disarm=False)


def test_enospc_not_at_the_end_never_passes_the_maximum() -> None:
    """A pause no device owns (a migration's), or a sticky nospace,
    treats every thin drive as paused on ENOSPC; one at its maximum whose
    allocation is far from the LV's end must not grow past it."""
    top = maximum_size(8591507456, EXTENT)
    state = drive(lv_size=top, allocation=3 * GiB, paused_nospace=True, reason=Reason.NOSPACE)
    assert decide(state) == AtMaximum(disarm=False)
    assert classify(state) is ExtensionState.AT_MAXIMUM
    assert not may_pass_maximum(state)
    assert may_pass_maximum(dataclasses.replace(state, allocation=top - EXTENT + 1))
    assert not may_pass_maximum(dataclasses.replace(state, allocation=top - EXTENT))


def test_an_enospc_is_new_until_answered_or_when_the_end_is_near_again() -> None:
    chunk = 256 * MiB
    assert enospc_is_new(None, 512 * MiB, 0, chunk)  # never answered here
    # Answered: the LV got a chunk past the allocation; the same nospace
    # (a blocked resume, a sticky io-status) asks for nothing more...
    assert not enospc_is_new(768 * MiB, 768 * MiB, 500 * MiB, chunk)
    assert not enospc_is_new(768 * MiB, 768 * MiB, 512 * MiB, chunk)
    # ...until the guest wrote to within a chunk of the end again.
    assert enospc_is_new(768 * MiB, 768 * MiB, 512 * MiB + 1, chunk)
    assert enospc_is_new(768 * MiB, 768 * MiB, 769 * MiB, chunk)


def test_a_pause_no_device_owns_grows_only_drives_near_their_end() -> None:
    """A VM that arrives paused after a live migration: this QEMU never saw
    the failed write, so a drive with a chunk of room left is not grown."""
    chunk = 256 * MiB

    def unowned(lv_size: int, allocation: int) -> bool:
        return paused_out_of_room(device_says_nospace=False, unowned_pause=True,
                                  lv_size=lv_size, allocation=allocation, chunksize=chunk)

    # A second disk the guest barely wrote: no chunk; the VM is resumed and
    # the retried write, if it fails again, names its device.
    assert not unowned(GiB, 0)
    assert not unowned(GiB, GiB - chunk)
    # Within a chunk of the end: it may be the one that ran out.
    assert unowned(GiB, GiB - chunk + 1)
    assert unowned(GiB, GiB + MiB)
    # A device that says nospace owns the pause: its drive, wherever the allocation.
    assert paused_out_of_room(device_says_nospace=True, unowned_pause=False, lv_size=GiB,
                              allocation=0, chunksize=chunk)
    # Running, or paused for another reason: no drive.
    assert not paused_out_of_room(device_says_nospace=False, unowned_pause=False,
                                  lv_size=GiB, allocation=GiB + MiB, chunksize=chunk)
    # Such a drive is then decided as any other: its threshold armed, no extension.
    far = drive(lv_size=GiB, allocation=0, paused_nospace=unowned(GiB, 0))
    assert decide(far) == Arm(threshold(GiB, chunk, 0.5))


@given(lv_size=st.integers(1, 1 << 44), allocation=st.integers(0, 1 << 44),
       chunksize=st.integers(1, 1 << 34), owned=st.booleans(), unowned=st.booleans())
def test_only_the_owner_or_a_drive_near_its_end_counts_as_out_of_room(
        lv_size: int, allocation: int, chunksize: int, owned: bool, unowned: bool) -> None:
    counts = paused_out_of_room(device_says_nospace=owned, unowned_pause=unowned,
                                lv_size=lv_size, allocation=allocation, chunksize=chunksize)
    room_left = lv_size - allocation
    assert counts == (owned or (unowned and room_left < chunksize))
    if counts and not owned:
        # Answered once, as any ENOSPC: the chunk it gets takes it out of the rule.
        grown = extend_target(lv_size, allocation, chunksize, 1 << 46, 1)
        assert not paused_out_of_room(device_says_nospace=False, unowned_pause=True,
                                      lv_size=grown, allocation=allocation,
                                      chunksize=chunksize)


def test_table_against_metadata() -> None:
    assert table_state(2 * GiB, 2 * GiB) is TableState.MATCH
    assert table_state(4 * GiB, 2 * GiB) is TableState.BEHIND  # grown elsewhere: refresh
    assert table_state(2 * GiB, 4 * GiB) is TableState.AHEAD   # lost extension: refuse


def test_exact_device_matching() -> None:
    """A device on /dev/san1/vm-101-disk-10 is not on vm-101-disk-1."""
    disk1 = DriveIdentity("/dev/san1/vm-101-disk-1", frozenset({"e1", "f1"}))
    disk10 = BlockDevice("drive-scsi1", "drive-scsi1", device_filenames("/dev/san1/vm-101-disk-10"))
    assert not device_on(disk10, disk1)
    assert device_on(BlockDevice("scsi0", None, device_filenames(disk1.path)), disk1)
    # The root node named as one of the drive's nodes (a plain -blockdev device).
    assert device_on(BlockDevice("scsi0", "f1", frozenset()), disk1)
    # A json: pseudo-filename holds the path in a nested member, exactly.
    nested = ('json:{"driver": "throttle", "file": {"driver": "qcow2", "file": '
              '{"driver": "host_device", "filename": "/dev/san1/vm-101-disk-1"}}}')
    assert device_filenames(nested) == frozenset({disk1.path})
    assert device_on(BlockDevice("scsi0", "drive-scsi0", device_filenames(nested)), disk1)
    assert not device_on(BlockDevice("scsi0", "drive-scsi0", device_filenames(
        nested.replace("disk-1", "disk-10"))), disk1)
    assert device_filenames("json:{broken") == frozenset()


def test_resume_is_blocked_by_a_device_that_is_not_a_usable_thin_drive() -> None:
    thin = DriveIdentity("/dev/san/vm-101-disk-0", frozenset({"e0", "f0"}))
    on_thin = BlockDevice("scsi0", "drive-scsi0", frozenset({thin.path}))
    local = BlockDevice("scsi2", "drive-scsi2", frozenset({"/var/lib/vz/images/101/d.qcow2"}))
    assert resume_blocker([on_thin], [thin], [], unowned_pause=False) is None
    assert resume_blocker([on_thin, local], [thin], [], unowned_pause=False) == ResumeBlocker(
        "scsi2", BlockedBecause.NOT_THIN)
    assert resume_blocker([on_thin], [], [thin], unowned_pause=False) == ResumeBlocker(
        "scsi0", BlockedBecause.DRIVE_FAILED)
    # A migration's pause owned by no device: resumed only if no thin drive failed.
    assert resume_blocker([], [thin], [], unowned_pause=True) is None
    assert resume_blocker([], [], [thin], unowned_pause=True) == ResumeBlocker(
        thin.path, BlockedBecause.DRIVE_FAILED)


def test_not_thin_is_never_touched() -> None:
    assert decide(drive(thin=False, paused_nospace=True, allocation=GiB)) == NotThin()


def test_daemon_knowledge_wins_in_classify() -> None:
    state = drive(allocation=GiB)
    assert classify(state, extending=True) is ExtensionState.EXTENDING
    assert classify(state, failed=True) is ExtensionState.FAILED


@pytest.mark.parametrize(("field", "value"), [
    ("lv_size", -1), ("allocation", -1), ("extent_size", 0), ("chunksize", 0),
    ("chunk_percentage", 0.0), ("chunk_percentage", 1.0),
])
def test_impossible_observations_are_rejected(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        drive(**{field: value})


# --- properties -----------------------------------------------------------------

@st.composite
def states(draw: st.DrawFn) -> DriveState:
    extent = draw(st.sampled_from([1 * MiB, 4 * MiB, 32 * MiB, 64 * MiB]))
    chunksize = draw(st.integers(min_value=1, max_value=4096)) * MiB
    percentage = draw(st.floats(min_value=0.001, max_value=0.999))
    virtual = draw(st.integers(min_value=1, max_value=64 * 1024)) * MiB
    # measure's fully allocated size: a bit more than the virtual size, unaligned.
    measured = virtual + draw(st.integers(min_value=0, max_value=virtual // 100 + 4 * MiB))
    maximum = maximum_size(measured, extent) if draw(st.booleans()) else measured
    top = maximum_size(maximum, extent)
    lv_size = draw(st.integers(min_value=1, max_value=top // extent + 8)) * extent
    allocation = draw(st.one_of(
        st.integers(min_value=0, max_value=lv_size),
        st.integers(min_value=0, max_value=top + 8 * extent)))  # shrunk LVs, outgrown measure
    armed = draw(st.one_of(st.just(0), st.just(threshold(lv_size, chunksize, percentage)),
                           st.integers(min_value=0, max_value=lv_size)))
    return DriveState(lv_size=lv_size, allocation=allocation, threshold=armed,
                      virtual_size=virtual, maximum=maximum, extent_size=extent,
                      chunksize=chunksize, chunk_percentage=percentage,
                      paused_nospace=draw(st.booleans()), reason=draw(st.sampled_from(Reason)),
                      thin=draw(st.booleans()),
                      job_room=draw(st.one_of(st.just(0), st.integers(0, top))))


def carry_out(state: DriveState, decision: Decision) -> DriveState:
    """The drive as it is after the daemon did what ``decision`` says (a real
    daemon re-observes; the allocation is the same, the request consumed)."""
    after = dataclasses.replace(state, reason=Reason.ARM)
    match decision:
        case Arm(threshold=new):
            return dataclasses.replace(after, threshold=new)
        case Extend(target=target):
            # The daemon arms the next threshold on its fresh look, none at the maximum.
            new = 0 if target >= cap(state) else threshold(target, state.chunksize,
                                                           state.chunk_percentage)
            return dataclasses.replace(after, lv_size=target, threshold=new,
                                       paused_nospace=False)
        case ExtendPastMaximum(target=target):
            return dataclasses.replace(after, lv_size=target, threshold=0, paused_nospace=False)
        case AtMaximum():
            return dataclasses.replace(after, threshold=0)
        case _:
            return after


def cap(state: DriveState) -> int:
    return maximum_size(state.maximum, state.extent_size)


# Enough to find the edge cases below in well under a second each.
SETTINGS = settings(max_examples=300, deadline=None)


@SETTINGS
@given(states())
def test_never_past_maximum_except_explicit_enospc_case(state: DriveState) -> None:
    decision = decide(state)
    if isinstance(decision, Extend):
        assert decision.target <= cap(state)
    if isinstance(decision, ExtendPastMaximum):
        assert state.paused_nospace and state.lv_size >= cap(state)
        # Only a failed write at the very end of the LV proves the image needs more.
        assert state.allocation + state.extent_size > state.lv_size
        wanted = max(state.lv_size, state.allocation) + state.chunksize
        assert decision.target == wanted + (-wanted % state.extent_size)


@SETTINGS
@given(states())
def test_never_shrinks_and_every_extension_grows(state: DriveState) -> None:
    decision = decide(state)
    if isinstance(decision, Extend | ExtendPastMaximum):
        assert decision.target > state.lv_size


@SETTINGS
@given(states())
def test_targets_are_extent_aligned_and_smallest(state: DriveState) -> None:
    decision = decide(state)
    if isinstance(decision, Extend | ExtendPastMaximum):
        assert decision.target % state.extent_size == 0
    if isinstance(decision, Extend) and decision.target < cap(state):
        wanted = max(state.lv_size, state.allocation + state.job_room) + state.chunksize
        assert decision.target >= wanted
        assert decision.target - state.extent_size < wanted


@SETTINGS
@given(states())
def test_headroom_after_extension(state: DriveState) -> None:
    decision = decide(state)
    if isinstance(decision, Extend) and decision.target < cap(state):
        headroom = decision.target - state.allocation
        assert headroom >= state.chunksize * state.chunk_percentage
        assert headroom >= state.chunksize
    if isinstance(decision, Extend):
        # The next look, at the new size, arms a threshold above the
        # allocation, so it can fire; at the maximum, none.
        grown = dataclasses.replace(state, lv_size=decision.target, threshold=0,
                                    paused_nospace=False, reason=Reason.ARM)
        if decision.target < cap(state):
            armed = decide(grown)
            assert isinstance(armed, Arm)
            assert state.allocation < armed.threshold < decision.target
        else:
            assert decide(grown) == AtMaximum(disarm=False)


@SETTINGS
@given(states())
def test_arming_only_above_the_allocation(state: DriveState) -> None:
    decision = decide(state)
    if isinstance(decision, Arm):
        assert 0 < decision.threshold < state.lv_size
        assert decision.threshold >= state.allocation
        assert not state.paused_nospace


@SETTINGS
@given(states())
def test_idempotent_for_duplicates(state: DriveState) -> None:
    decision = decide(state)
    after = carry_out(state, decision)
    again = decide(after)
    assert again in (Nothing(), AtMaximum(disarm=False), NotThin())
    # The same entry once more (threshold and nospace reasons; manual forces).
    if state.reason is not Reason.MANUAL:
        duplicate = dataclasses.replace(after, reason=state.reason)
        assert decide(duplicate) == again


@SETTINGS
@given(states())
def test_a_vm_paused_on_nospace_is_always_resumed(state: DriveState) -> None:
    decision = decide(state)
    if state.thin and state.paused_nospace and not (
            state.lv_size >= cap(state) and not may_pass_maximum(state)):
        assert isinstance(decision, Extend | ExtendPastMaximum)


@SETTINGS
@given(states())
def test_not_thin_is_never_touched_property(state: DriveState) -> None:
    assert (decide(state) == NotThin()) == (not state.thin)


@SETTINGS
@given(states())
def test_classify_agrees_with_decide(state: DriveState) -> None:
    assume(state.thin)
    decision = decide(state)
    status = classify(state)
    if status is ExtensionState.EXCEEDED:
        assert isinstance(decision, Extend | ExtendPastMaximum)
    if status is ExtensionState.AT_MAXIMUM:
        assert isinstance(decision, AtMaximum)
    if status in (ExtensionState.IDLE, ExtensionState.ARMED):
        assert isinstance(decision, Nothing | Arm) or state.reason is Reason.MANUAL
    if isinstance(decision, Nothing):
        assert status is ExtensionState.ARMED


@SETTINGS
@given(states(), st.sampled_from([None, 0]))
def test_a_vm_whose_resume_is_blocked_is_grown_a_bounded_number_of_times(
        state: DriveState, answered: int | None) -> None:
    """A blocked resume: the VM stays paused with io-status nospace on the drive
    (another device blocks its resume, or the status is sticky) and the guest
    writes nothing. Pass after pass, the engine answers that ENOSPC once, and
    never grows past the maximum unless the allocation is at the LV's very end.
    (No block job writes either: a job's room is test_blockjobs.py's.)"""
    assume(state.thin)
    state = dataclasses.replace(state, job_room=0)
    lv, remembered, extensions = state.lv_size, answered, 0
    for _ in range(5):
        now = dataclasses.replace(state, lv_size=lv, reason=Reason.NOSPACE)
        paused = enospc_is_new(remembered, lv, state.allocation, state.chunksize)
        decision = decide(dataclasses.replace(now, paused_nospace=paused))
        if isinstance(decision, Extend | ExtendPastMaximum):
            assert paused
            if isinstance(decision, ExtendPastMaximum):
                assert may_pass_maximum(now)
            lv = remembered = decision.target
            extensions += 1
    # An extension to the maximum, then one past it for a write that failed at its end.
    assert extensions <= 2
    assert lv <= max(state.lv_size, cap(state)) or (
        state.allocation + state.extent_size > cap(state))


@SETTINGS
@given(st.integers(min_value=0, max_value=2**50), st.integers(min_value=0, max_value=2**50))
def test_exactly_one_table_state(size: int, table: int) -> None:
    verdict = table_state(size, table)
    assert (verdict is TableState.MATCH) == (size == table)
    assert (verdict is TableState.BEHIND) == (table < size)


paths = st.sampled_from(["/dev/san1/vm-101-disk-1", "/dev/san1/vm-101-disk-10",
                         "/dev/san1/vm-101-disk-1.qcow2", "/dev/san2/vm-101-disk-1"])


@SETTINGS
@given(st.lists(st.tuples(paths, st.sampled_from(["f1", "drive-scsi1", None]),
                          st.booleans()), max_size=4),
       st.lists(paths, max_size=3, unique=True), st.lists(paths, max_size=3, unique=True),
       st.booleans())
def test_resumed_only_when_every_device_out_of_space_is_a_usable_thin_drive(
        devices: list[tuple[str, str | None, bool]], usable_paths: list[str],
        failing_paths: list[str], unowned: bool) -> None:
    def named(path: str, as_json: bool) -> frozenset[str]:
        return device_filenames(f'json:{{"file": {{"filename": "{path}"}}}}' if as_json else path)
    nospace = [BlockDevice(f"d{i}", node, named(path, as_json))
               for i, (path, node, as_json) in enumerate(devices)]
    usable = [DriveIdentity(p, frozenset({f"e-{p}"})) for p in usable_paths]
    failing = [DriveIdentity(p, frozenset({f"e-{p}"})) for p in failing_paths
               if p not in usable_paths]
    blocker = resume_blocker(nospace, usable, failing, unowned_pause=unowned)
    if blocker is None:
        assert all(path in usable_paths for path, _, _ in devices)
        assert not (unowned and failing)
    else:
        assert any(path not in usable_paths for path, _, _ in devices) or (unowned and failing)
