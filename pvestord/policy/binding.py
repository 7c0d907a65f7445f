"""Which LV a thin drive is, by the device QEMU has open, not by its name.

QEMU opens ``/dev/VG/LV`` once and keeps the descriptor. Proxmox renames a
running VM's LVs (a snapshot renames the current LV to ``snap_...`` and
creates a new LV under the old name; deleting the first snapshot renames it
back; ``saferemove`` renames to ``del-...``), and for a while the name in
QEMU's block node names another device than the one QEMU writes. Growing by
name then grows the wrong LV, and the guest, paused on ENOSPC, stays paused.

So a drive is bound to a device number (major:minor of its device-mapper
device, which a rename keeps) the first time its name is seen to be a device
QEMU has open, and found again by that number when the name stops being one.
"""

from __future__ import annotations

import enum
from collections.abc import Collection
from dataclasses import dataclass


class Binding(enum.Enum):
    #: The name is a device QEMU has open: use it (and remember its number).
    BY_NAME = "by name"
    #: The name is not QEMU's device, but the device remembered for the drive
    #: still is: the LV was renamed; find it by its number.
    RENAMED = "renamed"
    #: Neither the name nor a remembered device is one QEMU has open: which LV
    #: QEMU writes is unknown; do nothing to this drive.
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class BindingVerdict:
    binding: Binding
    #: The device number to use (BY_NAME: the name's; RENAMED: the remembered one).
    device: int | None


def bind(name_device: int | None, remembered: int | None,
         open_devices: Collection[int] | None) -> BindingVerdict:
    """Decide which device a drive is.

    ``name_device``: the device number ``/dev/VG/LV`` has now (None: no such
    device here); ``remembered``: the number bound last time; ``open_devices``:
    the block devices QEMU's process has open, or None when they cannot be
    read (another user's process, no ``/proc``): then the name is trusted, as
    it always was.
    """
    if open_devices is None:
        return BindingVerdict(Binding.BY_NAME, name_device)
    if name_device is not None and name_device in open_devices:
        return BindingVerdict(Binding.BY_NAME, name_device)
    if remembered is not None and remembered in open_devices:
        return BindingVerdict(Binding.RENAMED, remembered)
    return BindingVerdict(Binding.UNKNOWN, None)
