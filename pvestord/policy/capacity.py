"""How full a thin VG is, how fast it fills, and what its guards allow.

Thin provisioning overcommits a VG on purpose: the images' measured maxima
add up to more than it holds. When it fills, every thin VM on it pauses at
the end of its chunk, so the figures here are what an admin needs to see it
coming, and the guards are what keeps the last room for the VMs that run.

Defaults, and why:

- ``thin-warn-free`` 10 %: at the growth rates a thin VG sees, a tenth of it
  is hours to days of writes, time for an admin to act on one warning.
- ``thin-critical-free`` 5 %: new volumes stop well before the VG is full,
  so what is left serves the running VMs' extensions (never refused by it).
- ``thin-reserve`` one chunk of the storage: exactly what one paused VM needs to
  run again (an answer to ENOSPC grows one chunk), so a full VG never leaves
  a paused VM without the room to resume; ``0`` turns it off.
- ``max-overcommit`` unset, no cap: overcommit is the point of thin
  provisioning and its safe ratio depends on the guests (how much of their
  disks they ever write); the free-space guards protect every VG, and the cap
  is there for an admin who knows the workload's ratio.

Nothing here reads LVM or the clock: the figures come from LVM's reports.
"""

from __future__ import annotations

import enum
import math
import re
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

from pvestord.policy.sizes import format_size, parse_size

#: The growth window: allocations over the last hour.
GROWTH_WINDOW = 3600.0
#: A rate measured over less than this is noise (one extension), not a trend.
MIN_GROWTH_SPAN = 60.0
#: The storage.cfg options this module reads. Prefixed: Proxmox's storage
#: properties share one namespace across every plugin, and a name declared by
#: two plugins stops PVE::Storage from loading (see storageoptions.PREFIX).
WARN_FREE = "pvestord-thin-warn-free"
CRITICAL_FREE = "pvestord-thin-critical-free"
MAX_OVERCOMMIT = "pvestord-max-overcommit"
THIN_RESERVE = "pvestord-thin-reserve"
OPTIONS = (WARN_FREE, CRITICAL_FREE, MAX_OVERCOMMIT, THIN_RESERVE)
_PERCENT = re.compile(r"(\d+(?:\.\d+)?)%")
_RATIO = re.compile(r"\d+(?:\.\d+)?")


@dataclass(frozen=True)
class FreeThreshold:
    """Free space as a share of the VG (``10%``) or as bytes (``50G``)."""

    percent: float | None = None
    size: int | None = None

    def bytes_of(self, vg_size: int) -> int:
        if self.size is not None:
            return self.size
        return math.ceil(vg_size * (self.percent or 0.0) / 100)

    def __str__(self) -> str:
        return format_size(self.size) if self.size is not None else f"{self.percent:g}%"


@dataclass(frozen=True)
class Guards:
    """The capacity options of one thin storage."""

    warn_free: FreeThreshold = FreeThreshold(percent=10.0)
    critical_free: FreeThreshold = FreeThreshold(percent=5.0)
    #: Committed / VG size above which new volumes are refused; None: no cap.
    max_overcommit: float | None = None
    #: Bytes an extension of a running VM leaves free; None: one chunk.
    reserve: int | None = None

    def reserve_bytes(self, chunksize: int) -> int:
        return chunksize if self.reserve is None else self.reserve


def parse_guards(options: Mapping[str, str | None],
                 problem: Callable[[str, str], None]) -> Guards:
    """The guards set in ``options``; each unusable value is told to ``problem``
    (option, reason) and replaced by its default."""
    default = Guards()
    warn = _threshold(options, WARN_FREE, default.warn_free, problem)
    critical = _threshold(options, CRITICAL_FREE, default.critical_free, problem)
    ratio: float | None = None
    text = options.get(MAX_OVERCOMMIT)
    if MAX_OVERCOMMIT in options:
        if text is None or not _RATIO.fullmatch(text) or float(text) <= 0:
            problem(MAX_OVERCOMMIT, "not a positive ratio (committed maxima over the VG"
                    " size, e.g. 3 or 2.5)")
        else:
            ratio = float(text)
    reserve: int | None = None
    if THIN_RESERVE in options:
        try:
            reserve = parse_size(options[THIN_RESERVE] or "")
        except ValueError:
            problem(THIN_RESERVE, "not a size (e.g. 4G, or 0 for none)")
    return Guards(warn, critical, ratio, reserve)


def _threshold(options: Mapping[str, str | None], option: str, default: FreeThreshold,
               problem: Callable[[str, str], None]) -> FreeThreshold:
    if option not in options:
        return default
    text = options[option] or ""
    match = _PERCENT.fullmatch(text)
    if match is not None:
        percent = float(match.group(1))
        if percent <= 100:
            return FreeThreshold(percent=percent)
        problem(option, "a share of the VG is at most 100%")
        return default
    try:
        return FreeThreshold(size=parse_size(text))
    except ValueError:
        problem(option, "not a share of the VG (e.g. 10%) or a size (e.g. 50G)")
        return default


