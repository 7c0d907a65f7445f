"""A copy target made thin as soon as its copy is over.

qemu-server copies whole disks into new volumes with nobody to grow them
(``qemu-img convert``, ``vma extract``, a mirror job): the plugin makes such
a volume thick, its LV at the image's maximum, and tags it
:data:`~pvestord.policy.capacity.COPY_TAG` (:mod:`pvestord.features.plugin`,
``alloc``). The copy runs at full speed and can never hit ENOSPC.

A snapshot delete is such a copy too: it merges one LV of a chain into
another (``qemu-img commit`` or ``rebase`` offline, a ``block-commit`` or
``block-stream`` of the running VM), and the plugin grows the LV written
into ahead of it (``commit``), so without a reduction a chain would ratchet
up towards its maximum with every delete. That LV is tagged as well, a
snapshot LV (``snap_...``) as much as a disk's top: offline the plugin has it
reduced right after the delete; for a running VM, whose QEMU has it open, the
daemon reduces it under the VM once no job runs, as a mirror's target
(:mod:`pvestord.engine.livereduce`), or else its next deactivation does (the
VM's stop).

Once the copy is over, the Proxmox plugin calls :func:`reduce_copy_target`
(``pvestord volume reduce-copy``) and the LV is reduced as ``pvestord volume
shrink`` reduces one, to ``max(initial-size, image end + one chunk)`` in whole
extents, with the same core (:func:`~.shrinking.plan_reduction`,
:func:`~.shrinking.reduce_planned`), and the tag is dropped:

* before Proxmox deactivates it (every offline copy ends with
  ``deactivate_volumes``; a mirror or migration target is deactivated when
  its VM stops, if the daemon has not reduced it under the running VM
  first: :mod:`pvestord.engine.livereduce`);
* after Proxmox activates it, when the image already holds data
  (:func:`pvestord.policy.volumes.copy_over`): a full clone on the same node
  never deactivates its new volumes, and ``clone_disk`` activates the new
  volume, still empty, right before it copies into it.

Refused, nothing changed and the tag kept (the next activation or
deactivation tries again), when: the LV is open on this node (a copy, a
mirror or a VM uses it), the VM of the volume runs on this node, the image
does not check clean, or the LV changed meanwhile. An LV not active here is
left alone without a refusal (a deactivation of a volume already inactive).
Proxmox calls both without the storage lock: the locks are taken here, for
the re-read and ``lvreduce`` alone; ``qemu-img check`` runs before them.

Unlike ``volume shrink`` this needs no proof from the cluster (quorum, the
VM list naming this node): Proxmox activates and deactivates a VM's volumes
on the node that runs the task using them, and the LV being active and not
open here is the state Proxmox's own activation leaves it in. With one
exception, refused: a live migration's source deactivates the volumes once
its QEMU has stopped, while the target's QEMU writes them, the config moved
there already; so a ``.vmlist`` naming another node for the VM refuses
(:func:`pvestord.policy.cluster.owned_elsewhere`), and the target node
reduces the LV at that VM's stop. A mirror's target or a running VM's
snapshot-delete target must not be reduced under it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from pvestord.adapters import lvm
from pvestord.features.volumes.running import refuse_if_owned_elsewhere, refuse_if_running_here
from pvestord.features.volumes.shrinking import plan_reduction, reduce_planned
from pvestord.features.volumes.storage import VolumeSettings, load_config, thin_storage
from pvestord.policy.capacity import COPY_TAG
from pvestord.policy.sizes import format_size
from pvestord.policy.volumes import (
    ShrinkRefused,
    VolumeError,
    VolumeId,
    copy_over,
    parse_chain_volume_id,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CopyReduced:
    """What ``volume reduce-copy`` did."""

    volid: VolumeId
    #: The LV was reduced (or only untagged, already that small) and its tag dropped.
    done: bool
    #: Why nothing was done, when nothing was: not a copy target, or its copy not over.
    note: str
    lv_size_before: int
    lv_size_after: int
    #: ``qemu-img check``'s image end; None when the image was not checked.
    image_end: int | None
    target: int | None


async def reduce_copy_target(settings: VolumeSettings, volid: VolumeId | str, *,
                             on_activation: bool) -> CopyReduced:
    """Reduce the copy target ``volid`` if its copy is over; drop its tag.

    ``on_activation``: called after Proxmox activated it (reduced only when
    the image holds data); else before Proxmox deactivates it.

    :raises ShrinkRefused: not safe now (the message says why); nothing changed.
    :raises VolumeError: bad volume id or storage, no such LV, or the image
        did not check clean after the reduction.
    :raises PvestordError: LVM, qemu-img or the lock failed.
    """
    vol = parse_chain_volume_id(volid) if isinstance(volid, str) else volid
    what = str(vol)
    storage = thin_storage(load_config(settings), vol.storeid)
    vg, lv = storage.vgname, vol.volname
    try:
        before = await lvm.lv_info(vg, lv)
    except lvm.LvMissingError as err:
        raise VolumeError(f"no volume {vol} (no LV {vg}/{lv})") from err

    def untouched(note: str) -> CopyReduced:
        return CopyReduced(vol, False, note, before.size, before.size, None, None)

    if COPY_TAG not in before.tags:
        return untouched("not a copy target")
    if not before.active:
        # Deactivated already (LVMPlugin's deactivation then does nothing
        # either): no copy ran into it here since it was last active.
        return untouched("not active on this node")
    if before.open:
        raise ShrinkRefused(f"{what}: the LV {vg}/{lv} is open on this node (a copy, a "
                            "mirror or a VM uses it); nothing changed")
    refuse_if_running_here(settings, vol.vmid, prefix=f"{what}: ", outcome="nothing changed")
    refuse_if_owned_elsewhere(settings, vol.vmid, prefix=f"{what}: ")
    plan = await plan_reduction(storage, before, what)
    if not copy_over(on_activation, plan.checked.allocated_clusters):
        return untouched("the image holds no data yet: its copy has not begun")

    def still_safe(fresh: lvm.LvInfo) -> None:
        if COPY_TAG not in fresh.tags:
            raise ShrinkRefused(f"{what}: no longer a copy target (its tag was dropped "
                                "meanwhile); nothing changed")
        refuse_if_running_here(settings, vol.vmid, prefix=f"{what}: ", outcome="nothing changed")
        refuse_if_owned_elsewhere(settings, vol.vmid, prefix=f"{what}: ")

    after = await reduce_planned(settings, storage, plan, still_safe=still_safe,
                                 drop_tags=(COPY_TAG,))
    log.info("copy target %s: LV %s -> %s (image end %s)", vol, format_size(before.size),
             format_size(after.size), format_size(plan.image_end))
    return CopyReduced(vol, True, "", before.size, after.size, plan.image_end, plan.target)


__all__ = ["CopyReduced", "reduce_copy_target"]
