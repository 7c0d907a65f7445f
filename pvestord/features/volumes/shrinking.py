"""Shrink a stopped volume's LV back to its image end plus one chunk.

When is it safe?
    An LV can be reduced only if nothing can write the image meanwhile and
    nothing past the new end is data. We refuse, with the reason:

    1. the VM runs on this node (``<run-dir>/<vmid>.pid`` names a live QEMU,
       :func:`pvestord.adapters.vms.local_vm`): a certain answer;
    2. this node cannot prove that it owns the VM. LVM cannot see another
       node's activations (no lvmlockd), and Proxmox keeps no run marker in
       ``/etc/pve``, so the proof is the ownership pmxcfs keeps: a VM runs
       only on the node holding its config (``qm start`` refuses elsewhere;
       a live migration moves the config only once the source QEMU is gone),
       and pmxcfs's ``.vmlist`` names that node. We require (a) quorum, from
       ``.members`` (``"cluster": {..., "quorate": 1}``; a standalone node,
       with no ``cluster`` and no ``corosync.conf``, is its own quorum):
       without it our ``.vmlist`` may be stale and the VM recovered on a node
       we cannot hear; (b) ``.vmlist`` naming this node (``.members``'
       ``nodename``) for the VMID; (c) check 1. pvestatd's status broadcast
       (``.rrd``, a line ``pve2.3-vm/<vmid>:<uptime>:<name>:<status>:...``
       per VM) is supporting evidence only: a line saying anything but
       ``stopped`` refuses, however old; a missing line proves nothing,
       because pmxcfs drops lines not refreshed for 5 minutes (a hung
       pvestatd, a partition, a restarted pve-cluster);
    3. the LV is open on this node (someone uses it);
    4. the LV is active on this node. Proxmox activates a volume to use it
       and deactivates it when the VM stops, so an active LV means a user or
       a task in progress (a start, a backup, a migration). Shrink therefore
       starts from an inactive LV, activates it itself (``-aey``) to read it,
       and deactivates it at the end, also after a refusal or a dry run. The
       LV must be active for ``qemu-img check`` and ``lvreduce`` alike;
    5. the image does not check clean (``qemu-img check``: corruption or
       leaked clusters; leaks are harmless but ``check -r leaks`` first lets
       the image end shrink too). The image end offset comes from that
       check: nothing of the image lies beyond it.

    The new size is ``max(initial-size, image end + one chunk)`` rounded up to
    whole extents, never below the image end (rounding only goes up), never
    above the current size. The chunk is the headroom the daemon wants
    anyway (more than ``chunksize * chunk-percentage``), so a shrunk disk
    starts with its threshold above the data and grows on its first writes
    past it. Under the storage lock the LV is read again (same size, still
    not open) and the VM's status re-checked before ``lvreduce -f``; after
    it, outside the lock, the image is checked again (clean, same end).

:func:`plan_reduction` (check clean, target; no lock) and
:func:`reduce_planned` (the locked re-check and ``lvreduce``, then the
recheck) are that core; a copy target's reduction when its copy is over
(:mod:`pvestord.features.volumes.copies`) is the same two steps with its
own refusals before them.

The pure rules are :mod:`pvestord.policy.volumes` (the target) and
:mod:`pvestord.policy.cluster` (the other nodes' side).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pvestord.adapters import lvm, qemu_img
from pvestord.adapters.config import ThinStorage
from pvestord.errors import CommandError, PvestordError
from pvestord.features.volumes.running import refuse_if_running
from pvestord.features.volumes.storage import (
    VolumeSettings,
    load_config,
    locked,
    thin_storage,
)
from pvestord.policy.capacity import COPY_TAG
from pvestord.policy.sizes import format_size
from pvestord.policy.volumes import (
    ShrinkRefused,
    VolumeError,
    VolumeId,
    parse_volume_id,
    shrink_target,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Shrunk:
    """What ``volume shrink`` did, or would do with ``--dry-run``."""

    volid: VolumeId
    lv_size_before: int
    #: As LVM reports it afterwards (the size before, on a dry run).
    lv_size_after: int
    #: The image's end (``qemu-img check``): no byte past it holds data.
    image_end: int
    virtual_size: int
    #: What the LV is reduced to (:func:`pvestord.policy.volumes.shrink_target`).
    target: int
    dry_run: bool
    #: How long the shrink took, the locks included.
    seconds: float

    @property
    def reclaimed(self) -> int:
        return self.lv_size_before - self.target


async def _checked_clean(path: str, what: str) -> qemu_img.CheckResult:
    try:
        result = await qemu_img.check(path)
    except CommandError as err:
        raise ShrinkRefused(f"{what}: qemu-img check could not read the image: "
                            f"{err}") from err
    if result.status is qemu_img.CheckStatus.CORRUPT:
        raise ShrinkRefused(f"{what}: the image is corrupt ({result.corruptions} "
                            f"corruptions): {result.messages or 'see qemu-img check'}")
    if result.status is qemu_img.CheckStatus.LEAKS:
        raise ShrinkRefused(f"{what}: the image has {result.leaks} leaked clusters; "
                            f"repair them first with 'qemu-img check -r leaks {path}'")
    if result.image_end_offset is None:
        raise ShrinkRefused(f"{what}: qemu-img check did not report the image end")
    return result


@dataclass(frozen=True)
class Reduction:
    """A reduction decided outside the storage lock: the LV as it was read,
    the clean image's end and what the LV is to be reduced to."""

    before: lvm.LvInfo
    #: ``qemu-img check``'s findings (clean), the image end among them.
    checked: qemu_img.CheckResult
    image_end: int
    #: :func:`pvestord.policy.volumes.shrink_target`; never above ``before.size``.
    target: int


