"""qmeventd-py: Proxmox's qmeventd in asyncio, plus the thin-provisioning events.

Every QEMU on a Proxmox node connects to this socket as a client
(``-chardev socket,...,reconnect=N -mon chardev=...,mode=control``). For each
peer we check its uid (0 only) and pin its process; then its first message
says what it is:

- QEMU's QMP greeting: the VMID comes from the peer's command line, we send
  ``qmp_capabilities`` and turn ``BLOCK_WRITE_THRESHOLD`` and ``BLOCK_IO_ERROR``
  (nospace) into extend-queue entries, and do qmeventd's duties on
  ``SHUTDOWN`` and disconnect (:mod:`qmeventd_py.cleanup`);
- vzdump's ``{"vzdump": {"vmid": "N"}}``: a backup of that VM runs until this
  connection closes, so a shut-down VM is kept alive until then.

The QMP sessions use qemu.qmp's ``QMPClient``, handed the accepted socket.
One deviation from its usual use: we read the first message ourselves
(``await_greeting``/``negotiate`` off, then ``qmp_capabilities`` by hand),
because the same socket also serves vzdump, whose first message is not a QMP
greeting; QMPClient would reject it before we could tell who is calling.

Entries go through one appender task that batches whatever is pending into a
single locked append, so a burst of many VMs costs one queue write, not one
each. The append runs in a thread of its own: a hung ``/etc/pve`` delays
queue entries, never the QMP sessions and qmeventd's duties (:class:`Appender`).
The queue is the only record of an event: a failed append is retried, and if
it still fails the loss is logged loudly (pvestord's reconcile finds those
drives anyway, only later).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.metadata
import json
import logging
import os
import signal
import socket
import stat
import sys
import threading
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qemu.qmp import EventListener, QMPClient, QMPError, Runstate
from qemu.qmp.models import Greeting

from pvestord import paths
from pvestord.adapters.locks import queue_lock
from pvestord.adapters.queue import Entry, ExtendQueue, QueueError
from pvestord.adapters.service import fields, notify, setup_logging, watchdog_loop
from pvestord.errors import ConfigError, PvestordError
from qmeventd_py import cleanup, events
from qmeventd_py.peer import Peer, PeerError, identify, vmid_of

log = logging.getLogger("qmeventd_py")

#: A peer must say who it is this soon after connecting (QEMU greets at once).
HELLO_TIMEOUT = 10.0
#: The first message is a QMP greeting or vzdump's hello: a few hundred bytes.
HELLO_LIMIT = 64 * 1024
#: Longest QMP line we accept from QEMU once the session runs (events are small).
READ_LIMIT = 1024 * 1024
#: ``qmp_capabilities`` and ``query-status`` replies.
QMP_TIMEOUT = 10.0
#: After a QEMU's connection closes, how long its process may take to exit
#: before we decide it did not exit (then no cleanup: it will reconnect).
EXIT_WAIT = 30.0
#: Append attempts for one batch, and the pause before each retry.
APPEND_RETRIES = (0.5, 1.0, 2.0, 4.0)
#: An append still running after this long is logged (once); it is not given
#: up: a thread blocked in pmxcfs cannot be interrupted, only waited for.
APPEND_SLOW = 10.0
#: Drives whose entries may wait in memory while an append is in flight.
MAX_BACKLOG = 4096
#: On SIGTERM, how long pending appends and cleanups may still take.
DRAIN_TIMEOUT = 20.0


@dataclass(frozen=True)
class Options:
    socket: Path
    queue: Path
    lock_dir: Path | None
    cleanup: list[str] | None
    kill_timeout: float
    origin: str
    hello_timeout: float = HELLO_TIMEOUT


class Appender:
    """Appends entries to the extend queue in batches, off the event loop.

    The queue lives in ``/etc/pve``: if pmxcfs hangs, a write there blocks in
    the kernel until pmxcfs answers, and no deadline can interrupt it. So each
    append (lock, read, write, rename) runs in a thread of its own, one at a
    time, and the event loop only waits for its result: QMP sessions,
    SHUTDOWN -> terminate and ``qm cleanup`` go on meanwhile (qmeventd, whose
    duties these are, never touches ``/etc/pve``). Entries that arrive while
    an append is in flight wait in memory, merged per drive, at most
    ``max_backlog`` drives. A failed append is retried; the failure is logged
    once, the recovery once, and entries given up on are logged one by one as
    LOST (pvestord's reconcile finds those drives anyway, only later).
    """

    def __init__(self, queue: ExtendQueue, on_change: Callable[[], None], *,
                 slow_after: float = APPEND_SLOW, max_backlog: int = MAX_BACKLOG) -> None:
        self._queue = queue
        self._on_change = on_change
        self._slow_after = slow_after
        self._max_backlog = max_backlog
        self._pending: dict[tuple[int, str], Entry] = {}
        self._arrived = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        #: Entries appended, and entries given up on, since start.
        self.queued = 0
        self.lost = 0

    @property
    def backlog(self) -> int:
        """Drives waiting in memory for the next append."""
        return len(self._pending)

    def submit(self, entry: Entry) -> None:
        old = self._pending.get(entry.key)
        if old is not None:
            self._pending[entry.key] = old.merged(entry)
        elif len(self._pending) >= self._max_backlog:
            self._lose([entry], f"{len(self._pending)} drives already wait for the queue")
            return
        else:
            self._pending[entry.key] = entry
        self._idle.clear()
        self._arrived.set()

    async def run(self) -> None:
        batch: list[Entry] = []
        try:
            while True:
                await self._arrived.wait()
                self._arrived.clear()
                batch = list(self._pending.values())
                self._pending.clear()
                if batch:
                    await self._append(batch)
                batch = []
                if not self._pending:
                    self._idle.set()
        except asyncio.CancelledError:
            left = batch + list(self._pending.values())
            if left:
                self._lose(left, "qmeventd-py stopped before the queue took them")
            raise

    async def drain(self) -> None:
        """Until nothing waits in memory and no append is in flight."""
        await self._idle.wait()

    async def _append(self, batch: list[Entry]) -> None:
        began = time.monotonic()
        last_err: Exception | None = None
        for attempt, pause in enumerate((*APPEND_RETRIES, None), start=1):
            try:
                await self._append_in_thread(batch, began)
            except Exception as err:  # any failure: retried, then LOST loudly
                last_err = err
                if attempt == 1:
                    log.warning("extend queue append of %d entries failed; retrying %d times"
                                " over %g s: %s", len(batch), len(APPEND_RETRIES),
                                sum(APPEND_RETRIES), err)
                else:
                    log.debug("extend queue append attempt %d failed: %s", attempt, err)
                if pause is None:
                    break
                await asyncio.sleep(pause)
                continue
            waited = time.monotonic() - began
            if last_err is not None or waited >= self._slow_after:
                log.warning("extend queue append of %d entries done after %.1f s and %d"
                            " attempts", len(batch), waited, attempt,
                            extra=fields(DURATION_MS=int(waited * 1000)))
            for e in batch:
                log.info("VM %d: queued %s:%s reason=%s", e.vmid, e.vmid, e.node_name,
                         e.reason.value, extra=fields(VMID=e.vmid, NODE_NAME=e.node_name,
                                                      REASON=e.reason.value))
            self.queued += len(batch)
            self._on_change()
            return
        self._lose(batch, f"after {len(APPEND_RETRIES) + 1} attempts ({last_err})")

    async def _append_in_thread(self, batch: list[Entry], began: float) -> None:
        result = run_in_daemon_thread(self._queue.append, batch)
        done, _ = await asyncio.wait({result}, timeout=self._slow_after)
        if not done:
            log.warning("extend queue append of %d entries still waits after %.0f s (is"
                        " pmxcfs hung?); events keep being handled, %d more drives wait in"
                        " memory", len(batch), time.monotonic() - began, len(self._pending))
        await result

    def _lose(self, entries: Sequence[Entry], why: str) -> None:
        for e in entries:
            log.error("VM %d: LOST queue entry %s:%s reason=%s %s;"
                      " pvestord's reconcile will find this drive, but later",
                      e.vmid, e.vmid, e.node_name, e.reason.value, why,
                      extra=fields(VMID=e.vmid, NODE_NAME=e.node_name, REASON=e.reason.value))
        self.lost += len(entries)
        self._on_change()


def run_in_daemon_thread(function: Callable[..., object], *args: object
                         ) -> asyncio.Future[object]:
    """``function(*args)`` in a new daemon thread; its outcome as a future of the loop.

    Not ``asyncio.to_thread``: its executor's threads are joined when the
    loop and the interpreter end, so one thread stuck in a hung pmxcfs would
    keep the process from ever exiting. A daemon thread is left behind.
    """
    loop = asyncio.get_running_loop()
    future: asyncio.Future[object] = loop.create_future()

    def settle(value: object, error: BaseException | None) -> None:
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(value)

    def work() -> None:
        try:
            value, error = function(*args), None
        except BaseException as err:  # handed to the loop
            value, error = None, err
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
            loop.call_soon_threadsafe(settle, value, error)

    threading.Thread(target=work, name="queue-append", daemon=True).start()
    return future


class VmSession:
    """One QEMU's monitor connection: its events and its end-of-life duties."""

    def __init__(self, server: Server, vmid: int, peer: Peer, client: QMPClient) -> None:
        self.server = server
        self.vmid = vmid
        self.peer = peer
        self.client = client
        self.graceful = False
        self.guest = False
        self.backup = False
        self.terminating = False
        self._check_lock = asyncio.Lock()
        self.extra = fields(VMID=vmid)

    async def run(self) -> None:
        listener = EventListener()
        self.client.register_listener(listener)
        consume = asyncio.create_task(self._consume(listener))
        closed = asyncio.create_task(self._wait_closed())
        try:
            done, _ = await asyncio.wait({consume, closed},
                                         return_when=asyncio.FIRST_COMPLETED)
            if consume in done and consume.exception() is not None:
                log.error("VM %d: event handling failed: %r", self.vmid,
                          consume.exception(), extra=self.extra)
        finally:
            for task in (consume, closed):
                task.cancel()
            await asyncio.gather(consume, closed, return_exceptions=True)
            self.client.remove_listener(listener)
            await self.close()

    async def close(self) -> None:
        try:
            await self.client.disconnect()
        except (QMPError, EOFError, OSError) as err:
            # How the connection ended (EOF when QEMU exits): not an error.
            log.debug("VM %d: connection ended: %r", self.vmid, err, extra=self.extra)

    async def _wait_closed(self) -> None:
        while self.client.runstate == Runstate.RUNNING:
            await self.client.runstate_changed()

    async def _consume(self, listener: EventListener) -> None:
        async for message in listener:
            self.handle(message)

    def handle(self, message: object) -> None:
        action = events.classify(message)
        if action is None:
            return
        if isinstance(action, events.Rejected):
            log.warning("VM %d: ignoring malformed %s event: %s", self.vmid, action.event,
                        action.why, extra=self.extra)
        elif isinstance(action, events.Extend):
            entry = events.to_entry(self.vmid, action, origin=self.server.options.origin,
                                    ts=int(time.time()))
            if isinstance(entry, events.Rejected):
                log.warning("VM %d: no queue entry for %s (%s): %s", self.vmid,
                            action.node_name, action.reason.value, entry.why, extra=self.extra)
            else:
                self.server.appender.submit(entry)
        elif isinstance(action, events.Shutdown):
            if self.terminating:
                # QEMU sometimes sends a second SHUTDOWN after SIGTERM (qmeventd).
                return
            self.graceful = True
            self.guest = action.guest
            log.info("VM %d: shutdown (guest: %s)", self.vmid, action.guest, extra=self.extra)
            self.server.spawn(self.terminate_check())

    async def terminate_check(self) -> None:
        """Stop a QEMU that shut down and is not needed by a backup any more."""
        async with self._check_lock:
            if self.terminating or self.client.runstate != Runstate.RUNNING:
                return
            try:
                status = await asyncio.wait_for(self.client.execute("query-status"),
                                                QMP_TIMEOUT)
            except (QMPError, TimeoutError) as err:
                # Interrupted by QEMU exiting is the usual end of a quit.
                level = (logging.WARNING if self.client.runstate == Runstate.RUNNING
                         else logging.DEBUG)
                log.log(level, "VM %d: query-status failed: %r", self.vmid, err,
                        extra=self.extra)
                return
            state = status.get("status") if isinstance(status, dict) else None
            if state in ("running", "paused"):
                log.debug("VM %d: still active (%s)", self.vmid, state, extra=self.extra)
                return
            if self.backup:
                log.info("VM %d: not active, but a backup runs: kept alive", self.vmid,
                         extra=self.extra)
                return
            if self.peer.pidfd is None:
                return
            self.terminating = True
            self.server.spawn(cleanup.terminate(self.vmid, self.peer.pid, self.peer.pidfd,
                                                self.server.options.kill_timeout))


class Server:
    def __init__(self, options: Options, queue: ExtendQueue) -> None:
        self.options = options
        self.appender = Appender(queue, self.report_status)
        self.vms: dict[int, VmSession] = {}
        self.stopping = False
        self._tasks: set[asyncio.Task[Any]] = set()
        self._peers: set[asyncio.Task[Any]] = set()
        self._sock: socket.socket | None = None
        self._sock_ino: int | None = None

    def report_status(self) -> None:
        """What ``systemctl status qmeventd-py`` shows on its Status: line."""
        lost = f", {self.appender.lost} LOST" if self.appender.lost else ""
        waiting = f", {self.appender.backlog} waiting" if self.appender.backlog else ""
        notify(f"STATUS={len(self.vms)} VM(s) connected, {self.appender.queued} "
               f"queue entries added{waiting}{lost}")

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        """A background task the server keeps a reference to and logs failures of."""
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("background task failed: %r", task.exception())

    # -- listening -----------------------------------------------------------

    def listen(self) -> None:
        """Listen on the socket path, created 0600.

        We bind and listen on a temporary name and rename it over the path:
        a peer never finds the path bound but not yet listening, and a stale
        socket from a previous run is replaced in one step (qmeventd unlinks
        it first).
        """
        path = self.options.socket
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old_umask = os.umask(0o177)  # the socket file is born 0600: no window
        try:
            sock.bind(str(tmp))
            os.chmod(tmp, 0o600)
            sock.listen(128)
            os.rename(tmp, path)
        except OSError as err:
            sock.close()
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise PvestordError(f"cannot listen on {path}: {err}") from err
        finally:
            os.umask(old_umask)
        sock.setblocking(False)
        self._sock = sock
        self._sock_ino = path.stat().st_ino

    async def serve(self, stop: asyncio.Event) -> None:
        self.listen()
        appender = self.spawn(self.appender.run())
        accept = asyncio.create_task(self._accept_loop())
        watchdog = asyncio.create_task(watchdog_loop())
        log.info("listening on %s (queue %s, cleanup %s)", self.options.socket,
                 self.options.queue,
                 " ".join(self.options.cleanup) if self.options.cleanup else "off")
        notify("READY=1")
        self.report_status()
        try:
            await stop.wait()
        finally:
            notify("STOPPING=1")
            log.info("stopping")
            self.stopping = True
            accept.cancel()
            watchdog.cancel()
            self._close_socket()
            await asyncio.gather(accept, watchdog, return_exceptions=True)
            for task in list(self._peers):
                task.cancel()
            await asyncio.gather(*self._peers, return_exceptions=True)
            background = [t for t in self._tasks if t is not appender]
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.appender.drain(), DRAIN_TIMEOUT)
            if background:
                await asyncio.wait(background, timeout=DRAIN_TIMEOUT)
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)

    def _close_socket(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        # Only remove the path if it is still ours: a new instance may own it.
        with contextlib.suppress(OSError):
            if self.options.socket.stat().st_ino == self._sock_ino:
                self.options.socket.unlink()

    async def _accept_loop(self) -> None:
        loop = asyncio.get_running_loop()
        assert self._sock is not None
        while True:
            try:
                conn, _ = await loop.sock_accept(self._sock)
            except OSError as err:
                # EMFILE and friends: keep the daemon up, let the backlog wait.
                log.error("accept failed: %s", err)
                await asyncio.sleep(0.5)
                continue
            task = asyncio.create_task(self._serve_peer(conn))
            self._peers.add(task)
            task.add_done_callback(self._peers.discard)

    # -- peers ---------------------------------------------------------------

    async def _serve_peer(self, conn: socket.socket) -> None:
        peer: Peer | None = None
        try:
            peer = identify(conn)
            if peer.uid != 0:
                raise PeerError(f"uid {peer.uid} is not root")
            try:
                hello, rest = await asyncio.wait_for(
                    read_hello(conn), self.options.hello_timeout)
            except TimeoutError:
                raise PeerError(f"said nothing usable within {self.options.hello_timeout:g} s"
                                ) from None
            kind = events.hello_kind(hello)
            if kind == "qmp":
                if rest.strip():
                    raise PeerError("sent data after its QMP greeting, before negotiation")
                await self._serve_qemu(conn, peer, hello)
            elif kind == "vzdump":
                await self._serve_vzdump(conn, peer, hello)
            else:
                raise PeerError(f"first message is neither a QMP greeting nor a vzdump"
                                f" hello: {_short(hello)}")
        except PeerError as err:
            who = peer.describe() if peer else "unknown peer"
            log.warning("dropped peer (%s): %s", who, err)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("unexpected error serving a peer; dropped it")
        finally:
            conn.close()
            if peer is not None:
                peer.close()

    async def _serve_qemu(self, conn: socket.socket, peer: Peer, hello: object) -> None:
        try:
            Greeting(hello)  # type: ignore[arg-type]
        except (KeyError, TypeError) as err:
            raise PeerError(f"malformed QMP greeting {_short(hello)}: {err!r}") from err
        vmid = vmid_of(peer)
        client = QMPClient(f"vm{vmid}", readbuflen=READ_LIMIT)
        client.await_greeting = False
        client.negotiate = False
        try:
            await asyncio.wait_for(client.connect(conn), QMP_TIMEOUT)
            await asyncio.wait_for(client.execute("qmp_capabilities"), QMP_TIMEOUT)
        except (QMPError, TimeoutError, OSError) as err:
            with contextlib.suppress(QMPError, EOFError, OSError):
                await client.disconnect()
            raise PeerError(f"VM {vmid}: QMP negotiation failed: {err!r}") from err
        session = VmSession(self, vmid, peer, client)
        previous = self.vms.get(vmid)
        if previous is not None:
            log.warning("VM %d: a second QEMU (pid %d) connected; pid %d was first",
                        vmid, peer.pid, previous.peer.pid, extra=session.extra)
        self.vms[vmid] = session
        log.info("VM %d: QEMU pid %d connected", vmid, peer.pid, extra=session.extra)
        self.report_status()
        try:
            await session.run()
        finally:
            if self.vms.get(vmid) is session:
                del self.vms[vmid]
                self.report_status()
        if self.stopping:
            return  # the VM runs on and reconnects to our successor
        log.info("VM %d: QEMU pid %d disconnected (graceful: %s, guest: %s)", vmid, peer.pid,
                 session.graceful, session.guest, extra=session.extra)
        if self.options.cleanup is not None and peer.pidfd is not None:
            pidfd = os.dup(peer.pidfd)
            self.spawn(self._cleanup_after_exit(session, pidfd))

    async def _cleanup_after_exit(self, session: VmSession, pidfd: int) -> None:
        try:
            if not await cleanup.exits_within(pidfd, EXIT_WAIT):
                log.warning("VM %d: QEMU pid %d still runs %g s after its monitor connection"
                            " closed: no cleanup (it will reconnect)", session.vmid,
                            session.peer.pid, EXIT_WAIT, extra=session.extra)
                return
        finally:
            os.close(pidfd)
        assert self.options.cleanup is not None
        await cleanup.run_cleanup(self.options.cleanup, session.vmid, session.graceful,
                                  session.guest)

    async def _serve_vzdump(self, conn: socket.socket, peer: Peer, hello: object) -> None:
        vmid = events.vzdump_vmid(hello)
        if vmid is None:
            raise PeerError(f"invalid vzdump hello {_short(hello)}")
        vm = self.vms.get(vmid)
        if vm is None:
            log.info("VM %d: vzdump started a backup of a VM with no QEMU connected", vmid,
                     extra=fields(VMID=vmid))
        else:
            vm.backup = True
            log.info("VM %d: vzdump backup started", vmid, extra=vm.extra)
        loop = asyncio.get_running_loop()
        # vzdump says nothing more; the backup lasts until it hangs up.
        while await loop.sock_recv(conn, 4096):
            pass
        vm = self.vms.get(vmid)
        if vm is not None:
            log.info("VM %d: vzdump backup ended", vmid, extra=vm.extra)
            vm.backup = False
            self.spawn(vm.terminate_check())


async def read_hello(conn: socket.socket) -> tuple[object, str]:
    """The peer's first JSON message, and whatever text followed it.

    vzdump sends its hello without a newline, so we parse as bytes arrive
    rather than reading a line.

    :raise PeerError: garbage, an over-long message, or EOF before a message.
    """
    loop = asyncio.get_running_loop()
    decoder = json.JSONDecoder()
    buf = b""
    while True:
        chunk = await loop.sock_recv(conn, HELLO_LIMIT - len(buf))
        if not chunk:
            raise PeerError(f"closed the connection after {len(buf)} bytes, before a"
                            " complete first message")
        buf += chunk
        text = buf.decode(errors="replace").lstrip()
        if text and not text.startswith("{"):
            raise PeerError(f"sent garbage: {buf[:60]!r}")
        try:
            message, end = decoder.raw_decode(text)
        except (ValueError, RecursionError):
            # RecursionError: nesting deeper than the decoder's stack (found by
            # fuzzing); as invalid as any other JSON we cannot read.
            if b"\n" in buf:
                raise PeerError(f"sent invalid JSON: {buf[:60]!r}") from None
            if len(buf) >= HELLO_LIMIT:
                raise PeerError(f"first message is longer than {HELLO_LIMIT} bytes") from None
            continue
        return message, text[end:]


def _short(message: object) -> str:
    text = repr(message)
    return text if len(text) <= 120 else text[:117] + "..."


# -- command line --------------------------------------------------------------

def _version() -> str:
    try:
        return importlib.metadata.version("pvestord")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="qmeventd-py",
        description="QMP event server for QEMU (drop-in for Proxmox's qmeventd) that"
                    " queues thin-provisioning extensions.")
    p.add_argument("path", nargs="?", type=Path,
                   help="socket path, as qmeventd takes it (same as --socket)")
    p.add_argument("--socket", type=Path, help=f"default: {paths.QMEVENTD_SOCKET}")
    p.add_argument("--queue", type=Path, default=paths.QUEUE,
                   help="extend queue file (default: %(default)s)")
    p.add_argument("--lock-dir", type=Path,
                   help="use lock directories here for the queue lock (pmxcfs style)")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--cleanup-cmd", help="run 'CMD VMID GRACEFUL GUEST' when a VM exits"
                       f" (default: '{cleanup.QM} cleanup' if installed)")
    group.add_argument("--no-cleanup", action="store_true", help="run no cleanup command")
    p.add_argument("-t", "--kill-timeout", type=float, default=cleanup.DEFAULT_KILL_TIMEOUT,
                   help="seconds from SIGTERM to SIGKILL for a shut-down VM"
                        " (default: %(default)g)")
    p.add_argument("--node-name", help="origin recorded in queue entries"
                   " (default: short host name)")
    p.add_argument("--hello-timeout", type=float, default=HELLO_TIMEOUT,
                   help="seconds a peer has to send its first message (default: %(default)g)")
    p.add_argument("-f", "--foreground", action="store_true",
                   help="accepted for qmeventd compatibility; we always run in the foreground")
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    p.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    args = p.parse_args(argv)
    if args.path is not None and args.socket is not None and args.path != args.socket:
        p.error("give the socket path once (positional or --socket)")
    return args


