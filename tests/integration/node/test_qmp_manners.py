"""pvestord shares each VM's QMP socket with qemu-server.

QEMU serves one client at a time on ``/var/run/qemu-server/<vmid>.qmp``, and
qemu-server gives each call 5 s, connect included (``PVE::QMPClient``); a
pvestord that held the socket across an LVM command, a lock wait or
``qemu-img`` would make ``qm`` calls, pvestatd and a migration's own QMP
calls time out. So a pass observes, leaves the socket, acts, and comes back
to arm.

The test runs real daemons on VMs started with Proxmox VE 9's block graph
(throttle over qcow2 ``f<hash>`` over host_device ``e<hash>``), while a
stand-in for qemu-server makes a call every 100 ms on each VM's socket:
20 extensions of a writing VM (10 in the quick set; each a write threshold
crossed, an ``lvextend``, a re-arm), and, on a second VM waiting in
``inmigrate``, LVs grown by "another node" that pvestord refreshes under the storage lock.

What must always hold is asserted, by order and count, never by a clock:
no LVM command for a VM's LV runs while pvestord holds that VM's socket (a
proxy on the socket path and the ``lvm_faulty`` wrapper's call log,
:class:`tests.harness.qmpproxy.LvmCallsInSessions`), every call of the
stand-in ends within qemu-server's own 5 s (a call past it fails in
``qm``), and every write reads back. How long the stand-in's calls waited
for the monitor is recorded beside (``qmp-manners.json``); how long
pvestord's sessions are, and so how long qemu-server can wait, is the
benchmark's figure (bench/qmp_sessions.py), where a loaded machine cannot
turn a test red. pvestord runs a process per LVM command
(``--no-lvm-shell``), its slowest LVM.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest

from tests.harness.daemons import NodeBed, daemons
from tests.harness.faultbed import CHUNK, HEADROOM, LV0, fault_bed, grow_elsewhere
from tests.harness.faults import LvmFaults
from tests.harness.lvmbed import VG, GiB, MiB, qcow2_check, qcow2_create
from tests.harness.polling import wait_until
from tests.harness.qemu import Pve9Disk, QemuVM
from tests.harness.qmpproxy import CountingQmpProxy, LvmCallsInSessions, QemuServerStandIn

WRITE = 1 * MiB
#: Extensions of the writer in the full node set, and in the quick set (where
#: each is about 12 s of the node tier's budget).
EXTENSIONS = 20
QUICK_EXTENSIONS = 10
#: Every this many extensions of the writer, the incoming VM's LV grows elsewhere.
CATCH_UP_EVERY = 4
#: A daemon's start-up and a first pass, or one extension, under TCG inside TCG.
SETTLE_TIMEOUT = 180.0


@pytest.fixture
def bed(vg: VG, tmp_path: Path, out_dir: Path) -> NodeBed:
    """The fault suite's storage: 32 MiB chunks, the threshold 16 MiB below the end."""
    return fault_bed(vg, tmp_path, out_dir)


def pve9_vm(bed: NodeBed, vg: VG, vmid: int, *extra_args: str) -> tuple[QemuVM, Pve9Disk, str]:
    lv = f"vm-{vmid}-disk-0.qcow2"
    qcow2_create(vg.create_lv(lv, LV0), 8 * GiB)
    disk = Pve9Disk.for_volume(vg.lv_path(lv), f"thin1:{lv}")
    vm = QemuVM(vmid, bed.run_dir, disks=[disk], event_socket=bed.event_socket,
                log_path=bed.logs / f"qemu-{vmid}.log", extra_args=list(extra_args),
                launch_timeout=120)
    return vm, disk, lv


def file_node(vm: QemuVM, disk: Pve9Disk) -> tuple[int, int]:
    """(write threshold, allocation) of the disk's file node."""
    threshold = int(vm.named_node(disk.file_block_node)["write_threshold"])
    for entry in vm.qmp("query-blockstats", query_nodes=True):
        if entry.get("node-name") == disk.file_block_node:
            return threshold, int(entry["stats"]["wr_highest_offset"])
    raise AssertionError(f"no blockstats for {disk.file_block_node}")


def armed_for(vm: QemuVM, disk: Pve9Disk, vg: VG, lv: str, size: int) -> bool:
    # The threshold first: a QMP call, where an lvs is a process under TCG
    # (polled every 100 ms, the test's own LVM load would starve the node).
    return file_node(vm, disk)[0] == size - HEADROOM and vg.lv_size(lv) == size


