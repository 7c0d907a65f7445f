"""The extension engine end to end: real qmeventd-py and pvestord processes,
real QEMU, real LVM on loop devices, inside the node guest.

Every VM's disk has Proxmox VE 9's block graph (tests/harness/qemu.py
``Pve9Disk``): a throttle node ``drive-scsi0`` over the qcow2 node
``f<hash>`` over the host_device node ``e<hash>``, with qemu-server's node
names, ``cache.direct`` and ``aio=native``; QEMU runs daemonized, as
qemu-server starts it. The writer goes through QEMU's own block layer: the
``qemu-io`` tool on an NBD export of the qcow2 node, 4 MiB per write.

How fast a writer may go without ever meeting the end of the LV is the
benchmark's question (bench/), not these tests'. An extension takes about 3 s
here (``lvextend`` under TCG inside TCG), and a CI machine with CPU steal makes
that longer, so the writer treats ENOSPC as a guest with ``werror=enospc``
would: it tries the write again until the daemon has grown the LV. What the
tests assert is that the daemon does grow it, that every byte lands, and that
no other error happens. The threshold event is the only way the LV grows here
(qemu-io's errors raise no ``BLOCK_IO_ERROR``), so a daemon that stopped
arming thresholds still fails these tests.
"""

from __future__ import annotations

import concurrent.futures
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from pvestord.adapters.queue import Entry
from pvestord.policy import Reason
from tests.harness.daemonlog import extensions, records
from tests.harness.daemons import NodeBed, ThinStorageSpec, daemons, start_pvestord
from tests.harness.lvmbed import (
    VG,
    GiB,
    MiB,
    loop_vg,
    measured_maximum,
    qcow2_check,
)
from tests.harness.pacedwrite import EXTEND_TIMEOUT, paced_write
from tests.harness.polling import wait_until
from tests.harness.qemu import pve9_disk
from tests.harness.thinvm import file_node, fmt_node, thin_vm


@pytest.fixture
def bed(vg: VG, tmp_path: Path, out_dir: Path) -> NodeBed:
    return NodeBed(tmp_path, [ThinStorageSpec("thin1", vg.name)], logs_dir=out_dir)


def test_thin_disk_grows_chunk_by_chunk_to_its_maximum(bed: NodeBed, vg: VG) -> None:
    """A writer fills a 1 GiB disk. The LV grows from 256 MiB in 256 MiB chunks,
    one per threshold crossed, the threshold re-armed half a chunk below each
    new end, and stops at what the qcow2 can use: 256 -> 512 -> 768 -> 1024
    MiB -> the maximum (1 GiB of data plus its metadata, in whole extents)."""
    virtual = 1024 * MiB
    half = virtual // 2
    lv = "vm-101-disk-0.qcow2"
    maximum = measured_maximum(virtual, vg.extent_size())
    with daemons(bed) as (_, pvestord), thin_vm(bed, vg, 101, virtual=virtual) as vm:
        # The start reconcile arms the threshold: LV 256 MiB - half a chunk.
        wait_until(lambda: vm.named_node(file_node(vm))["write_threshold"] == 128 * MiB, 30,
                   "threshold armed by reconcile")
        outcome = paced_write(vm, fmt_node(vm), 0, half, 0x5A)
        assert outcome.errors == []
        wait_until(lambda: bed.entries() == [], EXTEND_TIMEOUT, "queue drained")
        # Half-way: whole chunks, re-armed half a chunk below the end.
        size = vg.lv_size(lv)
        assert size % (256 * MiB) == 0
        assert half < size < maximum
        assert vm.named_node(file_node(vm))["write_threshold"] == size - 128 * MiB

        outcome = paced_write(vm, fmt_node(vm), half, virtual - half, 0x5A)
        assert outcome.errors == []
        wait_until(lambda: vg.lv_size(lv) == maximum, EXTEND_TIMEOUT, "LV at its maximum")
        # At the maximum nothing is left to arm for.
        wait_until(lambda: vm.named_node(file_node(vm))["write_threshold"] == 0, 30,
                   "no threshold at the maximum")
        for offset in range(0, virtual, 128 * MiB):
            assert vm.read_verify(fmt_node(vm), offset, 128 * MiB, 0x5A), offset
        # One extension per crossing, never two; and a pass asked for the
        # drive at its maximum (an entry, as a late event brings it) adds nothing.
        assert len(extensions(pvestord.log_text())) == 4
        bed.queue.append([Entry(101, file_node(vm), Reason.THRESHOLD, origin=bed.node)])
        wait_until(lambda: bed.entries() == [], EXTEND_TIMEOUT, "the late entry handled")
        assert vg.lv_size(lv) == maximum
        assert len(extensions(pvestord.log_text())) == 4
        # The node's device link survives the extensions (udev did not drop it).
        assert Path(vg.lv_path(lv)).is_block_device()
    assert qcow2_check(vg.lv_path(lv))["exit"] == 0


