"""Look at one VM's thin drives and do what the policy says: the engine's core.

One :meth:`Extender.handle` call is one pass over one VM: observe its drives
through QMP, decide per drive (:func:`pvestord.policy.decide`), grow LVs under
the storage lock, re-arm thresholds, and resume the VM if it paused on ENOSPC
and every drive it paused on has room again. The daemon, ``pvestord extend``
and ``pvestord drives`` all come through here, so a manual extension takes
exactly the daemon's path.

Order of work for an extension, and why:

1. observe with QMP (allocation, threshold, virtual size); the LV size
   comes from LVM, read on every reconcile pass and otherwise remembered
   from our last read or extension (QEMU 7.2 does not re-read a
   ``host_device``'s size when it grows, so its figure cannot be used), and
   the extent size is cached per VG: the event path runs no LVM command
   before the lock;
2. take the VG's gate (extensions in one VG are serialized in this process)
   and the storage lock (serialized across the cluster: two nodes writing one
   VG's metadata lose an extension);
3. read the LV from LVM under the lock and decide again on that: another node
   may have grown it (then this node's device-mapper table is smaller than
   the metadata, and gets a refresh instead of a second extension);
4. ``lvextend`` to an absolute size (idempotent when retried);
5. release the lock, then re-arm on a fresh QMP observation, and go round
   again if a fast writer is already past the new threshold.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from pvestord import policy
from pvestord.adapters import lvm, qemu_img
from pvestord.adapters.command import KILL_WAIT
from pvestord.adapters.config import DaemonSettings, StorageConfig, ThinStorage
from pvestord.adapters.locks import Held, VgLock, vg_lock
from pvestord.adapters.lvmshell import LvmShells
from pvestord.adapters.qmp import (
    MIGRATION_STATES,
    ThinDriveView,
    VmBusyError,
    VmMonitor,
    migration_status_from,
)
from pvestord.adapters.service import fields
from pvestord.adapters.vghealth import VgHealth
from pvestord.adapters.vms import LocalVm
from pvestord.engine import migration
from pvestord.engine.nodereport import LvmHealth
from pvestord.engine.status import Activity, Extension
from pvestord.errors import PvestordError
from pvestord.policy import (
    Decision,
    DriveIdentity,
    DriveState,
    ExtensionState,
    Reason,
    TableState,
)
from pvestord.policy.capacity import extension_refusal
from pvestord.policy.sizes import format_size

log = logging.getLogger(__name__)

#: Rounds of extend-then-rearm in one pass: a writer faster than an extension
#: crosses the new threshold before it is armed, and gets another chunk at once.
MAX_ROUNDS = 4
#: Seconds a whole-VG ``lvs`` may serve other reconcile passes of the same
#: sweep (they start together); never an extension's own read under the lock.
VG_REPORT_SHARE = 2.0
#: Budget for waiting on the storage lock: as ``cfs_lock``.
STORAGE_LOCK_TIMEOUT = 10.0
#: ``query-migrate`` statuses of a migration in flight (``completed`` leaves
#: the source in run state ``postmigrate``, already one of MIGRATION_STATES).
MIGRATING = frozenset({"setup", "active", "postcopy-active", "postcopy-paused",
                       "postcopy-recover", "pre-switchover", "device", "wait-unplug",
                       "cancelling"})


class StaleTableError(PvestordError):
    """This node's device-mapper table of an LV is larger than the LV's metadata."""


@dataclass(frozen=True)
class Drive:
    """A thin-drive candidate: QEMU's view joined with its storage."""

    view: ThinDriveView
    vg: str
    lv: str
    storage: ThinStorage | None
    maximum: int
    extent_size: int
    #: The LV's size in LVM's metadata, as last read or set by us.
    lv_size: int

    def state(self, *, lv_size: int | None = None, paused_nospace: bool = False,
              reason: Reason = Reason.ARM) -> DriveState:
        storage = self.storage
        return DriveState(
            lv_size=self.lv_size if lv_size is None else lv_size,
            allocation=self.view.allocation, threshold=self.view.threshold,
            virtual_size=self.view.virtual_size, maximum=self.maximum,
            extent_size=self.extent_size,
            chunksize=storage.chunksize if storage else 1,
            chunk_percentage=storage.chunk_percentage if storage else 0.5,
            paused_nospace=paused_nospace, reason=reason, thin=storage is not None)

    @property
    def identity(self) -> DriveIdentity:
        return DriveIdentity(self.view.path,
                             frozenset({self.view.file_node, self.view.format_node}))


