"""``pvestord run``: the node's extension daemon.

Three loops on one event loop, no threads:

- the queue loop wakes on inotify (a local write renames a new queue file into
  the directory) or every ``poll_interval`` (other nodes' writes, which FUSE
  does not report), takes the entries of VMs running here and starts one
  pass per VM (:class:`pvestord.engine.extender.Extender`);
- the reconcile loop runs a pass over every local VM at start, for every VM
  that appears, and every ``reconcile_interval``: events are the fast path,
  correctness never depends on them;
- the report loop publishes this node's view of its thin storages every
  ``report_interval`` (:mod:`pvestord.engine.nodereport`, for ``rank-nodes``);
- the watchdog loop pings systemd while the engine makes progress
  (:func:`engine_wedged`).

Every pass has a deadline (``pass_deadline``). A pass past it is abandoned:
cancelled, logged at error, the VGs of its VM marked unhealthy if it was in
the middle of an LVM change (:mod:`pvestord.adapters.vghealth`), and its VM's slot freed,
so the other VMs, and every other VG, keep being served. A pass whose
cancellation does not take (a command in D state) wedges the engine: the
watchdog stops being fed, and systemd restarts the daemon.

A VM that is busy (a migration's source or destination) is retried with a
short backoff of its own (:data:`BUSY_FIRST` to :data:`BUSY_MAX`), not at once.

An entry leaves the queue only when its pass succeeded, or when it is known
to be moot (the VM stopped, the node-name does not exist). A crash at any
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
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from pvestord.adapters import service
from pvestord.adapters.config import (
    DaemonSettings,
    StorageConfig,
    load_storage_config,
    parse_storage_config,
)
from pvestord.adapters.locks import queue_lock
from pvestord.adapters.qmp import VmBusyError, VmGoneError
from pvestord.adapters.queue import Entry, ExtendQueue
from pvestord.adapters.service import fields
from pvestord.adapters.vghealth import VgHealth
from pvestord.adapters.vms import LocalVm, local_vm, local_vms
from pvestord.adapters.watch import FolderWatch
from pvestord.engine import metrics, nodereport, publisher, status
from pvestord.engine.extender import Extender, VmOutcome
from pvestord.engine.migration import ExtensionsDeferred
from pvestord.errors import ConfigError, PvestordError
from pvestord.policy import Reason

log = logging.getLogger(__name__)

#: Retry delays after a failed pass, per VM: doubling from the first to the last.
BACKOFF_FIRST = 1.0
BACKOFF_MAX = 60.0
#: Retry delays for a busy VM (migrating): doubling from the first to the
#: last, reset once a pass finds it not busy. Short, because the VM may be
#: paused and waiting for the end of the migration; a backoff at all, because
#: a retry at once opened thousands of QMP connections a second to a
#: migrating QEMU (REVIEW 4.1).
BUSY_FIRST = 0.5
BUSY_MAX = 4.0
#: How long a stopping daemon lets passes in flight finish (an lvextend is
#: never cut off half-way by our own shutdown unless it overruns this).
SHUTDOWN_GRACE = 45.0
#: How long a pass cancelled at its deadline may take to end, and how long
#: past ``pass_deadline`` + ``poll_interval`` the queue loop may go without
#: completing an iteration, before the engine counts as wedged and the
#: watchdog stops being fed. A cancelled pass normally ends at once (QMP and
#: lock waits are cancelled, an LVM command is killed); one that does not is
#: waiting for a process that SIGKILL cannot end.
WEDGE_GRACE = 30.0


class StorageConfigSource:
    """The storage configuration, re-read when the file changes.

    A file that becomes invalid keeps the last good configuration in force
    (logged once): an admin's typo must not stop extensions cluster-wide.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._stamp: tuple[int, int] | None = None
        self._config = parse_storage_config("", str(path))
        self._last_problem: str | None = None

    def get(self) -> StorageConfig:
        try:
            st = self.path.stat()
            stamp = (st.st_mtime_ns, st.st_size)
        except OSError as err:
            self._problem(f"cannot read storage configuration {self.path}: {err.strerror};"
                          " no storage is thin until it can be read")
            self._config = parse_storage_config("", str(self.path))
            self._stamp = None
            return self._config
        if stamp != self._stamp:
            try:
                self._config = load_storage_config(self.path)
                self._stamp = stamp
                if self._last_problem is not None:
                    log.info("storage configuration %s is valid again", self.path)
                self._last_problem = None
                for warning in self._config.warnings:
                    log.warning("%s", warning)
                log.info("storage configuration %s: thin storages: %s", self.path,
                         ", ".join(sorted(self._config.thin_storages)) or "none")
            except ConfigError as err:
                self._problem(f"{err}; keeping the previous configuration")
        return self._config

    def _problem(self, message: str) -> None:
        if message != self._last_problem:
            log.error("%s", message)
            self._last_problem = message


