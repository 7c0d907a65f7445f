"""Live migration of a VM with thin drives: the rules of docs/design.md, "Live migration".

During a live migration the VM's LVs are active on two nodes, and an LV grown
on one is seen by the other only after ``lvchange --refresh`` there. A
destination QEMU reads past a stale device end as zeros, with no error, and
it takes the device's size when its block nodes are activated at the
switchover: a refresh after that comes too late. So:

* **defer on the source**: while the VM migrates, its source node does not
  extend its drives (a pass sees the migration in ``query-migrate`` or a
  mirror into the target's NBD export (:func:`mirroring_to_nbd`), or the
  mark left by ``pvestord migration begin --role outgoing``
  (:mod:`pvestord.features.migrationhint`), and leaves the VM alone;
  a guest that fills its LV meanwhile pauses on ENOSPC, and the destination
  extends and resumes it). The mark defers only while QEMU reports the
  migration in flight, or for :data:`MARK_GRACE` after it was written or the
  migration was last seen in flight (:func:`deferral`): a mark left behind by
  a hook that never called ``end`` is removed, with a warning, instead of
  keeping a paused VM paused;
* **pre-extend before**: ``begin --role outgoing`` gives every thin drive of
  the VM one more chunk first, so that a guest writing during the migration
  rarely needs the deferred extension;
* **refresh on the destination**: ``begin --role incoming`` refreshes every
  thin LV of the VM whose device-mapper table is smaller than the metadata,
  under the storage lock (so an extension in flight on another node finishes
  first); the daemon does the same for an incoming VM it finds in state
  ``inmigrate``, under the lock on every look (:func:`catch_up_incoming`);
* **arm on the destination** once the VM runs there: the daemon's reconcile.

The mark is a file beside the VM's pidfile, ``<run_dir>/<vmid>.migrating``
(node-local, like the QEMU it describes), and holds its role and the time.
What this means for a pass over a VM, its looks and its extensions, is
:class:`MigrationWatch`'s to say. Order for a hook (the proposed
``live-migration`` storage hint): ``begin
outgoing`` on the source, then ``begin incoming`` on the destination, then
the migration, then ``end`` on both. Without the hint the daemons still
defer and refresh, but the destination's refresh races the switchover.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from enum import Enum
from pathlib import Path

from pvestord.adapters import lvm
from pvestord.adapters.budgets import LVM_DAEMON, STORAGE_LOCK_WAIT
from pvestord.adapters.command import KILL_WAIT
from pvestord.adapters.lockheld import LockTimeout
from pvestord.adapters.qmp import (
    MIGRATION_STATES,
    BlockNodes,
    RunState,
    VmBusyError,
    VmMonitor,
    migration_status_from,
)
from pvestord.adapters.service import fields
from pvestord.adapters.settings import DaemonSettings
from pvestord.adapters.vmconfig import migration_task_running, read_config_lock
from pvestord.adapters.vms import LocalVm
from pvestord.engine.drive import DriveCandidate
from pvestord.engine.lvfigures import LvFigures
from pvestord.engine.lvmchanges import LvmChanges, VgGates
from pvestord.engine.memory import OncePerChange, forget_vm
from pvestord.engine.status import Activity
from pvestord.errors import PassDeferred
from pvestord.policy.blockjobs import WRITING, BlockJob, JobEdges
from pvestord.policy.sizes import format_size
from pvestord.policy.vmconfig import (
    MIGRATE_LOCK_GRACE,
    MIGRATING_STATUSES,
    RENAMING_LOCK_GRACE,
    RENAMING_LOCKS,
    ConfigLockRule,
    config_lock_rule,
    grows_while_renaming,
    source_migrating,
)

log = logging.getLogger(__name__)

#: ``query-migrate`` statuses of a migration in flight (``completed`` leaves
#: the source in run state ``postmigrate``, already one of MIGRATION_STATES).
MIGRATING = MIGRATING_STATUSES
#: How long an outgoing mark defers extensions while QEMU shows no migration
#: in flight, counted from when the mark was written or the migration was
#: last seen in flight (which refreshes the mark). The hook calls ``begin``
#: before qemu-server starts the migration: it first starts the destination's
#: QEMU over ssh, which takes seconds to tens of seconds; and ``end`` comes
#: only after qemu-server has seen the migration finish. Past this, a mark
#: with no migration is left over (a failed or aborted migration whose hook
#: never said ``end``, a crashed hook): it is removed and defers nothing, so
#: a guest that filled its LV is extended and resumed here.
MARK_GRACE = 60.0


class ExtensionsDeferred(PassDeferred):
    """The VM is migrating away: its drives are not grown here for now."""

    def __init__(self, vmid: int, *, paused: bool) -> None:
        self.vmid = vmid
        #: The VM is paused for room meanwhile: only the destination, or the
        #: end of the deferral, will resume it.
        self.paused = paused
        super().__init__(f"VM {vmid} is migrating away: extensions deferred")


class Deferral(Enum):
    """What the outgoing mark and QEMU together say about a VM's extensions here."""

    #: No mark and no migration in flight: extend as usual.
    NONE = "not migrating"
    #: QEMU shows the migration in flight (mark or not): defer.
    IN_FLIGHT = "migration in flight"
    #: A mark within :data:`MARK_GRACE` and nothing in flight yet (or any
    #: more): the migration is about to start, or just ended; defer.
    MARKED = "marked for a migration"
    #: A mark past its grace with no migration in flight: left over; remove it
    #: and extend as usual.
    STALE = "left-over migration mark"

    @property
    def defers(self) -> bool:
        return self in (Deferral.IN_FLIGHT, Deferral.MARKED)


