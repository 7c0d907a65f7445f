"""Why a drive was queued: the queue entry's reason is the policy's input.

``JOB`` names a block job, not a node: the job's target is one of the VM's
thin drives, writable while the job runs, and gets armed (or grown, and the
job resumed if it paused on ENOSPC; :mod:`pvestord.policy.blockjobs`).
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
    JOB = "job"              # a block job started or paused; the entry names the job

    @property
    def strength(self) -> int:
        """Merge order: the stronger reason survives a merge."""
        return _STRENGTH[self]

    @property
    def reaches_every_drive(self) -> bool:
        """Whether an entry of this reason that names no thin drive asks for
        every thin drive of its VM: ``nospace`` names the device's root node,
        ``job`` a block job, whose target may be any of them."""
        return self in (Reason.NOSPACE, Reason.JOB)


_STRENGTH = {Reason.ARM: 0, Reason.MANUAL: 1, Reason.JOB: 2, Reason.THRESHOLD: 3,
             Reason.NOSPACE: 4}