@dataclass
class VmRetry:
    attempts: int = 0
    not_before: float = 0.0
    first: float = BACKOFF_FIRST
    maximum: float = BACKOFF_MAX

    def failed(self) -> float:
        delay = min(self.maximum, self.first * 2.0 ** min(self.attempts, 64))
        self.attempts += 1
        self.not_before = time.monotonic() + delay
        return delay


def engine_wedged(now: float, *, abandoned: Iterable[tuple[int, float]],
                  running: Iterable[tuple[int, float]], loop_progress: float,
                  pass_deadline: float, poll_interval: float,
                  grace: float = WEDGE_GRACE) -> str | None:
    """Why the engine no longer makes progress, or None while it does.

    Wedged means one of: a pass cancelled at its deadline (``abandoned``:
    VMID, when cancelled) has not ended ``grace`` seconds later; a pass
    (``running``: VMID, when started) has run past its deadline plus
    ``grace`` without being abandoned; the queue loop, which starts every
    pass, has not completed an iteration for ``poll_interval`` +
    ``pass_deadline`` + ``grace`` seconds. An idle daemon is not wedged: its
    queue loop completes an iteration every ``poll_interval``.
    """
    for vmid, cancelled in abandoned:
        if now - cancelled > grace:
            return (f"the pass over VM {vmid} was cancelled at its deadline "
                    f"{now - cancelled:.0f} s ago and has not ended")
    for vmid, started in running:
        if now - started > pass_deadline + grace:
            return f"the pass over VM {vmid} has run for {now - started:.0f} s"
    if now - loop_progress > poll_interval + pass_deadline + grace:
        return f"the queue loop has not completed an iteration for {now - loop_progress:.0f} s"
    return None