def deferral(*, in_flight: bool, mark_age: float | None,
             grace: float = MARK_GRACE) -> Deferral:
    """The pure decision: ``mark_age`` is seconds since the mark was written or
    last refreshed (None: no mark). A mark from the future (the clock was
    stepped back) counts by its distance from now, so it cannot defer for
    longer than a step of the clock plus the grace."""
    if in_flight:
        return Deferral.IN_FLIGHT
    if mark_age is None:
        return Deferral.NONE
    return Deferral.MARKED if abs(mark_age) < grace else Deferral.STALE


def mark_path(run_dir: Path, vmid: int) -> Path:
    return run_dir / f"{vmid}.migrating"


def _mark_age(run_dir: Path, vmid: int, now: float | None) -> float | None:
    try:
        st = mark_path(run_dir, vmid).stat()
    except FileNotFoundError:
        return None
    return (time.time() if now is None else now) - st.st_mtime


def outgoing_marked(run_dir: Path, vmid: int, now: float | None = None) -> bool:
    """Whether ``begin --role outgoing`` was called for ``vmid`` within the
    grace (the mark alone: for a check that cannot ask QEMU)."""
    return deferral(in_flight=False, mark_age=_mark_age(run_dir, vmid, now)).defers


def outgoing_deferral(run_dir: Path, vmid: int, *, in_flight: bool,
                      now: float | None = None) -> Deferral:
    """:func:`deferral` for ``vmid`` with its mark's age; the I/O around it.

    A migration seen in flight refreshes the mark, so the grace runs from the
    last time it was seen (a migration that fails leaves the VM here, and its
    hook's ``end`` may follow a little later). A stale mark is removed and
    said at warning: the hook that left it needs looking at.
    """
    age = _mark_age(run_dir, vmid, now)
    decided = deferral(in_flight=in_flight, mark_age=age)
    path = mark_path(run_dir, vmid)
    if decided is Deferral.IN_FLIGHT and age is not None:
        with contextlib.suppress(FileNotFoundError):
            os.utime(path)
    elif decided is Deferral.STALE:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        assert age is not None
        log.warning("VM %d: migration mark %s is %d s old and no migration is in flight: "
                    "removed, extensions no longer deferred (did the migration hook's "
                    "'end' not run?)", vmid, path, age,
                    extra=fields(VMID=vmid, DURATION_MS=round(age * 1000)))
    return decided