def make_options(args: argparse.Namespace) -> Options:
    if args.kill_timeout <= 0:
        raise ConfigError(f"--kill-timeout must be positive, not {args.kill_timeout:g}")
    if args.hello_timeout <= 0:
        raise ConfigError(f"--hello-timeout must be positive, not {args.hello_timeout:g}")
    command: list[str] | None
    if args.no_cleanup:
        command = None
    elif args.cleanup_cmd is not None:
        try:
            command = cleanup.parse_command(args.cleanup_cmd)
        except ValueError as err:
            raise ConfigError(f"--cleanup-cmd {args.cleanup_cmd!r}: {err}") from err
    else:
        command = cleanup.default_command()
    origin = args.node_name or socket.gethostname().split(".")[0]
    try:
        Entry(100, "probe", origin=origin)
    except QueueError as err:
        raise ConfigError(f"node name {origin!r} cannot be a queue entry's origin: {err}"
                          " (use --node-name)") from err
    sock = args.socket or args.path or paths.QMEVENTD_SOCKET
    if sock.exists() and not stat.S_ISSOCK(sock.stat().st_mode):
        raise ConfigError(f"{sock} exists and is not a socket; not replacing it")
    return Options(socket=sock, queue=args.queue, lock_dir=args.lock_dir, cleanup=command,
                   kill_timeout=args.kill_timeout, origin=origin,
                   hello_timeout=args.hello_timeout)


async def _main(options: Options) -> None:
    queue = ExtendQueue(options.queue, lock=queue_lock(options.queue, options.lock_dir))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await Server(options, queue).serve(stop)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    setup_logging("qmeventd-py", verbose=args.verbose)
    try:
        options = make_options(args)
        asyncio.run(_main(options))
    except PvestordError as err:
        log.error("%s", err)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
