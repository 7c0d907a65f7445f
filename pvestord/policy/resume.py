"""When a VM paused for room may run again: pure rules."""

from __future__ import annotations

import enum
from collections.abc import Collection, Sequence
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
