"""The engine against stale device-mapper tables, blocked resumes and wrong
names: real LVM, real QEMU, real daemons, in
the node guest.

Stale tables are made as a lost or unseen extension makes them: the LV is
grown with ``lvextend`` (its table follows on this node), QEMU writes past the
old end, and then ``dmsetup reload`` puts back the table of another size. QEMU
then reads what this node's table shows, which is what the tests check.

The blocked resume is made with a real guest (``guest_writer.asm``, see
test_enospc_guest.py) on two virtio-blk disks with ``werror=enospc``: first it
writes past the end of its thin LV (pvestord extends and resumes it, and
QEMU keeps that device's io-status at ``nospace``: the sticky status of
``-blockdev`` devices), then, rebooted into a second program, past the end of
a non-thin LV. The VM then pauses with both devices ``nospace``, and nothing
pvestord may do resumes it.

Figures (LV sizes over the reconciles) go to ``<out_dir>/faults-engine.json``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pvestord.adapters.queue import Entry
from pvestord.policy import Reason, enospc_is_new
from pvestord.policy.sizes import align_up
from tests.harness import daemonlog
from tests.harness.daemons import (
    VENV_BIN,
    Daemon,
    NodeBed,
    ThinStorageSpec,
    daemons,
    start_pvestord,
)
from tests.harness.enospcguest import (
    CHUNKSIZE,
    EXTENT,
    FINISH_TIMEOUT,
    GUEST_PATTERN,
    GUEST_WRITE,
    IO_TIMEOUT,
    LAUNCH_TIMEOUT,
    LV_SIZE,
    PAUSE_TIMEOUT,
    PREFILL,
    RESUME_TIMEOUT,
    VIRTUAL,
    device,
    extended_size,
    prefill,
    run_guest_until_paused,
)
from tests.harness.lvmbed import VG, GiB, MiB, loop_vg, qcow2_check, qcow2_create, sh
from tests.harness.polling import wait_until
from tests.harness.qemu import Pve9Disk, QemuIoError, QemuVM, pve9_disk
from tests.harness.writerguest import build_writer

#: The stale-table tests: small chunks, so that little has to be written.
SMALL_CHUNK = 64 * MiB
#: Written from virtual 0: past the first 64 MiB of the LV, below the
#: threshold of a 128 MiB LV (128 MiB - half a chunk).
STALE_WRITE = 80 * MiB
STALE_PATTERN = 0x3C
#: A range of the image that lies past 64 MiB in the LV.
PAST_OLD_END = (68 * MiB, 8 * MiB)
RECONCILE = "3"
WAIT = 120.0


@pytest.fixture
def small_bed(vg: VG, tmp_path: Path, out_dir: Path) -> NodeBed:
    return NodeBed(tmp_path, [ThinStorageSpec("thin1", vg.name, chunksize="64M",
                                              initial_size="64M")], logs_dir=out_dir)


@pytest.fixture
def other_vg() -> Iterator[VG]:
    """A VG that no storage names: its LVs are not thin."""
    with loop_vg(512 * MiB, prefix="pvn") as unmanaged:
        yield unmanaged


# -- helpers ---------------------------------------------------------------------

def dm_name(path: str) -> str:
    rdev = os.stat(path).st_rdev
    return Path(f"/sys/dev/block/{os.major(rdev)}:{os.minor(rdev)}/dm/name").read_text().strip()


def dm_table(path: str) -> str:
    return sh("dmsetup", "table", dm_name(path))


def dm_reload(path: str, table: str) -> None:
    """Load ``table`` for the LV at ``path`` and make it live, as a node whose
    table was made at another time would have it."""
    name = dm_name(path)
    subprocess.run(["dmsetup", "reload", name], input=table, text=True,  # noqa: S603
                   check=True, timeout=60, capture_output=True)
    sh("dmsetup", "resume", name)


def allocation(vm: QemuVM, node: str) -> int:
    for entry in vm.qmp("query-blockstats", query_nodes=True):
        if entry.get("node-name") == node:
            return int(entry["stats"]["wr_highest_offset"])
    raise AssertionError(f"no blockstats for {node}")


def write(vm: QemuVM, node: str, length: int, pattern: int, start: int = 0) -> None:
    step = 16 * MiB
    for offset in range(start, start + length, step):
        vm.write_pattern(node, offset, min(step, start + length - offset), pattern,
                         timeout=IO_TIMEOUT)


def reads_back(vm: QemuVM, node: str, offset: int, length: int, pattern: int) -> bool:
    try:
        return vm.read_verify(node, offset, length, pattern, timeout=IO_TIMEOUT)
    except QemuIoError:
        return False


def records(daemon: Daemon, **wanted: object) -> list[daemonlog.LogLine]:
    """The daemon's log records whose journal fields have the ``wanted`` values."""
    return [r for r in daemonlog.parse(daemon.log_text())
            if all(r.fields.get(k) == str(v) for k, v in wanted.items())]


