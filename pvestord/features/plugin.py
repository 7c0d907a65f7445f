"""The decisions behind pvestord's Proxmox storage plugin: JSON in, JSON out.

``PVE::Storage::Custom::PvestordPlugin`` (packaging/perl) subclasses Proxmox's
``LVMPlugin`` and maps the methods Proxmox calls onto ``pvestord plugin``:
one JSON request on stdin, one JSON answer on stdout. The Perl carries out
what the answer says (``lvcreate``, ``lvextend``, ``qemu-img create``) with
Proxmox's own helpers, under the storage lock Proxmox holds; this module only
decides, so it takes no lock (taking the storage lock here would deadlock
against the caller).

Requests (sizes in bytes; ``storage`` is ``{"storeid", "vgname", "shared",
"options": {pvestord-chunksize, ...}}`` as Proxmox parsed them, former names too):

``alloc``: ``{"vmid", "format", "name", "virtual_size", "backing": bool,
    "callers": [perl sub names], "replaces": name, "parent": base}`` ->
    ``{"name", "format", "tags", "lv_size", "maximum",
    "kind": "thin"|"thick"|"plain", "preallocation": "off"}``.
    A new volume named ``name`` (Proxmox's, or the plugin's next free disk
    name) in ``format``, as Proxmox asked for it: a disk, a snapshot overlay
    (``backing``: Proxmox formats overlays with
    ``extended_l2=on,cluster_size=128k``) or the new top after a rollback;
    a VM's RAM state (raw: a *plain* LV of ``virtual_size`` in whole extents,
    no image on it); a backup's fleecing image (a thin qcow2, its name given
    the ``.qcow2`` suffix). :func:`pvestord.policy.volumes.new_volume` says
    which names and formats are allowed; ``name`` in the answer is the LV to
    create and the volume name to hand back to Proxmox.
    ``replaces`` (optional, the overlay's own ``name``): the new top of a
    rollback, which replaces the LV of that name. The guards judge the VG
    as the rollback leaves it, that LV removed: a rollback discarding a top
    that grew is not refused for the room that top holds. The plugin asks
    before it changes anything and makes the new top before it removes the
    old one; LVM itself refuses the new top when the VG cannot hold both
    for that moment, and the rollback is undone.
    When one of :data:`COPY_FLOWS` is among the callers, the new volume is
    about to be filled at copy speed with nobody to grow it (no QEMU, or a
    block job QEMU reports only as a job error): it is made *thick*, the LV
    at the image's maximum, so the copy can never hit ENOSPC, and tagged
    :data:`~pvestord.policy.capacity.COPY_TAG`: the plugin has it reduced
    to its data plus a chunk once the copy is over
    (:mod:`pvestord.features.volumes.copies`).
    ``parent`` (optional, a base's LV, ``base-<vmid>-...qcow2``): the overlay
    is a linked clone of that base (``clone_image``; ``backing`` must be
    set). It is thin whoever calls: qemu-server's ``clone_disk`` is among
    the copy flows, but nothing is copied into a linked clone, its guest
    writes it and the daemon grows it. Its LV carries
    :func:`~pvestord.policy.templates.parent_tag`, which keeps the base from
    being freed on every node (the VG is shared).
``base``: ``{"lv": name}`` -> ``{"name", "deltags", "addtags"}``. ``qm
    template`` makes the disk ``lv`` a read-only base: the plugin renames it
    ``name`` (:func:`~pvestord.policy.templates.base_name`) and retags it.
    Refused while the disk has snapshot LVs (a base is one image; qemu-server
    refuses templates with snapshots too). A base is never written again, so
    the maximum it records is its LV size: the capacity figures count what it
    holds, not room it could grow into. A copy target's tag is dropped: the
    base is never reduced (it is read-only), it keeps the size it has.
``resize``: ``{"lv": name, "virtual_size": new}`` -> ``{"lv_size", "extend": bool}``.
    The qcow2 grows; the LV keeps its size (it is never made thick), except
    that it is never left below the initial size the storage gives new disks.
``commit``: ``{"target_lv", "source_lv", "virtual_size", "running": bool}`` ->
    ``{"lv_size", "extend": bool, "deltags", "addtags"}``. A snapshot delete writes ``source_lv``'s
    data into ``target_lv``: offline ``qemu-img commit`` into the first
    snapshot or ``qemu-img rebase`` of the child; for a ``running`` VM,
    qemu-server's ``block-commit`` or ``block-stream``, which fail on the
    first ENOSPC (they pass no ``on-error``) and so cannot wait for the
    daemon. The target is grown first by what the source holds plus one
    chunk, capped at the target's maximum for ``virtual_size``: the job never
    runs out of room. What the source holds is its LV size (an image never
    ends past its LV), not its image end: ``qemu-img check`` reads every
    table, minutes on a large image, and this runs under the storage lock;
    while the VM runs the image may be growing anyway. At most the LV's
    unused tail is granted too much, and only until the merge is over: the
    target is tagged :data:`~pvestord.policy.capacity.COPY_TAG` with the
    growth (``addtags``), so the plugin has it reduced to what it then holds
    plus a chunk (:mod:`pvestord.features.volumes.copies`): offline right
    after the delete, for a running VM at the LV's next deactivation.

Every request may carry ``lock_seconds_left``: what is left of the alarm the
caller's storage lock runs under (``cfs_lock``'s 60 s, which aborts the holder
well before pmxcfs lets another node take the lock at 120 s), or null when it
has none. The answer keeps to :func:`answer_budget` of it and fails, having
changed nothing, when that runs out: the rest is for the LVM command that
carries the answer out under the same lock.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pvestord import policy
from pvestord.adapters import lvm, preparedjobs, qemu_img
from pvestord.adapters.config import ThinStorage, thin_from_options
from pvestord.errors import PvestordError
from pvestord.features import capacity
from pvestord.policy import templates
from pvestord.policy.capacity import COPY_TAG, maximum_tag, retag_maximum
from pvestord.policy.lvnames import is_snapshot
from pvestord.policy.sizes import KiB, align_up
from pvestord.policy.volumes import NewVolume, VolumeRole, initial_lv_size, new_volume

log = logging.getLogger(__name__)

#: ``PVE::Storage::Common::qemu_img_create_qcow2_backed``'s fixed overlay layout.
OVERLAY_CLUSTER_SIZE = 128 * KiB

#: The share of what is left of the caller's lock alarm that an answer may take:
#: the rest is for Python's start and for the LVM command carrying it out.
LOCK_BUDGET_SHARE = 0.5
#: The budget of an answer when the caller's lock has no alarm (Proxmox's
#: flock of a storage that is not shared): what it would get under cfs_lock.
UNTIMED_LOCK_BUDGET = 30.0

#: qemu-server subroutines whose ``vdisk_alloc`` is followed by a copy of a
#: whole disk into the new volume (full clone and move, offline or by a
#: mirror job; local-disk migration over NBD; import; the three restores).
COPY_FLOWS = frozenset({
    "PVE::QemuServer::clone_disk",
    "PVE::QemuServer::vm_migrate_alloc_nbd_disks",
    "PVE::QemuServer::ImportDisk::do_import",
    "PVE::QemuServer::restore_vma_archive",
    "PVE::QemuServer::restore_proxmox_backup_archive",
    "PVE::QemuServer::restore_external_archive",
    "PVE::QemuServer::restore_file_archive",
})


class PluginRequestError(PvestordError):
    """A request the plugin protocol does not allow (a bug in the caller)."""


class PluginTimeoutError(PvestordError):
    """The answer would have taken longer than the caller's lock allows."""


