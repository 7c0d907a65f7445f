"""pvestord's storage plugin driven through Proxmox's real PVE::Storage (node guest).

Real LVM on a loop device, real ``qemu-img``/``qemu-io``, Proxmox's own
``vdisk_alloc``, ``volume_snapshot``, ``volume_resize``,
``volume_snapshot_rollback``, ``volume_snapshot_delete`` (offline),
``rename_volume``, ``vdisk_list`` and ``vdisk_free`` (plain and
``saferemove``) from ``../shared/upstream`` with the test
stand-ins of ``tests/proxmox``; the plugin asks the venv's ``pvestord plugin``.
Every step asserts the LV sizes LVM reports and the image qemu-img reads.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pvestord.features import plugin
from tests.harness.daemons import VENV_BIN
from tests.harness.lvmbed import VG, GiB, MiB, loop_vg, measured_maximum, qcow2_check, sh
from tests.harness.qemu import Pve9Disk, QemuVM
from tests.proxmox import upstream

CHUNK = 256 * MiB
INITIAL = 512 * MiB
EXTENT = 4 * MiB
DISK = 4 * GiB
STORE = "thin1"
VMID = 100
VOLNAME = "vm-100-disk-0.qcow2"
VOLID = f"{STORE}:{VOLNAME}"
SNAP1 = "snap_vm-100-disk-0_snap1.qcow2"
SNAP2 = "snap_vm-100-disk-0_snap2.qcow2"
WRITE = 8 * MiB
QEMU_IO_TIMEOUT = 300.0
#: The online delete's storage: small, so that a job outgrows its target quickly.
SMALL_CHUNK = 16 * MiB
SMALL_INITIAL = 32 * MiB
#: What the guest wrote into the top after the snapshot: more than the snapshot's LV holds.
COMMITTED = 48 * MiB
JOB_TIMEOUT = 600.0


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> upstream.Upstream:
    reason = upstream.skip_reason()
    if reason is not None:
        pytest.skip(reason)
    return upstream.unpack(tmp_path_factory.mktemp("upstream"))


@contextlib.contextmanager
def thin_storage(sources: upstream.Upstream, out_dir: Path, *, chunksize: int,
                 initial_size: int) -> Iterator[tuple[upstream.PerlSession, VG]]:
    """A fresh VG, a pvestord: storage on it, and Proxmox's PVE::Storage to drive.

    The session's Perl code sees ``$cfg``, Proxmox's parse of that storage.cfg.
    """
    with loop_vg(6 * GiB) as vg:
        sources.write_storage_cfg(
            f"pvestord: {STORE}\n\tvgname {vg.name}\n\tcontent images\n\tshared 1\n"
            f"\tsnapshot-as-volume-chain 1\n\tchunksize {chunksize // MiB}M\n"
            f"\tchunk-percentage 0.5\n\tinitial-size {initial_size // MiB}M\n")
        session = sources.session(out_dir / "perl.log",
                                  PVESTORD_COMMAND=str(VENV_BIN / "pvestord"))
        try:
            yield session, vg
        finally:
            session.close()


@pytest.fixture
def proxmox(sources: upstream.Upstream, out_dir: Path
            ) -> Iterator[tuple[upstream.PerlSession, VG]]:
    with thin_storage(sources, out_dir, chunksize=CHUNK, initial_size=INITIAL) as storage:
        yield storage


def lv_sizes(vg: VG) -> dict[str, int]:
    out = sh("lvs", "--reportformat", "json", "--units", "b", "--nosuffix", "-o",
             "lv_name,lv_size", vg.name)
    return {row["lv_name"]: int(row["lv_size"]) for row in json.loads(out)["report"][0]["lv"]}


def image(vg: VG, lv: str) -> dict[str, Any]:
    info: dict[str, Any] = json.loads(sh("qemu-img", "info", "--output=json", "-f", "qcow2",
                                         vg.lv_path(lv)))
    return info


def image_end(vg: VG, lv: str) -> int:
    return int(str(qcow2_check(vg.lv_path(lv))["image-end-offset"]))


def qemu_io(vg: VG, lv: str, command: str) -> None:
    out = sh("qemu-io", "-f", "qcow2", "-c", command, vg.lv_path(lv), timeout=QEMU_IO_TIMEOUT)
    assert "failed" not in out and "mismatch" not in out, out


def test_disk_life_through_proxmox_stays_thin(proxmox: tuple[upstream.PerlSession, VG]) -> None:
    pve, vg = proxmox
    # A new disk: an LV of initial-size, a qcow2 without preallocation.
    volid = pve.call(f'return [PVE::Storage::vdisk_alloc($cfg, "{STORE}", {VMID}, "qcow2",'
                     f' undef, {DISK // 1024})];')[0]
    assert volid == VOLID
    assert lv_sizes(vg) == {VOLNAME: INITIAL}
    assert image(vg, VOLNAME)["virtual-size"] == DISK
    assert image_end(vg, VOLNAME) < 2 * MiB  # metadata preallocation would be ~DISK
    qemu_io(vg, VOLNAME, f"write -P 0x11 0 {WRITE}")

    # Snapshot: the renamed LV stays as it is, the new overlay is small.
    pve.call(f'PVE::Storage::volume_snapshot($cfg, "{VOLID}", "snap1");')
    assert lv_sizes(vg) == {SNAP1: INITIAL, VOLNAME: INITIAL}
    top = image(vg, VOLNAME)
    assert (top["backing-filename"], top["virtual-size"]) == (SNAP1, DISK)
    assert top["cluster-size"] == plugin.OVERLAY_CLUSTER_SIZE
    qemu_io(vg, VOLNAME, f"write -P 0x22 {GiB} {WRITE}")

    # Resize: the qcow2 grows, the LV does not become thick.
    pve.call(f'PVE::Storage::volume_resize($cfg, "{VOLID}", {6 * GiB}, 0);')
    assert image(vg, VOLNAME)["virtual-size"] == 6 * GiB
    assert lv_sizes(vg)[VOLNAME] == INITIAL
    # The daemon grew the LV meanwhile: a later Proxmox resize neither fails nor shrinks it.
    sh("lvextend", "-q", "--size", f"{GiB}b", vg.lv_path(VOLNAME))
    pve.call(f'PVE::Storage::volume_resize($cfg, "{VOLID}", {8 * GiB}, 0);')
    assert image(vg, VOLNAME)["virtual-size"] == 8 * GiB
    assert lv_sizes(vg) == {SNAP1: INITIAL, VOLNAME: GiB}

    # Rollback: a new small overlay on the snapshot, at the snapshot's size.
    pve.call(f'PVE::Storage::volume_snapshot_rollback($cfg, "{VOLID}", "snap1");')
    assert lv_sizes(vg) == {SNAP1: INITIAL, VOLNAME: INITIAL}
    top = image(vg, VOLNAME)
    assert (top["backing-filename"], top["virtual-size"]) == (SNAP1, DISK)
    qemu_io(vg, VOLNAME, f"write -P 0x33 {2 * GiB} {WRITE}")

    # Offline delete of the first snapshot: qemu-img commit writes the overlay
    # into the snapshot's LV, which gets the room for it first.
    child_end = image_end(vg, VOLNAME)
    expected = plugin.commit_lv_size(INITIAL, child_end, measured_maximum(DISK, EXTENT), CHUNK,
                                     EXTENT)
    assert INITIAL < expected < measured_maximum(DISK, EXTENT)
    pve.call(f'PVE::Storage::volume_snapshot_delete($cfg, "{VOLID}", "snap1", 0);')
    assert lv_sizes(vg) == {VOLNAME: expected}
    assert qcow2_check(vg.lv_path(VOLNAME))["exit"] == 0
    assert "backing-filename" not in image(vg, VOLNAME)
    qemu_io(vg, VOLNAME, f"read -P 0x11 0 {WRITE}")
    qemu_io(vg, VOLNAME, f"read -P 0x33 {2 * GiB} {WRITE}")
    qemu_io(vg, VOLNAME, f"read -P 0 {GiB} {WRITE}")  # rolled back

    # Listing: the virtual size while active, the (small) LV size when not.
    listed = pve.call(f'return PVE::Storage::vdisk_list($cfg, "{STORE}", {VMID});')[STORE]
    assert [(v["volid"], v["size"]) for v in listed] == [(VOLID, DISK)]
    sh("lvchange", "-aln", vg.lv_path(VOLNAME))
    listed = pve.call(f'return PVE::Storage::vdisk_list($cfg, "{STORE}", {VMID});')[STORE]
    assert [(v["volid"], v["approximate-size"]) for v in listed] == [(VOLID, expected)]

    pve.call(f'PVE::Storage::vdisk_free($cfg, "{VOLID}");')
    assert lv_sizes(vg) == {}


def overlay_maximum() -> int:
    """The maximum LV of a snapshot overlay of the test disk (Proxmox's layout)."""
    out = sh("qemu-img", "measure", "--output=json", "-O", "qcow2", "-o",
             "cluster_size=128k,extended_l2=on", "--size", str(DISK))
    return -(-int(json.loads(out)["fully-allocated"]) // EXTENT) * EXTENT


def test_intermediate_snapshot_delete_grows_the_child_first(
        proxmox: tuple[upstream.PerlSession, VG]) -> None:
    pve, vg = proxmox
    pve.call(f'return [PVE::Storage::vdisk_alloc($cfg, "{STORE}", {VMID}, "qcow2", undef,'
             f' {DISK // 1024})];')
    pve.call(f'PVE::Storage::volume_snapshot($cfg, "{VOLID}", "snap1");')
    qemu_io(vg, VOLNAME, f"write -P 0x44 0 {WRITE}")
    pve.call(f'PVE::Storage::volume_snapshot($cfg, "{VOLID}", "snap2");')
    assert lv_sizes(vg) == {SNAP1: INITIAL, SNAP2: INITIAL, VOLNAME: INITIAL}
    # snap2 sits between snap1 and the top: qemu-img rebase copies its data into the top.
    source_end = image_end(vg, SNAP2)
    expected = plugin.commit_lv_size(INITIAL, source_end, overlay_maximum(), CHUNK, EXTENT)
    pve.call(f'PVE::Storage::volume_snapshot_delete($cfg, "{VOLID}", "snap2", 0);')
    assert lv_sizes(vg) == {SNAP1: INITIAL, VOLNAME: expected}
    assert image(vg, VOLNAME)["backing-filename"] == SNAP1
    qemu_io(vg, VOLNAME, f"read -P 0x44 0 {WRITE}")


def test_copy_flows_get_a_thick_volume(proxmox: tuple[upstream.PerlSession, VG]) -> None:
    """A volume qemu-server allocates to copy a disk into (here: clone_disk) holds
    the whole image at once; nobody would grow it while the copy runs."""
    pve, vg = proxmox
    pve.call('sub PVE::QemuServer::clone_disk { return PVE::Storage::vdisk_alloc(@_) }'
             f' return [PVE::QemuServer::clone_disk($cfg, "{STORE}", {VMID},'
             f' "qcow2", undef, {DISK // 1024})];')
    assert lv_sizes(vg) == {VOLNAME: measured_maximum(DISK, EXTENT)}
    assert image(vg, VOLNAME)["virtual-size"] == DISK


def lv_tags(vg: VG) -> dict[str, set[str]]:
    out = sh("lvs", "--reportformat", "json", "-o", "lv_name,lv_tags", vg.name)
    return {row["lv_name"]: {t for t in row["lv_tags"].split(",") if t}
            for row in json.loads(out)["report"][0]["lv"]}


def test_rename_and_saferemove_of_small_lvs(proxmox: tuple[upstream.PerlSession, VG]) -> None:
    """Proxmox's own rename (reassign a disk to another VM) and ``saferemove``
    free, through the real ``PVE::Storage``, on thin volumes: a rename keeps
    the LV as small as it was and moves its tags, and is refused while
    snapshots exist; a safe removal renames every LV of the chain to
    ``del-...``, zeroes each (small, so quick) and removes it."""
    pve, vg = proxmox
    pve.call(f'return [PVE::Storage::vdisk_alloc($cfg, "{STORE}", {VMID}, "qcow2", undef,'
             f' {DISK // 1024})];')
    qemu_io(vg, VOLNAME, f"write -P 0x55 0 {WRITE}")
    renamed = pve.call(f'return PVE::Storage::rename_volume($cfg, "{VOLID}", 101);')
    assert renamed == f"{STORE}:vm-101-disk-0.qcow2"
    assert lv_sizes(vg) == {"vm-101-disk-0.qcow2": INITIAL}
    assert {"pve-vm-101", "pve-vm-101-disk-0.qcow2"} <= lv_tags(vg)["vm-101-disk-0.qcow2"]
    assert not {"pve-vm-100", f"pve-{VOLNAME}"} & lv_tags(vg)["vm-101-disk-0.qcow2"]
    qemu_io(vg, "vm-101-disk-0.qcow2", f"read -P 0x55 0 {WRITE}")

    pve.call(f'PVE::Storage::volume_snapshot($cfg, "{renamed}", "snap1");')
    with pytest.raises(AssertionError, match="external snapshot exists"):
        pve.call(f'return PVE::Storage::rename_volume($cfg, "{renamed}", 102);')
    assert set(lv_sizes(vg)) == {"snap_vm-101-disk-0_snap1.qcow2", "vm-101-disk-0.qcow2"}

    # saferemove: Proxmox renames under the storage lock, then zeroes and
    # removes in a worker; the worker runs inline here, after a look at the
    # LVs it is handed.
    handed = pve.call(
        f'my $scfg = PVE::Storage::storage_config($cfg, "{STORE}");'
        ' $scfg->{saferemove} = 1; my $seen;'
        ' PVE::RPCEnvironment::get()->set_user(q{root@pam});'
        ' no warnings "redefine";'
        ' local *PVE::RPCEnvironment::fork_worker = sub {'
        '   my ($self, $type, $id, $user, $worker) = @_;'
        f'   $seen = [sort keys %{{PVE::Storage::LVMPlugin::lvm_list_volumes("{vg.name}")'
        f'->{{"{vg.name}"}}}}];'
        '   $worker->(); return "UPID:test"; };'
        f' PVE::Storage::vdisk_free($cfg, "{renamed}"); return $seen;')
    assert handed == ["del-snap_vm-101-disk-0_snap1.qcow2", "del-vm-101-disk-0.qcow2"]
    assert lv_sizes(vg) == {}


def format_node_of(vm: QemuVM, lv_path: str) -> str:
    """The qcow2 node QEMU opened on ``lv_path`` (here: a backing file it
    opened from the top's header, with a name of QEMU's choosing)."""
    for node in vm.qmp("query-named-block-nodes", flat=True):
        if node.get("drv") == "qcow2" and node.get("file") == lv_path:
            return str(node["node-name"])
    raise AssertionError(f"QEMU has no qcow2 node on {lv_path}")


#: A stand-in for qemu-server's ``qemu_volume_snapshot_delete`` up to its block job
#: (QEMU 10, which qemu-server needs for volume chains, and the rest of
#: qemu-server are not to be had here): it reads the chain as the real one does.
QEMU_SERVER_DELETE_STANDIN = (
    'sub PVE::QemuServer::qemu_volume_snapshot_delete {'
    ' my ($vmid, $storecfg, $drive, $snap) = @_;'
    ' PVE::Storage::volume_snapshot_info($storecfg, $drive->{file}); 1 }')


def delete_online_until_the_job(pve: upstream.PerlSession, snap: str) -> None:
    pve.call(f'{QEMU_SERVER_DELETE_STANDIN} return PVE::QemuServer::qemu_volume_snapshot_delete('
             f'{VMID}, $cfg, {{ file => "{VOLID}" }}, "{snap}");')


def test_online_delete_of_the_first_snapshot_has_room_before_the_job(
        sources: upstream.Upstream, out_dir: Path, tmp_path: Path) -> None:
    """qemu-server deletes a running VM's first snapshot with an active
    ``block-commit`` of the disk into the snapshot's LV, at full speed and
    without ``on-error``: the first ENOSPC would fail the job. The plugin
    grows the target when qemu-server reads the chain right before the job
    (``volume_snapshot_info`` called from ``qemu_volume_snapshot_delete``);
    no daemon runs here, so that growth is all the room the job gets."""
    with thin_storage(sources, out_dir, chunksize=SMALL_CHUNK,
                      initial_size=SMALL_INITIAL) as (pve, vg):
        pve.call(f'return [PVE::Storage::vdisk_alloc($cfg, "{STORE}", {VMID}, "qcow2", undef,'
                 f' {DISK // 1024})];')
        qemu_io(vg, VOLNAME, f"write -P 0x11 0 {WRITE}")
        pve.call(f'PVE::Storage::volume_snapshot($cfg, "{VOLID}", "snap1");')
        # The guest wrote on; the daemon grew the top meanwhile (here: by hand).
        sh("lvextend", "-q", "--size", f"{3 * SMALL_INITIAL}b", vg.lv_path(VOLNAME))
        qemu_io(vg, VOLNAME, f"write -P 0x22 {GiB} {COMMITTED}")
        before = lv_sizes(vg)
        assert before == {SNAP1: SMALL_INITIAL, VOLNAME: 3 * SMALL_INITIAL}
        # What the job copies does not fit in the snapshot's LV as it is.
        assert image_end(vg, VOLNAME) > SMALL_INITIAL

        disk = Pve9Disk.for_volume(vg.lv_path(VOLNAME), VOLID)
        with QemuVM(VMID, tmp_path, disks=[disk]) as vm:
            # Reading the chain is no delete (a VM start and a snapshot read it too).
            pve.call(f'PVE::Storage::volume_snapshot_info($cfg, "{VOLID}"); return 1;')
            assert lv_sizes(vg) == before
            delete_online_until_the_job(pve, "snap1")
            # While the VM runs, the top's LV bounds what the job copies.
            maximum = measured_maximum(DISK, EXTENT)
            expected = plugin.commit_lv_size(SMALL_INITIAL, before[VOLNAME], maximum,
                                             SMALL_CHUNK, EXTENT)
            assert lv_sizes(vg) == {SNAP1: expected, VOLNAME: before[VOLNAME]}

            # qemu-server's blockdev_commit: the whole top into the snapshot, full speed.
            job = "commit-drive-scsi0"
            vm.qmp("block-commit", {"job-id": job, "device": disk.top_node,
                                    "top-node": disk.block_node,
                                    "base-node": format_node_of(vm, vg.lv_path(SNAP1))})
            settled = vm.wait_event("JOB_STATUS_CHANGE", timeout=JOB_TIMEOUT, match=lambda e: (
                e["data"]["id"] == job and e["data"]["status"] in ("ready", "concluded")))
            assert settled["data"]["status"] == "ready", vm.qmp("query-jobs")
            # The guest writes on during the job; the commit mirrors it into the base.
            vm.write_pattern(disk.top_node, 2 * GiB, WRITE, 0x33)
            vm.qmp("job-complete", id=job)
            completed = vm.wait_event("BLOCK_JOB_COMPLETED", timeout=JOB_TIMEOUT)
            assert "error" not in completed["data"], completed
            assert not [e for e in vm.events() if e["event"] == "BLOCK_JOB_ERROR"]
            for offset, length, pattern in ((0, WRITE, 0x11), (GiB, COMMITTED, 0x22),
                                            (2 * GiB, WRITE, 0x33)):
                assert vm.read_verify(disk.top_node, offset, length, pattern)
        # The snapshot's LV alone now holds every byte (qemu-server renames it to the disk next).
        assert qcow2_check(vg.lv_path(SNAP1))["exit"] == 0
        qemu_io(vg, SNAP1, f"read -P 0x22 {GiB} {COMMITTED}")
        qemu_io(vg, SNAP1, f"read -P 0x33 {2 * GiB} {WRITE}")
        assert lv_sizes(vg) == {SNAP1: expected, VOLNAME: before[VOLNAME]}
        assert expected < maximum


def test_online_delete_of_a_later_snapshot_has_room_before_the_stream(
        sources: upstream.Upstream, out_dir: Path, tmp_path: Path) -> None:
    """A running VM's later snapshot is deleted by ``block-stream``: its data
    goes into its child, here the top the guest writes. The plugin grows the
    top before the job, by the deleted snapshot's LV plus a chunk."""
    with thin_storage(sources, out_dir, chunksize=SMALL_CHUNK,
                      initial_size=SMALL_INITIAL) as (pve, vg):
        pve.call(f'return [PVE::Storage::vdisk_alloc($cfg, "{STORE}", {VMID}, "qcow2", undef,'
                 f' {DISK // 1024})];')
        qemu_io(vg, VOLNAME, f"write -P 0x11 0 {WRITE}")
        pve.call(f'PVE::Storage::volume_snapshot($cfg, "{VOLID}", "snap1");')
        sh("lvextend", "-q", "--size", f"{3 * SMALL_INITIAL}b", vg.lv_path(VOLNAME))
        qemu_io(vg, VOLNAME, f"write -P 0x22 {GiB} {COMMITTED}")
        pve.call(f'PVE::Storage::volume_snapshot($cfg, "{VOLID}", "snap2");')
        before = lv_sizes(vg)
        assert before == {SNAP1: SMALL_INITIAL, SNAP2: 3 * SMALL_INITIAL, VOLNAME: SMALL_INITIAL}
        assert image_end(vg, SNAP2) > SMALL_INITIAL

        disk = Pve9Disk.for_volume(vg.lv_path(VOLNAME), VOLID)
        with QemuVM(VMID, tmp_path, disks=[disk]) as vm:
            delete_online_until_the_job(pve, "snap2")
            expected = plugin.commit_lv_size(SMALL_INITIAL, before[SNAP2], overlay_maximum(),
                                             SMALL_CHUNK, EXTENT)
            assert lv_sizes(vg) == {**before, VOLNAME: expected}

            # qemu-server's blockdev_stream: snap2 into the top, onto snap1, full speed.
            job = "stream-drive-scsi0"
            vm.qmp("block-stream", {"job-id": job, "device": disk.block_node,
                                     "base-node": format_node_of(vm, vg.lv_path(SNAP1)),
                                     "backing-file": SNAP1})
            vm.write_pattern(disk.top_node, 2 * GiB, WRITE, 0x33)
            completed = vm.wait_event("BLOCK_JOB_COMPLETED", timeout=JOB_TIMEOUT)
            assert "error" not in completed["data"], completed
            assert not [e for e in vm.events() if e["event"] == "BLOCK_JOB_ERROR"]
            for offset, length, pattern in ((0, WRITE, 0x11), (GiB, COMMITTED, 0x22),
                                            (2 * GiB, WRITE, 0x33)):
                assert vm.read_verify(disk.top_node, offset, length, pattern)
        # The top now sits on snap1 and holds snap2's data itself.
        assert image(vg, VOLNAME)["backing-filename"] == SNAP1
        assert qcow2_check(vg.lv_path(VOLNAME))["exit"] == 0
        assert lv_sizes(vg) == {**before, VOLNAME: expected}