@dataclass(frozen=True)
class DriveReport:
    """One drive's figures for ``pvestord drives`` (LV size read from LVM)."""

    vmid: int
    node_name: str
    format_node: str
    lv: str
    storage: str | None
    lv_size: int
    device_size: int
    allocation: int
    threshold: int
    maximum: int
    virtual_size: int
    state: ExtensionState
    #: Why the drive needs an operator or a refresh (a stale table); None when fine.
    problem: str | None = None


@dataclass
class RoundTimings:
    """Where one round's time went, logged with each extension it made.

    The benchmarks split an extension's latency with these (bench/latency.py):
    the queue wait ends when the round starts; QMP, the lock wait and LVM
    follow. Wall-clock for the start, so it compares with QEMU's event timestamp.
    """

    started_wall: float = field(default_factory=time.time)
    started: float = field(default_factory=time.monotonic)
    #: The round's QMP observation before its extensions.
    observe_ms: int = 0


@dataclass
class VmOutcome:
    """What one pass over a VM did, for the caller's bookkeeping."""

    #: File node-names of thin drives seen in the VM.
    drives: set[str] = field(default_factory=set)
    #: Every node-name the VM has: an entry naming none of them is stale.
    known_nodes: set[str] = field(default_factory=set)
    extensions: int = 0
    resumed: bool = False
    #: Per file node: the error that stopped its work this pass.
    errors: dict[str, PvestordError] = field(default_factory=dict)


