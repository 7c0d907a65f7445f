"""Which LV a thin drive writes: the device QEMU has open, not its node's name.

A ``host_device`` node keeps the path it was opened with, but Proxmox renames
LVs under a running QEMU: a live snapshot renames the disk's LV to
``snap_<disk>_<snap>.qcow2`` and makes a new LV under the disk's name *before*
QEMU reopens anything (qemu-server's ``blockdev_external_snapshot``); deleting
the first snapshot renames ``snap_...`` back to the disk's name while QEMU's
node still shows ``snap_...``. In that window the node's path names an LV QEMU
does not write (or none at all), and growing it by name would grow the wrong
LV while the guest waits paused on the right one.

So a drive is bound to a device number (``st_rdev``, major:minor): the one
its path resolves to, as long as QEMU has that device open; once the name
moves away from it, the device remembered from the last good binding, for as
long as QEMU still has it open. Neither: the drive's LV is unknown, and the
engine stands back. Pure rules; the device numbers come from
:mod:`pvestord.adapters.devices`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class BindingKind(enum.Enum):
    #: The node's path resolves to a device QEMU has open: the name is right.
    NAME = "by name"
    #: The name moved away (a rename under the running QEMU); the device QEMU
    #: had open under it still is, under another name.
    DEVICE = "by device"
    #: The name resolves to a device QEMU does not have open, and no
    #: remembered device is open either.
    LOST = "unknown"


@dataclass(frozen=True)
class Binding:
    kind: BindingKind
    #: The device the drive writes: always for DEVICE, for NAME when the
    #: name resolved to one.
    device: int | None


def bind(path_device: int | None, open_devices: frozenset[int],
         remembered: int | None) -> Binding:
    """The device a drive writes.

    ``path_device``: what its node's path resolves to now (None: no such
    block device any more). ``open_devices``: every block device QEMU has
    open. ``remembered``: the device of the drive's last good binding.

    The name wins whenever QEMU has its device open: qemu-server gives a new
    top the node-names of the one it replaced, so a remembered device can
    belong to a node that is gone (it is still open, as the snapshot's
    backing node). Nothing else opens the new LV in the window before the
    new top is added, so an open name is never the wrong LV.

    A name that resolves to no block device at all, with nothing remembered,
    is taken by name, unverified (device None): no LV is called that any
    more (or it is not active here), so LVM refuses to grow it rather than
    growing another one. Only a name that resolves to a device QEMU does not
    have open is certainly wrong.
    """
    if path_device is not None and path_device in open_devices:
        return Binding(BindingKind.NAME, path_device)
    if remembered is not None and remembered in open_devices:
        return Binding(BindingKind.DEVICE, remembered)
    if path_device is None:
        return Binding(BindingKind.NAME, None)
    return Binding(BindingKind.LOST, None)


def split_dm_name(name: str) -> tuple[str, str] | None:
    """An LV's device-mapper name -> ``(VG, LV)``; None for any other mapping.

    LVM names an LV's mapping ``<VG>-<LV>`` with every ``-`` inside either
    name doubled, so the separator is the one ``-`` that is not part of a
    pair. A layered mapping (``-real``, ``-cow``, ``-tpool``: a third part)
    is no LV a drive writes.
    """
    parts: list[str] = []
    current: list[str] = []
    index = 0
    while index < len(name):
        char = name[index]
        if char == "-" and name[index + 1:index + 2] == "-":
            current.append("-")
            index += 2
            continue
        if char == "-":
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
        index += 1
    parts.append("".join(current))
    if len(parts) != 2 or not all(parts):
        return None
    return parts[0], parts[1]


def dm_name(vg: str, lv: str) -> str:
    """The device-mapper name LVM gives ``vg/lv`` (:func:`split_dm_name`'s inverse)."""
    return f"{vg.replace('-', '--')}-{lv.replace('-', '--')}"
