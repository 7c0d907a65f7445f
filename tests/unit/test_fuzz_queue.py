"""Fuzzing the extend queue's parser and its read-modify-write with hostile files.

Whatever a queue file holds (NUL, invalid UTF-8, huge lines, CRLF,
key=value junk, duplicate keys, hostile VMIDs and node-names), reading it never
raises, a bad line lands in ``<queue>.rejected`` and nowhere else, good lines
survive a round trip, and a change to a file full of garbage keeps every good
entry.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from pathlib import Path

from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from pvestord.adapters.queue import (
    MAX_REJECTED_LINE,
    N_MAX,
    Entry,
    ExtendQueue,
    RejectedLine,
    parse_queue,
    render,
)
from pvestord.policy.reason import Reason

fuzz = settings(max_examples=200, deadline=None)
#: For the strategies that build whole files: each example costs more to draw.
fuzz_files = settings(max_examples=80, deadline=None)

# -- good entries: node-names start with "good" so no junk line can name them

good_entries = st.builds(
    Entry,
    vmid=st.integers(100, 999_999_999),
    block_node=st.from_regex(r"good[A-Za-z0-9._-]{0,27}", fullmatch=True),
    reason=st.sampled_from(list(Reason)),
    origin=st.none() | st.from_regex(r"[a-z][a-z0-9-]{0,10}[a-z0-9]", fullmatch=True),
    ts=st.none() | st.integers(0, 2**63 - 1),
    n=st.integers(1, N_MAX),
    id=st.none() | st.from_regex(r"[0-9a-f]{1,32}", fullmatch=True),
    extra=st.lists(st.tuples(st.from_regex(r"x[a-z0-9_-]{0,8}", fullmatch=True),
                             st.from_regex(r"[\x21-\x7e]{1,40}", fullmatch=True)),
                   max_size=3, unique_by=lambda kv: kv[0]).map(tuple),
)

# -- junk: the pieces of a line, each hostile in its own way

hostile_vmids = st.one_of(
    st.integers(-10, 10**12).map(str),
    st.sampled_from(["", "0", "099", "1e3", "../", "..", "101 ", " 101", "101\x00", "0x65",
                     "\u0661\u0660\u0661", "+101", "-101", "9" * 400]),
    st.text(max_size=12),
)
hostile_names = st.one_of(
    st.sampled_from(["", "../../etc/passwd", "drive scsi0", "drïve", "0drive", "#block1",
                     "d" * 32, "d" * 5000, "drive\x00", "drive\r", "a:b", "a=b", "\u2028x"]),
    st.text(max_size=40).filter(lambda s: not s.startswith("good")),
    st.from_regex(r"[A-Za-z][A-Za-z0-9._-]{0,30}", fullmatch=True).filter(
        lambda s: not s.startswith("good")),
)
field_words = st.one_of(
    st.sampled_from(["reason=", "reason=threshold", "reason=NOSPACE", "reason=full",
                     "n=0", "n=-1", "n=1", f"n={N_MAX}", f"n={2**63}", "n=" + "9" * 19,
                     "n=99999999999999999999", "ts=", "ts=-5", "ts=1.5", f"ts={2**63}",
                     "id=XYZ", "id=" + "a" * 33, "origin=-bad", "origin=a_b",
                     "=value", "key", "key=", "Key=v", "x=\x7f", "a==b", "k=" + "v" * 300]),
    st.tuples(st.text(max_size=10), st.text(max_size=10)).map("=".join),
    st.text(max_size=20),
)
separators = st.sampled_from([" ", "  ", "\t", " \t ", "\x0b", "\x0c", "\x00", "\u00a0"])


@st.composite
def junk_texts(draw: st.DrawFn) -> str:
    """A queue line put together from hostile parts (may happen to be valid)."""
    key = f"{draw(hostile_vmids)}:{draw(hostile_names)}"
    words = [key, *draw(st.lists(field_words, max_size=6))]
    if draw(st.booleans()):  # the same field twice
        words += [words[-1]] if len(words) > 1 else ["reason=arm", "reason=arm"]
    sep = draw(separators)
    return sep.join(words)


junk_lines = st.one_of(
    junk_texts().map(lambda t: t.encode("utf-8", "surrogatepass")),
    junk_texts().map(lambda t: t.encode("utf-8", "surrogatepass") + b"\xff\xfe"),
    st.binary(max_size=200),
    st.tuples(st.binary(min_size=1, max_size=8), st.integers(600, 6000)).map(
        lambda bi: bi[0] * bi[1]),  # a huge line, past MAX_LINE or MAX_REJECTED_LINE
    st.sampled_from([b"101:a\x00", b"\x00\x00\x00", b"\xc3\x28", b"101:drive-scsi0\xa0",
                     b"101:a reason=nospace\x1b[31m", b"$(reboot)", b"101:a; rm -rf /"]),
).map(lambda raw: raw.replace(b"\n", b" "))  # one line each; the file's newlines are ours


def lines_of(data: bytes) -> list[bytes]:
    """The file's non-blank lines, stripped as the parser strips them."""
    return [s for line in data.split(b"\n") if (s := line.strip(b" \t\r"))]


