"""Scenario 11: how long a guest is paused while its copy target is reduced under it.

A live move disk leaves the VM running on a thick copy target; the daemon's
reconcile pass pauses the VM, reads the image's end (``qemu-img check
-U``), reduces the LV and resumes it (pvestord/engine/livereduce.py). The
figure an admin asks about is the pause: QEMU's own ``STOP`` and ``RESUME``
events, whose timestamps QEMU takes as it pauses and resumes the guest, seen
on a monitor of the harness's. The daemon's own count (``DURATION_MS`` of
its ``LIVE_REDUCTION=done`` record) is reported beside it, with the LV's
size before and after.

Each run: a VM whose disk is a tagged LV at the image's maximum holding
``data`` bytes, as the mirror left it; both daemons started; the pass after
their start reduces it. For each size of DATA, ``rounds`` runs.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.report import Figure, summary
from pvestord.policy.capacity import COPY_TAG
from tests.harness.daemonlog import records
from tests.harness.daemons import NodeBed, ThinStorageSpec, daemons
from tests.harness.lvmbed import VG, GiB, MiB, loop_vg, measured_maximum, sh
from tests.harness.polling import wait_until
from tests.harness.qemu import Pve9Disk, QemuVM, create_qcow2

DISK = 8 * GiB
CHUNK = 256 * MiB
VMID = 9300
STORE = "livepause"
#: What the mirror copied, per run size.
DATA = (256 * MiB, 1536 * MiB)
START_TIMEOUT = 300.0
REDUCE_TIMEOUT = 300.0


@dataclass(frozen=True)
class PauseRun:
    data: int
    #: From QEMU's STOP event to its RESUME event, as QEMU stamped them.
    paused: float
    #: The daemon's own count, from its ``stop`` to its ``cont``.
    daemon_paused: float
    lv_before: int
    lv_after: int


def run(out: Path, rounds: int) -> dict[str, Any]:
    """``rounds`` reductions for each size of :data:`DATA`."""
    runs: list[PauseRun] = []
    with _bed(out) as (bed, vg):
        for _ in range(rounds):
            for data in DATA:
                # A VMID per run: the daemons' logs go on across runs.
                runs.append(_reduce(bed, vg, data, VMID + len(runs)))
    result: dict[str, Any] = {"rounds": rounds, "disk_bytes": DISK, "chunk_bytes": CHUNK}
    for data in DATA:
        done = [r for r in runs if r.data == data]
        result[str(data)] = {
            "paused_seconds": summary([r.paused for r in done]),
            "daemon_paused_seconds": summary([r.daemon_paused for r in done]),
            "lv_before_bytes": max(r.lv_before for r in done),
            "lv_after_bytes": max(r.lv_after for r in done), "runs": len(done)}
    return result


@contextlib.contextmanager
def _bed(out: Path) -> Iterator[tuple[NodeBed, VG]]:
    logs = out / "livepause"
    logs.mkdir(parents=True, exist_ok=True)
    with loop_vg(DISK + 2 * GiB, prefix="pvl") as vg, \
            tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        spec = ThinStorageSpec(STORE, vg.name, chunksize=f"{CHUNK // MiB}M")
        yield NodeBed(Path(tmp), [spec], logs_dir=logs, verbose=False), vg


def _reduce(bed: NodeBed, vg: VG, data: int, vmid: int) -> PauseRun:
    lv = f"vm-{vmid}-disk-0.qcow2"
    maximum = measured_maximum(DISK, vg.extent_size())
    vg.create_lv(lv, maximum)
    create_qcow2(vg.lv_path(lv), DISK)
    sh("lvchange", "-q", f"--addtag={COPY_TAG}", vg.lv_path(lv))
    disk = Pve9Disk.for_volume(vg.lv_path(lv), f"{STORE}:{lv}")
    try:
        with QemuVM(vmid, bed.run_dir, disks=[disk], event_socket=bed.event_socket) as vm:
            assert vm.write_pattern(disk.block_node, 0, data, 0x6A, timeout=900).ok
            vm.qmp("query-status")  # the harness's monitor now collects events
            with daemons(bed, start_timeout=START_TIMEOUT) as (_, pvestord):
                stop = vm.wait_event("STOP", timeout=REDUCE_TIMEOUT)
                resume = vm.wait_event("RESUME", timeout=REDUCE_TIMEOUT)
                wait_until(lambda: records(pvestord.log_text(), VMID=str(vmid),
                                           LIVE_REDUCTION="done"), REDUCE_TIMEOUT, "reduced")
                (done,) = records(pvestord.log_text(), VMID=str(vmid), LIVE_REDUCTION="done")
            assert vm.read_verify(disk.block_node, 0, min(data, 64 * MiB), 0x6A)
        return PauseRun(data, _stamp(resume) - _stamp(stop),
                        int(done.fields["DURATION_MS"]) / 1000, maximum, vg.lv_size(lv))
    finally:
        sh("lvremove", "-q", "-f", vg.lv_path(lv), check=False)


def _stamp(event: dict[str, Any]) -> float:
    stamp = event["timestamp"]
    return float(stamp["seconds"]) + float(stamp["microseconds"]) / 1e6


def figures(result: dict[str, Any] | None) -> list[Figure]:
    rows: list[Figure] = []
    for data in DATA:
        side = result.get(str(data), {}) if result else {}
        label = f"{data // MiB} MiB"
        rows += [
            Figure("11 live reduction", f"guest paused p50, {label}",
                   side.get("paused_seconds", {}).get("p50"), "s"),
            Figure("11 live reduction", f"guest paused max, {label}",
                   side.get("paused_seconds", {}).get("max"), "s"),
            Figure("11 live reduction", f"daemon's count p50, {label}",
                   side.get("daemon_paused_seconds", {}).get("p50"), "s"),
            Figure("11 live reduction", f"LV before, {label}",
                   None if "lv_before_bytes" not in side else side["lv_before_bytes"] / MiB,
                   "MiB"),
            Figure("11 live reduction", f"LV after, {label}",
                   None if "lv_after_bytes" not in side else side["lv_after_bytes"] / MiB,
                   "MiB")]
    return rows
