"""Thin volumes' pure rules: Proxmox volume names and ids, and the LV sizes.

Names follow Proxmox's LVM plugin (pve-storage ``PVE/Storage/LVMPlugin.pm``):
``vm-<vmid>-disk-<n>.qcow2``, the first ``n`` (0..1023) not taken by an LV
of the VG (``get_next_vm_diskname``). We count a number as taken when any LV
name contains ``vm-<vmid>-disk-<n>`` or ``base-<vmid>-disk-<n>``, with or
without ``.qcow2``: a superset of what Proxmox counts, so we never pick a name
Proxmox would consider used, and never put ``vm-100-disk-0.qcow2`` beside a
raw ``vm-100-disk-0``.

The I/O (LVM, ``qemu-img``, the locks) is :mod:`pvestord.features.volumes`'s.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from pvestord.errors import PvestordError
from pvestord.policy.sizes import align_up

#: ``$MAX_VOLUMES_PER_GUEST`` in PVE::Storage::Plugin.
MAX_VOLUMES_PER_GUEST = 1024
#: pve-vmid: 100 .. 999999999.
MIN_VMID = 100
MAX_VMID = 999_999_999

# Proxmox: parse_lvm_name (letters, digits, '-', '_', '.'; alphanumeric at both
# ends), then LVMPlugin::parse_volname ``vm-<vmid>-...``, qcow2 by suffix.
_QCOW2_VOLNAME = re.compile(r"vm-([0-9]+)-[A-Za-z0-9_.\-]*\.qcow2")
_STOREID = re.compile(r"[a-z][a-z0-9\-_.]*[a-z0-9]", re.IGNORECASE)


class VolumeError(PvestordError):
    """A volume command cannot do what was asked (bad input, wrong storage...)."""


class ShrinkRefused(VolumeError):
    """Shrinking would not be safe now; the message says why."""


@dataclass(frozen=True)
class VolumeId:
    """``STORAGE:VOLNAME`` of a qcow2 volume on LVM."""

    storeid: str
    volname: str
    vmid: int

    def __str__(self) -> str:
        return f"{self.storeid}:{self.volname}"


# --- names and ids ------------------------------------------------------------

def check_vmid(vmid: int) -> int:
    if not MIN_VMID <= vmid <= MAX_VMID:
        raise VolumeError(f"invalid VMID {vmid}: Proxmox VMIDs are {MIN_VMID}..{MAX_VMID}")
    return vmid


def parse_volname(volname: str) -> int:
    """The VMID of a Proxmox qcow2 volume name on LVM.

    :raises VolumeError: not ``vm-<vmid>-<name>.qcow2`` (raw volumes, snapshot
        LVs ``snap_...``, anything LVM or Proxmox would refuse).
    """
    match = _QCOW2_VOLNAME.fullmatch(volname)
    if match is None or len(volname) > 127:
        raise VolumeError(
            f"{volname!r} is not a Proxmox qcow2 volume name on LVM "
            "(expected vm-<vmid>-<name>.qcow2, e.g. vm-100-disk-0.qcow2)")
    return check_vmid(int(match.group(1)))


def parse_volume_id(text: str) -> VolumeId:
    """``STORAGE:VOLNAME`` -> :class:`VolumeId`.

    :raises VolumeError: not a storage id, a colon, and a qcow2 volume name.
    """
    storeid, sep, volname = text.partition(":")
    if not sep or not _STOREID.fullmatch(storeid):
        raise VolumeError(f"{text!r} is not a volume id (expected STORAGE:VOLNAME, "
                          "e.g. thin1:vm-100-disk-0.qcow2)")
    return VolumeId(storeid, volname, parse_volname(volname))


def next_disk_name(existing: set[str] | list[str], vmid: int) -> str:
    """The first free ``vm-<vmid>-disk-<n>.qcow2`` among the VG's LV names.

    :raises VolumeError: all 1024 numbers are taken (as Proxmox).
    """
    taken = set()
    pattern = re.compile(rf"(?:vm|base)-{vmid}-disk-([0-9]+)")
    for name in existing:
        for match in pattern.finditer(name):
            end = match.end()
            if end == len(name) or not name[end].isdigit():
                taken.add(int(match.group(1)))
    for n in range(MAX_VOLUMES_PER_GUEST):
        if n not in taken:
            return f"vm-{vmid}-disk-{n}.qcow2"
    raise VolumeError(f"no free disk name for VM {vmid}: "
                      f"{MAX_VOLUMES_PER_GUEST} are taken")


def check_virtual_size(size: int) -> int:
    """A qcow2 virtual size we accept: positive, whole 512-byte sectors."""
    if size <= 0:
        raise VolumeError(f"invalid disk size {size}: must be positive")
    if size % 512:
        raise VolumeError(f"invalid disk size {size} bytes: must be whole 512-byte "
                          "sectors (e.g. 32G, 512M)")
    return size


# --- sizes --------------------------------------------------------------------

def initial_lv_size(initial_size: int, maximum: int, extent_size: int) -> int:
    """The LV size for a new volume: ``initial-size`` in whole extents, never
    larger than the image can ever need (``maximum``, already extent-aligned
    by :func:`pvestord.policy.maximum_size`)."""
    return min(align_up(initial_size, extent_size), align_up(maximum, extent_size))


def shrink_target(lv_size: int, image_end: int, chunksize: int, initial_size: int,
                  extent_size: int) -> int:
    """The size ``shrink`` reduces an LV of ``lv_size`` to.

    ``max(initial-size, image end + chunk)`` rounded *up* to whole extents, so
    never below the image end; never above ``lv_size`` (shrink never grows:
    an LV already that small comes back unchanged).
    """
    wanted = align_up(max(initial_size, image_end + chunksize), extent_size)
    return min(lv_size, wanted)


__all__ = [
    "MAX_VMID", "MAX_VOLUMES_PER_GUEST", "MIN_VMID", "ShrinkRefused", "VolumeError",
    "VolumeId", "check_virtual_size", "check_vmid", "initial_lv_size", "next_disk_name",
    "parse_volname", "parse_volume_id", "shrink_target",
]
