"""ENOSPC pause and resume with a real guest device (issue 5).

A guest writes through a virtio-blk disk with ``werror=enospc`` whose qcow2
sits on a thin LV that is too small: QEMU pauses the VM with io-status
``nospace``, pvestord extends the LV and resumes the VM, and the guest's write
completes as if nothing happened. Elsewhere the writer is mostly the
``qemu-io`` tool on an NBD export of the node, whose write past the LV's end
fails instead of pausing the VM.

The guest is ``tests/harness/guest_writer.asm``, a boot sector that writes
one pattern with BIOS INT 13h (SeaBIOS -> virtio-blk -> QEMU's block layer,
so the device's error policy applies) and reports on the isa-debugcon port; a
Linux guest would take minutes to boot inside the emulated node.

Why virtio-blk and not IDE: the data disk was first an ``ide-hd`` (SeaBIOS
then writes by ATA PIO), and twice in about ten runs the guest's write that
was in flight across the pause failed with SeaBIOS's generic ATA error
(INT 13h status 0Ch) although pvestord had extended the LV and resumed the VM
correctly. That is QEMU's IDE PIO retry, not pvestord: ``ide_sector_write_cb``
clears BSY before ``ide_handle_rw_error`` asks for the stop, and on ``cont``
the vCPU runs again before ``ide_restart_bh`` resubmits the sector and sets
BSY once more, so a guest polling the status register can see "not busy, no
DRQ" in either window and give up. A virtio request is never completed to
the guest until it has been retried and succeeded, so there is no such
window; virtio (``virtio-scsi`` or ``virtio-blk``) is also what Proxmox VMs
use. docs/operations.md names the IDE PIO case for operators.

The VMs run as qemu-server starts them, with ``-daemonize``: the QEMU that
pvestord and qmeventd-py meet is no child of anything but init, known by its
pidfile. The harness writes the image with the ``qemu-io`` tool before the
launch and reads it back after the quit: while the guest runs, its device
holds the node's write permission.

How the pause is made deterministic: the harness fills the qcow2 until the
image ends ~1.7 MiB short of the LV's end; QEMU starts with ``-S``; then
``cont``, and the guest writes 3 MiB just past the filled region, so its
write must cross the LV's end.

Two ways pvestord meets the paused VM:

- it is not running when the VM pauses: its start reconcile must find the
  VM paused on ``nospace`` (no event exists for it) and extend and resume it;
- it runs, but the guest must outrun it: pvestord is held with SIGSTOP after
  its reconcile armed the threshold, and released (SIGCONT) once QEMU has
  paused and qmeventd-py has queued the ``nospace`` entry. Racing a writer
  against the daemon would make the pause depend on the emulator's speed;
  SIGSTOP makes it certain, and shows both events going through the queue.

And the negative: a VM paused on ENOSPC on a qcow2 whose LV belongs to no
thin storage is never resumed.

Figures (the pause as QEMU's STOP and RESUME event timestamps say) are
written to ``<out_dir>/enospc-figures.json``.
"""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pvestord.adapters.queue import Entry
from pvestord.policy import Reason
from pvestord.policy.sizes import align_up
from tests.harness.daemonlog import extensions, parse, records
from tests.harness.daemons import VENV_BIN, NodeBed, ThinStorageSpec, daemons
from tests.harness.lvmbed import VG, GiB, MiB, image_end_offset, loop_vg, qcow2_check, qcow2_create
from tests.harness.polling import wait_until
from tests.harness.qemu import Pve9Disk, QemuVM, image_io, pve9_disk
from tests.harness.writerguest import WriterGuest, build_writer

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


# -- fixtures --------------------------------------------------------------------

@pytest.fixture
def bed(vg: VG, tmp_path: Path, out_dir: Path) -> NodeBed:
    return NodeBed(tmp_path, [ThinStorageSpec("thin1", vg.name)], logs_dir=out_dir)


