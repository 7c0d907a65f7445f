"""``pvestord run``: the node's extension daemon.

Five loops on one event loop, no threads:

- the queue loop wakes on inotify (a local write renames a new queue file into
  the directory) or every ``poll_interval`` (other nodes' writes, which FUSE
  does not report), takes the entries of VMs running here and starts one
  pass per VM (:class:`pvestord.engine.extender.Extender`);
- the reconcile loop runs a pass over every local VM at start, for every VM
  that appears, and every ``reconcile_interval``: events are the fast path,
  correctness never depends on them;
- the report loop publishes this node's view of its thin storages every
  ``report_interval`` (:mod:`pvestord.engine.nodereport`, for ``rank-nodes``);
- the status loop publishes what the daemon is doing now, for ``pvestord
  status`` and node_exporter, and reads the VGs' capacity accounts
  (:mod:`pvestord.engine.publisher`);
- the watchdog loop pings systemd while the engine makes progress
  (:func:`pvestord.engine.passes.engine_wedged`).

Every pass has a deadline (``pass_deadline``): a pass past it is abandoned,
and one whose cancellation does not take wedges the engine: the watchdog
stops being fed, and systemd restarts the daemon (:mod:`~pvestord.engine.passes`).

A VM that is busy (a migration's source or destination) is retried with a
short backoff of its own, not at once (:mod:`~pvestord.engine.failures`).

An entry leaves the queue only when its pass succeeded, or when it is known
to be moot (the VM stopped, the node-name does not exist;
:func:`pvestord.policy.entry_fate`). A crash at any
point leaves it queued, and the next daemon's pass is idempotent. Failures
(a full VG, LVM or QMP errors) keep the entry and retry it with a backoff
per VM, and are logged once per change of state, not once per retry.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import Callable, Sequence

from pvestord.adapters import custody, service
from pvestord.adapters.locks import queue_lock
from pvestord.adapters.notify import Notifier
from pvestord.adapters.queue import Entry, ExtendQueue
from pvestord.adapters.service import fields
from pvestord.adapters.settings import DaemonSettings
from pvestord.adapters.vghealth import VgMarks
from pvestord.adapters.vmconfig import config_node
from pvestord.adapters.vms import LocalVm, local_vm, local_vms
from pvestord.adapters.watch import FolderWatch
from pvestord.engine import metrics, publisher, status
from pvestord.engine.configsource import StorageConfigSource
from pvestord.engine.extender import Extender
from pvestord.engine.failures import Failures
from pvestord.engine.memory import Notices
from pvestord.engine.nodereport import publish_stopped, report_loop
from pvestord.engine.passes import Passes
from pvestord.engine.suspension import SuspendedLvs
from pvestord.engine.vmpass import run_pass
from pvestord.errors import PvestordError
from pvestord.policy.requests import drops_entry_of_absent_vm

log = logging.getLogger(__name__)

#: How long a stopping daemon lets passes in flight finish (an lvextend is
#: never cut off half-way by our own shutdown unless it overruns this).
SHUTDOWN_GRACE = 45.0


class Daemon:
    def __init__(self, settings: DaemonSettings) -> None:
        self.settings = settings
        self.queue = ExtendQueue(settings.queue,
                                 lock=queue_lock(settings.queue, lock_dir=settings.lock_dir))
        # One sender and one memory of what was announced, for every part.
        self.notices = Notices(settings.node, Notifier())
        self.config = StorageConfigSource(settings.storage_config,
                                          kept_file=settings.kept_sections,
                                          notices=self.notices)
        self.extender = Extender(settings, self.config.get, notices=self.notices)
        self._wake = asyncio.Event()
        self._stop = asyncio.Event()
        self._reconcile_due: set[int] = set()
        self.failures = Failures(reconcile=self._reconcile_due.add, wake=self._wake.set)
        self.passes = Passes(settings, config=self.config.get,
                             changing=self.extender.lvm_changes.of_vm,
                             abandon=self._abandoned, notices=self.notices)
        # LVs a killed change of ours left suspended, hanging their guest's
        # I/O: looked for at start, every reconcile interval, and at once
        # after a kill.
        self.suspended = SuspendedLvs(self.config.get, self.extender.lvm_changes,
                                      self.failures, settings.vg_health_dir,
                                      lvm_timeout=settings.lvm_timeout)
        self.extender.lvm_changes.on_killed = self.suspended.wake.set
        self._loop_progress = time.monotonic()
        self._known_vms: set[int] = set()
        self._queue_depth = 0
        self._watch: FolderWatch | None = None
        # Beside the VG marks: a test daemon with its own folder publishes there,
        # and only the real one feeds node_exporter.
        status_file = settings.vg_health_dir.parent / status.STATUS_FILE.name
        self.publisher = publisher.Publisher(
            settings.node, self.extender.activity, self.config.get,
            kept=lambda: self.config.kept, status_file=status_file,
            metrics_file=metrics.METRICS_FILE if status_file == status.STATUS_FILE else None,
            shells=self.extender.lvm_shells, notices=self.notices)

    # -- lifecycle

    def _status_view(self) -> publisher.DaemonView:
        shells = self.extender.lvm_shells
        return publisher.DaemonView(
            self._queue_depth, self.failures.errors,
            self.failures.busy,
            max(shells.starts - len(shells.pids()), 0) if shells is not None else 0)

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stop.set)
        loop.add_signal_handler(signal.SIGHUP, self._reload)
        self.config.get()
        self._watch = _watch_for_work(self.settings, self._wake.set)
        _say_started(self.settings)
        # Before any pass: an lvm the last daemon left stuck keeps its VG's
        # storage locks held by us, not expiring while it may still write.
        custody.resume(VgMarks(self.settings.vg_health_dir))
        loops = [asyncio.create_task(self._queue_loop(), name="queue"),
                 asyncio.create_task(self._reconcile_loop(), name="reconcile"),
                 asyncio.create_task(report_loop(
                     self.settings, self.config.get, self.extender.lvm_health, self.failures,
                     self._stop, shells=self.extender.lvm_shells), name="report"),
                 asyncio.create_task(self.publisher.loop(self._status_view), name="status"),
                 asyncio.create_task(self.suspended.loop(self.settings.reconcile_interval),
                                     name="suspended")]
        if service.watchdog_interval() is not None:
            loops.append(asyncio.create_task(service.watchdog_loop(self.wedged),
                                             name="watchdog"))
        service.notify("READY=1")
        stop = asyncio.create_task(self._stop.wait())
        done, _ = await asyncio.wait([stop, *loops], return_when=asyncio.FIRST_COMPLETED)
        crashed = [t for t in done if t is not stop]
        service.notify("STOPPING=1")
        log.info("pvestord stopping: letting %d pass(es) in flight finish",
                 len(self.passes.running))
        for task in loops:
            task.cancel()
        await asyncio.gather(*loops, return_exceptions=True)
        stop.cancel()
        await self.passes.finish(SHUTDOWN_GRACE)
        # Custodians last (a pass cut off just now may have made one): each
        # renews its locks and writes down what the next daemon must keep.
        await custody.hand_over()
        if self._watch is not None:
            self._watch.stop()
        await self.extender.close()
        if self.notices.notifier is not None:
            # A notice of the last moments (a mark at shutdown) still goes out;
            # each send is bounded by its own timeout.
            await self.notices.notifier.drain()
        publish_stopped(self.settings)
        for ended in crashed:
            if not ended.cancelled() and ended.exception() is not None:
                log.error("pvestord: loop %s failed: %s", ended.get_name(), ended.exception(),
                          exc_info=ended.exception())
                return 1
        log.info("pvestord stopped")
        return 0

    def _reload(self) -> None:
        """SIGHUP: look at everything now, and read the copy of the
        ``pvestord:`` sections again (``pvestord storage forget`` changed it)."""
        self.config.reload_kept()
        self._wake.set()

    # -- loops

    async def _queue_loop(self) -> None:
        while not self._stop.is_set():
            # asyncio.timeout, not wait_for: Python 3.11's wait_for can swallow
            # a cancellation that arrives as the wake-up completes.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.settings.poll_interval):
                    await self._wake.wait()
            self._wake.clear()
            if self._stop.is_set():
                break
            self.config.get()  # a stat; an admin's change is read (or its error logged) now
            self._notice_new_vms()
            try:
                entries = await self.queue.entries_async()
            except PvestordError as err:
                # Reconciles must not depend on the queue: they are what
                # catches the drives whose entries it cannot give us.
                self.failures.note_error((0, "queue"), f"cannot read the extend queue: {err}; "
                                 "reconciling local VMs without it")
                entries = []
            else:
                self.failures.clear_error((0, "queue"), "extend queue readable again")
            try:
                await self._dispatch(entries)
            except PvestordError as err:
                self.failures.note_error((0, "queue"), f"cannot update the extend queue: {err}")
            service.notify(f"STATUS=queue depth {self._queue_depth}, "
                           f"{len(self._known_vms)} local VM(s), {len(self.passes.running)} busy")
            self._loop_progress = time.monotonic()

    async def _reconcile_loop(self) -> None:
        while not self._stop.is_set():
            # A stuck command the command line left behind (it cannot keep
            # the lock once it has exited): taken over well within a lifetime.
            custody.resume(VgMarks(self.settings.vg_health_dir))
            for vm in local_vms(self.settings.run_dir):
                self._reconcile_due.add(vm.vmid)
            self._wake.set()
            await asyncio.sleep(self.settings.reconcile_interval)

    def _notice_new_vms(self) -> None:
        current = {vm.vmid for vm in local_vms(self.settings.run_dir)}
        for vmid in sorted(current - self._known_vms):
            log.info("VM %d runs here: reconciling its thin drives", vmid,
                     extra=fields(VMID=vmid, VM_STATE="arrived"))
            self._reconcile_due.add(vmid)
        for vmid in self._known_vms - current:
            self.failures.forget(vmid)
            self.extender.forget(vmid)
            self._reconcile_due.discard(vmid)
        self._known_vms = current

    async def _dispatch(self, entries: Sequence[Entry]) -> None:
        """Start a pass for every local VM with entries or a reconcile due;
        drop this node's entries for VMs that do not run here."""
        self._queue_depth = len(entries)
        by_vm: dict[int, list[Entry]] = {}
        for entry in entries:
            by_vm.setdefault(entry.vmid, []).append(entry)
        moot: list[Entry] = []
        for vmid, vm_entries in by_vm.items():
            vm = local_vm(self.settings.run_dir, vmid)
            if vm is None:
                moot += self._absent_vms_entries(vmid, vm_entries)
                continue
            self._start_pass(vm, vm_entries)
        for vmid in sorted(self._reconcile_due - set(by_vm)):
            vm = local_vm(self.settings.run_dir, vmid)
            if vm is not None and self._start_pass(vm, []):
                self._reconcile_due.discard(vmid)
        if moot:
            removed = await self.queue.complete_async(moot)
            for entry in moot:
                log.info("VM %d is not running on this node: entry %d:%s dropped", entry.vmid,
                         entry.vmid, entry.block_node,
                         extra=fields(VMID=entry.vmid, BLOCK_NODE=entry.block_node,
                                      ENTRY="dropped"))
            log.debug("removed %d moot entries", removed)

    def _absent_vms_entries(self, vmid: int, entries: Sequence[Entry]) -> list[Entry]:
        """The entries of a VM not running here that this node removes
        (:func:`pvestord.policy.requests.drops_entry_of_absent_vm`)."""
        node = self.settings.node
        if all(e.origin is not None for e in entries):
            return [e for e in entries if e.origin == node]
        holder = config_node(self.settings.reports_dir, vmid)
        return [e for e in entries if drops_entry_of_absent_vm(e.origin, node, holder)]

    def _start_pass(self, vm: LocalVm, entries: Sequence[Entry]) -> bool:
        if self._stop.is_set() or vm.vmid in self.passes.running:
            return False  # the running pass wakes the loop when it ends
        if self.passes.occupied(vm.vmid):
            return False  # its last pass is still being cancelled
        now = time.monotonic()
        if self.failures.waiting(vm.vmid, now):
            return False
        self.passes.start(vm.vmid, self._pass(vm, list(entries)), now)
        return True

    async def _pass(self, vm: LocalVm, entries: list[Entry]) -> None:
        this = asyncio.current_task()
        try:
            await self._pass_inner(vm, entries)
        except Exception as err:  # the daemon outlives any bug in one pass
            log.exception("VM %d: unexpected error in a pass: %r", vm.vmid, err,
                          extra=fields(VMID=vm.vmid))
            self.failures.backoff(vm.vmid)
        finally:
            self.passes.ended(vm.vmid, this)
            self._wake.set()

    def _abandoned(self, vmid: int) -> None:
        self.failures.backoff(vmid)
        self._wake.set()

    def wedged(self) -> str | None:
        """Why the engine makes no progress (the watchdog is not fed then), or None."""
        return self.passes.wedged(self._loop_progress)

    async def _pass_inner(self, vm: LocalVm, entries: list[Entry]) -> None:
        await run_pass(vm, entries, extender=self.extender, queue=self.queue,
                       failures=self.failures, run_dir=self.settings.run_dir)


