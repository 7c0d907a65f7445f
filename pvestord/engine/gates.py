"""Who may change a VG's LVs now: a gate per VG in this process, and the
storage lock across the cluster (two nodes writing one VG's metadata lose an
extension)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable

from pvestord.adapters.budgets import STORAGE_LOCK_WAIT
from pvestord.adapters.config import StorageConfig, ThinStorage
from pvestord.adapters.locks import Held, VgLock, vg_lock
from pvestord.adapters.settings import DaemonSettings
from pvestord.adapters.vghealth import VgMarks


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
