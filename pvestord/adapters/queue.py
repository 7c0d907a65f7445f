"""The cluster extend queue: one file, one drive a line, shared by every node.

Format (UTF-8 text, one entry a line, fields separated by blanks)::

    VMID:NODE-NAME [reason=threshold|nospace|arm|manual] [origin=NODE] [ts=UNIX]
                   [n=N] [id=HEX] [key=value ...]

The original proposal's plain ``101:drive-scsi0`` lines are entries with the
default reason ``threshold``. ``origin`` is the cluster node that queued it,
``ts`` the time of the oldest event merged into it, ``n`` how many events it
stands for (written when more than one), ``id`` a random tag given when the
line is created. Unknown ``key=value`` fields are kept as they are: a newer
writer's fields survive an older reader.

Rules:

* one line per ``VMID:NODE-NAME``: a second event for a queued drive merges
  into its line (the strongest reason wins, ``nospace`` > ``threshold`` >
  ``manual`` > ``arm``; the oldest ``ts`` wins; ``n`` adds up), so the file
  stays small however many events arrive;
* an entry leaves the queue only when its work is done or moot. The daemon
  reads a snapshot (:meth:`ExtendQueue.pending`), works, then calls
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

import base64
import builtins
import contextlib
import hashlib
import json
import logging
import os
import re
import secrets
import stat
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from pvestord.adapters.locks import DEFAULT_TIMEOUT, Lock, queue_lock
from pvestord.errors import PvestordError
from pvestord.policy.reason import Reason

log = logging.getLogger(__name__)

#: pmxcfs refuses files larger than this (MEMDB_MAX_FILE_SIZE).
MAX_BYTES = 1024 * 1024
#: Longest line we accept as an entry; longer lines are rejected.
MAX_LINE = 1024
#: Longest part of a rejected line kept in the rejected file.
MAX_REJECTED_LINE = 4096
#: We read at most this much of a queue file; a larger one is refused unread.
MAX_READ = 64 * MAX_BYTES
#: Proxmox's VMID range (PVE::JSONSchema pve_verify_vmid: ``^[1-9][0-9]{2,8}$``).
VMID_MIN, VMID_MAX = 100, 999_999_999
#: Largest ``n`` (and ``ts``) a line can hold: a signed 64-bit integer, as
#: Proxmox's Perl tools would read it.
N_MAX = 2**63 - 1
#: How many rejected lines are logged one by one before a summary.
_LOG_REJECTED_LINES = 20

# QEMU's id_wellformed(): a letter, then letters, digits, '-', '.', '_';
# BlockDriverState.node_name holds 31 characters.
_NODE_NAME = re.compile(r"[A-Za-z][A-Za-z0-9._-]{0,30}")
# A Proxmox node name is a DNS label (PVE::JSONSchema pve-node).
_ORIGIN = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?")
_ID = re.compile(r"[0-9a-f]{1,32}")
_EXTRA_KEY = re.compile(r"[a-z][a-z0-9_-]{0,31}")
_EXTRA_VALUE = re.compile(r"[\x21-\x7e]{1,256}")
_UINT = re.compile(r"[0-9]{1,19}")
_KNOWN_FIELDS = ("reason", "origin", "ts", "n", "id")
_NOT_PRINTABLE_ASCII = re.compile(r"[^\t\x20-\x7e]")


class QueueError(PvestordError):
    """The queue file cannot be read or written as asked."""


class QueueFullError(QueueError):
    """An append would grow the queue past its bound; nothing was changed."""


class InvalidEntryError(QueueError, ValueError):
    """A VMID, node-name or field that the queue format does not allow."""


def check_vmid(vmid: int) -> int:
    if isinstance(vmid, bool) or not isinstance(vmid, int) or not VMID_MIN <= vmid <= VMID_MAX:
        raise InvalidEntryError(f"invalid VMID {vmid!r}: must be {VMID_MIN}..{VMID_MAX}")
    return vmid


def check_node_name(name: str) -> str:
    if not isinstance(name, str) or not _NODE_NAME.fullmatch(name):
        shown = name if isinstance(name, str) and len(name) <= 40 else f"{str(name)[:40]!r}..."
        raise InvalidEntryError(
            f"invalid node-name {shown!r}: QEMU node names are at most 31 letters, digits, "
            "'-', '.', '_', starting with a letter")
    return name


def parse_key(text: str) -> tuple[int, str]:
    """``"101:drive-scsi0"`` -> ``(101, "drive-scsi0")``; :class:`InvalidEntryError` otherwise."""
    vmid_text, sep, name = text.partition(":")
    if not sep or not re.fullmatch(r"[0-9]{1,10}", vmid_text):
        raise InvalidEntryError(f"expected VMID:NODE-NAME, got {text[:60]!r}")
    return check_vmid(int(vmid_text)), check_node_name(name)


@dataclass(frozen=True)
class Entry:
    """One queued drive. Equality covers every field: :meth:`ExtendQueue.complete`
    relies on it to tell an untouched line from one that merged a new event."""

    vmid: int
    node_name: str
    reason: Reason = Reason.THRESHOLD
    origin: str | None = None
    ts: int | None = None
    n: int = 1
    id: str | None = None
    extra: tuple[tuple[str, str], ...] = field(default=())

    def __post_init__(self) -> None:
        check_vmid(self.vmid)
        check_node_name(self.node_name)
        if not isinstance(self.reason, Reason):
            raise InvalidEntryError(f"invalid reason {self.reason!r}")
        if self.origin is not None and not _ORIGIN.fullmatch(self.origin):
            raise InvalidEntryError(f"invalid origin {self.origin[:70]!r}: not a node name")
        if self.ts is not None and (isinstance(self.ts, bool) or not 0 <= self.ts <= N_MAX):
            raise InvalidEntryError(f"invalid ts {self.ts!r}: not a unix time")
        if isinstance(self.n, bool) or not 1 <= self.n <= N_MAX:
            raise InvalidEntryError(f"invalid n {self.n!r}: must be a positive count")
        if self.id is not None and not _ID.fullmatch(self.id):
            raise InvalidEntryError(f"invalid id {self.id[:40]!r}: hexadecimal only")
        keys = set(_KNOWN_FIELDS)
        for key, value in self.extra:
            if key in keys or not _EXTRA_KEY.fullmatch(key):
                raise InvalidEntryError(f"invalid or repeated field name {key[:40]!r}")
            if not _EXTRA_VALUE.fullmatch(value):
                raise InvalidEntryError(f"invalid value for field {key!r}")
            keys.add(key)

    @property
    def key(self) -> tuple[int, str]:
        return (self.vmid, self.node_name)

    def format(self) -> str:
        """The entry as one queue line, without the newline."""
        parts = [f"{self.vmid}:{self.node_name}", f"reason={self.reason.value}"]
        if self.origin is not None:
            parts.append(f"origin={self.origin}")
        if self.ts is not None:
            parts.append(f"ts={self.ts}")
        if self.n != 1:
            parts.append(f"n={self.n}")
        if self.id is not None:
            parts.append(f"id={self.id}")
        parts.extend(f"{k}={v}" for k, v in self.extra)
        return " ".join(parts)

    @classmethod
    def parse(cls, line: str) -> Entry:
        """One queue line (surrounding blanks allowed); :class:`InvalidEntryError` if malformed."""
        words = line.split()
        if not words:
            raise InvalidEntryError("empty line")
        vmid, name = parse_key(words[0])
        known: dict[str, str] = {}
        extra: list[tuple[str, str]] = []
        for word in words[1:]:
            key, sep, value = word.partition("=")
            if not sep or not value:
                raise InvalidEntryError(f"expected key=value, got {word[:40]!r}")
            if key in known or any(key == k for k, _ in extra):
                raise InvalidEntryError(f"field {key[:40]!r} given twice")
            if key in _KNOWN_FIELDS:
                known[key] = value
            else:
                extra.append((key, value))
        try:
            reason = Reason(known.get("reason", Reason.THRESHOLD.value))
        except ValueError:
            raise InvalidEntryError(f"unknown reason {known['reason'][:40]!r}") from None
        n = _uint(known, "n")
        return cls(vmid, name, reason, known.get("origin"), _uint(known, "ts"),
                   1 if n is None else n, known.get("id"), tuple(extra))

    def merged(self, other: Entry) -> Entry:
        """This line after ``other`` (an event for the same drive) merged into it.

        Commutative and associative in every field but ``id`` and ``extra``,
        where this line's values win: the strongest reason, its origin (ties
        broken by the node name, a known one first), the oldest known ts, and
        the sum of the counts (at most :data:`N_MAX`).
        """
        if other.key != self.key:
            raise InvalidEntryError(f"cannot merge {other.key} into {self.key}")
        strongest = max(self.reason.strength, other.reason.strength)
        winner = min((e for e in (self, other) if e.reason.strength == strongest), key=_rank)
        known_ts = [t for t in (self.ts, other.ts) if t is not None]
        have = {k for k, _ in self.extra}
        return replace(
            self,
            reason=winner.reason,
            origin=winner.origin,
            ts=min(known_ts) if known_ts else None,
            # Saturated: two hostile counts must not make the file unreadable.
            n=min(N_MAX, self.n + other.n),
            id=self.id if self.id is not None else other.id,
            extra=self.extra + tuple((k, v) for k, v in other.extra if k not in have),
        )


def _rank(entry: Entry) -> tuple[bool, str]:
    # Only fields that merging does not change, so that merging is associative.
    return (entry.origin is None, entry.origin or "")


def _uint(fields: dict[str, str], key: str) -> int | None:
    value = fields.get(key)
    if value is None:
        return None
    if not _UINT.fullmatch(value):
        raise InvalidEntryError(f"{key}={value[:40]!r} is not a non-negative integer")
    return int(value)


@dataclass(frozen=True)
class RejectedLine:
    """A queue line that did not parse, as kept in ``<queue>.rejected``."""

    raw: bytes          # the line (its first 4 KiB when truncated)
    error: str          # why it was rejected
    ts: int             # when it was moved out of the queue
    length: int         # the full line's length in bytes
    sha256: str         # of the full line

    @property
    def truncated(self) -> bool:
        return len(self.raw) < self.length

    @property
    def text(self) -> str:
        """The line for display: undecodable bytes as backslash escapes."""
        return self.raw.decode("utf-8", "backslashreplace")

    def to_json(self) -> str:
        return json.dumps({"ts": self.ts, "error": self.error, "length": self.length,
                           "sha256": self.sha256, "truncated": self.truncated,
                           "line_b64": base64.b64encode(self.raw).decode("ascii"),
                           "line": self.text}, sort_keys=True)

    @classmethod
    def from_json(cls, record: bytes) -> RejectedLine:
        try:
            obj = json.loads(record)
            raw = base64.b64decode(obj["line_b64"], validate=True)
            return cls(raw, str(obj["error"]), int(obj["ts"]), int(obj["length"]),
                       str(obj["sha256"]))
        except (ValueError, KeyError, TypeError, OverflowError, RecursionError):
            # Someone edited the rejected file: show the record itself. (A ts of
            # 1e999 overflows int(); deep nesting exhausts the JSON decoder.)
            return cls(record, "unreadable record in the rejected file", 0, len(record),
                       hashlib.sha256(record).hexdigest())


def _reject(raw: bytes, error: str, now: int) -> RejectedLine:
    return RejectedLine(raw[:MAX_REJECTED_LINE], error, now, len(raw),
                        hashlib.sha256(raw).hexdigest())


def _parse_line(raw: bytes) -> Entry:
    if len(raw) > MAX_LINE:
        raise InvalidEntryError(f"line of {len(raw)} bytes, longer than {MAX_LINE}")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidEntryError("not UTF-8 text") from None
    if _NOT_PRINTABLE_ASCII.search(text):
        raise InvalidEntryError("control or non-ASCII characters in line")
    return Entry.parse(text)


@dataclass
class _Contents:
    raw: bytes
    entries: dict[tuple[int, str], Entry]
    rejected: list[RejectedLine]
    #: The file's own line for each entry that came from exactly one line:
    #: rewritten as it was unless the entry changes.
    lines: dict[tuple[int, str], bytes]


#: Parsed lines, shared by the reads of one queue: the file changes by a few
#: lines per write, so most lines parse once per process.
_ParseCache = dict[bytes, "Entry | str"]
_PARSE_CACHE_MAX = 65536


def parse_queue(data: bytes, now: int | None = None) -> tuple[list[Entry], list[RejectedLine]]:
    """Every entry in file order (duplicates merged) and every rejected line."""
    contents = _parse(data, int(time.time()) if now is None else now, {})
    return list(contents.entries.values()), contents.rejected


def _parse(data: bytes, now: int, cache: _ParseCache) -> _Contents:
    if len(cache) > _PARSE_CACHE_MAX:
        cache.clear()
    entries: dict[tuple[int, str], Entry] = {}
    lines: dict[tuple[int, str], bytes] = {}
    rejected: list[RejectedLine] = []
    for raw_line in data.split(b"\n"):
        line = raw_line.strip(b" \t\r")
        if not line:
            continue
        parsed = cache.get(line)
        if parsed is None:
            try:
                parsed = _parse_line(line)
            except InvalidEntryError as err:
                parsed = str(err)
            cache[line] = parsed
        if isinstance(parsed, str):
            rejected.append(_reject(raw_line, parsed, now))
            continue
        old = entries.get(parsed.key)
        if old is None:
            entries[parsed.key] = parsed
            lines[parsed.key] = line
        else:
            entries[parsed.key] = old.merged(parsed)
            lines.pop(parsed.key, None)
    return _Contents(data, entries, rejected, lines)


def _render(entries: Iterable[Entry], before: _Contents) -> bytes:
    out = []
    for entry in entries:
        line = before.lines.get(entry.key)
        if line is None or before.entries.get(entry.key) is not entry:
            line = entry.format().encode("utf-8")
        out.append(line + b"\n")
    return b"".join(out)


def render(entries: Iterable[Entry]) -> bytes:
    """The queue file for these entries."""
    return b"".join(e.format().encode("utf-8") + b"\n" for e in entries)


# ---------------------------------------------------------------------------
# files


def _refuse_symlink(path: Path) -> None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as err:
        raise QueueError(f"cannot stat {path}: {err.strerror}") from err
    if stat.S_ISLNK(st.st_mode):
        raise QueueError(f"{path} is a symbolic link; refusing to follow it (a link would "
                         "let its owner choose where root writes); replace it with a file")
    if not stat.S_ISREG(st.st_mode):
        raise QueueError(f"{path} is not a regular file")


def _read(path: Path) -> bytes:
    _refuse_symlink(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return b""
    except OSError as err:
        raise QueueError(f"cannot open {path}: {err.strerror}") from err
    try:
        size = os.fstat(fd).st_size
        if size > MAX_READ:
            raise QueueError(f"{path} is {size} bytes, far beyond the queue's bound; "
                             "refusing to read it: move it aside and check who writes it")
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)
    except OSError as err:
        raise QueueError(f"cannot read {path}: {err.strerror}") from err
    finally:
        os.close(fd)


def write_atomically(path: Path, data: bytes) -> None:
    """Temporary file in the same directory, fsync, rename over ``path``, fsync the directory.

    Also what the node reports (:mod:`pvestord.engine.nodereport`) are written with.
    """
    _refuse_symlink(path)
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as err:
        raise QueueError(f"cannot create a temporary file beside {path}: {err.strerror}") from err
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            with contextlib.suppress(OSError):  # pmxcfs decides modes itself
                os.fchmod(fd, 0o644)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, path)
    except OSError as err:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise QueueError(f"cannot write {path}: {err.strerror}") from err
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    try:
        dfd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        os.fsync(dfd)
    except OSError as err:  # some FUSE file systems cannot fsync a directory
        log.debug("fsync of %s: %s", path.parent, err.strerror)
    finally:
        os.close(dfd)


def _remove_leftover_temporaries(path: Path) -> None:
    # Called under the queue lock: every writer holds it, so any temporary
    # file of ours that exists now was left by a writer that died.
    prefix = f".{path.name}."
    try:
        names = [e.name for e in os.scandir(path.parent)
                 if e.name.startswith(prefix) and e.name.endswith(".tmp")]
    except OSError:
        return
    for name in names:
        with contextlib.suppress(OSError):
            os.unlink(path.parent / name)
            log.info("removed %s, left by a writer that died", path.parent / name)


# ---------------------------------------------------------------------------
# the queue


Change = Callable[[dict[tuple[int, str], Entry]], int]
# ExtendQueue.list shadows the builtin inside the class body.
Entries = list[Entry]


class ExtendQueue:
    """The queue file at ``path``, its lock, and ``<path>.rejected``.

    Reads (:meth:`list`, :meth:`pending`, :meth:`rejected`) take no lock:
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
        self._cache: _ParseCache = {}

    def __repr__(self) -> str:
        return f"ExtendQueue({str(self.path)!r})"

    # -- reads

    def _load(self) -> _Contents:
        return _parse(_read(self.path), int(time.time()), self._cache)

    def list(self) -> Entries:
        """Every queued entry, in file order."""
        return list(self._load().entries.values())

    def pending(self, predicate: Callable[[Entry], bool]) -> Entries:
        """A snapshot of the entries ``predicate`` accepts; removes nothing."""
        return [e for e in self.list() if predicate(e)]

    def rejected(self) -> builtins.list[RejectedLine]:
        """Lines moved out of the queue because they did not parse, oldest first."""
        data = _read(self.rejected_path)
        return [RejectedLine.from_json(r) for r in data.split(b"\n") if r.strip()]

    # -- changes

    def _apply(self, change: Change, *, grows: bool) -> int:
        """One read-modify-write; the caller holds the lock."""
        if not self._swept:
            _remove_leftover_temporaries(self.path)
            self._swept = True
        cur = self._load()
        entries = dict(cur.entries)
        result = change(entries)
        data = _render(entries.values(), cur)
        if grows and len(data) > self.max_bytes and len(data) > len(_render(cur.entries.values(),
                                                                            cur)):
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

    async def list_async(self) -> Entries:
        return self.list()

    async def pending_async(self, predicate: Callable[[Entry], bool]) -> Entries:
        return self.pending(predicate)

    async def append_async(self, entries: Sequence[Entry]) -> None:
        await self._run_async(_appender(entries), grows=True)

    async def complete_async(self, entries: Sequence[Entry]) -> int:
        return await self._run_async(_completer(entries))

    async def remove_async(self, keys: Sequence[tuple[int, str]]) -> int:
        return await self._run_async(_remover(keys))

    async def flush_async(self) -> int:
        return await self._run_async(_flusher)


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
