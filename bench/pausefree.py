"""Scenario 5: how fast a writer may go without a failed write, per chunk-percentage.

A writer at full speed through QEMU (HMP ``qemu-io``, 16 MiB writes, back to
back, no pacing) over ``total`` bytes of fresh data, on a thin drive managed
by the real daemons; with ``-machine none`` there is no guest device, so a
write past the LV's end fails with ENOSPC instead of pausing a VM. For each
chunk-percentage from large to small: failed writes, the writer's rate and
the headroom (chunksize x chunk-percentage). The smallest headroom with
zero failures is compared with rate x p99 latency (scenario 1) by bench.run.

Caveat of the method: an HMP ``qemu-io`` holds QEMU's main loop while it
runs, so the daemon's QMP calls wait for the write in progress; a guest's
own writes do not do that.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.latency import FILE_NODE, FORMAT_NODE, IO_TIMEOUT, VIRTUAL, VMID, armed_threshold
from tests.harness.daemons import NodeBed, ThinStorageSpec, daemons, wait_for
from tests.harness.lvmbed import MiB, loop_vg, qcow2_create
from tests.harness.qemu import Disk, QemuVM

WRITE = 16 * MiB
CHUNK = 256 * MiB
DRAIN_TIMEOUT = 180.0


def one_setting(out: Path, percentage: float, total: int) -> dict[str, Any]:
    logs = out / f"pausefree-{percentage:g}"
    logs.mkdir(parents=True, exist_ok=True)
    with loop_vg(total + 3 * CHUNK + 256 * MiB, prefix="pf") as vg, \
            tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        spec = ThinStorageSpec("san", vg.name, chunksize=f"{CHUNK // MiB}M",
                               chunk_percentage=percentage, initial_size=f"{CHUNK // MiB}M")
        bed = NodeBed(Path(tmp), [spec], logs_dir=logs, verbose=False)
        lv = f"vm-{VMID}-disk-0.qcow2"
        path = vg.create_lv(lv, CHUNK)
        qcow2_create(path, VIRTUAL)
        with daemons(bed) as _, QemuVM(
                VMID, bed.run_dir, disks=[Disk(path, FORMAT_NODE, FILE_NODE)],
                event_socket=bed.event_socket, log_path=logs / "qemu.log") as vm:
            wait_for(lambda: armed_threshold(vm, FILE_NODE) > 0, 60, "the first threshold")
            failed = 0
            errors: set[str] = set()
            writing = 0.0  # seconds in writes that succeeded: a failed write is quick
            began = time.monotonic()
            for offset in range(0, total, WRITE):
                started = time.monotonic()
                result = vm.write_pattern(FORMAT_NODE, offset, WRITE, 0x3C, check=False,
                                          timeout=IO_TIMEOUT)
                if result.ok:
                    writing += time.monotonic() - started
                else:
                    failed += 1
                    errors.add(str(result.error))
            elapsed = time.monotonic() - began
            wait_for(lambda: not bed.entries(), DRAIN_TIMEOUT, "the queue to drain")
            final_size = vg.lv_size(lv)
    return {"percentage": percentage, "chunk": CHUNK, "headroom": int(CHUNK * percentage),
            "writes": total // WRITE, "failed_writes": failed, "errors": sorted(errors),
            "seconds": elapsed,
            "rate": (total // WRITE - failed) * WRITE / writing if writing else 0.0,
            "final_lv_size": final_size}


def run(out: Path, total: int, percentages: Sequence[float]) -> dict[str, Any]:
    """One setting per chunk-percentage, from large to small."""
    settings = [one_setting(out, p, total) for p in sorted(percentages, reverse=True)]
    clean = [s["headroom"] for s in settings if s["failed_writes"] == 0]
    return {"total": total, "write": WRITE, "settings": settings,
            "smallest_clean_headroom": min(clean) if clean else None,
            # The writer's speed when it is not failing, the best seen.
            "rate": max(s["rate"] for s in settings)}
