"""Templates and linked clones on a ``pvestord`` storage: their names and the parent tag.

``qm template`` turns a disk into a read-only *base*: the LV
``vm-<vmid>-disk-<n>.qcow2`` is renamed ``base-<vmid>-disk-<n>.qcow2``, as
Proxmox's plugins that have templates name them (pve-storage ``Plugin.pm``,
``LvmThinPlugin.pm``, ``RBDPlugin.pm`` ``create_base``). A linked clone is a
small qcow2 overlay LV of its own, ``vm-<clone>-disk-<m>.qcow2``, whose
backing file is the base's LV. Proxmox names a linked clone's volume by its
base and its own name, ``base-100-disk-0.qcow2/vm-101-disk-0.qcow2`` (the
RBD convention): ``PVE::Storage::volume_is_base_and_used`` reads the base
from that name to refuse freeing a base a clone still uses.

The link is also recorded in the VG's metadata, as the tag
:func:`parent_tag` on the clone's LV: the VG is shared, so every node reads
it. The Perl plugin reads the tag by the same prefix: its ``list_images``
builds the clone's volume name from it without opening any image, and its
``free_image`` refuses, under the storage lock, to remove a base that an LV
of the VG still names.

Pure: names and tags in, names and tags out.
"""

from __future__ import annotations

import re

from pvestord.policy.proxmox import LVM_NAME
from pvestord.policy.volumes import VolumeError

#: The tag on a linked clone's LV naming its base's LV (the Perl plugin's
#: ``$PARENT_TAG``). LVM allows every character of an LV name in a tag.
PARENT_TAG_PREFIX = "pvestord-parent-"
#: A base's LV: ``base-<vmid>-<name>.qcow2``. Group 1 is the VMID.
BASE_DISK = re.compile(r"base-([0-9]+)-[A-Za-z0-9_.\-]*\.qcow2")
_DISK = re.compile(r"vm-([0-9]+)-([A-Za-z0-9_.\-]*\.qcow2)")


class TemplateError(VolumeError):
    """A name that is no base, no clone or no disk to make a base of."""


def is_base(lv: str) -> bool:
    """Whether ``lv`` is a base's LV (:data:`BASE_DISK`)."""
    return BASE_DISK.fullmatch(lv) is not None and LVM_NAME.fullmatch(lv) is not None


def base_name(lv: str) -> str:
    """The LV name ``lv`` (a disk, ``vm-<vmid>-...qcow2``) has as a base:
    ``vm-`` becomes ``base-``, the rest is kept, so the disk's number stays
    taken for its VM (Proxmox's ``get_next_vm_diskname`` counts both).

    :raises TemplateError: ``lv`` is not a qcow2 disk's LV, or the new name
        would be longer than LVM allows."""
    match = _DISK.fullmatch(lv)
    if match is None:
        raise TemplateError(f"only a qcow2 disk (vm-<vmid>-<name>.qcow2) becomes a base,"
                            f" not {lv!r}")
    name = f"base-{match.group(1)}-{match.group(2)}"
    if LVM_NAME.fullmatch(name) is None:
        raise TemplateError(f"{lv!r} as a base would be {name!r}, longer than LVM allows")
    return name


def parent_tag(base_lv: str) -> str:
    """The tag a linked clone's LV carries for its base ``base_lv``.

    :raises TemplateError: ``base_lv`` is not a base's LV."""
    if not is_base(base_lv):
        raise TemplateError(f"{base_lv!r} is not a base (base-<vmid>-<name>.qcow2)")
    return f"{PARENT_TAG_PREFIX}{base_lv}"


__all__ = ["BASE_DISK", "PARENT_TAG_PREFIX", "TemplateError", "base_name", "is_base",
           "parent_tag"]
