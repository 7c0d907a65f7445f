"""Shrink a stopped volume's LVs back to their image ends plus one chunk.

A disk with snapshots (``snapshot-as-volume-chain``) is a chain of LVs: the
top, ``vm-<vmid>-<name>.qcow2``, backed by ``snap_vm-<vmid>-<name>_<snap>.qcow2``
LVs. Each one may be bloated (a snapshot LV is the former top as it was,
grown by the daemon; a snapshot delete grows the LV it merges into), so
``volume shrink`` reduces every LV of the chain. The chain is read from the
images, not guessed from names: the top's ``qemu-img info`` names its
backing file, an LV of the VG (:func:`pvestord.policy.lvnames.backing_lv`),
whose own header names the next, down to an image without one. Each LV is
checked (rules 3 and 4 below) before it is activated, one at a time, because
``qemu-img info --backing-chain`` would need them all active first. A chain
reaching an LV that is not one of the disk's own snapshot LVs (a base image
linked clones share, another disk's LV) is refused: such an LV may be in use
by another VM this node cannot see.

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

    Every LV of the chain is checked (3, 4, 5) before any is reduced: a
    refusal names the LV and leaves them all as they were. The LVs
    activated here are deactivated again at the end, whatever happened.

    The new size is ``max(initial-size, image end + one chunk)`` rounded up to
    whole extents, never below the image end (rounding only goes up), never
    above the current size. The chunk is the headroom the daemon wants
    anyway (more than ``chunksize * chunk-percentage``), so a shrunk disk
    starts with its threshold above the data and grows on its first writes
    past it (a snapshot LV, read-only, gets the same rule: one rule, and a
    chunk is little against a disk's maximum). Under the storage lock every
    LV is read again (same size, still not open) and the VM's status
    re-checked before the first ``lvreduce -f``; after them, outside the
    lock, each image is checked again (clean, same end).

:func:`plan_reduction` (check clean, target; no lock) and
:func:`reduce_all` (the locked re-check and the ``lvreduce`` of each, then
the rechecks) are that core; a copy target's reduction when its copy is over
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
from pvestord.policy.lvnames import backing_lv, is_snapshot_of
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
class LvShrunk:
    """One LV of a disk's chain in ``volume shrink``: what was done to it, or
    would be with ``--dry-run``."""

    lv: str
    lv_size_before: int
    #: As LVM reports it afterwards (the size before, on a dry run).
    lv_size_after: int
    #: The image's end (``qemu-img check``): no byte past it holds data.
    image_end: int
    #: What the LV is reduced to (:func:`pvestord.policy.volumes.shrink_target`).
    target: int

    @property
    def reclaimed(self) -> int:
        return self.lv_size_before - self.target


@dataclass(frozen=True)
class Shrunk:
    """What ``volume shrink`` did, or would do with ``--dry-run``. The sizes
    at the top level are the top LV's (the volume's own); ``chain`` has every
    LV, the top first, then each backing LV in turn."""

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
    chain: tuple[LvShrunk, ...] = ()

    @property
    def reclaimed(self) -> int:
        """What the whole chain gives back."""
        return sum(lv.reclaimed for lv in self.chain)


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
    #: The LV as messages name it (a volume id).
    what: str

    @property
    def reducing(self) -> bool:
        return self.target < self.before.size


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
    return Reduction(before, checked, end, target, what)


async def reduce_all(settings: VolumeSettings, storage: ThinStorage,
                     plans: Sequence[Reduction], *, still_safe: Callable[[lvm.LvInfo], None],
                     drop_tags: Sequence[str] = ()) -> list[lvm.LvInfo]:
    """Carry out ``plans``, all or none: under the storage locks only, every
    LV read again (same size, still not open, ``still_safe`` of it) before
    the first ``lvreduce`` to its target, and the ``drop_tags`` each carries
    removed; then, outside them, each reduced image checked again (clean,
    same end). Returns the LVs as LVM reports them after, in order.

    :raises ShrinkRefused: an LV changed or was opened meanwhile, or
        ``still_safe`` refused; nothing was changed.
    :raises VolumeError: an image no longer checks clean after its reduction,
        or LVM failed after some LVs were reduced (the message says which,
        and how to restore their sizes).
    """
    async with locked(settings, storage):
        fresh_all = [await lvm.lv_info(p.before.vg, p.before.lv) for p in plans]
        for plan, fresh in zip(plans, fresh_all, strict=True):
            _refuse_if_changed(plan, fresh)
            still_safe(fresh)
        done: list[Reduction] = []
        for plan, fresh in zip(plans, fresh_all, strict=True):
            try:
                if plan.reducing:
                    await lvm.reduce(plan.before.vg, plan.before.lv, plan.target)
                    done.append(plan)
                dropped = [tag for tag in drop_tags if tag in fresh.tags]
                if dropped:
                    await lvm.remove_tags(plan.before.vg, plan.before.lv, dropped)
            except PvestordError as err:
                if not done:
                    raise
                raise VolumeError(f"{plan.what}: {err}; reduced already, their images "
                                  f"not checked again: {_restore_hints(done)}") from err
    after = [await lvm.lv_info(p.before.vg, p.before.lv) for p in plans]
    unclean = []
    for plan in plans:
        if not plan.reducing:
            continue
        recheck = await qemu_img.check(plan.before.path)
        if (recheck.status is not qemu_img.CheckStatus.CLEAN
                or recheck.image_end_offset != plan.image_end):
            unclean.append(f"{plan.what} ({recheck.status.value}, end "
                           f"{recheck.image_end_offset})")
    if unclean:
        reduced = [p for p in plans if p.reducing]
        raise VolumeError(
            f"the image no longer checks clean after its LV was reduced: "
            f"{', '.join(unclean)}; restore the sizes at once: {_restore_hints(reduced)}")
    return after


def _refuse_if_changed(plan: Reduction, fresh: lvm.LvInfo) -> None:
    before = plan.before
    if fresh.size != before.size:
        raise ShrinkRefused(f"{plan.what}: the LV changed size meanwhile "
                            f"({format_size(before.size)} -> "
                            f"{format_size(fresh.size)}); nothing changed, try again")
    if fresh.open:
        raise ShrinkRefused(f"{plan.what}: the LV was opened meanwhile; nothing changed")


def _restore_hints(plans: Sequence[Reduction]) -> str:
    return "; ".join(f"'lvextend -L {p.before.size}b {p.before.vg}/{p.before.lv}'"
                     f" (was {p.before.size}, now {p.target} bytes)" for p in plans)


async def reduce_planned(settings: VolumeSettings, storage: ThinStorage, plan: Reduction, *,
                         still_safe: Callable[[lvm.LvInfo], None],
                         drop_tags: Sequence[str] = ()) -> lvm.LvInfo:
    """:func:`reduce_all` of one LV."""
    return (await reduce_all(settings, storage, [plan], still_safe=still_safe,
                             drop_tags=drop_tags))[0]


async def shrink(settings: VolumeSettings, volid: VolumeId | str, *,
                 dry_run: bool = False) -> Shrunk:
    """Reduce each LV of a stopped volume's chain to ``max(initial-size, image
    end + chunk)``: all of them, or none.

    A copy target's tag (:data:`COPY_TAG`) is dropped with the reduction: the
    LV is no longer at its maximum.

    :raises ShrinkRefused: not safe now (the message says which LV and why).
    :raises VolumeError: bad volume id or storage.
    :raises PvestordError: LVM, qemu-img or the lock failed.
    """
    began = time.monotonic()
    vol = parse_volume_id(volid) if isinstance(volid, str) else volid
    storage = thin_storage(load_config(settings), vol.storeid)
    vg, lv = storage.vgname, vol.volname
    refuse_if_running(settings, vol.vmid)
    try:
        top = await lvm.lv_info(vg, lv)
    except lvm.LvMissingError as err:
        raise VolumeError(f"no volume {vol} (no LV {vg}/{lv})") from err
    activated: list[str] = []
    try:
        chain = await _activate_chain(vol, top, activated)
        plans = [await plan_reduction(storage, info, _what(vol, info.lv)) for info, _ in chain]
        rows = [LvShrunk(p.before.lv, p.before.size, p.before.size, p.image_end, p.target)
                for p in plans]
        top_image = chain[0][1]
        result = Shrunk(vol, top.size, top.size, plans[0].image_end, top_image.virtual_size,
                        plans[0].target, dry_run, 0.0, tuple(rows))
        tagged = any(COPY_TAG in p.before.tags for p in plans)
        if dry_run or not (tagged or any(p.reducing for p in plans)):
            return _timed(result, began)
        after = await reduce_all(
            settings, storage, plans,
            still_safe=lambda _fresh: refuse_if_running(settings, vol.vmid),
            drop_tags=(COPY_TAG,))
        rows = [dataclasses.replace(row, lv_size_after=info.size)
                for row, info in zip(rows, after, strict=True)]
        for row in rows:
            log.info("shrank %s: LV %s -> %s (image end %s)", _what(vol, row.lv),
                     format_size(row.lv_size_before), format_size(row.lv_size_after),
                     format_size(row.image_end))
        return _timed(dataclasses.replace(result, lv_size_after=after[0].size,
                                          chain=tuple(rows)), began)
    finally:
        for name in reversed(activated):
            try:
                await lvm.deactivate(vg, name)
            except PvestordError as err:
                log.warning("%s: could not deactivate the LV again: %s", _what(vol, name), err)


def _what(vol: VolumeId, lv: str) -> str:
    """An LV of ``vol``'s chain as messages name it: its Proxmox volume id."""
    return f"{vol.storeid}:{lv}"


