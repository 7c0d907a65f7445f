"""Thin volumes: create them small, shrink stopped ones, list what shrinking gives back.

The daemon only ever grows LVs; this module is where a thin LV starts small
(``create``) and where a thick or bloated one is made small again
(``shrink``). Both follow Proxmox's own LVM plugin (pve-storage
``PVE/Storage/LVMPlugin.pm``) so the result is a volume Proxmox can attach:

- names: ``vm-<vmid>-disk-<n>.qcow2``, the first ``n`` (0..1023) not taken by
  an LV of the VG (``get_next_vm_diskname``). We count a number as taken when
  any LV name contains ``vm-<vmid>-disk-<n>`` or ``base-<vmid>-disk-<n>``,
  with or without ``.qcow2``: a superset of what Proxmox counts, so we never
  pick a name Proxmox would consider used, and never put
  ``vm-100-disk-0.qcow2`` beside a raw ``vm-100-disk-0``;
- ``lvcreate -aly -Wy --yes --setautoactivation n --addtag pve-vm-<vmid>
  --addtag pve-<volname>``: the second tag is what Proxmox activates a qcow2
  volume (and its snapshot LVs) by (``lvchange -aey @pve-<volname>``); without
  it Proxmox could not start a VM on the volume;
- ``qemu-img create -f qcow2 -o preallocation=off``: Proxmox's default for
  qcow2 is ``metadata``, which writes every L2 table up front; a thin LV
  needs them allocated as the guest writes;
- all metadata changes under the storage locks of every storage on the VG
  (:func:`pvestord.adapters.locks.vg_lock`; each is the lock Proxmox's ``vdisk_alloc``
  holds around ``alloc_image``), and nothing else: ``qemu-img create`` runs
  after the lock is released.

Shrinking: when is it safe?
    An LV can be reduced only if nothing can write the image meanwhile and
    nothing past the new end is data. We refuse, with the reason:

    1. the VM runs on this node (``<run-dir>/<vmid>.pid`` names a live QEMU,
       :func:`pvestord.adapters.vms.local_vm`): a certain answer;
    2. this node cannot prove that it owns the VM. LVM cannot see another
       node's activations (no lvmlockd), and Proxmox keeps no run marker in
       ``/etc/pve``, so the proof is the ownership pmxcfs keeps: a VM runs
       only on the node holding its config (``qm start`` refuses elsewhere;
       a live migration moves the config only once the source QEMU is gone),
       and pmxcfs's ``.vmlist`` names that node. We require (a) quorum, from
       ``.members`` (``"cluster": {..., "quorate": 1}``; a standalone node,
       with no ``cluster`` and no ``corosync.conf``, is its own quorum):
       without it our ``.vmlist`` may be stale and the VM recovered on a node
       we cannot hear; (b) ``.vmlist`` naming this node (``.members``'
       ``nodename``) for the VMID; (c) check 1. pvestatd's status broadcast
       (``.rrd``, a line ``pve2.3-vm/<vmid>:<uptime>:<name>:<status>:...``
       per VM) is supporting evidence only: a line saying anything but
       ``stopped`` refuses, however old; a missing line proves nothing,
       because pmxcfs drops lines not refreshed for 5 minutes (a hung
       pvestatd, a partition, a restarted pve-cluster);
    3. the LV is open on this node (someone uses it);
    4. the LV is active on this node. Proxmox activates a volume to use it
       and deactivates it when the VM stops, so an active LV means a user or
       a task in progress (a start, a backup, a migration). Shrink therefore
       starts from an inactive LV, activates it itself (``-aey``) to read it,
       and deactivates it at the end, also after a refusal or a dry run. The
       LV must be active for ``qemu-img check`` and ``lvreduce`` alike;
    5. the image does not check clean (``qemu-img check``: corruption or
       leaked clusters; leaks are harmless but ``check -r leaks`` first lets
       the image end shrink too). The image end offset comes from that
       check: nothing of the image lies beyond it.

    The new size is ``max(initial-size, image end + one chunk)`` rounded up to
    whole extents, never below the image end (rounding only goes up), never
    above the current size. The chunk is the headroom the daemon wants
    anyway (more than ``chunksize * chunk-percentage``), so a shrunk disk
    starts with its threshold above the data and grows on its first writes
    past it. Under the storage lock the LV is read again (same size, still
    not open) and the VM's status re-checked before ``lvreduce -f``; after
    it, the image is checked again and must still be clean with the same end.

    ``--dry-run`` does everything up to the decision (the temporary
    activation included, which writes no metadata) and changes nothing.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from pvestord import paths, policy
from pvestord.adapters import command, lvm, qemu_img, vghealth
from pvestord.adapters.config import StorageConfig, ThinStorage, load_storage_config
from pvestord.adapters.locks import PMXCFS_LOCK_EXPIRY, Held, vg_lock
from pvestord.adapters.vghealth import VgHealth
from pvestord.adapters.vms import local_vm
from pvestord.errors import CommandError, PvestordError
from pvestord.features import capacity
from pvestord.policy.sizes import align_up, format_size

log = logging.getLogger(__name__)

#: pmxcfs's mount: ``.members`` (quorum, node name), ``.vmlist`` (VM -> node), ``.rrd``.
CLUSTER_DIR = Path("/etc/pve")
#: ``$MAX_VOLUMES_PER_GUEST`` in PVE::Storage::Plugin.
MAX_VOLUMES_PER_GUEST = 1024
#: pve-vmid: 100 .. 999999999.
MIN_VMID = 100
MAX_VMID = 999_999_999
#: Budget for waiting on the storage lock, as ``cfs_lock``.
STORAGE_LOCK_TIMEOUT = 10.0
#: ``qemu-img create`` writes a header and empty tables: seconds even under TCG.
CREATE_TIMEOUT = 60.0

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


@dataclass(frozen=True)
class VolumeSettings:
    """Where things live; every one is a command-line option."""

    storage_config: Path = paths.STORAGE_CFG
    run_dir: Path = paths.QEMU_SERVER_RUN
    cluster_dir: Path = CLUSTER_DIR
    #: Force pmxcfs-style lock directories here (see :func:`storage_lock`).
    lock_dir: Path | None = None
    #: Lifetime of a lock directory off pmxcfs (the emulated expiry's; tests).
    lock_lifetime: float = PMXCFS_LOCK_EXPIRY
    #: Where VGs this node must not change are marked (:mod:`pvestord.adapters.vghealth`).
    vg_health_dir: Path = vghealth.DEFAULT_DIR


# --- names and ids (pure) ------------------------------------------------------

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


# --- sizes (pure) ---------------------------------------------------------------

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


# --- is the VM running anywhere? ------------------------------------------------

@dataclass(frozen=True)
class ClusterReport:
    """One node's status line for a VM, from pmxcfs's ``.rrd``."""

    vmid: int
    status: str
    uptime: int
    #: When the reporting node sent it (epoch seconds), if given.
    ctime: int | None
    #: Where ``.vmlist`` says the VM lives, if known.
    node: str | None

    @property
    def running(self) -> bool:
        return self.status not in ("", "stopped") or self.uptime > 0


def parse_rrd(text: str, vmid: int) -> tuple[str, int, int | None] | None:
    """``(status, uptime, ctime)`` of ``vmid`` from a ``.rrd`` dump, or None.

    Lines are ``<key>:<values separated by ':'>``. ``pve2.3-vm/<vmid>``:
    uptime, name, status, template, ctime, ...; the older ``pve2-vm/<vmid>``
    has no status field (running means uptime > 0), as ``PVE::API2Tools``
    reads them.
    """
    found: tuple[str, int, int | None] | None = None
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        values = rest.split(":")
        if key == f"pve2.3-vm/{vmid}":
            status = values[2] if len(values) > 2 else ""
            ctime = _int_or_none(values[4]) if len(values) > 4 else None
            return status, _int_or_none(values[0]) or 0, ctime
        if key == f"pve2-vm/{vmid}" and found is None:
            uptime = _int_or_none(values[0]) or 0
            found = ("running" if uptime else "stopped", uptime, None)
    return found


def _int_or_none(text: str) -> int | None:
    try:
        return int(float(text))
    except ValueError:
        return None


def cluster_report(cluster_dir: Path, vmid: int) -> ClusterReport | None:
    """What the cluster folder's ``.rrd`` says about ``vmid``; None when it says nothing.

    :raises ShrinkRefused: there is no ``.rrd`` to ask (pmxcfs not mounted).
    """
    rrd = cluster_dir / ".rrd"
    try:
        text = rrd.read_text(errors="replace")
    except OSError as err:
        raise ShrinkRefused(
            f"cannot tell whether VM {vmid} runs on another node: {rrd} cannot be read "
            f"({err.strerror}); is the cluster file system mounted?") from err
    parsed = parse_rrd(text, vmid)
    if parsed is None:
        return None
    node = None
    with contextlib.suppress(OSError):
        node = vmlist_owner((cluster_dir / ".vmlist").read_text(errors="replace"), vmid)
    status, uptime, ctime = parsed
    return ClusterReport(vmid, status, uptime, ctime, node)


@dataclass(frozen=True)
class Membership:
    """pmxcfs's ``.members``: this node's name and whether it has quorum."""

    nodename: str
    #: False on a standalone node (pmxcfs without corosync: no ``cluster`` key).
    clustered: bool
    quorate: bool


def parse_members(text: str) -> Membership | None:
    """``.members`` as pmxcfs writes it, or None when it is not that.

    Clustered: ``{"nodename": N, "version": V, "cluster": {"name": ...,
    "version": ..., "nodes": ..., "quorate": 0|1}, "nodelist": {...}}``;
    standalone (or before corosync told pmxcfs anything): ``{"nodename": N,
    "version": V}``.
    """
    try:
        data = json.loads(text)
    except ValueError:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("nodename"), str):
        return None
    cluster = data.get("cluster")
    if cluster is None:
        return Membership(data["nodename"], clustered=False, quorate=True)
    if not isinstance(cluster, dict):
        return None
    return Membership(data["nodename"], clustered=True, quorate=cluster.get("quorate") == 1)


def vmlist_owner(text: str, vmid: int) -> str | None:
    """The node ``.vmlist`` says holds ``vmid``'s config, or None (unknown VMID or
    not a VM list: ``{"version": V, "ids": {"<vmid>": {"node": N, ...}}}``)."""
    try:
        node = json.loads(text)["ids"][str(vmid)]["node"]
    except (ValueError, KeyError, TypeError):
        return None
    return node if isinstance(node, str) and node else None


@dataclass(frozen=True)
class ClusterView:
    """What the cluster folder says, as read; None where a file was unreadable."""

    members: str | None
    vmlist: str | None
    rrd: str | None
    #: ``corosync.conf`` exists: this node is (or is joining) a cluster.
    corosync_conf: bool


def cross_node_refusal(view: ClusterView, vmid: int, now: float) -> str | None:
    """Why shrinking ``vmid`` is not proven safe from the other nodes' side, or None.

    Proof is quorum plus ``.vmlist`` naming this node (see the module
    docstring); ``.rrd`` can only refuse, never allow.
    """
    if view.members is None:
        return (f"cannot tell whether VM {vmid} runs on another node: .members cannot be "
                "read; is the cluster file system mounted?")
    members = parse_members(view.members)
    if members is None:
        return f"cannot tell whether VM {vmid} runs on another node: .members is unreadable"
    if members.clustered and not members.quorate:
        return (f"node {members.nodename} has no quorum: its view of where VM {vmid} runs "
                "may be stale (another partition may have started it); try again with quorum")
    if not members.clustered and view.corosync_conf:
        return (f"cannot tell whether VM {vmid} runs on another node: the cluster folder has "
                "a corosync.conf but pmxcfs knows no members yet; try again in a moment")
    parsed = parse_rrd(view.rrd, vmid) if view.rrd is not None else None
    if parsed is not None:
        status, uptime, ctime = parsed
        owner = vmlist_owner(view.vmlist, vmid) if view.vmlist is not None else None
        report = ClusterReport(vmid, status, uptime, ctime, owner)
        if report.running:
            where = f"node {owner}" if owner else "a node"
            age = f", reported {max(0, int(now) - ctime)} s ago" if ctime is not None else ""
            return (f"VM {vmid} is {status or 'running'} on {where} according to .rrd{age}; "
                    "stop it first")
    owner = vmlist_owner(view.vmlist, vmid) if view.vmlist is not None else None
    if owner is None:
        return (f"VM {vmid} is in no node's VM list (.vmlist): cannot tell which node owns "
                "it, so nothing proves it runs nowhere; shrink only volumes of existing VMs")
    if owner != members.nodename:
        return (f"VM {vmid}'s configuration is on node {owner}, not on this node "
                f"({members.nodename}): it may run there; shrink it on {owner}")
    return None


def read_cluster_view(cluster_dir: Path) -> ClusterView:
    def read(name: str) -> str | None:
        try:
            return (cluster_dir / name).read_text(errors="replace")
        except OSError:
            return None
    return ClusterView(read(".members"), read(".vmlist"), read(".rrd"),
                       (cluster_dir / "corosync.conf").exists())


def refuse_if_running(settings: VolumeSettings, vmid: int) -> None:
    """:raises ShrinkRefused: the VM runs here, or this node cannot prove it runs nowhere
    else (:func:`cross_node_refusal`)."""
    vm = local_vm(settings.run_dir, vmid)
    if vm is not None:
        raise ShrinkRefused(f"VM {vmid} is running on this node (pid {vm.pid}); "
                            "stop it first")
    why = cross_node_refusal(read_cluster_view(settings.cluster_dir), vmid, time.time())
    if why is not None:
        raise ShrinkRefused(f"{why} (cluster folder {settings.cluster_dir})")


# --- storage --------------------------------------------------------------------

def thin_storage(config: StorageConfig, storeid: str) -> ThinStorage:
    """:raises VolumeError: unknown, not LVM, disabled or not thin-enabled."""
    lvm_storage = config.lvm_storages.get(storeid)
    if lvm_storage is None:
        others = [s for s in config.sections if s.id == storeid]
        if others:
            raise VolumeError(f"storage '{storeid}' is of type '{others[0].type}', "
                              "not lvm")
        raise VolumeError(f"no storage '{storeid}' in {config.source}")
    if lvm_storage.disabled:
        raise VolumeError(f"storage '{storeid}' is disabled")
    if lvm_storage.thin is None:
        raise VolumeError(f"storage '{storeid}' is not thin-enabled (no chunksize in "
                          f"{config.source}): its LVs would never grow")
    return lvm_storage.thin


def _load(settings: VolumeSettings) -> StorageConfig:
    """:raises ConfigError: unreadable file or invalid options of ours."""
    return load_storage_config(settings.storage_config)


@contextlib.asynccontextmanager
async def _locked(settings: VolumeSettings, storage: ThinStorage,
                  config: StorageConfig | None = None) -> AsyncIterator[Held]:
    """The locks of every storage on ``storage``'s VG, as the daemon takes
    them; refused while the VG is marked unhealthy on this node."""
    if config is None:
        config = _load(settings)
    lock = vg_lock(storage.vgname, config.vg_users(storage.vgname),
                   lock_dir=settings.lock_dir, lifetime=settings.lock_lifetime,
                   health=VgHealth(settings.vg_health_dir))
    async with lock.acquire_async(STORAGE_LOCK_TIMEOUT) as held:
        yield held


# --- create ---------------------------------------------------------------------

@dataclass(frozen=True)
class Created:
    volid: VolumeId
    lv_size: int
    virtual_size: int
    maximum: int


async def create(settings: VolumeSettings, storeid: str, vmid: int, size: int,
                 name: str | None = None) -> Created:
    """Create a thin qcow2 volume (see the module docstring).

    :raises VolumeError: bad input, storage not thin, name taken.
    :raises PvestordError: LVM, qemu-img or the lock failed.
    """
    check_vmid(vmid)
    check_virtual_size(size)
    if name is not None and parse_volname(name) != vmid:
        raise VolumeError(f"volume name {name!r} does not belong to VM {vmid}")
    config = _load(settings)
    storage = thin_storage(config, storeid)
    vg = storage.vgname
    VgHealth(settings.vg_health_dir).check(vg)
    extent = (await lvm.vg_info(vg)).extent_size
    measured = await qemu_img.measure(size)
    maximum = policy.maximum_size(measured.fully_allocated, extent)
    lv_size = initial_lv_size(storage.initial_size, maximum, extent)
    await capacity.check_new_volume(storage, lv_size=lv_size, maximum=maximum,
                                    extent_size=extent)
    # Only what must be atomic with lvcreate runs under the lock (REVIEW R7):
    # the name is chosen and checked again there (one lvs), the qcow2 header
    # is written after the lock is released (it changes no LVM metadata).
    async with _locked(settings, storage, config) as held:
        names = {row.lv for row in await lvm.list_lvs(vg)}
        volname = name if name is not None else next_disk_name(names, vmid)
        if volname in names:
            raise VolumeError(f"volume {storeid}:{volname} already exists")
        held.require(lvm.CHANGE_TIMEOUT + command.KILL_WAIT)
        await lvm.create(vg, volname, lv_size, (f"pve-vm-{vmid}", f"pve-{volname}"))
    try:
        await command.run_async(
            [command.binary("qemu-img"), "create", "-q", "-f", "qcow2",
             "-o", "preallocation=off", "--", f"/dev/{vg}/{volname}", str(size)],
            timeout=CREATE_TIMEOUT)
    except BaseException:
        # Nothing is on the LV yet: remove it (under the lock again) so no
        # half-made volume remains.
        try:
            async with _locked(settings, storage, config) as held:
                held.require(lvm.CHANGE_TIMEOUT + command.KILL_WAIT)
                await lvm.remove(vg, volname)
        except PvestordError as err:
            log.error("%s:%s: qemu-img create failed and the new LV could not be removed:"
                      " %s; remove it with 'lvremove %s/%s'", storeid, volname, err, vg,
                      volname)
        raise
    log.info("created %s:%s: LV %s, qcow2 %s (maximum %s)", storeid, volname,
             format_size(lv_size), format_size(size), format_size(maximum))
    return Created(VolumeId(storeid, volname, vmid), lv_size, size, maximum)


# --- shrink ---------------------------------------------------------------------

@dataclass(frozen=True)
class Shrunk:
    volid: VolumeId
    lv_size_before: int
    lv_size_after: int
    image_end: int
    virtual_size: int
    target: int
    dry_run: bool
    seconds: float

    @property
    def reclaimed(self) -> int:
        return self.lv_size_before - self.target


async def _checked_clean(path: str, what: str) -> qemu_img.CheckResult:
    try:
        result = await qemu_img.check(path)
    except CommandError as err:
        raise ShrinkRefused(f"{what}: qemu-img check could not read the image: "
                            f"{err}") from err
    if result.status is qemu_img.CheckStatus.CORRUPT:
        raise ShrinkRefused(f"{what}: the image is corrupt ({result.corruptions} "
                            f"corruptions): {result.messages or 'see qemu-img check'}")
    if result.status is qemu_img.CheckStatus.LEAKS:
        raise ShrinkRefused(f"{what}: the image has {result.leaks} leaked clusters; "
                            f"repair them first with 'qemu-img check -r leaks {path}'")
    if result.image_end_offset is None:
        raise ShrinkRefused(f"{what}: qemu-img check did not report the image end")
    return result


async def shrink(settings: VolumeSettings, volid: VolumeId | str, *,
                 dry_run: bool = False) -> Shrunk:
    """Reduce a stopped volume's LV to ``max(initial-size, image end + chunk)``.

    :raises ShrinkRefused: not safe now (the message says why).
    :raises VolumeError: bad volume id or storage.
    :raises PvestordError: LVM, qemu-img or the lock failed.
    """
    began = time.monotonic()
    vol = parse_volume_id(volid) if isinstance(volid, str) else volid
    storage = thin_storage(_load(settings), vol.storeid)
    vg, lv = storage.vgname, vol.volname
    path = f"/dev/{vg}/{lv}"
    refuse_if_running(settings, vol.vmid)
    try:
        before = await lvm.lv_info(vg, lv)
    except lvm.LvMissingError as err:
        raise VolumeError(f"no volume {vol} (no LV {vg}/{lv})") from err
    _refuse_if_in_use(before, vol)
    await lvm.activate(vg, lv)
    try:
        image = await _image_info(path, vol)
        checked = await _checked_clean(path, str(vol))
        end = checked.image_end_offset
        assert end is not None
        target = shrink_target(before.size, end, storage.chunksize, storage.initial_size,
                               before.extent_size)
        result = Shrunk(vol, before.size, before.size, end, image.virtual_size, target,
                        dry_run, 0.0)
        if dry_run or target >= before.size:
            return _timed(result, began)
        async with _locked(settings, storage):
            fresh = await lvm.lv_info(vg, lv)
            if fresh.size != before.size:
                raise ShrinkRefused(f"{vol}: the LV changed size meanwhile "
                                    f"({format_size(before.size)} -> "
                                    f"{format_size(fresh.size)}); try again")
            if fresh.open:
                raise ShrinkRefused(f"{vol}: the LV was opened meanwhile; nothing changed")
            refuse_if_running(settings, vol.vmid)
            await lvm.reduce(vg, lv, target)
        after = await lvm.lv_info(vg, lv)
        recheck = await qemu_img.check(path)
        if (recheck.status is not qemu_img.CheckStatus.CLEAN
                or recheck.image_end_offset != end):
            raise VolumeError(
                f"{vol}: the image no longer checks clean after reducing the LV from "
                f"{before.size} to {target} bytes ({recheck.status.value}, end "
                f"{recheck.image_end_offset}); restore its size at once with "
                f"'lvextend -L {before.size}b {vg}/{lv}'")
        log.info("shrank %s: LV %s -> %s (image end %s)", vol, format_size(before.size),
                 format_size(after.size), format_size(end))
        return _timed(Shrunk(vol, before.size, after.size, end, image.virtual_size, target,
                             False, 0.0), began)
    finally:
        try:
            await lvm.deactivate(vg, lv)
        except PvestordError as err:
            log.warning("%s: could not deactivate the LV again: %s", vol, err)


def _timed(result: Shrunk, began: float) -> Shrunk:
    return Shrunk(result.volid, result.lv_size_before, result.lv_size_after,
                  result.image_end, result.virtual_size, result.target, result.dry_run,
                  time.monotonic() - began)


def _refuse_if_in_use(info: lvm.LvInfo, vol: VolumeId) -> None:
    if info.open:
        raise ShrinkRefused(f"{vol}: the LV {info.vg}/{info.lv} is open on this node "
                            "(in use); nothing changed")
    if info.active:
        raise ShrinkRefused(
            f"{vol}: the LV {info.vg}/{info.lv} is active on this node, so something may "
            "be using it (Proxmox deactivates a stopped VM's volumes); if nothing is, "
            f"deactivate it with 'lvchange -an {info.vg}/{info.lv}' and try again")


async def _image_info(path: str, vol: VolumeId) -> qemu_img.ImageInfo:
    try:
        return await qemu_img.info(path)
    except CommandError as err:
        raise ShrinkRefused(f"{vol}: not a readable qcow2 image: {err}") from err


# --- list -----------------------------------------------------------------------

@dataclass(frozen=True)
class VolumeReport:
    """One qcow2 LV of a thin storage; image figures only where safely readable."""

    volid: str
    storage: str
    vmid: int
    lv: str
    lv_size: int
    #: ``in-use`` (open), ``active`` or ``inactive`` on this node.
    state: str
    image_end: int | None = None
    virtual_size: int | None = None
    maximum: int | None = None
    #: What ``shrink`` would give back, when the image end is known.
    reclaimable: int | None = None
    error: str | None = None


async def list_volumes(settings: VolumeSettings) -> list[VolumeReport]:
    """Every qcow2 volume of every thin-enabled storage, as this node sees it.

    Nothing is activated: an inactive LV cannot be read, so its image figures
    stay unknown (``shrink --dry-run`` activates and reads it). An open LV is
    read with ``qemu-img info -U`` (metadata only); its image end is not
    meaningful while a guest writes.
    """
    config = _load(settings)
    reports: list[VolumeReport] = []
    for storage in config.thin_storages.values():
        try:
            vg = await lvm.vg_info(storage.vgname)
            rows = await lvm.list_lvs(storage.vgname)
        except lvm.LvmError as err:
            log.warning("storage '%s': %s", storage.storeid, err)
            continue
        for row in rows:
            try:
                vmid = parse_volname(row.lv)
            except VolumeError:
                continue
            reports.append(await _report(storage, vg.extent_size, row, vmid))
    return reports


async def _report(storage: ThinStorage, extent: int, row: lvm.LvRow,
                  vmid: int) -> VolumeReport:
    state = "in-use" if row.open else "active" if row.active else "inactive"
    base = VolumeReport(f"{storage.storeid}:{row.lv}", storage.storeid, vmid, row.lv,
                        row.size, state)
    if state == "inactive":
        return base
    path = f"/dev/{row.vg}/{row.lv}"
    try:
        image = await qemu_img.info(path, force_share=row.open)
        maximum = policy.maximum_size(await qemu_img.maximum_required(image), extent)
        end = reclaim = None
        if not row.open:
            checked = await qemu_img.check(path)
            end = checked.image_end_offset
            if end is not None:
                reclaim = row.size - shrink_target(row.size, end, storage.chunksize,
                                                   storage.initial_size, extent)
    except PvestordError as err:
        return VolumeReport(base.volid, base.storage, vmid, row.lv, row.size, state,
                            error=str(err))
    return VolumeReport(base.volid, base.storage, vmid, row.lv, row.size, state, end,
                        image.virtual_size, maximum, reclaim)


__all__ = [
    "CLUSTER_DIR", "ClusterReport", "ClusterView", "Created", "Membership", "ShrinkRefused",
    "Shrunk", "VolumeError", "VolumeId", "VolumeReport", "VolumeSettings",
    "check_virtual_size", "check_vmid", "cluster_report", "create", "cross_node_refusal",
    "initial_lv_size", "list_volumes", "next_disk_name", "parse_members", "parse_rrd",
    "parse_volname", "parse_volume_id", "read_cluster_view", "refuse_if_running", "shrink",
    "shrink_target", "thin_storage", "vmlist_owner",
]
