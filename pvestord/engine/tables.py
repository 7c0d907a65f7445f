"""This node's device-mapper table of an LV against LVM's metadata.

Another node may grow an LV: this node's table then lags the metadata until
a refresh, and gets one instead of a second extension. A table larger than
the metadata (an extension lost, an LV shrunk elsewhere) is never written
over: the drive gets nothing until an operator looks.
"""

from __future__ import annotations

import logging

from pvestord import policy
from pvestord.adapters import lvm
from pvestord.adapters.command import KILL_WAIT
from pvestord.adapters.locks import Held
from pvestord.adapters.lvmshell import LvmShells
from pvestord.adapters.service import fields
from pvestord.adapters.settings import DaemonSettings
from pvestord.adapters.vms import LocalVm
from pvestord.engine.drive import Drive, StaleTableError, VmOutcome
from pvestord.engine.lvfigures import LvFigures
from pvestord.engine.lvmchanges import LvmChanges, VgGates
from pvestord.engine.memory import OncePerChange
from pvestord.errors import PvestordError
from pvestord.policy import TableState
from pvestord.policy.sizes import format_size

log = logging.getLogger(__name__)


class Tables:
    """Compare, refresh or refuse this node's tables of the pass's LVs."""

    def __init__(self, settings: DaemonSettings, figures: LvFigures, gates: VgGates,
                 said: OncePerChange, shells: LvmShells | None, changes: LvmChanges) -> None:
        self.settings = settings
        self.figures = figures
        self.gates = gates
        self.said = said
        self.shells = shells
        self.changes = changes

    def differs(self, vm: LocalVm, drive: Drive, outcome: VmOutcome) -> bool:
        """Whether this node's table of a thin drive's LV differs from the size
        just read from LVM (confirmed, and acted on, under the lock)."""
        if drive.storage is None:
            return False
        try:
            table = lvm.device_size(drive.vg, drive.lv)
        except PvestordError as err:
            outcome.errors[drive.view.file_node] = err
            return False
        if policy.table_state(drive.lv_size, table) is TableState.MATCH:
            self.said.over((vm.vmid, drive.view.file_node, "table"))
            return False
        return True

    async def catch_up_locked(self, vmid: int, drive: Drive,
                              held: Held) -> tuple[lvm.LvInfo, int, TableState]:
        """Under the lock: the LV's metadata, this node's table, and how they
        compare; a table behind the metadata is refreshed here (one ahead is
        the caller's to refuse: it is never written over)."""
        info = await lvm.lv_info(drive.vg, drive.lv, timeout=self.settings.lvm_timeout,
                                 shells=self.shells)
        self.figures.remember(info)
        table = lvm.device_size(drive.vg, drive.lv)
        verdict = policy.table_state(info.size, table)
        if verdict is TableState.BEHIND:
            held.require(self.settings.lvm_timeout + KILL_WAIT)
            with self.changes.running(vmid, drive.view.file_node, (drive.vg, drive.lv)):
                await lvm.refresh(drive.vg, drive.lv, timeout=self.settings.lvm_timeout)
            self.figures.changed(drive.vg)
        return info, table, verdict

    async def catch_up(self, vm: LocalVm, drive: Drive, outcome: VmOutcome) -> bool:
        """Compare the table with the metadata under the lock; refresh a table
        that is behind (True), refuse one that is ahead (an error for the drive)."""
        assert drive.storage is not None
        node = drive.view.file_node
        try:
            async with self.gates.locked(drive.vg, drive.storage) as held:
                info, table, verdict = await self.catch_up_locked(vm.vmid, drive, held)
        except PvestordError as err:
            outcome.errors[node] = err
            return False
        if verdict is TableState.AHEAD:
            outcome.errors[node] = self.ahead(vm, drive, info.size, table)
            return False
        if verdict is TableState.BEHIND:
            self.log_refreshed(vm, drive, table, info.size)
            return True
        return False

    def log_refreshed(self, vm: LocalVm, drive: Drive, table: int, size: int) -> None:
        node = drive.view.file_node
        self.said.over((vm.vmid, node, "table"))
        log.info("VM %d %s: LV %s was grown elsewhere to %s (this node's table had %s):"
                 " refreshed", vm.vmid, node, drive.lv_path, format_size(size),
                 format_size(table), extra=fields(
                     VMID=vm.vmid, BLOCK_NODE=node, LV=drive.lv, TABLE="refreshed",
                     OLD_SIZE=table, NEW_SIZE=size))

    def ahead(self, vm: LocalVm, drive: Drive, size: int, table: int) -> StaleTableError:
        """Say (once per change) that the table is ahead; the drive's error."""
        node = drive.view.file_node
        self.said.say((vm.vmid, node, "table"), logging.ERROR,
                      "VM %d %s: this node's device-mapper table of LV %s (%s) is larger than"
                      " the LV in LVM's metadata (%s): an extension was lost or the LV was"
                      " shrunk elsewhere; the extents past the metadata's end are free in the"
                      " VG and may hold guest data. Not extended, not resumed: an operator"
                      " must look",
                      vm.vmid, node, drive.lv_path, format_size(table), format_size(size),
                      extra=fields(VMID=vm.vmid, BLOCK_NODE=node, LV=drive.lv,
                                   TABLE="ahead", TABLE_SIZE=table, LV_SIZE=size))
        return StaleTableError(
            f"VM {vm.vmid} {node}: device-mapper table of {drive.lv_path} "
            f"({format_size(table)}) is larger than the LV ({format_size(size)}): "
            "not extended, not resumed")


def table_problem(verdict: TableState, size: int, table: int) -> str | None:
    """What ``pvestord drives`` says of a table that differs; None when it matches."""
    if verdict is TableState.AHEAD:
        return (f"device-mapper table ({format_size(table)}) larger than the LV "
                f"({format_size(size)}): never extended or resumed until an operator looks")
    if verdict is TableState.BEHIND:
        return (f"device-mapper table ({format_size(table)}) smaller than the LV "
                f"({format_size(size)}): the next pass refreshes it")
    return None