class Extender:
    """The per-VM pass, with what must outlive it: gates, caches, storage config."""

    def __init__(self, settings: DaemonSettings,
                 storage_config: Callable[[], StorageConfig]) -> None:
        self.settings = settings
        self._storage_config = storage_config
        self._gates: dict[str, asyncio.Lock] = {}
        self._global_gate = asyncio.Lock()
        self._extent_sizes: dict[str, int] = {}
        self._lv_sizes: dict[tuple[str, str], int] = {}
        self._maximum_cache: dict[tuple[object, ...], int] = {}
        #: The latest whole-VG ``lvs`` per VG: (when started, its task).
        self._vg_reports: dict[str, tuple[float, asyncio.Future[list[lvm.LvRow]]]] = {}
        #: File nodes being extended right now, by (vmid, node): for ``drives``/status.
        self.extending: set[tuple[int, str]] = set()
        #: Our LVM commands' failures per VG, for this node's report.
        self.lvm_health = LvmHealth()
        #: Persistent ``lvm`` shells for the extension path, if configured.
        self.lvm_shells = LvmShells() if settings.lvm_shell else None
        #: The LV size we left after answering a drive's ENOSPC, by (vmid,
        #: QEMU pid, file node): a ``nospace`` that stays (a VM whose resume is
        #: blocked, sticky io-status) is answered once (policy.enospc_is_new).
        self._answered: dict[tuple[int, int, str], int] = {}
        #: The last message logged per (vmid, node, topic), for conditions that
        #: last many passes: logged at their level once per change, then at DEBUG.
        self._said: dict[tuple[int, str, str], str] = {}
        #: What ``pvestord status`` and the metrics show (engine/status.py).
        self.activity = Activity()

    def forget(self, vmid: int) -> None:
        """``vmid`` no longer runs here: drop what was remembered of its drives."""
        for key in [k for k in self._answered if k[0] == vmid]:
            del self._answered[key]
        for said in [k for k in self._said if k[0] == vmid]:
            del self._said[said]
        self.activity.forget(vmid)

    def _say(self, key: tuple[int, str, str], level: int, message: str, *args: object,
             extra: dict[str, str]) -> None:
        text = message % args
        if self._said.get(key) == text:
            log.debug(message, *args, extra=extra)
        else:
            self._said[key] = text
            log.log(level, message, *args, extra=extra)

    async def close(self) -> None:
        """Stop the LVM shells (a daemon's shutdown)."""
        if self.lvm_shells is not None:
            await self.lvm_shells.close()

    # -- locks

    @contextlib.asynccontextmanager
    async def _vg_gate(self, vg: str) -> AsyncIterator[None]:
        """Serialize extensions per VG (or globally, as the original proposal did)."""
        gate = self._global_gate if self.settings.global_worker else self._gates.setdefault(
            vg, asyncio.Lock())
        async with gate:
            yield

    def _monitor(self, vm: LocalVm) -> VmMonitor:
        return VmMonitor(vm.qmp_socket, f"VM {vm.vmid}", timeout=self.settings.qmp_timeout)

    def _storage_lock(self, storage: ThinStorage) -> VgLock:
        """The locks of every storage on ``storage``'s VG (config R1), refused
        while the VG is marked unhealthy on this node."""
        return vg_lock(storage.vgname, self._storage_config().vg_users(storage.vgname),
                       lock_dir=self.settings.lock_dir, lifetime=self.settings.lock_lifetime,
                       health=VgHealth(self.settings.vg_health_dir))

    # -- observing

    async def _lv_sizes_of(self, vg: str, lv: str, *, fresh: bool,
                           shared: bool = False) -> tuple[int, int]:
        """(LV size, extent size); from LVM when ``fresh`` or not known yet.

        ``shared``: a report of the whole VG at most :data:`VG_REPORT_SHARE`
        old will do. A reconcile sweep starts every local VM's pass at once;
        one ``lvs`` of the VG then serves all of them, where one per drive
        made LVM most of the daemon's idle cost (bench/fleet.py).
        """
        size = self._lv_sizes.get((vg, lv))
        extent = self._extent_sizes.get(vg)
        if fresh and shared and extent is not None:
            rows = await self._vg_report(vg)
            if lv in rows:
                self._lv_sizes[(vg, lv)] = rows[lv]
                return rows[lv], extent
        if fresh or size is None or extent is None:
            info = await lvm.lv_info(vg, lv, timeout=self.settings.lvm_timeout,
                                     shells=self.lvm_shells)
            size, extent = self._remember(info)
        return size, extent

    async def _vg_report(self, vg: str) -> dict[str, int]:
        """LV sizes of ``vg`` by name, from one ``lvs`` shared by concurrent callers."""
        taken = self._vg_reports.get(vg)
        if taken is None or time.monotonic() - taken[0] > VG_REPORT_SHARE:
            task = asyncio.ensure_future(lvm.list_lvs(vg, timeout=self.settings.lvm_timeout))
            taken = (time.monotonic(), task)
            self._vg_reports[vg] = taken
        # shield: one caller's cancellation (a shutdown) must not fail the others'.
        rows = await asyncio.shield(taken[1])
        return {row.lv: row.size for row in rows}

    def _changed(self, vg: str) -> None:
        """We changed an LV of ``vg``: a shared report from before must not serve."""
        self._vg_reports.pop(vg, None)

    def _remember(self, info: lvm.LvInfo) -> tuple[int, int]:
        self._lv_sizes[(info.vg, info.lv)] = info.size
        self._extent_sizes[info.vg] = info.extent_size
        return info.size, info.extent_size

    async def _maximum(self, view: ThinDriveView, extent_size: int) -> int:
        info = qemu_img.parse_info(view.image)
        key = (info.virtual_size, info.cluster_size, info.extended_l2, info.refcount_bits,
               tuple((b.name, b.granularity) for b in info.bitmaps))
        measured = self._maximum_cache.get(key)
        if measured is None:
            measured = await qemu_img.maximum_required(
                info, timeout=self.settings.qemu_img_timeout)
            self._maximum_cache[key] = measured
        return policy.maximum_size(measured, extent_size)

    async def _drives(self, monitor: VmMonitor, outcome: VmOutcome | None = None, *,
                      fresh: bool = False, shared: bool = False) -> list[Drive]:
        config = self._storage_config()
        drives: list[Drive] = []
        views, names = await monitor.thin_drives()
        if outcome is not None:
            outcome.known_nodes |= names
        for view in views:
            vg_lv = lvm.lv_from_path(view.path)
            if vg_lv is None:
                continue  # a qcow2 on a plain file or another kind of device: not ours
            vg, lv = vg_lv
            storage = config.by_vg(vg, self.settings.node)
            size, extent = await self._lv_sizes_of(vg, lv, fresh=fresh, shared=shared)
            drives.append(Drive(view, vg, lv, storage, await self._maximum(view, extent),
                                extent, size))
        return drives

    async def report(self, vm: LocalVm) -> list[DriveReport]:
        """Every thin-drive candidate of ``vm`` with its LV read from LVM."""
        async with self._monitor(vm) as monitor:
            drives = await self._drives(monitor, fresh=True)
            run = await monitor.run_state()
        reports = []
        for drive in drives:
            info = await lvm.lv_info(drive.vg, drive.lv, timeout=self.settings.lvm_timeout)
            table = lvm.device_size(drive.vg, drive.lv)
            verdict = policy.table_state(info.size, table)
            state = drive.state(lv_size=info.size, paused_nospace=run.nospace_on(
                drive.view.path, drive.identity.node_names))
            reports.append(DriveReport(
                vm.vmid, drive.view.file_node, drive.view.format_node, drive.view.path,
                drive.storage.storeid if drive.storage else None, info.size,
                table, drive.view.allocation, drive.view.threshold,
                drive.maximum, drive.view.virtual_size,
                policy.classify(state, extending=(vm.vmid, drive.view.file_node)
                                in self.extending, failed=verdict is TableState.AHEAD)
                if drive.storage else ExtensionState.IDLE,
                _table_problem(verdict, info.size, table) if drive.storage else None))
        return reports

    async def thin_node_names(self, vm: LocalVm) -> tuple[set[str], set[str]]:
        """(every node-name of ``vm``, the node-names of its thin drives), from
        QMP and storage.cfg only: ``pvestord extend`` checks its argument with
        this before any LVM command."""
        config = self._storage_config()
        async with self._monitor(vm) as monitor:
            views, names = await monitor.thin_drives()
        thin: set[str] = set()
        for view in views:
            vg_lv = lvm.lv_from_path(view.path)
            if vg_lv is not None and config.by_vg(vg_lv[0], self.settings.node) is not None:
                thin |= {view.file_node, view.format_node}
        return names, thin

    # -- the pass

    async def handle(self, vm: LocalVm, requests: dict[str, Reason] | None = None) -> VmOutcome:
        """One pass over ``vm``.

        ``requests`` maps node-names named by queue entries to their reasons;
        None means every thin drive (reconcile). A node-name may name a file
        node (threshold events) or any node above it (a ``nospace`` event names
        the device's root node): a ``nospace`` request that matches no thin
        drive by name is applied to every thin drive of the VM, which is safe
        because the policy does nothing for a drive with headroom, and answers
        each drive's ENOSPC once (:func:`pvestord.policy.enospc_is_new`).
        Any other request naming no thin drive does nothing.
        """
        outcome = VmOutcome()
        for key in [k for k in self._answered if k[0] == vm.vmid and k[1] != vm.pid]:
            del self._answered[key]  # a QEMU that ended: its ENOSPCs were answered
        for number in range(MAX_ROUNDS):
            # A reconcile's first look may share a VG report with the other
            # passes of its sweep; a later round follows our own change and
            # reads its LVs exactly.
            again = await self._round(vm, requests, outcome,
                                      shared=requests is None and number == 0)
            if not again:
                break
            requests = None  # later rounds look at every drive with fresh figures
        return outcome

    async def _round(self, vm: LocalVm, requests: dict[str, Reason] | None,
                     outcome: VmOutcome, *, shared: bool = False) -> bool:
        """Observe, decide, act once. True when another round is needed."""
        timings = RoundTimings()
        async with self._monitor(vm) as monitor:
            run = await monitor.run_state()
            if run.status == "inmigrate":
                # The destination of a live migration: its QEMU takes the
                # devices' sizes at the switchover, so catch up now with
                # whatever the source grew (docs/design.md, "Live migration").
                await self._catch_up_incoming(vm, monitor)
            if run.status in MIGRATION_STATES:
                raise VmBusyError(f"VM {vm.vmid} is in state {run.status}: later")
            if await self._migrating_away(vm, monitor):
                raise migration.ExtensionsDeferred(vm.vmid, paused=run.paused_for_room)
            fresh = requests is None
            drives = await self._drives(monitor, outcome, fresh=fresh, shared=shared)
            thin_nodes = {name for d in drives if d.storage is not None
                          for name in (d.view.file_node, d.view.format_node)}
            if requests:
                self._note_requests_for_no_thin_drive(vm, requests, thin_nodes, outcome)
            if not run.paused_for_room:
                self._said.pop((vm.vmid, "", "resume"), None)
            # Figures just read from LVM are compared with this node's table
            # (an lseek each); a drive whose table differs gets nothing else
            # until it is settled under the lock: never a threshold past the
            # device's end, never an extension over a lost one.
            stale = {d.view.file_node for d in drives
                     if fresh and d.view.file_node not in outcome.errors
                     and self._table_differs(vm, d, outcome)}
            planned: list[tuple[Drive, Decision, DriveState]] = []
            for drive in drives:
                outcome.drives.add(drive.view.file_node)
                if drive.view.file_node in stale or drive.view.file_node in outcome.errors:
                    continue
                reason = reason_for(drive, requests, thin_nodes)
                if reason is None:
                    continue
                paused = run.nospace_on(drive.view.path, drive.identity.node_names)
                state = drive.state(paused_nospace=paused and self._enospc_is_new(vm, drive),
                                    reason=reason)
                planned.append((drive, policy.decide(state), state))
                self.activity.seen(vm.vmid, drive.view.file_node, drive.view.path, drive.vg,
                                   policy.classify(state), paused_nospace=paused,
                                   maximum=drive.maximum)
            # Cheap actions first, inside this QMP session.
            for drive, decision, _ in planned:
                await self._arm_or_disarm(monitor, vm, drive, decision)
        timings.observe_ms = _ms_since(timings.started)
        refreshed = False
        for drive in drives:
            if drive.view.file_node in stale:
                refreshed |= await self._settle_table(vm, drive, outcome)
        extended = False
        for drive, decision, state in planned:
            if isinstance(decision, policy.Extend | policy.ExtendPastMaximum):
                try:
                    extended |= await self._extend(vm, drive, decision, state, timings)
                except PvestordError as err:
                    outcome.errors[drive.view.file_node] = err
                    self.activity.failure()
                    continue
                if state.paused_nospace:
                    self._answered[(vm.vmid, vm.pid, drive.view.file_node)] = \
                        self._lv_sizes.get((drive.vg, drive.lv), decision.target)
        if extended:
            outcome.extensions += 1
        # Re-arm and resume on a fresh observation: sizes changed, and a fast
        # writer may already be past the new threshold.
        if extended or refreshed or run.paused_for_room:
            return await self._settle(vm, outcome, extended)
        return False

    def _enospc_is_new(self, vm: LocalVm, drive: Drive) -> bool:
        answered = self._answered.get((vm.vmid, vm.pid, drive.view.file_node))
        chunksize = drive.storage.chunksize if drive.storage else 1
        return policy.enospc_is_new(answered, drive.lv_size, drive.view.allocation, chunksize)

    def _note_requests_for_no_thin_drive(self, vm: LocalVm, requests: dict[str, Reason],
                                         thin_nodes: set[str], outcome: VmOutcome) -> None:
        """An entry naming a node of the VM that is no thin drive's does nothing
        (only ``nospace``, which names a device's root node, means every thin
        drive); say so. One naming no node at all is the daemon's to drop."""
        for name, reason in requests.items():
            if (name not in thin_nodes and reason is not Reason.NOSPACE
                    and name in outcome.known_nodes):
                log.warning("VM %d: entry %s (%s) names no thin drive: nothing done", vm.vmid,
                            name, reason.value,
                            extra=fields(VMID=vm.vmid, NODE_NAME=name, REASON=reason.value))

    def _table_differs(self, vm: LocalVm, drive: Drive, outcome: VmOutcome) -> bool:
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
            self._said.pop((vm.vmid, drive.view.file_node, "table"), None)
            return False
        return True

    async def _catch_up_table(self, drive: Drive,
                              held: Held) -> tuple[lvm.LvInfo, int, TableState]:
        """Under the lock: the LV's metadata, this node's table, and how they
        compare; a table behind the metadata is refreshed here (one ahead is
        the caller's to refuse: it is never written over)."""
        info = await lvm.lv_info(drive.vg, drive.lv, timeout=self.settings.lvm_timeout,
                                 shells=self.lvm_shells)
        self._remember(info)
        table = lvm.device_size(drive.vg, drive.lv)
        verdict = policy.table_state(info.size, table)
        if verdict is TableState.BEHIND:
            held.require(self.settings.lvm_timeout + KILL_WAIT)
            await lvm.refresh(drive.vg, drive.lv, timeout=self.settings.lvm_timeout)
            self._changed(drive.vg)
        return info, table, verdict

    async def _settle_table(self, vm: LocalVm, drive: Drive, outcome: VmOutcome) -> bool:
        """Compare the table with the metadata under the lock; refresh a table
        that is behind (True), refuse one that is ahead (an error for the drive)."""
        assert drive.storage is not None
        node = drive.view.file_node
        try:
            async with self._vg_gate(drive.vg), \
                    self._storage_lock(drive.storage).acquire_async(STORAGE_LOCK_TIMEOUT) \
                    as held:
                info, table, verdict = await self._catch_up_table(drive, held)
        except PvestordError as err:
            outcome.errors[node] = err
            return False
        if verdict is TableState.AHEAD:
            outcome.errors[node] = self._table_ahead(vm, drive, info.size, table)
            return False
        if verdict is TableState.BEHIND:
            self._log_refreshed(vm, drive, table, info.size)
            return True
        return False

    def _log_refreshed(self, vm: LocalVm, drive: Drive, table: int, size: int) -> None:
        node = drive.view.file_node
        self._said.pop((vm.vmid, node, "table"), None)
        log.info("VM %d %s: LV %s was grown elsewhere to %s (this node's table had %s):"
                 " refreshed", vm.vmid, node, drive.view.path, format_size(size),
                 format_size(table), extra=fields(
                     VMID=vm.vmid, NODE_NAME=node, LV=drive.view.path, TABLE="refreshed",
                     OLD_SIZE=table, NEW_SIZE=size))

    def _table_ahead(self, vm: LocalVm, drive: Drive, size: int,
                     table: int) -> StaleTableError:
        node = drive.view.file_node
        self._say((vm.vmid, node, "table"), logging.ERROR,
                  "VM %d %s: this node's device-mapper table of LV %s (%s) is larger than the"
                  " LV in LVM's metadata (%s): an extension was lost or the LV was shrunk"
                  " elsewhere; the extents past the metadata's end are free in the VG and may"
                  " hold guest data. Not extended, not resumed: an operator must look",
                  vm.vmid, node, drive.view.path, format_size(table), format_size(size),
                  extra=fields(VMID=vm.vmid, NODE_NAME=node, LV=drive.view.path,
                               TABLE="ahead", TABLE_SIZE=table, LV_SIZE=size))
        return StaleTableError(
            f"VM {vm.vmid} {node}: device-mapper table of {drive.view.path} "
            f"({format_size(table)}) is larger than the LV ({format_size(size)}): "
            "not extended, not resumed")

    async def _arm_or_disarm(self, monitor: VmMonitor, vm: LocalVm, drive: Drive,
                             decision: Decision) -> None:
        node = drive.view.file_node
        if isinstance(decision, policy.Arm):
            await monitor.set_threshold(node, decision.threshold)
            log.info("VM %d %s: threshold armed at %s (LV %s)", vm.vmid, node,
                     format_size(decision.threshold), format_size(drive.lv_size),
                     extra=fields(VMID=vm.vmid, NODE_NAME=node, LV=drive.view.path,
                                  THRESHOLD=decision.threshold))
        elif isinstance(decision, policy.AtMaximum) and decision.disarm:
            await monitor.set_threshold(node, 0)
            log.info("VM %d %s: LV holds the whole image (%s): threshold removed", vm.vmid,
                     node, format_size(drive.maximum),
                     extra=fields(VMID=vm.vmid, NODE_NAME=node, LV=drive.view.path))

    async def _extend(self, vm: LocalVm, drive: Drive, decision: policy.Extend
                      | policy.ExtendPastMaximum, state: DriveState,
                      timings: RoundTimings) -> bool:
        """Grow the LV under the VG gate and the storage lock. True if it grew."""
        assert drive.storage is not None  # the policy never extends a drive that is not thin
        node = drive.view.file_node
        key = (vm.vmid, node)
        started = time.monotonic()
        self.extending.add(key)
        try:
            return await self._extend_locked(vm, drive, decision, state, timings, started)
        except lvm.LvmError as err:
            self.lvm_health.record(drive.vg, str(err))
            raise
        finally:
            self.extending.discard(key)

    async def _extend_locked(self, vm: LocalVm, drive: Drive, decision: policy.Extend
                             | policy.ExtendPastMaximum, state: DriveState,
                             timings: RoundTimings, started: float) -> bool:
        """:meth:`_extend`'s work, under the VG gate and the storage lock."""
        assert drive.storage is not None
        node = drive.view.file_node
        # QMP before the lock, never under it: a slow QEMU must not hold the
        # cluster-wide lock (REVIEW 1.1).
        if await self._migrating_away(vm):
            raise VmBusyError(f"VM {vm.vmid} started migrating away: extension of "
                              f"{node} deferred")
        observed = time.monotonic()
        async with self._vg_gate(drive.vg), \
                self._storage_lock(drive.storage).acquire_async(STORAGE_LOCK_TIMEOUT) as held:
            locked = time.monotonic()
            # Under the lock only the mark: a migration's begin marks the VM
            # and then takes this lock, so the mark is a barrier for us.
            if migration.outgoing_marked(self.settings.run_dir, vm.vmid):
                raise VmBusyError(f"VM {vm.vmid} started migrating away: extension of "
                                  f"{node} deferred")
            checked = time.monotonic()
            info, table, verdict = await self._catch_up_table(drive, held)
            if verdict is TableState.AHEAD:
                raise self._table_ahead(vm, drive, info.size, table)
            if verdict is TableState.BEHIND:
                # Another node grew it: caught up instead of growing again.
                self._log_refreshed(vm, drive, table, info.size)
                fresh = policy.decide(drive.state(
                    lv_size=info.size, paused_nospace=state.paused_nospace,
                    reason=state.reason))
                if not isinstance(fresh, policy.Extend | policy.ExtendPastMaximum):
                    return True
                decision = fresh
            if info.size >= decision.target:
                return False
            # The pure rule keeps the VG's reserve for a VM paused on ENOSPC:
            # this drive waits (no error, no backoff) and gets its chunk the
            # moment it pauses.
            held_back = extension_refusal(
                vg_free=info.vg_free, grow_by=decision.target - info.size,
                reserve=drive.storage.guards.reserve_bytes(drive.storage.chunksize),
                paused_nospace=state.paused_nospace)
            if held_back is not None:
                self.activity.hold(vm.vmid, node, held_back)
                self._say((vm.vmid, node, "reserve"), logging.WARNING, "VM %d %s: %s", vm.vmid,
                          node, held_back, extra=fields(VMID=vm.vmid, NODE_NAME=node,
                                                        VG=drive.vg))
                return False
            if isinstance(decision, policy.ExtendPastMaximum):
                log.warning(
                    "VM %d %s: paused on ENOSPC although LV %s already holds the measured"
                    " maximum %s (a fragmented image can outgrow qemu-img measure, Proxmox"
                    " bug 6543): growing one more chunk so the VM can run",
                    vm.vmid, node, drive.view.path, format_size(drive.maximum),
                    extra=fields(VMID=vm.vmid, NODE_NAME=node, LV=drive.view.path))
            held.require(self.settings.lvm_timeout + KILL_WAIT)
            await lvm.extend(drive.vg, drive.lv, decision.target,
                             timeout=self.settings.lvm_timeout, shells=self.lvm_shells)
            self._changed(drive.vg)
            self._lv_sizes[(drive.vg, drive.lv)] = decision.target
            self.lvm_health.record(drive.vg, None)
        elapsed_ms = _ms_since(started)
        log.info("VM %d %s: LV %s extended %s -> %s in %d ms", vm.vmid, node,
                 drive.view.path, format_size(info.size), format_size(decision.target),
                 elapsed_ms, extra=fields(
                     VMID=vm.vmid, NODE_NAME=node, LV=drive.view.path, VG=drive.vg,
                     OLD_SIZE=info.size, NEW_SIZE=decision.target, DURATION_MS=elapsed_ms,
                     REASON=state.reason.value, ROUND_STARTED=f"{timings.started_wall:.6f}",
                     QMP_MS=timings.observe_ms + round((observed - started) * 1000),
                     LOCK_WAIT_MS=round((locked - observed) * 1000), LVM_MS=_ms_since(checked)))
        self.activity.extended(Extension(
            time.time(), vm.vmid, node, drive.view.path, info.size, decision.target, elapsed_ms,
            round((locked - observed) * 1000), _ms_since(checked), _ms_since(timings.started)))
        return True

    async def _migrating_away(self, vm: LocalVm, monitor: VmMonitor | None = None) -> bool:
        """Whether ``vm`` is the source of a live migration now, or is about to
        be: its LVs must not grow here (the destination could miss the new size).
        QEMU's word (``query-migrate``, run state) and the outgoing mark together
        (:func:`pvestord.engine.migration.deferral`)."""
        if monitor is None:
            async with self._monitor(vm) as fresh:
                in_flight = await migrating_away(fresh)
        else:
            in_flight = await migrating_away(monitor)
        return migration.outgoing_deferral(self.settings.run_dir, vm.vmid,
                                           in_flight=in_flight).defers

    async def _catch_up_incoming(self, vm: LocalVm, monitor: VmMonitor) -> None:
        """Refresh every thin LV of an incoming VM that another node grew.

        Compared without the lock (LVM's metadata against this node's table):
        the lock is taken, and the comparison made again under it, only when
        the table is behind. A VM waiting in ``inmigrate`` is looked at on
        every retry, and a storage-lock round trip per drive each time was
        most of the load of a migration (REVIEW 4.1).
        """
        for drive in await self._drives(monitor, fresh=True):
            if drive.storage is None or lvm.device_size(drive.vg, drive.lv) >= drive.lv_size:
                continue
            key = (vm.vmid, drive.view.file_node)
            self.extending.add(key)  # an LVM change: the daemon's deadline marks its VG
            try:
                async with self._vg_gate(drive.vg), \
                        self._storage_lock(drive.storage).acquire_async(STORAGE_LOCK_TIMEOUT) \
                        as held:
                    done = await migration.catch_up(drive.vg, drive.lv, held=held)
            finally:
                self.extending.discard(key)
            if done.action == "refreshed":
                self._changed(drive.vg)
                log.info("VM %d %s: incoming migration: LV %s refreshed %s -> %s", vm.vmid,
                         drive.view.file_node, drive.view.path, format_size(done.old),
                         format_size(done.new), extra=fields(
                             VMID=vm.vmid, NODE_NAME=drive.view.file_node, LV=drive.view.path,
                             VG=drive.vg, OLD_SIZE=done.old, NEW_SIZE=done.new))

    async def _settle(self, vm: LocalVm, outcome: VmOutcome, extended: bool) -> bool:
        """Re-arm every drive and resume a VM paused on ENOSPC that has room again."""
        async with self._monitor(vm) as monitor:
            drives = await self._drives(monitor)
            run = await monitor.run_state()
            need_more = False
            for drive in drives:
                if drive.view.file_node in outcome.errors:
                    continue
                decision = policy.decide(drive.state(paused_nospace=False))
                if isinstance(decision, policy.Extend | policy.ExtendPastMaximum):
                    need_more = True  # a fast writer is already past the new threshold
                await self._arm_or_disarm(monitor, vm, drive, decision)
            blocker = None
            if run.paused_for_room and not need_more:
                thin = [d for d in drives if d.storage is not None]
                blocker = policy.resume_blocker(
                    run.nospace_devices,
                    [d.identity for d in thin if d.view.file_node not in outcome.errors],
                    [d.identity for d in thin if d.view.file_node in outcome.errors],
                    unowned_pause=run.paused_on_unowned_error)
                if blocker is not None:
                    self._say_blocked(vm, blocker, outcome)
            if run.paused_for_room and not need_more and blocker is None:
                await monitor.cont()
                outcome.resumed = True
                self._said.pop((vm.vmid, "", "resume"), None)
                if run.paused_on_nospace:
                    log.warning("VM %d: resumed after it paused on ENOSPC", vm.vmid,
                                extra=fields(VMID=vm.vmid))
                else:
                    log.warning("VM %d: resumed after an I/O error pause that no device owns"
                                " (brought by a live migration, which does not carry the"
                                " devices' io-status); its thin drives were given room first",
                                vm.vmid, extra=fields(VMID=vm.vmid))
        return need_more or (run.paused_for_room and not outcome.resumed and extended)

    def _say_blocked(self, vm: LocalVm, blocker: policy.ResumeBlocker,
                     outcome: VmOutcome) -> None:
        """Why a VM paused for room stays paused (the thin drives got their
        one extension per new ENOSPC, and no more)."""
        extra = fields(VMID=vm.vmid, DEVICE=blocker.device,
                       RESUME_BLOCKED=blocker.because.value)
        if blocker.because is policy.BlockedBecause.NOT_THIN:
            self._say((vm.vmid, "", "resume"), logging.WARNING,
                      "VM %d stays paused: device %s has io-status nospace and is not a thin"
                      " drive: it is out of space, or that status is left over from an"
                      " earlier pause (QEMU keeps it after cont on -blockdev devices). Its"
                      " thin drives got room; resume the VM by hand once %s has room too",
                      vm.vmid, blocker.device, blocker.device, extra=extra)
        else:
            errors = "; ".join(str(e) for e in outcome.errors.values())
            self._say((vm.vmid, "", "resume"), logging.WARNING,
                      "VM %d stays paused: thin drive %s failed: %s", vm.vmid,
                      blocker.device, errors, extra=extra)


