"""What every lock backend shares: the budgets, the errors, the :class:`Held`
that says how long a hold is guaranteed, and the one wait loop.

A waiter's attempts are a generator (:func:`attempts`) that yields the pause
before the next try and returns what the successful try gave; the command
line drives it with ``time.sleep`` (:func:`wait_blocking`), the daemons with
``asyncio.sleep`` (:func:`wait_async`). A lock that cannot be had in time
raises :class:`LockTimeout` naming the lock and its holder's age; nothing hangs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import time
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from pvestord.adapters import budgets
from pvestord.errors import PvestordError

log = logging.getLogger(__name__)

T = TypeVar("T")

# The budgets and shares themselves, and why each is what it is, are
# pvestord.adapters.budgets'; these are the names the lock modules know them by.
#: How long a waiter tries before giving up (``cfs_lock``'s default).
DEFAULT_TIMEOUT = budgets.STORAGE_LOCK_WAIT
#: pmxcfs expires a lock directory unchanged for longer than this.
PMXCFS_LOCK_EXPIRY = budgets.PMXCFS_LOCK_EXPIRY
#: A holder should be done by then (``cfs_lock`` aborts its code after 60 s).
HOLD_BUDGET = budgets.HOLD_BUDGET
#: A holder renews its lock directory (``utime(path, 0, now)``: pmxcfs then
#: keeps it for another lifetime) every this share of the lifetime.
RENEW_SHARE = budgets.RENEW_SHARE
#: :meth:`Held.require` keeps this share of the lifetime in reserve.
MARGIN_SHARE = budgets.MARGIN_SHARE
#: Unlock requests go out at most this often (``cfs_lock`` sends one per ~1 s retry).
UNLOCK_REQUEST_INTERVAL = 1.0
#: Retry back-off of the ``mkdir``/``flock`` attempts: the first pause, then
#: doubling up to a cap per backend. The first retries come within
#: milliseconds, so a lock held for a moment (most holds: one lvextend) is
#: taken as soon as it is free. On pmxcfs every attempt, failed or not, is a
#: synchronous message to every node and a write of each node's database, so
#: a long wait settles at ``cfs_lock``'s own pace, once a second: the cap
#: there is 1 s, as Proxmox's waiters on the same lock have it, and a waiter
#: makes about 20 attempts in cfs_lock's 10 s instead of 100. A plain folder
#: (9p, tests) answers from one server, 10 ms; flock is a local syscall, 5 ms.
RETRY_FIRST = 0.001
RETRY_MAX_PMXCFS = 1.0
RETRY_MAX_FOLDER = 0.01
RETRY_MAX_FLOCK = 0.005


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

    def reclaim(self) -> None:
        """Undo :meth:`abandon`: release the lock at the end after all."""
        self.abandoned = False


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

    def reclaim(self) -> None:
        super().reclaim()
        for held in self.helds:
            held.reclaim()


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


class Backoff:
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
        pause = min(self.pause * (0.5 + jitter()), self.deadline - now)
        self.pause = min(self.pause * 2, self.cap)
        return max(pause, 0.0)

    @property
    def waited(self) -> float:
        return time.monotonic() - self.start


def jitter() -> float:
    return int.from_bytes(os.urandom(2), "little") / 65535.0


def warn_if_overran(name: str, held_since: float, budget: float) -> None:
    held = time.monotonic() - held_since
    if held > budget:
        log.warning("lock %s was held for %.1f s, longer than its %.0f s budget: pmxcfs "
                    "expires cluster locks after %.0f s, and waiters time out after %.0f s",
                    name, held, budget, PMXCFS_LOCK_EXPIRY, DEFAULT_TIMEOUT)


#: The pauses of one wait, then what the successful attempt gave.
Attempts = Generator[float, None, T]


def attempts(attempt: Callable[[], T | None], backoff: Backoff,
             timed_out: Callable[[Backoff], LockTimeout]) -> Attempts[T]:
    """Try ``attempt`` until it gives something, yielding the pause before
    each retry; raises ``timed_out(backoff)`` once the deadline has passed."""
    while (got := attempt()) is None:
        pause = backoff.next_pause()
        if pause is None:
            raise timed_out(backoff)
        yield pause
    return got


@dataclass(frozen=True)
class _Got(Generic[T]):
    """What a finished wait returned (a pause is a float, so it needs a box)."""

    value: T


def _next_pause(waiting: Attempts[T]) -> float | _Got[T]:
    """The pause ``waiting`` asks for before its next try, or what it got:
    the one step both drivers share, so they differ only in how they sleep."""
    try:
        return next(waiting)
    except StopIteration as done:
        return _Got(done.value)


def wait_blocking(waiting: Attempts[T]) -> T:
    """Drive ``waiting`` with ``time.sleep`` (the command line)."""
    while True:
        step = _next_pause(waiting)
        if isinstance(step, _Got):
            return step.value
        time.sleep(step)


async def wait_async(waiting: Attempts[T]) -> T:
    """Drive ``waiting`` with ``asyncio.sleep`` (the daemons)."""
    while True:
        step = _next_pause(waiting)
        if isinstance(step, _Got):
            return step.value
        await asyncio.sleep(step)
