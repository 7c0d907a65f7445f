"""The extend queue's writer: entries batched, appended off the event loop, retried.

Entries go through one appender task that batches whatever is pending into a
single locked append, so a burst of many VMs costs one queue write, not one
each. The append runs in a thread of its own: a hung ``/etc/pve`` delays
queue entries, never the QMP sessions and qmeventd's duties. The queue is the
only record of an event: a failed append is retried, and if it still fails
the loss is logged loudly (pvestord's reconcile finds those drives anyway,
only later).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Sequence

from pvestord.adapters.queue import Entry, ExtendQueue
from pvestord.adapters.service import fields

log = logging.getLogger("qmeventd_py")

#: Append attempts for one batch, and the pause before each retry.
APPEND_RETRIES = (0.5, 1.0, 2.0, 4.0)
#: An append still running after this long is logged (once); it is not given
#: up: a thread blocked in pmxcfs cannot be interrupted, only waited for.
APPEND_SLOW = 10.0
#: Drives whose entries may wait in memory while an append is in flight.
MAX_BACKLOG = 4096


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
                log.info("VM %d: queued %s:%s reason=%s", e.vmid, e.vmid, e.block_node,
                         e.reason.value, extra=fields(VMID=e.vmid, BLOCK_NODE=e.block_node,
                                                      REASON=e.reason.value, ENTRY="queued"))
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
                      e.vmid, e.vmid, e.block_node, e.reason.value, why,
                      extra=fields(VMID=e.vmid, BLOCK_NODE=e.block_node, REASON=e.reason.value,
                                   ENTRY="lost"))
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
