"""Reading a VM's qemu-server config on pmxcfs: its lock and the config's age.

Only this node's folder is read (``<nodes_dir>/<node>/qemu-server``): a VM
runs where its config lives, and the source of a migration keeps the config
until the switchover is over.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from pvestord.policy.vmconfig import config_lock

#: A config is a few KiB; anything far larger is not one, and is not read whole.
MAX_CONFIG_BYTES = 1024 * 1024


@dataclass(frozen=True)
class ConfigLock:
    #: The main section's ``lock`` value, or None.
    lock: str | None
    #: Seconds since the config was last written.
    age: float


def config_path(nodes_dir: Path, node: str, vmid: int) -> Path:
    return nodes_dir / node / "qemu-server" / f"{vmid}.conf"


def read_config_lock(nodes_dir: Path, node: str, vmid: int,
                     now: float | None = None) -> ConfigLock | None:
    """The lock of ``vmid``'s config on ``node``; None when there is no config
    here (a VM started by hand, or a test bed without qemu-server)."""
    path = config_path(nodes_dir, node, vmid)
    try:
        with path.open("rb") as config:
            mtime = os.fstat(config.fileno()).st_mtime
            text = config.read(MAX_CONFIG_BYTES).decode("utf-8", errors="replace")
    except (FileNotFoundError, NotADirectoryError):
        return None
    return ConfigLock(config_lock(text), (time.time() if now is None else now) - mtime)