def test_qemu_servers_calls_never_wait_on_pvestord(bed: NodeBed, vg: VG, out_dir: Path,
                                                   faults: LvmFaults,
                                                   full_node_set: bool) -> None:
    extensions = EXTENSIONS if full_node_set else QUICK_EXTENSIONS
    writer, disk, lv = pve9_vm(bed, vg, 951)
    incoming, _, incoming_lv = pve9_vm(bed, vg, 952, "-incoming", "defer")
    written: list[tuple[int, int, int]] = []  # (offset, length, pattern)
    in_writer_sessions = LvmCallsInSessions(faults, [lv])
    in_incoming_sessions = LvmCallsInSessions(faults, [incoming_lv])
    with writer, incoming, \
            contextlib.closing(CountingQmpProxy(writer.qmp_path, in_writer_sessions)) as seen, \
            contextlib.closing(CountingQmpProxy(incoming.qmp_path, in_incoming_sessions)), \
            daemons(bed, pvestord_args=("--no-lvm-shell",)):
        assert incoming.qmp("query-status")["status"] == "inmigrate"
        wait_until(lambda: armed_for(writer, disk, vg, lv, LV0), SETTLE_TIMEOUT,
                   "the writer's first threshold armed")
        # pvestord's sessions go through the proxies; qemu-server's stand-ins
        # call QEMU's own sockets, where they wait on QEMU alone.
        with QemuServerStandIn(writer.qmp_path.with_name(writer.qmp_path.name + ".real")) \
                as on_writer, \
                QemuServerStandIn(incoming.qmp_path.with_name(incoming.qmp_path.name + ".real")) \
                as on_incoming:
            size, cursor, incoming_size = LV0, 0, LV0
            for number in range(extensions):
                # Cross the armed threshold, inside the headroom: no write can fail.
                start, pattern = cursor, number % 251 + 1
                with writer.io_session() as io:
                    while file_node(writer, disk)[1] <= size - HEADROOM:
                        io.write_pattern(disk.block_node, cursor, WRITE, pattern)
                        cursor += WRITE
                written.append((start, cursor - start, pattern))
                size += CHUNK
                wait_until(lambda s=size: armed_for(writer, disk, vg, lv, s), SETTLE_TIMEOUT,
                           f"extension {number + 1} to {size // MiB} MiB, re-armed")
                if number % CATCH_UP_EVERY == 0:
                    incoming_size += CHUNK
                    grow_elsewhere(vg, incoming_lv, incoming_size)
                    wait_until(lambda s=incoming_size: vg.device_size(incoming_lv) == s,
                               SETTLE_TIMEOUT, "the incoming VM's table refreshed")
        waits = on_writer.waits + on_incoming.waits
        figures = {"calls": len(on_writer.calls) + len(on_incoming.calls),
                   "longest_wait_s": round(max(waits), 3),
                   "writer_longest_wait_s": round(max(on_writer.waits), 3),
                   "incoming_longest_wait_s": round(max(on_incoming.waits), 3),
                   "longest_call_s": round(max(on_writer.calls + on_incoming.calls), 3),
                   "failures": on_writer.failures + on_incoming.failures,
                   "extensions": extensions,
                   "refreshes": -(-extensions // CATCH_UP_EVERY),
                   "pvestord_sessions_on_writer": seen.connections,
                   "lvm_calls_inside_sessions": in_writer_sessions.violations
                   + in_incoming_sessions.violations}
        (out_dir / "qmp-manners.json").write_text(json.dumps(figures, indent=2) + "\n")
        # The watch saw pvestord's sessions, and their LVM commands all ran outside.
        assert seen.connections >= extensions, figures
        assert faults.calls_naming(lv) and faults.calls_naming(incoming_lv), figures
        assert not figures["lvm_calls_inside_sessions"], figures
        assert not figures["failures"], figures
        # At 100 ms apart, each stand-in called hundreds of times meanwhile.
        assert min(len(on_writer.calls), len(on_incoming.calls)) >= extensions, figures
        assert vg.lv_size(lv) == LV0 + extensions * CHUNK
        with writer.io_session() as io:
            bad = [offset for offset, length, pattern in written
                   if not io.read_verify(disk.block_node, offset, length, pattern)]
        assert not bad, f"regions that do not read back: {bad}"
    assert qcow2_check(vg.lv_path(lv))["exit"] == 0
