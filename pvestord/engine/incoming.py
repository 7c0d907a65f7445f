"""The destination of a live migration catches up with what the source grew.

Its QEMU takes the devices' sizes at the switchover, so every thin LV that
another node grew must be refreshed here before then (docs/design.md, "Live
migration").
"""

from __future__ import annotations

import logging

from pvestord.adapters import lvm
from pvestord.adapters.service import fields
from pvestord.adapters.vms import LocalVm
from pvestord.engine import migration
from pvestord.engine.drive import Drive
from pvestord.engine.gates import VgGates
from pvestord.engine.lvfigures import LvFigures
from pvestord.engine.lvmchanges import LvmChanges
from pvestord.policy.sizes import format_size

#: The pass's messages keep the logger name they always had.
log = logging.getLogger("pvestord.engine.extender")


async def catch_up_incoming(vm: LocalVm, drives: list[Drive], *, gates: VgGates,
                            figures: LvFigures, extending: set[tuple[int, str]],
                            changes: LvmChanges) -> None:
    """Refresh every thin LV of an incoming VM that another node grew.

    ``drives`` freshly read from LVM. Compared without the lock (LVM's
    metadata against this node's table): the lock is taken, and the
    comparison made again under it, only when the table is behind. A VM
    waiting in ``inmigrate`` is looked at on every retry, and a storage-lock
    round trip per drive each time was most of the load of a migration
    (REVIEW 4.1). ``extending`` shows the drive as being extended (status)
    from the lock wait on; ``changes`` marks it only while the refresh runs.
    """
    for drive in drives:
        if drive.storage is None or lvm.device_size(drive.vg, drive.lv) >= drive.lv_size:
            continue
        key = (vm.vmid, drive.view.file_node)
        extending.add(key)
        try:
            async with gates.locked(drive.vg, drive.storage) as held:
                done = await migration.catch_up(
                    drive.vg, drive.lv, held=held,
                    changing=changes.running(vm.vmid, drive.view.file_node))
        finally:
            extending.discard(key)
        if done.action == "refreshed":
            figures.changed(drive.vg)
            log.info("VM %d %s: incoming migration: LV %s refreshed %s -> %s", vm.vmid,
                     drive.view.file_node, drive.view.path, format_size(done.old),
                     format_size(done.new), extra=fields(
                         VMID=vm.vmid, BLOCK_NODE=drive.view.file_node, LV=drive.lv,
                         VG=drive.vg, OLD_SIZE=done.old, NEW_SIZE=done.new))
