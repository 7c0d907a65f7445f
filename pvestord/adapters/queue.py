"""The cluster extend queue: one file, one drive a line, shared by every node.

The line format (:class:`Entry`, parsing, merging, :class:`RejectedLine`) is
pure and lives in :mod:`pvestord.policy.queueformat`; here are the file, its
lock and the changes to it.

Rules:

* one line per ``VMID:BLOCK-NODE``: a second event for a queued drive merges
  into its line, so the file stays small however many events arrive;
* an entry leaves the queue only when its work is done or moot. The daemon
  reads a snapshot (:meth:`ExtendQueue.entries_async`), works, then calls
  :meth:`ExtendQueue.complete`, which removes a line only if it is still
  *equal* to the snapshot. A merge always changes the line (``n`` grows), so
  an event that arrived during the work keeps its line queued and is handled
  next round; ``id`` makes a line removed and queued again differ from the
  old one too. A crash in between leaves the line queued.
* every change is a read-modify-write under the queue lock
  (:func:`pvestord.adapters.locks.queue_lock`), written to a temporary file in the same
  directory, fsynced and renamed over the queue: readers never take the lock
  and never see half a file.
* the file is bounded by ``max_bytes`` (1 MiB: pmxcfs refuses larger files).
  An append that would grow the file past it is refused as a whole with
  :class:`QueueFullError`; nothing queued before changes. Removals always
  proceed, even on a file that is already over the bound.
* lines that do not parse are never fatal and never silently dropped: the
  next change moves them to ``<queue>.rejected`` (JSON lines with the
  original bytes, why, and when) with a warning in the log, and
  ``pvestord queue list --rejected`` shows them. The rejected file has the
  same bound: past it the oldest records go, with a warning saying how many.
  A rejected line longer than 4 KiB is kept truncated, with its length and
  SHA-256.
* a queue (or rejected) file that is a symbolic link is refused with
  :class:`QueueError`: whoever controls the link would choose where root
  writes. Nothing is read or written through it.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

from pvestord.adapters.atomicfile import (
    read_bounded,
    remove_leftover_temporaries,
    write_atomically,
)
from pvestord.adapters.locks import DEFAULT_TIMEOUT, Lock, queue_lock
from pvestord.policy.proxmox import VMID_MAX, VMID_MIN
from pvestord.policy.queueformat import (
    MAX_LINE,
    MAX_REJECTED_LINE,
    N_MAX,
    Contents,
    Entry,
    InvalidEntryError,
    ParseCache,
    QueueError,
    QueueFullError,
    RejectedLine,
    check_block_node,
    check_vmid,
    parse_contents,
    parse_key,
    render,
    render_keeping,
)
from pvestord.policy.reason import Reason

log = logging.getLogger(__name__)

#: pmxcfs refuses files larger than this (MEMDB_MAX_FILE_SIZE).
MAX_BYTES = 1024 * 1024
#: We read at most this much of a queue file; a larger one is refused unread.
MAX_READ = 64 * MAX_BYTES
#: How many rejected lines are logged one by one before a summary.
_LOG_REJECTED_LINES = 20


def parse_queue(data: bytes, now: int | None = None) -> tuple[list[Entry], list[RejectedLine]]:
    """Every entry in file order (duplicates merged) and every rejected line
    (stamped ``now``, by default the current time)."""
    contents = parse_contents(data, int(time.time()) if now is None else now, {})
    return list(contents.entries.values()), contents.rejected


def _read(path: Path) -> bytes:
    return read_bounded(path, MAX_READ)


# the queue


Change = Callable[[dict[tuple[int, str], Entry]], int]
# What a read of the queue returns, in file order.
Entries = list[Entry]


class ExtendQueue:
    """The queue file at ``path``, its lock, and ``<path>.rejected``.

    Reads (:meth:`entries`, :meth:`pending`, :meth:`rejected`) take no lock:
    writers replace the file atomically. Changes take the lock for one
    read-modify-write each. The ``*_async`` twins wait for the lock with
    ``asyncio.sleep``; the file I/O itself is a few small syscalls.
    """

    def __init__(self, path: Path, *, lock: Lock | None = None, max_bytes: int = MAX_BYTES,
                 lock_timeout: float = DEFAULT_TIMEOUT) -> None:
        self.path = path
        self.rejected_path = path.with_name(path.name + ".rejected")
        self.lock = lock if lock is not None else queue_lock(path)
        self.max_bytes = max_bytes
        self.lock_timeout = lock_timeout
        self._swept = False
        self._cache: ParseCache = {}

    def __repr__(self) -> str:
        return f"ExtendQueue({str(self.path)!r})"

    # -- reads

    def _load(self) -> Contents:
        return parse_contents(_read(self.path), int(time.time()), self._cache)

    def entries(self) -> Entries:
        """Every queued entry, in file order."""
        return list(self._load().entries.values())

    def pending(self, predicate: Callable[[Entry], bool]) -> Entries:
        """A snapshot of the entries ``predicate`` accepts; removes nothing."""
        return [e for e in self.entries() if predicate(e)]

    def rejected(self) -> list[RejectedLine]:
        """Lines moved out of the queue because they did not parse, oldest first."""
        data = _read(self.rejected_path)
        return [RejectedLine.from_json(r) for r in data.split(b"\n") if r.strip()]

    # -- changes

    def _apply(self, change: Change, *, grows: bool) -> int:
        """One read-modify-write; the caller holds the lock."""
        if not self._swept:
            remove_leftover_temporaries(self.path)
            self._swept = True
        cur = self._load()
        entries = dict(cur.entries)
        result = change(entries)
        data = render_keeping(entries.values(), cur)
        if (grows and len(data) > self.max_bytes
                and len(data) > len(render_keeping(cur.entries.values(), cur))):
            raise QueueFullError(
                f"queue {self.path} would grow to {len(data)} bytes, past its bound of "
                f"{self.max_bytes} (pmxcfs refuses files over 1 MiB): nothing was queued, "
                "nothing queued before was changed")
        if cur.rejected:
            self._move_rejected(cur.rejected)
        if data != cur.raw:
            write_atomically(self.path, data)
        return result

    def _move_rejected(self, lines: Sequence[RejectedLine]) -> None:
        for line in lines[:_LOG_REJECTED_LINES]:
            log.warning("queue %s: moved a malformed line to %s (%s): %.80s", self.path,
                        self.rejected_path, line.error, line.text)
        if len(lines) > _LOG_REJECTED_LINES:
            log.warning("queue %s: moved %d more malformed lines to %s", self.path,
                        len(lines) - _LOG_REJECTED_LINES, self.rejected_path)
        old = [r for r in _read(self.rejected_path).split(b"\n") if r.strip()]
        records = old + [line.to_json().encode("ascii") for line in lines]
        total = sum(len(r) + 1 for r in records)
        dropped = 0
        while records and total > self.max_bytes:
            total -= len(records[0]) + 1
            records.pop(0)
            dropped += 1
        if dropped:
            log.warning("rejected file %s would pass its bound of %d bytes: dropped its %d "
                        "oldest records", self.rejected_path, self.max_bytes, dropped)
        # Written before the queue: a crash in between duplicates a rejected
        # line in the rejected file, it never loses one.
        write_atomically(self.rejected_path, b"".join(r + b"\n" for r in records))

    def _run(self, change: Change, *, grows: bool = False) -> int:
        with self.lock.acquire(self.lock_timeout):
            return self._apply(change, grows=grows)

    async def _run_async(self, change: Change, *, grows: bool = False) -> int:
        async with self.lock.acquire_async(self.lock_timeout):
            return self._apply(change, grows=grows)

    def append(self, entries: Sequence[Entry]) -> None:
        """Queue ``entries``, merging each into the line for its drive if there is one.

        Raises :class:`QueueFullError` (and changes nothing) if the file would
        grow past ``max_bytes``.
        """
        self._run(_appender(entries), grows=True)

    def complete(self, entries: Sequence[Entry]) -> int:
        """Remove each line still equal to the given entry; returns how many went.

        A line that merged another event since the snapshot stays queued.
        """
        return self._run(_completer(entries))

    def remove(self, keys: Sequence[tuple[int, str]]) -> int:
        """Remove the lines of these drives whatever they hold; returns how many went."""
        return self._run(_remover(keys))

    def flush(self) -> int:
        """Remove every line; returns how many went. The rejected file stays."""
        return self._run(_flusher)

    async def entries_async(self) -> Entries:
        return self.entries()

    async def append_async(self, entries: Sequence[Entry]) -> None:
        await self._run_async(_appender(entries), grows=True)

    async def complete_async(self, entries: Sequence[Entry]) -> int:
        return await self._run_async(_completer(entries))


def _appender(new: Sequence[Entry]) -> Change:
    batch = list(new)

    def change(entries: dict[tuple[int, str], Entry]) -> int:
        now = int(time.time())
        for entry in batch:
            if entry.ts is None:
                entry = replace(entry, ts=now)
            old = entries.get(entry.key)
            if old is not None:
                entries[entry.key] = old.merged(entry)
            else:
                entries[entry.key] = (entry if entry.id is not None
                                      else replace(entry, id=secrets.token_hex(4)))
        return len(batch)

    return change


def _completer(done: Sequence[Entry]) -> Change:
    batch = list(done)

    def change(entries: dict[tuple[int, str], Entry]) -> int:
        removed = 0
        for entry in batch:
            if entries.get(entry.key) == entry:
                del entries[entry.key]
                removed += 1
        return removed

    return change


def _remover(keys: Sequence[tuple[int, str]]) -> Change:
    batch = list(keys)

    def change(entries: dict[tuple[int, str], Entry]) -> int:
        return sum(1 for key in batch if entries.pop(key, None) is not None)

    return change


def _flusher(entries: dict[tuple[int, str], Entry]) -> int:
    count = len(entries)
    entries.clear()
    return count


__all__ = [
    "MAX_BYTES", "MAX_LINE", "MAX_READ", "MAX_REJECTED_LINE", "N_MAX", "VMID_MAX", "VMID_MIN",
    "Entry", "ExtendQueue", "InvalidEntryError", "QueueError", "QueueFullError", "Reason",
    "RejectedLine", "check_block_node", "check_vmid", "parse_key", "parse_queue", "render",
    "write_atomically",
]
