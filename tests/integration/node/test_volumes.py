"""``pvestord volume create|shrink|list`` against real LVM, qemu-img and QEMU (node guest).

Data is written and read back with the ``qemu-io`` tool (QEMU's block layer, no
guest) while no VM runs, and through the VM's own block layer (an NBD export
of its node) while one does.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness.daemons import VENV_BIN, NodeBed, ThinStorageSpec, daemons
from tests.harness.lvmbed import (
    VG,
    GiB,
    MiB,
    image_end_offset,
    loop_vg,
    measured_maximum,
    qcow2_check,
    qcow2_create,
    sh,
)
from tests.harness.polling import wait_until
from tests.harness.qemu import Pve9Disk, QemuVM, image_io, pve9_disk

CLI_TIMEOUT = 300.0
EXTEND_TIMEOUT = 180.0
#: Daemon and QEMU start-up budget: the node guest shares two cores with other
#: guests, and a Python start-up alone has taken over 30 s there.
START_TIMEOUT = 180.0
CHUNK = 256 * MiB
#: Three regions of the 8 GiB disk, each with its own pattern (small: every
#: MiB written and read back costs about a second of the node guest's TCG).
REGION = 32 * MiB
REGIONS = ((0, 0x11), (4 * GiB, 0x22), (8 * GiB - REGION, 0x33))


def pvestord(bed: NodeBed, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    argv = [str(VENV_BIN / "pvestord"), "volume", args[0], "--storage-config",
            str(bed.storage_cfg), *args[1:]]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=CLI_TIMEOUT,  # noqa: S603
                          stdin=subprocess.DEVNULL, check=False)
    if check and done.returncode != 0:
        raise AssertionError(f"{argv} exited {done.returncode}:\n{done.stdout}{done.stderr}")
    return done


def shrink(bed: NodeBed, volid: str, *extra: str, check: bool = True
           ) -> subprocess.CompletedProcess[str]:
    return pvestord(bed, "shrink", "--run-dir", str(bed.run_dir), "--cluster-dir",
                    str(bed.root / "pve"), volid, *extra, check=check)


def qemu_io(path: str, command: str) -> None:
    image_io(path, command, timeout=CLI_TIMEOUT)


def lvs(vg: VG, lv: str) -> dict[str, str]:
    out = sh("lvs", "--reportformat", "json", "--units", "b", "--nosuffix", "-o",
             "lv_name,lv_size,lv_tags,lv_active,lv_device_open,lv_autoactivation,lv_attr",
             f"{vg.name}/{lv}")
    row: dict[str, str] = json.loads(out)["report"][0]["lv"][0]
    return row


def vg_seqno(vg: VG) -> int:
    out = sh("vgs", "--reportformat", "json", "-o", "vg_seqno", vg.name)
    return int(json.loads(out)["report"][0]["vg"][0]["vg_seqno"])


@pytest.fixture
def big_vg() -> Iterator[VG]:
    """Room for a thick 8 GiB-virtual disk (the backing file is sparse)."""
    with loop_vg(12 * GiB) as vg:
        yield vg


def make_bed(root: Path, vg: VG, out_dir: Path) -> NodeBed:
    bed = NodeBed(root, [ThinStorageSpec("thin1", vg.name, chunksize="256M",
                                         initial_size="256M")], logs_dir=out_dir)
    (root / "pve").mkdir()
    (root / "pve" / ".rrd").write_text("")  # pmxcfs's status dump: nothing runs anywhere
    # pmxcfs's membership (this node, quorate) and VM list: the test VMs are ours.
    (root / "pve" / ".members").write_text(members_json(quorate=1))
    (root / "pve" / ".vmlist").write_text(vmlist_json(HERE))
    return bed


HERE = "nodea"
VMIDS = (120, 130)


def members_json(*, quorate: int) -> str:
    return json.dumps({"nodename": HERE, "version": 2,
                       "cluster": {"name": "clu", "version": 2, "nodes": 2, "quorate": quorate},
                       "nodelist": {HERE: {"id": 1, "online": 1}, "nodeb": {"id": 2,
                                                                            "online": 1}}})


def vmlist_json(node: str) -> str:
    return json.dumps({"version": 1, "ids": {str(vmid): {"node": node, "type": "qemu",
                                                         "version": 1} for vmid in VMIDS}})


@pytest.fixture
def bed(vg: VG, tmp_path: Path, out_dir: Path) -> NodeBed:
    return make_bed(tmp_path, vg, out_dir)


def threshold_of(vm: QemuVM) -> int:
    return int(vm.named_node(pve9_disk(vm).file_block_node)["write_threshold"])


def vm_on(bed: NodeBed, vmid: int, path: str) -> QemuVM:
    """A VM with the volume at ``path`` attached as Proxmox VE 9 does."""
    disk = Pve9Disk.for_volume(path, f"thin1:{Path(path).name}")
    return QemuVM(vmid, bed.run_dir, disks=[disk],
                  event_socket=bed.event_socket, log_path=bed.logs / f"qemu-{vmid}.log",
                  launch_timeout=START_TIMEOUT)


# --- create -------------------------------------------------------------------------------

# In the full node set: the quick set creates a volume with the same command
# in the test below, and through Proxmox in test_proxmox_plugin.py, whose LVs'
# tags and sizes it checks.
@pytest.mark.node_full
def test_create_names_flags_tags_and_sizes(bed: NodeBed, vg: VG) -> None:
    out = pvestord(bed, "create", "thin1", "100", "8G").stdout.strip()
    assert out == "thin1:vm-100-disk-0.qcow2"
    row = lvs(vg, "vm-100-disk-0.qcow2")
    assert int(row["lv_size"]) == 256 * MiB                 # initial-size
    assert set(row["lv_tags"].split(",")) == {"pve-vm-100", "pve-vm-100-disk-0.qcow2"}
    assert row["lv_autoactivation"] == ""                       # --setautoactivation n
    assert row["lv_active"] == "active"                      # -aly, as Proxmox leaves it
    assert row["lv_attr"].startswith("-wi-a")                # linear, writable
    path = vg.lv_path("vm-100-disk-0.qcow2")
    info = json.loads(sh("qemu-img", "info", "--output=json", path))
    assert (info["format"], info["virtual-size"]) == ("qcow2", 8 * GiB)
    check = qcow2_check(path)
    assert check["exit"] == 0
    assert int(str(check["image-end-offset"])) < 1 * MiB   # preallocation off

    # The next free number; a chosen name; a taken name; a tiny disk's LV is
    # its maximum, not the initial size.
    assert pvestord(bed, "create", "thin1", "100", "1G").stdout.strip() == \
        "thin1:vm-100-disk-1.qcow2"
    assert pvestord(bed, "create", "thin1", "100", "64M", "--name",
                    "vm-100-tiny.qcow2").stdout.strip() == "thin1:vm-100-tiny.qcow2"
    assert int(lvs(vg, "vm-100-tiny.qcow2")["lv_size"]) == measured_maximum(
        64 * MiB, vg.extent_size()) < 256 * MiB
    taken = pvestord(bed, "create", "thin1", "100", "1G", "--name", "vm-100-tiny.qcow2",
                     check=False)
    assert taken.returncode == 1
    assert "volume thin1:vm-100-tiny.qcow2 already exists" in taken.stderr

    listed = {r["volid"]: r for r in json.loads(pvestord(bed, "list", "--json").stdout)}
    assert set(listed) == {"thin1:vm-100-disk-0.qcow2", "thin1:vm-100-disk-1.qcow2",
                           "thin1:vm-100-tiny.qcow2"}
    disk0 = listed["thin1:vm-100-disk-0.qcow2"]
    assert (disk0["state"], disk0["lv_size"], disk0["virtual_size"], disk0["maximum"]) == (
        "active", 256 * MiB, 8 * GiB, measured_maximum(8 * GiB, vg.extent_size()))
    assert disk0["reclaimable"] == 0  # already initial-size
    assert not any(r["snapshot"] for r in listed.values())

    # A snapshot LV, as Proxmox renames a disk's LV when it takes a snapshot:
    # listed with its VM, as a snapshot.
    sh("lvrename", "-q", vg.name, "vm-100-disk-1.qcow2", "snap_vm-100-disk-0_before.qcow2")
    listed = {r["volid"]: r for r in json.loads(pvestord(bed, "list", "--json").stdout)}
    snap = listed["thin1:snap_vm-100-disk-0_before.qcow2"]
    assert (snap["vmid"], snap["snapshot"], snap["virtual_size"]) == (100, True, 1 * GiB)


def test_created_volume_grows_through_the_daemon(bed: NodeBed, vg: VG) -> None:
    volid = pvestord(bed, "create", "thin1", "110", "8G").stdout.strip()
    lv = volid.split(":")[1]
    with daemons(bed), vm_on(bed, 110, vg.lv_path(lv)) as vm:
        wait_until(lambda: threshold_of(vm) == 128 * MiB, START_TIMEOUT,
                   "threshold armed by reconcile")
        vm.write_pattern(pve9_disk(vm).block_node, 0, 160 * MiB, 0x44, timeout=120)
        wait_until(lambda: vg.lv_size(lv) >= 512 * MiB, EXTEND_TIMEOUT, "LV grown by a chunk")
        assert vm.read_verify(pve9_disk(vm).block_node, 0, 160 * MiB, 0x44, timeout=120)
    # No lvchange --refresh: the daemon's lvextend must leave /dev/VG/LV in place.
    assert qcow2_check(vg.lv_path(lv))["exit"] == 0


# --- shrink -------------------------------------------------------------------------------

def test_shrink_a_thick_disk_then_grow_it_again(big_vg: VG, tmp_path: Path,
                                                out_dir: Path) -> None:
    vg = big_vg
    bed = make_bed(tmp_path, vg, out_dir)
    lv = "vm-120-disk-0.qcow2"
    volid = f"thin1:{lv}"
    thick = measured_maximum(8 * GiB, vg.extent_size())
    path = vg.create_lv(lv, thick)                          # as Proxmox allocates today
    qcow2_create(path, 8 * GiB)
    for offset, pattern in REGIONS:
        qemu_io(path, f"write -P {pattern:#x} {offset} {REGION}")
    sh("lvchange", "-an", f"{vg.name}/{lv}")               # the VM is stopped

    seqno = vg_seqno(vg)
    dry = json.loads(shrink(bed, volid, "--dry-run", "--json").stdout)
    assert dry["dry_run"] and dry["lv_size_after"] == thick
    assert (vg_seqno(vg), vg.lv_size(lv), lvs(vg, lv)["lv_active"]) == (seqno, thick, "")

    began = time.monotonic()
    result = json.loads(shrink(bed, volid, "--json").stdout)
    took = time.monotonic() - began
    end = result["image_end"]
    assert 3 * REGION < end < 3 * REGION + 10 * MiB         # data plus a little metadata
    expected = -(-(end + CHUNK) // vg.extent_size()) * vg.extent_size()
    assert result["lv_size_after"] == vg.lv_size(lv) == expected
    assert lvs(vg, lv)["lv_active"] == ""                   # left as it was found
    (out_dir / "shrink.json").write_text(json.dumps(
        {**result, "cli_seconds": took, "thick_lv": thick}, indent=2))

    sh("lvchange", "-aey", f"{vg.name}/{lv}")               # as Proxmox starts a VM
    assert qcow2_check(path)["exit"] == 0
    for offset, pattern in REGIONS:
        qemu_io(path, f"read -P {pattern:#x} {offset} {REGION}")
    qemu_io(path, f"read -P 0 {REGION} {REGION}")          # never written: zeros

    with daemons(bed), vm_on(bed, 120, path) as vm:
        wait_until(lambda: threshold_of(vm) == expected - 128 * MiB,
                   START_TIMEOUT, "threshold armed above the data")
        vm.write_pattern(pve9_disk(vm).block_node, 2 * GiB, 200 * MiB, 0x55, timeout=120)
        wait_until(lambda: vg.lv_size(lv) > expected, EXTEND_TIMEOUT, "grown again")
        assert vm.read_verify(pve9_disk(vm).block_node, 2 * GiB, 200 * MiB, 0x55, timeout=120)
        for offset, pattern in REGIONS:
            assert vm.read_verify(pve9_disk(vm).block_node, offset, REGION, pattern, timeout=120)
    # No lvchange --refresh: the daemon's lvextend must leave /dev/VG/LV in place.
    assert qcow2_check(path)["exit"] == 0


def _set_refcount(path: str, cluster: int, value: int) -> None:
    """Write one 16-bit refcount entry in the first refcount block (a damaged image)."""
    fd = os.open(path, os.O_RDWR)
    try:
        header = os.pread(fd, 104, 0)
        cluster_bits = struct.unpack(">I", header[20:24])[0]
        table = struct.unpack(">Q", header[48:56])[0]
        block = struct.unpack(">Q", os.pread(fd, 8, table))[0]
        assert block and cluster < (1 << cluster_bits) // 2
        os.pwrite(fd, struct.pack(">H", value), block + 2 * cluster)
        os.fsync(fd)
    finally:
        os.close(fd)


# Four minutes under TCG, in `make node NODE=full`: the quick set keeps the
# shrink itself, and tests/unit/test_volumes.py each refusal's rule.
@pytest.mark.node_full
def test_shrink_refusals_each_with_its_reason(bed: NodeBed, vg: VG) -> None:
    volid = pvestord(bed, "create", "thin1", "130", "8G").stdout.strip()
    lv = volid.split(":")[1]
    path = vg.lv_path(lv)
    sh("lvextend", "-q", "-L", "1G", f"{vg.name}/{lv}")    # room to give back
    qemu_io(path, f"write -P 0x66 0 {50 * MiB}")

    def refused(message: str, *extra: str) -> None:
        seqno = vg_seqno(vg)
        done = shrink(bed, volid, *extra, check=False)
        assert done.returncode == 1, done
        assert message in done.stderr, done.stderr
        assert (vg.lv_size(lv), vg_seqno(vg)) == (1 * GiB, seqno)

    # Active after create (and after a use): someone may be using it.
    refused(f"the LV {vg.name}/{lv} is active on this node")
    # Open: a reader holds it.
    fd = os.open(path, os.O_RDONLY)
    try:
        refused(f"the LV {vg.name}/{lv} is open on this node (in use)")
    finally:
        os.close(fd)
    # Running here.
    with vm_on(bed, 130, path):
        refused("VM 130 is running on this node")
    sh("lvchange", "-an", f"{vg.name}/{lv}")
    # Reported running by another node (pmxcfs's status dump and VM list).
    rrd = bed.root / "pve" / ".rrd"
    rrd.write_text(f"pve2.3-vm/130:3600:vm130:running:0:{int(time.time())}:1:0:1:1:1:1:0:0:0:0\n")
    (bed.root / "pve" / ".vmlist").write_text(vmlist_json("nodeb"))
    refused("VM 130 is running on node nodeb according to")
    # Owned by another node: refused whether its .rrd line is stopped, or gone
    # (pmxcfs drops lines 5 minutes old).
    rrd.write_text(f"pve2.3-vm/130:0:vm130:stopped:0:{int(time.time())}:1:0:1:1:1:1:0:0:0:0\n")
    refused("VM 130's configuration is on node nodeb, not on this node (nodea)")
    rrd.write_text("")
    refused("VM 130's configuration is on node nodeb, not on this node (nodea)")
    (bed.root / "pve" / ".vmlist").write_text(vmlist_json(HERE))
    # Ours, but without quorum our VM list may be stale.
    (bed.root / "pve" / ".members").write_text(members_json(quorate=0))
    refused("node nodea has no quorum")
    (bed.root / "pve" / ".members").write_text(members_json(quorate=1))

    # Not clean: a leaked cluster, then a corrupted refcount.
    sh("lvchange", "-aey", f"{vg.name}/{lv}")
    end = image_end_offset(path)
    _set_refcount(path, end // 65536 + 16, 1)
    sh("lvchange", "-an", f"{vg.name}/{lv}")
    refused("leaked clusters; repair them first with 'qemu-img check -r leaks")
    assert lvs(vg, lv)["lv_active"] == ""                  # deactivated again
    sh("lvchange", "-aey", f"{vg.name}/{lv}")
    sh("qemu-img", "check", "-q", "-r", "leaks", path)
    _set_refcount(path, 0, 0)
    sh("lvchange", "-an", f"{vg.name}/{lv}")
    refused("the image is corrupt")

    # Repaired, it shrinks; a dry run first changes nothing.
    sh("lvchange", "-aey", f"{vg.name}/{lv}")
    sh("qemu-img", "check", "-q", "-r", "all", path)
    sh("lvchange", "-an", f"{vg.name}/{lv}")
    seqno = vg_seqno(vg)
    dry = shrink(bed, volid, "--dry-run")
    assert "would shrink LV 1 GiB -> 308 MiB" in dry.stdout, dry.stdout
    assert "dry run, nothing changed" in dry.stdout
    assert (vg.lv_size(lv), vg_seqno(vg), lvs(vg, lv)["lv_active"]) == (1 * GiB, seqno, "")
    done = shrink(bed, volid)
    assert "shrank LV 1 GiB -> 308 MiB" in done.stdout, done.stdout
    assert vg.lv_size(lv) == 308 * MiB                     # 50 MiB of data + a chunk
    again = shrink(bed, volid)
    assert "nothing to shrink" in again.stdout
    sh("lvchange", "-aey", f"{vg.name}/{lv}")
    qemu_io(path, f"read -P 0x66 0 {50 * MiB}")
