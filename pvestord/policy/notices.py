"""Which events reach Proxmox's notification system, and with what.

The journal and Prometheus say everything; an admin who set up targets and
matchers in Datacenter → Notifications (mail, gotify, webhook) looks there
instead. Four conditions are worth a message there, because each needs a
person:

- a VG crossing below its ``thin-warn-free`` (warning) or
  ``thin-critical-free`` (error): free space in the VG or move images;
- a VM paused for room (warning): its thin drive hit ENOSPC; it is resumed
  once grown, and stays paused if the VG cannot give the room;
- a VG marked unhealthy (error): no LVM change is made on it until someone
  checked it and removed the mark;
- a ``pvestord:`` storage vanished from storage.cfg (error): its VMs' LVs
  are grown from the kept copy only until it is put back.

The daemon checks these conditions on every pass; a message per pass would
bury the one that matters, so :class:`Announcements` gives one notice per
occurrence: when a condition starts, or gets worse (warn → critical), and
not again until it ended and starts anew.

Nothing here sends anything or reads the clock: :mod:`pvestord.adapters.notify`
sends, the engine says what it saw.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

#: The ``type`` metadata field, Proxmox's own convention (``vzdump``,
#: ``replication``, ``package-updates``): a matcher's ``match-field
#: exact:type=pvestord`` selects every pvestord notification.
TYPE = "pvestord"


class Severity(enum.StrEnum):
    """PVE::Notify's severities (what a matcher's ``match-severity`` takes)."""

    INFO = "info"
    NOTICE = "notice"
    WARNING = "warning"
    ERROR = "error"


@dataclass(frozen=True)
class Notice:
    """One call of ``PVE::Notify::notify(severity, template, data, fields)``."""

    severity: Severity
    #: The template's name: ``<template>-subject.txt.hbs`` and
    #: ``<template>-body.txt.hbs`` render it.
    template: str
    #: What the templates print.
    data: dict[str, str]
    #: The metadata matchers filter on (``match-field``).
    fields: dict[str, str]


@dataclass(frozen=True)
class LowSpace:
    """A VG's free space crossed below one of its guards."""

    vg: str
    #: ``warn`` or ``critical``.
    level: str
    free: str
    size: str
    #: The guard crossed, as configured (``10%``, ``50G``).
    limit: str


@dataclass(frozen=True)
class VmPaused:
    """A VM paused for room (ENOSPC on a thin drive)."""

    vmid: int
    #: The devices that hit ENOSPC (their ``query-block`` names).
    drives: tuple[str, ...]


@dataclass(frozen=True)
class VgMarked:
    """A VG was marked unhealthy on this node."""

    vg: str
    reason: str
    #: The mark's file, removed by hand once the VG was checked.
    mark: str


@dataclass(frozen=True)
class StorageVanished:
    """A ``pvestord:`` section vanished from storage.cfg."""

    storage: str
    source: str
    last_seen: str
    restore: str


Event = LowSpace | VmPaused | VgMarked | StorageVanished

#: Conditions are told apart by kind and subject: one VG's low space is not
#: another's, and a VG's low space is not its unhealthy mark.
Key = tuple[str, str]

#: The template names, one per kind; shipped in packaging/notification-templates.
TEMPLATES = {
    LowSpace: "pvestord-low-space",
    VmPaused: "pvestord-vm-paused",
    VgMarked: "pvestord-vg-unhealthy",
    StorageVanished: "pvestord-storage-vanished",
}


def low_space_key(vg: str) -> Key:
    return (TEMPLATES[LowSpace], vg)


def paused_key(vmid: int) -> Key:
    return (TEMPLATES[VmPaused], str(vmid))


def marked_key(vg: str) -> Key:
    return (TEMPLATES[VgMarked], vg)


def vanished_key(storage: str) -> Key:
    return (TEMPLATES[StorageVanished], storage)


def key_of(event: Event) -> Key:
    """The condition ``event`` belongs to."""
    match event:
        case LowSpace(vg=vg):
            return low_space_key(vg)
        case VgMarked(vg=vg):
            return marked_key(vg)
        case VmPaused(vmid=vmid):
            return paused_key(vmid)
        case StorageVanished(storage=storage):
            return vanished_key(storage)


def rank_of(event: Event) -> int:
    """How bad ``event`` is within its condition: a higher rank is news
    (critical after warn), an equal or lower one is not (warn after critical
    is recovery, and goes to the journal only)."""
    if isinstance(event, LowSpace) and event.level == "critical":
        return 2
    return 1


def notice_for(event: Event, hostname: str) -> Notice:
    """The notification for ``event`` on node ``hostname``."""
    base = {"type": TYPE, "hostname": hostname}
    template = TEMPLATES[type(event)]
    match event:
        case LowSpace():
            data = {"hostname": hostname, "vg": event.vg, "level": event.level,
                    "free": event.free, "size": event.size, "limit": event.limit,
                    "guard": f"thin-{event.level}-free"}
            severity = Severity.ERROR if event.level == "critical" else Severity.WARNING
            fields = {**base, "event": "low-space", "vg": event.vg, "level": event.level}
        case VmPaused():
            drives = ", ".join(event.drives) or "(no device reported nospace)"
            data = {"hostname": hostname, "vmid": str(event.vmid), "drives": drives}
            severity = Severity.WARNING
            fields = {**base, "event": "vm-paused", "vmid": str(event.vmid)}
        case VgMarked():
            data = {"hostname": hostname, "vg": event.vg, "reason": event.reason,
                    "mark": event.mark}
            severity = Severity.ERROR
            fields = {**base, "event": "vg-unhealthy", "vg": event.vg}
        case StorageVanished():
            data = {"hostname": hostname, "storage": event.storage, "source": event.source,
                    "last-seen": event.last_seen, "restore": event.restore}
            severity = Severity.ERROR
            fields = {**base, "event": "storage-vanished", "storage": event.storage}
    return Notice(severity, template, data, fields)


class Announcements:
    """One notice per occurrence of a condition, however many passes see it."""

    def __init__(self, hostname: str) -> None:
        self.hostname = hostname
        #: The rank last announced per condition that has not ended.
        self._announced: dict[Key, int] = {}

    def seen(self, event: Event) -> Notice | None:
        """``event`` holds now: its notice if it is news, else None."""
        key, rank = key_of(event), rank_of(event)
        if self._announced.get(key, 0) >= rank:
            return None
        self._announced[key] = rank
        return notice_for(event, self.hostname)

    def over(self, key: Key) -> None:
        """The condition ``key`` ended: its next occurrence is announced again."""
        self._announced.pop(key, None)

    def lowered(self, key: Key, rank: int) -> None:
        """The condition eased to ``rank`` without ending (critical → warn):
        getting worse again is news again."""
        if key in self._announced:
            self._announced[key] = min(self._announced[key], rank)
