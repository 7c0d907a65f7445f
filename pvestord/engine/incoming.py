"""The destination of a live migration catches up with what the source grew.

Its QEMU takes the devices' sizes at the switchover, so every thin LV that
another node grew must be refreshed here before then (docs/design.md, "Live
migration").
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from pvestord.adapters import lvm
from pvestord.adapters.budgets import LVM_DAEMON, STORAGE_LOCK_WAIT
from pvestord.adapters.command import KILL_WAIT
from pvestord.adapters.lockheld import LockTimeout
from pvestord.adapters.service import fields
from pvestord.adapters.vms import LocalVm
from pvestord.engine.drive import DriveCandidate
from pvestord.engine.gates import VgGates
from pvestord.engine.lvfigures import LvFigures
from pvestord.engine.lvmchanges import LvmChanges
from pvestord.engine.status import Activity
from pvestord.policy.sizes import format_size

log = logging.getLogger(__name__)


async def catch_up_incoming(vm: LocalVm, drives: Sequence[DriveCandidate], *, gates: VgGates,
                            figures: LvFigures, activity: Activity,
                            changes: LvmChanges, lvm_timeout: float = LVM_DAEMON,
                            budget: float = STORAGE_LOCK_WAIT) -> None:
    """Refresh every thin LV of an incoming VM that another node grew.

    Compared under the storage lock, on every look at a VM in ``inmigrate``
    (the busy backoff's pace, at most 4 s apart): the source's extension
    takes that lock for its ``lvextend``, so one in flight has committed by
    the time the comparison reads LVM, and one that commits later is seen
    by the next look. Compared without the lock, an extension committing
    just then was missed until the next look, which may come after the
    switchover, when the target QEMU has taken the short table's size
    (docs/design.md, "Live migration"). What it costs is bounded for the lock's other
    users: one lock round trip per VG and look, never one per
    drive; under it one ``lvs`` of the VG, and a refresh only for a drive
    whose table is behind, each started only while the lock stays ours for
    the refresh's whole budget (``lvm_timeout``, the daemon's
    ``--lvm-timeout``, which the settings check against the lock's
    lifetime). A lock that stays busy past ``budget``
    skips this look (said at info) instead of failing the pass: a failure's
    backoff (up to a minute) would space the looks out just when the
    switchover may come; the next look, seconds later, tries again.

    ``drives``: the VM's thin drives as the look found them, bound to the
    LVs QEMU has open; their sizes are read under the lock alone, so a look
    costs no LVM read (nor ``qemu-img``) outside it. ``activity`` shows a drive
    as being extended (status) while its refresh runs, as ``changes`` does
    for the pass deadline: never during a lock wait, which changes nothing.
    """
    by_vg: dict[str, list[DriveCandidate]] = {}
    for drive in drives:
        if drive.storage is not None:
            by_vg.setdefault(drive.vg, []).append(drive)
    for vg, group in by_vg.items():
        storage = group[0].storage
        assert storage is not None
        try:
            async with gates.locked(vg, storage, budget) as held:
                sizes = {row.lv: row.size for row in await lvm.list_lvs(vg)}
                for drive in group:
                    size = sizes.get(drive.lv)
                    if size is None:
                        continue  # renamed or gone since the look: the next one sees
                    device = lvm.device_size(vg, drive.lv)
                    if device >= size:
                        continue
                    held.require(lvm_timeout + KILL_WAIT)
                    node = drive.view.file_node
                    with activity.extending(vm.vmid, node), changes.running(vm.vmid, node):
                        await lvm.refresh(vg, drive.lv, timeout=lvm_timeout)
                    figures.changed(vg)
                    log.info("VM %d %s: incoming migration: LV %s refreshed %s -> %s",
                             vm.vmid, drive.view.file_node, drive.view.path,
                             format_size(device), format_size(size), extra=fields(
                                 VMID=vm.vmid, BLOCK_NODE=drive.view.file_node, LV=drive.lv,
                                 VG=vg, OLD_SIZE=device, NEW_SIZE=size))
        except LockTimeout as err:
            log.info("VM %d: incoming migration: VG %s not compared this time: %s",
                     vm.vmid, vg, err, extra=fields(VMID=vm.vmid, VG=vg))
