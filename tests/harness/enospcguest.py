"""The ENOSPC pause with a real guest device, for the node tier's tests that need one.

A VM whose writer guest (tests/harness/guest_writer.asm, through
tests/harness/writerguest.py) writes through a virtio-blk disk with
``werror=enospc`` onto a qcow2 on a thin LV that is too small, so QEMU pauses
it on ``nospace``: :func:`writer_vm` builds it (the image prefilled until it
ends ~1.7 MiB short of the LV's end, QEMU started with ``-S``),
:func:`run_guest_until_paused` lets it run into the pause, and
:func:`assert_resumed_and_written` and :func:`assert_image_holds` check that
pvestord resumed it and that every byte arrived. test_enospc_guest.py says
why the disk is virtio-blk and how the pause is made deterministic.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pvestord.adapters.queue import Entry
from pvestord.policy import Reason
from pvestord.policy.sizes import align_up
from tests.harness.daemonlog import extensions
from tests.harness.daemons import NodeBed
from tests.harness.lvmbed import VG, GiB, MiB, image_end_offset, qcow2_check, qcow2_create
from tests.harness.polling import wait_until
from tests.harness.qemu import Pve9Disk, QemuVM, image_io, pve9_disk
from tests.harness.writerguest import WriterGuest

LV_SIZE = 64 * MiB
VIRTUAL = 1 * GiB
#: Filled by the harness before the guest runs: the qcow2 then ends ~1.7 MiB
#: (its metadata is ~320 KiB) short of the LV's end.
PREFILL = 62 * MiB
PREFILL_PATTERN = 0x11
#: The guest's write, just past the filled region: more than the room left.
GUEST_WRITE = 3 * MiB
GUEST_PATTERN = 0x5A
CHUNKSIZE = 256 * MiB
EXTENT = 4 * MiB

#: Boot and writes until the pause, under TCG inside the emulated node.
PAUSE_TIMEOUT = 300.0
#: From pvestord's start (or SIGCONT) to the VM's RESUME.
RESUME_TIMEOUT = 120.0
#: From the RESUME to the guest's last byte on the debug port.
FINISH_TIMEOUT = 300.0
#: qemu-io over tens of MiB under nested TCG.
IO_TIMEOUT = 180.0
#: A daemon's start-up (Python imports over 9p) with other node guests busy on
#: the same two cores: 30 s was seen to be too short.
DAEMON_START_TIMEOUT = 180.0
#: How long "Proxmox" holds the storage lock while a guest waits paused.
PROXMOX_HOLD = 25.0
#: QEMU's QMP socket under the same load.
LAUNCH_TIMEOUT = 120.0


# -- the VM ---------------------------------------------------------------------

def writer_vm(bed: NodeBed, vg: VG, vmid: int, guest: WriterGuest, *,
              lv_size: int = LV_SIZE, prefilled: int = PREFILL,
              extra_args: tuple[str, ...] = ()) -> tuple[QemuVM, str, int]:
    """A VM with the writer guest and a qcow2 on a new LV, its first
    ``prefilled`` bytes written (:func:`prefill`); daemonized and started
    with -S. Returns the VM, its LV and the room the image leaves on it."""
    lv = f"vm-{vmid}-disk-0.qcow2"
    path = vg.create_lv(lv, lv_size)
    qcow2_create(path, VIRTUAL)
    room = prefill(path, prefilled, lv_size)
    disk = thin_disk(path, lv, 0)
    vm = QemuVM(vmid, bed.run_dir, disks=[disk], machine="pc",
                event_socket=bed.event_socket, log_path=bed.logs / f"qemu-{vmid}.log",
                extra_args=["-S", *guest.args(disk.top_node), *extra_args],
                launch_timeout=LAUNCH_TIMEOUT)
    return vm, lv, room


def thin_disk(path: str, lv: str, index: int) -> Pve9Disk:
    """The volume as Proxmox VE 9 attaches it as ``virtio<index>``: a throttle
    node over the qcow2 node ``f<hash>`` over the host_device ``e<hash>``."""
    return Pve9Disk.for_volume(path, f"thin1:{lv}", f"virtio{index}")


def reporting_disk(vg: VG, vmid: int) -> Pve9Disk:
    """A second thin disk, for a device that hands ENOSPC to the guest
    (:func:`reporting_device`), with headroom enough for its threshold to be
    armed without an extension."""
    lv = f"vm-{vmid}-disk-1.qcow2"
    path = vg.create_lv(lv, 2 * CHUNKSIZE)
    qcow2_create(path, VIRTUAL)
    return thin_disk(path, lv, 1)


def reporting_device(disk: Pve9Disk) -> tuple[str, ...]:
    return (*disk.args(),
            "-device", f"virtio-blk-pci,drive={disk.top_node},id=data1,werror=report")


# -- observations ----------------------------------------------------------------

def allocation(vm: QemuVM) -> int:
    """``wr_highest_offset`` of the LV's file node: where the image ends."""
    for entry in vm.qmp("query-blockstats", query_nodes=True):
        if entry.get("node-name") == pve9_disk(vm).file_block_node:
            return int(entry["stats"]["wr_highest_offset"])
    raise AssertionError("no blockstats for the data disk's file node")


def prefill(path: str, length: int, lv_size: int) -> int:
    """Fill the image from 0; return the room left on the LV."""
    image_io(path, f"write -P {PREFILL_PATTERN:#x} 0 {length}", timeout=IO_TIMEOUT)
    room = lv_size - image_end_offset(path)
    # The scenario's premise: the guest's write cannot fit, and fills what fits first.
    assert 512 * 1024 <= room <= 2 * MiB, room
    assert room < GUEST_WRITE
    return room


