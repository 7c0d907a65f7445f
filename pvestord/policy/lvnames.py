"""Which VM an LV belongs to, from the names Proxmox gives a qcow2 chain's LVs.

A disk is ``vm-<vmid>-<name>.qcow2``; with ``snapshot-as-volume-chain``
every snapshot is an LV of its own, ``snap_vm-<vmid>-<name>_<snap>.qcow2``
(pve-storage's ``get_snap_name``), which the running QEMU has open as a
backing file and which a commit may write into. Whatever pvestord does for a
VM's LVs (refresh them for a migration, list them) covers both.

Which LVs a disk's chain holds is read from the images themselves (each
one's backing file, :func:`backing_lv`); the names only bound it
(:func:`is_snapshot_of`): a chain reaching an LV of another name is not one
pvestord may change as a whole.
"""

from __future__ import annotations

import re

from pvestord.policy.proxmox import QCOW2_DISK, is_lvm_name

#: The snapshot's name may hold ``_`` as the disk's may: only the VMID and
#: the prefix are unambiguous.
_SNAPSHOT = re.compile(r"snap_vm-([0-9]+)-[A-Za-z0-9_.\-]*_[A-Za-z0-9_\-]+\.qcow2")


def chain_vmid(lv: str) -> int | None:
    """The VMID of a qcow2 disk LV or of one of its snapshot LVs; None for
    any other name."""
    match = QCOW2_DISK.fullmatch(lv) or _SNAPSHOT.fullmatch(lv)
    return int(match.group(1)) if match else None


def is_snapshot(lv: str) -> bool:
    """Whether ``lv`` is a snapshot LV of a qcow2 chain (``snap_vm-...``)."""
    return _SNAPSHOT.fullmatch(lv) is not None


def is_snapshot_of(disk_lv: str, lv: str) -> bool:
    """Whether ``lv`` is one of the snapshot LVs of the disk ``disk_lv``
    (``snap_<disk stem>_<snap>.qcow2``): the LVs Proxmox activates and
    deactivates with the disk (LVMPlugin's ``get_activate_volume_target_opts``),
    never another disk's nor a base image linked clones share."""
    stem = disk_lv.removesuffix(".qcow2")
    if stem == disk_lv or chain_vmid(disk_lv) is None or not is_snapshot(lv):
        return False
    prefix = f"snap_{stem}_"
    return lv.startswith(prefix) and len(lv) > len(prefix) + len(".qcow2")


def backing_lv(image_path: str, backing: str, vg: str) -> str | None:
    """The LV of VG ``vg`` that the image at ``image_path`` (``/dev/<vg>/<lv>``)
    names as its backing file ``backing``; None when that is no such LV.

    QEMU resolves a relative backing file name (Proxmox writes the bare LV
    name) against the overlay's folder, ``/dev/<vg>``; an absolute one must
    be ``/dev/<vg>/<lv>`` itself. Nothing is normalised away: ``..`` or a
    second folder is not an LV of the VG, whatever it would resolve to.
    """
    folder = f"/dev/{vg}/"
    if not image_path.startswith(folder) or not backing:
        return None
    name = backing.removeprefix(folder) if backing.startswith("/") else backing
    if "/" in name or not is_lvm_name(name):
        return None
    return name
