"""When a VM paused for room may run again: pure rules."""

from __future__ import annotations

import enum
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass

from pvestord.policy.devices import BlockDevice, DriveIdentity, device_on


class BlockedBecause(enum.Enum):
    """Why a VM paused for room is not resumed (a journal field's value)."""

    #: A device out of space that is none of our thin drives (a qcow2 on a
    #: full directory storage), or one whose ``nospace`` is left over from an
    #: earlier pause (QEMU keeps it after ``cont`` on ``-blockdev`` devices).
    NOT_THIN = "not-thin"
    #: One of our thin drives failed this pass (LVM error, stale table).
    DRIVE_FAILED = "drive-failed"
    #: A thin drive this pass may grow is past its threshold again after
    #: every round: written faster than grown; the next pass goes on.
    NEEDS_MORE = "needs-more"


@dataclass(frozen=True)
class ResumeBlocker:
    device: str
    because: BlockedBecause


def resume_blocker(nospace: Sequence[BlockDevice], usable: Collection[DriveIdentity],
                   failing: Collection[DriveIdentity], *,
                   unowned_pause: bool) -> ResumeBlocker | None:
    """What keeps a VM paused for room from being resumed; None: resume it.

    ``nospace``: the devices with io-status ``nospace``; ``usable``: thin
    drives that have room now; ``failing``: thin drives whose work failed.
    Resumed only when every device out of space is a usable thin drive; a
    pause no device owns (``unowned_pause``, a migration's) only when no thin
    drive failed.
    """
    for device in nospace:
        if any(device_on(device, drive) for drive in usable):
            continue
        if any(device_on(device, drive) for drive in failing):
            return ResumeBlocker(device.name, BlockedBecause.DRIVE_FAILED)
        return ResumeBlocker(device.name, BlockedBecause.NOT_THIN)
    if unowned_pause and failing:
        return ResumeBlocker(sorted(failing, key=lambda d: d.path)[0].path,
                             BlockedBecause.DRIVE_FAILED)
    return None


@dataclass(frozen=True)
class ResumeDecision:
    """Whether to ``cont`` a VM after a round, and what blocks it if not."""

    resume: bool
    #: Why a VM paused for room stays paused (said to the operator); None
    #: when it resumes, is not paused, or waits for another round.
    blocker: ResumeBlocker | None = None


def may_resume(*, paused_for_room: bool, need_more: bool, nospace: Sequence[BlockDevice],
               usable: Collection[DriveIdentity], failing: Collection[DriveIdentity],
               unowned_pause: bool) -> ResumeDecision:
    """Whether a VM seen after a round's re-arm may run again.

    Only a VM paused for room is resumed, never while a drive still needs
    more (a fast writer already past the new threshold gets another round
    first), and only when nothing blocks it (:func:`resume_blocker`).
    """
    if not paused_for_room or need_more:
        return ResumeDecision(False)
    blocker = resume_blocker(nospace, usable, failing, unowned_pause=unowned_pause)
    return ResumeDecision(blocker is None, blocker)


def needing_more(past_threshold: Iterable[str], may_not_grow: Collection[str]) -> str | None:
    """The first drive past its threshold that the pass may grow, or None.

    Such a drive gets another round before its VM, paused for room, runs
    again. One the pass may not grow now (held back by the VG's reserve,
    left alone while qemu-server renames the VM's LVs) keeps nothing paused:
    waiting for it would keep the VM paused until the reserve or the rename
    is over, and the drive gets its room when it pauses the VM itself.
    """
    return next((drive for drive in past_threshold if drive not in may_not_grow), None)


#: Rounds of extend-then-rearm in one pass: a writer faster than an extension
#: crosses the new threshold before it is armed, and gets another chunk at once;
#: the bound keeps one VM's pass from serving it forever.
MAX_ROUNDS = 4


def another_round(*, need_more: bool, paused_for_room: bool, resumed: bool,
                  extended: bool) -> bool:
    """Whether the pass goes round again after a re-arm: a drive needs more,
    or the VM stays paused for room although this round grew a drive."""
    return need_more or (paused_for_room and not resumed and extended)
