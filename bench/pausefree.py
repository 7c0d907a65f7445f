"""Scenario 5: how fast a writer may go without a failed write, per chunk-percentage.

A writer at full speed through QEMU (one ``qemu-io`` tool session on an NBD
export of the qcow2 node, 16 MiB writes, back to back, no pacing) over
``total`` bytes of fresh data, on a thin drive managed by the real daemons;
with ``-machine none`` there is no guest device, so a write past the LV's
end fails with ENOSPC instead of pausing a VM. For each
chunk-percentage from large to small: failed writes, the writer's rate and
the headroom (chunksize x chunk-percentage). The smallest headroom with
zero failures is compared with rate x p99 latency (scenario 1) by bench.run.

The settings are set up side by side (each with its own VG, storage id,
daemons and QEMU) and written one after the other: while one writer runs,
the other settings' daemons idle beside it, as in scenarios 1-3.

Caveat of the method: the writer waits for each write before the next,
where a guest keeps several in flight.
"""

from __future__ import annotations

import contextlib
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from bench.latency import (
    FILE_NODE,
    FORMAT_NODE,
    IO_TIMEOUT,
    VIRTUAL,
    VMID,
    VOLID,
    armed_threshold,
)
from bench.together import enter_together, one_at_a_time
from tests.harness.daemons import NodeBed, ThinStorageSpec, daemons
from tests.harness.lvmbed import VG, MiB, loop_vg, qcow2_create
from tests.harness.polling import wait_until
from tests.harness.qemu import Pve9Disk, QemuVM

WRITE = 16 * MiB
CHUNK = 256 * MiB
DRAIN_TIMEOUT = 180.0
#: Written data of the settings alive at once: every byte is memory on the
#: guest's tmpfs (quick mode: two settings of 512 MiB; full mode: one of 2 GiB).
TOGETHER_BYTES = 1024 * MiB


class Setting:
    """One chunk-percentage: its own VG, daemons and QEMU, ready for the writer."""

    def __init__(self, percentage: float, bed: NodeBed, vg: VG, lv: str, vm: QemuVM) -> None:
        self.percentage = percentage
        self.bed = bed
        self.vg = vg
        self.lv = lv
        self.vm = vm

    def write(self, total: int) -> dict[str, Any]:
        """The writer at full speed over ``total`` bytes of fresh data; its failures and rate."""
        failed = 0
        errors: set[str] = set()
        writing = 0.0  # seconds in writes that succeeded: a failed write is quick
        began = time.monotonic()
        with self.vm.io_session() as io:
            for offset in range(0, total, WRITE):
                started = time.monotonic()
                result = io.write_pattern(FORMAT_NODE, offset, WRITE, 0x3C, check=False,
                                          timeout=IO_TIMEOUT)
                if result.ok:
                    writing += time.monotonic() - started
                else:
                    failed += 1
                    errors.add(str(result.error))
        elapsed = time.monotonic() - began
        wait_until(lambda: not self.bed.entries(), DRAIN_TIMEOUT, "the queue to drain")
        return {"percentage": self.percentage, "chunk": CHUNK,
                "headroom": int(CHUNK * self.percentage), "writes": total // WRITE,
                "failed_writes": failed, "errors": sorted(errors), "seconds": elapsed,
                "rate": (total // WRITE - failed) * WRITE / writing if writing else 0.0,
                "final_lv_size": self.vg.lv_size(self.lv)}


@contextlib.contextmanager
def setting(out: Path, percentage: float, total: int) -> Iterator[Setting]:
    logs = out / f"pausefree-{percentage:g}"
    logs.mkdir(parents=True, exist_ok=True)
    with one_at_a_time(loop_vg(total + 3 * CHUNK + 256 * MiB, prefix="pf")) as vg, \
            tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        # Its own storage id per setting: the storage lock is a flock named after it.
        spec = ThinStorageSpec(f"san{int(percentage * 100)}", vg.name,
                               chunksize=f"{CHUNK // MiB}M", chunk_percentage=percentage,
                               initial_size=f"{CHUNK // MiB}M")
        bed = NodeBed(Path(tmp), [spec], logs_dir=logs, verbose=False)
        lv = f"vm-{VMID}-disk-0.qcow2"
        path = vg.create_lv(lv, CHUNK)
        qcow2_create(path, VIRTUAL)
        with daemons(bed) as _, QemuVM(
                VMID, bed.run_dir, disks=[Pve9Disk.for_volume(path, VOLID)],
                event_socket=bed.event_socket, log_path=logs / "qemu.log") as vm:
            wait_until(lambda: armed_threshold(vm, FILE_NODE) > 0, 60, "the first threshold")
            yield Setting(percentage, bed, vg, lv, vm)


def run(out: Path, total: int, percentages: Sequence[float]) -> dict[str, Any]:
    """One setting per chunk-percentage, from large to small.

    Settings are set up together and torn down together, as many at once as
    the guest's memory holds their written data (set-up is most of this
    scenario's time in quick mode); the writers run one at a time, each alone.
    """
    ordered = sorted(percentages, reverse=True)
    together = max(1, TOGETHER_BYTES // total)
    settings: list[dict[str, Any]] = []
    for first in range(0, len(ordered), together):
        with contextlib.ExitStack() as stack:
            beds: list[Setting] = enter_together(
                stack, [setting(out, p, total) for p in ordered[first:first + together]])
            settings += [bed.write(total) for bed in beds]
    clean = [s["headroom"] for s in settings if s["failed_writes"] == 0]
    return {"total": total, "write": WRITE, "settings": settings,
            "smallest_clean_headroom": min(clean) if clean else None,
            # The writer's speed when it is not failing, the best seen.
            "rate": max(s["rate"] for s in settings)}
