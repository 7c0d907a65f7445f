"""The listening socket every QEMU connects to, and the tasks of its connections.

The socket path is replaced in one step (bound and listening on a temporary
name first) and removed at the end only while it is still ours, so a new
instance that took it over meanwhile keeps its socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from pvestord.errors import PvestordError

log = logging.getLogger("qmeventd_py")


class Listener:
    """A Unix stream socket at ``path``; each connection served in a task of its own."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._sock: socket.socket | None = None
        self._sock_ino: int | None = None
        self._connections: set[asyncio.Task[Any]] = set()

    def open(self) -> None:
        """Listen on the socket path, created 0600.

        We bind and listen on a temporary name and rename it over the path:
        a peer never finds the path bound but not yet listening, and a stale
        socket from a previous run is replaced in one step (qmeventd unlinks
        it first).
        """
        path = self.path
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

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        # Only remove the path if it is still ours: a new instance may own it.
        with contextlib.suppress(OSError):
            if self.path.stat().st_ino == self._sock_ino:
                self.path.unlink()

    async def accept_forever(
            self, serve: Callable[[socket.socket], Coroutine[Any, Any, None]]) -> None:
        """Accept connections and ``serve`` each in a task, until cancelled."""
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
            task = asyncio.create_task(serve(conn))
            self._connections.add(task)
            task.add_done_callback(self._connections.discard)

    async def drop_connections(self) -> None:
        """Cancel every connection still served, and wait until each has ended."""
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
