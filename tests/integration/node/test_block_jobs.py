"""Block jobs writing into thin drives (node guest).

A job that starts makes its target writable: ``JOB_STATUS_CHANGE`` to
``running`` is queued (reason ``job``) and the pass arms the target's
threshold then, not at the next reconcile.

An active commit's base is grown by all the job can still write when the
job runs (``len - offset`` of ``query-block-jobs``, the target from
``x-debug-query-block-graph``), so a job at disk speed never outruns it.
A stream's target, and a commit's of a backing layer, are grown by the data
their layers still hold past the job's offset (``qemu-img map``).

A block job paused on ENOSPC in a thin target is given room and resumed.

An admin's ``block-commit`` (or a mirror, a stream) started with
``on-error=enospc`` pauses when its thin target is full, with
``BLOCK_JOB_ERROR`` (action ``stop``) and io-status ``nospace`` in
``query-block-jobs``. qmeventd-py queues it; pvestord grows the target as
for a paused guest and resumes the job, as often as it pauses again, and no
write is lost. The job starts before pvestord does, so that it is certain to
pause at least once (no threshold on the target is armed yet): what is
tested is that a paused job is never left paused when room can be made.

Real parts: Proxmox's own ``PVE::Storage`` for the volume and its snapshot
on a loop VG (tests/harness/pvestorage.py), QEMU with Proxmox VE 9's block
graph, both daemons, ``qemu-io`` and ``qemu-img check`` on the LV after.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.harness.daemons import NodeBed, daemons, start_pvestord, start_qmeventd
from tests.harness.lvmbed import VG, GiB, MiB, qcow2_check, sh
from tests.harness.polling import wait_until
from tests.harness.pvestorage import (
    CHUNK,
    INITIAL,
    SNAP1,
    SNAP2,
    VMID,
    VOLID,
    VOLNAME,
    alloc_disk,
    daemons_bed,
    image,
    live_storage,
    lv_sizes,
    overlay_maximum,
    qemu_io,
    snapshot,
)
from tests.harness.qemu import Pve9Disk, QemuVM
from tests.proxmox import upstream

BASE_DATA = 4 * MiB
#: What the top holds: twice what the base LV can still take, so the commit
#: fills the base at least once before pvestord runs.
TOP_DATA = 64 * MiB
START_TIMEOUT = 300.0
JOB_TIMEOUT = 600.0


def _file_node_on(vm: QemuVM, path: str) -> dict[str, Any]:
    """The ``host_device`` node on ``path`` (QEMU names a backing's itself)."""
    [node] = [n for n in vm.qmp("query-named-block-nodes", flat=True)
              if n.get("drv") == "host_device" and n.get("file") == path]
    return dict(node)


def _chain(pve: upstream.PerlSession, vg: VG, *, top_data: int) -> None:
    """The disk with BASE_DATA, snapshot ``snap1`` (the base, INITIAL), and
    ``top_data`` written into the top, whose LV is grown to hold it."""
    alloc_disk(pve)
    qemu_io(vg, VOLNAME, f"write -P 0x11 0 {BASE_DATA}")
    snapshot(pve, "snap1")
    top_lv = max(3 * INITIAL, top_data + INITIAL)
    sh("lvextend", "-q", "--size", f"{top_lv}b", vg.lv_path(VOLNAME))
    qemu_io(vg, VOLNAME, f"write -P 0x22 {GiB} {top_data}")


def _vm(bed: NodeBed, disk: Pve9Disk, out_dir: Path) -> QemuVM:
    return QemuVM(VMID, bed.run_dir, disks=[disk], machine="pc",
                  event_socket=bed.event_socket, log_path=out_dir / "qemu.log")


@contextlib.contextmanager
def _armed_then_locked(bed: NodeBed, disk: Pve9Disk, out_dir: Path,
                       lock: str | None) -> Iterator[QemuVM]:
    """Both daemons and the VM, its top armed by the first reconcile; then
    its config at ``lock``, as qemu-server writes it before a snapshot delete."""
    bed.write_vm_config(VMID, VOLID)
    with daemons(bed, start_timeout=START_TIMEOUT), _vm(bed, disk, out_dir) as vm:
        wait_until(lambda: vm.named_node(disk.file_block_node)["write_threshold"] != 0,
                   START_TIMEOUT, "the top armed by the first reconcile")
        bed.write_vm_config(VMID, VOLID, lock=lock)
        yield vm


def _start_commit(vm: QemuVM, disk: Pve9Disk, base: str, **options: str | int) -> str:
    """An active commit of the top into ``base`` at full speed; its job id."""
    job = "commit0"
    vm.qmp("block-commit", {"job-id": job, "device": disk.top_node,
                            "top-node": disk.block_node,
                            "base-node": vm.format_node_on(base), **options})
    return job


def _base_holds_every_byte(vg: VG, *, top_data: int) -> None:
    assert qcow2_check(vg.lv_path(SNAP1))["exit"] == 0
    qemu_io(vg, SNAP1, f"read -P 0x11 0 {BASE_DATA}")
    qemu_io(vg, SNAP1, f"read -P 0x22 {GiB} {top_data}")


# In the full node set (make node NODE=full): the quick set's node tier ran
# 45 of its 48 minutes with it. The paused-job test below keeps the job
# entries and the job's target as a drive in the quick set.
@pytest.mark.node_full
def test_a_job_that_starts_has_its_thin_target_armed_at_once(
        sources: upstream.Upstream, out_dir: Path, tmp_path: Path) -> None:
    with live_storage(sources, out_dir) as (pve, vg):
        _chain(pve, vg, top_data=INITIAL // 2)
        # Room for the whole commit in the base, as the plugin gives it before
        # qemu-server's job: the job (on-error report) must never fail.
        sh("lvextend", "-q", "--size", f"{4 * INITIAL}b", vg.lv_path(SNAP1))
        bed = daemons_bed(sources, out_dir, tmp_path / "bed")
        disk = Pve9Disk.for_volume(vg.lv_path(VOLNAME), VOLID)
        # No reconcile after the first: only the job's entry can arm the base.
        with daemons(bed, pvestord_args=("--reconcile-interval", "3600"),
                     start_timeout=START_TIMEOUT), _vm(bed, disk, out_dir) as vm:
            wait_until(lambda: vm.named_node(disk.file_block_node)["write_threshold"] != 0,
                       START_TIMEOUT, "the top armed by the first reconcile")
            base = vg.lv_path(SNAP1)
            assert _file_node_on(vm, base)["write_threshold"] == 0  # read-only: not a drive

            job = _start_commit(vm, disk, base)
            assert vm.wait_job(job, timeout=JOB_TIMEOUT) == "ready", vm.qmp("query-block-jobs")
            armed = 4 * INITIAL - CHUNK // 2
            wait_until(lambda: _file_node_on(vm, base)["write_threshold"] == armed,
                       START_TIMEOUT, "the job's target armed")
            vm.qmp("job-complete", id=job)
            assert vm.job_completed_cleanly(timeout=JOB_TIMEOUT)
        _base_holds_every_byte(vg, top_data=INITIAL // 2)


#: What the top holds for the commit that is grown ahead of: four times the base LV.
AHEAD_DATA = 128 * MiB
#: The commit's rate while the test looks: after QEMU's first burst of 16 MiB,
#: it takes 24 s to copy half of AHEAD_DATA; pvestord answers the job's start
#: within a pass (about a second here).
SLOW = 2 * MiB


def _job(vm: QemuVM, job: str) -> dict[str, Any]:
    [found] = [j for j in vm.qmp("query-block-jobs") if j["device"] == job]
    return dict(found)


def _grown_while_it_runs(vm: QemuVM, vg: VG, job: str, target: str, size: int
                         ) -> dict[str, Any]:
    """Until LV ``target`` holds ``size``, failing if ``job`` ends first; the
    job's progress then."""
    def grown() -> bool:
        # A job that failed on ENOSPC is gone (QEMU dismisses it).
        assert any(j["device"] == job for j in vm.qmp("query-block-jobs")), \
            f"{job} ended before {target} was grown"
        return lv_sizes(vg)[target] >= size

    wait_until(grown, JOB_TIMEOUT, f"{target} grown to hold {job}")
    return _job(vm, job)


# The admin's variant in the full node set: the locked one takes the same
# path and the lift besides, and the quick set's node tier has its budget.
@pytest.mark.parametrize("lock", [pytest.param(None, marks=pytest.mark.node_full),
                                  "snapshot-delete"], ids=["admin", "snapshot-delete"])
def test_an_active_commit_has_its_base_grown_ahead_of_it(
        sources: upstream.Upstream, out_dir: Path, tmp_path: Path, lock: str | None) -> None:
    """A commit nobody announced to the plugin (an admin's ``block-commit`` of
    the top, QEMU's default ``on-error=report``): its base is grown by all the
    job can still write as soon as the job runs, not a chunk at a time behind
    it, and no further than the data needs.

    With ``lock: snapshot-delete`` in the VM's config, this is qemu-server's
    own commit of a snapshot delete once the job must write more than the
    plugin granted before it (the grant's one chunk of margin is what the
    guest may write during the job; here there is no grant at all). The
    daemon stands back from the VM's LVs while the lock is there, but not
    from the job's target: the job, and so the delete, must not fail.
    """
    with live_storage(sources, out_dir) as (pve, vg):
        _chain(pve, vg, top_data=AHEAD_DATA)
        assert lv_sizes(vg)[SNAP1] == INITIAL
        disk = Pve9Disk.for_volume(vg.lv_path(VOLNAME), VOLID)
        bed = daemons_bed(sources, out_dir, tmp_path / "bed")
        with _armed_then_locked(bed, disk, out_dir, lock) as vm:
            job = _start_commit(vm, disk, vg.lv_path(SNAP1), speed=SLOW)
            progress = _grown_while_it_runs(vm, vg, job, SNAP1, BASE_DATA + AHEAD_DATA)
            # Grown while the job had most of its work ahead: chunk by chunk
            # behind threshold events, the base would be about the size of what
            # the job had copied.
            assert progress["offset"] < progress["len"] // 2, progress
            vm.qmp("block-job-set-speed", device=job, speed=0)
            assert vm.run_job_to_completion(job, timeout=JOB_TIMEOUT), vm.qmp("query-block-jobs")
        _base_holds_every_byte(vg, top_data=AHEAD_DATA)
        # Once, by what the job could write: no second helping as it copied.
        assert lv_sizes(vg)[SNAP1] <= BASE_DATA + AHEAD_DATA + 2 * CHUNK


# In the full node set: the quick set's stream under snapshot-delete is the
# copy-of-layers one below, and its paused-job test answers a job's ENOSPC.
@pytest.mark.node_full
def test_a_stream_under_snapshot_delete_is_served_through_the_lock(
        sources: upstream.Upstream, out_dir: Path, tmp_path: Path) -> None:
    """qemu-server deletes an intermediate snapshot with a ``block-stream``
    into its child under ``lock: snapshot-delete``; here the child is the
    top, the drive the guest writes, and the stream brings it more than its
    LV holds. The daemon stands back from a VM whose LVs are being renamed,
    but not from one in which a block job writes: the job must finish.

    The stream runs at full speed with ``on-error=enospc``, so whichever
    comes first, a threshold event or the job pausing on ENOSPC, the daemon
    must answer it: standing back, it left the job paused for the lock's
    whole length (qemu-server's own stream, on ``report``, failed instead).
    """
    with live_storage(sources, out_dir) as (pve, vg):
        _chain(pve, vg, top_data=TOP_DATA)
        snapshot(pve, "snap2")  # the top with TOP_DATA becomes snap2; a new, empty top
        assert lv_sizes(vg)[VOLNAME] == INITIAL
        disk = Pve9Disk.for_volume(vg.lv_path(VOLNAME), VOLID)
        bed = daemons_bed(sources, out_dir, tmp_path / "bed")
        with _armed_then_locked(bed, disk, out_dir, "snapshot-delete") as vm:
            vm.qmp("block-stream", {"job-id": "stream0", "device": disk.block_node,
                                    "base-node": vm.format_node_on(vg.lv_path(SNAP1)),
                                    "on-error": "enospc"})
            completed = vm.wait_event("BLOCK_JOB_COMPLETED", timeout=JOB_TIMEOUT)
            assert "error" not in completed["data"], completed
            assert vm.qmp("query-status")["status"] == "running"
        # snap2's data now lives in the top itself, over the base alone.
        assert lv_sizes(vg)[VOLNAME] > INITIAL
        assert qcow2_check(vg.lv_path(VOLNAME))["exit"] == 0
        assert Path(image(vg, VOLNAME)["backing-filename"]).name == SNAP1
        qemu_io(vg, VOLNAME, f"read -P 0x11 0 {BASE_DATA}")
        qemu_io(vg, VOLNAME, f"read -P 0x22 {GiB} {TOP_DATA}")
        assert lv_sizes(vg)[SNAP2] == 3 * INITIAL  # the stream's source, never grown


def _start_chain_copy(pve: upstream.PerlSession, vm: QemuVM, disk: Pve9Disk, vg: VG,
                      kind: str) -> tuple[str, str, int]:
    """A ``block-stream`` of snap2 into the top, a ``block-commit`` of snap2
    into snap1, or a mirror of the whole chain into a new volume, at SLOW
    and QEMU's default ``on-error=report``: the job id, the LV it writes,
    and the data that LV holds, or is brought, besides snap2's."""
    if kind == "mirror":
        # As qemu-server's move disk of a running VM (BlockJob.pm
        # blockdev_mirror): a new volume, attached without a throttle node under
        # node names hashed from its volid, and a full mirror of the drive's
        # throttle node that replaces the node below it. But the volume is thin:
        # the plugin makes qemu-server's own copy target thick (COPY_FLOWS).
        volid = alloc_disk(pve)
        volname = volid.split(":", 1)[1]
        target = Pve9Disk.for_volume(vg.lv_path(volname), volid)
        vm.qmp("blockdev-add", target.format_blockdev())
        vm.qmp("blockdev-mirror", {"job-id": "mirror-scsi0", "device": disk.top_node,
                                   "target": target.block_node, "sync": "full",
                                   "replaces": disk.block_node, "speed": SLOW})
        return "mirror-scsi0", volname, BASE_DATA
    snap1 = vm.format_node_on(vg.lv_path(SNAP1))
    if kind == "stream":
        vm.qmp("block-stream", {"job-id": "stream0", "device": disk.block_node,
                                "base-node": snap1, "speed": SLOW})
        return "stream0", VOLNAME, 0
    vm.qmp("block-commit", {"job-id": "commit0", "device": disk.top_node,
                            "top-node": vm.format_node_on(vg.lv_path(SNAP2)),
                            "base-node": snap1, "speed": SLOW})
    return "commit0", SNAP1, BASE_DATA


# The commit of a backing layer in the full node set: it takes the stream's
# path (the layers' map) into the active commit's target.
@pytest.mark.parametrize(("kind", "lock"), [("stream", "snapshot-delete"),
                                            pytest.param("commit", None,
                                                         marks=pytest.mark.node_full),
                                            ("mirror", None)],
                         ids=["stream-under-snapshot-delete", "commit-of-a-backing-layer",
                              "mirror-into-a-thin-volume"])
def test_a_copy_of_layers_has_its_target_grown_ahead_of_it(
        sources: upstream.Upstream, out_dir: Path, tmp_path: Path, kind: str,
        lock: str | None) -> None:
    """A ``block-stream``, a ``block-commit`` of a backing layer, or a full
    mirror, on QEMU's default ``on-error=report``: the first ENOSPC would
    fail the job, and its progress counts every offset of the virtual disk,
    not data. Its target is grown by the data its source layers still hold
    past its offset (their ``qemu-img map``) as soon as it runs, while most
    of that data is ahead.

    The stream under ``lock: snapshot-delete`` is qemu-server's delete of an
    intermediate snapshot once it must write more than the plugin granted
    (here nothing was granted); the commit is an admin's, nobody announced;
    the mirror is shaped as qemu-server's move disk but into a thin volume
    of the storage (an admin's, or a tool's: the plugin makes the target of
    qemu-server's own thick), which starts at its initial size.
    """
    with live_storage(sources, out_dir) as (pve, vg):
        _chain(pve, vg, top_data=AHEAD_DATA)
        snapshot(pve, "snap2")  # AHEAD_DATA is snap2's now, under a new, empty top
        assert lv_sizes(vg)[VOLNAME] == lv_sizes(vg)[SNAP1] == INITIAL
        disk = Pve9Disk.for_volume(vg.lv_path(VOLNAME), VOLID)
        bed = daemons_bed(sources, out_dir, tmp_path / "bed")
        with _armed_then_locked(bed, disk, out_dir, lock) as vm:
            job, target, held = _start_chain_copy(pve, vm, disk, vg, kind)
            progress = _grown_while_it_runs(vm, vg, job, target, held + AHEAD_DATA)
            # The data starts at GiB: chunk by chunk behind threshold events,
            # the target would be about the size of what the job had copied.
            assert progress["offset"] < GiB + AHEAD_DATA // 2, progress
            vm.qmp("block-job-set-speed", device=job, speed=0)
            done = (vm.run_job_to_completion(job, timeout=JOB_TIMEOUT) if kind == "mirror"
                    else vm.job_completed_cleanly(timeout=JOB_TIMEOUT))
            assert done, vm.qmp("query-block-jobs")
            assert vm.qmp("query-status")["status"] == "running"
        assert qcow2_check(vg.lv_path(target))["exit"] == 0
        qemu_io(vg, target, f"read -P 0x11 0 {BASE_DATA}")
        qemu_io(vg, target, f"read -P 0x22 {GiB} {AHEAD_DATA}")
        # Once, by the data: not by the job's length (the whole disk), and
        # no second helping as it copied.
        assert lv_sizes(vg)[target] <= held + AHEAD_DATA + 2 * CHUNK
        assert lv_sizes(vg)[SNAP2] == AHEAD_DATA + INITIAL  # the source, never grown


def _paused_on_enospc(vm: QemuVM, job: str) -> bool:
    return any(j["device"] == job and j["paused"] and j["io-status"] == "nospace"
               for j in vm.qmp("query-block-jobs"))


def test_an_active_commit_paused_on_enospc_is_given_room_and_resumed(
        sources: upstream.Upstream, out_dir: Path, tmp_path: Path) -> None:
    with live_storage(sources, out_dir) as (pve, vg):
        _chain(pve, vg, top_data=TOP_DATA)
        assert lv_sizes(vg) == {SNAP1: INITIAL, VOLNAME: 3 * INITIAL}

        bed = daemons_bed(sources, out_dir, tmp_path / "bed")
        disk = Pve9Disk.for_volume(vg.lv_path(VOLNAME), VOLID)
        qmeventd = start_qmeventd(bed, timeout=START_TIMEOUT)
        pvestord = None
        try:
            with _vm(bed, disk, out_dir) as vm:
                job = _start_commit(vm, disk, vg.lv_path(SNAP1), **{"on-error": "enospc"})
                wait_until(lambda: _paused_on_enospc(vm, job), JOB_TIMEOUT,
                           "the commit paused on ENOSPC in the base")
                # qmeventd-py queued it, under the job's name.
                wait_until(lambda: any(e.block_node == job for e in bed.entries()),
                           START_TIMEOUT, "the paused job queued")

                pvestord = start_pvestord(bed, timeout=START_TIMEOUT)
                assert vm.wait_job(job, timeout=JOB_TIMEOUT) == "ready", \
                    vm.qmp("query-block-jobs")
                vm.qmp("job-complete", id=job)
                completed = vm.wait_event("BLOCK_JOB_COMPLETED", timeout=JOB_TIMEOUT)
                assert "error" not in completed["data"], completed
                assert vm.qmp("query-status")["status"] == "running"
            assert pvestord.stop() == 0, pvestord.log_text()[-4000:]
            pvestord = None
        finally:
            if pvestord is not None:
                pvestord.stop()
            assert qmeventd.stop() == 0, qmeventd.log_text()[-4000:]

        # The base alone holds every byte, in an LV grown no further than its image can use.
        _base_holds_every_byte(vg, top_data=TOP_DATA)
        grown = lv_sizes(vg)[SNAP1]
        assert BASE_DATA + TOP_DATA < grown <= overlay_maximum()
