"""Record the maximum of the thin LVs made before it was recorded (``volume record-maxima``).

Every node's capacity figures and ``max-overcommit`` read a thin LV's maximum
from its ``pvestord-max-<bytes>`` tag (:mod:`pvestord.adapters.vgspace`); an
LV without it (made before this version, or by Proxmox's ``lvm`` type) counts
at its LV size, and the figures are partial. This adds the tag where it can
be known without harm:

- a qcow2 LV active on this node: its image is read (``qemu-img info -U``,
  which a running QEMU allows) and its maximum measured as the daemon
  measures a running drive's. Outside the storage lock: a ``qemu-img`` per LV
  under it would keep every other node's extensions waiting;
- a raw LV (a disk of a converted ``lvm:`` storage, a RAM state): its LV size,
  active or not. A raw volume never holds more than its LV, and the account
  counts a thin LV at the larger of its size and its maximum, so a resize by
  Proxmox's ``lvm`` code later (which grows the LV alone) is still counted;
- a qcow2 LV not active here is left alone, and named: activating another
  node's LV to read it could race that node's VM. Run this on the node where
  it is active (or resize the disk, which records it).

The tags are added under the storage locks of every storage on the VG, one
``lvchange`` per LV, after the VG is read again: an LV recorded meanwhile (a
resize on another node) or removed is skipped.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from pvestord import policy
from pvestord.adapters import command, lvm, qemu_img, vgspace
from pvestord.adapters.vghealth import VgMarks
from pvestord.errors import PvestordError
from pvestord.features.volumes.storage import VolumeSettings, load_config, locked, thin_storage
from pvestord.policy.capacity import maximum_from_tags, maximum_tag

log = logging.getLogger(__name__)


@dataclass
class Recorded:
    storeid: str
    #: LV -> the maximum now recorded in its tag.
    recorded: dict[str, int] = field(default_factory=dict)
    #: qcow2 LVs without the tag not active here: run this where they are.
    inactive: list[str] = field(default_factory=list)
    #: LV -> why its maximum could not be measured.
    failed: dict[str, str] = field(default_factory=dict)


async def record_maxima(settings: VolumeSettings, storeid: str) -> Recorded:
    """Add the missing maximum tags of ``storeid``'s VG (see the module docstring).

    :raises VolumeError: the storage is not thin.
    :raises PvestordError: LVM or the lock failed (tags added until then stay)."""
    config = load_config(settings)
    storage = thin_storage(config, storeid)
    vg = storage.vgname
    VgMarks(settings.vg_health_dir).check(vg)
    extent = (await lvm.vg_info(vg)).extent_size
    result = Recorded(storeid)
    measured: dict[str, int] = {}
    for row in await lvm.list_lvs(vg):
        if not vgspace.is_thin_lv(row.lv) or maximum_from_tags(row.tags) is not None:
            continue
        if not row.lv.endswith(".qcow2"):
            measured[row.lv] = row.size
        elif not row.active:
            result.inactive.append(row.lv)
        else:
            try:
                image = await qemu_img.info(f"/dev/{vg}/{row.lv}", force_share=True)
                measured[row.lv] = policy.maximum_size(
                    await qemu_img.maximum_required(image), extent)
            except PvestordError as err:
                result.failed[row.lv] = str(err)
    if not measured:
        return result
    async with locked(settings, storage, config) as held:
        now = {row.lv: row for row in await lvm.list_lvs(vg)}
        for lv, maximum in sorted(measured.items()):
            current = now.get(lv)
            if current is None or maximum_from_tags(current.tags) is not None:
                continue
            held.require(lvm.CHANGE_TIMEOUT + command.KILL_WAIT)
            await lvm.add_tags(vg, lv, (maximum_tag(maximum),))
            result.recorded[lv] = maximum
            log.info("%s:%s: maximum %d recorded", storeid, lv, maximum)
    return result