def only_good(entries: list[Entry]) -> list[Entry]:
    return [e for e in entries if e.block_node.startswith("good")]


@st.composite
def hostile_files(draw: st.DrawFn) -> tuple[bytes, list[Entry], list[bytes]]:
    """(file, its good entries in file order, its junk lines) shuffled together."""
    good = draw(st.lists(good_entries, max_size=8, unique_by=lambda e: e.key))
    junk = draw(st.lists(junk_lines, max_size=8))
    tagged = [(True, e.format().encode()) for e in good] + [(False, j) for j in junk]
    order = draw(st.permutations(range(len(tagged))))
    newline = draw(st.sampled_from([b"\n", b"\r\n", b"\n\n"]))
    body = [tagged[i][1] for i in order]
    data = newline.join(body) + draw(st.sampled_from([b"", b"\n", b"\r\n", b"\n \t\n"]))
    good_in_order = [Entry.parse(line.decode()) for ok, line in (tagged[i] for i in order)
                     if ok]
    return data, good_in_order, junk


# -- parsing


@fuzz
@given(st.binary(max_size=3000))
@example(b"101:a\x00 reason=arm\n\xff\xfe\n\r\n" + b"x" * 5000)
def test_any_bytes_parse_without_raising(data: bytes) -> None:
    entries, rejected = parse_queue(data, now=1)
    # Every non-blank line went one way or the other, and a rejected record
    # keeps what it needs to be shown and matched against the original.
    assert len(rejected) <= len(lines_of(data))
    for record in rejected:
        assert record.error and record.length >= len(record.raw)
        assert len(record.raw) <= MAX_REJECTED_LINE
        assert RejectedLine.from_json(record.to_json().encode()) == record
    for entry in entries:
        assert Entry.parse(entry.format()) == entry


@fuzz_files
@given(hostile_files())
def test_bad_lines_are_rejected_and_good_lines_kept(
        case: tuple[bytes, list[Entry], list[bytes]]) -> None:
    data, good, junk = case
    entries, rejected = parse_queue(data, now=1)
    assert only_good(entries) == good
    # A line is rejected in the file exactly when it is rejected alone: its
    # neighbours change nothing about it. Only junk is ever rejected.
    alone = [line for line in data.split(b"\n")
             if line.strip(b" \t\r") and parse_queue(line, now=1)[1]]
    assert [(r.length, r.sha256) for r in rejected] == [
        (len(line), hashlib.sha256(line).hexdigest()) for line in alone]
    assert {line.strip(b" \t\r") for line in alone} <= {j.strip(b" \t\r") for j in junk}


@fuzz_files
@given(st.lists(good_entries, max_size=10, unique_by=lambda e: e.key),
       st.lists(junk_lines, max_size=6))
