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
worst (:func:`pvestord.adapters.budgets.guaranteed_hold`: 30 + 5 s of 80 s for the
daemon's changes on pmxcfs, 40 + 5 s for a volume command's;
:class:`pvestord.adapters.settings.DaemonSettings` refuses settings where the
daemon's do not fit).

:class:`VgLock` holds the locks of every storage on one VG (Proxmox locks
by storage id, not VG), refuses a VG marked unhealthy, and when a command
under it survives SIGKILL, marks the VG and leaves the locks to a custodian
that keeps them, renewed, until that process has gone, across a restart of
the daemon too (:mod:`pvestord.adapters.custody`).

Every wait is a retry loop (``time.sleep`` for the command line,
``asyncio.sleep`` for the daemons): a lock that cannot be had in time raises
:class:`LockTimeout` naming the lock and its holder's age; nothing hangs.

The parts live beside this module: :mod:`pvestord.adapters.lockheld` (budgets,
errors, :class:`Held`, the wait loop), :mod:`pvestord.adapters.lockflock` and
:mod:`pvestord.adapters.lockdir` (the backends, and on a plain folder the
emulated pmxcfs expiry). Here: which backend protects what, and the VG lock.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import re
import time
from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from pathlib import Path

from pvestord import paths
from pvestord.adapters import custody
from pvestord.adapters.command import UnkillableCommandError
from pvestord.adapters.custody import CUSTODY_POLL, custodians_done
from pvestord.adapters.lockdir import (
    EmulatedPmxcfsExpiry,
    LockDirLock,
    UnlockRequest,
    on_pmxcfs,
    pmxcfs_unlock_request,
)
from pvestord.adapters.lockflock import FlockLock
from pvestord.adapters.lockheld import (
    DEFAULT_TIMEOUT,
    HOLD_BUDGET,
    MARGIN_SHARE,
    PMXCFS_LOCK_EXPIRY,
    RENEW_SHARE,
    Held,
    HeldAll,
    Lock,
    LockError,
    LockLifetimeError,
    LockTimeout,
)
from pvestord.adapters.vghealth import VgMarks
from pvestord.policy.proxmox import is_storage_id

log = logging.getLogger(__name__)

def _check_storage_id(storeid: str) -> None:
    if not is_storage_id(storeid):
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
    (:class:`pvestord.adapters.vghealth.VgMarks`) is refused. When a command under
    the locks could not be killed (:class:`UnkillableCommandError`), the VG
    is marked, and the locks go to a custodian task that keeps renewing
    them while the stuck process lives (it may still write the metadata),
    and releases them once it has gone; the caller gets the error at once.
    """

    def __init__(self, vg: str, locks: Sequence[Lock], health: VgMarks | None = None) -> None:
        self.vg = vg
        self.locks = list(locks)
        self.health = health
        self.name = f"VG {vg}: " + ", ".join(lock.name for lock in self.locks)

    def _check(self) -> None:
        if self.health is not None:
            self.health.check(self.vg)

    def _book(self) -> custody.CustodyBook | None:
        if self.health is None:
            return None
        return custody.CustodyBook(custody.custody_folder(self.health))

    def _mark(self, stuck: UnkillableCommandError) -> None:
        if self.health is not None:
            self.health.mark(self.vg, f"{' '.join(stuck.argv[:2])} (pid "
                             f"{', '.join(map(str, stuck.pids)) or 'unknown'}) did not end "
                             "after SIGKILL: it may still write this VG's metadata")

    @contextlib.contextmanager
    def acquire(self, timeout: float = DEFAULT_TIMEOUT) -> Iterator[Held]:
        """As :meth:`acquire_async`, without renewal or custodian: a stuck
        command leaves the locks in place, written down for the daemon to
        take over (:func:`pvestord.adapters.custody.resume`)."""
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
                    # No task to keep the locks here (the command line exits):
                    # written down for the daemon, which takes them over at its
                    # next reconcile (custody.resume).
                    book = self._book()
                    if book is not None:
                        try:
                            book.write(custody.record_of(self.vg, stuck.argv, stuck.stuck,
                                                         self.locks, held, time.time()))
                        except OSError as err:
                            log.error("cannot write the custody record of VG %s: %s",
                                      self.vg, err)
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
            log.error("keeping lock %s while pid %s, which SIGKILL did not end, may still act",
                      self.name, ", ".join(map(str, stuck.pids)) or "unknown")
            book = self._book()
            custody.start(self.name, stack, self.locks, held,
                          custody.record_of(self.vg, stuck.argv, stuck.stuck, self.locks, held,
                                            time.time()), book)
            raise
        await stack.aclose()


def vg_lock(vg: str, storages: Iterable[tuple[str, bool]], *, lock_dir: Path | None = None,
            lifetime: float = PMXCFS_LOCK_EXPIRY, health: VgMarks | None = None,
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
    "CUSTODY_POLL", "DEFAULT_TIMEOUT", "HOLD_BUDGET", "MARGIN_SHARE", "PMXCFS_LOCK_EXPIRY",
    "RENEW_SHARE",
    "EmulatedPmxcfsExpiry", "FlockLock", "Held", "Lock", "LockDirLock", "LockError",
    "LockLifetimeError", "LockTimeout", "UnlockRequest", "VgLock", "custodians_done",
    "on_pmxcfs", "pmxcfs_unlock_request", "queue_lock", "storage_lock", "unkillable_cause",
    "vg_lock",
]
