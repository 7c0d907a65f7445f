"""Cluster-wide and node-local locks behind one small interface.

Two backends, chosen by where the protected thing lives:

* :class:`LockDirLock`: a lock directory, as ``PVE::Cluster::cfs_lock`` does
  on pmxcfs: ``mkdir <lockdir>/<id>`` is the atomic test-and-set; while it
  exists the waiter sends an *unlock request* and retries for up to 10 s;
  ``rmdir`` releases. pmxcfs expires a lock directory unchanged for 120 s when
  a waiter asks. An ``acquire_async`` holder therefore renews it while held
  (``utime(path, 0, now)``, which pmxcfs documents as "another 120 seconds")
  every quarter of the lifetime.
* :class:`FlockLock`: ``flock`` on a lock file, for one node on an ordinary
  file system; the same kernel lock Proxmox's ``PVE::Tools::lock_file`` takes,
  so ours and theirs exclude each other.

Every ``acquire`` yields a :class:`Held`: how long the lock is guaranteed
to stay ours from its last successful renewal. :meth:`Held.require` refuses
(:class:`LockLifetimeError`) when less than a change's budget remains, so no
LVM change starts that could outlive the lock. Budgets, all counted from a
renewal: a change's command timeout plus the bounded wait after its kill
(:data:`pvestord.adapters.command.KILL_WAIT`) plus :data:`MARGIN_SHARE` of the
lifetime must fit in the ``1 - RENEW_SHARE`` of it that a renewal leaves at
worst (30 + 5 + 10 s of 90 s on pmxcfs; :class:`pvestord.adapters.config.DaemonSettings`
refuses settings where it does not).

:class:`VgLock` holds the locks of every storage on one VG (Proxmox locks
by storage id, not VG), refuses a VG marked unhealthy, and when a command
under it survives SIGKILL, marks the VG and leaves the locks to a custodian
that keeps them, renewed, until that process has gone.

Every wait is a retry loop (``time.sleep`` for the command line,
``asyncio.sleep`` for the daemons): a lock that cannot be had in time raises
:class:`LockTimeout` naming the lock and its holder's age; nothing hangs.

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
import errno
import fcntl
import logging
import math
import os
import re
import time
from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from pvestord import paths
from pvestord.adapters.command import UnkillableCommandError
from pvestord.adapters.vghealth import VgHealth
from pvestord.errors import PvestordError

log = logging.getLogger(__name__)

#: How long a waiter tries before giving up (``cfs_lock``'s default).
DEFAULT_TIMEOUT = 10.0
#: pmxcfs expires a lock directory unchanged for longer than this
#: (``CFS_LOCK_TIMEOUT`` in pmxcfs's memdb.c).
PMXCFS_LOCK_EXPIRY = 120.0
#: A holder should be done by then (``cfs_lock`` aborts its code after 60 s).
HOLD_BUDGET = 60.0
#: A holder renews its lock directory (``utime(path, 0, now)``: pmxcfs then
#: keeps it for another lifetime) every this share of the lifetime: 30 s on
#: pmxcfs, so that three renewals in a row may fail before it can expire.
RENEW_SHARE = 0.25
#: :meth:`Held.require` keeps this share of the lifetime in reserve (10 s on
#: pmxcfs): the judge of a lock's age is pmxcfs on the lowest-id node, with
#: its own clock and message latency, and our renewal is timed from before
#: the call, not from when pmxcfs saw it.
MARGIN_SHARE = 1 / 12
#: Unlock requests go out at most this often (``cfs_lock`` sends one per ~1 s retry).
UNLOCK_REQUEST_INTERVAL = 1.0
#: Retry back-off of the ``mkdir``/``flock`` attempts: the first pause, then
#: doubling up to a cap per backend. Polling waiters only get the lock in the
#: gap between one holder's release and the next acquisition, so the cap
#: decides how fairly a busy lock is shared. ``cfs_lock`` retries every 1 s;
#: we poll faster so that a busy queue does not stall: on pmxcfs every attempt
#: is a cluster message, so 100 ms there; a plain folder (9p, tests) answers
#: from one server, 10 ms; flock is a local syscall, 5 ms.
RETRY_FIRST = 0.001
RETRY_MAX_PMXCFS = 0.1
RETRY_MAX_FOLDER = 0.01
RETRY_MAX_FLOCK = 0.005

# Lock ids become file names: Proxmox's ids are "storage-<storeid>",
# "file-<name>", "domain-<name>"; storage ids may contain dots.
_LOCK_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
# PVE::JSONSchema parse_storage_id.
_STORAGE_ID = re.compile(r"[a-z][a-z0-9._-]*[a-z0-9]", re.IGNORECASE)


class LockError(PvestordError):
    """A lock could not be used at all (bad id, missing directory, I/O error)."""


class LockTimeout(LockError):
    """The lock was held by someone else for the whole wait."""

    def __init__(self, name: str, waited: float, holder_age: float | None,
                 detail: str = "") -> None:
        self.name = name
        self.waited = waited
        self.holder_age = holder_age
        age = f"held for {holder_age:.0f} s" if holder_age is not None else "holder's age unknown"
        extra = f"; {detail}" if detail else ""
        super().__init__(f"timed out after {waited:.1f} s waiting for lock {name} ({age}{extra})")


class LockLifetimeError(LockError):
    """A held lock may not stay ours long enough for what comes next (or a
    renewal failed, or it was found taken by someone else): the work is not
    started."""


class Held:
    """One hold of a lock: how long it is guaranteed to stay ours.

    ``lifetime`` None: the lock never expires on its own (``flock``). A lock
    directory's life runs from the start of its last successful renewal (or
    of the ``mkdir`` that took it); :meth:`require` refuses work that could
    outlast it.
    """

    def __init__(self, name: str, lifetime: float | None, since: float) -> None:
        self.name = name
        self.lifetime = lifetime
        #: Monotonic time from which the lock is guaranteed for ``lifetime``.
        self.renewed_at = since
        #: Why the guarantee is gone (renewal failed, lock taken by another), if it is.
        self.broken: str | None = None
        #: Leave the lock in place at release (a stuck command may still act).
        self.abandoned = False

    def remaining(self) -> float:
        """Seconds the lock is still guaranteed to be ours (``inf``: no expiry)."""
        if self.broken is not None:
            return 0.0
        if self.lifetime is None:
            return math.inf
        return self.lifetime - (time.monotonic() - self.renewed_at)

    def margin(self) -> float:
        return 0.0 if self.lifetime is None else self.lifetime * MARGIN_SHARE

    def require(self, seconds: float) -> None:
        """Raise :class:`LockLifetimeError` unless the lock stays ours for
        ``seconds`` more, with the margin (:data:`MARGIN_SHARE`) to spare."""
        if self.broken is not None:
            raise LockLifetimeError(f"lock {self.name} can no longer be vouched for: "
                                    f"{self.broken}; nothing is changed under it")
        left = self.remaining() - self.margin()
        if left < seconds:
            raise LockLifetimeError(
                f"lock {self.name} is guaranteed for {max(left, 0.0):.1f} s more (margin "
                f"{self.margin():.1f} s kept), less than the {seconds:.1f} s the next "
                "change may take; nothing is changed under it")

    def abandon(self) -> None:
        """At release, leave the lock as it is: it expires on its own."""
        self.abandoned = True


class HeldAll(Held):
    """Several locks held together (every storage of one VG)."""

    def __init__(self, name: str, helds: Sequence[Held]) -> None:
        super().__init__(name, None, time.monotonic())
        self.helds = list(helds)

    def remaining(self) -> float:
        return min((h.remaining() for h in self.helds), default=math.inf)

    def margin(self) -> float:
        return max((h.margin() for h in self.helds), default=0.0)

    def require(self, seconds: float) -> None:
        for held in self.helds:
            held.require(seconds)

    def abandon(self) -> None:
        super().abandon()
        for held in self.helds:
            held.abandon()


class Lock(Protocol):
    """One named lock; each ``acquire`` is an independent, non-reentrant hold."""

    name: str

    def acquire(self, timeout: float = DEFAULT_TIMEOUT) -> contextlib.AbstractContextManager[Held]:
        """Hold the lock for the ``with`` block; raises :class:`LockTimeout`."""
        ...

    def acquire_async(
        self, timeout: float = DEFAULT_TIMEOUT
    ) -> contextlib.AbstractAsyncContextManager[Held]:
        """Hold the lock for the ``async with`` block, waiting with ``asyncio.sleep``."""
        ...


class _Backoff:
    """Pauses between attempts: exponential, capped, with some jitter so that
    waiters started together do not retry in lock-step."""

    def __init__(self, timeout: float, cap: float) -> None:
        self.cap = cap
        self.start = time.monotonic()
        self.deadline = self.start + timeout
        self.pause = RETRY_FIRST

    def next_pause(self) -> float | None:
        """The next pause, or None once the deadline has passed."""
        now = time.monotonic()
        if now >= self.deadline:
            return None
        pause = min(self.pause * (0.5 + _jitter()), self.deadline - now)
        self.pause = min(self.pause * 2, self.cap)
        return max(pause, 0.0)

    @property
    def waited(self) -> float:
        return time.monotonic() - self.start


def _jitter() -> float:
    return int.from_bytes(os.urandom(2), "little") / 65535.0


def _warn_if_overran(name: str, held_since: float, budget: float) -> None:
    held = time.monotonic() - held_since
    if held > budget:
        log.warning("lock %s was held for %.1f s, longer than its %.0f s budget: pmxcfs "
                    "expires cluster locks after %.0f s, and waiters time out after %.0f s",
                    name, held, budget, PMXCFS_LOCK_EXPIRY, DEFAULT_TIMEOUT)


# ---------------------------------------------------------------------------
# flock backend


class FlockLock:
    """``flock(LOCK_EX)`` on ``path``, created if missing.

    The lock file's mtime is set at each acquisition so that a waiter that
    times out can say how long the current holder has had it (Proxmox's own
    holders do not touch it, so for them this is an upper bound).
    """

    def __init__(self, path: Path, *, hold_budget: float = HOLD_BUDGET,
                 retry_max: float = RETRY_MAX_FLOCK) -> None:
        self.path = path
        self.retry_max = retry_max
        self.name = f"{path} (flock)"
        self.hold_budget = hold_budget

    def _open(self) -> int:
        try:
            return os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
        except OSError as err:
            raise LockError(f"cannot open lock file {self.path}: {err.strerror}") from err

    def _try(self, fd: int) -> bool:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        except OSError as err:
            raise LockError(f"flock on {self.path} failed: {err.strerror}") from err
        with contextlib.suppress(OSError):
            os.utime(fd)
        return True

    def _timeout(self, backoff: _Backoff) -> LockTimeout:
        age: float | None = None
        with contextlib.suppress(OSError):
            age = max(time.time() - os.stat(self.path).st_mtime, 0.0)
        holders = _flock_holders(self.path)
        detail = f"holder pid {', '.join(map(str, holders))}" if holders else ""
        return LockTimeout(self.name, backoff.waited, age, detail)

    @contextlib.contextmanager
    def acquire(self, timeout: float = DEFAULT_TIMEOUT) -> Iterator[Held]:
        fd = self._open()
        try:
            backoff = _Backoff(timeout, self.retry_max)
            while not self._try(fd):
                pause = backoff.next_pause()
                if pause is None:
                    raise self._timeout(backoff)
                time.sleep(pause)
            held_since = time.monotonic()
            try:
                yield Held(self.name, None, held_since)
            finally:
                _warn_if_overran(self.name, held_since, self.hold_budget)
        finally:
            os.close(fd)  # closing the descriptor drops the flock

    @contextlib.asynccontextmanager
    async def acquire_async(
        self, timeout: float = DEFAULT_TIMEOUT  # noqa: ASYNC109 - bounds the wait, not the body
    ) -> AsyncIterator[Held]:
        fd = self._open()
        try:
            backoff = _Backoff(timeout, self.retry_max)
            while not self._try(fd):
                pause = backoff.next_pause()
                if pause is None:
                    raise self._timeout(backoff)
                await asyncio.sleep(pause)
            held_since = time.monotonic()
            try:
                yield Held(self.name, None, held_since)
            finally:
                _warn_if_overran(self.name, held_since, self.hold_budget)
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


# ---------------------------------------------------------------------------
# lock-directory backend


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
        probe = breaker.with_name(f"{breaker.name}.probe-{os.getpid()}-{_jitter():.6f}")
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
        _warn_if_overran(self.name, held_since, self.hold_budget)
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

    def _timeout(self, backoff: _Backoff) -> LockTimeout:
        age: float | None = None
        with contextlib.suppress(OSError):
            mtime = os.stat(self.path).st_mtime
            if mtime > 0:
                age = max(time.time() - mtime, 0.0)
        return LockTimeout(self.name, backoff.waited, age)

    def _maybe_request(self, last: float | None) -> float | None:
        now = time.monotonic()
        if last is None or now - last >= UNLOCK_REQUEST_INTERVAL:
            self.unlock_request(self.path)
            return now
        return last

    def _attempt(self) -> tuple[_Seen, float] | None:
        """One ``mkdir``: (our directory, the time its life is counted from)."""
        before = time.monotonic()
        mine = self._try()
        return None if mine is None else (mine, before)

    @contextlib.contextmanager
    def acquire(self, timeout: float = DEFAULT_TIMEOUT) -> Iterator[Held]:
        """Hold without renewal (the command line's short holds): the
        :class:`Held` counts the lifetime from the ``mkdir``."""
        backoff = _Backoff(timeout, self.retry_max)
        last_request: float | None = None
        while (got := self._attempt()) is None:
            last_request = self._maybe_request(last_request)
            if (got := self._attempt()) is not None:
                break
            pause = backoff.next_pause()
            if pause is None:
                raise self._timeout(backoff)
            time.sleep(pause)
        held = _DirHeld(self.name, self.lifetime, got[1], got[0])
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
        backoff = _Backoff(timeout, self.retry_max)
        last_request: float | None = None
        while (got := self._attempt()) is None:
            last_request = self._maybe_request(last_request)
            if (got := self._attempt()) is not None:
                break
            pause = backoff.next_pause()
            if pause is None:
                raise self._timeout(backoff)
            await asyncio.sleep(pause)
        held = _DirHeld(self.name, self.lifetime, got[1], got[0])
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


# ---------------------------------------------------------------------------
# choosing a backend


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


def _check_storage_id(storeid: str) -> None:
    if not _STORAGE_ID.fullmatch(storeid):
        raise LockError(f"invalid storage id {storeid!r}")


def queue_lock(queue_path: Path, lock_dir: Path | None = None) -> Lock:
    """The lock every read-modify-write of the queue file holds.

    On pmxcfs, or with ``lock_dir``: a lock directory named as
    ``cfs_lock_file`` would name it (``file-extend-queue``). Elsewhere:
    flock on ``<queue>.lock`` beside the queue.
    """
    lock_id = "file-" + re.sub(r"[./]", "_", queue_path.name)
    if lock_dir is not None:
        return LockDirLock(lock_dir, lock_id)
    if on_pmxcfs(queue_path.parent):
        return LockDirLock(paths.PMXCFS_LOCK_DIR, lock_id)
    return FlockLock(queue_path.with_name(queue_path.name + ".lock"))


def storage_lock(storeid: str, *, shared: bool, lock_dir: Path | None = None,
                 flock_dir: Path = paths.LOCAL_LOCK_DIR,
                 lifetime: float = PMXCFS_LOCK_EXPIRY) -> Lock:
    """The lock Proxmox's own storage code takes around lvcreate/lvremove.

    As ``PVE::Storage::Plugin::cluster_lock_storage``: shared storage on a
    pmxcfs node takes ``cfs_lock_storage`` (lock directory
    ``storage-<storeid>``); otherwise flock on
    ``/var/lock/pve-manager/pve-storage-<storeid>``. ``lock_dir`` forces the
    lock-directory backend (the two-node bed's shared folder).
    """
    _check_storage_id(storeid)
    lock_id = f"storage-{storeid}"
    if lock_dir is not None:
        return LockDirLock(lock_dir, lock_id, lifetime=lifetime)
    if shared and on_pmxcfs(paths.PMXCFS_LOCK_DIR):
        return LockDirLock(paths.PMXCFS_LOCK_DIR, lock_id, lifetime=lifetime)
    try:
        flock_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        if err.errno != errno.EEXIST:
            raise LockError(f"cannot create lock folder {flock_dir}: {err.strerror}") from err
    return FlockLock(flock_dir / f"pve-storage-{storeid}")


# ---------------------------------------------------------------------------
# every storage of one VG, and what happens when a command under it is stuck

#: How often a custodian looks whether the stuck command has gone.
CUSTODY_POLL = 1.0

#: Custodians at work, kept referenced until they are done.
_CUSTODIANS: set[asyncio.Task[None]] = set()


def unkillable_cause(exc: BaseException | None) -> UnkillableCommandError | None:
    """The :class:`UnkillableCommandError` behind ``exc`` (it may be wrapped
    in an LVM error or carried by a cancellation), or None."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, UnkillableCommandError):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


class VgLock:
    """The locks of every storage that uses one VG, taken in a fixed order.

    Proxmox locks ``storage-<storeid>``, not the VG: a thin and a thick
    storage on one VG, each with its own lock, would let two writers change
    the VG's metadata at once. So all of them are held (sorted by storage
    id, released in reverse; every holder takes them in the same order, so
    two of them cannot deadlock).

    Before taking anything, a VG marked unhealthy on this node
    (:class:`pvestord.adapters.vghealth.VgHealth`) is refused. When a command under
    the locks could not be killed (:class:`UnkillableCommandError`), the VG
    is marked, and the locks go to a custodian task that keeps renewing
    them while the stuck process lives (it may still write the metadata),
    and releases them once it has gone; the caller gets the error at once.
    """

    def __init__(self, vg: str, locks: Sequence[Lock], health: VgHealth | None = None) -> None:
        self.vg = vg
        self.locks = list(locks)
        self.health = health
        self.name = f"VG {vg}: " + ", ".join(lock.name for lock in self.locks)

    def _check(self) -> None:
        if self.health is not None:
            self.health.check(self.vg)

    def _mark(self, stuck: UnkillableCommandError) -> None:
        if self.health is not None:
            self.health.mark(self.vg, f"{' '.join(stuck.argv[:2])} (pid "
                             f"{', '.join(map(str, stuck.pids)) or 'unknown'}) did not end "
                             "after SIGKILL: it may still write this VG's metadata")

    @contextlib.contextmanager
    def acquire(self, timeout: float = DEFAULT_TIMEOUT) -> Iterator[Held]:
        """As :meth:`acquire_async`, without renewal or custodian: a stuck
        command leaves the locks in place to expire on their own."""
        self._check()
        deadline = time.monotonic() + timeout
        with contextlib.ExitStack() as stack:
            helds = [stack.enter_context(lock.acquire(max(deadline - time.monotonic(), 0.0)))
                     for lock in self.locks]
            held = HeldAll(self.name, helds)
            try:
                yield held
            except BaseException as exc:
                stuck = unkillable_cause(exc)
                if stuck is not None:
                    self._mark(stuck)
                    held.abandon()
                raise

    @contextlib.asynccontextmanager
    async def acquire_async(
        self, timeout: float = DEFAULT_TIMEOUT  # noqa: ASYNC109 - bounds the wait, not the body
    ) -> AsyncIterator[Held]:
        self._check()
        deadline = time.monotonic() + timeout
        stack = contextlib.AsyncExitStack()
        try:
            helds = [await stack.enter_async_context(
                lock.acquire_async(max(deadline - time.monotonic(), 0.0)))
                for lock in self.locks]
        except BaseException:
            await stack.aclose()
            raise
        held = HeldAll(self.name, helds)
        try:
            yield held
        except BaseException as exc:
            stuck = unkillable_cause(exc)
            if stuck is None:
                await stack.aclose()
                raise
            self._mark(stuck)
            task = asyncio.create_task(_custody(self.name, stack, held, stuck),
                                       name=f"custody of {self.vg}")
            _CUSTODIANS.add(task)
            task.add_done_callback(_CUSTODIANS.discard)
            raise
        await stack.aclose()


async def _custody(name: str, stack: contextlib.AsyncExitStack, held: Held,
                   stuck: UnkillableCommandError) -> None:
    """Keep ``stack``'s locks (their renewal runs on) until ``stuck`` has gone."""
    pids = ", ".join(map(str, stuck.pids)) or "unknown"
    log.error("keeping lock %s while pid %s, which SIGKILL did not end, may still act",
              name, pids)
    started = time.monotonic()
    try:
        # Polled: the stuck processes are no children of ours to wait for.
        while any(process.alive() for process in stuck.stuck):  # noqa: ASYNC110
            await asyncio.sleep(CUSTODY_POLL)
    except asyncio.CancelledError:
        # Our own shutdown: what is left is to not release the locks.
        held.abandon()
        log.error("stopping while pid %s may still act: lock %s left to expire", pids, name)
        await stack.aclose()
        raise
    log.warning("pid %s ended %.0f s after it was killed: releasing lock %s", pids,
                time.monotonic() - started, name)
    await stack.aclose()


async def custodians_done(timeout: float) -> bool:  # noqa: ASYNC109 - a bound, not a deadline
    """Wait up to ``timeout`` for every custodian; True if none is left."""
    tasks = list(_CUSTODIANS)
    if not tasks:
        return True
    _, pending = await asyncio.wait(tasks, timeout=timeout)
    return not pending


def vg_lock(vg: str, storages: Iterable[tuple[str, bool]], *, lock_dir: Path | None = None,
            lifetime: float = PMXCFS_LOCK_EXPIRY, health: VgHealth | None = None,
            flock_dir: Path = paths.LOCAL_LOCK_DIR) -> VgLock:
    """:class:`VgLock` of ``vg`` over ``storages`` (``(storeid, shared)``, each
    locked as :func:`storage_lock` locks it), in sorted order of storage id."""
    ordered = sorted(dict(storages).items())
    if not ordered:
        raise LockError(f"no storage uses VG {vg}: nothing to lock")
    return VgLock(vg, [storage_lock(storeid, shared=shared, lock_dir=lock_dir,
                                    flock_dir=flock_dir, lifetime=lifetime)
                       for storeid, shared in ordered], health)


__all__ = [
    "DEFAULT_TIMEOUT", "HOLD_BUDGET", "PMXCFS_LOCK_EXPIRY", "EmulatedPmxcfsExpiry", "FlockLock",
    "Held", "Lock", "LockDirLock", "LockError", "LockLifetimeError", "LockTimeout",
    "UnlockRequest", "VgLock", "custodians_done", "on_pmxcfs", "pmxcfs_unlock_request",
    "queue_lock", "storage_lock", "unkillable_cause", "vg_lock",
]
