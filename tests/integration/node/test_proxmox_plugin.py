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

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pvestord.adapters import preparedjobs, vghealth
from pvestord.features import plugin
from pvestord.policy.capacity import COPY_TAG, maximum_tag
from pvestord.policy.volumes import shrink_target
from tests.harness.daemons import VENV_BIN
from tests.harness.lvmbed import VG, GiB, MiB, measured_maximum, qcow2_check, sh
from tests.harness.pvestorage import (
    DISK,
    EXTENT,
    SNAP1,
    SNAP2,
    STORE,
    VMID,
    VOLID,
    VOLNAME,
    alloc_disk,
    image,
    image_end,
    lv_sizes,
    overlay_maximum,
    qemu_io,
    snapshot,
    thin_storage,
)
from tests.proxmox import upstream

CHUNK = 256 * MiB
INITIAL = 512 * MiB
WRITE = 8 * MiB


@pytest.fixture
def proxmox(sources: upstream.Upstream, out_dir: Path
            ) -> Iterator[tuple[upstream.PerlSession, VG]]:
    with thin_storage(sources, out_dir, chunksize=CHUNK, initial_size=INITIAL) as storage:
        yield storage


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
    # into the snapshot's LV, which gets the room for it first: what the
    # overlay's LV holds (its size: no qemu-img check under the storage lock).
    assert image_end(vg, VOLNAME) <= lv_sizes(vg)[VOLNAME]
    expected = plugin.commit_lv_size(INITIAL, lv_sizes(vg)[VOLNAME],
                                     measured_maximum(DISK, EXTENT), CHUNK, EXTENT)
    assert INITIAL < expected < measured_maximum(DISK, EXTENT)
    pve.call(f'PVE::Storage::volume_snapshot_delete($cfg, "{VOLID}", "snap1", 0);')
    # Then, the merge over, back to what it holds plus a chunk.
    reduced = shrink_target(expected, image_end(vg, VOLNAME), CHUNK, INITIAL, EXTENT)
    assert lv_sizes(vg) == {VOLNAME: reduced}
    assert reduced < expected
    assert COPY_TAG not in lv_tags(vg)[VOLNAME]
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
    assert [(v["volid"], v["approximate-size"]) for v in listed] == [(VOLID, reduced)]

    pve.call(f'PVE::Storage::vdisk_free($cfg, "{VOLID}");')
    assert lv_sizes(vg) == {}


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
    assert image_end(vg, SNAP2) <= lv_sizes(vg)[SNAP2]
    expected = plugin.commit_lv_size(INITIAL, lv_sizes(vg)[SNAP2], overlay_maximum(), CHUNK,
                                     EXTENT)
    pve.call(f'PVE::Storage::volume_snapshot_delete($cfg, "{VOLID}", "snap2", 0);')
    # Grown for the rebase, then reduced to what the top holds plus a chunk.
    assert expected > INITIAL
    reduced = shrink_target(expected, image_end(vg, VOLNAME), CHUNK, INITIAL, EXTENT)
    assert lv_sizes(vg) == {SNAP1: INITIAL, VOLNAME: reduced}
    assert COPY_TAG not in lv_tags(vg)[VOLNAME]
    assert image(vg, VOLNAME)["backing-filename"] == SNAP1
    qemu_io(vg, VOLNAME, f"read -P 0x44 0 {WRITE}")


def test_a_live_delete_reading_the_chain_in_an_eval_is_prepared_and_recorded(
        proxmox: tuple[upstream.PerlSession, VG]) -> None:
    """qemu-server's ``qemu_volume_snapshot_delete`` with its chain read wrapped in
    an ``eval`` block (a frame of its own on Perl's call stack): the plugin
    still grows the commit's target before the job, and leaves the record by
    which the daemon tells a prepared job from one it must warn of."""
    pve, vg = proxmox
    pve.call(f'return [PVE::Storage::vdisk_alloc($cfg, "{STORE}", {VMID}, "qcow2", undef,'
             f' {DISK // 1024})];')
    qemu_io(vg, VOLNAME, f"write -P 0x11 0 {WRITE}")
    pve.call(f'PVE::Storage::volume_snapshot($cfg, "{VOLID}", "snap1");')
    # The guest wrote more than snap1's LV could take (the daemon grew the top).
    sh("lvextend", "-q", "--size", f"{3 * INITIAL}b", vg.lv_path(VOLNAME))
    before = lv_sizes(vg)
    since = time.time()
    pve.call('sub PVE::QemuServer::qemu_volume_snapshot_delete {'
             ' my ($vmid, $storecfg, $drive, $snap) = @_;'
             ' eval { PVE::Storage::volume_snapshot_info($storecfg, $drive->{file}) };'
             ' die $@ if $@; 1 }'
             f' return PVE::QemuServer::qemu_volume_snapshot_delete({VMID}, $cfg,'
             f' {{ file => "{VOLID}" }}, "snap1");')
    expected = plugin.commit_lv_size(INITIAL, before[VOLNAME], measured_maximum(DISK, EXTENT),
                                     CHUNK, EXTENT)
    assert expected > before[SNAP1]
    assert lv_sizes(vg) == {SNAP1: expected, VOLNAME: before[VOLNAME]}
    # Recorded by this call: its age counted from the call's start is at most
    # the file system's timestamp granularity below zero.
    recorded = preparedjobs.age(preparedjobs.folder_beside(vghealth.DEFAULT_DIR), vg.name, SNAP1,
                                now=since)
    assert recorded is not None and recorded <= 1


