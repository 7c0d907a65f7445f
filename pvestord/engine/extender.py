"""Look at one VM's thin drives and do what the policy says: the engine's core.

One :meth:`Extender.handle` call is one pass over one VM: observe its drives
through QMP, decide per drive (:func:`pvestord.policy.decide`), grow LVs under
the storage lock, re-arm thresholds, and resume the VM if it paused on ENOSPC
and every drive it paused on has room again. The daemon, ``pvestord extend``
and ``pvestord drives`` (:func:`drive_reports`) all come through here, so a
manual extension takes exactly the daemon's path.

Order of work for an extension, and why:

1. observe with QMP (allocation, threshold, virtual size) in one short
   session that does nothing else, then leave it: qemu-server and pvestatd
   share the VM's only QMP socket and give each call 5 s, connect included,
   so no LVM command, lock wait or ``qemu-img`` ever runs while pvestord
   holds it (each later step that needs QMP opens a session of its own);
   the LV size
   comes from LVM, read on every reconcile pass and otherwise remembered
   from our last read or extension (QEMU 7.2 does not re-read a
   ``host_device``'s size when it grows, so its figure cannot be used), and
   the extent size is cached per VG: the event path runs no LVM command
   before the lock (:mod:`~pvestord.engine.lvfigures`);
2. take the VG's gate (extensions in one VG are serialized in this process)
   and the storage lock (serialized across the cluster: two nodes writing one
   VG's metadata lose an extension; :class:`~pvestord.engine.lvmchanges.VgGates`);
3. read the LV from LVM under the lock and decide again on that: another node
   may have grown it (then this node's device-mapper table is smaller than
   the metadata, and gets a refresh instead of a second extension;
   :mod:`~pvestord.engine.tables`);
4. ``lvextend`` to an absolute size (idempotent when retried;
   :mod:`~pvestord.engine.lvgrowth`);
5. release the lock, then re-arm on a fresh QMP observation, and go round
   again if a fast writer is already past the new threshold
   (:mod:`~pvestord.engine.settle`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from pvestord import policy
from pvestord.adapters import lvm
from pvestord.adapters.config import StorageConfig
from pvestord.adapters.lvmshell import LvmShells
from pvestord.adapters.qmp import (
    MIGRATION_STATES,
    RunState,
    ThinDriveView,
    VmMonitor,
)
from pvestord.adapters.service import fields
from pvestord.adapters.settings import DaemonSettings
from pvestord.adapters.vms import LocalVm
from pvestord.engine import migration
from pvestord.engine.binding import DeviceBindings
from pvestord.engine.drive import (
    Drive,
    DriveCandidate,
    DriveRow,
    RoundTimings,
    VmOutcome,
    candidates,
    ms_since,
    thin_block_nodes,
)
from pvestord.engine.jobroom import room_for_chain_copies, say_unprepared_deletes
from pvestord.engine.livereduce import LiveReductions
from pvestord.engine.lvfigures import LvFigures
from pvestord.engine.lvgrowth import Grown, LvGrowth
from pvestord.engine.lvmchanges import LvmChanges, LvmHealth, VgGates
from pvestord.engine.memory import EnospcAnswers, Notices, OncePerChange, silent
from pvestord.engine.settle import (
    PausedJobs,
    arm_or_disarm,
    changes_threshold,
    rearm_and_resume,
)
from pvestord.engine.status import Activity
from pvestord.engine.tables import Tables, table_problem
from pvestord.engine.werror import WerrorWatch, werror_problem, werror_risks
from pvestord.errors import PvestordError
from pvestord.policy import Decision, DriveState, ExtensionState, Reason, TableState
from pvestord.policy.notices import VmPaused, paused_key
from pvestord.policy.resume import BlockedBecause
from pvestord.policy.vmconfig import grows_while_renaming

log = logging.getLogger(__name__)


class Extender:
    """The per-VM pass, with what must outlive it: gates, caches, storage config."""

    def __init__(self, settings: DaemonSettings,
                 storage_config: Callable[[], StorageConfig], *,
                 quiet_locks: migration.QuietRenamingLocks | None = None,
                 notices: Notices | None = None) -> None:
        self.settings = settings
        #: A VM paused for room is told to Proxmox's notifications once per pause.
        self.notices = notices if notices is not None else silent()
        self._storage_config = storage_config
        #: Persistent ``lvm`` shells for the extension path, if configured.
        self.lvm_shells = LvmShells() if settings.lvm_shell else None
        self.figures = LvFigures(settings, self.lvm_shells)
        self.gates = VgGates(settings, storage_config)
        #: Conditions that last many passes, logged once per change.
        self._said = OncePerChange()
        #: What ``pvestord status`` and the metrics show (engine/status.py).
        self.activity = Activity()
        #: The LVM commands that change a VG running now: the pass deadline's mark.
        self.lvm_changes = LvmChanges()
        #: Our LVM commands' failures per VG, for this node's report.
        self.lvm_health = LvmHealth()
        #: What a migration or a rename of the VM's LVs means for the pass and
        #: its extensions (``quiet_locks``: a test's own clock for renaming locks).
        self.migrations = migration.MigrationWatch(
            settings, said=self._said, gates=self.gates, figures=self.figures,
            activity=self.activity, changes=self.lvm_changes, quiet_locks=quiet_locks)
        self.tables = Tables(settings, self.figures, self.gates, self._said, self.lvm_shells,
                             self.lvm_changes)
        self.bindings = DeviceBindings(self._said)
        self.growth = LvGrowth(settings, figures=self.figures, gates=self.gates,
                               tables=self.tables, shells=self.lvm_shells,
                               migrations=self.migrations, activity=self.activity,
                               said=self._said, changes=self.lvm_changes,
                               health=self.lvm_health)
        self.answers = EnospcAnswers()
        self.werror = WerrorWatch()
        self.jobs = PausedJobs(self._said)
        #: Copy targets made thin under their running VM (the daemon's reconciles).
        self.live = LiveReductions(settings, gates=self.gates, figures=self.figures,
                                   changes=self.lvm_changes, said=self._said,
                                   monitor=self.monitor, found=self.found)

    def note_pause(self, vmid: int, run: RunState) -> None:
        """Tell Proxmox's notifications of a VM paused for room. Every round of
        every pass sees the pause; the notice goes once per pause, and a VM
        seen running again ends it."""
        if run.paused_for_room:
            self.notices.seen(VmPaused(vmid, tuple(d.name for d in run.nospace_devices)))
        else:
            self.notices.over(paused_key(vmid))

    def forget(self, vmid: int) -> None:
        """``vmid`` no longer runs here: drop what was remembered of its drives."""
        self.answers.forget(vmid)
        self._said.forget(vmid)
        self.notices.over(paused_key(vmid))  # a VM that stopped is no longer paused
        self.migrations.forget(vmid)
        self.bindings.forget(vmid)
        self.werror.forget(vmid)
        self.jobs.forget(vmid)
        self.activity.forget(vmid)

    async def close(self) -> None:
        """Stop the LVM shells (a daemon's shutdown)."""
        if self.lvm_shells is not None:
            await self.lvm_shells.close()

    def monitor(self, vm: LocalVm) -> VmMonitor:
        """A QMP session with ``vm``, with the daemon's budget."""
        return VmMonitor(vm.qmp_socket, f"VM {vm.vmid}", timeout=self.settings.qmp_timeout)

    def found(self, views: Iterable[ThinDriveView]) -> list[DriveCandidate]:
        """QEMU's views joined with their storage (no I/O)."""
        return candidates(views, self._storage_config(), self.settings.node)

    async def look(self, vm: LocalVm, monitor: VmMonitor, *,
                   migration_check: bool = True) -> Look:
        """One observation in ``monitor``'s session: QMP commands, then each
        drive bound to the LV QEMU writes (reads of ``/proc`` and ``/sys``,
        no LVM)."""
        run = await monitor.run_state()
        check = migration_check and run.status not in MIGRATION_STATES
        in_flight = check and await migration.migration_under_way(monitor, run)
        nodes = await monitor.block_nodes()
        # The job graph only while a commit, a stream or a mirror runs: no
        # cost to a pass without one.
        graph = (await monitor.job_graph()
                 if any(policy.needs_job_graph(job) for job in run.jobs) else {})
        # A mirror into an NBD export is a live migration's local disks
        # going to the target, hours before query-migrate shows anything:
        # from what this look read, no command more.
        in_flight = in_flight or (check and migration.mirroring_to_nbd(run.jobs, nodes, graph))
        # Their progress read again, after the allocations: what a job copies
        # between the two replies then counts in neither, where read the
        # other way round it counted in both (a whole first burst of an
        # active commit, seen as a base grown 12 MiB past what it needed).
        progress = await monitor.block_jobs() if graph else run.jobs
        copies = [copy for job in progress if job.id in graph
                  if (copy := policy.chain_copy(job, graph[job.id])) is not None]
        return Look(run, in_flight, self.bindings.bind(vm, self.found(nodes.drives)),
                    nodes.names, policy.room_for_jobs(progress, graph),
                    tuple((copy, nodes.filenames[copy.mapped]) for copy in copies
                          if copy.mapped in nodes.filenames))

    async def thin_block_nodes(self, vm: LocalVm) -> tuple[set[str], set[str]]:
        """(every node-name of ``vm``, the node-names of its thin drives), from
        QMP and storage.cfg only: ``pvestord extend`` checks its argument with
        this before any LVM command."""
        async with self.monitor(vm) as monitor:
            nodes = await monitor.block_nodes()
        return nodes.names, thin_block_nodes(self.found(nodes.drives))

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
        self.answers.qemu_seen(vm)
        for number in range(policy.MAX_ROUNDS):
            outcome.waits_for = None  # only the last round's re-arm says who holds the VM
            # A reconcile's first look may share a VG report with the other
            # passes of its sweep; a later round follows our own change and
            # reads its LVs exactly.
            again = await self._round(vm, requests, outcome,
                                      shared=requests is None and number == 0)
            if not again:
                break
            requests = None  # later rounds look at every drive with fresh figures
        if outcome.waits_for is not None:
            self._said.say((vm.vmid, "", "resume"), logging.WARNING,
                           "VM %d stays paused: thin drive %s is past its threshold again"
                           " after %d rounds of extensions (written faster than it is"
                           " grown); the next pass gives it more", vm.vmid,
                           outcome.waits_for, policy.MAX_ROUNDS,
                           extra=fields(VMID=vm.vmid, BLOCK_NODE=outcome.waits_for,
                                        RESUME_BLOCKED=BlockedBecause.NEEDS_MORE.value))
        return outcome

    async def _round(self, vm: LocalVm, requests: dict[str, Reason] | None,
                     outcome: VmOutcome, *, shared: bool = False) -> bool:
        """Observe, decide, act once. True when another round is needed."""
        timings = RoundTimings()
        async with self.monitor(vm) as monitor:
            look = await self.look(vm, monitor)
        # A block job's id names its queue entry (reason job).
        outcome.known_nodes |= look.names | {job.id for job in look.run.jobs}
        run = look.run
        job_writing = any(policy.writes_drives(job) for job in run.jobs)
        renaming = await self.migrations.before_round(
            vm, run, look.found, in_flight=look.in_flight, job_writing=job_writing)
        fresh = requests is None
        drives = await self.figures.drives(look.found, fresh=fresh, shared=shared)
        job_room = await room_for_chain_copies(vm, look.copies, look.job_room,
                                               map_timeout=self.settings.qemu_img_timeout,
                                               said=self._said)
        if renaming and job_writing:
            say_unprepared_deletes(self.settings, vm, drives, job_room, self._said)
        thin_nodes = thin_block_nodes(drives)
        if requests:
            _note_requests_for_no_thin_drive(vm, requests, thin_nodes, outcome)
        if not run.paused_for_room:
            self._said.over((vm.vmid, "", "resume"))
        self.note_pause(vm.vmid, run)
        # Figures just read from LVM are compared with this node's table
        # (an lseek each); a drive whose table differs gets nothing else
        # until it is settled under the lock: never a threshold past the
        # device's end, never an extension over a lost one.
        stale = {d.view.file_node for d in drives
                 if fresh and d.view.file_node not in outcome.errors
                 and self.tables.differs(vm, d, outcome)}
        planned: list[tuple[Drive, Decision, DriveState]] = []
        #: Drives this round may not grow, whatever their decision.
        may_not_grow: set[str] = set()
        for drive in drives:
            outcome.drives.add(drive.view.file_node)
            self.bindings.note_foreign_disk(vm, drive)
            if drive.view.file_node in stale or drive.view.file_node in outcome.errors:
                continue
            reason = policy.reason_for(drive.identity.block_nodes, requests, thin_nodes)
            if reason is None:
                continue
            paused = drive.paused_for_room(run)
            if renaming and not grows_while_renaming(paused_nospace=paused,
                                                     job_writing=job_writing):
                may_not_grow.add(drive.view.file_node)
                continue
            state = drive.state(paused_nospace=paused and self.answers.is_new(vm, drive),
                                reason=reason,
                                job_room=job_room.get(drive.view.format_node, 0))
            planned.append((drive, policy.decide(state), state))
            self.activity.seen(vm.vmid, drive.view.file_node, drive.lv, drive.vg,
                               policy.classify(state), paused_nospace=paused,
                               maximum=drive.maximum)
        await self._arm(vm, drives, [(d, decision) for d, decision, _ in planned])
        timings.observe_ms = ms_since(timings.started)
        refreshed = False
        for drive in drives:
            if drive.view.file_node in stale:
                refreshed |= await self.tables.catch_up(vm, drive, outcome)
        extended = await self._grow(vm, planned, run, timings, outcome,
                                    job_writing=job_writing, may_not_grow=may_not_grow)
        if extended:
            outcome.extensions += 1
        # Re-arm and resume on a fresh observation: sizes changed, and a fast
        # writer may already be past the new threshold.
        if extended or refreshed or run.paused_for_room or run.jobs_paused_for_room:
            return await self._rearm(vm, outcome, extended=extended,
                                     may_not_grow=may_not_grow)
        return False

    async def _arm(self, vm: LocalVm, drives: list[Drive],
                   decided: list[tuple[Drive, Decision]]) -> None:
        """The cheap actions first, in a session of their own, and only when
        there is one to carry out (an idle pass costs one QMP session): the
        thresholds ``decided`` sets or clears, and the werror check when due."""
        quick = [(drive, decision) for drive, decision in decided
                 if changes_threshold(decision)]
        if quick or self.werror.due(vm):
            async with self.monitor(vm) as monitor:
                await self.werror.check_once(monitor, vm, drives)
                for drive, decision in quick:
                    await arm_or_disarm(monitor, vm, drive, decision)

    async def _grow(self, vm: LocalVm, planned: list[tuple[Drive, Decision, DriveState]],
                    run: RunState, timings: RoundTimings, outcome: VmOutcome, *,
                    job_writing: bool, may_not_grow: set[str]) -> bool:
        """The round's extensions, one drive after another; True when one grew.
        A failure is its drive's (``outcome.errors``), not the round's; a drive
        held back by the VG's reserve is added to ``may_not_grow``."""
        extended = False
        for drive, decision, state in planned:
            if not isinstance(decision, policy.Extend | policy.ExtendPastMaximum):
                continue
            try:
                grown = await self.growth.extend(
                    vm, drive, decision, state, timings, job_writing=job_writing,
                    vm_paused_for_room=run.paused_for_room)
            except PvestordError as err:
                outcome.errors[drive.view.file_node] = err
                self.activity.failure()
                continue
            extended |= grown is Grown.GREW
            if grown is Grown.HELD_BACK:
                may_not_grow.add(drive.view.file_node)
            if state.paused_nospace:
                known = self.figures.size(drive.vg, drive.lv)
                self.answers.answered(vm, drive, decision.target if known is None else known)
        return extended

    async def _rearm(self, vm: LocalVm, outcome: VmOutcome, *, extended: bool,
                     may_not_grow: set[str]) -> bool:
        """Re-arm every drive and resume ``vm`` if it may run, from a fresh look.

        One QMP session when the figures are all remembered (our extension
        has just set them); when one is not (a resize changed the image's
        geometry meanwhile), it is read outside the session, and a new one
        looks again.
        """
        filled: list[Drive] | None = None
        while True:
            async with self.monitor(vm) as monitor:
                look = await self.look(vm, monitor, migration_check=False)
                drives = self.figures.remembered(look.found)
                if drives is None and filled is not None:
                    drives = filled  # the image changed again: what was just read
                if drives is not None:
                    return await rearm_and_resume(monitor, vm, drives, look.run, outcome,
                                                  extended=extended, said=self._said,
                                                  jobs=self.jobs, may_not_grow=may_not_grow)
            filled = await self.figures.drives(look.found)


@dataclass(frozen=True)
class Look:
    """What one QMP session saw of a VM, before any LVM read."""

    run: RunState
    #: ``query-migrate`` shows a migration away in flight (not asked for a
    #: VM in one of :data:`MIGRATION_STATES`, nor by a re-arm).
    in_flight: bool
    found: list[DriveCandidate]
    #: Every node-name the VM has: an entry naming none of them is stale.
    names: set[str]
    #: What running active commits can still write, by target node-name
    #: (:func:`pvestord.policy.room_for_jobs`).
    job_room: Mapping[str, int] = field(default_factory=dict)
    #: Streams and commits of a backing layer, each with the image whose
    #: map shows what it still copies (:mod:`pvestord.engine.jobroom`).
    copies: tuple[tuple[policy.ChainCopy, str], ...] = ()


def _note_requests_for_no_thin_drive(vm: LocalVm, requests: dict[str, Reason],
                                     thin_nodes: set[str], outcome: VmOutcome) -> None:
    """An entry naming a node of the VM that is no thin drive's does nothing
    (only ``nospace``, which names a device's root node, and ``job``, which
    names a block job, mean every thin drive); say so. One naming no node at
    all is the daemon's to drop."""
    for name, reason in requests.items():
        if (name not in thin_nodes and not reason.reaches_every_drive
                and name in outcome.known_nodes):
            log.warning("VM %d: entry %s (%s) names no thin drive: nothing done", vm.vmid,
                        name, reason.value,
                        extra=fields(VMID=vm.vmid, BLOCK_NODE=name, REASON=reason.value))


async def drive_reports(extender: Extender, vm: LocalVm) -> list[DriveRow]:
    """``pvestord drives``: every thin-drive candidate of ``vm``, its LV read
    afresh from LVM."""
    async with extender.monitor(vm) as monitor:
        found = extender.found((await monitor.block_nodes()).drives)
        run = await monitor.run_state()
        werror = await werror_risks(monitor, found)
    # LVM and qemu-img after the session: the VM's QMP socket serves one client.
    drives = await extender.figures.drives(found, fresh=True)
    reports = []
    for drive in drives:
        info = await lvm.lv_info(drive.vg, drive.lv, timeout=extender.settings.lvm_timeout)
        table = lvm.device_size(drive.vg, drive.lv)
        verdict = policy.table_state(info.size, table)
        paused = drive.paused_for_room(run, lv_size=info.size)
        state = drive.state(lv_size=info.size, paused_nospace=paused)
        reports.append(DriveRow(
            vm.vmid, drive.view.file_node, drive.view.format_node, drive.view.path,
            drive.storage.storeid if drive.storage else None, info.size,
            table, drive.view.allocation, drive.view.threshold,
            drive.maximum, drive.view.virtual_size,
            policy.classify(state, extending=extender.activity.is_extending(
                vm.vmid, drive.view.file_node), failed=verdict is TableState.AHEAD)
            if drive.storage else ExtensionState.IDLE,
            table_problem(verdict, info.size, table) or werror_problem(
                werror.get(drive.view.file_node)) if drive.storage else None))
    return reports