@pytest.fixture
def second_vg() -> Iterator[VG]:
    with loop_vg(prefix="pvu") as other:
        yield other


def test_two_vgs_extend_concurrently(bed: NodeBed, vg: VG, second_vg: VG) -> None:
    bed.storages.append(ThinStorageSpec("thin2", second_vg.name))
    bed.write_storage_config()
    with daemons(bed) as (_, pvestord), thin_vm(bed, vg, 201) as a, \
            thin_vm(bed, second_vg, 202) as b:
        for vm in (a, b):
            wait_until(lambda vm=vm: vm.named_node(file_node(vm))["write_threshold"] > 0, 30,
                       "armed")
        # Fill both to just below their 128 MiB thresholds, then cross both at
        # the same moment (each VM is its own QEMU: one thread each).
        a.write_pattern(fmt_node(a), 0, 112 * MiB, 0x01, timeout=120)
        b.write_pattern(fmt_node(b), 0, 112 * MiB, 0x02, timeout=120)
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            crossings = [pool.submit(vm.write_pattern, fmt_node(vm), 112 * MiB, 32 * MiB, pattern)
                         for vm, pattern in ((a, 0x01), (b, 0x02))]
            assert all(f.result(timeout=120).ok for f in crossings)
        wait_until(lambda: vg.lv_size("vm-201-disk-0.qcow2") > 256 * MiB
                   and second_vg.lv_size("vm-202-disk-0.qcow2") > 256 * MiB,
                   EXTEND_TIMEOUT, "both extended")
        log = pvestord.log_text()
    # Each extension logs when it starts working under its VG's lock and when
    # it is done: with one worker per VG the two intervals overlap.
    spans = extension_spans(log)
    assert set(spans) == {"201", "202"}, log[-3000:]
    (s1, e1), (s2, e2) = spans["201"], spans["202"]
    assert s1 < e2 and s2 < e1, spans


def extension_spans(log: str) -> dict[str, tuple[float, float]]:
    """VMID -> (start, end) of its first extension, from the DURATION_MS field."""
    spans: dict[str, tuple[float, float]] = {}
    for line in extensions(log):
        spans.setdefault(line.fields["VMID"],
                         (line.time - int(line.fields["DURATION_MS"]) / 1000, line.time))
    return spans


def test_full_vg_keeps_the_entry_then_extends_when_space_is_added(
        tmp_path: Path, out_dir: Path) -> None:
    # A VG with room for the LV and less than one chunk more: LVM refuses
    # the chunk (the reserve holds back only an extension that fits).
    with loop_vg(320 * MiB) as small:
        bed = NodeBed(tmp_path, [ThinStorageSpec("thin1", small.name)], logs_dir=out_dir)
        with daemons(bed) as (_, pvestord), thin_vm(bed, small, 301) as vm:
            wait_until(lambda: vm.named_node(file_node(vm))["write_threshold"] > 0, 30, "armed")
            vm.write_pattern(fmt_node(vm), 0, 144 * MiB, 0x07)
            wait_until(lambda: records(pvestord.log_text(), "ERROR", VMID="301"),
                       EXTEND_TIMEOUT, "VG full logged")
            assert [e.block_node for e in bed.entries()] == [file_node(vm)]
            # Retries happen meanwhile (with -v, a DEBUG line notes each)...
            wait_until(lambda: len(records(pvestord.log_text(), "DEBUG", VMID="301",
                                           BLOCK_NODE=file_node(vm), STILL_FAILING="yes")) >= 2,
                       EXTEND_TIMEOUT, "two retries")
            # ...and the failure is logged once at ERROR.
            errors = records(pvestord.log_text(), "ERROR", VMID="301", BLOCK_NODE=file_node(vm))
            assert len(errors) == 1, errors
            small.add_pv(1 * GiB)
            wait_until(lambda: small.lv_size("vm-301-disk-0.qcow2") > 256 * MiB, 120,
                       "extended after vgextend")
            wait_until(lambda: bed.entries() == [], 30, "entry done")
            assert vm.write_pattern(fmt_node(vm), 144 * MiB, 200 * MiB, 0x08).ok
            # ...and its recovery once, with the same fields.
            assert len(records(pvestord.log_text(), VMID="301", BLOCK_NODE=file_node(vm),
                               RECOVERED="yes")) == 1


def test_reconcile_catches_missed_events(bed: NodeBed, vg: VG) -> None:
    lv = "vm-401-disk-0.qcow2"
    with thin_vm(bed, vg, 401) as vm:
        # No daemon: the write crosses where a threshold should be, unseen.
        vm.write_pattern(fmt_node(vm), 0, 200 * MiB, 0x09)
        with daemons(bed):
            wait_until(lambda: vg.lv_size(lv) >= 512 * MiB, EXTEND_TIMEOUT, "reconciled")
            wait_until(lambda: vm.named_node(file_node(vm))["write_threshold"] > 200 * MiB, 30,
                       "re-armed above the allocation")
        assert vm.read_verify(fmt_node(vm), 0, 200 * MiB, 0x09)