def test_copy_flows_get_a_thick_volume(proxmox: tuple[upstream.PerlSession, VG]) -> None:
    """A volume qemu-server allocates to copy a disk into (here: clone_disk) holds
    the whole image at once; nobody would grow it while the copy runs."""
    pve, vg = proxmox
    pve.call('sub PVE::QemuServer::clone_disk { return PVE::Storage::vdisk_alloc(@_) }'
             f' return [PVE::QemuServer::clone_disk($cfg, "{STORE}", {VMID},'
             f' "qcow2", undef, {DISK // 1024})];')
    assert lv_sizes(vg) == {VOLNAME: measured_maximum(DISK, EXTENT)}
    assert image(vg, VOLNAME)["virtual-size"] == DISK


#: qemu-server's new volume of a move disk or clone (VMID 101's first disk).
COPY_VOLNAME = "vm-101-disk-0.qcow2"
COPY_VOLID = f"{STORE}:{COPY_VOLNAME}"
#: What the source holds: a 64 MiB stretch at its start, 8 MiB at 2 GiB.
SOURCE_DATA = ((0x5A, 0, 64 * MiB), (0x6B, 2 * GiB, 8 * MiB))


def copy_source(pve: upstream.PerlSession, vg: VG) -> None:
    """The disk to copy: thin, written, deactivated as a stopped VM's is."""
    alloc_disk(pve)
    for pattern, offset, length in SOURCE_DATA:
        qemu_io(vg, VOLNAME, f"write -P {pattern:#x} {offset} {length}")
    pve.call(f'PVE::Storage::deactivate_volumes($cfg, ["{VOLID}"]); return [];')


def alloc_copy_target(pve: upstream.PerlSession) -> None:
    """clone_disk's ``vdisk_alloc`` of the target, then its ``activate_volumes``
    of the new, still empty volume (qemu-server's order)."""
    made = pve.call('sub PVE::QemuServer::clone_disk {'
                    '  my $volid = PVE::Storage::vdisk_alloc(@_);'
                    '  PVE::Storage::activate_volumes($_[0], [$volid]); return $volid }'
                    f' return [PVE::QemuServer::clone_disk($cfg, "{STORE}", 101,'
                    f' "qcow2", undef, {DISK // 1024})];')
    assert made == [COPY_VOLID]


def convert_into_target(pve: upstream.PerlSession, vg: VG) -> None:
    """qemu-server's offline copy (QemuImage::convert into a zero-initialized
    qcow2): the source activated, ``qemu-img convert -p -n`` into a target
    known to read as zeroes. Proxmox's QEMU says so with its own ``zeroinit:``
    driver; Debian's qemu-img has ``--target-is-zero`` for it."""
    pve.call(f'PVE::Storage::activate_volumes($cfg, ["{VOLID}"]); return [];')
    sh("qemu-img", "convert", "-p", "-n", "-f", "qcow2", "-O", "qcow2", "--target-is-zero",
       vg.lv_path(VOLNAME), vg.lv_path(COPY_VOLNAME), timeout=600)


