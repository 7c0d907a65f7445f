"""``pvestord queue ...`` through the real entry point: exit codes and output."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

PVESTORD = Path(sys.executable).with_name("pvestord")
TIMEOUT = 30.0


def run(queue: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(  # noqa: S603 - argument list, the installed entry point
        [str(PVESTORD), "--queue", str(queue), *args], capture_output=True, text=True,
        timeout=TIMEOUT, stdin=subprocess.DEVNULL, check=False)


@pytest.fixture
def queue(tmp_path: Path) -> Path:
    return tmp_path / "extend-queue"


def test_add_list_remove_flush(queue: Path) -> None:
    assert run(queue, "queue", "add", "101:drive-scsi0", "102:drive-virtio1",
               "--reason", "nospace").returncode == 0
    table = run(queue, "queue", "list")
    assert table.returncode == 0
    header, *rows = table.stdout.splitlines()
    assert header.split() == ["VMID", "BLOCK-NODE", "REASON", "EVENTS", "SINCE", "ORIGIN"]
    assert [r.split()[:3] for r in rows] == [["101", "drive-scsi0", "nospace"],
                                            ["102", "drive-virtio1", "nospace"]]
    listed = json.loads(run(queue, "queue", "list", "--json").stdout)
    assert [(e["vmid"], e["block_node"], e["reason"], e["n"]) for e in listed] == [
        (101, "drive-scsi0", "nospace", 1), (102, "drive-virtio1", "nospace", 1)]
    removed = run(queue, "queue", "remove", "101:drive-scsi0", "103:nothing")
    assert removed.returncode == 0 and "removed 1 of 2" in removed.stdout
    flushed = run(queue, "queue", "flush")
    assert flushed.returncode == 0 and "removed 1" in flushed.stdout
    assert json.loads(run(queue, "queue", "list", "--json").stdout) == []
    assert "queue is empty" in run(queue, "queue", "list").stdout


def test_adding_twice_merges(queue: Path) -> None:
    run(queue, "queue", "add", "101:drive-scsi0", "--reason", "arm")
    run(queue, "queue", "add", "101:drive-scsi0")
    [entry] = json.loads(run(queue, "queue", "list", "--json").stdout)
    assert (entry["reason"], entry["n"]) == ("manual", 2)


@pytest.mark.parametrize("args", [
    ["queue", "add", "1:drive-scsi0"],
    ["queue", "add", "101:" + "d" * 200],
    ["queue", "add", "101:drive;reboot"],
    ["queue", "add", "drive-scsi0"],
    ["queue", "add", "101:drive-scsi0", "--reason", "because"],
    ["queue", "remove", "101:$(id)"],
    ["queue", "--lock-timeout", "never", "list"],
    ["queue"],
])
def test_bad_arguments_exit_2_with_one_line_reason(queue: Path, args: list[str]) -> None:
    result = run(queue, *args)
    assert result.returncode == 2
    assert result.stdout == ""
    last = result.stderr.strip().splitlines()[-1]
    assert "error:" in last
    assert not queue.exists(), "a refused command must not touch the queue"


def test_rejected_lines_are_listed(queue: Path) -> None:
    queue.write_bytes(b"101:drive-scsi0\nnot an entry\n\xff\xfe binary\n")
    assert run(queue, "queue", "add", "102:b").returncode == 0
    table = run(queue, "queue", "list", "--rejected")
    assert table.returncode == 0
    assert "not an entry" in table.stdout and "\\xff\\xfe binary" in table.stdout
    records = json.loads(run(queue, "queue", "list", "--rejected", "--json").stdout)
    assert [r["line"] for r in records] == ["not an entry", "\\xff\\xfe binary"]
    assert all(r["error"] for r in records)
    listed = json.loads(run(queue, "queue", "list", "--json").stdout)
    assert [e["vmid"] for e in listed] == [101, 102]


def test_a_symlinked_queue_fails_with_exit_1(queue: Path, tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.write_text("precious\n")
    queue.symlink_to(target)
    result = run(queue, "queue", "add", "101:a")
    assert result.returncode == 1
    assert result.stderr.startswith("pvestord: ") and "symbolic link" in result.stderr
    assert target.read_text() == "precious\n"


def test_lock_dir_backend_and_its_timeout(queue: Path, tmp_path: Path) -> None:
    lock_dir = tmp_path / "locks"
    lock_dir.mkdir()
    assert run(queue, "queue", "--lock-dir", str(lock_dir), "add", "101:a").returncode == 0
    assert list(lock_dir.iterdir()) == []
    (lock_dir / "file-extend-queue").mkdir()  # someone else holds it right now
    result = run(queue, "queue", "--lock-dir", str(lock_dir), "--lock-timeout", "0.5",
                 "add", "102:b")
    assert result.returncode == 1
    assert "file-extend-queue" in result.stderr and "held for" in result.stderr
    # A lock left by a holder that died long ago is expired, and the add goes through.
    old = time.time() - 600
    os.utime(lock_dir / "file-extend-queue", (old, old))
    result = run(queue, "queue", "--lock-dir", str(lock_dir), "add", "102:b")
    assert result.returncode == 0, result.stderr
    listed = json.loads(run(queue, "queue", "list", "--json").stdout)
    assert [e["vmid"] for e in listed] == [101, 102]


def test_a_full_queue_fails_with_exit_1_and_keeps_what_it_had(queue: Path) -> None:
    line = b"100000:d reason=threshold\n"  # every line this long: 6-digit VMIDs
    entries = b"".join(b"%d:d reason=threshold\n" % (100_000 + i)
                       for i in range(1024 * 1024 // len(line)))  # just under 1 MiB
    queue.write_bytes(entries)
    result = run(queue, "queue", "add", "999999:new")
    assert result.returncode == 1
    assert "past its bound" in result.stderr
    assert queue.read_bytes() == entries