def attached_to(entry: dict[str, Any], qdev_id: str) -> bool:
    """Whether a query-block(stats) entry belongs to the device ``qdev_id``.

    QEMU names the device by its id when the BlockBackend's own device has
    one (ide-hd), else by QOM path: a virtio-blk-pci's BlockBackend hangs off
    the proxy's inner device, ``/machine/peripheral/<id>/virtio-backend``.
    """
    qdev = str(entry.get("qdev", ""))
    return qdev == qdev_id or qdev.startswith(f"/machine/peripheral/{qdev_id}/")


def device(vm: QemuVM, qdev_id: str) -> dict[str, Any]:
    for dev in vm.qmp("query-block"):
        if attached_to(dev, qdev_id):
            return dict(dev)
    raise AssertionError(f"no block device {qdev_id}")


def device_stats(vm: QemuVM, qdev_id: str) -> dict[str, Any]:
    for entry in vm.qmp("query-blockstats"):
        if attached_to(entry, qdev_id):
            return dict(entry["stats"])
    raise AssertionError(f"no blockstats for {qdev_id}")


def extended_size(paused_allocation: int) -> int:
    """One chunk past the LV or the allocation, in whole extents (the policy's
    target). The allocation may already be past the LV's end: QEMU counts the
    failed write in ``wr_highest_offset``."""
    return align_up(max(LV_SIZE, paused_allocation) + CHUNKSIZE, EXTENT)


def assert_no_second_extension(bed: NodeBed, vm: QemuVM, vg: VG, lv: str, size: int) -> None:
    """Once the VM runs again, another pass over the drive must leave it alone
    (it has a chunk of headroom), whatever io-status QEMU still shows."""
    bed.queue.append([Entry(vm.vmid, pve9_disk(vm).file_block_node, Reason.THRESHOLD,
                            origin=bed.node)])
    wait_until(lambda: bed.entries() == [], 120, "the extra entry handled")
    assert vg.lv_size(lv) == size


def assert_extended_once(log: str, vmid: str, node: str, lv: str, size: int) -> None:
    """One extension in ``log``, of VM ``vmid``'s ``node`` on ``lv``, from the
    test's 64 MiB LV to ``size``: the pause was answered in one step."""
    [grown] = extensions(log)
    assert (grown.fields["VMID"], grown.fields["BLOCK_NODE"], grown.fields["LV"]) == \
        (vmid, node, lv), grown
    assert (int(grown.fields["OLD_SIZE"]), int(grown.fields["NEW_SIZE"])) == \
        (LV_SIZE, size), grown


def timestamp(event: dict[str, Any]) -> float:
    ts = event["timestamp"]
    return float(ts["seconds"]) + float(ts["microseconds"]) / 1e6


def run_guest_until_paused(vm: QemuVM, guest: WriterGuest) -> dict[str, Any]:
    """``cont`` the -S VM; return the STOP event of its ENOSPC pause."""
    assert vm.qmp("query-status")["status"] == "prelaunch"
    vm.qmp("cont")
    vm.wait_event("RESUME", timeout=30)
    error = vm.wait_event("BLOCK_IO_ERROR", timeout=PAUSE_TIMEOUT)
    # A guest device's request (the harness's qemu-io never stops a VM), on the
    # device's root node, failed with ENOSPC, and the device's werror stopped the VM.
    assert error["data"]["node-name"] == pve9_disk(vm).top_node, error
    assert error["data"]["operation"] == "write", error
    assert error["data"]["action"] == "stop", error
    assert error["data"]["nospace"] is True, error
    stop = vm.wait_event("STOP", timeout=30)
    status = vm.qmp("query-status")
    assert (status["status"], status["running"]) == ("io-error", False), status
    assert device(vm, "data0")["io-status"] == "nospace"
    assert device(vm, "boot")["io-status"] == "ok"
    out = guest.output()
    assert out.startswith("G") and "S" not in out and "F" not in out, out
    # The guest got part of its write in before the LV was full.
    assert device_stats(vm, "data0")["wr_bytes"] > 0
    return stop


def assert_resumed_and_written(vm: QemuVM, guest: WriterGuest) -> dict[str, Any]:
    """Wait for pvestord's ``cont``; check the guest's write completed; return RESUME."""
    resume = vm.wait_event("RESUME", timeout=RESUME_TIMEOUT)
    out = guest.wait_finished(FINISH_TIMEOUT)
    assert out == guest.success, out
    status = vm.qmp("query-status")
    assert (status["status"], status["running"]) == ("running", True), status
    # Not checked: io-status. QEMU 7.2's ``cont`` resets it only on
    # monitor-owned (-drive) BlockBackends; a -blockdev device such as
    # qemu-server's keeps "nospace" while the VM runs again.
    # Every guest byte went through the guest device's BlockBackend.
    assert device_stats(vm, "data0")["wr_bytes"] >= guest.length
    return resume


def assert_image_holds(vg: VG, lv: str, guest: WriterGuest, *, prefilled: int) -> None:
    """Once QEMU has quit: every byte the harness and the guest wrote reads
    back, and the image is consistent."""
    path = vg.lv_path(lv)
    image_io(path, f"read -P {guest.pattern:#x} {guest.start} {guest.length}",
             timeout=IO_TIMEOUT)
    image_io(path, f"read -P {PREFILL_PATTERN:#x} 0 {prefilled}", timeout=IO_TIMEOUT)
    assert qcow2_check(path)["exit"] == 0


def record(out_dir: Path, name: str, figures: dict[str, float]) -> None:
    path = out_dir.parent / "enospc-figures.json"
    data = json.loads(path.read_text()) if path.exists() else {}
    data[name] = {k: round(v, 3) for k, v in figures.items()}
    path.write_text(json.dumps(data, indent=2) + "\n")