def assert_reduced_copy(vg: VG, thick: int, out_dir: Path, flow: str) -> None:
    """The target at shrink_target's size, the data the source's, clean, untagged."""
    sh("lvchange", "-aey", vg.lv_path(COPY_VOLNAME))
    end = image_end(vg, COPY_VOLNAME)
    size = lv_sizes(vg)[COPY_VOLNAME]
    (out_dir / "copy-sizes.json").write_text(json.dumps(
        {"flow": flow, "thick_lv": thick, "reduced_lv": size, "image_end": end}))
    assert size == shrink_target(thick, end, CHUNK, INITIAL, EXTENT) < thick
    assert COPY_TAG not in lv_tags(vg)[COPY_VOLNAME]
    assert qcow2_check(vg.lv_path(COPY_VOLNAME))["exit"] == 0
    sh("qemu-img", "compare", "-f", "qcow2", "-F", "qcow2", vg.lv_path(VOLNAME),
       vg.lv_path(COPY_VOLNAME), timeout=600)


def test_an_offline_move_disk_lands_thin(proxmox: tuple[upstream.PerlSession, VG],
                                         out_dir: Path) -> None:
    """Move disk of a stopped VM (clone_disk, then the API's deactivate_volumes):
    thick while qemu-img converts, reduced when the new volume is deactivated."""
    pve, vg = proxmox
    copy_source(pve, vg)
    alloc_copy_target(pve)
    thick = measured_maximum(DISK, EXTENT)
    assert lv_sizes(vg)[COPY_VOLNAME] == thick
    assert COPY_TAG in lv_tags(vg)[COPY_VOLNAME]
    convert_into_target(pve, vg)
    assert lv_sizes(vg)[COPY_VOLNAME] == thick
    pve.call(f'PVE::Storage::deactivate_volumes($cfg, ["{COPY_VOLID}"]); return [];')
    assert_reduced_copy(vg, thick, out_dir, "offline move disk")


def test_a_same_node_clone_lands_thin_at_its_next_activation(
        proxmox: tuple[upstream.PerlSession, VG], out_dir: Path) -> None:
    """A full clone on the same node never deactivates its new volume: the
    activation right after vdisk_alloc finds it empty and leaves it; the next
    one (the clone's first start) finds the copy's data and reduces it."""
    pve, vg = proxmox
    copy_source(pve, vg)
    alloc_copy_target(pve)
    thick = measured_maximum(DISK, EXTENT)
    convert_into_target(pve, vg)
    assert lv_sizes(vg)[COPY_VOLNAME] == thick
    assert COPY_TAG in lv_tags(vg)[COPY_VOLNAME]
    pve.call(f'PVE::Storage::activate_volumes($cfg, ["{COPY_VOLID}"]); return [];')
    assert_reduced_copy(vg, thick, out_dir, "same-node full clone")


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



#: The VG's free space in the rollback test (1.6 GiB)...
ROOM_LEFT = 1600 * MiB
#: ...and a thin-critical-free that a new top refuses on it, even with the
#: old top's 512 MiB counted as given back: 1.6 GiB would be left, below 2 GiB.
CRITICAL_FREE = "2G"
ROLLBACK = f'PVE::Storage::volume_snapshot_rollback($cfg, "{VOLID}", "snap1");'


def test_rollback_refused_for_room_leaves_the_volume_as_it_was(
        sources: upstream.Upstream, out_dir: Path) -> None:
    """A rollback refused for room, on real LVM: 1.6 GiB free, a snapshot, a rollback the
    capacity guard refuses. The rollback removed the top before it asked and
    left the volume without a current LV, which every retry then failed on.
    Now the refusal changes nothing: the top keeps what the guest wrote, the
    chain is whole, and the same rollback succeeds once room is freed."""
    with thin_storage(sources, out_dir, chunksize=CHUNK, initial_size=INITIAL,
                      options={"pvestord-thin-critical-free": CRITICAL_FREE}) as (pve, vg):
        assert alloc_disk(pve) == VOLID
        qemu_io(vg, VOLNAME, f"write -P 0x11 0 {WRITE}")
        snapshot(pve, "snap1")
        qemu_io(vg, VOLNAME, f"write -P 0x22 {GiB} {WRITE}")
        vg.create_lv("filler", vg.free() - ROOM_LEFT)
        assert vg.free() == ROOM_LEFT
        before = lv_sizes(vg)
        assert before == {SNAP1: INITIAL, VOLNAME: INITIAL, "filler": before["filler"]}

        with pytest.raises(AssertionError, match="refusing a new thin volume"):
            pve.call(ROLLBACK)
        assert lv_sizes(vg) == before
        assert image(vg, VOLNAME)["backing-filename"] == SNAP1
        assert qcow2_check(vg.lv_path(VOLNAME))["exit"] == 0
        qemu_io(vg, VOLNAME, f"read -P 0x22 {GiB} {WRITE}")
        # Proxmox's own check before a rollback still finds the chain.
        assert pve.call(f'return PVE::Storage::volume_rollback_is_possible($cfg, "{VOLID}",'
                        ' "snap1");') == 1

        sh("lvremove", "-q", "-y", vg.lv_path("filler"))
        pve.call(ROLLBACK)
        assert lv_sizes(vg) == {SNAP1: INITIAL, VOLNAME: INITIAL}
        top = image(vg, VOLNAME)
        assert (top["backing-filename"], top["virtual-size"]) == (SNAP1, DISK)
        qemu_io(vg, VOLNAME, f"read -P 0x11 0 {WRITE}")
        qemu_io(vg, VOLNAME, f"read -P 0 {GiB} {WRITE}")  # rolled back


