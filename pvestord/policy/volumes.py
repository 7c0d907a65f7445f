"""Thin volumes' pure rules: Proxmox volume names and ids, and the LV sizes.

Names follow Proxmox's LVM plugin (pve-storage ``PVE/Storage/LVMPlugin.pm``):
``vm-<vmid>-disk-<n>.qcow2``, the first ``n`` (0..1023) not taken by an LV
of the VG (``get_next_vm_diskname``). We count a number as taken when any LV
name contains ``vm-<vmid>-disk-<n>`` or ``base-<vmid>-disk-<n>``, with or
without ``.qcow2``: a superset of what Proxmox counts, so we never pick a name
Proxmox would consider used, and never put ``vm-100-disk-0.qcow2`` beside a
raw ``vm-100-disk-0``.

Besides disks, Proxmox allocates two kinds of volumes on a VM's storage by a
fixed name (:func:`new_volume`): the RAM state of a snapshot or a hibernation,
``vm-<vmid>-state-<snapshot>`` in raw (qemu-server ``QemuConfig.pm``
``__snapshot_save_vmstate``; no extension on a storage without a path), and a
backup's fleecing image, ``vm-<vmid>-fleece-<n>`` in the storage's format
(``VZDump/QemuServer.pm`` ``allocate_fleecing_images``; the extension is
added only for storages with a path). The LVM plugin reads a volume's format
from its name (``.qcow2`` or raw), so a qcow2 fleecing image is named with the
suffix here, and the name allocated is handed back to Proxmox.

The I/O (LVM, ``qemu-img``, the locks) is :mod:`pvestord.features.volumes`'s.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

from pvestord.errors import PvestordError
from pvestord.policy.lvnames import chain_vmid, is_snapshot
from pvestord.policy.proxmox import VMID_MAX, VMID_MIN, is_storage_id, qcow2_disk_vmid
from pvestord.policy.sizes import align_up

#: ``$MAX_VOLUMES_PER_GUEST`` in PVE::Storage::Plugin.
MAX_VOLUMES_PER_GUEST = 1024
# Proxmox's snapshot names are configuration ids (pve-common JSONSchema
# ``$CONFIGID_RE``); a hibernation's state is named ``suspend-<date>`` alike.
_VMSTATE_NAME = re.compile(r"vm-([0-9]+)-state-[A-Za-z][A-Za-z0-9_\-]+")
_FLEECE_NAME = re.compile(r"vm-([0-9]+)-fleece-([0-9]+)(\.qcow2)?")
_STATE_PREFIX = re.compile(r"vm-[0-9]+-state-")
_PLAIN_DISK_NAME = re.compile(r"vm-[0-9]+-[A-Za-z0-9_\-]+")
#: An LV name's length limit as Proxmox's parse_lvm_name allows it.
_MAX_LV_NAME = 127


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
    if not VMID_MIN <= vmid <= VMID_MAX:
        raise VolumeError(f"invalid VMID {vmid}: Proxmox VMIDs are {VMID_MIN}..{VMID_MAX}")
    return vmid


def parse_volname(volname: str) -> int:
    """The VMID of a Proxmox qcow2 volume name on LVM.

    :raises VolumeError: not ``vm-<vmid>-<name>.qcow2`` (raw volumes, snapshot
        LVs ``snap_...``, anything LVM or Proxmox would refuse).
    """
    vmid = qcow2_disk_vmid(volname)
    if vmid is None or len(volname) > _MAX_LV_NAME:
        raise VolumeError(
            f"{volname!r} is not a Proxmox qcow2 volume name on LVM "
            "(expected vm-<vmid>-<name>.qcow2, e.g. vm-100-disk-0.qcow2)")
    return check_vmid(vmid)


class VolumeRole(enum.Enum):
    """What Proxmox allocates a volume on this storage for."""

    #: A guest disk (or a snapshot overlay): a thin qcow2 image.
    DISK = "disk"
    #: A snapshot's or a hibernation's RAM state: QEMU's savevm writes it
    #: once, from start to end, as a raw stream; a plain LV of the size asked.
    VMSTATE = "vmstate"
    #: A backup's fleecing image: a thin qcow2 the copy-before-write filter
    #: fills as the guest overwrites data not yet backed up.
    FLEECE = "fleece"


@dataclass(frozen=True)
class NewVolume:
    """The LV to create for one of Proxmox's allocations, and how."""

    vmid: int
    #: The LV name, which is also the volume name handed back to Proxmox.
    name: str
    #: ``qcow2`` or ``raw``, as the name says it to Proxmox's parse_volname.
    format: str
    role: VolumeRole

    @property
    def tags(self) -> tuple[str, ...]:
        """The LV's tags, as Proxmox's LVM plugin sets them: the owner's always,
        the volume's own (shared with its snapshot LVs) for qcow2 only."""
        owner = f"pve-vm-{self.vmid}"
        return (owner, f"@pve-{self.name}") if self.format == "qcow2" else (owner,)


