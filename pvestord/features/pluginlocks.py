"""``pvestord plugin``'s ``locks`` op: the locks the Proxmox plugin takes, and the VG mark.

Every Proxmox storage call that changes our storage's VG metadata
(allocation, free, snapshot, rollback, resize, rename, and the plugin's own
growths) locks through the plugin's ``cluster_lock_storage``. Before it takes
anything it asks here:

request ``{"op": "locks", "storage": {"storeid", "vgname", "shared"},
"storages": [{"storeid", "type", "vgname", "shared", "disable"}, ...]}``
(every section of ``storage.cfg`` as Proxmox parsed it; values as text or
numbers) -> ``{"locks": [{"storeid", "shared"}, ...], "vg", "health_mark"}``.

``locks``: :func:`pvestord.policy.vglocks.locks_for`, the storage locks of
every storage on the VG in the order the daemon takes them (sorted by id),
each as Proxmox locks that storage (``shared``: ``cfs_lock_storage``, else a
``flock``). ``health_mark``: the file that marks the VG unhealthy on this
node (:mod:`pvestord.adapters.vghealth`); the plugin looks at it again once it
holds the locks (the daemon may have marked the VG while the plugin waited)
and asks again to have the refusal.

A VG marked on this node is refused here, before any lock: an ``lvm`` of
ours that SIGKILL did not end may still write the VG's metadata, and an
``lvcreate`` or ``lvremove`` of Proxmox's from this node would be the second
writer that loses an update. The daemon refuses its extensions for the same
reason; the refusal names the mark and the runbook.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pvestord.adapters import lvm
from pvestord.adapters.vghealth import VgMarks, VgUnhealthyError
from pvestord.errors import PvestordError
from pvestord.policy.vglocks import SectionView, locks_for

#: Where the operator finds what to do about a marked VG (installed uncompressed).
RUNBOOK = ("/usr/share/doc/pvestord/operations.md, 'The storage lock, and a VG"
           " marked unhealthy'")


class LocksRequestError(PvestordError):
    """A ``locks`` request the protocol does not allow (a bug in the caller)."""


class VgMarkedError(PvestordError):
    """The VG is marked unhealthy on this node: Proxmox's change is refused."""


@dataclass(frozen=True)
class LocksRequest:
    storeid: str
    vgname: str
    shared: bool
    sections: tuple[SectionView, ...]


def _text(value: object) -> str | None:
    """An option value as storage.cfg would hold it: Proxmox's parsed booleans
    are numbers, JSON's are true/false."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)


def parse_locks_request(data: Mapping[str, Any]) -> LocksRequest:
    """:raises LocksRequestError: not a ``locks`` request."""
    storage = data.get("storage")
    if not isinstance(storage, dict):
        raise LocksRequestError("locks: 'storage' must be an object")
    storeid, vgname = storage.get("storeid"), storage.get("vgname")
    if not isinstance(storeid, str) or not isinstance(vgname, str):
        raise LocksRequestError("locks: 'storage' needs storeid and vgname")
    lvm.check_name("VG", vgname)
    storages = data.get("storages")
    if not isinstance(storages, list):
        raise LocksRequestError("locks: 'storages' must be a list of sections")
    sections: list[SectionView] = []
    for entry in storages:
        if not isinstance(entry, dict) or not isinstance(entry.get("storeid"), str) \
                or not isinstance(entry.get("type"), str):
            raise LocksRequestError(f"locks: a section needs storeid and type, got {entry!r}")
        options = {key: _text(entry[key]) for key in ("vgname", "shared", "disable")
                   if entry.get(key) is not None}
        sections.append((entry["type"], entry["storeid"], options))
    return LocksRequest(storeid, vgname, bool(storage.get("shared")), tuple(sections))


def answer_locks(request: LocksRequest, health: VgMarks) -> dict[str, Any]:
    """The locks to take and the mark to look at again under them.

    :raises VgMarkedError: the VG is marked unhealthy on this node.
    """
    try:
        health.check(request.vgname)
    except VgUnhealthyError as err:
        raise VgMarkedError(
            f"storage '{request.storeid}': {err}. Until then Proxmox's changes on this"
            f" VG from this node are refused too (an LVM command of pvestord's may still"
            f" write its metadata); see {RUNBOOK}") from err
    locks = locks_for(request.sections, request.vgname, request.storeid, request.shared)
    mark = health.path(request.vgname)
    return {"locks": [{"storeid": storeid, "shared": shared} for storeid, shared in locks],
            "vg": request.vgname, "health_mark": str(mark)}


__all__ = ["RUNBOOK", "LocksRequest", "LocksRequestError", "VgMarkedError", "answer_locks",
           "parse_locks_request"]
