"""When and how far to grow a thin drive: pure functions, no I/O.

Everything here works on byte counts observed by others (LVM, QMP,
``qemu-img``), so it can be tested exhaustively with hypothesis and reused by
the daemon, ``pvestord extend`` and ``pvestord drives`` alike.

Vocabulary
    *allocation*: ``wr_highest_offset`` of the drive's file node, the end of
    the highest write into the LV: the qcow2 image never uses the LV beyond it.
    *headroom wanted*: ``chunksize * chunk-percentage``, rounded up to a byte:
    the share of a chunk still free when the threshold fires.
    *threshold*: ``lv_size - headroom wanted`` (the original proposal's
    formula), armed on the file node. QEMU's write threshold is one-shot and
    fires on a write that ends past it.
    *maximum*: the largest the qcow2 image can become (``qemu-img measure``'s
    fully allocated size plus bitmaps), rounded up to whole extents.

A drive is *exceeded* when its allocation is past the threshold it should
have. That includes an LV too small to hold the wanted headroom at all
(threshold <= 0; e.g. an initial size below half a chunk, or an LV an admin
shrank): it can never be armed, so it must grow first.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

from pvestord.policy.reason import Reason
from pvestord.policy.sizes import align_up


class ExtensionState(enum.Enum):
    """Where a drive stands, for ``pvestord drives`` and status lines."""

    #: Below its threshold with no threshold armed (reconcile will arm it).
    IDLE = "idle"
    #: Below its threshold and a threshold is armed: nothing to do until it fires.
    ARMED = "armed"
    #: Past its threshold, or paused on ENOSPC: needs an extension.
    EXCEEDED = "exceeded"
    #: An extension is in progress (known only to the daemon).
    EXTENDING = "extending"
    #: The LV holds the whole image: never extended again, no threshold.
    AT_MAXIMUM = "at-maximum"
    #: The last extension failed (VG full, LVM error); retried with backoff.
    FAILED = "failed"


@dataclass(frozen=True)
class DriveState:
    """One thin-drive candidate as observed right now. All sizes in bytes.

    :raises ValueError: on construction, for values no observation can produce.
    """

    lv_size: int
    #: ``wr_highest_offset`` of the file node.
    allocation: int
    #: The write threshold currently armed on the file node; 0 = none.
    threshold: int
    #: The qcow2 node's virtual size (reporting only; the maximum derives from it).
    virtual_size: int
    #: The maximum LV size (see :func:`maximum_size`); aligned up to extents here.
    maximum: int
    extent_size: int
    chunksize: int
    chunk_percentage: float
    #: The VM is paused with io-status ``nospace`` on this drive, and that
    #: ENOSPC is one to answer (:func:`enospc_is_new`): the engine passes
    #: False for an ENOSPC it already answered, so that a VM whose resume is
    #: blocked elsewhere is not grown on every pass.
    paused_nospace: bool = False
    reason: Reason = Reason.ARM
    #: A ``host_device`` on a thin-enabled storage under a writable qcow2 node.
    thin: bool = True
    #: What running block jobs can still write into this drive
    #: (:func:`pvestord.policy.room_for_jobs`): the LV must hold it beyond
    #: the allocation, with the usual headroom on top.
    job_room: int = 0

    def __post_init__(self) -> None:
        for name in ("lv_size", "allocation", "threshold", "virtual_size", "maximum",
                     "job_room"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must not be negative: {getattr(self, name)}")
        if self.extent_size <= 0:
            raise ValueError(f"extent_size must be positive: {self.extent_size}")
        if self.chunksize <= 0:
            raise ValueError(f"chunksize must be positive: {self.chunksize}")
        if not 0 < self.chunk_percentage < 1:
            raise ValueError(f"chunk_percentage must be in (0, 1): {self.chunk_percentage}")


# --- decisions ---------------------------------------------------------------

@dataclass(frozen=True)
class Nothing:
    """Enough headroom and the right threshold armed (e.g. a duplicate entry)."""


@dataclass(frozen=True)
class Arm:
    """Enough headroom, but the threshold is missing or wrong: arm this one."""

    threshold: int


@dataclass(frozen=True)
class Extend:
    """Grow the LV to ``target``.

    What follows is decided again on a fresh observation (the size read back
    may differ: someone else extended it too): the threshold to arm, and
    whether a VM paused for room may run.
    """

    target: int


@dataclass(frozen=True)
class ExtendPastMaximum:
    """The drive hit ENOSPC at the very end of an LV that already holds the
    measured maximum (:func:`may_pass_maximum`).

    A fragmented image can outgrow ``qemu-img measure`` (Proxmox bug 6543);
    the write that failed at the end proves it did, so it gets one more
    chunk, no threshold, and the caller logs a loud warning.
    """

    target: int
    resume: bool = True


@dataclass(frozen=True)
class AtMaximum:
    """The LV holds the maximum: nothing to grow; ``disarm`` a leftover threshold."""

    disarm: bool


@dataclass(frozen=True)
class NotThin:
    """Not ours: never touched, never resumed."""


Decision = Nothing | Arm | Extend | ExtendPastMaximum | AtMaximum | NotThin


# --- formulas ----------------------------------------------------------------

def wanted_headroom(chunksize: int, chunk_percentage: float) -> int:
    """``chunksize * chunk_percentage``, rounded up: at least that much stays free."""
    return max(1, math.ceil(chunksize * chunk_percentage))


def threshold(lv_size: int, chunksize: int, chunk_percentage: float) -> int:
    """The write threshold for an LV of ``lv_size``: ``lv_size - headroom wanted``.

    Clamped at 0. A result of 0 is not a threshold (QEMU reads 0 as "none"):
    the LV cannot hold the wanted headroom, so it must be extended, not armed.
    """
    return max(0, lv_size - wanted_headroom(chunksize, chunk_percentage))


def maximum_size(measured_fully_allocated: int, extent_size: int) -> int:
    """The largest the LV ever needs to be: the measured size in whole extents.

    ``measured_fully_allocated`` is ``qemu-img measure``'s fully allocated
    size for the image's virtual size and cluster layout, plus its bitmaps
    (:func:`pvestord.adapters.qemu_img.required_size`).
    """
    return align_up(measured_fully_allocated, extent_size)


def extend_target(lv_size: int, allocation: int, chunksize: int, maximum: int,
                  extent_size: int) -> int:
    """The size to extend to: one chunk beyond the LV or the allocation,
    whichever is further, in whole extents, capped at ``maximum``; never less
    than ``lv_size`` (we never shrink).

    Growing from ``max(lv_size, allocation)`` rather than from the allocation
    alone makes every extension a real step (an event fires just before the
    end, so extending to ``allocation + chunk`` only would often add less than
    a chunk); growing from the allocation too catches a guest that has already
    written past the end (ENOSPC) or an LV smaller than the image's data.
    """
    wanted = align_up(max(lv_size, allocation) + chunksize, extent_size)
    cap = align_up(maximum, extent_size)
    return max(lv_size, min(wanted, cap))


def exceeded(state: DriveState) -> bool:
    """Whether the drive is past the threshold it should have (see module
    doc), or a block job writing into it will pass it (:attr:`DriveState.job_room`)."""
    limit = threshold(state.lv_size, state.chunksize, state.chunk_percentage)
    return limit == 0 or state.allocation + state.job_room > limit


def may_pass_maximum(state: DriveState) -> bool:
    """Whether the allocation reaches the LV's last extent: a write failed at
    the very end of the LV (QEMU counts the failed write in ``wr_highest_offset``).

    Only that proves an image needs more than its measured maximum. A pause
    that no device owns (a migration's) or a sticky ``nospace`` says nothing
    about where the image ends, and must never grow an LV past the maximum.
    """
    return state.allocation + state.extent_size > state.lv_size


def near_its_end(lv_size: int, allocation: int, chunksize: int) -> bool:
    """Whether the allocation has come within a chunk of the LV's end."""
    return allocation + chunksize > lv_size


def paused_out_of_room(*, device_says_nospace: bool, unowned_pause: bool, lv_size: int,
                       allocation: int, chunksize: int) -> bool:
    """Whether a thin drive counts as the one its VM is paused on for lack of room.

    ``device_says_nospace``: a device on the drive has io-status ``nospace``
    while the VM is paused: that device owns the pause. ``unowned_pause``: the
    VM is paused on an I/O error no device owns up to.

    Such a pause comes from another QEMU process (a live migration's source
    that deferred its extension): this process saw neither the failed write
    nor the guest's writes before it, so its figures cannot say which drive
    ran out. Growing every drive by a chunk would spend a chunk per disk on
    disks that had room. Only a drive whose own allocation is within a chunk
    of its LV's end counts; for the others the VM is resumed, and the failed
    write, retried, either lands or fails again on a device that then says
    ``nospace`` and is answered as any ENOSPC. A real I/O error fails again
    as ``failed`` and is never resumed.
    """
    if device_says_nospace:
        return True
    return unowned_pause and near_its_end(lv_size, allocation, chunksize)


def enospc_is_new(answered: int | None, lv_size: int, allocation: int, chunksize: int) -> bool:
    """Whether a drive's ``nospace`` is an ENOSPC still to answer with an extension.

    ``answered``: the LV size the engine left after it last answered an
    ENOSPC of this drive in this QEMU process, None if it never did.

    QEMU keeps a ``-blockdev`` device's io-status at ``nospace`` after ``cont``,
    and a VM whose resume is blocked (another device out of space) stays
    paused with it: the same ``nospace`` is seen on every pass. It is new only
    when never answered, or when the allocation has come within a chunk of
    the LV's end again (an extension leaves at least a chunk past it, so the
    guest must have written since: a fresh ENOSPC at the new end).
    """
    return answered is None or near_its_end(lv_size, allocation, chunksize)


def decide(state: DriveState) -> Decision:
    """What to do for a drive in ``state``. Idempotent: deciding again after
    carrying out the decision, with the same allocation, yields :class:`Nothing`
    (or :class:`AtMaximum` with nothing to disarm).

    Rules, in order:

    1. not thin: :class:`NotThin`;
    2. the LV holds the maximum: :class:`ExtendPastMaximum` if paused on
       ENOSPC at the very end of the LV (:func:`may_pass_maximum`), else
       :class:`AtMaximum` (an ENOSPC elsewhere, or a pause that no device
       owns, proves nothing about this image's size);
    3. paused on ENOSPC, or a manual request: :class:`Extend`, whatever the
       headroom looks like (``wr_highest_offset`` counts only writes that
       succeeded, so the failed one is not in it);
    4. past the threshold: :class:`Extend` at once. Arming a threshold below
       the allocation would not fire until the next write beyond it; the
       guest may already be close to the end. A block job's room counts as
       written already: a job at disk speed would outrun a chunk, so its
       target grows by all the job can still write, in one step;
    5. the right threshold armed: :class:`Nothing`; else :class:`Arm`.

    A ``nospace`` entry for a VM that is no longer paused is judged by its
    headroom like any other (it is most likely a duplicate of work done).
    """
    if not state.thin:
        return NotThin()
    cap = align_up(state.maximum, state.extent_size)
    if state.lv_size >= cap:
        if state.paused_nospace and may_pass_maximum(state):
            # From the allocation too: a failed write past the end counts in it.
            target = align_up(max(state.lv_size, state.allocation) + state.chunksize,
                              state.extent_size)
            return ExtendPastMaximum(target)
        return AtMaximum(disarm=state.threshold != 0)
    if state.paused_nospace or state.reason is Reason.MANUAL or exceeded(state):
        target = extend_target(state.lv_size, state.allocation + state.job_room,
                               state.chunksize, cap, state.extent_size)
        return Extend(target)
    wanted = threshold(state.lv_size, state.chunksize, state.chunk_percentage)
    if state.threshold == wanted:
        return Nothing()
    return Arm(wanted)


def classify(state: DriveState, *, extending: bool = False,
             failed: bool = False) -> ExtensionState:
    """The reporting state of a thin drive.

    ``extending`` and ``failed`` are what only the daemon knows (an extension
    in progress, the last one failed); they take precedence over what the
    sizes say. ``state.reason`` is ignored: this describes the drive, not a
    request.
    """
    if extending:
        return ExtensionState.EXTENDING
    if failed:
        return ExtensionState.FAILED
    if state.lv_size >= align_up(state.maximum, state.extent_size):
        return (ExtensionState.EXCEEDED if state.paused_nospace and may_pass_maximum(state)
                else ExtensionState.AT_MAXIMUM)
    if state.paused_nospace or exceeded(state):
        return ExtensionState.EXCEEDED
    return ExtensionState.ARMED if state.threshold != 0 else ExtensionState.IDLE
