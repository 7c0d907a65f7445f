"""One LV grown: under the VG gate and the storage lock, decided again on
the LV as LVM says it is under the lock (another node may have grown it)."""

from __future__ import annotations

import dataclasses
import enum
import logging
import time

from pvestord import policy
from pvestord.adapters import lvm
from pvestord.adapters.budgets import PAUSED_STORAGE_LOCK_WAIT, STORAGE_LOCK_WAIT
from pvestord.adapters.command import KILL_WAIT
from pvestord.adapters.lvmshell import LvmShells
from pvestord.adapters.qmp import VmBusyError
from pvestord.adapters.service import fields
from pvestord.adapters.settings import DaemonSettings
from pvestord.adapters.vms import LocalVm
from pvestord.engine import migration
from pvestord.engine.binding import DeviceBindings
from pvestord.engine.drive import Drive, RoundTimings, ms_since
from pvestord.engine.lvfigures import LvFigures
from pvestord.engine.lvmchanges import LvmChanges, LvmHealth, VgGates
from pvestord.engine.memory import OncePerChange
from pvestord.engine.status import Activity, Extension
from pvestord.engine.tables import Tables
from pvestord.policy import DriveState, TableState
from pvestord.policy.capacity import extension_refusal
from pvestord.policy.sizes import format_size

log = logging.getLogger(__name__)

Growing = policy.Extend | policy.ExtendPastMaximum

class Grown(enum.Enum):
    """What one :meth:`LvGrowth.extend` did to its LV."""

    #: Grown, or caught up with another node's growth.
    GREW = "grew"
    #: Already as large as decided: nothing to do.
    ENOUGH = "enough"
    #: Held back by the VG's reserve: the pass may not grow it now.
    HELD_BACK = "held-back"


