"""The extend queue's format, merging, compare-and-remove, bound and hostile input."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pvestord.adapters.queue import (
    MAX_REJECTED_LINE,
    Entry,
    ExtendQueue,
    InvalidEntryError,
    QueueError,
    QueueFullError,
    parse_key,
    parse_queue,
    render,
)
from pvestord.policy.reason import Reason

# -- strategies

block_nodes = st.from_regex(r"[A-Za-z][A-Za-z0-9._-]{0,30}", fullmatch=True)
origins = st.none() | st.from_regex(r"[a-z][a-z0-9-]{0,10}[a-z0-9]", fullmatch=True)
extras = st.lists(st.tuples(st.from_regex(r"x[a-z0-9_-]{0,8}", fullmatch=True),
                            st.from_regex(r"[\x21-\x7e]{1,20}", fullmatch=True)),
                  max_size=3, unique_by=lambda kv: kv[0]).map(tuple)
entries = st.builds(
    Entry,
    vmid=st.integers(100, 999_999_999),
    block_node=block_nodes,
    reason=st.sampled_from(list(Reason)),
    origin=origins,
    ts=st.none() | st.integers(0, 2**40),
    n=st.integers(1, 10**6),
    id=st.none() | st.from_regex(r"[0-9a-f]{8}", fullmatch=True),
    extra=extras,
)


def same_drive(entry: Entry, other: Entry) -> Entry:
    return Entry(entry.vmid, entry.block_node, other.reason, other.origin, other.ts, other.n,
                 other.id, other.extra)


def semantic(entry: Entry) -> tuple[object, ...]:
    """Everything merge treats symmetrically (id and extra: the existing line wins)."""
    return (entry.key, entry.reason, entry.origin, entry.ts, entry.n)


@pytest.fixture
def queue(tmp_path: Path) -> ExtendQueue:
    return ExtendQueue(tmp_path / "extend-queue")


# -- format


def test_the_proposals_plain_lines_parse(queue: ExtendQueue) -> None:
    queue.path.write_text("101:drive-scsi0\n102:drive-virtio1\n")
    assert queue.entries() == [Entry(101, "drive-scsi0"), Entry(102, "drive-virtio1")]
    assert queue.entries()[0].reason is Reason.THRESHOLD


def test_blank_lines_crlf_and_missing_final_newline_are_fine(queue: ExtendQueue) -> None:
    queue.path.write_bytes(b"\n  101:a reason=nospace \r\n\n102:b")
    assert queue.entries() == [Entry(101, "a", Reason.NOSPACE), Entry(102, "b")]
    assert queue.rejected() == []


@given(entries)
def test_an_entry_round_trips_through_its_line(entry: Entry) -> None:
    assert Entry.parse(entry.format()) == entry


@given(st.lists(entries, max_size=20, unique_by=lambda e: e.key))
def test_a_file_round_trips(items: list[Entry]) -> None:
    parsed, rejected = parse_queue(render(items))
    assert parsed == items
    assert rejected == []


@pytest.mark.parametrize("vmid, ok", [(99, False), (100, True), (999_999_999, True),
                                      (1_000_000_000, False), (0, False), (-5, False)])
def test_vmid_range_is_proxmoxs(vmid: int, ok: bool) -> None:
    if ok:
        assert Entry(vmid, "drive-scsi0").vmid == vmid
    else:
        with pytest.raises(InvalidEntryError, match="VMID"):
            Entry(vmid, "drive-scsi0")


@pytest.mark.parametrize("name, ok", [
    ("a", True), ("drive-scsi0", True), ("f" + "0" * 30, True), ("f" + "0" * 31, False),
    ("0drive", False), ("drive scsi0", False), ("drive/x", False),
    # QEMU's own names for nodes it opened itself (a backing image): a commit's base.
    ("#block123", True), ("#block", False), ("#blockx", False), ("#evil", False),
    ("#block1 x", False),
    ("", False), ("d" * 200, False), ("drïve", False),
])
def test_node_names_follow_qemus_rules(name: str, ok: bool) -> None:
    if ok:
        assert parse_key(f"101:{name}") == (101, name)
    else:
        with pytest.raises(InvalidEntryError, match=r"node-name|VMID:BLOCK-NODE"):
            parse_key(f"101:{name}")


def test_unknown_fields_are_kept_verbatim_through_merge_and_rewrite(queue: ExtendQueue) -> None:
    queue.path.write_text("101:a reason=arm future=yes path=$HOME;x\n")
    queue.append([Entry(101, "a", Reason.THRESHOLD, extra=(("other", "1"),))])
    [entry] = queue.entries()
    assert entry.extra == (("future", "yes"), ("path", "$HOME;x"), ("other", "1"))
    assert entry.reason is Reason.THRESHOLD
    assert "future=yes path=$HOME;x other=1" in queue.path.read_text()


# -- merging


@given(entries, entries)
def test_merge_is_commutative(a: Entry, b: Entry) -> None:
    b = same_drive(a, b)
    assert semantic(a.merged(b)) == semantic(b.merged(a))


@given(entries, entries, entries)
def test_merge_is_associative(a: Entry, b: Entry, c: Entry) -> None:
    b, c = same_drive(a, b), same_drive(a, c)
    assert a.merged(b).merged(c) == a.merged(b.merged(c))


@given(entries, entries)
def test_merge_keeps_the_strongest_reason_the_oldest_ts_and_counts(a: Entry, b: Entry) -> None:
    b = same_drive(a, b)
    m = a.merged(b)
    assert m.reason.strength == max(a.reason.strength, b.reason.strength)
    known = [t for t in (a.ts, b.ts) if t is not None]
    assert m.ts == (min(known) if known else None)
    assert m.n == a.n + b.n
    assert m != a, "a merge must change the line, or complete() could drop the new event"


def test_reason_strength_order() -> None:
    order = sorted(Reason, key=lambda r: r.strength)
    assert order == [Reason.ARM, Reason.MANUAL, Reason.JOB, Reason.THRESHOLD, Reason.NOSPACE]


def test_append_merges_duplicates_into_one_line(queue: ExtendQueue) -> None:
    queue.append([Entry(101, "a", Reason.THRESHOLD, origin="pve1", ts=200)])
    queue.append([Entry(101, "a", Reason.NOSPACE, origin="pve2", ts=300),
                  Entry(101, "a", Reason.ARM, origin="pve3", ts=100)])
    [entry] = queue.entries()
    assert (entry.reason, entry.origin, entry.ts, entry.n) == (Reason.NOSPACE, "pve2", 100, 3)
    assert len(queue.path.read_text().splitlines()) == 1


def test_duplicate_lines_in_the_file_merge_on_read(queue: ExtendQueue) -> None:
    queue.path.write_text("101:a\n101:a reason=nospace ts=5\n")
    [entry] = queue.entries()
    assert (entry.reason, entry.ts, entry.n) == (Reason.NOSPACE, 5, 2)


def test_append_stamps_a_time_and_an_id(queue: ExtendQueue) -> None:
    queue.append([Entry(101, "a")])
    [entry] = queue.entries()
    assert entry.ts is not None and entry.id is not None


# -- pending and compare-and-remove


def test_pending_is_a_snapshot_that_removes_nothing(queue: ExtendQueue) -> None:
    queue.append([Entry(101, "a"), Entry(102, "b")])
    assert [e.key for e in queue.pending(lambda e: e.vmid == 101)] == [(101, "a")]
    assert len(queue.entries()) == 2


@settings(max_examples=60, deadline=None)
@given(first=st.lists(entries, min_size=1, max_size=8, unique_by=lambda e: e.key),
       again=st.lists(st.integers(0, 7), max_size=8), gone=st.lists(st.integers(0, 7), max_size=3))
def test_complete_never_loses_an_event_merged_meanwhile(
        first: list[Entry], again: list[int], gone: list[int]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        queue = ExtendQueue(Path(tmp) / "q")
        queue.append([Entry(e.vmid, e.block_node, e.reason, e.origin, e.ts) for e in first])
        snapshot = queue.pending(lambda e: True)
        # While the daemon works: new events for some drives, and some lines
        # removed by hand and queued again with identical fields.
        merged = {snapshot[i % len(snapshot)].key for i in again}
        queue.append([Entry(*snapshot[i % len(snapshot)].key) for i in again])
        requeued = {snapshot[i % len(snapshot)].key for i in gone} - merged
        old = {e.key: e for e in snapshot}
        queue.remove(sorted(requeued))
        queue.append([Entry(k[0], k[1], old[k].reason, old[k].origin, old[k].ts)
                      for k in sorted(requeued)])
        removed = queue.complete(snapshot)
        left = {e.key for e in queue.entries()}
        assert left == merged | requeued
        assert removed == len(snapshot) - len(merged | requeued)


def test_complete_ignores_entries_never_read_from_the_queue(queue: ExtendQueue) -> None:
    queue.append([Entry(101, "a")])
    assert queue.complete([Entry(101, "a")]) == 0  # no id, no ts: not the stored line
    assert len(queue.entries()) == 1


def test_remove_and_flush_are_unconditional(queue: ExtendQueue) -> None:
    queue.append([Entry(101, "a"), Entry(102, "b"), Entry(103, "c")])
    assert queue.remove([(101, "a"), (999, "zz")]) == 1
    assert queue.flush() == 2
    assert queue.entries() == []
    assert queue.path.read_bytes() == b""


async def test_async_twins(queue: ExtendQueue) -> None:
    async def run() -> None:
        await queue.append_async([Entry(101, "a"), Entry(102, "b")])
        batch = [e for e in await queue.entries_async() if e.vmid == 102]
        assert await queue.complete_async(batch) == 1
        assert [e.key for e in await queue.entries_async()] == [(101, "a")]
    await asyncio.wait_for(run(), timeout=20)


# -- the bound


def test_an_append_past_the_bound_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    queue = ExtendQueue(tmp_path / "q", max_bytes=400)
    i = 0
    with pytest.raises(QueueFullError, match="past its bound of 400"):
        while True:
            queue.append([Entry(100 + i, "drive-scsi0", origin="pve1")])
            i += 1
    before = queue.path.read_bytes()
    assert len(before) <= 400
    with pytest.raises(QueueFullError):
        queue.append([Entry(100, "drive-scsi0"), Entry(999, "new")])  # the whole batch
    assert queue.path.read_bytes() == before
    assert queue.remove([(100, "drive-scsi0")]) == 1  # removals always work


def test_a_file_already_past_the_bound_can_still_shrink(tmp_path: Path) -> None:
    queue = ExtendQueue(tmp_path / "q", max_bytes=1000)
    queue.path.write_bytes(render(Entry(100 + i, "d") for i in range(200)))
    with pytest.raises(QueueFullError):
        queue.append([Entry(999, "new")])
    assert len(queue.entries()) == 200
    assert queue.complete(queue.pending(lambda e: e.vmid < 150)) == 50
    assert len(queue.entries()) == 150


# -- hostile input


def test_binary_garbage_moves_to_the_rejected_file(queue: ExtendQueue,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    garbage = [os.urandom(50).replace(b"\n", b"") + b"\xff" for _ in range(30)]
    valid = [Entry(100 + i, f"drive-{i}") for i in range(30)]
    lines = [g for pair in zip(garbage, render(valid).splitlines(), strict=True) for g in pair]
    queue.path.write_bytes(b"\n".join(lines) + b"\n\x00\x01\x02")
    assert queue.entries() == valid  # reading is never fatal
    with caplog.at_level(logging.WARNING, logger="pvestord.adapters.queue"):
        queue.append([Entry(999, "new")])
    assert [e.key for e in queue.entries()] == [e.key for e in valid] + [(999, "new")]
    rejected = queue.rejected()
    assert [r.raw for r in rejected] == [*garbage, b"\x00\x01\x02"]
    assert all(r.error for r in rejected)
    assert "malformed line" in caplog.text
    assert b"\xff" not in queue.path.read_bytes()


def test_a_2_mib_file_of_garbage_and_entries(queue: ExtendQueue,
                                              caplog: pytest.LogCaptureFixture) -> None:
    valid = [Entry(100 + i, "drive-scsi0", origin="pve1") for i in range(100)]
    chunk = (2 * 1024 * 1024) // 100
    queue.path.write_bytes(b"".join(os.urandom(chunk) + b"\n" + e.format().encode() + b"\n"
                                    for e in valid))
    with caplog.at_level(logging.WARNING, logger="pvestord.adapters.queue"):
        queue.append([Entry(999, "new")])
    assert [e.key for e in queue.entries()] == [e.key for e in valid] + [(999, "new")]
    # More garbage than the rejected file may hold: it keeps the newest, says so.
    assert queue.rejected_path.stat().st_size <= queue.max_bytes
    assert "dropped its" in caplog.text
    assert queue.rejected()
    assert all(len(r.raw) <= MAX_REJECTED_LINE for r in queue.rejected())


def test_a_2_mib_line_is_kept_truncated_with_its_length_and_hash(queue: ExtendQueue) -> None:
    line = b"x" * (2 * 1024 * 1024)
    queue.path.write_bytes(line + b"\n101:a\n")
    queue.flush()
    [rejected] = queue.rejected()
    assert rejected.truncated and rejected.length == len(line)
    assert rejected.raw == line[:MAX_REJECTED_LINE]
    assert rejected.sha256 == hashlib.sha256(line).hexdigest()


def test_the_rejected_file_keeps_its_bound_and_says_what_it_dropped(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    queue = ExtendQueue(tmp_path / "q", max_bytes=4096)
    for round_ in range(5):
        queue.path.write_bytes(b"".join(b"garbage %d %d\n" % (round_, i) for i in range(20)))
        with caplog.at_level(logging.WARNING, logger="pvestord.adapters.queue"):
            queue.flush()
    assert queue.rejected_path.stat().st_size <= 4096
    assert "dropped its" in caplog.text
    assert queue.rejected()[-1].raw == b"garbage 4 19"


@pytest.mark.parametrize("line", [
    b"101:drive;reboot", b"101:$(rm -rf /tmp/x)", b"101:x origin=`id`", b"`id`:x",
    b"101:x reason=threshold;ls", b"101:x ts=1;2", b"101:x && touch /tmp/pwned", b"101:x |id",
    b"101:x reason=threshold reason=nospace", b"101:x n=0", b"101:x id=XYZ",
])
def test_shell_metacharacters_are_just_bad_lines(queue: ExtendQueue, line: bytes) -> None:
    queue.path.write_bytes(line + b"\n101:ok\n")
    queue.append([Entry(102, "new")])
    assert [e.key for e in queue.entries()] == [(101, "ok"), (102, "new")]
    assert [r.raw for r in queue.rejected()] == [line]


def test_a_200_character_node_name(queue: ExtendQueue) -> None:
    with pytest.raises(InvalidEntryError, match="node-name"):
        Entry(101, "d" * 200)
    queue.path.write_text(f"101:{'d' * 200}\n")
    assert queue.entries() == []
    queue.flush()
    assert queue.rejected()[0].raw == f"101:{'d' * 200}".encode()


def test_a_symlinked_queue_is_refused_and_its_target_untouched(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.write_text("precious\n")
    link = tmp_path / "extend-queue"
    link.symlink_to(target)
    queue = ExtendQueue(link)
    for call in (queue.entries, lambda: queue.append([Entry(101, "a")]), queue.flush):
        with pytest.raises(QueueError, match="symbolic link"):
            call()
    assert target.read_text() == "precious\n"
    assert link.is_symlink()


def test_a_symlinked_rejected_file_is_refused(queue: ExtendQueue, tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.write_text("precious\n")
    queue.rejected_path.symlink_to(target)
    queue.path.write_text("garbage\n101:a\n")
    with pytest.raises(QueueError, match="symbolic link"):
        queue.flush()
    assert target.read_text() == "precious\n"
    assert queue.path.read_text() == "garbage\n101:a\n", "nothing may be lost"


def test_a_directory_instead_of_the_queue_is_a_clear_error(queue: ExtendQueue) -> None:
    queue.path.mkdir()
    with pytest.raises(QueueError, match="not a regular file"):
        queue.entries()


def test_writes_leave_no_temporary_files_and_sweep_dead_writers(queue: ExtendQueue) -> None:
    dead = queue.path.with_name(f".{queue.path.name}.abc123.tmp")
    dead.write_text("half a file")
    queue.append([Entry(101, "a")])
    queue.append([Entry(102, "b")])
    names = sorted(p.name for p in queue.path.parent.iterdir())
    assert names == ["extend-queue", "extend-queue.lock"]
