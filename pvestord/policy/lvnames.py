"""Which VM an LV belongs to, from the names Proxmox gives a qcow2 chain's LVs.

A disk is ``vm-<vmid>-<name>.qcow2``; with ``snapshot-as-volume-chain``
every snapshot is an LV of its own, ``snap_vm-<vmid>-<name>_<snap>.qcow2``
(pve-storage's ``get_snap_name``), which the running QEMU has open as a
backing file and which a commit may write into. Whatever pvestord does for a
VM's LVs (refresh them for a migration, list them) covers both.
"""

from __future__ import annotations

import re

from pvestord.policy.proxmox import QCOW2_DISK

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