def test_saferemove_rollback_zeroes_the_old_top_outside_the_storage_lock(
        proxmox: tuple[upstream.PerlSession, VG]) -> None:
    """With ``saferemove`` the old top (grown to any size) is renamed to
    ``del-...`` under the storage lock and zeroed and removed by a worker
    that runs after the lock is left, as Proxmox's ``lvm`` type does it."""
    pve, vg = proxmox
    alloc_disk(pve)
    snapshot(pve, "snap1")
    qemu_io(vg, VOLNAME, f"write -P 0x66 0 {WRITE}")
    handed = pve.call(
        f'my $scfg = PVE::Storage::storage_config($cfg, "{STORE}");'
        ' $scfg->{saferemove} = 1; my $seen;'
        ' no warnings "redefine";'
        ' local *PVE::RPCEnvironment::fork_worker = sub {'
        '   my ($self, $type, $id, $user, $worker) = @_;'
        f'   open(my $lock, "<", "$ENV{{PVESTORD_TEST_LOCK_DIR}}/storage-{STORE}") or die $!;'
        '   my $free = flock($lock, Fcntl::LOCK_EX() | Fcntl::LOCK_NB()) ? 1 : 0;'
        '   close($lock);'
        f'   my $lvs = PVE::Storage::LVMPlugin::lvm_list_volumes("{vg.name}")->{{"{vg.name}"}};'
        '   $seen = {type => $type, lock_free => $free, lvs => [sort keys %$lvs]};'
        '   $worker->(); return "UPID:test"; };'
        f' {ROLLBACK} return $seen;')
    assert handed == {"type": "imgdel", "lock_free": 1,
                      "lvs": [f"del-{VOLNAME}-rollback", SNAP1, VOLNAME]}
    assert lv_sizes(vg) == {SNAP1: INITIAL, VOLNAME: INITIAL}
    assert image(vg, VOLNAME)["backing-filename"] == SNAP1
    qemu_io(vg, VOLNAME, f"read -P 0 0 {WRITE}")  # the new top reads the snapshot's zeroes