class Kind(enum.Enum):
    THIN = "thin"
    THICK = "thick"
    #: An LV of the size asked with no image on it (a VM's RAM state, raw).
    PLAIN = "plain"


# --- pure decisions ----------------------------------------------------------------

def allocation_kind(callers: Iterable[str], role: VolumeRole = VolumeRole.DISK) -> Kind:
    """Plain for a VM's RAM state; thick when the allocation is for a copy (see
    :data:`COPY_FLOWS`); else thin.

    A RAM state is raw, written once from start to end by QEMU's savevm, as
    large as qemu-server sized it (twice the RAM plus 500 MiB): there is no
    image that could grow, so nothing to make thin."""
    if role is VolumeRole.VMSTATE:
        return Kind.PLAIN
    return Kind.THICK if any(c in COPY_FLOWS for c in callers) else Kind.THIN


def alloc_lv_size(kind: Kind, initial_size: int, maximum: int, extent_size: int) -> int:
    """The LV size of a new volume: the initial size (never above the maximum)
    when thin, the maximum when thick or plain; whole extents either way."""
    if kind is not Kind.THIN:
        return align_up(maximum, extent_size)
    return initial_lv_size(initial_size, maximum, extent_size)


def resize_lv_size(lv_size: int, new_maximum: int, initial_size: int, extent_size: int) -> int:
    """The LV size after the image grows: unchanged, or raised to what a new
    disk of the new size would get; never smaller than ``lv_size``."""
    return max(lv_size, initial_lv_size(initial_size, new_maximum, extent_size))


