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
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field

from pvestord import lvm, migration, policy, qemu_img
from pvestord.config import DaemonSettings, StorageConfig, ThinStorage
from pvestord.errors import PvestordError
from pvestord.locks import Lock, storage_lock
from pvestord.lvmshell import LvmShells
from pvestord.nodereport import LvmHealth
from pvestord.policy import Decision, DriveState, ExtensionState, Reason
from pvestord.qmp import (
    MIGRATION_STATES,
    RunState,
    ThinDriveView,
    VmBusyError,
    VmMonitor,
    migration_status_from,
)
from pvestord.service import fields
from pvestord.sizes import format_size
from pvestord.vms import LocalVm

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

    def _storage_lock(self, storage: ThinStorage) -> Lock:
        return storage_lock(storage.storeid, shared=storage.shared,
                            lock_dir=self.settings.lock_dir)

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
            state = drive.state(lv_size=info.size, paused_nospace=run.nospace_on(drive.view.path))
            reports.append(DriveReport(
                vm.vmid, drive.view.file_node, drive.view.format_node, drive.view.path,
                drive.storage.storeid if drive.storage else None, info.size,
                lvm.device_size(drive.vg, drive.lv), drive.view.allocation, drive.view.threshold,
                drive.maximum, drive.view.virtual_size,
                policy.classify(state, extending=(vm.vmid, drive.view.file_node)
                                in self.extending) if drive.storage else ExtensionState.IDLE))
        return reports

    # -- the pass

    async def handle(self, vm: LocalVm, requests: dict[str, Reason] | None = None) -> VmOutcome:
        """One pass over ``vm``.

        ``requests`` maps node-names named by queue entries to their reasons;
        None means every thin drive (reconcile). A node-name may name a file
        node (threshold events) or any node above it (a ``nospace`` event names
        the device's root node): a request that matches no thin drive by name
        is applied to every thin drive of the VM, which is always safe because
        the policy does nothing for a drive with headroom.
        """
        outcome = VmOutcome()
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
                # whatever the source grew (DESIGN.md, Live migration).
                await self._catch_up_incoming(vm, monitor)
            if run.status in MIGRATION_STATES:
                raise VmBusyError(f"VM {vm.vmid} is in state {run.status}: later")
            if await self._migrating_away(vm, monitor):
                raise migration.ExtensionsDeferred(vm.vmid, paused=run.paused_for_room)
            drives = await self._drives(monitor, outcome, fresh=requests is None,
                                        shared=shared)
            thin_nodes = {name for d in drives for name in (d.view.file_node, d.view.format_node)}
            planned: list[tuple[Drive, Decision, DriveState]] = []
            for drive in drives:
                outcome.drives.add(drive.view.file_node)
                reason = _reason_for(drive, requests, thin_nodes)
                if reason is None:
                    continue
                state = drive.state(paused_nospace=run.nospace_on(drive.view.path),
                                    reason=reason)
                planned.append((drive, policy.decide(state), state))
            # Cheap actions first, inside this QMP session.
            for drive, decision, _ in planned:
                await self._arm_or_disarm(monitor, vm, drive, decision)
        timings.observe_ms = _ms_since(timings.started)
        extended = False
        for drive, decision, state in planned:
            if isinstance(decision, policy.Extend | policy.ExtendPastMaximum):
                try:
                    extended |= await self._extend(vm, drive, decision, state, timings)
                except PvestordError as err:
                    outcome.errors[drive.view.file_node] = err
        if extended:
            outcome.extensions += 1
        # Re-arm and resume on a fresh observation: sizes changed, and a fast
        # writer may already be past the new threshold.
        if extended or run.paused_for_room:
            return await self._settle(vm, outcome, extended)
        return False

    async def _arm_or_disarm(self, monitor: VmMonitor, vm: LocalVm, drive: Drive,
                             decision: Decision) -> None:
        node = drive.view.file_node
        if isinstance(decision, policy.Arm):
            await monitor.set_threshold(node, decision.threshold)
            log.info("VM %d %s: threshold armed at %s (LV %s)", vm.vmid, node,
                     format_size(decision.threshold), format_size(drive.lv_size),
                     extra=fields(VMID=vm.vmid, NODE_NAME=node, LV=drive.view.path))
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
        async with self._vg_gate(drive.vg), \
                self._storage_lock(drive.storage).acquire_async(STORAGE_LOCK_TIMEOUT):
            locked = time.monotonic()
            # Under the lock, so that a migration's begin (which takes
            # this lock after marking the VM) is a barrier for us.
            if await self._migrating_away(vm):
                raise VmBusyError(f"VM {vm.vmid} started migrating away: extension of "
                                  f"{node} deferred")
            checked = time.monotonic()
            info = await lvm.lv_info(drive.vg, drive.lv, timeout=self.settings.lvm_timeout,
                                     shells=self.lvm_shells)
            self._remember(info)
            if info.size > lvm.device_size(drive.vg, drive.lv):
                # The metadata is ahead of this node's device-mapper table:
                # another node grew it. Catch up instead of growing again.
                await lvm.refresh(drive.vg, drive.lv, timeout=self.settings.lvm_timeout)
                self._changed(drive.vg)
                log.info("VM %d %s: LV %s was grown elsewhere to %s: refreshed", vm.vmid,
                         node, drive.view.path, format_size(info.size),
                         extra=fields(VMID=vm.vmid, NODE_NAME=node, LV=drive.view.path))
                fresh = policy.decide(drive.state(
                    lv_size=info.size, paused_nospace=state.paused_nospace,
                    reason=state.reason))
                if not isinstance(fresh, policy.Extend | policy.ExtendPastMaximum):
                    return True
                decision = fresh
            if info.size >= decision.target:
                return False
            if isinstance(decision, policy.ExtendPastMaximum):
                log.warning(
                    "VM %d %s: paused on ENOSPC although LV %s already holds the measured"
                    " maximum %s (a fragmented image can outgrow qemu-img measure, Proxmox"
                    " bug 6543): growing one more chunk so the VM can run",
                    vm.vmid, node, drive.view.path, format_size(drive.maximum),
                    extra=fields(VMID=vm.vmid, NODE_NAME=node, LV=drive.view.path))
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
                     QMP_MS=timings.observe_ms + round((checked - locked) * 1000),
                     LOCK_WAIT_MS=round((locked - started) * 1000), LVM_MS=_ms_since(checked)))
        return True

    async def _migrating_away(self, vm: LocalVm, monitor: VmMonitor | None = None) -> bool:
        """Whether ``vm`` is the source of a live migration now, or is about to
        be: its LVs must not grow here (the destination could miss the new size).
        QEMU's word (``query-migrate``, run state) and the outgoing mark together
        (:func:`pvestord.migration.deferral`)."""
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
                        self._storage_lock(drive.storage).acquire_async(STORAGE_LOCK_TIMEOUT):
                    done = await migration.catch_up(drive.vg, drive.lv)
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
            if run.paused_for_room and not need_more and _may_resume(run, drives, outcome):
                await monitor.cont()
                outcome.resumed = True
                if run.paused_on_nospace:
                    log.warning("VM %d: resumed after it paused on ENOSPC", vm.vmid,
                                extra=fields(VMID=vm.vmid))
                else:
                    log.warning("VM %d: resumed after an I/O error pause that no device owns"
                                " (brought by a live migration, which does not carry the"
                                " devices' io-status); its thin drives were given room first",
                                vm.vmid, extra=fields(VMID=vm.vmid))
        return need_more or (run.paused_for_room and not outcome.resumed and extended)


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


def _reason_for(drive: Drive, requests: dict[str, Reason] | None,
                thin_nodes: set[str]) -> Reason | None:
    """The reason to look at ``drive``, or None to leave it alone this pass.

    A request naming no thin drive's node (a device's root node, as
    ``BLOCK_IO_ERROR`` reports it) applies to every thin drive.
    """
    if requests is None:
        return Reason.ARM
    names = {drive.view.file_node, drive.view.format_node}
    relevant = [reason for name, reason in requests.items()
                if name in names or name not in thin_nodes]
    return max(relevant, key=lambda r: r.strength) if relevant else None


def _may_resume(run: RunState, drives: Iterable[Drive], outcome: VmOutcome) -> bool:
    """Resume only a VM whose every ENOSPC pause sits on a thin drive that now has room.

    A device paused on ENOSPC that is not one of our thin drives (a qcow2 on a
    full file system, say) would pause again at once; a real I/O error
    (io-status ``failed``) is never ours to resume (``paused_on_nospace`` is
    False then).
    """
    ours = [d for d in drives if d.storage is not None and d.view.file_node not in outcome.errors]
    return all(any(d.view.path in label for d in ours) for label in run.nospace_devices)
