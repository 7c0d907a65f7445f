"""Proxmox's identifiers, each rule written once.

The VMID range, the storage id, the volume group (and LV) name, the name
Proxmox gives a qcow2 disk LV, qemu-server's pidfile name and the node name:
every module that checks one of them imports it from here, and raises its
own error when the check fails (a queue entry's :class:`InvalidEntryError`,
a volume's :class:`VolumeError`, an LVM command's :class:`LvmError`...).

Pure: the functions take the text to judge, never read it themselves (the
node name is computed from the host name the caller read). Shared by
``pvestord`` and ``qmeventd_py``.
"""

from __future__ import annotations

import re

#: Proxmox's VMID range (PVE::JSONSchema pve_verify_vmid: ``^[1-9][0-9]{2,8}$``).
VMID_MIN, VMID_MAX = 100, 999_999_999
#: A positive id in plain decimal that fits in ten digits, no leading zero:
#: what qmeventd accepts from a peer (``-id N``, a pidfile, vzdump's message)
#: before any range check; wider than Proxmox's range on purpose (a test VM
#: may be numbered below 100).
VMID_TEXT = re.compile(r"[1-9][0-9]{0,9}")

#: PVE::JSONSchema parse_storage_id: a letter first, a letter or a digit last.
STORAGE_ID = re.compile(r"[a-z][a-z0-9\-_.]*[a-z0-9]", re.IGNORECASE)

#: lvm(8) "VALID NAMES", for a VG and an LV alike: letters, digits and
#: ``+ _ . -``, never a hyphen first, never ``.`` or ``..``; at most 127
#: characters (LVM's NAME_LEN of 128 holds the NUL). pve-storage's
#: ``pve-storage-vgname`` format is the same alphabet.
LVM_NAME = re.compile(r"(?!\.\.?\Z)[A-Za-z0-9+_.][A-Za-z0-9+_.\-]{0,126}")

#: A qcow2 disk LV as Proxmox's LVM plugin names it: parse_lvm_name
#: (letters, digits, ``- _ .``), then LVMPlugin::parse_volname
#: ``vm-<vmid>-...``, qcow2 by its suffix. Group 1 is the VMID.
QCOW2_DISK = re.compile(r"vm-([0-9]+)-[A-Za-z0-9_.\-]*\.qcow2")
#: Any volume Proxmox allocates for a guest (``vm-<vmid>-...``, ``base-<vmid>-...``).
GUEST_VOLUME = re.compile(r"(?:vm|base)-\d+-.+")

#: A Proxmox node name: a DNS label (PVE::JSONSchema ``pve-node``).
NODE_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?")

#: qemu-server's pidfile, ``<run_dir>/<vmid>.pid``. Group 1 is the VMID.
PIDFILE = re.compile(rf"({VMID_TEXT.pattern})\.pid")


def is_vmid(vmid: object) -> bool:
    """Whether ``vmid`` is an int (not a bool) in Proxmox's VMID range."""
    return (isinstance(vmid, int) and not isinstance(vmid, bool)
            and VMID_MIN <= vmid <= VMID_MAX)


def vmid_from_text(text: str) -> int | None:
    """The id :data:`VMID_TEXT` reads in ``text``; None for anything else."""
    return int(text) if VMID_TEXT.fullmatch(text) else None


def is_storage_id(text: str) -> bool:
    return STORAGE_ID.fullmatch(text) is not None


def is_lvm_name(name: str) -> bool:
    """Whether LVM allows ``name`` for a VG or an LV (:data:`LVM_NAME`)."""
    return LVM_NAME.fullmatch(name) is not None


def is_vg_name(name: str) -> bool:
    return is_lvm_name(name)


def qcow2_disk_vmid(lv: str) -> int | None:
    """The VMID in a qcow2 disk LV's name (:data:`QCOW2_DISK`); None for another name."""
    match = QCOW2_DISK.fullmatch(lv)
    return int(match.group(1)) if match else None


def is_guest_volume(name: str) -> bool:
    return GUEST_VOLUME.fullmatch(name) is not None


def pidfile_name(vmid: int) -> str:
    """The name qemu-server gives the pidfile of VM ``vmid``."""
    return f"{vmid}.pid"


def pidfile_vmid(name: str) -> int | None:
    """The VMID a pidfile's name gives (``100.pid`` -> 100); None for another name."""
    match = PIDFILE.fullmatch(name)
    return int(match.group(1)) if match else None


def is_node_name(name: str) -> bool:
    return NODE_NAME.fullmatch(name) is not None


def node_name(hostname: str) -> str:
    """The Proxmox node name of a host: its short host name, as
    PVE::INotify::nodename takes it (the part before the first dot)."""
    return hostname.split(".", 1)[0]


__all__ = [
    "GUEST_VOLUME", "LVM_NAME", "NODE_NAME", "PIDFILE", "QCOW2_DISK", "STORAGE_ID", "VMID_MAX",
    "VMID_MIN", "VMID_TEXT", "is_guest_volume", "is_lvm_name", "is_node_name", "is_storage_id",
    "is_vg_name", "is_vmid", "node_name", "pidfile_name", "pidfile_vmid", "qcow2_disk_vmid",
    "vmid_from_text",
]
