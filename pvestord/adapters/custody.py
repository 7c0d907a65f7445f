"""Custody of the storage locks while an ``lvm`` that SIGKILL did not end
lives, across a restart of the daemon.

An ``lvm`` in D state (its SAN path queues I/O) may write the VG's metadata
whenever its I/O completes, computed from the sequence number it read before:
until it has gone, no other node may change that VG. So the storage locks it
ran under are kept, renewed, by a custodian (:class:`pvestord.adapters.locks.VgLock`).

The custodian is a task of the daemon, and the daemon may stop or be
restarted (an upgrade, the watchdog) while the stuck process lives on: a
process in D state outlives SIGKILL, and systemd's stop leaves it behind
("Processes still around after SIGKILL"). If the locks were left to expire,
pmxcfs would hand them to another node 120 s later while the stuck ``lvm``
could still write. So custody is written down, in a record under ``/run``
beside the VG marks (a reboot clears both, as it clears the process):

- which processes: pid *and* start time (``/proc/<pid>/stat`` field 22), so
  that a pid reused after the stuck process ended is not taken for it;
- which locks, and for a lock directory which one (inode, and mtime as of its
  last renewal), so that the next daemon takes over that very directory and
  not one a new holder made after it expired.

The record is written when custody starts, kept current while the custodian
renews (a daemon killed without warning leaves a record at most
:data:`CUSTODY_POLL` behind its last renewal), renewed and written once more
when the daemon stops, and removed when the stuck processes are gone. The
next daemon reads every record at start (:func:`resume`): processes gone,
record removed; otherwise it takes the locks over (or, if a lock directory
expired or was taken meanwhile, waits for it as any holder would and then
keeps it) and keeps them until the processes are gone.

What is not covered: between a daemon's end and the next one's start the
lock directories are not renewed; a next daemon that starts later than the
lock lifetime (pmxcfs: 120 s) finds them expired and possibly taken by
another node. ``Restart=on-failure`` with ``RestartSec=2s`` keeps that gap
short; a daemon stopped by hand (``systemctl stop``) with a stuck lvm leaves
the VG to the operator (the VG mark and an error in the journal say so).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pvestord.adapters.command import StuckProcess
from pvestord.adapters.lockdir import LockDirLock, held_directory
from pvestord.adapters.lockflock import FlockLock
from pvestord.adapters.lockheld import DEFAULT_TIMEOUT, Held, HeldAll, Lock, LockError
from pvestord.adapters.vghealth import VgMarks

log = logging.getLogger(__name__)

#: How often a custodian looks whether the stuck command has gone (and
#: brings the record up to date with the last renewal).
CUSTODY_POLL = 1.0
#: A custody record is no bigger than this (a few pids and locks).
RECORD_LIMIT = 64 * 1024

#: Custodians at work, kept referenced until they are done.
CUSTODIANS: set[asyncio.Task[None]] = set()
#: The custodian of each VG kept in this process.
_KEEPING: dict[str, asyncio.Task[None]] = {}


def _register(vg: str, task: asyncio.Task[None]) -> None:
    CUSTODIANS.add(task)
    _KEEPING[vg] = task

    def done(ended: asyncio.Task[None]) -> None:
        CUSTODIANS.discard(ended)
        if _KEEPING.get(vg) is ended:
            del _KEEPING[vg]

    task.add_done_callback(done)


def _kept_here(vg: str) -> bool:
    task = _KEEPING.get(vg)
    return task is not None and not task.done() and task.get_loop() is asyncio.get_running_loop()


def custody_folder(health: VgMarks) -> Path:
    """Where the custody records live: beside the VG marks (``/run/pvestord/vg-custody``)."""
    return health.folder.parent / "vg-custody"


@dataclass(frozen=True)
class LockRecord:
    """One lock kept in custody: a lock directory (``dir``: ``path`` is the
    directory; ``ino`` and ``mtime_ns`` which one) or a flock (``flock``:
    ``path`` is the lock file)."""

    kind: str
    path: str
    lifetime: float | None = None
    ino: int | None = None
    mtime_ns: int | None = None


@dataclass(frozen=True)
class CustodyRecord:
    """What a custodian keeps, and for whom."""

    vg: str
    command: tuple[str, ...]
    stuck: tuple[StuckProcess, ...]
    locks: tuple[LockRecord, ...]
    since: float

    def alive(self) -> list[StuckProcess]:
        return [process for process in self.stuck if process.alive()]

    @property
    def pids(self) -> str:
        return ", ".join(str(p.pid) for p in self.stuck) or "unknown"

    def to_json(self) -> str:
        return json.dumps({
            "vg": self.vg, "command": list(self.command), "since": self.since,
            "stuck": [[p.pid, p.start_ticks] for p in self.stuck],
            "locks": [{k: v for k, v in vars(lock).items() if v is not None}
                      for lock in self.locks]}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> CustodyRecord:
        data: Any = json.loads(text)
        return cls(
            vg=str(data["vg"]), command=tuple(str(a) for a in data["command"]),
            since=float(data["since"]),
            stuck=tuple(StuckProcess(int(pid), int(ticks)) for pid, ticks in data["stuck"]),
            locks=tuple(LockRecord(
                kind=str(lock["kind"]), path=str(lock["path"]),
                lifetime=None if lock.get("lifetime") is None else float(lock["lifetime"]),
                ino=None if lock.get("ino") is None else int(lock["ino"]),
                mtime_ns=None if lock.get("mtime_ns") is None else int(lock["mtime_ns"]))
                for lock in data["locks"]))


class CustodyBook:
    """The custody records under one folder, one file per VG."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def _path(self, vg: str) -> Path:
        # The VG name was checked by the mark that always comes first
        # (VgMarks.mark); a name with a slash never gets here.
        if "/" in vg or vg in ("", ".", ".."):
            raise LockError(f"not a VG name: {vg!r}")
        return self.folder / vg

    def write(self, record: CustodyRecord) -> None:
        path = self._path(record.vg)
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(f".{os.getpid()}-{record.vg}")
        temporary.write_text(record.to_json() + "\n")
        os.replace(temporary, path)

    def clear(self, vg: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._path(vg).unlink()

    def records(self) -> list[CustodyRecord]:
        """Every readable record; an unreadable one is logged and left for
        the operator (it is small, and under /run: a reboot clears it)."""
        try:
            names = sorted(os.listdir(self.folder))
        except FileNotFoundError:
            return []
        found = []
        for name in names:
            if name.startswith("."):
                continue
            path = self.folder / name
            try:
                with path.open() as stream:
                    text = stream.read(RECORD_LIMIT)
                found.append(CustodyRecord.from_json(text))
            except (OSError, ValueError, KeyError, TypeError) as err:
                log.error("cannot read custody record %s: %s; the VG it names is not "
                          "guarded by this daemon", path, err)
        return found


def describe(lock: Lock, held: Held) -> LockRecord | None:
    """How to take ``lock`` (held as ``held``) again after a restart; None for
    a kind of lock we cannot (a stand-in in tests)."""
    if isinstance(lock, LockDirLock):
        owned = held_directory(held)
        return LockRecord("dir", str(lock.path), lock.lifetime,
                          *(owned if owned is not None else (None, None)))
    if isinstance(lock, FlockLock):
        return LockRecord("flock", str(lock.path))
    return None


def record_of(vg: str, command: Sequence[str], stuck: Sequence[StuckProcess],
              locks: Sequence[Lock], held: HeldAll, since: float) -> CustodyRecord:
    described = (describe(lock, one) for lock, one in zip(locks, held.helds, strict=True))
    return CustodyRecord(vg, tuple(command), tuple(stuck),
                         tuple(r for r in described if r is not None), since)


async def keep(name: str, stack: contextlib.AsyncExitStack, locks: Sequence[Lock],
               held: HeldAll, record: CustodyRecord, book: CustodyBook | None) -> None:
    """Keep ``stack``'s locks (their renewal runs on) until the processes of
    ``record`` have gone, with the record kept current in ``book``; at our own
    shutdown, renew once more, write the record for the next daemon and leave
    the locks in place."""
    started = time.monotonic()
    written = ""

    def write() -> None:
        nonlocal written, record
        record = record_of(record.vg, record.command, record.stuck, locks, held, record.since)
        text = record.to_json()
        if book is not None and text != written:
            try:
                book.write(record)
            except OSError as err:
                log.error("cannot write the custody record of VG %s: %s; a restart of "
                          "pvestord would not keep lock %s", record.vg, err, name)
            else:
                written = text

    try:
        held.abandon()  # until the processes are gone (see start)
        write()
        # Polled: the stuck processes are no children of ours to wait for.
        while record.alive():
            await asyncio.sleep(CUSTODY_POLL)
            write()
    except asyncio.CancelledError:
        # Our own shutdown: the next daemon takes custody over from the record.
        # Renewed now, so that it has the whole lifetime to start in.
        for lock, one in zip(locks, held.helds, strict=True):
            if isinstance(lock, LockDirLock):
                with contextlib.suppress(Exception):
                    lock.renew(one)  # type: ignore[arg-type]
        write()
        held.abandon()
        log.error("stopping while pid %s may still act: lock %s left in place for the next "
                  "pvestord to keep (custody record in %s); it expires %s after its last "
                  "renewal if none starts", record.pids, name,
                  book.folder if book is not None else "nowhere",
                  _lifetimes(record))
        await stack.aclose()
        raise
    log.warning("pid %s ended %.0f s after custody began here: releasing lock %s",
                record.pids, time.monotonic() - started, name)
    # The record first: the processes are gone, so a lock left behind by a
    # crash right here only has to expire.
    if book is not None:
        book.clear(record.vg)
    held.reclaim()
    await stack.aclose()


def _lifetimes(record: CustodyRecord) -> str:
    lives = sorted({lock.lifetime for lock in record.locks if lock.lifetime is not None})
    return "/".join(f"{life:g} s" for life in lives) or "never (flock: at our exit)"


def start(name: str, stack: contextlib.AsyncExitStack, locks: Sequence[Lock], held: HeldAll,
          record: CustodyRecord, book: CustodyBook | None) -> asyncio.Task[None]:
    """Run :func:`keep` as a custodian task, referenced until it is done.

    Abandoned and written down at once, before the task first runs: a task
    cancelled before its start never runs its body, and the holds' clean-up
    would then release the locks under the stuck process.
    """
    held.abandon()
    if book is not None:
        try:
            book.write(record)
        except OSError as err:
            log.error("cannot write the custody record of VG %s: %s", record.vg, err)
    task = asyncio.create_task(keep(name, stack, locks, held, record, book),
                               name=f"custody of {record.vg}")
    _register(record.vg, task)
    return task


def lock_of(record: LockRecord) -> Lock:
    if record.kind == "dir":
        path = Path(record.path)
        return LockDirLock(path.parent, path.name,
                           lifetime=record.lifetime if record.lifetime is not None else 120.0)
    if record.kind == "flock":
        return FlockLock(Path(record.path))
    raise LockError(f"unknown kind of lock {record.kind!r} in a custody record")


async def _take_over(stack: contextlib.AsyncExitStack, lock: Lock, record: LockRecord,
                     custody: CustodyRecord) -> Held:
    """The lock as the last daemon left it, or, if it was lost meanwhile,
    as soon as it can be had (while the stuck processes live); held by ``stack``."""
    if isinstance(lock, LockDirLock) and record.ino is not None and record.mtime_ns is not None:
        try:
            held = await stack.enter_async_context(
                lock.adopt_async(record.ino, record.mtime_ns))
        except LockError as err:
            log.error("%s while pid %s may still act: another node may have changed VG %s "
                      "meanwhile; taking the lock again as soon as it can be had",
                      err, custody.pids, custody.vg)
        else:
            log.warning("took over lock %s from the last pvestord: pid %s may still act",
                        lock.name, custody.pids)
            return held
    while True:
        try:
            return await stack.enter_async_context(lock.acquire_async(DEFAULT_TIMEOUT))
        except LockError as err:
            if not custody.alive():
                raise
            log.warning("waiting for lock %s to keep it while pid %s may still act: %s",
                        lock.name, custody.pids, err)


async def _resumed(record: CustodyRecord, book: CustodyBook) -> None:
    locks = [lock_of(one) for one in record.locks]
    name = f"VG {record.vg}: " + ", ".join(lock.name for lock in locks)
    stack = contextlib.AsyncExitStack()
    try:
        helds = [await _take_over(stack, lock, one, record)
                 for lock, one in zip(locks, record.locks, strict=True)]
    except BaseException as err:
        await stack.aclose()
        if isinstance(err, LockError) and not record.alive():
            log.warning("pid %s ended while its lock was being taken again", record.pids)
            book.clear(record.vg)
            return
        raise
    await keep(name, stack, locks, HeldAll(name, helds), record, book)


def resume(health: VgMarks) -> list[asyncio.Task[None]]:
    """Take custody of every stuck process written down that no custodian of
    ours keeps (the last daemon's, a command line's), and forget the ones
    that have gone meanwhile: at daemon start, and again every reconcile
    (the command line cannot keep a lock once it has exited)."""
    book = CustodyBook(custody_folder(health))
    tasks = []
    for record in book.records():
        if _kept_here(record.vg):
            continue
        if not record.alive():
            log.warning("pid %s (%s), kept in custody before, has ended: custody "
                        "of VG %s over (the VG mark stays until an operator removes it)",
                        record.pids, " ".join(record.command[:2]), record.vg)
            book.clear(record.vg)
            continue
        log.error("pid %s (%s), which SIGKILL did not end, may still act on VG %s: keeping "
                  "its storage locks, as the process that ran it did", record.pids,
                  " ".join(record.command[:2]), record.vg)
        task = asyncio.create_task(_resumed(record, book), name=f"custody of {record.vg}")
        _register(record.vg, task)
        tasks.append(task)
    return tasks


async def hand_over() -> None:
    """At daemon stop: every custodian renews its locks once more, writes its
    record for the next daemon and leaves the locks in place."""
    loop = asyncio.get_running_loop()
    tasks = [task for task in CUSTODIANS if task.get_loop() is loop]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def custodians_done(timeout: float) -> bool:  # noqa: ASYNC109 - a bound, not a deadline
    """Wait up to ``timeout`` for every custodian; True if none is left."""
    tasks = list(CUSTODIANS)
    if not tasks:
        return True
    _, pending = await asyncio.wait(tasks, timeout=timeout)
    return not pending
