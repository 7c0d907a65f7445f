"""The ``pvestord migration begin|end`` steps around a live migration, on each node.

The hook (the proposed ``live-migration`` storage hint) calls them: ``begin
--role outgoing`` on the source, ``begin --role incoming`` on the
destination, then the migration, then ``end`` on both. What the daemons do
without them, and why each step matters, is :mod:`pvestord.engine.migration`'s
docstring (docs/design.md, "Live migration"):

* ``begin outgoing`` writes the source's mark (:func:`pvestord.engine.migration.mark_path`),
  which defers the daemon's extensions of the VM, then gives each of its
  thin LVs one more chunk (:func:`pre_extend`), so that a guest writing
  during the migration rarely needs the deferred extension;
* ``begin incoming`` and ``end incoming`` refresh, under the storage lock,
  every LV of the VM whose table this node has smaller than the metadata
  (:func:`catch_up`);
* ``end outgoing`` removes the mark.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from dataclasses import dataclass
from enum import Enum

from pvestord import policy
from pvestord.adapters import lvm, qemu_img
from pvestord.adapters.budgets import STORAGE_LOCK_WAIT
from pvestord.adapters.command import KILL_WAIT
from pvestord.adapters.config import StorageConfig, ThinStorage
from pvestord.adapters.locks import Held, VgLock, vg_lock
from pvestord.adapters.settings import DaemonSettings
from pvestord.adapters.vghealth import VgMarks
from pvestord.adapters.vmlvs import find_vm_lvs
from pvestord.engine.migration import mark_path
from pvestord.errors import PvestordError
from pvestord.policy.sizes import format_size

log = logging.getLogger(__name__)


class Role(Enum):
    INCOMING = "incoming"
    OUTGOING = "outgoing"



@dataclass(frozen=True)
class LvAction:
    vg: str
    lv: str
    old: int
    new: int
    action: str  # "refreshed", "extended", "at maximum", "unchanged"


async def catch_up(vg: str, lv: str, *, budget: float, held: Held | None = None,
                   changing: contextlib.AbstractContextManager[None] | None = None,
                   ) -> LvAction:
    """Refresh ``vg/lv`` if this node's table is smaller than the metadata.

    The caller holds the storage lock (``held``): an extension in flight
    elsewhere has finished, so the metadata read here is the last word.
    ``changing`` is entered around the refresh alone (the daemon's record of
    the LVM changes running). ``budget``: the refresh's (the settings'
    ``lvm_timeout``, which they check against the lock's lifetime).
    """
    info = await lvm.lv_info(vg, lv)
    device = lvm.device_size(vg, lv)
    if device < info.size:
        if held is not None:
            held.require(budget + KILL_WAIT)
        with changing or contextlib.nullcontext():
            await lvm.refresh(vg, lv, timeout=budget)
        return LvAction(vg, lv, device, info.size, "refreshed")
    return LvAction(vg, lv, device, device, "unchanged")


async def image_maximum(row: lvm.LvRow) -> int | None:
    """What the qcow2 on ``row`` can ever use, in whole extents, or None.

    Read before the storage lock is taken: ``qemu-img`` has no place under
    a lock whose lifetime bounds everything done there, and what it reads
    (the image's header, snapshot table and bitmaps) does not change with
    the LV's size. The image is open in the running QEMU, so it is read with
    ``-U`` (nothing the guest writes). An LV that is not a qcow2 we can read
    gives None: the defer rule keeps it safe, the pre-extension only spares
    a pause.
    """
    info = await lvm.lv_info(row.vg, row.lv)
    try:
        image = await qemu_img.info(info.path, force_share=True)
        return policy.maximum_size(await qemu_img.maximum_required(image), info.extent_size)
    except PvestordError as err:
        log.warning("LV %s/%s: not pre-extended for the migration: %s", row.vg, row.lv, err)
        return None


async def pre_extend(storage: ThinStorage, row: lvm.LvRow, maximum: int | None, *,
                     budget: float, held: Held | None = None) -> LvAction:
    """One more chunk for ``row``, never past ``maximum`` (:func:`image_maximum`).

    The caller holds the storage lock; the LV's size is read again under it.
    ``budget``: the ``lvextend``'s, as :func:`catch_up`'s.
    """
    info = await lvm.lv_info(row.vg, row.lv)
    if maximum is None:
        return LvAction(row.vg, row.lv, info.size, info.size, "unchanged")
    target = policy.extend_target(info.size, 0, storage.chunksize, maximum, info.extent_size)
    if target <= info.size:
        return LvAction(row.vg, row.lv, info.size, info.size, "at maximum")
    if held is not None:
        held.require(budget + KILL_WAIT)
    await lvm.extend(row.vg, row.lv, target, timeout=budget)
    return LvAction(row.vg, row.lv, info.size, target, "extended")


async def begin(settings: DaemonSettings, config: StorageConfig, vmid: int,
                role: Role) -> list[LvAction]:
    """The start of a live migration of ``vmid``, on this node in ``role``."""
    if role is Role.OUTGOING:
        # The mark first, then the lock: a pass that extends holds the lock
        # and re-checks the mark under it, so once we hold the lock no
        # extension of this VM's drives can start here until :func:`end`.
        path = mark_path(settings.run_dir, vmid)
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_text(f"{role.value} {time.time():.3f}\n")
        tmp.rename(path)
    actions = []
    # The active LVs of the VM's chains: its disks and their snapshot LVs,
    # which a migration's target opens as well.
    for storage, row in await find_vm_lvs(config, vmid):
        maximum = await image_maximum(row) if role is Role.OUTGOING else None
        async with _vg_lock(settings, config, storage).acquire_async(
                STORAGE_LOCK_WAIT) as held:
            if role is Role.INCOMING:
                actions.append(await catch_up(row.vg, row.lv, budget=settings.lvm_timeout,
                                              held=held))
                continue
            actions.append(await pre_extend(storage, row, maximum,
                                            budget=settings.lvm_timeout, held=held))
    for a in actions:
        log.info("VM %d migration begin (%s): %s/%s %s %s -> %s", vmid, role.value, a.vg,
                 a.lv, a.action, format_size(a.old), format_size(a.new))
    return actions


async def end(settings: DaemonSettings, config: StorageConfig, vmid: int,
              role: Role) -> list[LvAction]:
    """The end of a live migration: the source stops deferring; the destination
    refreshes once more (a pre-extension made after its ``begin``)."""
    if role is Role.OUTGOING:
        with contextlib.suppress(FileNotFoundError):
            mark_path(settings.run_dir, vmid).unlink()
        return []
    actions = []
    for storage, row in await find_vm_lvs(config, vmid):
        async with _vg_lock(settings, config, storage).acquire_async(
                STORAGE_LOCK_WAIT) as held:
            actions.append(await catch_up(row.vg, row.lv, budget=settings.lvm_timeout,
                                          held=held))
    return actions


def _vg_lock(settings: DaemonSettings, config: StorageConfig, storage: ThinStorage) -> VgLock:
    """Every storage lock of ``storage``'s VG, as the daemon takes them."""
    return vg_lock(storage.vgname, config.vg_users(storage.vgname),
                   lock_dir=settings.lock_dir, lifetime=settings.lock_lifetime,
                   health=VgMarks(settings.vg_health_dir))
