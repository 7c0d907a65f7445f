"""The node-local lock backend: ``flock`` on a lock file, for one node on an
ordinary file system; the same kernel lock Proxmox's ``PVE::Tools::lock_file``
takes, so ours and theirs exclude each other."""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

from pvestord.adapters import lockheld


class FlockLock:
    """``flock(LOCK_EX)`` on ``path``, created if missing.

    The lock file's mtime is set at each acquisition so that a waiter that
    times out can say how long the current holder has had it (Proxmox's own
    holders do not touch it, so for them this is an upper bound).
    """

    def __init__(self, path: Path, *, hold_budget: float = lockheld.HOLD_BUDGET,
                 retry_max: float = lockheld.RETRY_MAX_FLOCK) -> None:
        self.path = path
        self.retry_max = retry_max
        self.name = f"{path} (flock)"
        self.hold_budget = hold_budget

    def _open(self) -> int:
        try:
            return os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
        except OSError as err:
            raise lockheld.LockError(f"cannot open lock file {self.path}: {err.strerror}") from err

    def _try(self, fd: int) -> bool:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        except OSError as err:
            raise lockheld.LockError(f"flock on {self.path} failed: {err.strerror}") from err
        with contextlib.suppress(OSError):
            os.utime(fd)
        return True

    def _timeout(self, backoff: lockheld.Backoff) -> lockheld.LockTimeout:
        age: float | None = None
        with contextlib.suppress(OSError):
            age = max(time.time() - os.stat(self.path).st_mtime, 0.0)
        holders = _flock_holders(self.path)
        detail = f"holder pid {', '.join(map(str, holders))}" if holders else ""
        return lockheld.LockTimeout(self.name, backoff.waited, age, detail)

    def _waiting(self, fd: int, timeout: float) -> lockheld.Attempts[bool]:
        return lockheld.attempts(lambda: self._try(fd) or None,
                                 lockheld.Backoff(timeout, self.retry_max), self._timeout)

    @contextlib.contextmanager
    def _held(self) -> Iterator[lockheld.Held]:
        held_since = time.monotonic()
        try:
            yield lockheld.Held(self.name, None, held_since)
        finally:
            lockheld.warn_if_overran(self.name, held_since, self.hold_budget)

    @contextlib.contextmanager
    def acquire(self, timeout: float = lockheld.DEFAULT_TIMEOUT) -> Iterator[lockheld.Held]:
        fd = self._open()
        try:
            lockheld.wait_blocking(self._waiting(fd, timeout))
            with self._held() as held:
                yield held
        finally:
            os.close(fd)  # closing the descriptor drops the flock

    @contextlib.asynccontextmanager
    async def acquire_async(
        self, timeout: float = lockheld.DEFAULT_TIMEOUT  # noqa: ASYNC109 - bounds the wait, not the body
    ) -> AsyncIterator[lockheld.Held]:
        fd = self._open()
        try:
            await lockheld.wait_async(self._waiting(fd, timeout))
            with self._held() as held:
                yield held
        finally:
            os.close(fd)


def _flock_holders(path: Path) -> list[int]:
    """Pids holding a FLOCK on ``path``, from /proc/locks (best effort)."""
    try:
        st = os.stat(path)
        text = Path("/proc/locks").read_text()
    except OSError:
        return []
    want = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    pids = []
    for line in text.splitlines():
        parts = line.split()
        # "1: FLOCK  ADVISORY  WRITE 1234 fd:00:5678 0 EOF"; blocked waiters have "->".
        if len(parts) >= 6 and parts[1] == "FLOCK" and parts[5] == want and parts[4].isdigit():
            pids.append(int(parts[4]))
    return pids
