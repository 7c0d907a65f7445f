"""Lock semantics on both backends, with real processes holding real locks."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from pvestord.adapters.locks import (
    EmulatedPmxcfsExpiry,
    FlockLock,
    Lock,
    LockDirLock,
    LockError,
    LockTimeout,
    on_pmxcfs,
    queue_lock,
    storage_lock,
)

HELPER = Path(__file__).with_name("helpers_queue.py")
# A holder that does not report within this long fails the test.
START_BUDGET = 20.0


class Holder:
    """Another process holding the lock at ``path`` for ``seconds``."""

    def __init__(self, proc: subprocess.Popen[str], pid: int) -> None:
        self.proc = proc
        self.pid = pid

    def last_held(self) -> float:
        """When it last held the lock (monotonic clock), read once it is done."""
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        return float(json.loads(line)["last_held"])


@contextmanager
def holder(kind: str, path: Path, seconds: float) -> Iterator[Holder]:
    proc = subprocess.Popen(  # noqa: S603 - argument list, our own helper
        [sys.executable, str(HELPER), "hold", "--kind", kind, "--path", str(path),
         "--seconds", str(seconds)], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # the helper prints once it holds the lock
        assert line, f"holder failed: {proc.stderr.read() if proc.stderr else ''}"
        yield Holder(proc, json.loads(line)["held"])
        proc.wait(timeout=seconds + START_BUDGET)
        assert proc.returncode == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def make(kind: str, tmp_path: Path) -> tuple[Lock, Path]:
    if kind == "flock":
        path = tmp_path / "lockfile"
        return FlockLock(path), path
    (tmp_path / "lock").mkdir(exist_ok=True)
    return LockDirLock(tmp_path / "lock", "storage-san1"), tmp_path / "lock" / "storage-san1"


@pytest.mark.parametrize("kind", ["flock", "lockdir"])
def test_a_held_lock_times_out_with_its_name_and_holders_age(tmp_path: Path, kind: str) -> None:
    lock, path = make(kind, tmp_path)
    with holder(kind, path, seconds=4) as other:
        with pytest.raises(LockTimeout) as info, lock.acquire(timeout=0.5):
            pytest.fail("got a lock another process holds")
        message = str(info.value)
        assert "storage-san1" in message or "lockfile" in message
        assert "held for" in message and info.value.holder_age is not None
        if kind == "flock":
            assert f"holder pid {other.pid}" in message
    with lock.acquire(timeout=2):  # free again once the holder is gone
        pass


@pytest.mark.parametrize("kind", ["flock", "lockdir"])
def test_mutual_exclusion_between_processes(tmp_path: Path, kind: str) -> None:
    lock, path = make(kind, tmp_path)
    with holder(kind, path, seconds=1.0) as other:
        with lock.acquire(timeout=START_BUDGET):
            got_it = time.monotonic()
        assert got_it > other.last_held(), "both processes held the lock at once"


@pytest.mark.parametrize("kind", ["flock", "lockdir"])
async def test_async_acquire_excludes_and_times_out(tmp_path: Path, kind: str) -> None:
    lock, _ = make(kind, tmp_path)
    inside = 0
    most = 0

    async def worker() -> None:
        nonlocal inside, most
        for _ in range(20):
            async with lock.acquire_async(timeout=START_BUDGET):
                inside += 1
                most = max(most, inside)
                await asyncio.sleep(0.001)
                inside -= 1

    await asyncio.wait_for(asyncio.gather(*(worker() for _ in range(4))), timeout=60)
    assert most == 1
    async with lock.acquire_async():
        with pytest.raises(LockTimeout):
            await asyncio.wait_for(lock.acquire_async(timeout=0.3).__aenter__(), timeout=10)


def test_a_stale_lock_directory_is_expired(tmp_path: Path, caplog: pytest.LogCaptureFixture
                                           ) -> None:
    lock, path = make("lockdir", tmp_path)
    path.mkdir()  # left by a holder that died ...
    old = time.time() - 200
    os.utime(path, (old, old))  # ... 200 s ago
    with caplog.at_level(logging.WARNING, logger="pvestord.adapters.locks"), \
            lock.acquire(timeout=5):
        assert path.is_dir()
    assert not path.exists()
    assert "expiring lock" in caplog.text
    assert list(path.parent.iterdir()) == []  # no breaker left behind


def test_a_live_lock_is_not_expired_by_waiters(tmp_path: Path) -> None:
    lock, path = make("lockdir", tmp_path)
    with holder("lockdir", path, seconds=3):
        before = os.stat(path).st_mtime_ns
        with pytest.raises(LockTimeout), lock.acquire(timeout=1.5):
            pass
        # The emulated unlock requests left its age alone (utime(0, 0) would not).
        assert os.stat(path).st_mtime_ns == before


def test_a_dead_breaker_is_cleared(tmp_path: Path) -> None:
    lock, path = make("lockdir", tmp_path)
    path.mkdir()
    breaker = path.with_name(f".{path.name}.expire")
    breaker.mkdir()
    old = time.time() - 300
    os.utime(path, (old, old))
    os.utime(breaker, (old, old))
    with lock.acquire(timeout=5):
        pass
    assert list(path.parent.iterdir()) == []


class FakePmxcfs:
    """Test double for pmxcfs's side of ``cfs_lock``: it sees each
    ``utime(path, 0, 0)`` unlock request and, like memdb_lock_expired(),
    removes a lock directory that has stayed unchanged (same inode and
    mtime) for longer than ``expiry`` since it first saw it. Needed because
    the real pmxcfs cannot run here; a plain folder's utime(0, 0) would only
    zero the mtime."""

    def __init__(self, expiry: float) -> None:
        self.expiry = expiry
        self.requests: list[float] = []
        self.first_seen: dict[tuple[int, int], float] = {}

    def __call__(self, lock_path: Path) -> None:
        self.requests.append(time.monotonic())
        try:
            st = os.stat(lock_path)
        except FileNotFoundError:
            return
        seen = self.first_seen.setdefault((st.st_ino, st.st_mtime_ns), time.monotonic())
        if time.monotonic() - seen > self.expiry:
            os.rmdir(lock_path)


def test_unlock_requests_reach_pmxcfs_and_it_expires_the_lock(tmp_path: Path) -> None:
    pmxcfs = FakePmxcfs(expiry=1.5)
    (tmp_path / "lock").mkdir()
    lock = LockDirLock(tmp_path / "lock", "storage-san1", unlock_request=pmxcfs)
    (tmp_path / "lock" / "storage-san1").mkdir()  # a holder that died
    start = time.monotonic()
    with lock.acquire(timeout=8):
        waited = time.monotonic() - start
    assert waited > 1.5  # only pmxcfs's expiry freed it
    # One request right away, then about one a second, as cfs_lock sends them.
    assert pmxcfs.requests[0] - start < 0.5
    assert 2 <= len(pmxcfs.requests) <= waited + 2


def test_the_holder_notices_its_lock_was_expired(tmp_path: Path,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    first, path = make("lockdir", tmp_path)
    second = LockDirLock(path.parent, path.name)
    with caplog.at_level(logging.WARNING, logger="pvestord.adapters.locks"):
        with first.acquire():
            old = time.time() - 200
            os.utime(path, (old, old))  # the holder overran pmxcfs's 120 s
            with second.acquire(timeout=5):
                pass
            path.mkdir()  # and a third holder has it now
        assert "expired while held" in caplog.text
        assert path.is_dir(), "the overrunning holder removed someone else's lock"


def test_holding_past_the_budget_warns(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "lock").mkdir()
    for lock in (LockDirLock(tmp_path / "lock", "x", hold_budget=0.05),
                 FlockLock(tmp_path / "f", hold_budget=0.05)):
        with caplog.at_level(logging.WARNING, logger="pvestord.adapters.locks"), lock.acquire():
            time.sleep(0.1)
        assert "longer than its" in caplog.text
        caplog.clear()


def test_a_missing_lock_directory_is_a_clear_error(tmp_path: Path) -> None:
    lock = LockDirLock(tmp_path / "nowhere", "storage-x")
    with pytest.raises(LockError, match="does not exist"), lock.acquire(timeout=1):
        pass


def test_lock_names(tmp_path: Path) -> None:
    q = tmp_path / "extend-queue"
    assert isinstance(queue_lock(q), FlockLock)
    assert queue_lock(q).name.startswith(str(q) + ".lock")
    by_dir = queue_lock(q, tmp_path)
    assert isinstance(by_dir, LockDirLock) and by_dir.lock_id == "file-extend-queue"
    flock = storage_lock("san.1", shared=False, flock_dir=tmp_path)
    assert isinstance(flock, FlockLock) and flock.path == tmp_path / "pve-storage-san.1"
    forced = storage_lock("san1", shared=True, lock_dir=tmp_path)
    assert isinstance(forced, LockDirLock) and forced.path == tmp_path / "storage-san1"
    # Not on pmxcfs here: shared storage falls back to flock, as a lone node would.
    assert isinstance(storage_lock("san1", shared=True, flock_dir=tmp_path), FlockLock)
    for bad in ("../etc", "a/b", "", "x y"):
        with pytest.raises(LockError):
            storage_lock(bad, shared=True, lock_dir=tmp_path)
    with pytest.raises(LockError):
        LockDirLock(tmp_path, "../escape")


def test_on_pmxcfs_is_false_for_ordinary_folders(tmp_path: Path) -> None:
    assert not on_pmxcfs(tmp_path)
    assert not on_pmxcfs(Path("/"))


def test_default_unlock_request_off_pmxcfs_is_the_emulation(tmp_path: Path) -> None:
    lock = LockDirLock(tmp_path, "x")
    assert isinstance(lock.unlock_request, EmulatedPmxcfsExpiry)