async def plan_reduction(storage: ThinStorage, before: lvm.LvInfo, what: str) -> Reduction:
    """Check the image on the active LV ``before`` clean and size the LV to
    ``max(initial-size, image end + chunk)``. Takes no lock: ``qemu-img check``
    reads every table, which can take long on a large image.

    :raises ShrinkRefused: the image does not check clean.
    """
    checked = await _checked_clean(before.path, what)
    end = checked.image_end_offset
    assert end is not None
    target = shrink_target(before.size, end, storage.chunksize, storage.initial_size,
                           before.extent_size)
    return Reduction(before, checked, end, target)


async def reduce_planned(settings: VolumeSettings, storage: ThinStorage, plan: Reduction,
                         what: str, *, still_safe: Callable[[lvm.LvInfo], None],
                         drop_tags: Sequence[str] = ()) -> lvm.LvInfo:
    """Carry out ``plan``: under the storage locks only the LV read again (same
    size, still not open, ``still_safe`` of it), ``lvreduce`` to the target
    and the ``drop_tags`` it carries removed; then, outside them, the image
    checked again (clean, same end). Returns the LV as LVM reports it after.

    :raises ShrinkRefused: the LV changed or was opened meanwhile, or
        ``still_safe`` refused; nothing was changed.
    :raises VolumeError: the image no longer checks clean after the reduction
        (the message says how to restore the size).
    """
    before = plan.before
    vg, lv = before.vg, before.lv
    reducing = plan.target < before.size
    async with locked(settings, storage):
        fresh = await lvm.lv_info(vg, lv)
        if fresh.size != before.size:
            raise ShrinkRefused(f"{what}: the LV changed size meanwhile "
                                f"({format_size(before.size)} -> "
                                f"{format_size(fresh.size)}); try again")
        if fresh.open:
            raise ShrinkRefused(f"{what}: the LV was opened meanwhile; nothing changed")
        still_safe(fresh)
        if reducing:
            await lvm.reduce(vg, lv, plan.target)
        dropped = [tag for tag in drop_tags if tag in fresh.tags]
        if dropped:
            await lvm.remove_tags(vg, lv, dropped)
    after = await lvm.lv_info(vg, lv)
    if reducing:
        recheck = await qemu_img.check(before.path)
        if (recheck.status is not qemu_img.CheckStatus.CLEAN
                or recheck.image_end_offset != plan.image_end):
            raise VolumeError(
                f"{what}: the image no longer checks clean after reducing the LV from "
                f"{before.size} to {plan.target} bytes ({recheck.status.value}, end "
                f"{recheck.image_end_offset}); restore its size at once with "
                f"'lvextend -L {before.size}b {vg}/{lv}'")
    return after


async def shrink(settings: VolumeSettings, volid: VolumeId | str, *,
                 dry_run: bool = False) -> Shrunk:
    """Reduce a stopped volume's LV to ``max(initial-size, image end + chunk)``.

    A copy target's tag (:data:`COPY_TAG`) is dropped with the reduction: the
    LV is no longer at its maximum.

    :raises ShrinkRefused: not safe now (the message says why).
    :raises VolumeError: bad volume id or storage.
    :raises PvestordError: LVM, qemu-img or the lock failed.
    """
    began = time.monotonic()
    vol = parse_volume_id(volid) if isinstance(volid, str) else volid
    storage = thin_storage(load_config(settings), vol.storeid)
    vg, lv = storage.vgname, vol.volname
    path = f"/dev/{vg}/{lv}"
    refuse_if_running(settings, vol.vmid)
    try:
        before = await lvm.lv_info(vg, lv)
    except lvm.LvMissingError as err:
        raise VolumeError(f"no volume {vol} (no LV {vg}/{lv})") from err
    _refuse_if_in_use(before, vol)
    await lvm.activate(vg, lv)
    try:
        image = await _image_info(path, vol)
        plan = await plan_reduction(storage, before, str(vol))
        result = Shrunk(vol, before.size, before.size, plan.image_end, image.virtual_size,
                        plan.target, dry_run, 0.0)
        if dry_run or (plan.target >= before.size and COPY_TAG not in before.tags):
            return _timed(result, began)
        after = await reduce_planned(
            settings, storage, plan, str(vol),
            still_safe=lambda _fresh: refuse_if_running(settings, vol.vmid),
            drop_tags=(COPY_TAG,))
        log.info("shrank %s: LV %s -> %s (image end %s)", vol, format_size(before.size),
                 format_size(after.size), format_size(plan.image_end))
        return _timed(dataclasses.replace(result, lv_size_after=after.size), began)
    finally:
        try:
            await lvm.deactivate(vg, lv)
        except PvestordError as err:
            log.warning("%s: could not deactivate the LV again: %s", vol, err)


def _timed(result: Shrunk, began: float) -> Shrunk:
    return dataclasses.replace(result, seconds=time.monotonic() - began)


def _refuse_if_in_use(info: lvm.LvInfo, vol: VolumeId) -> None:
    if info.open:
        raise ShrinkRefused(f"{vol}: the LV {info.vg}/{info.lv} is open on this node "
                            "(in use); nothing changed")
    if info.active:
        raise ShrinkRefused(
            f"{vol}: the LV {info.vg}/{info.lv} is active on this node, so something may "
            "be using it (Proxmox deactivates a stopped VM's volumes); if nothing is, "
            f"deactivate it with 'lvchange -an {info.vg}/{info.lv}' and try again")


async def _image_info(path: str, vol: VolumeId) -> qemu_img.ImageInfo:
    try:
        return await qemu_img.info(path)
    except CommandError as err:
        raise ShrinkRefused(f"{vol}: not a readable qcow2 image: {err}") from err