async def _activate_chain(vol: VolumeId, top: lvm.LvInfo, activated: list[str]
                          ) -> list[tuple[lvm.LvInfo, qemu_img.ImageInfo]]:
    """Follow the chain down from ``top``: each LV refused if in use, else
    activated (appended to ``activated``, for the caller to undo) and its
    header read for the next. Returns each LV with its image, the top first.

    :raises ShrinkRefused: an LV is in use, an image unreadable, or the chain
        reaches an LV that is not one of the disk's own, or loops.
    """
    vg = top.vg
    chain: list[tuple[lvm.LvInfo, qemu_img.ImageInfo]] = []
    info = top
    while True:
        what = _what(vol, info.lv)
        _refuse_if_in_use(info, what)
        await lvm.activate(vg, info.lv)
        activated.append(info.lv)
        image = await _image_info(info.path, what)
        chain.append((info, image))
        backing = image.backing_filename
        if backing is None:
            return chain
        name = backing_lv(info.path, backing, vg)
        if name is None or not is_snapshot_of(vol.volname, name):
            raise ShrinkRefused(
                f"{what}: its backing file {backing!r} is not a snapshot LV of {vol} "
                f"(snap_{vol.volname.removesuffix('.qcow2')}_<snapshot>.qcow2 in VG {vg}); "
                "shrink changes no LV another disk may use; nothing changed")
        if any(seen.lv == name for seen, _ in chain):
            raise ShrinkRefused(f"{what}: its backing chain loops back to {name}; "
                                "nothing changed")
        try:
            info = await lvm.lv_info(vg, name)
        except lvm.LvMissingError as err:
            raise ShrinkRefused(f"{what}: its backing LV {vg}/{name} does not exist; "
                                "nothing changed") from err


def _timed(result: Shrunk, began: float) -> Shrunk:
    return dataclasses.replace(result, seconds=time.monotonic() - began)


def _refuse_if_in_use(info: lvm.LvInfo, what: str) -> None:
    if info.open:
        raise ShrinkRefused(f"{what}: the LV {info.vg}/{info.lv} is open on this node "
                            "(in use); nothing changed")
    if info.active:
        raise ShrinkRefused(
            f"{what}: the LV {info.vg}/{info.lv} is active on this node, so something may "
            "be using it (Proxmox deactivates a stopped VM's volumes); if nothing is, "
            f"deactivate it with 'lvchange -an {info.vg}/{info.lv}' and try again")


async def _image_info(path: str, what: str) -> qemu_img.ImageInfo:
    try:
        return await qemu_img.info(path)
    except CommandError as err:
        raise ShrinkRefused(f"{what}: not a readable qcow2 image: {err}") from err
