"""``pvestord volume``: names, volume ids, sizes, run checks and hostile input (no root).

The LVM and QEMU side runs in the node guest (tests/integration/node/test_volumes.py).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pvestord import policy
from pvestord.adapters.config import parse_storage_config
from pvestord.features.volumes import (
    VolumeSettings,
    cluster_report,
    refuse_if_running,
    thin_storage,
)
from pvestord.policy.cluster import (
    ClusterView,
    Membership,
    cross_node_refusal,
    owned_elsewhere,
    parse_members,
    parse_rrd,
    vmlist_owner,
)
from pvestord.policy.sizes import GiB, MiB
from pvestord.policy.volumes import (
    MAX_VOLUMES_PER_GUEST,
    ShrinkRefused,
    VolumeError,
    VolumeId,
    VolumeRole,
    check_virtual_size,
    copy_over,
    initial_lv_size,
    new_volume,
    next_disk_name,
    parse_chain_volume_id,
    parse_volname,
    parse_volume_id,
    shrink_target,
)

PVESTORD = Path(sys.executable).with_name("pvestord")
TIMEOUT = 30.0

CONFIG = """\
dir: local
\tpath /var/lib/vz
\tcontent iso

lvm: thin1
\tvgname vgthin
\tshared 1
\tpvestord-chunksize 256M
\tpvestord-initial-size 512M

lvm: thick1
\tvgname vgthick
\tshared 1