class LvGrowth:
    """Extensions, with the marks the daemon's deadline and report read."""

    def __init__(self, settings: DaemonSettings, *, figures: LvFigures, gates: VgGates,
                 tables: Tables, shells: LvmShells | None,
                 migrations: migration.MigrationWatch, activity: Activity,
                 said: OncePerChange, changes: LvmChanges, health: LvmHealth) -> None:
        self.settings = settings
        self.figures = figures
        self.gates = gates
        self.tables = tables
        self.shells = shells
        self.migrations = migrations
        self.activity = activity
        self._said = said
        self.changes = changes
        #: Our LVM commands' failures per VG, for this node's report.
        self.lvm_health = health

    async def extend(self, vm: LocalVm, drive: Drive, decision: Growing, state: DriveState,
                     timings: RoundTimings, *, job_writing: bool = False,
                     vm_paused_for_room: bool = False) -> Grown:
        """Grow the LV under the VG gate and the storage lock.

        ``job_writing``: a block job writes into the VM's drives, as the pass
        saw it (which lets the growth through a snapshot delete's lock).
        ``vm_paused_for_room``: the VM is paused for room, so any of its
        drives may take the VG's reserve."""
        assert drive.storage is not None  # the policy never extends a drive that is not thin
        started = time.monotonic()
        try:
            # Status shows it extending from the migration check on; only
            # :attr:`changes` says an LVM change runs.
            with self.activity.extending(vm.vmid, drive.view.file_node):
                return await self._extend_locked(vm, drive, decision, state, timings, started,
                                                 job_writing=job_writing,
                                                 vm_paused_for_room=vm_paused_for_room)
        except lvm.LvmError as err:
            self.lvm_health.record(drive.vg, str(err))
            raise

    async def _extend_locked(self, vm: LocalVm, drive: Drive, decision: Growing,
                             state: DriveState, timings: RoundTimings, started: float,
                             *, job_writing: bool, vm_paused_for_room: bool) -> Grown:
        """:meth:`extend`'s work, under the VG gate and the storage lock."""
        storage = drive.storage
        assert storage is not None
        node = drive.view.file_node
        # QMP before the lock, never under it: a slow QEMU must not hold the
        # cluster-wide lock, which every node's change of the VG waits for.
        if await self.migrations.away_now(vm):
            raise VmBusyError(f"VM {vm.vmid} started migrating away: extension of "
                              f"{node} deferred")
        observed = time.monotonic()
        budget = PAUSED_STORAGE_LOCK_WAIT if state.paused_nospace else STORAGE_LOCK_WAIT
        async with self.gates.locked(drive.vg, storage, budget) as held:
            locked = time.monotonic()
            # Under the lock only files, no QMP: a migration's marks and
            # config locks are barriers for us here.
            if self.migrations.bars_growth(vm.vmid, paused_nospace=state.paused_nospace,
                                           job_writing=job_writing):
                raise VmBusyError(f"VM {vm.vmid} started migrating away or its LVs are "
                                  f"being renamed: extension of {node} deferred")
            # A drive that grows during a rename grows the LV QEMU has open,
            # by its name as of now.
            lv = DeviceBindings.current_lv(drive)
            if lv != drive.lv:
                drive = dataclasses.replace(drive, lv=lv)
            checked = time.monotonic()
            info, table, verdict = await self.tables.catch_up_locked(vm.vmid, drive, held)
            if verdict is TableState.AHEAD:
                raise self.tables.ahead(vm, drive, info.size, table)
            if verdict is TableState.BEHIND:
                # Another node grew it: caught up instead of growing again.
                self.tables.log_refreshed(vm, drive, table, info.size)
                fresh = policy.decide(drive.state(
                    lv_size=info.size, paused_nospace=state.paused_nospace,
                    reason=state.reason, job_room=state.job_room))
                if not isinstance(fresh, Growing):
                    return Grown.GREW
                decision = fresh
            if info.size >= decision.target:
                return Grown.ENOUGH
            # The pure rule keeps the VG's reserve for a VM paused on ENOSPC:
            # a drive of a running VM waits (no error, no backoff) and gets
            # its chunk the moment the VM pauses.
            held_back = extension_refusal(
                vg_free=info.vg_free, grow_by=decision.target - info.size,
                reserve=storage.guards.reserve_bytes(storage.chunksize),
                vm_paused_for_room=vm_paused_for_room)
            if held_back is not None:
                self.activity.hold(vm.vmid, node, held_back)
                self._said.say((vm.vmid, node, "reserve"), logging.WARNING, "VM %d %s: %s",
                               vm.vmid, node, held_back,
                               extra=fields(VMID=vm.vmid, BLOCK_NODE=node, VG=drive.vg))
                return Grown.HELD_BACK
            if isinstance(decision, policy.ExtendPastMaximum):
                log.warning(
                    "VM %d %s: paused on ENOSPC although LV %s already holds the measured"
                    " maximum %s (a fragmented image can outgrow qemu-img measure, Proxmox"
                    " bug 6543): growing one more chunk so the VM can run",
                    vm.vmid, node, drive.lv_path, format_size(drive.maximum),
                    extra=fields(VMID=vm.vmid, BLOCK_NODE=node, LV=drive.lv))
            held.require(self.settings.lvm_timeout + KILL_WAIT)
            with self.changes.running(vm.vmid, node, (drive.vg, drive.lv)):
                await lvm.extend(drive.vg, drive.lv, decision.target,
                                 timeout=self.settings.lvm_timeout, shells=self.shells)
            self.figures.changed(drive.vg)
            self.figures.grown(drive.vg, drive.lv, decision.target)
            self.lvm_health.record(drive.vg, None)
        elapsed_ms = ms_since(started)
        log.info("VM %d %s: LV %s extended %s -> %s in %d ms", vm.vmid, node,
                 drive.lv_path, format_size(info.size), format_size(decision.target),
                 elapsed_ms, extra=fields(
                     VMID=vm.vmid, BLOCK_NODE=node, LV=drive.lv, VG=drive.vg,
                     OLD_SIZE=info.size, NEW_SIZE=decision.target, DURATION_MS=elapsed_ms,
                     REASON=state.reason.value, ROUND_STARTED=f"{timings.started_wall:.6f}",
                     QMP_MS=timings.observe_ms + round((observed - started) * 1000),
                     LOCK_WAIT_MS=round((locked - observed) * 1000), LVM_MS=ms_since(checked)))
        self.activity.extended(Extension(
            time.time(), vm.vmid, node, drive.vg, drive.lv, info.size, decision.target, elapsed_ms,
            round((locked - observed) * 1000), ms_since(checked), ms_since(timings.started)))
        return Grown.GREW
