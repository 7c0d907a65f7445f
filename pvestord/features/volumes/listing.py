"""List the qcow2 volumes of every thin storage, and what shrinking gives back."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from pvestord import policy
from pvestord.adapters import lvm, qemu_img
from pvestord.adapters.config import ThinStorage
from pvestord.errors import PvestordError
from pvestord.features.volumes.storage import VolumeSettings, load_config
from pvestord.policy.lvnames import chain_vmid, is_snapshot
from pvestord.policy.volumes import shrink_target

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class VolumeRow:
    """One qcow2 LV of a thin storage; image figures only where safely readable."""

    volid: str
    storage: str
    vmid: int
    lv: str
    lv_size: int
    #: ``in-use`` (open), ``active`` or ``inactive`` on this node.
    state: str
    image_end: int | None = None
    virtual_size: int | None = None
    maximum: int | None = None
    #: What ``shrink`` would give back, when the image end is known.
    reclaimable: int | None = None
    error: str | None = None

    @property
    def snapshot(self) -> bool:
        """A snapshot LV of a disk's chain (``snap_vm-...``), not a volume of
        its own: Proxmox lists it as the disk's snapshot."""
        return is_snapshot(self.lv)


async def list_volumes(settings: VolumeSettings) -> list[VolumeRow]:
    """Every qcow2 volume of every thin-enabled storage, as this node sees it.

    Nothing is activated: an inactive LV cannot be read, so its image figures
    stay unknown (``shrink --dry-run`` activates and reads it). An open LV is
    read with ``qemu-img info -U`` (metadata only); its image end is not
    meaningful while a guest writes.
    """
    config = load_config(settings)
    reports: list[VolumeRow] = []
    for storage in config.thin_storages.values():
        try:
            vg = await lvm.vg_info(storage.vgname)
            rows = await lvm.list_lvs(storage.vgname)
        except lvm.LvmError as err:
            log.warning("storage '%s': %s", storage.storeid, err)
            continue
        for row in rows:
            # Disks and their snapshot LVs (a chain's backing files grow too:
            # a commit writes into them).
            vmid = chain_vmid(row.lv)
            if vmid is not None:
                reports.append(await _report(storage, vg.extent_size, row, vmid))
    return reports


async def _report(storage: ThinStorage, extent: int, row: lvm.LvRow,
                  vmid: int) -> VolumeRow:
    state = "in-use" if row.open else "active" if row.active else "inactive"
    base = VolumeRow(f"{storage.storeid}:{row.lv}", storage.storeid, vmid, row.lv,
                        row.size, state)
    if state == "inactive":
        return base
    path = f"/dev/{row.vg}/{row.lv}"
    try:
        image = await qemu_img.info(path, force_share=row.open)
        maximum = policy.maximum_size(await qemu_img.maximum_required(image), extent)
        end = reclaim = None
        if not row.open:
            checked = await qemu_img.check(path)
            end = checked.image_end_offset
            if end is not None:
                reclaim = row.size - shrink_target(row.size, end, storage.chunksize,
                                                   storage.initial_size, extent)
    except PvestordError as err:
        return VolumeRow(base.volid, base.storage, vmid, row.lv, row.size, state,
                            error=str(err))
    return VolumeRow(base.volid, base.storage, vmid, row.lv, row.size, state, end,
                        image.virtual_size, maximum, reclaim)
