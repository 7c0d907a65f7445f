"""Which storage locks guard one VG's metadata, and in which order they are taken.

Proxmox locks ``storage-<storeid>`` around an LVM metadata change
(``PVE::Storage::Plugin::cluster_lock_storage``), never the VG. Two storages
on one VG (an ``lvm:`` and a ``pvestord:`` one, say) take two different
locks, so their ``lvcreate``/``lvremove`` could write the VG's metadata at the
same moment and one update would be lost. Whoever changes the VG therefore
holds the lock of every storage on it: the daemon and ``pvestord volume``
(:func:`pvestord.adapters.locks.vg_lock`) and the Proxmox plugin
(``PvestordPlugin.pm``'s ``cluster_lock_storage``, which asks
``pvestord plugin`` for this list). One rule for all of them, so that they
take the same locks in the same order (sorted by storage id): two holders
taking a set of locks in one global order cannot deadlock.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from pvestord.policy.storageoptions import flag

#: Storage types whose volumes live in an LVM VG named by ``vgname``: each
#: one's storage lock guards that VG's metadata. ``pvestord`` is our plugin's.
LVM_TYPES = ("lvm", "lvmthin", "pvestord")

#: One section of ``storage.cfg``: its type, its id and its options as written
#: (``None`` for a bare key).
SectionView = tuple[str, str, Mapping[str, str | None]]


def vg_users(sections: Iterable[SectionView], vgname: str) -> list[tuple[str, bool]]:
    """``(storeid, shared)`` of every enabled storage on volume group ``vgname``,
    sorted by storage id: the locks to take, in the order to take them.

    Thin or thick ``lvm:``, ``lvmthin:`` and ``pvestord:`` alike, whatever
    their ``nodes``: a storage restricted to another node still writes a
    shared VG from there. ``disable 1`` storages are left out: Proxmox
    allocates nothing on them. An unreadable ``disable`` counts as enabled
    and an unreadable ``shared`` as shared: one lock more, never one fewer.
    """
    users: dict[str, bool] = {}
    for kind, storeid, options in sections:
        if kind not in LVM_TYPES or options.get("vgname") != vgname:
            continue
        if flag(options, "disable", unreadable=False):
            continue
        users[storeid] = flag(options, "shared", unreadable=True)
    return sorted(users.items())


def locks_for(sections: Iterable[SectionView], vgname: str, storeid: str,
              shared: bool) -> list[tuple[str, bool]]:
    """The locks a metadata change on storage ``storeid`` (of VG ``vgname``)
    takes: :func:`vg_users`, with ``storeid`` itself always among them (its
    own lock is the one Proxmox's callers expect held, even when the section
    says ``disable 1`` or was removed meanwhile), with its ``shared`` as the
    caller locks it."""
    users = dict(vg_users(sections, vgname))
    users[storeid] = shared
    return sorted(users.items())


__all__ = ["LVM_TYPES", "SectionView", "locks_for", "vg_users"]
