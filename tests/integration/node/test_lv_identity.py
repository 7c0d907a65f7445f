"""A drive is bound to the LV QEMU writes, not to its node's path (node guest).

Proxmox's live snapshot renames the disk's LV to ``snap_...`` under the
running QEMU and makes a new LV under the disk's name before QEMU reopens
anything (qemu-server's ``blockdev_external_snapshot``, with the VM's config
at ``lock: snapshot`` all along). A guest that fills its LV in that window
pauses on ENOSPC in the renamed LV, while its node's path names the new one.

Real parts: Proxmox's own ``PVE::Storage::volume_snapshot`` on a loop VG
(tests/harness/pvestorage.py), a real guest writing through a virtio-blk
device with ``werror=enospc`` (tests/harness/writerguest.py), QEMU with
Proxmox VE 9's block graph, both daemons. The VM config is a file in the
bed's nodes folder, as qemu-server writes it on pmxcfs.
"""

from __future__ import annotations

from pathlib import Path

from tests.harness.daemonlog import extensions
from tests.harness.daemons import daemons
from tests.harness.lvmbed import MiB
from tests.harness.polling import wait_until
from tests.harness.pvestorage import (
    CHUNK,
    INITIAL,
    SNAP1,
    VMID,
    VOLID,
    VOLNAME,
    alloc_disk,
    daemons_bed,
    live_storage,
    lv_sizes,
    reopen_onto_snapshot,
    snapshot,
)
from tests.harness.qemu import Pve9Disk, QemuVM
from tests.harness.writerguest import build_writer
from tests.proxmox import upstream

#: More than INITIAL: the guest fills the renamed LV and pauses on ENOSPC.
GUEST_WRITE = 48 * MiB
GUEST_START = 512 * MiB
#: Daemons' start, then a pass: generous for a loaded 2-core machine under TCG.
DAEMON_START_TIMEOUT = 300.0
ARM_TIMEOUT = 180.0
WRITER_TIMEOUT = 600.0


def test_a_guest_paused_between_rename_and_reopen_is_grown_on_the_lv_qemu_writes(
        sources: upstream.Upstream, out_dir: Path, tmp_path: Path) -> None:
    with live_storage(sources, out_dir) as (pve, vg):
        alloc_disk(pve)
        bed = daemons_bed(sources, out_dir, tmp_path / "bed")
        bed.write_vm_config(VMID, VOLID)
        disk = Pve9Disk.for_volume(vg.lv_path(VOLNAME), VOLID)
        writer = build_writer(tmp_path, out_dir, "writer", start=GUEST_START,
                              length=GUEST_WRITE, pattern=0x5A)
        with daemons(bed, start_timeout=DAEMON_START_TIMEOUT) as (_, pvestord), \
                QemuVM(VMID, bed.run_dir, disks=[disk], machine="pc",
                       event_socket=bed.event_socket, log_path=out_dir / "qemu.log",
                       extra_args=["-S", *writer.args(disk.top_node)]) as vm:
            # The daemon's first pass arms the drive: it has seen the LV by name.
            armed = INITIAL - CHUNK // 2
            wait_until(lambda: vm.named_node(disk.file_block_node)["write_threshold"] == armed,
                       ARM_TIMEOUT, "the drive armed by the daemon")

            # qemu-server locks the config, then Proxmox renames the LV and
            # makes a new one under the disk's name; QEMU still writes the old.
            bed.write_vm_config(VMID, VOLID, lock="snapshot")
            snapshot(pve, "snap1")
            assert lv_sizes(vg) == {SNAP1: INITIAL, VOLNAME: INITIAL}
            vm.qmp("cont")
            assert writer.wait_finished(WRITER_TIMEOUT) == writer.success
            assert vm.qmp("query-status")["status"] == "running"

            # Every extension grew the LV QEMU writes.
            grown = extensions(pvestord.log_text(), VMID=str(VMID))
            assert grown, "nothing was grown, yet the guest wrote more than its LV held"
            assert {e.fields["LV"] for e in grown} == {SNAP1}
            sizes = lv_sizes(vg)
            assert sizes[VOLNAME] == INITIAL, "the new LV was grown"
            assert sizes[SNAP1] > INITIAL

            # QEMU reopens onto the renamed LV, qemu-server unlocks: the
            # daemon binds the new top by its name again and arms it.
            _, top = reopen_onto_snapshot(vm, vg, disk, "snap1")
            bed.write_vm_config(VMID, VOLID)
            wait_until(lambda: vm.named_node(top.file_block_node)["write_threshold"] == armed,
                       ARM_TIMEOUT, "the new top armed by the daemon")
            assert vm.read_verify(top.top_node, GUEST_START, GUEST_WRITE, 0x5A)
            assert lv_sizes(vg)[VOLNAME] == INITIAL
        assert extensions(pvestord.log_text(), VMID=str(VMID), LV=VOLNAME) == []