def answer_budget(lock_seconds_left: float | None) -> float:
    """Seconds an answer may take: a share of what is left of the caller's lock
    alarm, strictly less than it; :data:`UNTIMED_LOCK_BUDGET` without an alarm."""
    if lock_seconds_left is None:
        return UNTIMED_LOCK_BUDGET
    return LOCK_BUDGET_SHARE * lock_seconds_left


#: A commit/rebase target's size: the rule a block job's target gets, one
#: place for the plugin and the daemon (:func:`pvestord.policy.job_target_size`).
commit_lv_size = policy.job_target_size


# --- the protocol --------------------------------------------------------------------

@dataclass(frozen=True)
class Request:
    op: str
    storage: ThinStorage
    body: Mapping[str, Any]

    def integer(self, key: str) -> int:
        value = self.body.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise PluginRequestError(f"{self.op}: '{key}' must be a positive integer, "
                                     f"got {value!r}")
        return value

    @property
    def lock_seconds_left(self) -> float | None:
        value = self.body.get("lock_seconds_left")
        if value is None:
            return None
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
            raise PluginRequestError(f"{self.op}: 'lock_seconds_left' must be a positive "
                                     f"number of seconds or null, got {value!r}")
        return float(value)

    def new_volume(self) -> NewVolume:
        """The volume an ``alloc`` asks for (:func:`new_volume`'s rules).

        :raises VolumeError: a name or format this storage does not hold."""
        fmt, name = self.body.get("format"), self.body.get("name")
        if not isinstance(fmt, str) or not isinstance(name, str):
            raise PluginRequestError(f"{self.op}: 'format' and 'name' must be strings, "
                                     f"got {fmt!r} and {name!r}")
        return new_volume(self.integer("vmid"), fmt, name)

    def replaces(self, volume: NewVolume, backing: bool) -> str | None:
        """The LV an ``alloc`` replaces: only a rollback's top replaces one, the
        LV of its own name (never another volume, whose room it would claim)."""
        if self.body.get("replaces") is None:
            return None
        replaced = self.name("replaces")
        if not backing or replaced != volume.name:
            raise PluginRequestError(f"{self.op}: only a rollback's new top replaces an LV,"
                                     f" its own ({volume.name!r}), not {replaced!r}")
        return replaced

    def parent(self, backing: bool) -> str | None:
        """The base an ``alloc`` makes a linked clone of: an overlay's only.

        :raises TemplateError: not a base's LV name."""
        if self.body.get("parent") is None:
            return None
        parent = self.name("parent")
        if not backing:
            raise PluginRequestError(f"{self.op}: a linked clone is an overlay ('backing')")
        if not templates.is_base(parent):
            raise templates.TemplateError(f"{parent!r} is not a base"
                                          " (base-<vmid>-<name>.qcow2)")
        return parent

    def name(self, key: str) -> str:
        value = self.body.get(key)
        if not isinstance(value, str):
            raise PluginRequestError(f"{self.op}: '{key}' must be an LV name, got {value!r}")
        return lvm.check_name("LV", value)