def test_duplicate_and_stale_entries(bed: NodeBed, vg: VG) -> None:
    lv = "vm-501-disk-0.qcow2"
    with daemons(bed) as (_, pvestord), thin_vm(bed, vg, 501) as vm:
        wait_until(lambda: vm.named_node(file_node(vm))["write_threshold"] > 0, 30, "armed")
        bed.queue.append([
            Entry(501, file_node(vm), Reason.THRESHOLD, origin=bed.node),  # duplicate: has headroom
            Entry(501, "nosuchnode", Reason.THRESHOLD, origin=bed.node),
            Entry(999, file_node(vm), Reason.THRESHOLD, origin=bed.node),  # VM gone
        ])
        wait_until(lambda: bed.entries() == [], 30, "all three handled")
        assert vg.lv_size(lv) == 256 * MiB  # the duplicate did nothing
        log = pvestord.log_text()
        assert records(log, "WARNING", VMID="501", BLOCK_NODE="nosuchnode"), log[-3000:]
        assert records(log, "INFO", VMID="999", BLOCK_NODE=file_node(vm)), log[-3000:]


def test_vm_paused_by_the_user_is_never_resumed(bed: NodeBed, vg: VG) -> None:
    with daemons(bed), thin_vm(bed, vg, 601) as vm:
        wait_until(lambda: vm.named_node(file_node(vm))["write_threshold"] > 0, 30, "armed")
        vm.qmp("stop")
        # BLOCK_IO_ERROR names the device's root node: the throttle node.
        bed.queue.append([Entry(601, pve9_disk(vm).top_node, Reason.NOSPACE,
                                origin=bed.node)])
        wait_until(lambda: bed.entries() == [], 30, "entry handled")
        assert vm.qmp("query-status")["status"] == "paused"
        # Nor by a second pass, one that finds nothing to extend either.
        bed.queue.append([Entry(601, pve9_disk(vm).top_node, Reason.NOSPACE,
                                origin=bed.node)])
        wait_until(lambda: bed.entries() == [], 30, "the second entry handled")
        assert vm.qmp("query-status")["status"] == "paused"


def test_manual_extend_and_drives_commands(bed: NodeBed, vg: VG) -> None:
    lv = "vm-701-disk-0.qcow2"
    common = ["--storage-config", str(bed.storage_cfg), "--run-dir", str(bed.run_dir)]
    with thin_vm(bed, vg, 701) as vm:
        vm.write_pattern(fmt_node(vm), 0, 32 * MiB, 0x0A)
        out = subprocess.run(  # noqa: S603 - argument list
            ["pvestord", "--queue", str(bed.queue_path), "extend", "701", file_node(vm),
             *common],
            capture_output=True, text=True, timeout=120, check=True).stdout
        assert "extended" in out
        assert vg.lv_size(lv) == 512 * MiB
        report = json.loads(subprocess.run(  # noqa: S603
            ["pvestord", "--queue", str(bed.queue_path), "drives", "--json", *common],
            capture_output=True, text=True, timeout=120, check=True).stdout)
        assert len(report) == 1
        row = report[0]
        assert (row["vmid"], row["block_node"], row["lv_size"], row["threshold"],
                row["storage"], row["state"]) == (
                    701, file_node(vm), 512 * MiB, 384 * MiB, "thin1", "armed")
        assert row["allocation"] >= 32 * MiB
        assert row["maximum"] == measured_maximum(8 * GiB, vg.extent_size())
        bad = subprocess.run(  # noqa: S603
            ["pvestord", "--queue", str(bed.queue_path), "extend", "701", "nosuch", *common],
            capture_output=True, text=True, timeout=120)
        assert bad.returncode == 1
        assert "no block node 'nosuch'" in bad.stderr


def test_restarted_daemon_finishes_queued_work(bed: NodeBed, vg: VG) -> None:
    lv = "vm-801-disk-0.qcow2"
    with thin_vm(bed, vg, 801) as vm:
        vm.write_pattern(fmt_node(vm), 0, 160 * MiB, 0x0B)
        bed.queue.append([Entry(801, file_node(vm), Reason.THRESHOLD, origin=bed.node)])
        pvestord = start_pvestord(bed)
        try:
            wait_until(lambda: bed.entries() == [], EXTEND_TIMEOUT, "entry done")
            assert vg.lv_size(lv) == 512 * MiB
        finally:
            assert pvestord.stop() == 0
        assert "STOPPING=1" in pvestord.notified  # as systemd hears a clean stop
