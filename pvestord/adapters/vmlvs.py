"""A VM's LVs on every thin VG of this node, by the names Proxmox gives them.

One function for what ``pvestord rank-nodes`` (which storages hold the VM)
and the migration hint (which LVs to refresh or pre-extend) both ask: the
LVs of the VM's qcow2 chains, its disks and their snapshot LVs
(:func:`pvestord.policy.lvnames.chain_vmid`), on the VG of every
thin-enabled storage, each VG listed once.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from pvestord.adapters import lvm
from pvestord.adapters.config import StorageConfig, ThinStorage
from pvestord.policy.lvnames import chain_vmid

#: What a caller makes of a VG it cannot list: ``(storeid, vgname, error)``
#: -> the exception to raise instead (the LvmError itself when not given).
ListFailed = Callable[[str, str, lvm.LvmError], Exception]


def vm_lvs(config: StorageConfig, rows: Mapping[str, Sequence[lvm.LvRow]], vmid: int, *,
           active_only: bool = True) -> list[tuple[ThinStorage, lvm.LvRow]]:
    """The thin LVs of ``vmid``'s qcow2 chains among ``rows`` (by VG), with
    the storage of each; only the active ones unless ``active_only`` is False."""
    found = []
    for storage in config.thin_storages.values():
        for row in rows.get(storage.vgname, []):
            if chain_vmid(row.lv) == vmid and (row.active or not active_only):
                found.append((storage, row))
    return found


async def thin_vg_rows(config: StorageConfig, *,
                       failed: ListFailed | None = None) -> dict[str, list[lvm.LvRow]]:
    """Every LV of every thin storage's VG, by VG, each VG listed once.

    :raises lvm.LvmError: a VG could not be listed (or what ``failed`` makes of it).
    """
    rows: dict[str, list[lvm.LvRow]] = {}
    for storeid, storage in config.thin_storages.items():
        if storage.vgname in rows:
            continue
        try:
            rows[storage.vgname] = await lvm.list_lvs(storage.vgname)
        except lvm.LvmError as err:
            if failed is None:
                raise
            raise failed(storeid, storage.vgname, err) from err
    return rows


async def find_vm_lvs(config: StorageConfig, vmid: int, *, active_only: bool = True,
                      failed: ListFailed | None = None) -> list[tuple[ThinStorage, lvm.LvRow]]:
    """:func:`vm_lvs` over this node's LVM (:func:`thin_vg_rows`)."""
    return vm_lvs(config, await thin_vg_rows(config, failed=failed), vmid,
                  active_only=active_only)