def new_volume(vmid: int, fmt: str, name: str) -> NewVolume:
    """What to create when Proxmox asks for volume ``name`` in format ``fmt`` for ``vmid``.

    qcow2 disks are ``vm-<vmid>-<name>.qcow2``; raw only for a VM state
    ``vm-<vmid>-state-<snapshot>``; a fleecing image ``vm-<vmid>-fleece-<n>``
    is made qcow2 and named with the suffix. The VMID in the name must be
    ``vmid``: the LV is tagged and listed as that VM's.

    :raises VolumeError: anything else, saying which name would do.
    """
    check_vmid(vmid)
    if len(name) > _MAX_LV_NAME:
        raise VolumeError(f"volume name {name!r} is longer than {_MAX_LV_NAME} characters")
    role, owner, allocated = _classify(fmt, name)
    if owner != vmid:
        raise VolumeError(f"volume name {name!r} belongs to VM {owner}, not to VM {vmid}")
    return NewVolume(vmid, allocated, "raw" if role is VolumeRole.VMSTATE else "qcow2", role)


def _classify(fmt: str, name: str) -> tuple[VolumeRole, int, str]:
    """The role, the VMID the name gives and the LV name, or VolumeError."""
    if fmt == "raw":
        state = _VMSTATE_NAME.fullmatch(name)
        if state is None:
            raise VolumeError(
                "storage type 'pvestord' holds raw volumes only for VM state "
                f"(vm-<vmid>-state-<snapshot>), not {name!r}{_qcow2_hint(name, fmt)}")
        return VolumeRole.VMSTATE, int(state.group(1)), name
    if fmt != "qcow2":
        raise VolumeError("storage type 'pvestord' holds qcow2 volumes (and raw VM state), "
                          f"not {fmt!r}")
    fleece = _FLEECE_NAME.fullmatch(name)
    if fleece is not None:
        return (VolumeRole.FLEECE, int(fleece.group(1)),
                f"vm-{fleece.group(1)}-fleece-{fleece.group(2)}.qcow2")
    if _VMSTATE_NAME.fullmatch(name):
        raise VolumeError(f"a VM state volume is raw, not qcow2: {name!r}")
    try:
        return VolumeRole.DISK, parse_volname(name), name
    except VolumeError:
        raise VolumeError("storage type 'pvestord' holds qcow2 volumes named "
                          f"vm-<vmid>-<name>.qcow2, not {name!r}{_qcow2_hint(name, fmt)}"
                          ) from None


def _qcow2_hint(name: str, fmt: str) -> str:
    """What to ask for instead, as Proxmox's LVM plugin suggests the right name.

    `` (did you mean '<name>.qcow2'? ...)`` for a plain disk name without the
    suffix (or with ``.raw``). For a qcow2 disk, also that an empty name lets
    Proxmox choose one: ``pvesm alloc STORAGE VMID NAME SIZE`` is where a
    name is typed by hand, and its empty name gives the next free
    ``vm-<vmid>-disk-<n>.qcow2`` (upstream's ``pvesm alloc local <vmid> ''``).
    Not for raw: an empty name there is what was refused (its next free name
    is a raw disk), the fix is the format the suffix gives."""
    base = name.removesuffix(".raw")
    suggested = (_PLAIN_DISK_NAME.fullmatch(base) is not None
                 and _STATE_PREFIX.match(base) is None)
    if fmt != "qcow2":
        return f" (did you mean '{base}.qcow2'?)" if suggested else ""
    if suggested:
        return f" (did you mean '{base}.qcow2'? An empty name ('') lets Proxmox choose one)"
    return " (an empty name ('') lets Proxmox choose one)"


def parse_volume_id(text: str) -> VolumeId:
    """``STORAGE:VOLNAME`` -> :class:`VolumeId`.

    :raises VolumeError: not a storage id, a colon, and a qcow2 volume name.
    """
    storeid, sep, volname = text.partition(":")
    if not sep or not is_storage_id(storeid):
        raise VolumeError(f"{text!r} is not a volume id (expected STORAGE:VOLNAME, "
                          "e.g. thin1:vm-100-disk-0.qcow2)")
    return VolumeId(storeid, volname, parse_volname(volname))


