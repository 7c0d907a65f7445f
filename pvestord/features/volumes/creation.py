"""Create a thin qcow2 volume: small, named and tagged as Proxmox's LVM plugin does.

So the result is a volume Proxmox can attach (pve-storage
``PVE/Storage/LVMPlugin.pm``):

- the name: the first free ``vm-<vmid>-disk-<n>.qcow2``
  (:func:`pvestord.policy.volumes.next_disk_name`);
- ``lvcreate -aly -Wy --yes --setautoactivation n --addtag pve-vm-<vmid>
  --addtag pve-<volname>``: the second tag is what Proxmox activates a qcow2
  volume (and its snapshot LVs) by (``lvchange -aey @pve-<volname>``); without
  it Proxmox could not start a VM on the volume; and ``--addtag
  pvestord-max-<bytes>``, the image's maximum, which every node's capacity
  figures read (:mod:`pvestord.adapters.vgspace`);
- ``qemu-img create -f qcow2 -o preallocation=off``: Proxmox's default for
  qcow2 is ``metadata``, which writes every L2 table up front; a thin LV
  needs them allocated as the guest writes;
- all metadata changes under the storage locks of every storage on the VG
  (:func:`pvestord.features.volumes.storage.locked`), and nothing else:
  ``qemu-img create`` runs after the lock is released.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from pvestord import policy
from pvestord.adapters import command, lvm, qemu_img
from pvestord.adapters.vghealth import VgMarks
from pvestord.errors import PvestordError
from pvestord.features import capacity
from pvestord.features.volumes.storage import (
    VolumeSettings,
    load_config,
    locked,
    thin_storage,
)
from pvestord.policy.capacity import maximum_tag
from pvestord.policy.sizes import format_size
from pvestord.policy.volumes import (
    VolumeError,
    VolumeId,
    check_virtual_size,
    check_vmid,
    initial_lv_size,
    next_disk_name,
    parse_volname,
)

log = logging.getLogger(__name__)

#: ``qemu-img create`` writes a header and empty tables: seconds even under TCG.
CREATE_TIMEOUT = 60.0


@dataclass(frozen=True)
class Created:
    volid: VolumeId
    lv_size: int
    virtual_size: int
    maximum: int


async def create(settings: VolumeSettings, storeid: str, vmid: int, size: int,
                 name: str | None = None) -> Created:
    """Create a thin qcow2 volume (see the module docstring).

    :raises VolumeError: bad input, storage not thin, name taken.
    :raises PvestordError: LVM, qemu-img or the lock failed.
    """
    check_vmid(vmid)
    check_virtual_size(size)
    if name is not None and parse_volname(name) != vmid:
        raise VolumeError(f"volume name {name!r} does not belong to VM {vmid}")
    config = load_config(settings)
    storage = thin_storage(config, storeid)
    vg = storage.vgname
    VgMarks(settings.vg_health_dir).check(vg)
    extent = (await lvm.vg_info(vg)).extent_size
    measured = await qemu_img.measure(size)
    maximum = policy.maximum_size(measured.fully_allocated, extent)
    lv_size = initial_lv_size(storage.initial_size, maximum, extent)
    await capacity.check_new_volume(storage, lv_size=lv_size, maximum=maximum)
    # Only what must be atomic with lvcreate runs under the lock, which every
    # other change of the VG, on any node, waits for:
    # the name is chosen and checked again there (one lvs), the qcow2 header
    # is written after the lock is released (it changes no LVM metadata).
    async with locked(settings, storage, config) as held:
        names = {row.lv for row in await lvm.list_lvs(vg)}
        volname = name if name is not None else next_disk_name(names, vmid)
        if volname in names:
            raise VolumeError(f"volume {storeid}:{volname} already exists")
        held.require(lvm.CHANGE_TIMEOUT + command.KILL_WAIT)
        await lvm.create(vg, volname, lv_size, (f"pve-vm-{vmid}", f"pve-{volname}",
                                                maximum_tag(maximum)))
    try:
        await command.run_async(
            [command.binary("qemu-img"), "create", "-q", "-f", "qcow2",
             "-o", "preallocation=off", "--", f"/dev/{vg}/{volname}", str(size)],
            timeout=CREATE_TIMEOUT)
    except BaseException:
        # Nothing is on the LV yet: remove it (under the lock again) so no
        # half-made volume remains.
        try:
            async with locked(settings, storage, config) as held:
                held.require(lvm.CHANGE_TIMEOUT + command.KILL_WAIT)
                await lvm.remove(vg, volname)
        except PvestordError as err:
            log.error("%s:%s: qemu-img create failed and the new LV could not be removed:"
                      " %s; remove it with 'lvremove %s/%s'", storeid, volname, err, vg,
                      volname)
        raise
    log.info("created %s:%s: LV %s, qcow2 %s (maximum %s)", storeid, volname,
             format_size(lv_size), format_size(size), format_size(maximum))
    return Created(VolumeId(storeid, volname, vmid), lv_size, size, maximum)