class Daemon:
    def __init__(self, settings: DaemonSettings) -> None:
        self.settings = settings
        self.queue = ExtendQueue(settings.queue,
                                 lock=queue_lock(settings.queue, lock_dir=settings.lock_dir))
        self.config = StorageConfigSource(settings.storage_config)
        self.extender = Extender(settings, self.config.get)
        self._wake = asyncio.Event()
        self._stop = asyncio.Event()
        self._passes: dict[int, asyncio.Task[None]] = {}
        #: When each pass in ``_passes`` started, and its deadline's timer.
        self._pass_started: dict[int, float] = {}
        self._deadlines: dict[int, asyncio.TimerHandle] = {}
        #: Passes cancelled at their deadline that have not ended yet: (VMID, when).
        self._abandoned: dict[asyncio.Task[None], tuple[int, float]] = {}
        self._loop_progress = time.monotonic()
        self.vg_health = VgHealth(settings.vg_health_dir)
        self._retry: dict[int, VmRetry] = {}
        self._busy: dict[int, VmRetry] = {}
        #: Busy VMs said at warning (paused while deferred), once per deferral.
        self._warned_paused: set[int] = set()
        self._errors: dict[tuple[int, str], str] = {}
        self._known_vms: set[int] = set()
        self._reconcile_due: set[int] = set()
        self._queue_depth = 0
        self._watch: FolderWatch | None = None
        # Beside the VG marks: a test daemon with its own folder publishes there,
        # and only the real one feeds node_exporter.
        status_file = settings.vg_health_dir.parent / status.STATUS_FILE.name
        self.publisher = publisher.Publisher(
            settings.node, self.extender.activity, self.config.get, status_file=status_file,
            metrics_file=metrics.METRICS_FILE if status_file == status.STATUS_FILE else None)

    # -- lifecycle

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stop.set)
        loop.add_signal_handler(signal.SIGHUP, self._wake.set)
        self.config.get()
        self._start_inotify()
        log.info("pvestord started on node %s: queue %s, VMs in %s, poll %g s, reconcile %g s%s"
                 "%s",
                 self.settings.node, self.settings.queue, self.settings.run_dir,
                 self.settings.poll_interval, self.settings.reconcile_interval,
                 ", one global worker" if self.settings.global_worker else "",
                 ", LVM commands in a shell per VG" if self.settings.lvm_shell else "")
        loops = [asyncio.create_task(self._queue_loop(), name="queue"),
                 asyncio.create_task(self._reconcile_loop(), name="reconcile"),
                 asyncio.create_task(self._report_loop(), name="report"),
                 asyncio.create_task(self.publisher.loop(self._status_view), name="status")]
        if service.watchdog_interval() is not None:
            loops.append(asyncio.create_task(service.watchdog_loop(self.wedged),
                                             name="watchdog"))
        service.notify("READY=1")
        stop = asyncio.create_task(self._wait_stop())
        done, _ = await asyncio.wait([stop, *loops], return_when=asyncio.FIRST_COMPLETED)
        crashed = [t for t in done if t is not stop]
        service.notify("STOPPING=1")
        log.info("pvestord stopping: letting %d pass(es) in flight finish", len(self._passes))
        for task in loops:
            task.cancel()
        await asyncio.gather(*loops, return_exceptions=True)
        stop.cancel()
        in_flight = [*self._passes.values(), *self._abandoned]
        if in_flight:
            _, late = await asyncio.wait(in_flight, timeout=SHUTDOWN_GRACE)
            for task in late:
                task.cancel()
            if late:
                # A pass whose cancellation does not take (a command in D
                # state) must not hold the stop forever.
                _, stuck = await asyncio.wait(late, timeout=WEDGE_GRACE)
                for task in stuck:
                    log.error("pvestord stopping: a pass does not end (%s)", task.get_name())
        if self._watch is not None:
            self._watch.stop()
        await self.extender.close()
        self._publish_stopped()
        for task in crashed:
            if not task.cancelled() and task.exception() is not None:
                log.error("pvestord: loop %s failed: %s", task.get_name(), task.exception(),
                          exc_info=task.exception())
                return 1
        log.info("pvestord stopped")
        return 0

    async def _wait_stop(self) -> None:
        await self._stop.wait()

    def _start_inotify(self) -> None:
        if not self.settings.inotify:
            return
        queue_name = self.settings.queue.name

        def wanted(name: str) -> bool:
            return name == queue_name or name.endswith((".pid", ".qmp"))

        self._watch = FolderWatch(self._wake.set, wanted)
        self._watch.start([self.settings.queue.parent, self.settings.run_dir],
                          asyncio.get_running_loop())

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
                entries = await self.queue.list_async()
            except PvestordError as err:
                # Reconciles must not depend on the queue: they are what
                # catches the drives whose entries it cannot give us.
                self._note_error((0, "queue"), f"cannot read the extend queue: {err}; "
                                 "reconciling local VMs without it")
                entries = []
            else:
                self._clear_error((0, "queue"), "extend queue readable again")
            try:
                await self._dispatch(entries)
            except PvestordError as err:
                self._note_error((0, "queue"), f"cannot update the extend queue: {err}")
            service.notify(f"STATUS=queue depth {self._queue_depth}, "
                           f"{len(self._known_vms)} local VM(s), {len(self._passes)} busy")
            self._loop_progress = time.monotonic()

    async def _reconcile_loop(self) -> None:
        while not self._stop.is_set():
            for vm in local_vms(self.settings.run_dir):
                self._reconcile_due.add(vm.vmid)
            self._wake.set()
            await asyncio.sleep(self.settings.reconcile_interval)

    async def _report_loop(self) -> None:
        while not self._stop.is_set():
            try:
                report = await nodereport.make_report(
                    self.settings.node, self.config.get(), self.extender.lvm_health,
                    interval=self.settings.report_interval,
                    lvm_timeout=self.settings.lvm_timeout)
                nodereport.publish(self.settings.reports_dir, report)
            except (OSError, PvestordError) as err:
                self._note_error((0, "report"), f"cannot publish this node's report in "
                                 f"{self.settings.reports_dir}: {err}", logging.WARNING)
            else:
                self._clear_error((0, "report"), "node report published again")
                for storeid, view in report.storages.items():
                    problem = view.problem()
                    if problem is None:
                        self._clear_error((0, f"vg {view.vg}"), f"VG {view.vg} healthy again")
                    else:
                        self._note_error((0, f"vg {view.vg}"), f"storage {storeid}: {problem}",
                                         logging.WARNING)
            await asyncio.sleep(self.settings.report_interval)

    def _status_view(self) -> publisher.DaemonView:
        shells = self.extender.lvm_shells
        return publisher.DaemonView(
            self._queue_depth, set(self.extender.extending), dict(self._errors), set(self._busy),
            max(shells.starts - len(shells.pids()), 0) if shells is not None else 0)

    def _publish_stopped(self) -> None:
        """Tell rank-nodes at once that this node extends nothing now."""
        report = nodereport.NodeReport(node=self.settings.node, time=time.time(),
                                       interval=self.settings.report_interval, stopped=True)
        try:
            nodereport.publish(self.settings.reports_dir, report)
        except (OSError, PvestordError) as err:
            log.warning("cannot mark this node's report stopped: %s", err)

    def _notice_new_vms(self) -> None:
        current = {vm.vmid for vm in local_vms(self.settings.run_dir)}
        for vmid in sorted(current - self._known_vms):
            log.info("VM %d runs here: reconciling its thin drives", vmid,
                     extra=fields(VMID=vmid))
            self._reconcile_due.add(vmid)
        for vmid in self._known_vms - current:
            self._retry.pop(vmid, None)
            self.extender.forget(vmid)
            self._busy.pop(vmid, None)
            self._warned_paused.discard(vmid)
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
                moot += [e for e in vm_entries if e.origin in (None, self.settings.node)]
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
                         entry.vmid, entry.node_name,
                         extra=fields(VMID=entry.vmid, NODE_NAME=entry.node_name))
            log.debug("removed %d moot entries", removed)

    def _start_pass(self, vm: LocalVm, entries: Sequence[Entry]) -> bool:
        if self._stop.is_set() or vm.vmid in self._passes:
            return False  # the running pass wakes the loop when it ends
        if any(vmid == vm.vmid for vmid, _ in self._abandoned.values()):
            return False  # its last pass is still being cancelled
        now = time.monotonic()
        for retry in (self._retry.get(vm.vmid), self._busy.get(vm.vmid)):
            if retry is not None and now < retry.not_before:
                return False
        task = asyncio.create_task(self._pass(vm, list(entries)), name=f"vm-{vm.vmid}")
        self._passes[vm.vmid] = task
        self._pass_started[vm.vmid] = now
        self._deadlines[vm.vmid] = asyncio.get_running_loop().call_later(
            self.settings.pass_deadline, self._overdue, vm.vmid, task)
        return True

    async def _pass(self, vm: LocalVm, entries: list[Entry]) -> None:
        this = asyncio.current_task()
        try:
            await self._pass_inner(vm, entries)
        except Exception as err:  # the daemon outlives any bug in one pass
            log.exception("VM %d: unexpected error in a pass: %r", vm.vmid, err,
                          extra=fields(VMID=vm.vmid))
            self._backoff(vm.vmid)
        finally:
            if self._passes.get(vm.vmid) is this:
                self._passes.pop(vm.vmid)
                self._pass_started.pop(vm.vmid, None)
                deadline = self._deadlines.pop(vm.vmid, None)
                if deadline is not None:
                    deadline.cancel()
            elif this is not None and self._abandoned.pop(this, None) is not None:
                log.info("VM %d: the pass abandoned at its deadline has ended", vm.vmid,
                         extra=fields(VMID=vm.vmid))
            self._wake.set()

    def _overdue(self, vmid: int, task: asyncio.Task[None]) -> None:
        """A pass ran past its deadline: abandon it, and serve the others."""
        if task.done() or self._passes.get(vmid) is not task:
            return
        now = time.monotonic()
        self._passes.pop(vmid)
        self._deadlines.pop(vmid, None)
        started = self._pass_started.pop(vmid, now)
        self._abandoned[task] = (vmid, now)
        # An LVM change may be half done (a command that never returned):
        # nothing more may change on those VGs from here until someone looks.
        # A pass stuck before any change (QMP) leaves the VGs as they were.
        changing = any(key[0] == vmid for key in self.extender.extending)
        vgs = self._vgs_of(vmid) if changing else []
        message = (f"VM {vmid}: pass abandoned after {now - started:.0f} s (its deadline is "
                   f"{self.settings.pass_deadline:g} s)")
        for vg in vgs:
            self.vg_health.mark(vg, f"{message}, in the middle of an LVM change")
            log.error("%s, in the middle of an LVM change on VG %s: VG marked unhealthy",
                      message, vg, extra=fields(VMID=vmid, VG=vg))
        if not vgs:
            log.error("%s, before any LVM change", message, extra=fields(VMID=vmid))
        task.cancel()
        self._backoff(vmid)
        self._wake.set()

    def _vgs_of(self, vmid: int) -> list[str]:
        """The thin VGs that hold an active LV of ``vmid`` (named as Proxmox names them)."""
        return sorted({storage.vgname for storage in self.config.get().thin_storages.values()
                       if any(Path("/dev", storage.vgname).glob(f"vm-{vmid}-*"))})

    def wedged(self) -> str | None:
        """Why the engine makes no progress (the watchdog is not fed then), or None."""
        return engine_wedged(
            time.monotonic(), abandoned=self._abandoned.values(),
            running=self._pass_started.items(), loop_progress=self._loop_progress,
            pass_deadline=self.settings.pass_deadline,
            poll_interval=self.settings.poll_interval)

    async def _pass_inner(self, vm: LocalVm, entries: list[Entry]) -> None:
        requests: dict[str, Reason] | None = None
        if entries:
            requests = {}
            for entry in entries:
                old = requests.get(entry.node_name)
                if old is None or entry.reason.strength > old.strength:
                    requests[entry.node_name] = entry.reason
        try:
            outcome = await self.extender.handle(vm, requests)
        except VmGoneError as err:
            if local_vm(self.settings.run_dir, vm.vmid) is None:
                if entries:
                    await self.queue.complete_async(entries)
                    log.info("VM %d stopped: %d entr%s dropped", vm.vmid, len(entries),
                             "y" if len(entries) == 1 else "ies", extra=fields(VMID=vm.vmid))
                return
            # The pidfile is written before the QMP socket exists: a VM that
            # is starting up looks like this for a moment.
            self._note_error((vm.vmid, ""), str(err), level=logging.WARNING)
            self._backoff(vm.vmid)
            return
        except VmBusyError as err:
            self._busy_backoff(vm.vmid, err)
            return
        except PvestordError as err:
            self._note_error((vm.vmid, ""), str(err))
            self._backoff(vm.vmid)
            return
        self._busy.pop(vm.vmid, None)
        self._warned_paused.discard(vm.vmid)
        self._clear_error((vm.vmid, ""), f"VM {vm.vmid}: QMP works again")
        await self._settle_entries(vm, entries, outcome)

    async def _settle_entries(self, vm: LocalVm, entries: list[Entry],
                              outcome: VmOutcome) -> None:
        done: list[Entry] = []
        for node, err in outcome.errors.items():
            self._note_error((vm.vmid, node), str(err))
        for node in outcome.drives - set(outcome.errors):
            self._clear_error((vm.vmid, node), f"VM {vm.vmid} {node}: extensions work again")
        for entry in entries:
            if entry.node_name not in outcome.known_nodes:
                log.warning("VM %d has no block node %r: entry dropped", vm.vmid,
                            entry.node_name,
                            extra=fields(VMID=vm.vmid, NODE_NAME=entry.node_name))
                done.append(entry)
            elif entry.node_name in outcome.errors or (
                    entry.node_name not in outcome.drives and outcome.errors):
                continue  # its work failed: stays queued, retried after the backoff
            else:
                done.append(entry)
        if outcome.errors:
            self._backoff(vm.vmid)
        else:
            self._retry.pop(vm.vmid, None)
        if done:
            await self.queue.complete_async(done)

    # -- failures: once per change of state in the log, backoff per VM

    def _backoff(self, vmid: int) -> None:
        # Whatever failed, the VM gets a full pass when its backoff ends: a
        # failed reconcile has no queue entry to bring it back.
        self._reconcile_due.add(vmid)
        delay = self._retry.setdefault(vmid, VmRetry()).failed()
        log.debug("VM %d: next attempt in %g s", vmid, delay)

    def _busy_backoff(self, vmid: int, err: VmBusyError) -> None:
        """Retry a busy VM soon, but not at once; warn once if it waits paused."""
        self._reconcile_due.add(vmid)
        delay = self._busy.setdefault(vmid, VmRetry(first=BUSY_FIRST, maximum=BUSY_MAX)).failed()
        asyncio.get_running_loop().call_later(delay, self._wake.set)
        if (isinstance(err, ExtensionsDeferred) and err.paused
                and vmid not in self._warned_paused):
            self._warned_paused.add(vmid)
            log.warning("VM %d is paused for room and migrating away: its extension is "
                        "deferred to the destination, or to the end of the migration here",
                        vmid, extra=fields(VMID=vmid))
            return
        log.debug("%s; next attempt in %g s", err, delay)

    def _note_error(self, key: tuple[int, str], message: str,
                    level: int = logging.ERROR) -> None:
        if self._errors.get(key) != message:
            self._errors[key] = message
            vmid, node = key
            log.log(level, "%s (will retry)", message,
                    extra=fields(VMID=vmid, NODE_NAME=node) if vmid else {})
        else:
            log.debug("still failing: %s", message)

    def _clear_error(self, key: tuple[int, str], message: str) -> None:
        if self._errors.pop(key, None) is not None:
            log.info("%s", message)


def run(settings: DaemonSettings, *, verbose: bool = False,
        journal: bool | None = None) -> int:
    """Run the daemon until SIGTERM or SIGINT; the process's exit status."""
    service.setup_logging("pvestord", verbose=verbose, journal=journal)
    try:
        return asyncio.run(Daemon(settings).run())
    except PvestordError as err:
        log.error("pvestord: %s", err)
        return 1
