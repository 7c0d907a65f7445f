"""Block device numbers: what a path resolves to, what QEMU has open, which
LV a device is (the I/O of :mod:`pvestord.policy.binding`).

All three are reads of ``/dev``, ``/proc`` and ``/sys``: no LVM command, so
the pass may bind its drives at every look. pvestord runs as root, as QEMU's
``/proc/<pid>/fd`` requires.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from pvestord.policy.binding import split_dm_name

PROC = Path("/proc")
SYS_DEV_BLOCK = Path("/sys/dev/block")


def block_device(path: str | Path) -> int | None:
    """The device number ``path`` resolves to; None when it is no block device
    (any more: an LV renamed away leaves no ``/dev/VG/LV``)."""
    try:
        info = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    return info.st_rdev if stat.S_ISBLK(info.st_mode) else None


def open_block_devices(pid: int, proc: Path = PROC) -> frozenset[int] | None:
    """Every block device process ``pid`` has open (each fd followed to its
    file, whatever name it was opened under). Empty once the process is gone;
    None when ``/proc`` refuses us (``hidepid``, a sandbox: not root enough)."""
    found = set()
    try:
        fds = list((proc / str(pid) / "fd").iterdir())
    except (FileNotFoundError, ProcessLookupError):
        return frozenset()
    except PermissionError:
        return None
    for fd in fds:
        try:
            info = os.stat(fd)
        except (FileNotFoundError, ProcessLookupError):
            continue  # closed since the listing
        except PermissionError:
            return None
        if stat.S_ISBLK(info.st_mode):
            found.add(info.st_rdev)
    return frozenset(found)


def lv_of_device(device: int, sys_dev_block: Path = SYS_DEV_BLOCK) -> tuple[str, str] | None:
    """``(VG, LV)`` of the LV whose mapping is ``device``, by its name now
    (an ``lvrename`` on this node renames the mapping too); None when the
    device is gone or is no LV."""
    name_file = sys_dev_block / f"{os.major(device)}:{os.minor(device)}" / "dm" / "name"
    try:
        name = name_file.read_text(encoding="utf-8").strip()
    except (FileNotFoundError, NotADirectoryError):
        return None
    return split_dm_name(name)
