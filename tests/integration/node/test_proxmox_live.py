"""A running VM's snapshot flows on a pvestord storage, as qemu-server 9 runs them (node guest).

Proxmox's real ``PVE::Storage`` (tests/harness/pvestorage.py) and a real QEMU
with Proxmox VE 9's block graph; the QMP commands are qemu-server's
(``VolumeChain.pm``: ``blockdev_external_snapshot``, ``blockdev_commit``,
``blockdev_stream``). qemu-server itself cannot run here (volume chains need
QEMU 10 and the whole PVE stack), so its ``qemu_volume_snapshot_delete`` is a
stand-in, named as one, that reads the chain as the real one does right
before its block job. The guest of the live snapshot is a real one writing
through a virtio-blk device (tests/harness/writerguest.py), beside writes
issued at chosen moments with qemu-io. No pvestord daemon runs: the room a job gets is the
plugin's alone, and a top that must hold more is grown by hand, as the
daemon would.

A block job writes at full speed and qemu-server gives it no ``on-error``:
the first ENOSPC fails it. So the data each job copies is made larger than
its target LV as it stood before the plugin's growth.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pvestord.features import plugin
from pvestord.policy.capacity import COPY_TAG
from pvestord.policy.volumes import shrink_target
from tests.harness.lvmbed import VG, GiB, MiB, measured_maximum, qcow2_check, sh
from tests.harness.polling import wait_until
from tests.harness.pvestorage import (
    CHUNK,
    DISK,
    EXTENT,
    INITIAL,
    SNAP1,
    SNAP2,
    VMID,
    VOLID,
    VOLNAME,
    alloc_disk,
    image,
    image_end,
    live_storage,
    lv_sizes,
    overlay_maximum,
    qemu_io,
    reopen_onto_snapshot,
    snapshot,
)
from tests.harness.qemu import Pve9Disk, QemuVM
from tests.harness.writerguest import build_writer
from tests.proxmox import upstream

WRITE = 4 * MiB
#: The writing guest's range: it and the test's writes before the snapshot
#: fit in INITIAL, so no write meets ENOSPC (no daemon would resume the guest).
GUEST_START = 512 * MiB
GUEST_WRITE = 16 * MiB
#: The guest's write rate while the snapshot is taken: 16 MiB take 256 s at
#: 64 KiB/s, several times what the snapshot's steps take in the node guest.
GUEST_SLOW_RATE = 64 * 1024
WRITER_TIMEOUT = 300.0
#: What the guest writes into the top after a snapshot: more than INITIAL, so
#: that the snapshot's LV could not take it without the plugin's growth.
COMMITTED = 48 * MiB
JOB_TIMEOUT = 600.0
WRITE_TIMEOUT = 300.0

#: A stand-in for qemu-server's ``qemu_volume_snapshot_delete`` up to its block
#: job: it reads the chain, as the real one does right before the job.
QEMU_SERVER_DELETE_STANDIN = (
    'sub PVE::QemuServer::qemu_volume_snapshot_delete {'
    ' my ($vmid, $storecfg, $drive, $snap) = @_;'
    ' PVE::Storage::volume_snapshot_info($storecfg, $drive->{file}); 1 }')


def delete_until_the_job(pve: upstream.PerlSession, snap: str) -> None:
    pve.call(f'{QEMU_SERVER_DELETE_STANDIN} return PVE::QemuServer::qemu_volume_snapshot_delete('
             f'{VMID}, $cfg, {{ file => "{VOLID}" }}, "{snap}");')


class Guest:
    """The guest's writes through the drive's top node; each one must succeed."""

    def __init__(self, vm: QemuVM, disk: Pve9Disk) -> None:
        self.vm, self.disk = vm, disk
        self.written: list[tuple[int, int, int]] = []

    def write(self, offset: int, length: int, pattern: int, *, node: str | None = None) -> None:
        """Write through the top node, or ``node`` (below the throttle node, when
        its limits hold the writing guest back)."""
        self.vm.write_pattern(node or self.disk.top_node, offset, length, pattern,
                              timeout=WRITE_TIMEOUT)
        self.written.append((offset, length, pattern))

    def reads_back_everything(self) -> bool:
        return all(self.vm.read_verify(self.disk.top_node, offset, length, pattern)
                   for offset, length, pattern in self.written)


def test_live_snapshot_then_live_delete_as_qemu_server_makes_them(
        sources: upstream.Upstream, out_dir: Path, tmp_path: Path) -> None:
    """A guest writes all through a live snapshot (its writes slowed by the
    drive's own throttle group so that the snapshot lands mid-write); then
    the snapshot is deleted live by an active commit at full speed."""
    with live_storage(sources, out_dir) as (pve, vg):
        alloc_disk(pve)
        disk = Pve9Disk.for_volume(vg.lv_path(VOLNAME), VOLID)
        writer = build_writer(tmp_path, out_dir, "writer", start=GUEST_START,
                              length=GUEST_WRITE, pattern=0x5A)
        with QemuVM(VMID, tmp_path, disks=[disk], machine="pc",
                    extra_args=["-S", *writer.args(disk.top_node)]) as vm:
            guest = Guest(vm, disk)
            guest.write(0, WRITE, 0x11)
            vm.qmp("qom-set", path=f"/objects/{disk.throttle_group}", property="limits",
                   value={"bps-write": GUEST_SLOW_RATE})
            vm.qmp("cont")
            wait_until(lambda: writer.output().count(".") >= 2, WRITER_TIMEOUT,
                       "the guest's first writes")

            # blockdev_external_snapshot, 1: Proxmox renames the LV under the running
            # QEMU and makes a new small top on it.
            snapshot(pve, "snap1")
            assert lv_sizes(vg) == {SNAP1: INITIAL, VOLNAME: INITIAL}
            # QEMU writes its open device on, now named snap1.
            guest.write(16 * MiB, WRITE, 0x22, node=disk.block_node)
            # 2 to 4: QEMU reopened onto the renamed LV, the new top over it.
            snap_disk, top = reopen_onto_snapshot(vm, vg, disk, "snap1")
            assert vm.named_node(top.block_node)["backing_file"] == vg.lv_path(SNAP1)
            assert not writer.output().endswith("S"), "the guest finished before the snapshot"
            # A limit absent from qom-set's value keeps its old one: zero lifts it.
            vm.qmp("qom-set", path=f"/objects/{disk.throttle_group}", property="limits",
                   value={"bps-write": 0})
            assert writer.wait_finished(WRITER_TIMEOUT) == writer.success
            guest.written.append((GUEST_START, GUEST_WRITE, 0x5A))

            # The guest writes more than the snapshot's LV could take; the daemon
            # would grow the top meanwhile (here: by hand).
            sh("lvextend", "-q", "--size", f"{3 * INITIAL}b", vg.lv_path(VOLNAME))
            guest.write(GiB, COMMITTED, 0x33)
            before = lv_sizes(vg)
            assert before == {SNAP1: INITIAL, VOLNAME: 3 * INITIAL}

            # Reading the chain is no delete (a VM start and a snapshot read it too).
            pve.call(f'PVE::Storage::volume_snapshot_info($cfg, "{VOLID}"); return 1;')
            assert lv_sizes(vg) == before
            # qemu_volume_snapshot_delete reads the chain right before its job: the
            # plugin grows the commit's target then, by the top's LV plus a chunk.
            delete_until_the_job(pve, "snap1")
            maximum = measured_maximum(DISK, EXTENT)
            expected = plugin.commit_lv_size(INITIAL, before[VOLNAME], maximum, CHUNK, EXTENT)
            assert expected < maximum
            assert lv_sizes(vg) == {SNAP1: expected, VOLNAME: before[VOLNAME]}

            # blockdev_commit: an active commit of the top into snap1, full speed.
            job = "commit-drive-scsi0"
            vm.qmp("block-commit", {"job-id": job, "device": disk.top_node,
                                    "top-node": top.block_node,
                                    "base-node": snap_disk.block_node})
            assert vm.wait_job(job, timeout=JOB_TIMEOUT) == "ready", vm.qmp("query-jobs")
            guest.write(2 * GiB, WRITE, 0x44)  # mirrored into snap1 by the job
            vm.qmp("job-complete", id=job)
            assert vm.job_completed_cleanly(timeout=JOB_TIMEOUT)
            assert guest.reads_back_everything()
            assert vm.qmp("query-status")["status"] == "running"

        # snap1's LV alone holds every byte now (qemu-server renames it to the disk next).
        assert qcow2_check(vg.lv_path(SNAP1))["exit"] == 0
        for offset, length, pattern in guest.written:
            qemu_io(vg, SNAP1, f"read -P {pattern:#x} {offset} {length}")
        assert lv_sizes(vg) == {SNAP1: expected, VOLNAME: before[VOLNAME]}

        # The VM stopped, qemu-server deactivates its volumes (vm_stop_cleanup):
        # the LV the commit merged into, tagged when it was grown for the job,
        # goes back to what it holds plus a chunk.
        assert COPY_TAG in lv_tag_sets(vg)[SNAP1]
        end = image_end(vg, SNAP1)
        pve.call(f'PVE::Storage::deactivate_volumes($cfg, ["{VOLID}"]); return [];')
        reduced = lv_sizes(vg)[SNAP1]
        (out_dir / "live-delete-sizes.json").write_text(json.dumps(
            {"before": before, "grown_for_commit": expected, "image_end": end,
             "after_stop": lv_sizes(vg)}, indent=2))
        assert reduced == shrink_target(expected, end, CHUNK, INITIAL, EXTENT) <= expected
        assert COPY_TAG not in lv_tag_sets(vg)[SNAP1]
        sh("lvchange", "-aey", vg.lv_path(SNAP1))
        assert qcow2_check(vg.lv_path(SNAP1))["exit"] == 0


def lv_tag_sets(vg: VG) -> dict[str, set[str]]:
    out = sh("lvs", "--reportformat", "json", "-o", "lv_name,lv_tags", vg.name)
    return {row["lv_name"]: {t for t in row["lv_tags"].split(",") if t}
            for row in json.loads(out)["report"][0]["lv"]}


# The quick set has the plugin's rule for this delete offline
# (test_proxmox_plugin.py) and the running path through the commit above.
@pytest.mark.node_full
def test_live_delete_of_a_later_snapshot_has_room_before_the_stream(
        sources: upstream.Upstream, out_dir: Path, tmp_path: Path) -> None:
    """A running VM's later snapshot is deleted by ``block-stream``: its data
    goes into its child, here the top the guest writes. The plugin grows the
    top before the job, by the deleted snapshot's LV plus a chunk, and the top
    goes back to its data plus a chunk when the VM stops."""
    with live_storage(sources, out_dir) as (pve, vg):
        alloc_disk(pve)
        qemu_io(vg, VOLNAME, f"write -P 0x11 0 {WRITE}")
        snapshot(pve, "snap1")
        sh("lvextend", "-q", "--size", f"{3 * INITIAL}b", vg.lv_path(VOLNAME))
        qemu_io(vg, VOLNAME, f"write -P 0x22 {GiB} {COMMITTED}")
        snapshot(pve, "snap2")
        before = lv_sizes(vg)
        assert before == {SNAP1: INITIAL, SNAP2: 3 * INITIAL, VOLNAME: INITIAL}
        assert image_end(vg, SNAP2) > INITIAL

        disk = Pve9Disk.for_volume(vg.lv_path(VOLNAME), VOLID)
        with QemuVM(VMID, tmp_path, disks=[disk]) as vm:
            guest = Guest(vm, disk)
            delete_until_the_job(pve, "snap2")
            expected = plugin.commit_lv_size(INITIAL, before[SNAP2], overlay_maximum(), CHUNK,
                                             EXTENT)
            assert lv_sizes(vg) == {**before, VOLNAME: expected}

            # blockdev_stream: snap2 into the top, onto snap1, full speed.
            job = "stream-drive-scsi0"
            vm.qmp("block-stream", {"job-id": job, "device": disk.block_node,
                                     "base-node": vm.format_node_on(vg.lv_path(SNAP1)),
                                     "backing-file": SNAP1})
            guest.write(2 * GiB, WRITE, 0x33)
            assert vm.job_completed_cleanly(timeout=JOB_TIMEOUT)
            guest.written += [(0, WRITE, 0x11), (GiB, COMMITTED, 0x22)]
            assert guest.reads_back_everything()
        # The top now sits on snap1 and holds snap2's data itself.
        assert image(vg, VOLNAME)["backing-filename"] == SNAP1
        assert qcow2_check(vg.lv_path(VOLNAME))["exit"] == 0
        assert lv_sizes(vg) == {**before, VOLNAME: expected}

        # The VM stopped (vm_stop_cleanup deactivates its volumes): the top,
        # grown for the stream and tagged then, goes back to its data plus a chunk.
        assert COPY_TAG in lv_tag_sets(vg)[VOLNAME]
        end = image_end(vg, VOLNAME)
        pve.call(f'PVE::Storage::deactivate_volumes($cfg, ["{VOLID}"]); return [];')
        reduced = lv_sizes(vg)[VOLNAME]
        assert reduced == shrink_target(expected, end, CHUNK, INITIAL, EXTENT) < expected
        assert COPY_TAG not in lv_tag_sets(vg)[VOLNAME]
        for lv in (SNAP1, VOLNAME):  # the top reads its first bytes from snap1
            sh("lvchange", "-aey", vg.lv_path(lv))
        assert qcow2_check(vg.lv_path(VOLNAME))["exit"] == 0
        for offset, length, pattern in guest.written:
            qemu_io(vg, VOLNAME, f"read -P {pattern:#x} {offset} {length}")
        print(f"MEASURED live stream delete: top {before[VOLNAME]} -> {expected} for the job,"
              f" {reduced} at the VM's stop (image end {end})")