def parse_request(text: str) -> Request:
    """:raises PluginRequestError: not a request; :raises ConfigError: bad options."""
    try:
        data = json.loads(text)
    except ValueError as err:
        raise PluginRequestError(f"the request is not JSON: {err}") from err
    if not isinstance(data, dict):
        raise PluginRequestError("the request must be a JSON object")
    op = data.get("op")
    if op not in ("alloc", "resize", "commit", "base"):
        raise PluginRequestError(f"unknown op {op!r} (alloc, resize, commit or base)")
    storage = data.get("storage")
    if not isinstance(storage, dict):
        raise PluginRequestError(f"{op}: 'storage' must be an object")
    storeid, vgname = storage.get("storeid"), storage.get("vgname")
    options = storage.get("options", {})
    if not isinstance(storeid, str) or not isinstance(vgname, str) \
            or not isinstance(options, dict):
        raise PluginRequestError(f"{op}: 'storage' needs storeid, vgname and options")
    lvm.check_name("VG", vgname)
    texts = {k: None if v is None else str(v) for k, v in options.items()}
    thin = thin_from_options(storeid, vgname, bool(storage.get("shared")), texts,
                             f"storage.cfg (storage '{storeid}')")
    return Request(op, thin, data)


async def answer(request: Request, *, prepared_jobs: Path | None = None) -> dict[str, Any]:
    """Gather what the decision needs (LVM, qemu-img), decide, say what to do.

    ``prepared_jobs``: where to record the target of a running VM's ``commit``
    (:mod:`pvestord.adapters.preparedjobs`), so that the daemon can tell the
    snapshot deletes prepared here from those qemu-server started without.

    :raises PluginTimeoutError: not done within :func:`answer_budget` (the
        commands it ran are killed with it).
    """
    left = request.lock_seconds_left
    budget = answer_budget(left)
    try:
        async with asyncio.timeout(budget):
            decided = await _decide(request)
    except TimeoutError:
        held = ("its storage lock has no alarm" if left is None
                else f"{left:g} s were left of its storage lock's alarm")
        raise PluginTimeoutError(
            f"{request.op}: no answer within {budget:g} s ({held}); nothing was changed"
        ) from None
    if request.op == "commit" and request.body.get("running") and prepared_jobs is not None:
        _note_prepared(prepared_jobs, request.storage.vgname, request.name("target_lv"))
    return decided


def _note_prepared(folder: Path, vg: str, lv: str) -> None:
    """The record is for the daemon's warning only: never fail the delete for it."""
    try:
        preparedjobs.note(folder, vg, lv)
    except OSError as err:
        log.warning("cannot record the prepared snapshot delete into %s/%s under %s: %s",
                    vg, lv, folder, err.strerror)


async def _decide(request: Request) -> dict[str, Any]:
    storage = request.storage
    vg = storage.vgname
    if request.op == "alloc":
        volume = request.new_volume()
        virtual_size = request.integer("virtual_size")
        backing = bool(request.body.get("backing"))
        if backing and volume.role is not VolumeRole.DISK:
            raise PluginRequestError(f"alloc: only a disk has snapshots, not {volume.name!r}")
        callers = request.body.get("callers", [])
        if not isinstance(callers, list):
            raise PluginRequestError("alloc: 'callers' must be a list of names")
        replaces = request.replaces(volume, backing)
        parent = request.parent(backing)
        extent = (await lvm.vg_info(vg)).extent_size
        # A linked clone is written by its guest, never copied into: thin.
        kind = (Kind.THIN if parent is not None
                else allocation_kind((str(c) for c in callers), volume.role))
        if kind is Kind.PLAIN:
            maximum = align_up(virtual_size, extent)
        else:
            measured = await qemu_img.measure(
                virtual_size, cluster_size=OVERLAY_CLUSTER_SIZE if backing else None,
                extended_l2=backing)
            maximum = policy.maximum_size(measured.fully_allocated, extent)
        lv_size = alloc_lv_size(kind, storage.initial_size, maximum, extent)
        # A RAM state takes VG space the running thin VMs grow into: the same guards.
        await capacity.check_new_volume(storage, lv_size=lv_size, maximum=maximum,
                                        replaces=replaces)
        # The maximum goes into a tag with the LV: every node's capacity
        # figures and guards read it from the VG metadata, active here or not.
        tags = [*volume.tags, maximum_tag(maximum)]
        if kind is Kind.THICK:
            tags.append(COPY_TAG)
        if parent is not None:
            tags.append(templates.parent_tag(parent))
        return {"name": volume.name, "format": volume.format, "tags": tags,
                "lv_size": lv_size, "maximum": maximum, "kind": kind.value,
                "preallocation": "off"}
    if request.op == "base":
        return await _base(vg, request.name("lv"))
    if request.op == "resize":
        lv = request.name("lv")
        virtual_size = request.integer("virtual_size")
        info = await lvm.lv_info(vg, lv)
        image = await qemu_img.info(f"/dev/{vg}/{lv}", force_share=True)
        maximum = await _maximum(image, virtual_size, info.extent_size)
        target = resize_lv_size(info.size, maximum, storage.initial_size, info.extent_size)
        return {"lv_size": target, "extend": target > info.size, "maximum": maximum,
                **_retag(info.tags, maximum)}
    target_lv, source_lv = request.name("target_lv"), request.name("source_lv")
    virtual_size = request.integer("virtual_size")
    running = bool(request.body.get("running"))
    info = await lvm.lv_info(vg, target_lv)
    # A running QEMU holds the chain's image locks; the header is read all the same.
    image = await qemu_img.info(f"/dev/{vg}/{target_lv}", force_share=running)
    maximum = await _maximum(image, virtual_size, info.extent_size)
    source_lv_size = (await lvm.lv_info(vg, source_lv)).size
    target = commit_lv_size(info.size, source_lv_size, maximum, storage.chunksize, info.extent_size)
    # qemu-img commit grows a smaller backing image to the top's virtual size:
    # the target, which becomes the top, records the maximum it now has.
    retag = _retag(info.tags, maximum)
    if COPY_TAG not in info.tags:
        # Reduced again once the merge is over (pvestord.features.volumes.copies).
        retag["addtags"].append(COPY_TAG)
    return {"lv_size": target, "extend": target > info.size, "maximum": maximum, **retag}