@pytest.fixture
def other_vg() -> Iterator[VG]:
    """A VG that no storage names: its LVs are not thin."""
    with loop_vg(512 * MiB, prefix="pvn") as unmanaged:
        yield unmanaged


# -- tests -----------------------------------------------------------------------

def test_start_reconcile_resumes_a_vm_paused_on_enospc(
        bed: NodeBed, vg: VG, tmp_path: Path, out_dir: Path) -> None:
    guest = build_writer(tmp_path, out_dir, "writer-901", start=PREFILL, length=GUEST_WRITE,
                         pattern=GUEST_PATTERN)
    vm, lv, room = writer_vm(bed, vg, 901, guest)
    with vm:
        stop = run_guest_until_paused(vm, guest)
        assert vg.lv_size(lv) == LV_SIZE
        expected = extended_size(allocation(vm))
        started = time.time()
        with daemons(bed, start_timeout=DAEMON_START_TIMEOUT) as (_, pvestord):
            resume = assert_resumed_and_written(vm, guest)
            record(out_dir, "start_reconcile", {
                "room_before_pause_mib": room / MiB,
                "stop_to_resume_s": timestamp(resume) - timestamp(stop),
                "daemons_start_to_resume_s": timestamp(resume) - started,
            })
            assert vg.lv_size(lv) == expected
            assert vg.device_size(lv) == expected
            pvestord.wait_record("the resume", 30, VMID="901", RESUMED="nospace")
            assert_no_second_extension(bed, vm, vg, lv, expected)
            log = pvestord.log_text()
        assert_extended_once(log, "901", pve9_disk(vm).file_block_node, lv, expected)
        assert len(records(log, VMID="901", RESUMED="nospace")) == 1
    assert_image_holds(vg, lv, guest, prefilled=PREFILL)


