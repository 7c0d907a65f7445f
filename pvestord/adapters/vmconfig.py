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

from pvestord.policy.vmconfig import config_lock, migration_tasks, task_alive

#: A config is a few KiB; anything far larger is not one, and is not read whole.
MAX_CONFIG_BYTES = 1024 * 1024
#: Proxmox's list of this node's running and recent tasks (pvedaemon,
#: pveproxy and ``qm`` keep it; root-readable).
TASKS_ACTIVE = Path("/var/log/pve/tasks/active")
#: It holds the running tasks and a few recent ones: a few KiB.
MAX_TASKS_BYTES = 1024 * 1024


@dataclass(frozen=True)
class ConfigLock:
    #: The main section's ``lock`` value, or None.
    lock: str | None
    #: Seconds since the config was last written.
    age: float


def config_path(nodes_dir: Path, node: str, vmid: int) -> Path:
    return nodes_dir / node / "qemu-server" / f"{vmid}.conf"


def config_node(nodes_dir: Path, vmid: int) -> str | None:
    """The node whose folder holds ``vmid``'s config (pmxcfs keeps it in one
    node's folder only); None when none does."""
    for found in sorted(nodes_dir.glob(f"*/qemu-server/{vmid}.conf")):
        return found.parent.parent.name
    return None


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


def migration_task_running(node: str, vmid: int, *, active: Path | None = None,
                           proc: Path = Path("/proc")) -> bool:
    """Whether qemu-server's ``qmigrate`` task for ``vmid`` runs on ``node``
    (:func:`pvestord.policy.vmconfig.migration_tasks`): the task that wrote
    ``lock: migrate`` and removes it at its end, alive however long its
    target's start or its disks' mirror takes. A node without the list (no
    Proxmox, a test bed) or a list we may not read says no: the other
    signs of a migration still count. Two small file reads, no process."""
    try:
        with (TASKS_ACTIVE if active is None else active).open("rb") as tasks:
            text = tasks.read(MAX_TASKS_BYTES).decode("utf-8", errors="replace")
    except (FileNotFoundError, NotADirectoryError, PermissionError):
        return False
    for pid, pstart in migration_tasks(text, node, vmid):
        try:
            stat = (proc / str(pid) / "stat").read_text(errors="replace")
        except (FileNotFoundError, NotADirectoryError, PermissionError, ProcessLookupError):
            continue
        if task_alive(stat, pstart):
            return True
    return False
