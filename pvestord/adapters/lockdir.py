"""The cluster lock backend: a lock directory, as ``PVE::Cluster::cfs_lock``
does on pmxcfs. ``mkdir <lockdir>/<id>`` is the atomic test-and-set; while it
exists the waiter sends an *unlock request* and retries; ``rmdir`` releases.
pmxcfs expires a lock directory unchanged for 120 s when a waiter asks, so an
``acquire_async`` holder renews it while held (``utime(path, 0, now)``, which
pmxcfs documents as "another 120 seconds") every quarter of the lifetime.

Expiry on a folder that is not pmxcfs
-------------------------------------
pmxcfs treats ``utime(path, 0, 0)`` on a lock directory as an unlock request:
it never lowers the directory's mtime, and removes the directory if it has not
changed for 120 s. A plain folder (the two-node bed's shared 9p folder, tests)
has no pmxcfs behind it, and ``utime(0, 0)`` there really sets the mtime to
1970: the lock would look 55 years old and the next waiter would break a live
lock. So on a plain folder the waiter does not send ``utime(0, 0)``;
:class:`EmulatedPmxcfsExpiry` takes its place and does what pmxcfs would do:

1. ``mkdir .<id>.expire`` beside the lock: only one waiter judges a lock at a
   time (a waiter that finds it taken just retries later). Its mtime, set by
   the file server, is "now" on the same clock as the lock's mtime, so the
   guests' clock skew does not matter.
2. under it, the lock's age is ``mtime(.<id>.expire) - mtime(<id>)``; if the
   lock is still the directory the waiter saw first (same inode and mtime) and
   is older than 120 s, its holder is gone: ``rmdir`` it, with a warning.
3. ``rmdir .<id>.expire``.

A holder checks at release that the lock directory is still the one it made;
if it was expired meanwhile (the holder overran 120 s) it logs an error and
leaves the new holder's directory alone. The one race left needs a waiter to
crash inside step 2 *and* another to find the leftover breaker 120 s later
at the very moment a third waiter takes the lock: it is documented, not
handled.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import re
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from pvestord import paths
from pvestord.adapters import tally
from pvestord.adapters.lockheld import (
    DEFAULT_TIMEOUT,
    HOLD_BUDGET,
    PMXCFS_LOCK_EXPIRY,
    RENEW_SHARE,
    RETRY_MAX_FOLDER,
    RETRY_MAX_PMXCFS,
    UNLOCK_REQUEST_INTERVAL,
    Attempts,
    Backoff,
    Held,
    LockError,
    LockTimeout,
    attempts,
    jitter,
    wait_async,
    wait_blocking,
    warn_if_overran,
)

log = logging.getLogger(__name__)

# Lock ids become file names: Proxmox's ids are "storage-<storeid>",
# "file-<name>", "domain-<name>"; storage ids may contain dots.
_LOCK_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def on_pmxcfs(path: Path) -> bool:
    """True when ``path`` lives on the Proxmox cluster file system: the FUSE
    mount at /etc/pve (pmxcfs mounts nothing else)."""
    try:
        target = os.path.realpath(path)
        text = Path("/proc/self/mountinfo").read_text()
    except OSError:
        return False
    best, best_type = "", ""
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        fields = left.split()
        if not sep or len(fields) < 5 or not right.split():
            continue
        mount_point = fields[4].replace("\\040", " ")
        inside = target == mount_point or target.startswith(mount_point.rstrip("/") + "/")
        if inside and len(mount_point) >= len(best):
            best, best_type = mount_point, right.split()[0]
    return best == str(paths.QUEUE.parent) and best_type.startswith("fuse")



class UnlockRequest(Protocol):
    """What a waiter does, about once a second, while the lock directory exists."""

    def __call__(self, lock_path: Path) -> None: ...


def pmxcfs_unlock_request(lock_path: Path) -> None:
    """``utime(path, 0, 0)``, exactly as ``cfs_lock``: pmxcfs sees it and
    removes the lock directory if it has been unchanged for 120 s. pmxcfs
    refuses to lower a lock's mtime, so the error is expected and ignored
    (``cfs_lock`` ignores it too)."""
    with contextlib.suppress(OSError):
        os.utime(lock_path, (0, 0))


@dataclass(frozen=True)
class _Seen:
    ino: int
    mtime_ns: int


class EmulatedPmxcfsExpiry:
    """pmxcfs's lock expiry, done by the waiters themselves, for a lock
    directory on a folder that is not pmxcfs (see the module docstring)."""

    def __init__(self, stale_after: float = PMXCFS_LOCK_EXPIRY) -> None:
        self.stale_after = stale_after

    def __call__(self, lock_path: Path) -> None:
        try:
            st = os.stat(lock_path)
        except FileNotFoundError:
            return
        seen = _Seen(st.st_ino, st.st_mtime_ns)
        breaker = lock_path.with_name(f".{lock_path.name}.expire")
        try:
            os.mkdir(breaker)
        except FileExistsError:
            self._clear_dead_breaker(breaker)
            return
        except OSError as err:
            log.warning("cannot check lock %s for expiry: %s", lock_path, err.strerror)
            return
        try:
            now_ns = os.stat(breaker).st_mtime_ns  # the file server's clock
            try:
                st = os.stat(lock_path)
            except FileNotFoundError:
                return
            if _Seen(st.st_ino, st.st_mtime_ns) != seen:
                return  # released and taken again meanwhile: a fresh lock
            age = (now_ns - st.st_mtime_ns) / 1e9
            if age <= self.stale_after:
                return
            log.warning("expiring lock %s: unchanged for %.0f s, longer than pmxcfs's %.0f s; "
                        "its holder is gone (emulated pmxcfs expiry)", lock_path, age,
                        self.stale_after)
            try:
                os.rmdir(lock_path)
            except FileNotFoundError:
                pass
            except OSError as err:
                log.error("cannot expire lock %s: %s", lock_path, err.strerror)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.rmdir(breaker)

    def _clear_dead_breaker(self, breaker: Path) -> None:
        # A breaker is held for a few syscalls; one much older than the lock
        # expiry belongs to a waiter that died in between. Its age is measured
        # against a probe directory made now, on the file server's clock.
        probe = breaker.with_name(f"{breaker.name}.probe-{os.getpid()}-{jitter():.6f}")
        try:
            os.mkdir(probe)
            try:
                now_ns = os.stat(probe).st_mtime_ns
            finally:
                os.rmdir(probe)
            age = (now_ns - os.stat(breaker).st_mtime_ns) / 1e9
        except OSError:
            return
        if age > self.stale_after:
            log.warning("removing %s left by a waiter that died %.0f s ago", breaker, age)
            with contextlib.suppress(OSError):
                os.rmdir(breaker)


class _DirHeld(Held):
    """A held lock directory: which directory is ours (it changes mtime at each renewal)."""

    def __init__(self, name: str, lifetime: float, since: float, mine: _Seen) -> None:
        super().__init__(name, lifetime, since)
        self.mine = mine
        #: The directory is no longer ours: never touch it again.
        self.lost = False


class LockDirLock:
    """A pmxcfs-style lock directory ``<lock_dir>/<lock_id>``.

    ``unlock_request`` is what a waiter does while the directory exists:
    :func:`pmxcfs_unlock_request` on pmxcfs, :class:`EmulatedPmxcfsExpiry`
    elsewhere (the default picks by where ``lock_dir`` lives).

    ``lifetime``: how long the lock lives after its last renewal (pmxcfs:
    120 s; never more there). On a plain folder the emulated expiry uses it
    too, so that tests can shorten it. An ``acquire_async`` hold renews the
    lock every :data:`RENEW_SHARE` of it while held.
    """

    def __init__(self, lock_dir: Path, lock_id: str, *,
                 unlock_request: UnlockRequest | None = None,
                 hold_budget: float = HOLD_BUDGET, retry_max: float | None = None,
                 lifetime: float = PMXCFS_LOCK_EXPIRY) -> None:
        if not _LOCK_ID.fullmatch(lock_id):
            raise LockError(f"invalid lock id {lock_id!r}: letters, digits, '.', '_', '-' only")
        if not (math.isfinite(lifetime) and lifetime > 0):
            raise LockError(f"lock lifetime {lifetime}: must be a positive number of seconds")
        self.lock_dir = lock_dir
        self.lock_id = lock_id
        self.path = lock_dir / lock_id
        self.name = f"{lock_id} (lock directory {lock_dir})"
        self.hold_budget = hold_budget
        pmxcfs = on_pmxcfs(lock_dir)
        # pmxcfs's own lifetime cannot be lengthened; a shorter one only
        # makes us renew and refuse sooner.
        self.lifetime = min(lifetime, PMXCFS_LOCK_EXPIRY) if pmxcfs else lifetime
        if unlock_request is None:
            unlock_request = (pmxcfs_unlock_request if pmxcfs
                              else EmulatedPmxcfsExpiry(self.lifetime))
        self.unlock_request = unlock_request
        if retry_max is None:
            retry_max = RETRY_MAX_PMXCFS if pmxcfs else RETRY_MAX_FOLDER
        self.retry_max = retry_max

    def _try(self) -> _Seen | None:
        tally.happened("cluster_lock_attempt")
        try:
            os.mkdir(self.path, 0o755)
        except FileExistsError:
            return None
        except FileNotFoundError as err:
            raise LockError(f"lock directory {self.lock_dir} does not exist "
                            "(is the cluster file system online?)") from err
        except OSError as err:
            raise LockError(f"cannot create lock {self.path}: {err.strerror}") from err
        try:
            st = os.stat(self.path)
        except OSError as err:
            self._rmdir_quietly()
            raise LockError(f"cannot stat lock {self.path} just made: {err.strerror}") from err
        return _Seen(st.st_ino, st.st_mtime_ns)

    def _rmdir_quietly(self) -> None:
        with contextlib.suppress(OSError):
            os.rmdir(self.path)

    def _still_mine(self, held: _DirHeld) -> str | None:
        """None while the directory is the one we hold; else what became of it."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return ("it vanished while held (expired as stale), so another holder may have"
                    " run concurrently")
        except OSError as err:
            return f"it cannot be checked: {err.strerror}"
        same_mtime = st.st_mtime_ns in (held.mine.mtime_ns, 0)  # 0: a utime(0, 0) on ours
        if st.st_ino != held.mine.ino or not same_mtime:
            return "it was expired while held and taken by another holder"
        return None

    def renew(self, held: _DirHeld) -> bool:
        """``utime(path, 0, now)``: pmxcfs keeps the lock for another lifetime.

        Only a directory that is still ours is touched. True when renewed;
        otherwise ``held.broken`` says why (logged at error once).
        """
        if held.lost:
            return False
        started = time.monotonic()
        lost = self._still_mine(held)
        if lost is None:
            try:
                os.utime(self.path, (0, time.time()))
                st = os.stat(self.path)
            except OSError as err:
                problem = f"renewing it failed: {err.strerror}"
            else:
                held.mine = _Seen(st.st_ino, st.st_mtime_ns)
                held.renewed_at = started
                if held.broken is not None:
                    log.warning("lock %s renewed again", self.name)
                # A failed renewal is forgiven once one succeeds: the
                # directory was still ours, so it had not expired.
                held.broken = None
                return True
        else:
            held.lost = True
            problem = lost
        if held.broken is None:
            log.error("lock %s: %s", self.name, problem)
        held.broken = problem
        return False

    async def _renew_while_held(self, held: _DirHeld) -> None:
        interval = self.lifetime * RENEW_SHARE
        while True:
            await asyncio.sleep(interval)
            if held.lost:
                return  # never touch another holder's lock
            self.renew(held)

    def _release(self, held: _DirHeld, held_since: float) -> None:
        warn_if_overran(self.name, held_since, self.hold_budget)
        if held.abandoned:
            log.error("lock %s left in place: a command under it may still act; it expires "
                      "%.0f s after its last renewal", self.name, self.lifetime)
            return
        lost = self._still_mine(held)
        if lost is not None:
            # Not ours any more: leave the new holder's directory alone.
            log.error("lock %s at release: %s; leaving it in place", self.name, lost)
            return
        try:
            os.rmdir(self.path)
        except OSError as err:
            log.error("cannot release lock %s: %s", self.name, err.strerror)

    def _timeout(self, backoff: Backoff) -> LockTimeout:
        age: float | None = None
        with contextlib.suppress(OSError):
            mtime = os.stat(self.path).st_mtime
            if mtime > 0:
                age = max(time.time() - mtime, 0.0)
        return LockTimeout(self.name, backoff.waited, age)

    def _waiting(self, timeout: float) -> Attempts[tuple[_Seen, float]]:
        """The attempts of one wait: a ``mkdir``; while it fails, an unlock
        request (at most every :data:`UNLOCK_REQUEST_INTERVAL`) and a second
        ``mkdir`` straight after it, before the pause."""
        last_request: float | None = None

        def attempt() -> tuple[_Seen, float] | None:
            nonlocal last_request
            if (got := self._attempt()) is not None:
                return got
            now = time.monotonic()
            if last_request is None or now - last_request >= UNLOCK_REQUEST_INTERVAL:
                self.unlock_request(self.path)
                last_request = now
            return self._attempt()

        return attempts(attempt, Backoff(timeout, self.retry_max), self._timeout)

    def _attempt(self) -> tuple[_Seen, float] | None:
        """One ``mkdir``: (our directory, the time its life is counted from)."""
        before = time.monotonic()
        mine = self._try()
        return None if mine is None else (mine, before)

    @contextlib.contextmanager
    def acquire(self, timeout: float = DEFAULT_TIMEOUT) -> Iterator[Held]:
        """Hold without renewal (the command line's short holds): the
        :class:`Held` counts the lifetime from the ``mkdir``."""
        mine, since = wait_blocking(self._waiting(timeout))
        held = _DirHeld(self.name, self.lifetime, since, mine)
        held_since = time.monotonic()
        try:
            yield held
        finally:
            self._release(held, held_since)

    @contextlib.asynccontextmanager
    async def acquire_async(
        self, timeout: float = DEFAULT_TIMEOUT  # noqa: ASYNC109 - bounds the wait, not the body
    ) -> AsyncIterator[Held]:
        """Hold, renewing the lock every :data:`RENEW_SHARE` of its lifetime."""
        mine, since = await wait_async(self._waiting(timeout))
        async with self._hold_async(mine, since) as held:
            yield held

    def owned(self) -> tuple[int, int] | None:
        """(inode, mtime in ns) of the lock directory as it is now, or None
        if there is none: what a holder records to :meth:`adopt_async` it later."""
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return st.st_ino, st.st_mtime_ns

    @contextlib.asynccontextmanager
    async def adopt_async(self, ino: int, mtime_ns: int) -> AsyncIterator[Held]:
        """Hold a lock directory an earlier holder on this node left in place
        (a daemon that stopped while a command under it could still act) as
        if we had taken it: renewed, released at the end.

        Only the very directory it left: same inode, and unchanged since its
        last renewal (pmxcfs never lowers a lock's mtime, so a newer one is a
        new holder's). Raises :class:`LockError` otherwise: it expired or was
        taken by another holder meanwhile, and taking it now is a fresh wait.
        """
        seen = _Seen(ino, mtime_ns)
        probe = _DirHeld(self.name, self.lifetime, time.monotonic(), seen)
        lost = self._still_mine(probe)
        if lost is not None:
            raise LockError(f"lock {self.name} cannot be taken over: {lost}")
        # Renewed at once: its life so far is unknown here.
        if not self.renew(probe):
            raise LockError(f"lock {self.name} cannot be taken over: {probe.broken}")
        async with self._hold_async(probe.mine, probe.renewed_at) as held:
            yield held

    @contextlib.asynccontextmanager
    async def _hold_async(self, mine: _Seen, since: float) -> AsyncIterator[_DirHeld]:
        held = _DirHeld(self.name, self.lifetime, since, mine)
        held_since = time.monotonic()
        renewer = asyncio.create_task(self._renew_while_held(held),
                                      name=f"renew {self.lock_id}")
        try:
            yield held
        finally:
            # The renewal runs only between awaits: once cancelled it cannot
            # touch the directory again, so release before awaiting its end
            # (a second cancellation then cannot leave the lock behind).
            renewer.cancel()
            self._release(held, held_since)
            await asyncio.gather(renewer, return_exceptions=True)


def held_directory(held: Held) -> tuple[int, int] | None:
    """(inode, mtime in ns) of the lock directory ``held`` holds, as of its
    last renewal; None for a hold that is no lock directory's, or one lost."""
    if not isinstance(held, _DirHeld) or held.lost:
        return None
    return held.mine.ino, held.mine.mtime_ns
