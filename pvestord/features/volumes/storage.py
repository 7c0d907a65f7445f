"""Where a volume command's storage, locks and settings come from.

Every volume command works on one thin-enabled LVM storage of ``storage.cfg``
and changes LVM metadata only under the storage locks of every storage on
the VG (:func:`pvestord.adapters.locks.vg_lock`; each is the lock Proxmox's
``vdisk_alloc`` holds around ``alloc_image``).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from pvestord import paths
from pvestord.adapters import vghealth
from pvestord.adapters.budgets import STORAGE_LOCK_WAIT
from pvestord.adapters.config import StorageConfig, ThinStorage, load_storage_config
from pvestord.adapters.locks import PMXCFS_LOCK_EXPIRY, Held, vg_lock
from pvestord.adapters.vghealth import VgMarks
from pvestord.policy.storageoptions import CHUNKSIZE
from pvestord.policy.volumes import VolumeError

#: pmxcfs's mount: ``.members`` (quorum, node name), ``.vmlist`` (VM -> node), ``.rrd``.
CLUSTER_DIR = Path("/etc/pve")


@dataclass(frozen=True)
class VolumeSettings:
    """Where things live; every one is a command-line option."""

    storage_config: Path = paths.STORAGE_CFG
    run_dir: Path = paths.QEMU_SERVER_RUN
    cluster_dir: Path = CLUSTER_DIR
    #: Force pmxcfs-style lock directories here (see :func:`storage_lock`).
    lock_dir: Path | None = None
    #: Lifetime of a lock directory off pmxcfs (the emulated expiry's; tests).
    lock_lifetime: float = PMXCFS_LOCK_EXPIRY
    #: Where VGs this node must not change are marked (:mod:`pvestord.adapters.vghealth`).
    vg_health_dir: Path = vghealth.DEFAULT_DIR


def thin_storage(config: StorageConfig, storeid: str) -> ThinStorage:
    """:raises VolumeError: unknown, not LVM, disabled or not thin-enabled."""
    lvm_storage = config.lvm_storages.get(storeid)
    if lvm_storage is None:
        others = [s for s in config.sections if s.id == storeid]
        if others:
            raise VolumeError(f"storage '{storeid}' is of type '{others[0].type}', "
                              "not lvm")
        raise VolumeError(f"no storage '{storeid}' in {config.source}")
    if lvm_storage.disabled:
        raise VolumeError(f"storage '{storeid}' is disabled")
    if lvm_storage.thin is None:
        raise VolumeError(f"storage '{storeid}' is not thin-enabled (no {CHUNKSIZE} in "
                          f"{config.source}): its LVs would never grow")
    return lvm_storage.thin


def load_config(settings: VolumeSettings) -> StorageConfig:
    """:raises ConfigError: unreadable file or invalid options of ours."""
    return load_storage_config(settings.storage_config)


@contextlib.asynccontextmanager
async def locked(settings: VolumeSettings, storage: ThinStorage,
                 config: StorageConfig | None = None) -> AsyncIterator[Held]:
    """The locks of every storage on ``storage``'s VG, as the daemon takes
    them; refused while the VG is marked unhealthy on this node."""
    if config is None:
        config = load_config(settings)
    lock = vg_lock(storage.vgname, config.vg_users(storage.vgname),
                   lock_dir=settings.lock_dir, lifetime=settings.lock_lifetime,
                   health=VgMarks(settings.vg_health_dir))
    async with lock.acquire_async(STORAGE_LOCK_WAIT) as held:
        yield held
