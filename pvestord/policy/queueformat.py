"""The extend queue's line format, pure: parsing, rendering, merging, and the
record of a line that did not parse. The file, its lock and its changes are
:mod:`pvestord.adapters.queue`.

Format (UTF-8 text, one entry a line, fields separated by blanks)::

    VMID:BLOCK-NODE [reason=threshold|nospace|job|arm|manual] [origin=NODE] [ts=UNIX]
                   [n=N] [id=HEX] [key=value ...]

The original proposal's plain ``101:drive-scsi0`` lines are entries with the
default reason ``threshold``. ``origin`` is the cluster node that queued it,
``ts`` the time of the oldest event merged into it, ``n`` how many events it
stands for (written when more than one), ``id`` a random tag given when the
line is created. Unknown ``key=value`` fields are kept as they are: a newer
writer's fields survive an older reader.

One line per ``VMID:BLOCK-NODE``: a second event for a queued drive merges
into its line (the strongest reason wins, ``nospace`` > ``threshold`` >
``job`` > ``manual`` > ``arm``; the oldest ``ts`` wins; ``n`` adds up). A
``job`` entry names a block job by its id instead of a node. A rejected line
longer than 4 KiB is kept truncated, with its length and SHA-256.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from pvestord.errors import PvestordError
from pvestord.policy.proxmox import VMID_MAX, VMID_MIN, is_node_name, is_vmid
from pvestord.policy.reason import Reason

#: Longest line we accept as an entry; longer lines are rejected.
MAX_LINE = 1024
#: Longest part of a rejected line kept in the rejected file.
MAX_REJECTED_LINE = 4096
#: Largest ``n`` (and ``ts``) a line can hold: a signed 64-bit integer, as
#: Proxmox's Perl tools would read it.
N_MAX = 2**63 - 1

# QEMU's id_wellformed(): a letter, then letters, digits, '-', '.', '_';
# BlockDriverState.block_node holds 31 characters. Or a name QEMU gave a node
# itself (id_generate(): "#block" and a counter), as it does for a backing
# image it opened on its own: an active commit's base, a chain started
# without names. A '#' is safe in a line (fields are split on whitespace).
_NODE_NAME = re.compile(r"[A-Za-z][A-Za-z0-9._-]{0,30}|#block[0-9]{1,25}")
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


class InvalidEntryError(QueueError):
    """A VMID, node-name or field that the queue format does not allow."""


def check_vmid(vmid: int) -> int:
    if not is_vmid(vmid):
        raise InvalidEntryError(f"invalid VMID {vmid!r}: must be {VMID_MIN}..{VMID_MAX}")
    return vmid


def check_block_node(name: str) -> str:
    if not isinstance(name, str) or not _NODE_NAME.fullmatch(name):
        shown = name if isinstance(name, str) and len(name) <= 40 else f"{str(name)[:40]!r}..."
        raise InvalidEntryError(
            f"invalid node-name {shown!r}: QEMU node names are at most 31 letters, digits, "
            "'-', '.', '_', starting with a letter, or one QEMU gave itself (#block123)")
    return name


def parse_key(text: str) -> tuple[int, str]:
    """``"101:drive-scsi0"`` -> ``(101, "drive-scsi0")``; :class:`InvalidEntryError` otherwise."""
    vmid_text, sep, name = text.partition(":")
    if not sep or not re.fullmatch(r"[0-9]{1,10}", vmid_text):
        raise InvalidEntryError(f"expected VMID:BLOCK-NODE, got {text[:60]!r}")
    return check_vmid(int(vmid_text)), check_block_node(name)


@dataclass(frozen=True)
class Entry:
    """One queued drive. Equality covers every field: :meth:`ExtendQueue.complete`
    relies on it to tell an untouched line from one that merged a new event."""

    vmid: int
    block_node: str
    reason: Reason = Reason.THRESHOLD
    origin: str | None = None
    ts: int | None = None
    n: int = 1
    id: str | None = None
    extra: tuple[tuple[str, str], ...] = field(default=())

    def __post_init__(self) -> None:
        check_vmid(self.vmid)
        check_block_node(self.block_node)
        if not isinstance(self.reason, Reason):
            raise InvalidEntryError(f"invalid reason {self.reason!r}")
        if self.origin is not None and not is_node_name(self.origin):
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
        return (self.vmid, self.block_node)

    def format(self) -> str:
        """The entry as one queue line, without the newline."""
        parts = [f"{self.vmid}:{self.block_node}", f"reason={self.reason.value}"]
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


def reject(raw: bytes, error: str, now: int) -> RejectedLine:
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
class Contents:
    raw: bytes
    entries: dict[tuple[int, str], Entry]
    rejected: list[RejectedLine]
    #: The file's own line for each entry that came from exactly one line:
    #: rewritten as it was unless the entry changes.
    lines: dict[tuple[int, str], bytes]


#: Parsed lines, shared by the reads of one queue: the file changes by a few
#: lines per write, so most lines parse once per process.
ParseCache = dict[bytes, "Entry | str"]
_PARSE_CACHE_MAX = 65536


def parse_queue(data: bytes, now: int) -> tuple[list[Entry], list[RejectedLine]]:
    """Every entry in file order (duplicates merged) and every rejected line
    (stamped ``now``)."""
    contents = parse_contents(data, now, {})
    return list(contents.entries.values()), contents.rejected


def parse_contents(data: bytes, now: int, cache: ParseCache) -> Contents:
    """The file ``data`` parsed, lines already seen taken from ``cache``."""
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
            rejected.append(reject(raw_line, parsed, now))
            continue
        old = entries.get(parsed.key)
        if old is None:
            entries[parsed.key] = parsed
            lines[parsed.key] = line
        else:
            entries[parsed.key] = old.merged(parsed)
            lines.pop(parsed.key, None)
    return Contents(data, entries, rejected, lines)


def render_keeping(entries: Iterable[Entry], before: Contents) -> bytes:
    """The file for ``entries``, each unchanged entry written as its own line was."""
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
