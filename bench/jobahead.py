"""Scenario 10: how soon the daemon grows the target of a block job nobody announced.

qemu-server's own jobs get their room from the storage plugin before they
start (scenario 9). A ``block-stream`` an admin starts by hand does not: the
daemon sees it run (``JOB_STATUS_CHANGE``, a queue entry), reads what it
still copies from its layers' allocation map (``qemu-img map``), and grows
its target by that, in one step (pvestord/engine/jobroom.py). On QEMU's
default ``on-error=report`` the job fails at its first ENOSPC, so the figure
that matters is a race: the room the target has when the job starts,
against what the job copies before the daemon's step lands.

Each run streams ``data`` bytes from a snapshot layer into a thin top of
INITIAL bytes, under both daemons, at each rate of RATES (bytes a second; 0
is QEMU's full speed). Measured: from the ``block-stream`` command to the
top's LV grown to hold the data (``lvs`` every POLL s), what the job had
copied by then (its ``offset`` past the data's start), and whether it
completed without error. The target: no job at a rate up to
SAFE_RATE fails; at full speed the figures say how much room a target
needs to ride out the daemon's reaction.

Seen in the node guest (quick run, 256 MiB per stream, a 64 MiB top): at
64 MiB/s the top was grown after 1.4 s with 29 MiB copied, and no job
failed; at full speed both jobs had failed on ENOSPC within 0.7 and 1.9 s,
before the step landed. An admin's job at disk speed needs
``on-error=enospc`` (it is then paused, given room and resumed) or a
``speed``.
"""

from __future__ import annotations

import contextlib
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.blockjobs import qemu_io
from bench.report import Figure, summary
from pvestord.policy.blockjobs import WRITING
from tests.harness.daemons import NodeBed, ThinStorageSpec, daemons
from tests.harness.lvmbed import VG, GiB, MiB, loop_vg, sh
from tests.harness.qemu import Pve9Disk, QemuVM, create_qcow2

DISK = 4 * GiB
CHUNK = 32 * MiB
INITIAL = 64 * MiB
#: Where the snapshot's data lies: the stream steps over the first GiB first.
DATA_OFFSET = GiB
VMID = 9200
STORE = "ahead"
#: The rates each run streams at (0: full speed), bytes a second.
RATES = (0, 64 * MiB)
#: The rate up to which no job may fail.
SAFE_RATE = 64 * MiB
POLL = 0.05
JOB_TIMEOUT = 900.0
START_TIMEOUT = 300.0


@dataclass(frozen=True)
class StreamRun:
    rate: int
    #: Seconds from the command to the top grown to hold the data; None if never.
    grown_after: float | None
    #: What the job had copied of the data by then, bytes.
    copied_by_then: int | None
    #: Seconds from the command to BLOCK_JOB_COMPLETED.
    job: float
    failed: bool


def run(out: Path, rounds: int, data: int) -> dict[str, Any]:
    """``rounds`` streams of ``data`` bytes at each rate of RATES, in turn."""
    runs: list[StreamRun] = []
    with _bed(out, data) as (bed, vg):
        for _ in range(rounds):
            for rate in RATES:
                runs.append(_stream(bed, vg, data, rate))
    result: dict[str, Any] = {"rounds": rounds, "data_bytes": data, "initial": INITIAL}
    for rate in RATES:
        done = [r for r in runs if r.rate == rate]
        result[str(rate)] = {
            "grown_after_seconds": summary([r.grown_after for r in done
                                            if r.grown_after is not None]),
            "copied_by_then_bytes": summary([r.copied_by_then for r in done
                                             if r.copied_by_then is not None]),
            "job_seconds": summary([r.job for r in done]),
            "failed": sum(r.failed for r in done), "runs": len(done)}
    return result


