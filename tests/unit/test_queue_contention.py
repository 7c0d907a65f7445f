"""Many real processes on one queue: 8 writers x 1000 appends with distinct
keys while a taker pends and completes. Every entry must be taken exactly
once, none lost, none duplicated, and the file must parse at every moment
(the taker reads it without the lock on every round).

The files live on tmpfs (/dev/shm) when there is one: rename, flock and mkdir
behave as on any local file system, and fsync costs nothing, so the test
measures locking and merging rather than this machine's disk flushes (the
benchmark reports both).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from pvestord.adapters.queue import ExtendQueue

HELPER = Path(__file__).with_name("helpers_queue.py")
WRITERS = 8
PER_WRITER = 1000
# A hung writer or taker fails the test instead of hanging it.
PROCESS_BUDGET = 150.0


def spawn(role: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(  # noqa: S603 - argument list, our own helper
        [sys.executable, str(HELPER), role, *args], stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.fixture
def fast_dir(tmp_path: Path) -> Iterator[Path]:
    shm = Path("/dev/shm")
    if not (shm.is_dir() and os.access(shm, os.W_OK)):
        yield tmp_path
        return
    with tempfile.TemporaryDirectory(dir=shm, prefix="pvestord-queue-") as name:
        yield Path(name)


@pytest.mark.parametrize("backend", ["flock", "lockdir"])
def test_writers_and_taker_lose_nothing(fast_dir: Path, backend: str) -> None:
    tmp_path = fast_dir
    queue_path = tmp_path / "extend-queue"
    lock_dir = tmp_path / "lock"
    lock_dir.mkdir()
    go = tmp_path / "go"
    common = ["--queue", str(queue_path), "--backend", backend, "--lock-dir", str(lock_dir),
              "--go", str(go)]
    total = WRITERS * PER_WRITER
    roles = ["taker", *(f"writer {w}" for w in range(WRITERS))]
    procs = [spawn("taker", *common, "--total", str(total), "--budget", str(PROCESS_BUDGET - 10))]
    procs += [spawn("writer", *common, "--writer", str(w), "--count", str(PER_WRITER))
              for w in range(WRITERS)]
    go.touch()
    results = []
    try:
        for role, proc in zip(roles, procs, strict=True):
            out, err = proc.communicate(timeout=PROCESS_BUDGET)
            assert proc.returncode == 0, f"{role} failed: {err[-2000:]}"
            results.append(json.loads(out.splitlines()[-1]))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    taker, writers = results[0], results[1:]
    assert taker["bad"] == []
    taken = Counter((vmid, name) for vmid, name in taker["taken"])
    expected = {(1000 + w, f"w{w}-{i}") for w in range(WRITERS) for i in range(PER_WRITER)}
    assert set(taken) == expected, "entries lost or invented"
    assert [k for k, n in taken.items() if n > 1] == [], "entries taken twice"
    assert sum(w["appended"] for w in writers) == total
    queue = ExtendQueue(queue_path)
    assert queue.entries() == []
    assert queue.rejected() == []
    assert not (tmp_path / "extend-queue.rejected").exists()
    assert list(lock_dir.iterdir()) == [], "a lock directory was left behind"
    leftovers = [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    assert leftovers == []
    # For the record (speed is measured in bench/, not asserted here).
    print(f"{backend}: taker {taker['seconds']:.1f} s, {taker['rounds']} rounds; writers "
          f"{max(w['seconds'] for w in writers):.1f} s, lock timeouts retried: writers "
          f"{sum(w['lock_timeouts'] for w in writers)}, taker {taker['lock_timeouts']}")