def test_vm_state_and_fleecing_image_with_real_lvm(
        proxmox: tuple[upstream.PerlSession, VG]) -> None:
    """The two volumes Proxmox allocates by name: a snapshot's RAM state (raw,
    as qemu-server's ``__snapshot_save_vmstate`` asks) kept across the disk's
    rollback and freed with the snapshot, and a backup's fleecing image (qcow2
    without its suffix, as vzdump asks), made thin and freed."""
    pve, vg = proxmox
    state_kib = 64 * 1024 + 4  # not whole extents: LVM rounds up, as for Proxmox's lvm
    state = f"vm-{VMID}-state-snap1"
    pve.call(f'return [PVE::Storage::vdisk_alloc($cfg, "{STORE}", {VMID}, "qcow2", undef,'
             f' {DISK // 1024})];')
    made = pve.call(f'return [PVE::Storage::vdisk_alloc($cfg, "{STORE}", {VMID}, "raw",'
                    f' "{state}", {state_kib})];')[0]
    assert made == f"{STORE}:{state}"
    assert lv_sizes(vg)[state] == -(-state_kib * 1024 // EXTENT) * EXTENT
    # Proxmox's tag, and the maximum every node's capacity figures read: a
    # raw LV's is its size.
    assert lv_tags(vg)[state] == {f"pve-vm-{VMID}", maximum_tag(lv_sizes(vg)[state])}
    path = pve.call(f'PVE::Storage::activate_volumes($cfg, ["{made}"]);'
                    f' return PVE::Storage::path($cfg, "{made}");')
    assert path == f"/dev/{vg.name}/{state}"
    sh("dd", "if=/dev/urandom", f"of={path}", "bs=1M", "count=1", "oflag=direct")
    written = sh("sha256sum", path)
    listed = pve.call(f'return PVE::Storage::vdisk_list($cfg, "{STORE}", {VMID})->{{"{STORE}"}};')
    assert {v["volid"]: v["format"] for v in listed}[made] == "raw"

    # The disk's snapshot and rollback leave the state alone; the snapshot's delete frees it.
    pve.call(f'PVE::Storage::volume_snapshot($cfg, "{VOLID}", "snap1");')
    pve.call(f'PVE::Storage::volume_snapshot_rollback($cfg, "{VOLID}", "snap1");')
    assert sh("sha256sum", path) == written
    pve.call(f'PVE::Storage::vdisk_free($cfg, "{made}");')
    assert state not in lv_sizes(vg)

    fleece_lv = f"vm-{VMID}-fleece-0.qcow2"
    fleece_size = DISK + 512  # QEMU's size of the disk, passed exactly for qcow2
    fleece = pve.call(f'return [PVE::Storage::vdisk_alloc($cfg, "{STORE}", {VMID}, "qcow2",'
                      f' "vm-{VMID}-fleece-0", {fleece_size} / 1024)];')[0]
    assert fleece == f"{STORE}:{fleece_lv}"
    assert lv_sizes(vg)[fleece_lv] == INITIAL
    assert image(vg, fleece_lv)["virtual-size"] == fleece_size
    pve.call(f'PVE::Storage::vdisk_free($cfg, "{fleece}");')
    assert fleece_lv not in lv_sizes(vg)


# --- snapshot deletes and shrink of a chain (issue 37, item 2) -------------------------------

def test_snapshot_deletes_do_not_ratchet_a_chain_up(
        proxmox: tuple[upstream.PerlSession, VG], out_dir: Path) -> None:
    """Snapshot, write, delete, three times over (each delete commits the top
    into the snapshot's LV, which is grown first for it): each time the LV
    that received the merge goes back to what it holds plus a chunk, instead
    of keeping its growth and passing it on to the next snapshot."""
    pve, vg = proxmox
    alloc_disk(pve)
    qemu_io(vg, VOLNAME, f"write -P 0x10 0 {WRITE}")
    rounds = []
    for n in range(1, 4):
        snapshot(pve, f"r{n}")
        snap_lv = f"snap_vm-{VMID}-disk-0_r{n}.qcow2"
        qemu_io(vg, VOLNAME, f"write -P {0x10 + n:#x} {n * GiB} {WRITE}")
        before = lv_sizes(vg)
        grown = plugin.commit_lv_size(before[snap_lv], before[VOLNAME],
                                      measured_maximum(DISK, EXTENT), CHUNK, EXTENT)
        pve.call(f'PVE::Storage::volume_snapshot_delete($cfg, "{VOLID}", "r{n}", 0);')
        end = image_end(vg, VOLNAME)
        after = lv_sizes(vg)
        rounds.append({"round": n, "before": before, "grown_for_commit": grown,
                       "image_end": end, "after": after})
        assert after == {VOLNAME: shrink_target(grown, end, CHUNK, INITIAL, EXTENT)}
        assert after[VOLNAME] == INITIAL < grown
        assert COPY_TAG not in lv_tags(vg)[VOLNAME]
    (out_dir / "snapshot-delete-sizes.json").write_text(json.dumps(rounds, indent=2))
    # Reduced under the disk's name: after qemu-img commit and the rename, never
    # under the snapshot's, before the commit had written into its room.
    said = (out_dir / "perl.log").read_text()
    assert said.count(f"{STORE}:{VOLNAME}: copy over") == 3, said
    assert f"{STORE}:snap_vm-{VMID}-disk-0_r1.qcow2: copy over" not in said, said
    assert qcow2_check(vg.lv_path(VOLNAME))["exit"] == 0
    for n in range(4):
        qemu_io(vg, VOLNAME, f"read -P {0x10 + n:#x} {n * GiB} {WRITE}")


NODE = "nodea"


def shrink_cli(sources: upstream.Upstream, out_dir: Path, cluster: Path, *extra: str
               ) -> subprocess.CompletedProcess[str]:
    """``pvestord volume shrink`` as an admin runs it on the node owning VM 100."""
    for name, text in ((".members", json.dumps({"nodename": NODE, "version": 1})),
                       (".vmlist", json.dumps({"version": 1, "ids": {str(VMID): {
                           "node": NODE, "type": "qemu", "version": 1}}})),
                       (".rrd", "")):
        (cluster / name).write_text(text)
    run_dir = cluster / "run"
    run_dir.mkdir(exist_ok=True)
    return subprocess.run(  # noqa: S603 - argument list
        [str(VENV_BIN / "pvestord"), "volume", "shrink", "--storage-config",
         str(sources.pve_dir / "storage.cfg"), "--lock-dir", str(out_dir / "locks"),
         "--run-dir", str(run_dir), "--cluster-dir", str(cluster), *extra, VOLID],
        capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL, check=False)


def active_lvs(vg: VG) -> set[str]:
    out = sh("lvs", "--reportformat", "json", "-o", "lv_name,lv_active", vg.name)
    return {row["lv_name"] for row in json.loads(out)["report"][0]["lv"] if row["lv_active"]}


def test_shrink_reduces_every_lv_of_a_chain(
        proxmox: tuple[upstream.PerlSession, VG], sources: upstream.Upstream, out_dir: Path,
        tmp_path: Path) -> None:
    """A stopped disk with two snapshots, each LV grown past its data (the
    daemon grew the top of its time): ``volume shrink`` finds the chain from
    the images, refuses as a whole when one LV is in use, and otherwise
    reduces each LV to its image end plus a chunk, at least initial-size."""
    pve, vg = proxmox
    alloc_disk(pve)
    qemu_io(vg, VOLNAME, f"write -P 0x11 0 {WRITE}")
    sh("lvextend", "-q", "--size", f"{3 * INITIAL}b", vg.lv_path(VOLNAME))
    snapshot(pve, "snap1")
    qemu_io(vg, VOLNAME, f"write -P 0x22 {GiB} {WRITE}")
    sh("lvextend", "-q", "--size", f"{2 * INITIAL}b", vg.lv_path(VOLNAME))
    snapshot(pve, "snap2")
    qemu_io(vg, VOLNAME, f"write -P 0x33 {2 * GiB} {WRITE}")
    sh("lvextend", "-q", "--size", f"{2 * INITIAL}b", vg.lv_path(VOLNAME))
    pve.call(f'PVE::Storage::deactivate_volumes($cfg, ["{VOLID}"]); return [];')
    before = lv_sizes(vg)
    assert before == {SNAP1: 3 * INITIAL, SNAP2: 2 * INITIAL, VOLNAME: 2 * INITIAL}
    assert active_lvs(vg) == set()
    cluster = tmp_path / "pve"
    cluster.mkdir()

    # One LV of the chain in use: refused, naming it; nothing changed, nothing left active.
    sh("lvchange", "-aey", vg.lv_path(SNAP2))
    refused = shrink_cli(sources, out_dir, cluster)
    assert refused.returncode == 1, refused
    assert f"{STORE}:{SNAP2}: the LV {vg.name}/{SNAP2} is active" in refused.stderr, refused
    assert lv_sizes(vg) == before
    assert active_lvs(vg) == {SNAP2}
    sh("lvchange", "-an", vg.lv_path(SNAP2))

    dry = shrink_cli(sources, out_dir, cluster, "--dry-run", "--json")
    assert dry.returncode == 0, dry
    planned = json.loads(dry.stdout)
    assert [row["lv"] for row in planned["chain"]] == [VOLNAME, SNAP2, SNAP1]
    assert lv_sizes(vg) == before
    assert active_lvs(vg) == set()

    done = shrink_cli(sources, out_dir, cluster)
    assert done.returncode == 0, done
    assert active_lvs(vg) == set()
    sh("lvchange", "-aey", vg.lv_path(VOLNAME), vg.lv_path(SNAP2), vg.lv_path(SNAP1))
    after = lv_sizes(vg)
    ends = {lv: image_end(vg, lv) for lv in after}
    (out_dir / "chain-shrink-sizes.json").write_text(json.dumps(
        {"before": before, "after": after, "image_ends": ends, "stdout": done.stdout},
        indent=2))
    for lv, size in after.items():
        assert size == shrink_target(before[lv], ends[lv], CHUNK, INITIAL, EXTENT), lv
        assert f"{STORE}:{lv}: shrank LV" in done.stdout, done.stdout
    assert sum(after.values()) == 3 * INITIAL < sum(before.values())
    for lv in after:
        assert qcow2_check(vg.lv_path(lv))["exit"] == 0, lv
    for pattern, offset in ((0x11, 0), (0x22, GiB), (0x33, 2 * GiB)):
        qemu_io(vg, VOLNAME, f"read -P {pattern:#x} {offset} {WRITE}")