def extensions(daemon: Daemon, vmid: int) -> list[daemonlog.LogLine]:
    return [r for r in records(daemon, VMID=vmid) if "DURATION_MS" in r.fields]


def figures(out_dir: Path, name: str, values: dict[str, Any]) -> None:
    path = out_dir.parent / "faults-engine.json"
    data = json.loads(path.read_text()) if path.exists() else {}
    data[name] = values
    path.write_text(json.dumps(data, indent=2) + "\n")


def one_disk_vm(bed: NodeBed, vg: VG, vmid: int) -> tuple[QemuVM, str]:
    lv = f"vm-{vmid}-disk-0.qcow2"
    path = vg.create_lv(lv, SMALL_CHUNK)
    qcow2_create(path, 1 * GiB)
    disk = Pve9Disk.for_volume(path, f"thin1:{lv}")
    return QemuVM(vmid, bed.run_dir, disks=[disk],
                  event_socket=bed.event_socket, log_path=bed.logs / f"qemu-{vmid}.log"), lv


def drives_report(bed: NodeBed) -> list[dict[str, Any]]:
    out = subprocess.run(  # noqa: S603 - argument list
        [str(VENV_BIN / "pvestord"), "--queue", str(bed.queue_path), "drives", "--json",
         "--storage-config", str(bed.storage_cfg), "--run-dir", str(bed.run_dir),
         "--node", bed.node], capture_output=True, text=True, timeout=120, check=True).stdout
    rows: list[dict[str, Any]] = json.loads(out)
    return rows


# -- stale tables ----------------------------------------------------------------

