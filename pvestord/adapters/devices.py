"""Block device numbers: of an LV's path, and of what a process has open.

Reads ``/dev`` and ``/proc`` only; no command is run. A device-mapper device
keeps its number across ``lvrename`` (only the names in ``/dev`` change),
which is what :mod:`pvestord.policy.binding` relies on.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path


def device_number(path: str | Path) -> int | None:
    """The device number (``st_rdev``) of the block device at ``path``; None
    when there is none (a missing link, a regular file)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_rdev if stat.S_ISBLK(st.st_mode) else None


def open_block_devices(pid: int, proc: Path = Path("/proc")) -> frozenset[int] | None:
    """The block devices process ``pid`` has open; None when its descriptors
    cannot be read (gone, or not ours to look at)."""
    folder = proc / str(pid) / "fd"
    try:
        entries = list(folder.iterdir())
    except OSError:
        return None
    found = set()
    for entry in entries:
        with contextlib.suppress(OSError):  # a descriptor closed meanwhile
            number = device_number(entry)
            if number is not None:
                found.add(number)
    return frozenset(found)


def lv_with_device(vg: str, number: int, dev: Path = Path("/dev")) -> str | None:
    """The LV of ``vg`` whose device is ``number`` now, by the names LVM keeps
    in ``/dev/VG``; None when none is."""
    try:
        entries = sorted((dev / vg).iterdir())
    except OSError:
        return None
    return next((entry.name for entry in entries if device_number(entry) == number), None)