@contextlib.contextmanager
def _bed(out: Path, data: int) -> Iterator[tuple[NodeBed, VG]]:
    logs = out / "jobahead"
    logs.mkdir(parents=True, exist_ok=True)
    with loop_vg(3 * (data + DISK // 8) + GiB, prefix="pva") as vg, \
            tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        spec = ThinStorageSpec(STORE, vg.name, chunksize=f"{CHUNK // MiB}M",
                               initial_size=f"{INITIAL // MiB}M")
        yield NodeBed(Path(tmp), [spec], logs_dir=logs, verbose=False), vg


def _stream(bed: NodeBed, vg: VG, data: int, rate: int) -> StreamRun:
    """The snapshot's ``data`` streamed into a thin, empty top, as an admin would."""
    base, snap, top = ("snap_vm-9200-disk-0_a.qcow2", "snap_vm-9200-disk-0_b.qcow2",
                       "vm-9200-disk-0.qcow2")
    vg.create_lv(base, INITIAL)
    create_qcow2(vg.lv_path(base), DISK)
    vg.create_lv(snap, data + INITIAL)
    create_qcow2(vg.lv_path(snap), DISK, options=(f"backing_file={base}", "backing_fmt=qcow2"))
    qemu_io(vg.lv_path(snap), f"write -P 0x44 {DATA_OFFSET} {data}")
    vg.create_lv(top, INITIAL)
    create_qcow2(vg.lv_path(top), DISK, options=(f"backing_file={snap}", "backing_fmt=qcow2"))
    disk = Pve9Disk.for_volume(vg.lv_path(top), f"{STORE}:{top}")
    try:
        with daemons(bed, start_timeout=START_TIMEOUT), \
                QemuVM(VMID, bed.run_dir, disks=[disk], event_socket=bed.event_socket) as vm:
            _wait(lambda: vm.named_node(disk.file_block_node)["write_threshold"] != 0,
                  START_TIMEOUT, "the top armed")
            job = "stream0"
            began = time.monotonic()
            vm.qmp("block-stream", {"job-id": job, "device": disk.block_node,
                                    "base-node": vm.format_node_on(vg.lv_path(base)),
                                    "speed": rate})
            grown_after: float | None = None
            copied: int | None = None
            while True:
                jobs = {j["device"]: j for j in vm.qmp("query-block-jobs")}
                if job not in jobs or jobs[job]["status"] not in WRITING:
                    break  # it ended (a failed one keeps its offset a moment)
                if vg.lv_size(top) >= data:
                    grown_after = time.monotonic() - began
                    copied = max(0, int(jobs[job]["offset"]) - DATA_OFFSET)
                    break
                time.sleep(POLL)
            clean = vm.job_completed_cleanly(timeout=JOB_TIMEOUT)
            ended = time.monotonic()
        return StreamRun(rate, grown_after, copied, ended - began, failed=not clean)
    finally:
        sh("lvremove", "-q", "-f", vg.lv_path(top), vg.lv_path(snap), vg.lv_path(base),
           check=False)


def _wait(condition: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {what} within {timeout:g} s")
        time.sleep(POLL)


def figures(result: dict[str, Any] | None) -> list[Figure]:
    rows: list[Figure] = []
    for rate in RATES:
        side = result.get(str(rate), {}) if result else {}
        name = "full speed" if rate == 0 else f"{rate // MiB} MiB/s"
        copied = _p50(side, "copied_by_then_bytes")
        failed = side.get("failed")
        rows += [
            Figure("10 job ahead", f"stream {name}: grown after p50",
                   _p50(side, "grown_after_seconds"), "s"),
            Figure("10 job ahead", f"stream {name}: copied by then p50",
                   None if copied is None else copied / MiB, "MiB",
                   note=f"the top had {INITIAL // MiB} MiB at the start"),
            Figure("10 job ahead", f"stream {name}: jobs failed",
                   None if failed is None else float(failed),
                   target=("<=", 0.0) if 0 < rate <= SAFE_RATE else None,
                   note=f"of {side['runs']}" if side else "")]
    return rows


def _p50(side: dict[str, Any], key: str) -> float | None:
    value = side.get(key, {}).get("p50")
    return None if value is None else float(value)
