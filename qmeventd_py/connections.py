"""Serving one accepted connection: who calls, and what it gets from us.

For each peer we check its uid (0 only) and pin its process; then its first
message says what it is (:mod:`qmeventd_py.hello`):

- QEMU's QMP greeting: the VMID comes from the peer's command line, we send
  ``qmp_capabilities`` and hand the session to :class:`~qmeventd_py.session.VmSession`;
  when the connection closes and the process has exited, the cleanup command
  runs (:mod:`qmeventd_py.cleanup`);
- vzdump's ``{"vzdump": {"vmid": "N"}}``: a backup of that VM runs until this
  connection closes, so a shut-down VM is kept alive until then.

The QMP sessions use qemu.qmp's ``QMPClient``, handed the accepted socket.
One deviation from its usual use: we read the first message ourselves
(``await_greeting``/``negotiate`` off, then ``qmp_capabilities`` by hand),
because the same socket also serves vzdump, whose first message is not a QMP
greeting; QMPClient would reject it before we could tell who is calling.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Callable

from qemu.qmp import QMPClient, QMPError
from qemu.qmp.models import Greeting

from pvestord.adapters.queue import Entry
from pvestord.adapters.service import fields
from qmeventd_py import cleanup, events
from qmeventd_py.hello import read_hello, short
from qmeventd_py.options import Options
from qmeventd_py.peer import Peer, PeerError, identify, vmid_of
from qmeventd_py.session import QMP_TIMEOUT, Spawn, VmSession

log = logging.getLogger("qmeventd_py")

#: Longest QMP line we accept from QEMU once the session runs (events are small).
READ_LIMIT = 1024 * 1024
#: After a QEMU's connection closes, how long its process may take to exit
#: before we decide it did not exit (then no cleanup: it will reconnect).
EXIT_WAIT = 30.0


class Connections:
    """The peers being served, and the QEMU sessions among them by VMID."""

    def __init__(self, options: Options, *, submit: Callable[[Entry], None], spawn: Spawn,
                 on_change: Callable[[], None]) -> None:
        self.options = options
        self.vms: dict[int, VmSession] = {}
        #: Set on SIGTERM: a QEMU that disconnects now runs on and reconnects
        #: to our successor, so no cleanup.
        self.stopping = False
        self._submit = submit
        self._spawn = spawn
        self._on_change = on_change

    async def serve(self, conn: socket.socket) -> None:
        """Serve one accepted connection until it ends; always closes it."""
        peer: Peer | None = None
        try:
            peer = identify(conn)
            if peer.uid != 0:
                raise PeerError(f"uid {peer.uid} is not root", why="not-root")
            try:
                hello, rest = await asyncio.wait_for(
                    read_hello(conn), self.options.hello_timeout)
            except TimeoutError:
                raise PeerError(f"said nothing usable within {self.options.hello_timeout:g} s",
                                why="silent") from None
            kind = events.hello_kind(hello)
            if kind == "qmp":
                if rest.strip():
                    raise PeerError("sent data after its QMP greeting, before negotiation",
                                    why="early-data")
                await self._serve_qemu(conn, peer, hello)
            elif kind == "vzdump":
                await self._serve_vzdump(conn, peer, hello)
            else:
                raise PeerError(f"first message is neither a QMP greeting nor a vzdump"
                                f" hello: {short(hello)}", why="unknown-hello")
        except PeerError as err:
            who = peer.describe() if peer else "unknown peer"
            extra = (fields(DROPPED=err.why, PEER_PID=peer.pid, PEER_UID=peer.uid) if peer
                     else fields(DROPPED=err.why))
            log.warning("dropped peer (%s): %s", who, err, extra=extra)
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
            raise PeerError(f"malformed QMP greeting {short(hello)}: {err!r}",
                            why="bad-greeting") from err
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
            raise PeerError(f"VM {vmid}: QMP negotiation failed: {err!r}",
                            why="negotiation") from err
        session = VmSession(vmid, peer, client, origin=self.options.origin,
                            kill_timeout=self.options.kill_timeout, submit=self._submit,
                            spawn=self._spawn)
        previous = self.vms.get(vmid)
        if previous is not None:
            log.warning("VM %d: a second QEMU (pid %d) connected; pid %d was first",
                        vmid, peer.pid, previous.peer.pid, extra=session.extra)
        self.vms[vmid] = session
        log.info("VM %d: QEMU pid %d connected", vmid, peer.pid,
                 extra={**session.extra, **fields(QEMU_PID=peer.pid, QMP_SESSION="connected")})
        self._on_change()
        try:
            await session.run()
        finally:
            if self.vms.get(vmid) is session:
                del self.vms[vmid]
                self._on_change()
        if self.stopping:
            return  # the VM runs on and reconnects to our successor
        log.info("VM %d: QEMU pid %d disconnected (graceful: %s, guest: %s)", vmid, peer.pid,
                 session.graceful, session.guest,
                 extra={**session.extra, **fields(QEMU_PID=peer.pid, QMP_SESSION="ended")})
        if self.options.cleanup is not None and peer.pidfd is not None:
            pidfd = os.dup(peer.pidfd)
            self._spawn(self._cleanup_after_exit(session, pidfd))

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
            raise PeerError(f"invalid vzdump hello {short(hello)}", why="bad-hello")
        vm = self.vms.get(vmid)
        if vm is None:
            log.info("VM %d: vzdump started a backup of a VM with no QEMU connected", vmid,
                     extra=fields(VMID=vmid))
        else:
            vm.backup = True
            log.info("VM %d: vzdump backup started", vmid,
                     extra={**vm.extra, **fields(BACKUP="started")})
        loop = asyncio.get_running_loop()
        # vzdump says nothing more; the backup lasts until it hangs up.
        while await loop.sock_recv(conn, 4096):
            pass
        vm = self.vms.get(vmid)
        if vm is not None:
            log.info("VM %d: vzdump backup ended", vmid,
                     extra={**vm.extra, **fields(BACKUP="ended")})
            vm.backup = False
            self._spawn(vm.terminate_check())