def test_parse_format_parse_is_identity(good: list[Entry], junk: list[bytes]) -> None:
    data = b"\n".join([e.format().encode() for e in good] + junk)
    entries, _ = parse_queue(data, now=1)
    again, rejected = parse_queue(render(entries), now=1)
    assert again == entries
    assert rejected == []


@fuzz
@given(st.lists(st.tuples(st.sampled_from(list(Reason)), st.none() | st.integers(0, 2**63 - 1),
                          st.integers(1, N_MAX)), min_size=1, max_size=6),
       st.sampled_from([b"\n", b"\r\n"]))
@example([(Reason.ARM, None, N_MAX), (Reason.ARM, None, 5)], b"\n")
def test_duplicate_lines_merge_on_read_whatever_their_counts(
        lines: list[tuple[Reason, int | None, int]], newline: bytes) -> None:
    # Found by this test: two lines whose counts add up past 2**63 made the
    # merge raise, and with it every read and every append of the queue.
    drive = [Entry(101, "drive-scsi0", reason, ts=ts, n=n) for reason, ts, n in lines]
    data = newline.join(e.format().encode() for e in drive)
    [merged], rejected = parse_queue(data, now=1)
    assert rejected == []
    assert merged.n == min(N_MAX, sum(e.n for e in drive))
    assert merged.reason.strength == max(e.reason.strength for e in drive)
    known_ts = [e.ts for e in drive if e.ts is not None]
    assert merged.ts == (min(known_ts) if known_ts else None)


# -- read-modify-write on a file holding garbage


@fuzz_files
@given(hostile_files(), good_entries, st.sampled_from(["append", "complete", "remove"]))
def test_a_change_to_a_garbage_file_keeps_every_good_entry(
        case: tuple[bytes, list[Entry], list[bytes]], new: Entry, change: str) -> None:
    data, good, _ = case
    assume(new.key not in {e.key for e in good})
    with tempfile.TemporaryDirectory() as tmp:
        queue = ExtendQueue(Path(tmp) / "extend-queue")
        queue.path.write_bytes(data)
        before, bad = parse_queue(data, now=1)
        if change == "append":
            queue.append([new])
        elif change == "complete":
            queue.complete([new])  # not queued: removes nothing
        else:
            queue.remove([new.key])
        after = queue.entries()
        assert only_good(after)[:len(good)] == good
        assert [e for e in after if e.key != new.key] == before
        if change == "append":
            assert [e.key for e in after][-1] == new.key
        # The rejected lines moved, whole: out of the queue, into the rejected file.
        assert parse_queue(queue.path.read_bytes(), now=1)[1] == []
        moved = queue.rejected()
        assert [(r.raw, r.length, r.sha256) for r in moved] == [
            (r.raw, r.length, r.sha256) for r in bad]


# -- the rejected file itself, edited by hand or damaged

json_junk = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                  max_size=4),
    max_leaves=12)
record_fields = st.fixed_dictionaries({}, optional={
    "ts": json_junk, "error": json_junk, "length": json_junk, "sha256": json_junk,
    "line_b64": st.sampled_from(["", "AA==", "!!", "ä"]) | json_junk, "extra": json_junk})


def encode_record(record: object) -> bytes:
    return json.dumps(record).encode()


@fuzz
@given(st.one_of(
    st.binary(max_size=300),
    record_fields.map(encode_record),
    json_junk.map(encode_record),
    st.integers(1, 100_000).map(lambda depth: b"[" * depth),
))
@example(b'{"line_b64": "", "error": "", "ts": 1e999, "length": 0, "sha256": ""}')
@example(b"[" * 100_000)
def test_any_rejected_record_reads_without_raising(record: bytes) -> None:
    # Found by this test: a ts of 1e999 (OverflowError) and deep nesting
    # (RecursionError) escaped from `pvestord queue list --rejected`.
    line = RejectedLine.from_json(record)
    assert isinstance(line.raw, bytes) and isinstance(line.text, str)