lvm: off1
\tvgname vgoff
\tpvestord-chunksize 1G
\tdisable
"""


# --- names and ids ---------------------------------------------------------------

@pytest.mark.parametrize(("volname", "vmid"), [
    ("vm-100-disk-0.qcow2", 100),
    ("vm-999999999-disk-12.qcow2", 999999999),
    ("vm-4242-cloudinit.qcow2", 4242),
    ("vm-100-my_disk.v2.qcow2", 100),
])
def test_qcow2_volume_names(volname: str, vmid: int) -> None:
    assert parse_volname(volname) == vmid


@pytest.mark.parametrize("volname", [
    "vm-100-disk-0",                   # raw volume
    "snap_vm-100-disk-0_s1.qcow2",     # a snapshot LV, not a volume
    "base-100-disk-0.qcow2",           # a template base: never shrunk
    "vm-100-disk-0.raw",
    "vm-100-disk-0.QCOW2",
    "vm-99-disk-0.qcow2",              # below Proxmox's smallest VMID
    "vm-1000000000-disk-0.qcow2",
    "vm--disk-0.qcow2",
    "vm-100-disk 0.qcow2",
    "vm-100-../../etc/passwd.qcow2",
    "vm-100-disk-0.qcow2\n",
    "-vm-100-disk-0.qcow2",
    "vm-100-" + "d" * 120 + ".qcow2",  # longer than LVM's 127
    "",
])
def test_names_that_are_not_proxmox_qcow2_volumes(volname: str) -> None:
    with pytest.raises(VolumeError):
        parse_volname(volname)


def test_volume_ids() -> None:
    assert parse_volume_id("thin1:vm-100-disk-0.qcow2") == VolumeId(
        "thin1", "vm-100-disk-0.qcow2", 100)
    assert str(parse_volume_id("thin1:vm-100-disk-0.qcow2")) == "thin1:vm-100-disk-0.qcow2"
    for bad in ("vm-100-disk-0.qcow2", "thin1:", ":vm-100-disk-0.qcow2",
                "thin/1:vm-100-disk-0.qcow2", "thin1:vm-100-disk-0", "1thin:vm-100-disk-0.qcow2",
                "thin1:vm-100-disk-0.qcow2:x"):
        with pytest.raises(VolumeError):
            parse_volume_id(bad)


def test_next_disk_name_as_proxmox() -> None:
    assert next_disk_name([], 100) == "vm-100-disk-0.qcow2"
    assert next_disk_name(["vm-100-disk-0.qcow2", "vm-100-disk-2.qcow2"], 100) == \
        "vm-100-disk-1.qcow2"
    # Other VMs' disks do not count, whatever their digits.
    assert next_disk_name(["vm-1000-disk-0.qcow2", "vm-10-disk-0.qcow2",
                           "vm-1001-disk-0"], 100) == "vm-100-disk-0.qcow2"
    # Snapshot LVs, raw volumes and template bases hold their numbers too.
    assert next_disk_name(["snap_vm-100-disk-0_before.qcow2", "vm-100-disk-1",
                           "base-100-disk-2.qcow2"], 100) == "vm-100-disk-3.qcow2"
    # disk-1 is not disk-10.
    assert next_disk_name(["vm-100-disk-10.qcow2"], 100) == "vm-100-disk-0.qcow2"


def test_no_free_disk_name() -> None:
    every = [f"vm-100-disk-{n}.qcow2" for n in range(MAX_VOLUMES_PER_GUEST)]
    with pytest.raises(VolumeError, match="1024 are taken"):
        next_disk_name(every, 100)


@given(st.sets(st.integers(0, 40)), st.integers(100, 10**9 - 1))
def test_next_disk_name_is_the_first_free(taken: set[int], vmid: int) -> None:
    names = [f"vm-{vmid}-disk-{n}.qcow2" for n in taken]
    name = next_disk_name(names, vmid)
    assert name not in names
    assert parse_volname(name) == vmid
    n = int(name.removeprefix(f"vm-{vmid}-disk-").removesuffix(".qcow2"))
    assert n == min(set(range(42)) - taken)


# Proxmox's snapshot names (pve-common $CONFIGID_RE) and a hibernation's.
snapshot_names = st.from_regex(r"[A-Za-z][A-Za-z0-9_\-]{1,40}", fullmatch=True)
#: VMIDs with a next one (another VM's name must be refused).
vmids = st.integers(100, 10**9 - 2)


@given(vmids, snapshot_names)
def test_vm_state_is_raw_under_the_name_qemu_server_gives(vmid: int, snap: str) -> None:
    name = f"vm-{vmid}-state-{snap}"
    volume = new_volume(vmid, "raw", name)
    assert (volume.name, volume.format, volume.role) == (name, "raw", VolumeRole.VMSTATE)
    # As Proxmox's LVM plugin tags a raw LV: the owner only.
    assert volume.tags == (f"pve-vm-{vmid}",)
    with pytest.raises(VolumeError, match="raw"):
        new_volume(vmid, "qcow2", name)
    with pytest.raises(VolumeError, match=f"VM {vmid}"):
        new_volume(vmid + 1, "raw", name)


@given(vmids, st.integers(0, 1000), st.booleans())
def test_fleecing_image_is_qcow2_with_its_suffix(vmid: int, n: int, suffixed: bool) -> None:
    asked = f"vm-{vmid}-fleece-{n}" + (".qcow2" if suffixed else "")
    volume = new_volume(vmid, "qcow2", asked)
    assert (volume.name, volume.format, volume.role) == (
        f"vm-{vmid}-fleece-{n}.qcow2", "qcow2", VolumeRole.FLEECE)
    # The name handed back parses as a qcow2 volume of the VM, as Proxmox reads it.
    assert parse_volname(volume.name) == vmid
    assert volume.tags == (f"pve-vm-{vmid}", f"@pve-{volume.name}")
    with pytest.raises(VolumeError):
        new_volume(vmid, "raw", asked)


@given(vmids, st.integers(0, MAX_VOLUMES_PER_GUEST - 1))
def test_disks_stay_qcow2_and_a_missing_suffix_is_named(vmid: int, n: int) -> None:
    assert new_volume(vmid, "qcow2", f"vm-{vmid}-disk-{n}.qcow2").role is VolumeRole.DISK
    for fmt in ("qcow2", "raw"):
        with pytest.raises(VolumeError, match=rf"did you mean 'vm-{vmid}-disk-{n}\.qcow2'"):
            new_volume(vmid, fmt, f"vm-{vmid}-disk-{n}")


EMPTY_NAME_ADVICE = "empty name ('') lets Proxmox choose one"


# Proxmox's own fixed names (RAM state, fleecing) have rules of their own.
disk_names = st.from_regex(r"[A-Za-z0-9_\-]{1,40}", fullmatch=True).filter(
    lambda rest: not rest.startswith(("state-", "fleece-")))


@given(vmids, disk_names, st.sampled_from(["", ".raw"]))
def test_a_refused_disk_name_says_which_name_would_do(vmid: int, rest: str,
                                                      suffix: str) -> None:
    """``pvesm alloc STORAGE VMID NAME SIZE`` without ``.qcow2`` (Proxmox then asks
    for the storage's default format, qcow2): the error names the volume to
    ask for, which is then accepted, and says an empty name lets Proxmox choose."""
    asked = f"vm-{vmid}-{rest}{suffix}"
    try:
        new_volume(vmid, "qcow2", asked)
    except VolumeError as err:
        message = str(err)
    else:
        pytest.fail(f"{asked!r} accepted as a qcow2 disk")
    assert EMPTY_NAME_ADVICE in message
    suggested = re.search(r"did you mean '([^']+)'\?", message)
    assert suggested is not None, message
    assert new_volume(vmid, "qcow2", suggested.group(1)).name == f"vm-{vmid}-{rest}.qcow2"


@pytest.mark.parametrize("name", ["mydisk", "disk-1.qcow2x", "vm-x-disk-0"])
def test_any_refused_qcow2_name_offers_the_empty_name(name: str) -> None:
    with pytest.raises(VolumeError, match=re.escape(f"(an {EMPTY_NAME_ADVICE})")):
        new_volume(100, "qcow2", name)


@pytest.mark.parametrize("name", ["vm-100-disk-1", ""])
def test_a_raw_request_is_not_told_to_give_an_empty_name(name: str) -> None:
    """An empty name with ``--format raw`` is what gave a raw disk name; the fix
    is the format (the ``.qcow2`` name), not the empty name."""
    with pytest.raises(VolumeError) as refused:
        new_volume(100, "raw", name)
    assert "empty name" not in str(refused.value)


@given(st.text(max_size=140), st.sampled_from(["raw", "qcow2", "vmdk", ""]))
def test_new_volume_names_are_always_safe_lv_names(name: str, fmt: str) -> None:
    try:
        volume = new_volume(100, fmt, name)
    except VolumeError:
        return
    # Whatever is accepted is a name LVM and Proxmox's parse_lvm_name take as is.
    assert re.fullmatch(r"vm-100-[A-Za-z0-9_.\-]+", volume.name)
    assert len(volume.name) <= 127


@pytest.mark.parametrize(("fmt", "name"), [
    ("raw", "vm-100-state-x"), ("raw", "vm-100-state-snap1.raw"), ("raw", "vm-100-state-a/b"),
    ("raw", "vm-100-state-snap1 x"), ("raw", "vm-100-fleece-0"), ("qcow2", "vm-100-fleece-"),
    ("qcow2", "vm-100-fleece-0.raw"), ("vmdk", "vm-100-disk-0.vmdk"), ("raw", ""),
    ("raw", "vm-100-state-" + "s" * 120),
])
def test_other_names_and_formats_refused(fmt: str, name: str) -> None:
    with pytest.raises(VolumeError):
        new_volume(100, fmt, name)


@pytest.mark.parametrize("size", [0, -512, 1000, 512 * 3 + 1])
def test_virtual_sizes_refused(size: int) -> None:
    with pytest.raises(VolumeError):
        check_virtual_size(size)


# --- sizes ---------------------------------------------------------------------------

extents = st.sampled_from([1 * MiB, 4 * MiB, 32 * MiB])
chunks = st.integers(1 * MiB, 4 * GiB)


@given(st.integers(1, 16 * GiB), st.integers(1, 64 * GiB), extents)
def test_initial_lv_size(initial: int, measured: int, extent: int) -> None:
    maximum = policy.maximum_size(measured, extent)
    size = initial_lv_size(initial, maximum, extent)
    assert size % extent == 0
    assert size <= maximum
    assert size == maximum or size >= initial


def test_initial_size_never_larger_than_the_image_needs() -> None:
    maximum = policy.maximum_size(1 * GiB + 300 * 1024, 4 * MiB)
    assert initial_lv_size(2 * GiB, maximum, 4 * MiB) == maximum == 1 * GiB + 4 * MiB
    assert initial_lv_size(256 * MiB, maximum, 4 * MiB) == 256 * MiB


@given(st.integers(1, 4096).flatmap(lambda n: st.tuples(st.just(n), extents)),
       st.integers(0, 80 * GiB), chunks, st.integers(0, 4 * GiB))
def test_shrink_target_properties(lv: tuple[int, int], end: int, chunk: int,
                                  initial: int) -> None:
    extents_count, extent = lv
    lv_size = extents_count * extent
    target = shrink_target(lv_size, end, chunk, initial, extent)
    assert target <= lv_size
    assert target % extent == 0  # lv_size is whole extents, and so is the wanted size
    if target < lv_size:
        # Never below the data, at least the initial size, a chunk of headroom.
        assert target >= end + chunk
        assert target >= initial
        assert target - extent < max(end + chunk, initial)  # the smallest such size


@given(st.booleans(), st.one_of(st.none(), st.integers(0, 2**40)))
def test_a_copy_is_over_at_deactivation_or_when_an_activation_finds_data(
        on_activation: bool, allocated: int | None) -> None:
    over = copy_over(on_activation, allocated)
    if not on_activation:
        assert over
    else:
        # clone_disk activates the new, empty volume right before its copy.
        assert over == (allocated is not None and allocated > 0)


def test_shrink_of_300_mib_of_data() -> None:
    # An 8 GiB thick disk (LV at its maximum) with 300 MiB of data and metadata.
    lv_size = policy.maximum_size(8 * GiB + 1310720, 4 * MiB)
    end = 300 * MiB + 917504
    target = shrink_target(lv_size, end, 256 * MiB, 256 * MiB, 4 * MiB)
    assert target == 560 * MiB  # 300.875 MiB + 256 MiB, up to whole 4 MiB extents


@given(st.integers(1, 2048).map(lambda n: n * 4 * MiB), st.integers(0, 80 * GiB), chunks,
       st.floats(0.01, 0.99), st.integers(0, 4 * GiB))
def test_a_shrunk_disk_is_armed_above_its_data(lv_size: int, end: int, chunk: int,
                                               percentage: float, initial: int) -> None:
    """The reconcile rule for shrunk disks: after a shrink the LV holds more
    headroom above the image end than the threshold wants, so reconcile arms a
    threshold above the data (not 'exceeded'), and the first writes past it
    grow the disk again."""
    target = shrink_target(lv_size, end, chunk, initial, 4 * MiB)
    if target == lv_size:
        return
    state = policy.DriveState(lv_size=target, allocation=end, threshold=0,
                              virtual_size=80 * GiB, maximum=lv_size, extent_size=4 * MiB,
                              chunksize=chunk, chunk_percentage=percentage)
    assert not policy.exceeded(state)
    assert policy.threshold(target, chunk, percentage) >= end
    assert policy.decide(state) == policy.Arm(policy.threshold(target, chunk, percentage))


def test_too_little_headroom_counts_as_exceeded() -> None:
    """The other half of the rule, as the policy has it: an LV holding less
    headroom than the threshold wants is 'exceeded' and extended at once, both
    when the LV cannot hold the headroom at all (a created volume whose
    initial-size is below chunksize * chunk-percentage: even with nothing
    written) and when the data is already past the threshold."""
    created = policy.DriveState(lv_size=64 * MiB, allocation=0, threshold=0,
                                virtual_size=8 * GiB, maximum=9 * GiB, extent_size=4 * MiB,
                                chunksize=256 * MiB, chunk_percentage=0.5)
    assert policy.exceeded(created)
    assert isinstance(policy.decide(created), policy.Extend)
    crowded = policy.DriveState(lv_size=512 * MiB, allocation=500 * MiB, threshold=0,
                                virtual_size=8 * GiB, maximum=9 * GiB, extent_size=4 * MiB,
                                chunksize=256 * MiB, chunk_percentage=0.5)
    assert policy.exceeded(crowded)


# --- storages ---------------------------------------------------------------------------

def test_thin_storage_checks() -> None:
    config = parse_storage_config(CONFIG, "storage.cfg")
    assert thin_storage(config, "thin1").chunksize == 256 * MiB
    with pytest.raises(VolumeError, match="'thick1' is not thin-enabled"):
        thin_storage(config, "thick1")
    with pytest.raises(VolumeError, match="'local' is of type 'dir', not lvm"):
        thin_storage(config, "local")
    with pytest.raises(VolumeError, match="'off1' is disabled"):
        thin_storage(config, "off1")
    with pytest.raises(VolumeError, match="no storage 'nope'"):
        thin_storage(config, "nope")


# --- is the VM running anywhere? ----------------------------------------------------------

def rrd_line(vmid: int, status: str, uptime: int, ctime: int) -> str:
    return (f"pve2.3-vm/{vmid}:{uptime}:vm{vmid}:{status}:0:{ctime}:2:0.01:2147483648:"
            "1073741824:34359738368:0:100:200:300:400\n")


def test_parse_rrd() -> None:
    text = ("pve2-node/nodea:123:0.1\n" + rrd_line(101, "running", 50, 1700000000)
            + rrd_line(102, "stopped", 0, 1700000001) + "pve2-vm/103:77:vm103:1:1\n"
            + "garbage\n\n" + "pve2.3-vm/104\n")
    assert parse_rrd(text, 101) == ("running", 50, 1700000000)
    assert parse_rrd(text, 102) == ("stopped", 0, 1700000001)
    assert parse_rrd(text, 103) == ("running", 77, None)
    assert parse_rrd(text, 104) == ("", 0, None)
    assert parse_rrd(text, 10) is None


HERE = "nodea"


def members(nodename: str = HERE, quorate: int | None = 1) -> str:
    """``.members`` as pmxcfs writes it; ``quorate=None``: a standalone node."""
    data: dict[str, object] = {"nodename": nodename, "version": 7}
    if quorate is not None:
        data["cluster"] = {"name": "clu", "version": 3, "nodes": 2, "quorate": quorate}
        data["nodelist"] = {"nodea": {"id": 1, "online": 1, "ip": "10.0.0.1"},
                            "nodeb": {"id": 2, "online": quorate, "ip": "10.0.0.2"}}
    return json.dumps(data)


def vmlist(**owners: str) -> str:
    """``.vmlist``: ``vm201="nodeb"`` -> VM 201's config is on nodeb."""
    return json.dumps({"version": 9, "ids": {
        name.removeprefix("vm"): {"node": node, "type": "qemu", "version": 1}
        for name, node in owners.items()}})


def write_cluster(folder: Path, *, members_text: str | None, vmlist_text: str,
                  rrd_text: str) -> Path:
    folder.mkdir(exist_ok=True)
    if members_text is not None:
        (folder / ".members").write_text(members_text)
    (folder / ".vmlist").write_text(vmlist_text)
    (folder / ".rrd").write_text(rrd_text)
    return folder


@pytest.fixture
def cluster(tmp_path: Path) -> Path:
    return write_cluster(
        tmp_path / "pve", members_text=members(),
        vmlist_text=vmlist(vm201="nodeb", vm202=HERE, vm203=HERE, vm205=HERE),
        rrd_text=rrd_line(201, "running", 3600, int(time.time()) - 5)
        + rrd_line(202, "stopped", 0, int(time.time())) + rrd_line(203, "paused", 10, 1))


def test_cluster_reports(cluster: Path, tmp_path: Path) -> None:
    settings = VolumeSettings(run_dir=tmp_path / "run", cluster_dir=cluster)
    report = cluster_report(cluster, 201)
    assert report is not None and report.running and report.node == "nodeb"
    with pytest.raises(ShrinkRefused, match=r"VM 201 is running on node nodeb according to "
                       r"\.rrd, reported \d+ s ago; stop it first"):
        refuse_if_running(settings, 201)
    with pytest.raises(ShrinkRefused, match="VM 203 is paused on node nodea"):
        refuse_if_running(settings, 203)
    refuse_if_running(settings, 202)  # ours, stopped: allowed
    refuse_if_running(settings, 205)  # ours, no .rrd line: allowed (ownership is the proof)
    with pytest.raises(ShrinkRefused, match=r"VM 204 is in no node's VM list \(\.vmlist\)"):
        refuse_if_running(settings, 204)


def test_no_cluster_report_means_we_cannot_tell(tmp_path: Path) -> None:
    settings = VolumeSettings(run_dir=tmp_path, cluster_dir=tmp_path / "nothing")
    with pytest.raises(ShrinkRefused, match="cannot tell whether VM 200 runs on another node"):
        refuse_if_running(settings, 200)


# A VM running elsewhere must not be shrunk: another node runs VM 102, but its .rrd line
# is missing (pmxcfs dropped it after 5 minutes without pvestatd, or pve-cluster
# just restarted here) or stale, or present and saying "stopped" while .vmlist
# names the other node. Only ownership by this node, with quorum, allows.
@pytest.mark.parametrize("rrd_text", [
    "",                                                                  # line absent
    rrd_line(101, "running", 50, 1700000000),                            # others' lines only
    rrd_line(102, "stopped", 0, 1700000000),                             # stale "stopped"
    rrd_line(102, "stopped", 0, 2_000_000_000),                          # fresh "stopped"
], ids=["absent", "other-vm-only", "stale-stopped", "present-stopped"])
def test_vm_owned_by_another_node_is_refused_whatever_rrd_says(
        tmp_path: Path, rrd_text: str) -> None:
    folder = write_cluster(tmp_path / "pve", members_text=members(),
                           vmlist_text=vmlist(vm102="nodeb"), rrd_text=rrd_text)
    settings = VolumeSettings(run_dir=tmp_path, cluster_dir=folder)
    with pytest.raises(ShrinkRefused, match=r"VM 102's configuration is on node nodeb, not "
                       r"on this node \(nodea\)"):
        refuse_if_running(settings, 102)


@pytest.mark.parametrize("rrd_text", [
    "",
    rrd_line(102, "stopped", 0, 1700000000),
    rrd_line(102, "stopped", 0, 2_000_000_000),
], ids=["absent", "stale-stopped", "present-stopped"])
def test_vm_owned_here_and_not_running_here_is_allowed(tmp_path: Path, rrd_text: str) -> None:
    folder = write_cluster(tmp_path / "pve", members_text=members(),
                           vmlist_text=vmlist(vm102=HERE), rrd_text=rrd_text)
    refuse_if_running(VolumeSettings(run_dir=tmp_path, cluster_dir=folder), 102)


@pytest.mark.parametrize("rrd_text", [
    rrd_line(102, "running", 50, 1700000000),                            # stale "running"
    rrd_line(102, "running", 50, 2_000_000_000),                         # fresh "running"
], ids=["stale-running", "present-running"])
def test_a_running_line_refuses_even_for_our_own_vm(tmp_path: Path, rrd_text: str) -> None:
    folder = write_cluster(tmp_path / "pve", members_text=members(),
                           vmlist_text=vmlist(vm102=HERE), rrd_text=rrd_text)
    with pytest.raises(ShrinkRefused, match="VM 102 is running on node nodea according to"):
        refuse_if_running(VolumeSettings(run_dir=tmp_path, cluster_dir=folder), 102)


def test_no_quorum_is_refused(tmp_path: Path) -> None:
    folder = write_cluster(tmp_path / "pve", members_text=members(quorate=0),
                           vmlist_text=vmlist(vm102=HERE), rrd_text="")
    with pytest.raises(ShrinkRefused, match="node nodea has no quorum"):
        refuse_if_running(VolumeSettings(run_dir=tmp_path, cluster_dir=folder), 102)


def test_standalone_node_is_its_own_quorum_unless_a_cluster_is_configured(
        tmp_path: Path) -> None:
    folder = write_cluster(tmp_path / "pve", members_text=members(quorate=None),
                           vmlist_text=vmlist(vm102=HERE), rrd_text="")
    settings = VolumeSettings(run_dir=tmp_path, cluster_dir=folder)
    refuse_if_running(settings, 102)
    (folder / "corosync.conf").write_text("totem {}\n")
    with pytest.raises(ShrinkRefused, match="pmxcfs knows no members yet"):
        refuse_if_running(settings, 102)


@pytest.mark.parametrize("members_text", [None, "", "{", "[]", '{"version": 1}',
                                          '{"nodename": "nodea", "cluster": 1}'])
def test_unreadable_members_is_refused(tmp_path: Path, members_text: str | None) -> None:
    folder = write_cluster(tmp_path / "pve", members_text=members_text,
                           vmlist_text=vmlist(vm102=HERE), rrd_text="")
    with pytest.raises(ShrinkRefused, match="cannot tell whether VM 102 runs on another node"):
        refuse_if_running(VolumeSettings(run_dir=tmp_path, cluster_dir=folder), 102)


@given(owner=st.sampled_from(["nodea", "nodeb", None]), quorate=st.sampled_from([0, 1, None]),
       status=st.sampled_from(["running", "stopped", "paused", "prelaunch", None]),
       corosync_conf=st.booleans(), age=st.integers(0, 10**6))
def test_cross_node_refusal_allows_only_with_ownership_and_quorum(
        owner: str | None, quorate: int | None, status: str | None, corosync_conf: bool,
        age: int) -> None:
    now = 1_800_000_000
    view = ClusterView(
        members(quorate=quorate), vmlist(vm102=owner) if owner else vmlist(),
        rrd_line(102, status, 5 if status != "stopped" else 0, now - age) if status else "",
        corosync_conf)
    allowed = cross_node_refusal(view, 102, now) is None
    assert allowed == (owner == HERE and status in (None, "stopped")
                       and (quorate == 1 or (quorate is None and not corosync_conf)))


def test_parse_members_and_vmlist() -> None:
    assert parse_members(members()) == Membership("nodea", clustered=True, quorate=True)
    assert parse_members(members(quorate=0)) == Membership("nodea", clustered=True,
                                                           quorate=False)
    assert parse_members(members(quorate=None)) == Membership("nodea", clustered=False,
                                                              quorate=True)
    assert vmlist_owner(vmlist(vm102="nodeb"), 102) == "nodeb"
    assert vmlist_owner(vmlist(vm102="nodeb"), 103) is None
    assert vmlist_owner('{"version": 1}', 102) is None
    assert vmlist_owner("garbage", 102) is None


@pytest.fixture
def local_qemu_double(tmp_path: Path) -> Iterator[Path]:
    """A process whose command line names ``-pidfile <run>/301.pid``, as qemu-server
    starts QEMU: what :func:`pvestord.adapters.vms.local_vm` recognises (a fake QEMU)."""
    run = tmp_path / "run"
    run.mkdir()
    pidfile = run / "301.pid"
    proc = subprocess.Popen(  # noqa: S603 - argument list
        [sys.executable, "-c", "import time; time.sleep(60)", "-pidfile", str(pidfile)],
        stdin=subprocess.DEVNULL)
    try:
        pidfile.write_text(f"{proc.pid}\n")
        # Popen may return before the child has exec'd (posix_spawn/vfork):
        # wait until its command line is the one a QEMU would have.
        cmdline = Path(f"/proc/{proc.pid}/cmdline")
        deadline = time.monotonic() + TIMEOUT
        while b"-pidfile" not in cmdline.read_bytes():
            assert time.monotonic() < deadline, "the stand-in process never started"
            time.sleep(0.01)
        yield run
    finally:
        proc.kill()
        proc.wait(TIMEOUT)


def test_vm_running_here_is_refused(local_qemu_double: Path, cluster: Path) -> None:
    settings = VolumeSettings(run_dir=local_qemu_double, cluster_dir=cluster)
    with pytest.raises(ShrinkRefused, match=r"VM 301 is running on this node \(pid \d+\)"):
        refuse_if_running(settings, 301)


# --- the command line: hostile input never reaches LVM --------------------------------------

def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(  # noqa: S603 - argument list, the installed entry point
        [str(PVESTORD), *args], capture_output=True, text=True, timeout=TIMEOUT,
        stdin=subprocess.DEVNULL, check=False)


@pytest.fixture
def storage_cfg(tmp_path: Path) -> Path:
    path = tmp_path / "storage.cfg"
    path.write_text(CONFIG)
    return path


@pytest.mark.parametrize("size", ["1g", "1GB", "10X", "1 G", "", "0x10", "1.G"])
def test_create_size_with_a_bad_suffix(storage_cfg: Path, size: str) -> None:
    done = run("volume", "create", "--storage-config", str(storage_cfg), "thin1", "100", size)
    assert done.returncode == 2
    assert "not a size" in done.stderr


@pytest.mark.parametrize(("args", "message"), [
    (["thick1", "100", "1G"], "storage 'thick1' is not thin-enabled"),
    (["local", "100", "1G"], "storage 'local' is of type 'dir', not lvm"),
    (["nope", "100", "1G"], "no storage 'nope'"),
    (["thin1", "100", "1000"], "whole 512-byte sectors"),
    (["thin1", "100", "1G", "--name", "vm-100-disk-0"], "not a Proxmox qcow2 volume name"),
    (["thin1", "100", "1G", "--name", "vm-101-disk-0.qcow2"], "does not belong to VM 100"),
])
def test_create_refuses_hostile_input(storage_cfg: Path, args: list[str],
                                      message: str) -> None:
    done = run("volume", "create", "--storage-config", str(storage_cfg), *args)
    assert done.returncode == 1, done
    assert done.stderr.startswith("pvestord: ")
    assert message in done.stderr


@pytest.mark.parametrize("vmid", ["99", "abc", "1e3", "1000000000"])
def test_create_refuses_bad_vmids(storage_cfg: Path, vmid: str) -> None:
    done = run("volume", "create", "--storage-config", str(storage_cfg), "thin1", vmid, "1G")
    assert done.returncode == 2


@pytest.mark.parametrize(("volid", "message"), [
    ("thin1:vm-100-disk-0", "not a Proxmox qcow2 volume name"),
    ("thin1:snap_vm-100-disk-0_s.qcow2", "not a Proxmox qcow2 volume name"),
    ("thin1:../vm-100-disk-0.qcow2", "not a Proxmox qcow2 volume name"),
    ("vm-100-disk-0.qcow2", "not a volume id"),
    ("thick1:vm-100-disk-0.qcow2", "storage 'thick1' is not thin-enabled"),
])
def test_shrink_refuses_hostile_input(storage_cfg: Path, tmp_path: Path, volid: str,
                                      message: str) -> None:
    done = run("volume", "shrink", "--storage-config", str(storage_cfg),
               "--cluster-dir", str(tmp_path), volid)
    assert done.returncode == 1, done
    assert message in done.stderr


def test_unreadable_storage_config(tmp_path: Path) -> None:
    done = run("volume", "list", "--storage-config", str(tmp_path / "missing.cfg"))
    assert done.returncode == 1
    assert "cannot read storage configuration" in done.stderr


@given(st.integers(100, 999_999_999), st.from_regex(r"disk-[0-9]{1,3}", fullmatch=True),
       st.from_regex(r"[A-Za-z][A-Za-z0-9_\-]{0,39}", fullmatch=True))
def test_reduce_copy_takes_a_disk_or_one_of_its_snapshot_lvs(vmid: int, disk: str,
                                                             snap: str) -> None:
    """A snapshot delete merges into the top or into a snapshot LV: both are
    copy targets then, named by LVMPlugin's volume ids."""
    for volname in (f"vm-{vmid}-{disk}.qcow2", f"snap_vm-{vmid}-{disk}_{snap}.qcow2"):
        vol = parse_chain_volume_id(f"thin1:{volname}")
        assert (vol.storeid, vol.volname, vol.vmid) == ("thin1", volname, vmid)


@pytest.mark.parametrize("text", ["thin1:snap_vm-100-disk-0.qcow2", "thin1:../x.qcow2",
                                  "snap_vm-100-disk-0_s.qcow2", "thin1:snap_vm-99-d_s.qcow2",
                                  "thin1:base-100-disk-0.qcow2"])
def test_reduce_copy_refuses_other_names(text: str) -> None:
    with pytest.raises(VolumeError):
        parse_chain_volume_id(text)


@given(st.sampled_from(["nodea", "nodeb", "node-c"]), st.sampled_from([None, 0, 1]),
       st.integers(100, 999))
def test_a_copy_target_is_left_alone_only_where_vmlist_names_another_node(
        owner: str, quorate: int | None, vmid: int) -> None:
    """The reduction at deactivation needs no proof of ownership (a clone's new
    VM is in no list yet); only a config known to be elsewhere, a migration's
    source cleaning up, refuses, quorum or not."""
    owners = {f"vm{vmid}": owner}
    why = owned_elsewhere(members(HERE, quorate), vmlist(**owners), vmid)
    assert (why is None) == (owner == HERE)
    if why is not None:
        assert f"on node {owner}" in why
    # Nothing known, nothing refused.
    assert owned_elsewhere(members(HERE, quorate), vmlist(), vmid) is None
    assert owned_elsewhere(None, vmlist(**owners), vmid) is None
    assert owned_elsewhere(members(HERE, quorate), None, vmid) is None
    assert owned_elsewhere("garbage", vmlist(**owners), vmid) is None
