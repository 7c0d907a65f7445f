"""qmeventd-py: Proxmox's qmeventd in asyncio, plus the thin-provisioning events.

Every QEMU on a Proxmox node connects to this socket as a client
(``-chardev socket,...,reconnect=N -mon chardev=...,mode=control``); so does
vzdump while it backs a VM up. This module ties the pieces together and owns
the daemon's life: start, ``READY``, the status line, and the stop on
SIGTERM that lets pending appends and cleanups finish. The pieces:

- :mod:`qmeventd_py.listener`: the socket and the task of each connection;
- :mod:`qmeventd_py.connections`: who calls (QEMU or vzdump) and the QMP handshake;
- :mod:`qmeventd_py.session`: a QEMU's events and its shutdown duties;
- :mod:`qmeventd_py.appender`: the batched, retried writes to the extend queue;
- :mod:`qmeventd_py.options`: the command line.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
from collections.abc import Coroutine, Sequence
from typing import Any

from pvestord.adapters.locks import queue_lock
from pvestord.adapters.queue import ExtendQueue
from pvestord.adapters.service import notify, setup_logging, watchdog_loop
from pvestord.errors import PvestordError
from qmeventd_py.appender import Appender
from qmeventd_py.connections import Connections
from qmeventd_py.listener import Listener
from qmeventd_py.options import Options, make_options, parse_args

log = logging.getLogger("qmeventd_py")

#: On SIGTERM, how long pending appends and cleanups may still take.
DRAIN_TIMEOUT = 20.0


class Server:
    def __init__(self, options: Options, queue: ExtendQueue) -> None:
        self.options = options
        self.appender = Appender(queue, self.report_status)
        self.connections = Connections(options, submit=self.appender.submit,
                                       spawn=self.spawn, on_change=self.report_status)
        self.listener = Listener(options.socket)
        self._tasks: set[asyncio.Task[Any]] = set()

    def report_status(self) -> None:
        """What ``systemctl status qmeventd-py`` shows on its Status: line."""
        lost = f", {self.appender.lost} LOST" if self.appender.lost else ""
        waiting = f", {self.appender.backlog} waiting" if self.appender.backlog else ""
        notify(f"STATUS={len(self.connections.vms)} VM(s) connected, {self.appender.queued} "
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

    async def serve(self, stop: asyncio.Event) -> None:
        self.listener.open()
        appender = self.spawn(self.appender.run())
        accept = asyncio.create_task(self.listener.accept_forever(self.connections.serve))
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
            self.connections.stopping = True
            accept.cancel()
            watchdog.cancel()
            self.listener.close()
            await asyncio.gather(accept, watchdog, return_exceptions=True)
            await self.listener.drop_connections()
            background = [t for t in self._tasks if t is not appender]
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.appender.drain(), DRAIN_TIMEOUT)
            if background:
                await asyncio.wait(background, timeout=DRAIN_TIMEOUT)
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)


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