def test_table_smaller_than_the_metadata_is_refreshed_before_anything_is_armed(
        small_bed: NodeBed, vg: VG, out_dir: Path) -> None:
    """Another node grew the LV and its VM wrote past this node's table: QEMU
    here reads zeros there, with no error, until pvestord's first pass
    refreshes the table; only then is a threshold armed."""
    vm, lv = one_disk_vm(small_bed, vg, 111)
    path = vg.lv_path(lv)
    disk = pve9_disk(vm)
    with vm:
        old_table = dm_table(path)
        sh("lvextend", "-q", "-L", f"{2 * SMALL_CHUNK}b", f"{vg.name}/{lv}")
        write(vm, disk.block_node, STALE_WRITE, STALE_PATTERN)
        assert allocation(vm, disk.file_block_node) > SMALL_CHUNK
        dm_reload(path, old_table)
        assert (vg.lv_size(lv), vg.device_size(lv)) == (2 * SMALL_CHUNK, SMALL_CHUNK)
        # The premise: what lies past the stale end reads as zeros, no error.
        assert not reads_back(vm, disk.block_node, *PAST_OLD_END, STALE_PATTERN)
        with daemons(small_bed) as (_, pvestord):
            wait_until(lambda: records(pvestord, VMID=111, BLOCK_NODE=disk.file_block_node,
                                     THRESHOLD=2 * SMALL_CHUNK - SMALL_CHUNK // 2), WAIT,
                       "threshold armed")
            assert vg.device_size(lv) == 2 * SMALL_CHUNK
            assert vg.lv_size(lv) == 2 * SMALL_CHUNK  # refreshed, not extended again
            assert vm.read_verify(disk.block_node, 0, STALE_WRITE, STALE_PATTERN,
                                  timeout=IO_TIMEOUT)
            log = list(daemonlog.parse(pvestord.log_text()))
        refreshed = [i for i, r in enumerate(log) if r.fields.get("TABLE") == "refreshed"]
        armed = [i for i, r in enumerate(log) if "THRESHOLD" in r.fields]
        assert len(refreshed) == 1
        assert (log[refreshed[0]].fields["OLD_SIZE"], log[refreshed[0]].fields["NEW_SIZE"]) == (
            str(SMALL_CHUNK), str(2 * SMALL_CHUNK))
        # Never a threshold past the device's end: nothing armed before the refresh.
        assert armed and min(armed) > refreshed[0]
        assert not [r for r in log if "DURATION_MS" in r.fields]
        figures(out_dir, "table_behind", {
            "metadata_mib": 2 * SMALL_CHUNK // MiB, "stale_table_mib": SMALL_CHUNK // MiB,
            "table_after_mib": vg.device_size(lv) // MiB,
            "threshold_mib": (2 * SMALL_CHUNK - SMALL_CHUNK // 2) // MiB})
    assert qcow2_check(path)["exit"] == 0


def test_table_larger_than_the_metadata_is_never_extended_over(
        small_bed: NodeBed, vg: VG, out_dir: Path) -> None:
    """An extension was lost (this node's table maps 128 MiB, the metadata
    says 64 MiB) and the guest's data lies past the metadata's end: no
    lvextend may map other extents there. Error with fields, ``drives`` shows
    the drive failed, and the data still reads back."""
    vm, lv = one_disk_vm(small_bed, vg, 112)
    path = vg.lv_path(lv)
    disk = pve9_disk(vm)
    with vm:
        sh("lvextend", "-q", "-L", f"{2 * SMALL_CHUNK}b", f"{vg.name}/{lv}")
        big_table = dm_table(path)
        write(vm, disk.block_node, STALE_WRITE, STALE_PATTERN)
        sh("lvreduce", "-q", "-f", "-L", f"{SMALL_CHUNK}b", f"{vg.name}/{lv}")
        dm_reload(path, big_table)
        assert (vg.lv_size(lv), vg.device_size(lv)) == (SMALL_CHUNK, 2 * SMALL_CHUNK)
        with daemons(small_bed) as (_, pvestord):
            ahead = {"VMID": 112, "BLOCK_NODE": disk.file_block_node, "TABLE": "ahead"}
            wait_until(lambda: records(pvestord, **ahead), WAIT, "the stale table refused")
            (first,) = [r for r in records(pvestord, **ahead) if r.level == "ERROR"]
            assert (first.fields["TABLE_SIZE"], first.fields["LV_SIZE"]) == (
                str(2 * SMALL_CHUNK), str(SMALL_CHUNK))
            (row,) = drives_report(small_bed)
            assert (row["vmid"], row["block_node"], row["state"]) == (
                112, disk.file_block_node, "failed")
            assert (row["lv_size"], row["device_size"]) == (SMALL_CHUNK, 2 * SMALL_CHUNK)
            assert row["problem"]
            # The threshold event a guest writing on would bring: the extension
            # path refuses too (the entry stays queued, retried later).
            small_bed.queue.append([Entry(112, disk.file_block_node, Reason.THRESHOLD,
                                          origin=small_bed.node)])
            wait_until(lambda: len(records(pvestord, **ahead)) >= 3, WAIT,
                       "the extension path refused as well")
            assert [e.block_node for e in small_bed.entries()] == [disk.file_block_node]
            assert vg.lv_size(lv) == SMALL_CHUNK
            assert vg.device_size(lv) == 2 * SMALL_CHUNK
            assert extensions(pvestord, 112) == []
            assert vm.read_verify(disk.block_node, 0, STALE_WRITE, STALE_PATTERN,
                                  timeout=IO_TIMEOUT)
            figures(out_dir, "table_ahead", {
                "metadata_mib": SMALL_CHUNK // MiB, "table_mib": 2 * SMALL_CHUNK // MiB,
                "refusals_logged": len(records(pvestord, **ahead)),
                "lv_after_mib": vg.lv_size(lv) // MiB, "drives_state": row["state"]})


# -- a blocked resume: answered once, never past the maximum --------------------------

#: The non-thin disk: a 16 MiB LV in a VG no storage names, filled to 2 MiB
#: short of its end before the guest writes 3 MiB past that.
LOCAL_LV = 16 * MiB
LOCAL_PREFILL = 14 * MiB


def two_disk_writer_vm(bed: NodeBed, vg: VG, other: VG, vmid: int, boot_image: Path,
                       debugcon: Path) -> tuple[QemuVM, str]:
    """Boot disk on IDE, the thin disk as BIOS drive 81h and the non-thin one as
    82h (boot order), both virtio-blk with qemu-server's ``werror=enospc``."""
    thin = vg.create_lv(f"vm-{vmid}-disk-0.qcow2", LV_SIZE)
    qcow2_create(thin, VIRTUAL)
    prefill(thin, PREFILL, LV_SIZE)
    local = other.create_lv(f"vm-{vmid}-disk-1.qcow2", LOCAL_LV)
    qcow2_create(local, VIRTUAL)
    disks = [Pve9Disk.for_volume(thin, f"thin1:vm-{vmid}-disk-0.qcow2", "virtio0"),
             Pve9Disk.for_volume(local, f"local:vm-{vmid}-disk-1.qcow2", "virtio1")]
    data = "werror=enospc,rerror=report,share-rw=on"
    args = ["-S", "-m", "64",
            "-blockdev", f"driver=file,filename={boot_image},node-name=boot0",
            "-device", "ide-hd,drive=boot0,bus=ide.0,unit=0,bootindex=0,id=boot",
            "-device", f"virtio-blk-pci,drive={disks[0].top_node},id=data0,{data},bootindex=1",
            "-device", f"virtio-blk-pci,drive={disks[1].top_node},id=data1,{data},bootindex=2",
            "-chardev", f"file,id=dbg,path={debugcon}",
            "-device", "isa-debugcon,iobase=0xe9,chardev=dbg"]
    vm = QemuVM(vmid, bed.run_dir, disks=disks, machine="pc", event_socket=bed.event_socket,
                log_path=bed.logs / f"qemu-{vmid}.log", extra_args=args,
                launch_timeout=LAUNCH_TIMEOUT)
    return vm, f"vm-{vmid}-disk-0.qcow2"


def watch_blocked(pvestord: Daemon, vg: VG, lv: str, passes: int, since: int) -> list[int]:
    """The thin LV's size, polled until ``passes`` more passes said why the VM
    stays paused (a reconcile every few seconds); stops early if it grows
    past one chunk more than at the start."""
    start = vg.lv_size(lv)
    sizes = [start]

    def seen() -> bool:
        sizes.append(vg.lv_size(lv))
        blocked = records(pvestord, VMID=131, RESUME_BLOCKED="not-thin")
        return len(blocked) >= since + passes or sizes[-1] > start + CHUNKSIZE

    wait_until(seen, 240, f"{passes} passes over the blocked VM", interval=0.5)
    return sizes


# In the full node set: tests/unit/test_policy.py holds the rule (one
# extension per new ENOSPC), and the quick set resumes paused guests in
# test_enospc_guest.py.
@pytest.mark.node_full
def test_a_vm_whose_resume_is_blocked_gets_one_extension_per_new_enospc(
        vg: VG, other_vg: VG, tmp_path: Path, out_dir: Path) -> None:
    bed = NodeBed(tmp_path, [ThinStorageSpec("thin1", vg.name)], logs_dir=out_dir)
    thin_writer = build_writer(tmp_path, out_dir, "writer-131-thin", start=PREFILL,
                               length=GUEST_WRITE, pattern=GUEST_PATTERN)
    local_writer = build_writer(tmp_path, out_dir, "writer-131-local", start=LOCAL_PREFILL,
                                length=GUEST_WRITE, pattern=0x6B, data_disk=0x82)
    vm, lv = two_disk_writer_vm(bed, vg, other_vg, 131, thin_writer.boot_image,
                                thin_writer.debugcon)
    with vm:
        write(vm, pve9_disk(vm, 1).block_node, LOCAL_PREFILL, 0x22)
        run_guest_until_paused(vm, thin_writer)
        expected = extended_size(allocation(vm, pve9_disk(vm).file_block_node))
        with daemons(bed, pvestord_args=["--reconcile-interval", RECONCILE]) as (_, pvestord):
            # 1. A thin ENOSPC: extended once and resumed.
            vm.wait_event("RESUME", timeout=RESUME_TIMEOUT)
            assert thin_writer.wait_finished(FINISH_TIMEOUT) == thin_writer.success
            answered = vg.lv_size(lv)
            assert answered == expected
            # 2. The same guest, rebooted into a program that writes past the
            # end of the non-thin disk: the VM pauses again.
            shutil.copyfile(local_writer.boot_image, thin_writer.boot_image)
            vm.qmp("system_reset")
            error = vm.wait_event("BLOCK_IO_ERROR", timeout=PAUSE_TIMEOUT,
                                  match=lambda e: e["data"]["node-name"]
                                  == pve9_disk(vm, 1).top_node)
            assert error["data"]["nospace"] is True, error
            vm.wait_event("STOP", timeout=30)
            assert vm.qmp("query-status")["status"] == "io-error"
            # The premise: both devices say nospace, the thin one left over
            # from step 1 (QEMU keeps a -blockdev device's status after cont).
            assert device(vm, "data1")["io-status"] == "nospace"
            assert device(vm, "data0")["io-status"] == "nospace"
            # 3. Five reconciles (and the nospace entry's pass): the VM stays
            # paused, each pass says which device blocks it, and the thin
            # drive's old nospace is answered again only if the guest's retried
            # write brought its allocation within a chunk of the end (the
            # rule: policy.enospc_is_new), and then once.
            written = allocation(vm, pve9_disk(vm).file_block_node)
            again = enospc_is_new(answered, answered, written, CHUNKSIZE)
            sizes = watch_blocked(pvestord, vg, lv, passes=6, since=0)
            settled = align_up(max(answered, written) + CHUNKSIZE, EXTENT) if again else answered
            assert sizes[-1] == settled, sizes
            assert set(sizes) <= {answered, settled}, sizes
            blocked = records(pvestord, VMID=131, RESUME_BLOCKED="not-thin")
            assert {r.fields["DEVICE"] for r in blocked} == {device(vm, "data1")["qdev"]}
            assert [r.level for r in blocked][:1] == ["WARNING"]
            assert len(extensions(pvestord, 131)) == 1 + again
            assert vm.qmp("query-status")["status"] == "io-error"
            # 4. A daemon that never saw the first ENOSPC (restarted): the
            # thin drive's nospace is new to it, and gets one chunk, no more.
            assert pvestord.stop() == 0
            before = len(records(pvestord, VMID=131, RESUME_BLOCKED="not-thin"))
            restarted = start_pvestord(bed, "--reconcile-interval", RECONCILE)
            try:
                after_restart = watch_blocked(restarted, vg, lv, passes=6, since=before)
                final = vg.lv_size(lv)
                assert final == align_up(settled + CHUNKSIZE, EXTENT), after_restart
                # The log file holds both daemons' lines.
                assert len(extensions(restarted, 131)) == 2 + again
                assert vm.qmp("query-status")["status"] == "io-error"
            finally:
                assert restarted.stop() == 0
            figures(out_dir, "blocked_resume", {
                "lv_before_first_enospc_mib": LV_SIZE // MiB,
                "lv_after_first_enospc_mib": answered // MiB,
                "thin_allocation_mib": round(written / MiB, 2),
                "old_nospace_new_again": again,
                "lv_over_reconciles_mib": sorted({s // MiB for s in sizes}),
                "polls": len(sizes),
                "blocked_passes_logged": len(blocked),
                "lv_over_reconciles_after_restart_mib": sorted(
                    {s // MiB for s in after_restart}),
                "lv_final_mib": final // MiB})
    assert qcow2_check(vg.lv_path(lv))["exit"] == 0


# -- a wrong name: no drive touched ------------------------------------------------

def test_extend_with_a_wrong_name_touches_no_drive(
        small_bed: NodeBed, vg: VG, other_vg: VG) -> None:
    """``pvestord extend VMID NAME`` and ``manual`` entries for a name that is
    no thin drive's: nothing extended (the old code grew every thin drive)."""
    disks = []
    for index in (0, 1):
        path = vg.create_lv(f"vm-141-disk-{index}.qcow2", SMALL_CHUNK)
        qcow2_create(path, 1 * GiB)
        disks.append(Pve9Disk.for_volume(path, f"thin1:vm-141-disk-{index}.qcow2",
                                         f"scsi{index}"))
    local = other_vg.create_lv("vm-141-disk-2.qcow2", SMALL_CHUNK)
    qcow2_create(local, 1 * GiB)
    disks.append(Pve9Disk.for_volume(local, "local:vm-141-disk-2.qcow2", "scsi2"))
    not_thin = disks[2]
    lvs = ["vm-141-disk-0.qcow2", "vm-141-disk-1.qcow2"]
    common = ["--storage-config", str(small_bed.storage_cfg), "--run-dir",
              str(small_bed.run_dir), "--node", small_bed.node]
    with QemuVM(141, small_bed.run_dir, disks=disks, event_socket=small_bed.event_socket,
                log_path=small_bed.logs / "qemu-141.log"):
        for name in ("file-typo", not_thin.block_node, not_thin.file_block_node):
            done = subprocess.run(  # noqa: S603 - argument list
                [str(VENV_BIN / "pvestord"), "--queue", str(small_bed.queue_path), "extend",
                 "141", name, *common], capture_output=True, text=True, timeout=120)
            assert done.returncode == 1, (name, done.stdout, done.stderr)
            assert [vg.lv_size(lv) for lv in lvs] == [SMALL_CHUNK] * 2, name
        with daemons(small_bed) as (_, pvestord):
            small_bed.queue.append([
                Entry(141, not_thin.block_node, Reason.MANUAL, origin=small_bed.node),
                Entry(141, "file-typo", Reason.MANUAL, origin=small_bed.node)])
            wait_until(lambda: small_bed.entries() == [], WAIT, "both entries handled")
            assert records(pvestord, VMID=141, BLOCK_NODE=not_thin.block_node, REASON="manual")
            assert [vg.lv_size(lv) for lv in lvs] == [SMALL_CHUNK] * 2
            assert extensions(pvestord, 141) == []
        # The right name still works.
        done = subprocess.run(  # noqa: S603 - argument list
            [str(VENV_BIN / "pvestord"), "--queue", str(small_bed.queue_path), "extend",
             "141", disks[1].file_block_node, *common], capture_output=True, text=True,
            timeout=120)
        assert done.returncode == 0, done.stderr
        assert [vg.lv_size(lv) for lv in lvs] == [SMALL_CHUNK, 2 * SMALL_CHUNK]