async def migrating_away(monitor: VmMonitor) -> bool:
    """Whether the VM behind ``monitor`` is migrating away, or has gone.

    ``completed`` alone is not enough: a destination reports its incoming
    migration as ``completed`` too. The source is the one left in run state
    ``postmigrate``. Seen in the two-node tier: a pass read the run state
    while the migration was active and ``query-migrate`` just after it
    completed, and grew the LV of a VM that already ran on the other node.
    """
    status = migration_status_from(await monitor.execute("query-migrate"))
    if status in MIGRATING:
        return True
    if status == "completed":
        return (await monitor.run_state()).status in MIGRATION_STATES
    return False


def _ms_since(start: float) -> int:
    return round((time.monotonic() - start) * 1000)


def reason_for(drive: Drive, requests: dict[str, Reason] | None,
                thin_nodes: set[str]) -> Reason | None:
    """The reason to look at ``drive``, or None to leave it alone this pass.

    A ``nospace`` request naming no thin drive's node (a device's root node,
    as ``BLOCK_IO_ERROR`` reports it) applies to every thin drive; any other
    reason applies only to the drive it names (a typo in ``pvestord extend``
    must not grow every drive of the VM).
    """
    if requests is None:
        return Reason.ARM
    names = {drive.view.file_node, drive.view.format_node}
    relevant = [reason for name, reason in requests.items()
                if name in names or (name not in thin_nodes and reason is Reason.NOSPACE)]
    return max(relevant, key=lambda r: r.strength) if relevant else None


def _table_problem(verdict: TableState, size: int, table: int) -> str | None:
    if verdict is TableState.AHEAD:
        return (f"device-mapper table ({format_size(table)}) larger than the LV "
                f"({format_size(size)}): never extended or resumed until an operator looks")
    if verdict is TableState.BEHIND:
        return (f"device-mapper table ({format_size(table)}) smaller than the LV "
                f"({format_size(size)}): the next pass refreshes it")
    return None
