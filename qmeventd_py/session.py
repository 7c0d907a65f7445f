"""One QEMU's monitor session once it is negotiated: its events and its shutdown.

The session turns QEMU's events into extend-queue entries (handed to the
appender) and does qmeventd's duty on ``SHUTDOWN``: a QEMU started with
``-no-shutdown`` stays up after its guest powered off, so we ask its status
and stop it, unless a vzdump backup still needs the process. Who the peer is
and how its session began is :mod:`qmeventd_py.connections`' part.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any

from qemu.qmp import EventListener, QMPClient, QMPError, Runstate

from pvestord.adapters.queue import Entry
from pvestord.adapters.service import fields
from qmeventd_py import cleanup, events
from qmeventd_py.peer import Peer

log = logging.getLogger("qmeventd_py")

#: ``qmp_capabilities`` and ``query-status`` replies.
QMP_TIMEOUT = 10.0

#: Starts a background task the server keeps and logs the failure of.
Spawn = Callable[[Coroutine[Any, Any, Any]], "asyncio.Task[Any]"]


class VmSession:
    """One QEMU's monitor connection: its events and its end-of-life duties."""

    def __init__(self, vmid: int, peer: Peer, client: QMPClient, *, origin: str,
                 kill_timeout: float, submit: Callable[[Entry], None], spawn: Spawn) -> None:
        self.vmid = vmid
        self.peer = peer
        self.client = client
        self.graceful = False
        self.guest = False
        self.backup = False
        self.terminating = False
        self._origin = origin
        self._kill_timeout = kill_timeout
        self._submit = submit
        self._spawn = spawn
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
        elif isinstance(action, events.QueueRequest):
            entry = events.to_entry(self.vmid, action, origin=self._origin,
                                    ts=int(time.time()))
            if isinstance(entry, events.Rejected):
                log.warning("VM %d: no queue entry for %s (%s): %s", self.vmid,
                            action.block_node, action.reason.value, entry.why, extra=self.extra)
            else:
                self._submit(entry)
        elif isinstance(action, events.JobWriteFailed):
            log.warning("VM %d: block job %s failed a write (on-error: %s); if it writes "
                        "into a thin LV, it may have run out of room: only an active "
                        "commit's target is grown ahead of its job, start others with "
                        "on-error=enospc (docs/proxmox.md)",
                        self.vmid, action.job, action.action,
                        extra=fields(VMID=self.vmid, JOB=action.job, JOB_ACTION=action.action))
        elif isinstance(action, events.Shutdown):
            if self.terminating:
                # QEMU sometimes sends a second SHUTDOWN after SIGTERM (qmeventd).
                return
            self.graceful = True
            self.guest = action.guest
            log.info("VM %d: shutdown (guest: %s)", self.vmid, action.guest, extra=self.extra)
            self._spawn(self.terminate_check())

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
                         extra={**self.extra, **fields(BACKUP="keeps-alive")})
                return
            if self.peer.pidfd is None:
                return
            self.terminating = True
            self._spawn(cleanup.terminate(self.vmid, self.peer.pid, self.peer.pidfd,
                                          self._kill_timeout))