# --- the maximum recorded with each thin LV -----------------------------------
#
# A thin LV's maximum (what its image may grow to) is written into an LV tag
# where it is created and where its virtual size changes, under the storage
# lock. Tags are VG metadata: every node of the cluster reads the same ones
# with one ``lvs``, without activating the LV or opening its image, so every
# node reports the same figures for a VG and the guards hold cluster-wide.
# LVM allows ``A-Z a-z 0-9 _ + . - / = ! : # &`` in a tag, 1024 characters at
# most, not starting with a hyphen: the prefix and decimal digits are all that.

#: The tag's prefix; the rest is the maximum in bytes, decimal. Not Proxmox's
#: ``pve-`` namespace, which its LVM plugin owns (``pve-vm-<vmid>``, ``pve-<volname>``).
MAXIMUM_TAG_PREFIX = "pvestord-max-"
#: Digits a recorded maximum may have: up to 2^63 (an exabyte and more);
#: longer ones are not ours (or hostile) and are not read.
_MAXIMUM_DIGITS = re.compile(r"[0-9]{1,19}")
_MAXIMUM_LIMIT = 10**19


def maximum_tag(maximum: int) -> str:
    """The tag recording ``maximum`` bytes."""
    if not 0 < maximum < _MAXIMUM_LIMIT:
        raise ValueError(f"a maximum is a positive number of bytes below"
                         f" {_MAXIMUM_LIMIT}, not {maximum!r}")
    return f"{MAXIMUM_TAG_PREFIX}{maximum}"


#: The tag of a copy target: an LV made thick (at its maximum) for a copy
#: qemu-server runs into it with nobody to grow it (clone, move, import,
#: restore, a migration's NBD target). The Proxmox plugin has it reduced to
#: its data plus a chunk, and the tag dropped, once the copy is over
#: (:mod:`pvestord.features.volumes.copies`), or the daemon does under the
#: running VM whose disk it became (:mod:`pvestord.engine.livereduce`); the
#: Perl reads it by this name.
COPY_TAG = "pvestord-copy"


def is_maximum_tag(tag: str) -> bool:
    """A tag of this family, readable or not (for removal when it is replaced)."""
    return tag.startswith(MAXIMUM_TAG_PREFIX)


def maximum_from_tags(tags: Iterable[str]) -> int | None:
    """The maximum recorded in ``tags``; None when none is readable.

    Only plain ASCII digits are read (``int`` would also take ``"٣"``,
    ``"+1"``, ``" 1"`` or ``"1_0"``); zero is no maximum. Two readable tags
    (an admin's ``--addtag`` next to ours) give the larger one: the guards
    rather count too much than too little."""
    found = [int(tag[len(MAXIMUM_TAG_PREFIX):]) for tag in tags
             if is_maximum_tag(tag)
             and _MAXIMUM_DIGITS.fullmatch(tag[len(MAXIMUM_TAG_PREFIX):]) is not None]
    best = max(found, default=0)
    return best if best > 0 else None


def retag_maximum(tags: Collection[str], maximum: int) -> tuple[list[str], list[str]]:
    """(tags to delete, tags to add) so that an LV with ``tags`` records
    ``maximum`` alone; both empty when it already does (no LVM change)."""
    new = maximum_tag(maximum)
    stale = sorted({tag for tag in tags if is_maximum_tag(tag) and tag != new})
    return stale, [] if new in tags else [new]


# --- accounting -------------------------------------------------------------

@dataclass(frozen=True)
class LvUsage:
    """One LV of the VG, as LVM reports it."""

    size: int
    #: Thin LVs: the image's maximum (what it may grow to), recorded in the
    #: LV's tag or measured; None if unknown (an LV made before the tag, or
    #: by Proxmox's ``lvm`` type, inactive here). Thick LVs: not thin.
    maximum: int | None = None
    thin: bool = True


@dataclass(frozen=True)
class Sample:
    """Bytes allocated in the VG (size - free) at a moment (seconds)."""

    at: float
    allocated: int


@dataclass(frozen=True)
class Account:
    """One VG's capacity, from one report and the recent samples."""

    vg: str
    size: int
    free: int
    #: Sum of the thin LVs' sizes (what they hold now).
    thin_allocated: int
    #: Sum of the thin LVs' maxima (their virtual commitment); an LV whose
    #: maximum is unknown counts at its size, and is counted in ``unmeasured``
    #: (the figure is then partial: a floor, not the commitment).
    thin_virtual: int
    unmeasured: int
    #: Everything the VG would need if every thin LV filled, over its size.
    overcommit: float
    #: Allocation growth over ``growth_span`` seconds (at most the last hour).
    growth: int | None
    growth_span: float | None
    #: Seconds until full at that rate; None when not filling (or unknown).
    time_to_full: float | None

    @property
    def committed(self) -> int:
        thick = self.size - self.free - self.thin_allocated
        return max(thick, 0) + self.thin_virtual

    def __str__(self) -> str:
        return (f"VG {self.vg}: {format_size(self.free)} free of {format_size(self.size)}, "
                f"overcommit {self.overcommit:.2f}")