class QuietRenamingLocks:
    """Since when the daemon has seen each VM's renaming lock with no block
    job in its QEMU: the ``quiet`` figure of
    :func:`pvestord.policy.vmconfig.renaming_lock_left_over`.

    A job seen, another lock or none starts the count again; so does the
    daemon's start (it only waits longer). On the monotonic clock: a step of
    the wall clock must not age a lock.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._quiet_since: dict[tuple[int, str], float] = {}

    def observe(self, vmid: int, lock: str | None, *, job_running: bool) -> float:
        """What a pass saw in ``vmid``'s config and QEMU; the seconds the lock
        has been seen quiet so far."""
        for key in [k for k in self._quiet_since
                    if k[0] == vmid and (k[1] != lock or job_running)]:
            del self._quiet_since[key]
        if lock is None or lock not in RENAMING_LOCKS or job_running:
            return 0.0
        now = self._clock()
        return now - self._quiet_since.setdefault((vmid, lock), now)

    def quiet_for(self, vmid: int, lock: str | None) -> float:
        """The count as the last :meth:`observe` left it, without a new look
        (under the storage lock, where QMP has no place)."""
        since = None if lock is None else self._quiet_since.get((vmid, lock))
        return 0.0 if since is None else self._clock() - since

    def forget(self, vmid: int) -> None:
        forget_vm(self._quiet_since, vmid)


def config_lock(settings: DaemonSettings, vmid: int, *, in_flight: bool,
                quiet: QuietRenamingLocks | None = None,
                now: float | None = None) -> ConfigLockRule:
    """What ``vmid``'s qemu-server config lock on this node says
    (:func:`pvestord.policy.vmconfig.config_lock_rule`).

    ``lock: migrate`` is written by qemu-server before it starts the target
    and activates the LVs there: from then on an LV grown here could be short
    on the target, so it defers like the hint's mark, with no hint at all. A
    left-over one is said at warning (``qm unlock`` clears it) and defers
    nothing (the engine says so at warning), so that a guest paused for room
    is not kept waiting for an admin. It is never left over while the source
    shows a migration under way: ``in_flight`` (what QEMU showed the caller),
    or qemu-server's ``qmigrate`` task for the VM still running on this node
    (:func:`pvestord.adapters.vmconfig.migration_task_running`). A renaming
    lock is judged left over from ``quiet``'s count as the pass left it
    (none: never).
    """
    found = read_config_lock(settings.reports_dir, settings.node, vmid, now)
    if found is None:
        return ConfigLockRule.NONE
    seen_quiet = 0.0 if quiet is None else quiet.quiet_for(vmid, found.lock)
    # qemu-server's task is asked only when nothing else kept the lock
    # fresh: files alone, so under the storage lock too.
    if found.lock == "migrate" and not in_flight and abs(found.age) >= MIGRATE_LOCK_GRACE:
        in_flight = source_migrating(
            migration_status=None,
            task_running=migration_task_running(settings.node, vmid))
    return config_lock_rule(found.lock, age=found.age, in_flight=in_flight, quiet=seen_quiet)


async def migration_under_way(monitor: VmMonitor, run: RunState | None = None) -> bool:
    """Whether ``query-migrate`` shows the VM behind ``monitor`` migrating
    away, or gone (``run``: its run state, if already read).

    ``completed`` alone is not enough: a destination reports its incoming
    migration as ``completed`` too. The source is the one left in run state
    ``postmigrate``. Seen in the two-node tier: a pass read the run state
    while the migration was active and ``query-migrate`` just after it
    completed, and grew the LV of a VM that already ran on the other node.
    """
    status = migration_status_from(await monitor.execute("query-migrate"))
    if source_migrating(migration_status=status):
        return True
    if status == "completed":
        return (run or await monitor.run_state()).status in MIGRATION_STATES
    return False


def mirroring_to_nbd(jobs: tuple[BlockJob, ...], nodes: BlockNodes,
                     graph: Mapping[str, JobEdges]) -> bool:
    """Whether a mirror into an NBD export runs in the VM (what one look
    read: its jobs, nodes and job graph): a live migration's local disks
    copied into the target QEMU, which has the shared LVs open already
    (:func:`pvestord.policy.vmconfig.mirrors_to_nbd`)."""
    return source_migrating(migration_status=None, jobs=jobs, nbd_nodes=nodes.nbd,
                            targets={job: edges.target for job, edges in graph.items()})


async def migrating_away(monitor: VmMonitor) -> bool:
    """Whether the VM behind ``monitor`` is migrating away, or has gone: the
    ``query-migrate`` of :func:`migration_under_way`, or a mirror into an NBD
    export (:func:`mirroring_to_nbd`). The nodes and the job graph are read
    only while a mirror may write: a VM without one costs two commands."""
    if await migration_under_way(monitor):
        return True
    jobs = await monitor.block_jobs()
    if not any(job.type == "mirror" and job.status in WRITING for job in jobs):
        return False
    return mirroring_to_nbd(jobs, await monitor.block_nodes(), await monitor.job_graph())


def extensions_defer(settings: DaemonSettings, vmid: int, *, in_flight: bool,
                     said: OncePerChange) -> bool:
    """Whether ``vmid``'s LVs must not grow here now: QEMU's word ``in_flight``
    (:func:`migrating_away`), the outgoing mark (:func:`outgoing_deferral`) and
    qemu-server's ``lock: migrate`` (:func:`config_lock`) together. A left-over
    lock defers nothing and is said at warning, once per change."""
    marked = outgoing_deferral(settings.run_dir, vmid, in_flight=in_flight).defers
    locked = config_lock(settings, vmid, in_flight=in_flight)
    if locked is ConfigLockRule.STALE_MIGRATE:
        said.say((vmid, "", "config-lock"), logging.WARNING,
                 "VM %d: its config has had 'lock: migrate' for over %d s and no "
                 "migration is in flight: taken as left over, extensions not "
                 "deferred ('qm unlock %d' clears it)", vmid, MIGRATE_LOCK_GRACE,
                 vmid, extra=fields(VMID=vmid))
    else:
        said.over((vmid, "", "config-lock"))
    return marked or locked is ConfigLockRule.MIGRATING


def renaming(settings: DaemonSettings, vmid: int, *, paused_for_room: bool,
             job_writing: bool, job_running: bool, quiet: QuietRenamingLocks,
             said: OncePerChange) -> bool:
    """Whether qemu-server is renaming ``vmid``'s LVs under its running QEMU
    (snapshot, its deletion, rollback: its config's lock says so).

    pvestord then stands back from the VM's LVs, except for a guest paused on
    ENOSPC and for a VM in which a block job writes (``job_writing``): see
    :func:`pvestord.policy.vmconfig.grows_while_renaming`. Raises
    :class:`VmBusyError` for a VM that has neither; the pass comes back once
    the lock is gone. A lock seen with no block job (``job_running``: any, in
    ``query-block-jobs``) for :data:`RENAMING_LOCK_GRACE` is left over from a
    failed task: it holds nothing back, and is said at warning once, with the
    command that clears it, so that a guest does not pause at every chunk's
    end until an admin looks.
    """
    found = read_config_lock(settings.reports_dir, settings.node, vmid)
    lock = None if found is None else found.lock
    seen_quiet = quiet.observe(vmid, lock, job_running=job_running)
    rule = ConfigLockRule.NONE if found is None else config_lock_rule(
        lock, age=found.age, in_flight=False, job_running=job_running, quiet=seen_quiet)
    key = (vmid, "", "renaming-lock")
    if rule is ConfigLockRule.STALE_RENAMING:
        said.say(key, logging.WARNING,
                 "VM %d: its config has had 'lock: %s' for over %d s with no block job in"
                 " its QEMU: taken as left over from a failed task, its drives are extended"
                 " as usual ('qm unlock %d' clears it)", vmid, lock, RENAMING_LOCK_GRACE,
                 vmid, extra=fields(VMID=vmid))
        return False
    said.over(key)
    if rule is not ConfigLockRule.RENAMING:
        return False
    if not (paused_for_room or job_writing):
        raise VmBusyError(f"VM {vmid}: its config is locked for a snapshot "
                          "operation that renames its LVs: later")
    return True



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


class MigrationWatch:
    """What a live migration, or a rename of the VM's LVs, means for a pass
    over a VM here: the one place the pass and its extensions ask.

    The pass asks :meth:`before_round` after each look (a destination
    catches up, a migrating VM is left alone, a renaming lock holds growth
    back); an extension asks :meth:`away_now` just before the storage lock,
    in a QMP session of its own, and :meth:`bars_growth` under it, from files
    alone.
    """

    def __init__(self, settings: DaemonSettings, *, said: OncePerChange, gates: VgGates,
                 figures: LvFigures, activity: Activity, changes: LvmChanges,
                 quiet_locks: QuietRenamingLocks | None = None) -> None:
        self.settings = settings
        self._said = said
        self._gates = gates
        self._figures = figures
        self._activity = activity
        self._changes = changes
        #: How long each VM's renaming lock has been seen with no block job
        #: (given: a test's own clock).
        self.quiet_locks = QuietRenamingLocks() if quiet_locks is None else quiet_locks

    async def before_round(self, vm: LocalVm, run: RunState,
                           drives: Sequence[DriveCandidate], *, in_flight: bool,
                           job_writing: bool) -> bool:
        """What one look (``run``, ``drives``, ``in_flight``) means before
        anything is decided: True while qemu-server renames the VM's LVs and
        only some of its drives may grow (:func:`renaming`).

        Raises :class:`VmBusyError` for a VM in one of
        :data:`MIGRATION_STATES`, after an incoming one has caught up
        (:func:`catch_up_incoming`), and :class:`ExtensionsDeferred` for one
        migrating away (:func:`extensions_defer`).
        """
        if run.status == "inmigrate":
            # The destination of a live migration: its QEMU takes the
            # devices' sizes at the switchover, so catch up now with
            # whatever the source grew (docs/design.md, "Live migration").
            await catch_up_incoming(vm, drives, gates=self._gates, figures=self._figures,
                                    activity=self._activity, changes=self._changes,
                                    lvm_timeout=self.settings.lvm_timeout)
        if run.status in MIGRATION_STATES:
            raise VmBusyError(f"VM {vm.vmid} is in state {run.status}: later")
        if extensions_defer(self.settings, vm.vmid, in_flight=in_flight, said=self._said):
            raise ExtensionsDeferred(vm.vmid, paused=run.paused_for_room)
        return renaming(self.settings, vm.vmid, paused_for_room=run.paused_for_room,
                        job_writing=job_writing, job_running=bool(run.jobs),
                        quiet=self.quiet_locks, said=self._said)

    async def away_now(self, vm: LocalVm) -> bool:
        """Whether ``vm`` is the source of a live migration now, or is about to
        be: its LVs must not grow here (the destination could miss the new
        size; :func:`extensions_defer`). Asked again just before the storage
        lock, in a session of its own."""
        async with VmMonitor(vm.qmp_socket, f"VM {vm.vmid}",
                             timeout=self.settings.qmp_timeout) as monitor:
            in_flight = await migrating_away(monitor)
        return extensions_defer(self.settings, vm.vmid, in_flight=in_flight, said=self._said)

    def bars_growth(self, vmid: int, *, paused_nospace: bool, job_writing: bool) -> bool:
        """Under the storage lock, from files alone: whether ``vmid`` has been
        marked for a migration since the pass looked, qemu-server's config
        says it migrates, or a rename holds its drive back
        (:func:`pvestord.policy.vmconfig.grows_while_renaming`).

        A migration's begin marks the VM and then takes this lock, and
        qemu-server writes ``lock: migrate`` before the target activates the
        LVs (itself under no lock, but the target's catch-up takes this one):
        both are barriers. A rename stops all but a paused guest and a VM whose
        block job writes; Proxmox renames under this very lock. A renaming
        lock the pass judged left over is judged again on the config as it is
        now. ``in_flight=False`` here does not age out a lock: what QEMU shows
        (``query-migrate``, a mirror into the target's NBD export) was asked
        just before the lock (:meth:`away_now`) and deferred already.
        """
        lock_rule = config_lock(self.settings, vmid, in_flight=False, quiet=self.quiet_locks)
        return (outgoing_marked(self.settings.run_dir, vmid)
                or lock_rule is ConfigLockRule.MIGRATING
                or (lock_rule is ConfigLockRule.RENAMING and not grows_while_renaming(
                    paused_nospace=paused_nospace, job_writing=job_writing)))

    def forget(self, vmid: int) -> None:
        self.quiet_locks.forget(vmid)