def parse_chain_volume_id(text: str) -> VolumeId:
    """``STORAGE:VOLNAME`` of a qcow2 disk or of one of its snapshot LVs
    (``snap_vm-<vmid>-<name>_<snap>.qcow2``, the volume id LVMPlugin's
    ``volume_snapshot_info`` gives a snapshot): what a copy target's
    reduction accepts, a snapshot delete's merge target being either.

    :raises VolumeError: neither.
    """
    storeid, sep, volname = text.partition(":")
    vmid = chain_vmid(volname)
    if sep and is_storage_id(storeid) and is_snapshot(volname) and len(volname) <= _MAX_LV_NAME:
        assert vmid is not None
        return VolumeId(storeid, volname, check_vmid(vmid))
    return parse_volume_id(text)


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


def copy_over(on_activation: bool, allocated_clusters: int | None) -> bool:
    """Whether a copy target whose LV is not open is done being copied into.

    qemu-server deactivates a volume once its copy into it is over (every
    offline copy ends with ``deactivate_volumes``; a mirror or migration
    target is deactivated when its VM stops): at a deactivation, yes. At an
    activation, only when the image already holds data (``qemu-img check``'s
    allocated clusters): ``clone_disk`` activates the new, empty volume right
    before it copies into it, and a same-node clone never deactivates it, so
    an activation that finds data is the next use after the copy. Unknown
    (no count reported) is no.
    """
    if not on_activation:
        return True
    return allocated_clusters is not None and allocated_clusters > 0


def live_reduction_target(lv_size: int, image_end: int, written_end: int, chunksize: int,
                          initial_size: int, extent_size: int) -> int:
    """What a running VM's copy target is reduced to while its VM is paused.

    :func:`shrink_target` of the larger of two ends: ``qemu-img check``'s
    image end, and the highest offset QEMU has written to the LV since it
    opened it (``wr_highest_offset``). Either alone would do once QEMU has
    flushed; the larger one is kept because a reduction that cuts one
    written byte loses it, and one that keeps a chunk too many costs
    nothing the next reduction cannot give back.
    """
    return shrink_target(lv_size, max(image_end, written_end), chunksize, initial_size,
                         extent_size)


def live_reduction_refused(*, status: str, jobs: int, exports: int, lv_vmid: int | None,
                           vmid: int, config_lock: str | None = None) -> str | None:
    """Why a running VM's copy target must not be paused and reduced now;
    None when it may.

    ``status``: ``query-status``'s; only ``running`` (a VM paused by someone
    else is theirs to resume, and an incoming migration's is not ours yet).
    ``jobs``: the VM's block jobs; any at all refuses, because a job keeps
    writing while the guest is paused (a mirror's target is written by the
    job, and ``stop`` does not stop it). ``exports``: the VM's block exports
    (``query-block-exports``); any refuses, because QEMU's NBD server serves
    a writable export's clients while the guest is paused (Proxmox exports
    a VM's disks for a migration's target, whose VM is not running, and its
    backup providers' images during a backup's job). ``lv_vmid``: the VMID
    the LV's name carries; a clone's target, mirrored by the source VM, is
    the clone's and not this VM's to pause for. ``config_lock``: qemu-server's
    ``lock`` in the VM's config: an operation runs (a backup, a snapshot, a
    migration, a suspend to disk) that may pause and resume the VM itself,
    and whose pause a ``cont`` of ours would undo.

    With none of these, nothing but the guest writes the LV, and a paused
    guest writes nothing: a node a finished job left behind (a move disk's
    source before qemu-server deletes it) is as safe to reduce as the disk.
    """
    if status != "running":
        return f"the VM is {status}, not running"
    if config_lock is not None:
        return f"its config is locked ({config_lock}): qemu-server is at work on it"
    if jobs:
        return f"{jobs} block job{'s' if jobs > 1 else ''} of the VM run{'s' if jobs == 1 else ''}"
    if exports:
        return f"{exports} block export{'s' if exports > 1 else ''} of the VM may write"
    if lv_vmid != vmid:
        return "the LV is not one of this VM's disks"
    return None


__all__ = [
    "MAX_VOLUMES_PER_GUEST", "NewVolume", "ShrinkRefused",
    "VolumeError", "VolumeId", "VolumeRole", "check_virtual_size", "check_vmid", "copy_over",
    "initial_lv_size", "live_reduction_refused", "live_reduction_target", "new_volume",
    "next_disk_name", "parse_volname", "parse_volume_id", "shrink_target",
]
