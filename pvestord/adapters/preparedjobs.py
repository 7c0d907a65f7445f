"""Which snapshot deletes the storage plugin prepared: one file per job target LV.

A running VM's snapshot delete is qemu-server's ``block-commit`` or
``block-stream``, which fail on their first ENOSPC instead of pausing for
the daemon. So the storage plugin grows the job's target right before
qemu-server starts the job (``docs/proxmox.md``, snapshot delete), when it
recognises qemu-server's call. Each time it does, it touches
``<folder>/<vg>/<lv>`` for the target. The daemon sees the job run; a job
whose target has no such file, newer than the VM config that took the lock,
was started by a qemu-server that called the storage some other way, and
the daemon says so: its growth behind the job may come too late for a job
running at disk speed.

The folder is node-local, beside the VG marks (``/run/pvestord``): the plugin
and the job's QEMU run on the node where the VM runs, and the two read the
same marks folder (the daemon's and ``pvestord plugin``'s ``--vg-health-dir``).
"""

from __future__ import annotations

import time
from pathlib import Path

from pvestord.adapters.lvm import check_name


def folder_beside(vg_health_dir: Path) -> Path:
    """The records' folder for a node whose VG marks are in ``vg_health_dir``."""
    return vg_health_dir.parent / "prepared-jobs"


def note(folder: Path, vg: str, lv: str) -> None:
    """Record that the plugin prepared a job writing into ``vg/lv`` now.

    :raises OSError: the file could not be written.
    """
    path = folder / check_name("VG", vg) / check_name("LV", lv)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch()  # a file that exists gets the time of now


def age(folder: Path, vg: str, lv: str, *, now: float | None = None) -> float | None:
    """Seconds since the plugin last prepared a job into ``vg/lv``; None if never
    (or since this node booted: the folder is under /run)."""
    try:
        mtime = (folder / vg / lv).stat().st_mtime
    except (FileNotFoundError, NotADirectoryError):
        return None
    return (time.time() if now is None else now) - mtime


__all__ = ["age", "folder_beside", "note"]
