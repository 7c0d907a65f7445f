"""Changes to a VG's LVs: who may make one now, and which of ours run.

Two nodes writing one VG's metadata lose an extension, so every change takes
the VG's gate (one change per VG in this process, or one in all with
``global_worker``) and then the storage lock, which serializes the cluster
(:class:`VgGates`).

The pass deadline marks a VM's VGs unhealthy only while one of our changes
runs (:class:`LvmChanges`, read by :mod:`pvestord.engine.passes`): a command
cut off there may have left the metadata or a table half changed. A pass that
was waiting for QMP or for the storage lock changed nothing, so it is not
counted there.

How our last change on each VG ended is kept for this node's report
(:class:`LvmHealth`, :mod:`pvestord.engine.nodereport`).

A change that did not end on its own (killed at its timeout, or cut off with
its pass) may have been killed between the suspend and the resume of its LV's
table: such LVs are noted (:meth:`LvmChanges.take_killed`) for the check of
suspended LVs (:mod:`pvestord.engine.suspension`), which is woken at once.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Iterator

from pvestord.adapters.budgets import STORAGE_LOCK_WAIT
from pvestord.adapters.config import StorageConfig, ThinStorage
from pvestord.adapters.locks import Held, VgLock, unkillable_cause, vg_lock
from pvestord.adapters.settings import DaemonSettings
from pvestord.adapters.vghealth import VgMarks
from pvestord.errors import CommandError


class VgGates:
    """The per-VG gates (or one global one) and the storage locks."""

    def __init__(self, settings: DaemonSettings,
                 storage_config: Callable[[], StorageConfig]) -> None:
        self.settings = settings
        self._storage_config = storage_config
        self._gates: dict[str, asyncio.Lock] = {}
        self._global_gate = asyncio.Lock()

    @contextlib.asynccontextmanager
    async def gate(self, vg: str) -> AsyncIterator[None]:
        """Serialize extensions per VG (or globally, as the original proposal did)."""
        gate = self._global_gate if self.settings.global_worker else self._gates.setdefault(
            vg, asyncio.Lock())
        async with gate:
            yield

    def storage_lock(self, storage: ThinStorage) -> VgLock:
        """The locks of every storage on ``storage``'s VG (Proxmox locks a
        storage by its id, not its VG: two storages on one VG exclude each
        other only if both locks are held), refused while the VG is marked
        unhealthy on this node."""
        return vg_lock(storage.vgname, self._storage_config().vg_users(storage.vgname),
                       lock_dir=self.settings.lock_dir, lifetime=self.settings.lock_lifetime,
                       health=VgMarks(self.settings.vg_health_dir))

    @contextlib.asynccontextmanager
    async def locked(self, vg: str, storage: ThinStorage,
                     budget: float = STORAGE_LOCK_WAIT) -> AsyncIterator[Held]:
        """``vg``'s gate, then the storage lock (waited for up to ``budget``
        seconds): what any LVM change runs under."""
        async with self.gate(vg), \
                self.storage_lock(storage).acquire_async(budget) as held:
            yield held



def _killed(exc: BaseException) -> bool:
    """Whether ``exc`` says our command was killed and has ended: a timeout,
    or a cancellation (ours kills the command). One that SIGKILL did not end
    may still resume its LV itself: it is the custodian's, not ours."""
    if unkillable_cause(exc) is not None:
        return False
    if isinstance(exc, asyncio.CancelledError):
        return True
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, CommandError) and cause.timed_out:
            return True
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return False


class LvmChanges:
    """The drives, by (vmid, file node), whose ``lvextend`` or ``lvchange``
    runs right now."""

    def __init__(self, on_killed: Callable[[], None] | None = None) -> None:
        self._running: set[tuple[int, str]] = set()
        self._killed: set[tuple[str, str]] = set()
        self.on_killed = on_killed

    @contextlib.contextmanager
    def running(self, vmid: int, node: str, lv: tuple[str, str] | None = None) -> Iterator[None]:
        """Around one command that changes the VG for ``node`` of ``vmid``;
        ``lv``: the (VG, LV) whose table it reloads."""
        key = (vmid, node)
        self._running.add(key)
        try:
            yield
        except BaseException as exc:
            if lv is not None and _killed(exc):
                self._killed.add(lv)
                if self.on_killed is not None:
                    self.on_killed()
            raise
        finally:
            self._running.discard(key)

    def of_vm(self, vmid: int) -> bool:
        """Whether a command that changes a VG runs for ``vmid`` now."""
        return any(key[0] == vmid for key in self._running)

    def vms(self) -> set[int]:
        """The VMs with a command that changes a VG running now."""
        return {key[0] for key in self._running}

    def take_killed(self) -> set[tuple[str, str]]:
        """The (VG, LV)s whose change of ours was killed since the last call."""
        killed, self._killed = self._killed, set()
        return killed


class LvmHealth:
    """Failures of the daemon's own LVM commands per VG since the last report.

    The report's probe is one moment; an ``lvextend`` that failed between
    two probes is the kind of thing a placement decision wants to know.
    """

    def __init__(self) -> None:
        self._errors: dict[str, str | None] = {}

    def record(self, vg: str, error: str | None) -> None:
        """The outcome of a command on ``vg``: None for success."""
        self._errors[vg] = error

    def take(self, vg: str) -> str | None:
        """The last outcome recorded for ``vg`` since the previous take, if it failed."""
        return self._errors.pop(vg, None)
