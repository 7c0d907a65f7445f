"""ENOSPC pause and resume with a real guest device.

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

import pytest

from pvestord.adapters.queue import Entry
from pvestord.policy import Reason
from tests.harness.daemonlog import extensions, parse, records
from tests.harness.daemons import VENV_BIN, NodeBed, ThinStorageSpec, daemons
from tests.harness.enospcguest import (
    CHUNKSIZE,
    DAEMON_START_TIMEOUT,
    GUEST_PATTERN,
    GUEST_WRITE,
    LV_SIZE,
    PREFILL,
    PROXMOX_HOLD,
    allocation,
    assert_extended_once,
    assert_image_holds,
    assert_no_second_extension,
    assert_resumed_and_written,
    device,
    extended_size,
    record,
    reporting_device,
    reporting_disk,
    run_guest_until_paused,
    timestamp,
    writer_vm,
)
from tests.harness.lvmbed import VG, MiB, loop_vg
from tests.harness.polling import wait_until
from tests.harness.qemu import pve9_disk
from tests.harness.writerguest import build_writer

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