def test_running_daemons_resume_a_vm_that_outran_them(
        vg: VG, tmp_path: Path, out_dir: Path) -> None:
    # Half a chunk of headroom would have the start reconcile extend a 64 MiB
    # LV at once; ~1 MiB of headroom arms a threshold above the filled image.
    spec = ThinStorageSpec("thin1", vg.name, chunk_percentage=0.004)
    bed = NodeBed(tmp_path, [spec], logs_dir=out_dir)
    threshold = LV_SIZE - -(-CHUNKSIZE * 4 // 1000)
    guest = build_writer(tmp_path, out_dir, "writer-902", start=PREFILL, length=GUEST_WRITE,
                         pattern=GUEST_PATTERN)
    with daemons(bed, start_timeout=DAEMON_START_TIMEOUT) as (qmeventd, pvestord):
        vm, lv, room = writer_vm(bed, vg, 902, guest)
        assert LV_SIZE - room < threshold
        with vm:
            # The daemonized QEMU, not the process the harness started.
            qmeventd.wait_record("QEMU's connection", 60, VMID="902", QEMU_PID=str(vm.pid),
                                 QMP_SESSION="connected")
            disk = pve9_disk(vm)
            wait_until(lambda: vm.named_node(disk.file_block_node)["write_threshold"]
                       == threshold, 60,
                       "threshold armed by pvestord's reconcile")
            pvestord.proc.send_signal(signal.SIGSTOP)
            try:
                stop = run_guest_until_paused(vm, guest)
                vm.wait_event("BLOCK_WRITE_THRESHOLD", timeout=5)  # crossed on the way
                qmeventd.wait_record("the ENOSPC queued", 60, VMID="902", ENTRY="queued",
                                     BLOCK_NODE=disk.top_node, REASON="nospace")
                assert {(e.block_node, e.reason) for e in bed.entries()} == {
                    (disk.file_block_node, Reason.THRESHOLD), (disk.top_node, Reason.NOSPACE)}
                assert vg.lv_size(lv) == LV_SIZE
                expected = extended_size(allocation(vm))
            finally:
                released = time.time()
                pvestord.proc.send_signal(signal.SIGCONT)
            resume = assert_resumed_and_written(vm, guest)
            record(out_dir, "running_daemons", {
                "room_before_pause_mib": room / MiB,
                "stop_to_resume_s": timestamp(resume) - timestamp(stop),
                "sigcont_to_resume_s": timestamp(resume) - released,
            })
            assert vg.lv_size(lv) == expected
            wait_until(lambda: bed.entries() == [], 60, "queue drained")
            pvestord.wait_record("the resume", 30, VMID="902", RESUMED="nospace")
            # Re-armed for the bigger LV, above the guest's write.
            assert vm.named_node(disk.file_block_node)["write_threshold"] == \
                expected - (LV_SIZE - threshold)
            assert_no_second_extension(bed, vm, vg, lv, expected)
            log = pvestord.log_text()
    assert_extended_once(log, "902", disk.file_block_node, lv, expected)
    assert len(records(log, VMID="902", RESUMED="nospace")) == 1
    assert_image_holds(vg, lv, guest, prefilled=PREFILL)


@contextlib.contextmanager
def proxmox_holding_the_storage_lock(storeid: str, release: Path) -> Iterator[None]:
    """The storage's lock held by another process, as Proxmox's ``vdisk_alloc``
    holds it (here the flock of a non-pmxcfs node, which the daemon then
    takes), until ``release`` exists."""
    lock = f"/var/lock/pve-manager/pve-storage-{storeid}"
    script = ("import fcntl, os, sys, time\n"
              "os.makedirs(os.path.dirname(sys.argv[1]), exist_ok=True)\n"
              "f = open(sys.argv[1], 'a'); fcntl.flock(f, fcntl.LOCK_EX)\n"
              "print('held', flush=True)\n"
              "while not os.path.exists(sys.argv[2]): time.sleep(0.05)\n")
    holder = subprocess.Popen([sys.executable, "-c", script, lock, str(release)],  # noqa: S603
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        yield
    finally:
        release.touch()
        holder.wait(timeout=30)


def test_a_paused_vm_runs_once_proxmox_lets_go_of_the_storage_lock(
        bed: NodeBed, vg: VG, tmp_path: Path, out_dir: Path) -> None:
    """Proxmox holds ``storage-<id>`` for a whole allocation. A guest paused on
    ENOSPC meanwhile is extended as the lock comes free: the daemon waits it
    out (never a give-up and a retry later), so the pause ends one extension
    after the release.

    The VM has a second thin disk whose device has ``werror=report``: it
    would hand ENOSPC to the guest, so the daemon warns once (``WERROR``)
    and ``drives`` marks it; the writer's disk (werror's default) is not."""
    guest = build_writer(tmp_path, out_dir, "writer-903", start=PREFILL, length=GUEST_WRITE,
                         pattern=GUEST_PATTERN)
    reporting = reporting_disk(vg, 903)
    vm, lv, _ = writer_vm(bed, vg, 903, guest, extra_args=reporting_device(reporting))
    release = tmp_path / "release-storage-lock"
    with vm:
        stop = run_guest_until_paused(vm, guest)
        expected = extended_size(allocation(vm))
        with proxmox_holding_the_storage_lock("thin1", release), \
                daemons(bed) as (_, pvestord):
            # The start reconcile found the VM paused and waits on the lock:
            # the scenario is Proxmox's hold, so its length is set, not awaited.
            time.sleep(PROXMOX_HOLD)
            assert vg.lv_size(lv) == LV_SIZE
            release.touch()
            released = time.time()
            resume = assert_resumed_and_written(vm, guest)
            wait_until(lambda: any("NEW_SIZE" in line.fields
                                   for line in parse(pvestord.log_text())), 30,
                     "the extension logged")
            lines = list(parse(pvestord.log_text()))
            report = json.loads(subprocess.run(  # noqa: S603 - argument list
                [str(VENV_BIN / "pvestord"), "--queue", str(bed.queue_path), "drives", "--json",
                 "--storage-config", str(bed.storage_cfg), "--run-dir", str(bed.run_dir)],
                capture_output=True, text=True, timeout=120, check=True).stdout)
        problems = {row["block_node"]: row["problem"] for row in report}
        reported = reporting.file_block_node
        assert problems[pve9_disk(vm).file_block_node] is None
        assert problems[reported] is not None and "werror=report" in problems[reported]
        warned = [line.fields for line in lines if "WERROR" in line.fields]
        assert [(w["VMID"], w["BLOCK_NODE"], w["WERROR"]) for w in warned] == [
            ("903", reported, "report")]
        extension = next(line.fields for line in lines if "NEW_SIZE" in line.fields)
        errors = [line for line in lines if line.level == "ERROR"]
        record(out_dir, "storage_lock_held", {
            "hold_s": PROXMOX_HOLD,
            "stop_to_resume_s": timestamp(resume) - timestamp(stop),
            "release_to_resume_s": timestamp(resume) - released,
            "lock_wait_s": int(extension["LOCK_WAIT_MS"]) / 1000,
        })
        # The extension waited for the lock, and nothing gave up meanwhile.
        assert int(extension["LOCK_WAIT_MS"]) >= PROXMOX_HOLD * 1000 / 2
        assert errors == [], [e.message for e in errors]
        # The pause ended with the one extension made once the lock was free:
        # no give-up and retry later (how long that took is the figure above).
        assert timestamp(resume) >= released
        writer_extensions = [line for line in lines if "NEW_SIZE" in line.fields
                             and line.fields["BLOCK_NODE"] == extension["BLOCK_NODE"]]
        assert len(writer_extensions) == 1, [line.message for line in writer_extensions]
        assert vg.lv_size(lv) == expected
    assert_image_holds(vg, lv, guest, prefilled=PREFILL)


def test_vm_paused_on_enospc_off_thin_storage_is_not_resumed(
        bed: NodeBed, other_vg: VG, tmp_path: Path, out_dir: Path) -> None:
    lv_size = 16 * MiB
    prefilled = lv_size - 2 * MiB
    guest = build_writer(tmp_path, out_dir, "writer-903", start=prefilled,
                         length=GUEST_WRITE, pattern=GUEST_PATTERN)
    with daemons(bed, start_timeout=DAEMON_START_TIMEOUT) as (qmeventd, pvestord):
        vm, lv, _ = writer_vm(bed, other_vg, 903, guest, lv_size=lv_size,
                              prefilled=prefilled)
        with vm:
            qmeventd.wait_record("QEMU's connection", 60, VMID="903", QEMU_PID=str(vm.pid),
                                 QMP_SESSION="connected")
            run_guest_until_paused(vm, guest)
            top = pve9_disk(vm).top_node
            qmeventd.wait_record("the ENOSPC queued", 60, VMID="903", ENTRY="queued",
                                 BLOCK_NODE=top, REASON="nospace")
            # pvestord took the entry and did nothing with it, and a second
            # pass after it did nothing either...
            wait_until(lambda: bed.entries() == [], 60, "the nospace entry handled")
            bed.queue.append([Entry(vm.vmid, top, Reason.NOSPACE, origin=bed.node)])
            wait_until(lambda: bed.entries() == [], 60, "a second pass over the VM")
            # ...and the VM stays paused: its disk is on no thin storage.
            status = vm.qmp("query-status")
            assert (status["status"], status["running"]) == ("io-error", False), status
            assert device(vm, "data0")["io-status"] == "nospace"
            assert other_vg.lv_size(lv) == lv_size
            assert "S" not in guest.output()
            assert not [e for e in vm.events() if e.get("event") == "RESUME"]
            log = pvestord.log_text()
    assert records(log, VMID="903", RESUMED="nospace") == []
    assert extensions(log) == []
