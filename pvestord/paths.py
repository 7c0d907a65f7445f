"""Where things live on a Proxmox VE node; every one can be overridden on the command line."""

from __future__ import annotations

from pathlib import Path

#: The cluster extend queue (pmxcfs, replicated to every node).
QUEUE = Path("/etc/pve/extend-queue")
#: Proxmox's storage configuration.
STORAGE_CFG = Path("/etc/pve/storage.cfg")
#: pmxcfs lock directories (``PVE::Cluster::cfs_lock``).
PMXCFS_LOCK_DIR = Path("/etc/pve/priv/lock")
#: Proxmox's flock files for non-shared storage locks.
LOCAL_LOCK_DIR = Path("/var/lock/pve-manager")
#: qemu-server's runtime folder: ``<vmid>.pid`` and ``<vmid>.qmp``.
QEMU_SERVER_RUN = Path("/var/run/qemu-server")
#: The daemon's node-local state (systemd's StateDirectory=pvestord): what it
#: must remember across restarts and across a rewrite of /etc/pve.
STATE_DIR = Path("/var/lib/pvestord")
#: qmeventd's listening socket.
QMEVENTD_SOCKET = Path("/var/run/qmeventd.sock")


def nodes_dir(queue: Path) -> Path:
    """Where node reports live: ``nodes`` beside the queue (``/etc/pve/nodes``)."""
    return queue.parent / "nodes"
