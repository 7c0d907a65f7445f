"""A running VM's thick copy target reduced under it: real pvestord, QEMU and LVM.

A live move disk or a migration with local disks leaves the VM running on a
thick LV tagged ``pvestord-copy`` (the mirror's target). The daemon's
reconcile pass pauses the VM for a moment, reduces the LV to its data plus a
chunk, re-arms the threshold and resumes it (pvestord/engine/livereduce.py).
The VMs here stand where such a mirror leaves them: a disk on a tagged LV at
its maximum, holding what the mirror wrote, with Proxmox VE 9's block graph.
What is asserted: the LV's size, the tag, the threshold, the VM running,
every byte written before and after, the image clean; the VM never left
paused, neither by a daemon killed in its pause nor when the reduction waits
for a job.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pvestord.adapters import pausemarks, vghealth
from pvestord.policy.capacity import COPY_TAG
from tests.harness.daemonlog import records
from tests.harness.daemons import Daemon, NodeBed, ThinStorageSpec, daemons
from tests.harness.faultbed import node
from tests.harness.faults import LvmFaults, kill_unit
from tests.harness.lvmbed import (
    VG,
    GiB,
    MiB,
    measured_maximum,
    qcow2_check,
    qcow2_create,
    sh,
)
from tests.harness.pacedwrite import EXTEND_TIMEOUT, paced_write
from tests.harness.polling import wait_until
from tests.harness.qemu import Pve9Disk, QemuVM, pve9_disk
from tests.harness.thinvm import file_node, fmt_node, thin_vm

#: Where the daemon under test notes its pauses (its default VG marks' folder).
PAUSE_NOTES = pausemarks.folder_beside(vghealth.DEFAULT_DIR)
CHUNK = 256 * MiB
#: What the mirror copied into the target before the VM went on running on it.
MIRRORED = 300 * MiB


@pytest.fixture
def bed(vg: VG, tmp_path: Path, out_dir: Path) -> NodeBed:
    return NodeBed(tmp_path, [ThinStorageSpec("thin1", vg.name)], logs_dir=out_dir)


def status(vm: QemuVM) -> str:
    return str(vm.qmp("query-status")["status"])


def mirrored_vm(bed: NodeBed, vg: VG, vmid: int) -> tuple[QemuVM, str, int]:
    """A VM on a thick copy target, at the image's maximum and tagged, as a
    mirror leaves it (the test writes what the mirror copied): (the VM, not
    launched yet; its LV; the LV's size)."""
    virtual = 2 * GiB
    maximum = measured_maximum(virtual, vg.extent_size())
    lv = f"vm-{vmid}-disk-0.qcow2"
    vm = thin_vm(bed, vg, vmid, lv_size=maximum, virtual=virtual)
    sh("lvchange", "--addtag", COPY_TAG, f"{vg.name}/{lv}")
    return vm, lv, maximum


def assert_reduced(vg: VG, lv: str, maximum: int) -> int:
    """The LV holds the mirrored data plus a chunk, in whole extents; untagged."""
    size = vg.lv_size(lv)
    assert COPY_TAG not in vg.lv_tags(lv)
    # The image's end is the data plus its qcow2 metadata (a few MiB).
    assert MIRRORED + CHUNK <= size <= MIRRORED + CHUNK + 8 * MiB < maximum
    assert size % vg.extent_size() == 0
    return size


def assert_holds(vm: QemuVM, pattern: int, start: int = 0, length: int = MIRRORED) -> None:
    """Every byte of ``length`` from ``start`` reads back as ``pattern``."""
    for offset in range(start, start + length, 100 * MiB):
        assert vm.read_verify(fmt_node(vm), offset, 100 * MiB, pattern), offset


def assert_resumed_then_reduced(vm: QemuVM, vg: VG, lv: str, maximum: int,
                                pvestord: Daemon) -> None:
    """A pause of pvestord's found noted is ended by ``pvestord``'s first
    pass over the VM, and the reduction follows."""
    wait_until(lambda: status(vm) == "running", EXTEND_TIMEOUT, f"VM {vm.vmid} resumed")
    wait_until(lambda: COPY_TAG not in vg.lv_tags(lv), EXTEND_TIMEOUT,
               "the copy target reduced")
    assert_reduced(vg, lv, maximum)
    assert records(pvestord.log_text(), "WARNING", VMID=str(vm.vmid),
                   LIVE_REDUCTION="resumed")
    assert pausemarks.noted(PAUSE_NOTES, vm.vmid, vm.pid) is pausemarks.Note.NONE


def test_a_mirrors_thick_target_is_reduced_under_its_running_vm(bed: NodeBed, vg: VG) -> None:
    vm, lv, maximum = mirrored_vm(bed, vg, 601)
    with vm:
        assert vm.write_pattern(fmt_node(vm), 0, MIRRORED, 0x3C, timeout=300).ok
        with daemons(bed) as (_, pvestord):
            wait_until(lambda: COPY_TAG not in vg.lv_tags(lv), EXTEND_TIMEOUT,
                       "the copy target reduced")
            size = assert_reduced(vg, lv, maximum)
            assert status(vm) == "running"
            assert pausemarks.noted(PAUSE_NOTES, 601, vm.pid) is pausemarks.Note.NONE
            # Re-armed for the new end, half a chunk below it.
            assert vm.named_node(file_node(vm))["write_threshold"] == size - CHUNK // 2
            (done,) = records(pvestord.log_text(), "INFO", VMID="601", LIVE_REDUCTION="done")
            assert (int(done.fields["OLD_SIZE"]), int(done.fields["NEW_SIZE"])) == (maximum,
                                                                                   size)
            assert_holds(vm, 0x3C)
            # The guest writes on past the reduced end: the LV grows again.
            outcome = paced_write(vm, fmt_node(vm), MIRRORED, 400 * MiB, 0x3D)
            assert outcome.errors == []
            wait_until(lambda: bed.entries() == [], EXTEND_TIMEOUT, "queue drained")
            assert vg.lv_size(lv) > size
            assert_holds(vm, 0x3C)
            assert_holds(vm, 0x3D, MIRRORED, 400 * MiB)
            # Reduced once: the tag went with the reduction.
            assert len(records(pvestord.log_text(), VMID="601", LIVE_REDUCTION="done")) == 1
    assert qcow2_check(vg.lv_path(lv))["exit"] == 0


def test_a_live_move_disk_lands_thin_under_both_daemons(bed: NodeBed, vg: VG) -> None:
    """The whole flow, as qemu-server runs a live move disk: the target, a
    tagged LV at the maximum, added under the disk's throttle node and
    mirrored into with ``replaces`` (BlockJob.pm ``blockdev_mirror``), the
    job completed; both daemons run throughout. After it, the VM's disk is
    the target's new nodes, which no pass knew before, and the next
    reconcile reduces it."""
    virtual = 2 * GiB
    source = "vm-606-disk-0.qcow2"
    target = "vm-606-disk-1.qcow2"
    with thin_vm(bed, vg, 606, virtual=virtual) as vm, \
            daemons(bed, pvestord_args=("--reconcile-interval", "5")):
        outcome = paced_write(vm, fmt_node(vm), 0, MIRRORED, 0x66)
        assert outcome.errors == []
        maximum = measured_maximum(virtual, vg.extent_size())
        qcow2_create(vg.create_lv(target, maximum), virtual)
        sh("lvchange", "--addtag", COPY_TAG, f"{vg.name}/{target}")
        disk = Pve9Disk.for_volume(vg.lv_path(target), f"thin1:{target}", "scsi1")
        vm.qmp("blockdev-add", disk.format_blockdev())
        vm.qmp("blockdev-mirror", {"job-id": "mirror-drive-scsi0",
                                   "device": pve9_disk(vm).top_node,
                                   "target": disk.block_node, "sync": "full",
                                   "replaces": fmt_node(vm)})
        assert vm.run_job_to_completion("mirror-drive-scsi0", timeout=600)
        wait_until(lambda: COPY_TAG not in vg.lv_tags(target), EXTEND_TIMEOUT,
                   "the new disk reduced")
        assert_reduced(vg, target, maximum)
        assert status(vm) == "running"
        assert vm.named_node(disk.file_block_node)["write_threshold"] == (
            vg.lv_size(target) - CHUNK // 2)
        for offset in range(0, MIRRORED, 100 * MiB):
            assert vm.read_verify(disk.block_node, offset, 100 * MiB, 0x66), offset
    assert qcow2_check(vg.lv_path(target))["exit"] == 0
    assert qcow2_check(vg.lv_path(source))["exit"] == 0


def test_a_copy_target_with_nothing_to_give_back_is_untagged_without_a_pause(
        bed: NodeBed, vg: VG) -> None:
    """A tagged LV no larger than what QEMU wrote plus a chunk (a merge
    target that needed little room) cannot be reduced: the daemon drops the
    tag and never pauses the guest."""
    with thin_vm(bed, vg, 607) as vm:
        lv = "vm-607-disk-0.qcow2"
        sh("lvchange", "--addtag", COPY_TAG, f"{vg.name}/{lv}")
        vm.qmp("query-status")  # the harness's monitor now collects events
        with daemons(bed) as (_, pvestord):
            wait_until(lambda: COPY_TAG not in vg.lv_tags(lv), EXTEND_TIMEOUT,
                       "the copy target untagged")
            assert records(pvestord.log_text(), "INFO", VMID="607",
                           LIVE_REDUCTION="untagged")
            wait_until(lambda: vm.named_node(file_node(vm))["write_threshold"] > 0,
                       EXTEND_TIMEOUT, "armed as any thin disk")
        assert vg.lv_size(lv) == 256 * MiB
        assert status(vm) == "running"
        assert [e["event"] for e in vm.events() if e["event"] in ("STOP", "RESUME")] == []


def test_a_pause_left_by_a_killed_daemon_is_resumed_and_no_other(bed: NodeBed, vg: VG) -> None:
    """VM 602 is as a daemon killed between its ``stop`` and its ``cont``
    leaves it: paused, with the note written before the stop. VM 603 was
    paused by someone else (no note): the next daemon resumes 602, reduces
    its LV, and leaves 603 paused."""
    vm, lv, maximum = mirrored_vm(bed, vg, 602)
    other = thin_vm(bed, vg, 603, index=1)
    with vm, other:
        assert vm.write_pattern(fmt_node(vm), 0, MIRRORED, 0x4E, timeout=300).ok
        pausemarks.note(PAUSE_NOTES, 602, vm.pid)
        vm.qmp("stop")
        other.qmp("stop")
        with daemons(bed) as (_, pvestord):
            assert_resumed_then_reduced(vm, vg, lv, maximum, pvestord)
            # VM 603's reconcile ran (it armed its threshold) and left it paused.
            wait_until(lambda: other.named_node(file_node(other))["write_threshold"] > 0,
                       EXTEND_TIMEOUT, "VM 603 reconciled")
            assert status(other) == "paused"
            assert_holds(vm, 0x4E)
    assert qcow2_check(vg.lv_path(lv))["exit"] == 0


def test_no_pause_while_a_job_runs_or_the_config_is_locked(bed: NodeBed, vg: VG) -> None:
    """A block job writes on while the guest is paused, so the reduction
    waits for the VM's jobs to end: here a mirror out of the disk, left
    ready (as a move disk's mirror is until qemu-server completes it). Then
    it waits for qemu-server's lock on the config to go."""
    vm, lv, maximum = mirrored_vm(bed, vg, 604)
    with vm:
        assert vm.write_pattern(fmt_node(vm), 0, MIRRORED, 0x5F, timeout=300).ok
        vm.qmp("blockdev-add", {"driver": "null-co", "node-name": "elsewhere",
                                "size": 2 * GiB})
        vm.qmp("blockdev-mirror", {"job-id": "move", "device": pve9_disk(vm).top_node,
                                   "target": "elsewhere", "sync": "full"})
        vm.wait_event("BLOCK_JOB_READY", timeout=300)
        with daemons(bed, pvestord_args=("--reconcile-interval", "5")) as (_, pvestord):
            wait_until(lambda: records(pvestord.log_text(), "INFO", VMID="604",
                                       LIVE_REDUCTION="waits"),
                       EXTEND_TIMEOUT, "the reduction waits for the job")
            assert vg.lv_size(lv) == maximum
            assert COPY_TAG in vg.lv_tags(lv)
            assert status(vm) == "running"
            # qemu-server's lock on the config (a backup about to start): no
            # pause either, once the job has ended.
            bed.write_vm_config(604, f"thin1:{lv}", lock="backup")
            vm.qmp("block-job-cancel", {"device": "move"})
            vm.wait_event("BLOCK_JOB_COMPLETED", timeout=60)
            wait_until(lambda: len(records(pvestord.log_text(), "INFO", VMID="604",
                                           LIVE_REDUCTION="waits")) == 2,
                       EXTEND_TIMEOUT, "the reduction waits for the lock")
            assert vg.lv_size(lv) == maximum
            assert status(vm) == "running"
            bed.write_vm_config(604, f"thin1:{lv}")
            wait_until(lambda: COPY_TAG not in vg.lv_tags(lv), EXTEND_TIMEOUT,
                       "reduced once the job ended and the lock went")
            assert_reduced(vg, lv, maximum)
            assert status(vm) == "running"
            assert_holds(vm, 0x5F)
    assert qcow2_check(vg.lv_path(lv))["exit"] == 0


def test_pvestord_killed_while_the_vm_is_paused_for_a_reduction(
        bed: NodeBed, vg: VG, faults: LvmFaults) -> None:
    """kill -9 of pvestord, and of its ``lvreduce``, while the guest is paused
    for the reduction: the VM stays paused (nobody else resumes it) until the
    restarted daemon's first pass over it resumes it, then reduces the LV."""
    vm, lv, maximum = mirrored_vm(bed, vg, 605)
    with vm:
        assert vm.write_pattern(fmt_node(vm), 0, MIRRORED, 0x71, timeout=300).ok
        faults.rule("lvreduce", "before hang")
        with node(bed, faults) as running:
            wait_until(lambda: faults.started("lvreduce"), EXTEND_TIMEOUT,
                       "lvreduce under the paused VM")
            assert status(vm) == "paused"
            kill_unit(running.pvestord, with_children=True)
            faults.clear()
            assert status(vm) == "paused"
            assert vg.lv_size(lv) == maximum
            assert pausemarks.noted(PAUSE_NOTES, 605, vm.pid) is pausemarks.Note.OURS
            assert_resumed_then_reduced(vm, vg, lv, maximum, running.start_pvestord())
            assert_holds(vm, 0x71)
    assert qcow2_check(vg.lv_path(lv))["exit"] == 0