async def _base(vg: str, lv: str) -> dict[str, Any]:
    """The name and tags the disk ``lv`` takes as a base (the ``base`` op).

    :raises TemplateError: ``lv`` is no qcow2 disk, or it has snapshot LVs."""
    name = templates.base_name(lv)
    rows = {row.lv: row for row in await lvm.list_lvs(vg)}
    if lv not in rows:
        raise lvm.LvMissingError(f"reading LV {vg}/{lv}: no such LV")
    snapshots = sorted(n for n in rows if is_snapshot(n) and n.startswith(
        f"snap_{lv.removesuffix('.qcow2')}_"))
    if snapshots:
        raise templates.TemplateError(
            f"{vg}/{lv} has snapshots ({', '.join(snapshots)}): a base is one image;"
            " delete them first")
    if name in rows:
        raise templates.TemplateError(f"{vg}/{name} exists already")
    tags = rows[lv].tags
    stale, new = retag_maximum(tags, rows[lv].size)
    # Proxmox tags a qcow2 volume with its own name (LVMPlugin rename_volume
    # retags it the same way on a rename); lvcreate is given it as
    # '@pve-<name>', which LVM stores without the '@'.
    own = {f"pve-{lv}", f"@pve-{lv}", COPY_TAG}
    deltags = sorted({*stale, *(t for t in tags if t in own)})
    return {"name": name, "deltags": deltags, "addtags": [*new, f"pve-{name}"]}


def _retag(tags: tuple[str, ...], maximum: int) -> dict[str, list[str]]:
    """``deltags``/``addtags``: the tag changes that make an LV with ``tags``
    record ``maximum`` (:func:`retag_maximum`), for the caller to make with
    one ``lvchange`` under the storage lock it holds; none when it does."""
    stale, new = retag_maximum(tags, maximum)
    return {"deltags": stale, "addtags": new}


async def _maximum(image: qemu_img.ImageInfo, virtual_size: int, extent_size: int) -> int:
    """The maximum of ``image`` once it has ``virtual_size`` (bitmaps included)."""
    grown = dataclasses.replace(image, virtual_size=virtual_size)
    return policy.maximum_size(await qemu_img.maximum_required(grown), extent_size)


__all__ = [
    "COPY_FLOWS",
    "LOCK_BUDGET_SHARE",
    "OVERLAY_CLUSTER_SIZE",
    "UNTIMED_LOCK_BUDGET",
    "Kind",
    "PluginRequestError",
    "PluginTimeoutError",
    "Request",
    "alloc_lv_size",
    "allocation_kind",
    "answer",
    "answer_budget",
    "commit_lv_size",
    "parse_request",
    "resize_lv_size",
]
