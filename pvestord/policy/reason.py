"""Why a drive was queued: the queue entry's reason is the policy's input.

``MANUAL`` (``pvestord extend``) forces a one-chunk extension even with
headroom; the others are judged by the drive's state
(:func:`pvestord.policy.extension.decide`).
"""

from __future__ import annotations

import enum


class Reason(enum.Enum):
    """Why a drive was queued."""

    THRESHOLD = "threshold"  # QEMU's write threshold fired
    NOSPACE = "nospace"      # the VM paused on ENOSPC: the most urgent
    ARM = "arm"              # (re)arm a threshold, e.g. after a migration
    MANUAL = "manual"        # an administrator asked

    @property
    def strength(self) -> int:
        """Merge order: the stronger reason survives a merge."""
        return _STRENGTH[self]


_STRENGTH = {Reason.ARM: 0, Reason.MANUAL: 1, Reason.THRESHOLD: 2, Reason.NOSPACE: 3}