def _say_started(settings: DaemonSettings) -> None:
    log.info("pvestord started on node %s: queue %s, VMs in %s, poll %g s, reconcile %g s%s"
             "%s",
             settings.node, settings.queue, settings.run_dir,
             settings.poll_interval, settings.reconcile_interval,
             ", one global worker" if settings.global_worker else "",
             ", LVM commands in a shell per VG" if settings.lvm_shell else "")


def _watch_for_work(settings: DaemonSettings,
                    wake: Callable[[], None]) -> FolderWatch | None:
    """Wake the queue loop on a local queue write and on a VM's pidfile or QMP socket."""
    if not settings.inotify:
        return None
    queue_name = settings.queue.name

    def wanted(name: str) -> bool:
        return name == queue_name or name.endswith((".pid", ".qmp"))

    watch = FolderWatch(wake, wanted)
    watch.start([settings.queue.parent, settings.run_dir], asyncio.get_running_loop())
    return watch


def run(settings: DaemonSettings, *, verbose: bool = False,
        journal: bool | None = None) -> int:
    """Run the daemon until SIGTERM or SIGINT; the process's exit status."""
    service.setup_logging("pvestord", verbose=verbose, journal=journal)
    try:
        return asyncio.run(Daemon(settings).run())
    except PvestordError as err:
        log.error("pvestord: %s", err)
        return 1