def keep_samples(samples: Sequence[Sample], now: float,
                 window: float = GROWTH_WINDOW) -> list[Sample]:
    """The samples a growth over ``window`` needs: those inside it, and the
    last one before it (so a full window is measured even with sparse samples)."""
    ordered = sorted(samples, key=lambda s: s.at)
    inside = [s for s in ordered if s.at >= now - window]
    before = [s for s in ordered if s.at < now - window]
    return before[-1:] + inside


def growth(samples: Sequence[Sample], now: float,
           window: float = GROWTH_WINDOW) -> tuple[int, float] | None:
    """Allocated bytes gained over the last ``window`` and the span measured;
    None with less than :data:`MIN_GROWTH_SPAN` of history."""
    inside = [s for s in sorted(samples, key=lambda s: s.at) if now - window <= s.at <= now]
    if len(inside) < 2 or inside[-1].at - inside[0].at < MIN_GROWTH_SPAN:
        return None
    return inside[-1].allocated - inside[0].allocated, inside[-1].at - inside[0].at


def time_to_full(free: int, gained: int, span: float) -> float | None:
    """Seconds until ``free`` is gone at the rate ``gained`` / ``span``."""
    if gained <= 0 or span <= 0:
        return None
    return free / (gained / span)


def account(vg: str, size: int, free: int, lvs: Iterable[LvUsage],
            samples: Sequence[Sample] = (), now: float = 0.0) -> Account:
    """The VG's :class:`Account` (``samples`` give the growth; may be empty)."""
    thin = [lv for lv in lvs if lv.thin]
    allocated = sum(lv.size for lv in thin)
    virtual = sum(max(lv.size, lv.maximum or 0) for lv in thin)
    unmeasured = sum(1 for lv in thin if lv.maximum is None)
    thick = max(size - free - allocated, 0)
    ratio = (thick + virtual) / size if size > 0 else 0.0
    grown = growth(samples, now)
    gained, span = grown if grown is not None else (None, None)
    to_full = time_to_full(free, gained, span) if gained is not None and span else None
    return Account(vg, size, free, allocated, virtual, unmeasured, ratio, gained, span, to_full)


# --- guards -----------------------------------------------------------------

class Level(enum.IntEnum):
    """How close to full a VG is (ordered: higher is worse)."""

    OK = 0
    WARN = 1
    CRITICAL = 2


def level(free: int, size: int, guards: Guards) -> Level:
    if free < guards.critical_free.bytes_of(size):
        return Level.CRITICAL
    if free < guards.warn_free.bytes_of(size):
        return Level.WARN
    return Level.OK


def warn_now(previous: Level | None, current: Level) -> bool:
    """A journal warning once per crossing: when the level gets worse (not
    while it stays, nor when it gets better; a new crossing warns again)."""
    return current > (previous if previous is not None else Level.OK)


def new_volume_refusal(account: Account, guards: Guards, *, lv_size: int,
                       maximum: int, storeid: str) -> str | None:
    """Why a new thin volume (initial ``lv_size``, image ``maximum``) must not
    be created on this VG; None when it may. Running VMs are not concerned."""
    critical = guards.critical_free.bytes_of(account.size)
    if account.free - lv_size < critical:
        return (f"storage '{storeid}': refusing a new thin volume: {account.vg} would have"
                f" {format_size(max(account.free - lv_size, 0))} free, below its"
                f" {CRITICAL_FREE} of {guards.critical_free} ({format_size(critical)});"
                " the rest is kept for the running VMs to grow. Free space in the VG or"
                f" lower {CRITICAL_FREE} in storage.cfg")
    if guards.max_overcommit is not None and account.size > 0:
        ratio = (account.committed + maximum) / account.size
        if ratio > guards.max_overcommit:
            return (f"storage '{storeid}': refusing a new thin volume: it would bring"
                    f" {account.vg}'s overcommit to {ratio:.2f}, above its {MAX_OVERCOMMIT}"
                    f" of {guards.max_overcommit:g} (committed maxima over the VG size)")
    return None


def extension_refusal(*, vg_free: int, grow_by: int, reserve: int,
                      vm_paused_for_room: bool) -> str | None:
    """Why an extension by ``grow_by`` must wait; None when it may go.

    It never takes the VG's last ``reserve``, except to let a VM paused on
    ENOSPC run again: the reserve exists for exactly that one. Every thin
    drive of that VM may take it (``vm_paused_for_room``), not only the
    drive it paused on: one held back there would keep the VM paused. An extension
    that does not fit at all is not held: LVM refuses it as a full VG, an
    error that keeps the queue entry and is retried until room is added.
    """
    if vm_paused_for_room or grow_by <= 0 or grow_by > vg_free or vg_free - grow_by >= reserve:
        return None
    left = max(vg_free - grow_by, 0)
    return (f"the extension by {format_size(grow_by)} would leave {format_size(left)} free,"
            f" inside the VG's reserve of {format_size(reserve)} (kept to let a VM"
            " paused on ENOSPC run again)")
