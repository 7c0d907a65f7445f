"""Extend queue throughput: appends/s and takes/s with 1, 4 and 8 concurrent
writers, on both lock backends, on this machine's disk and on tmpfs.

Each run starts W writer processes that append ``--count`` entries each (one
append per entry, as qmeventd does per event) and one taker that, like the
daemon, reads a snapshot and completes the entries one by one. appends/s is
all appends over the slowest writer's time; takes/s is completed entries over
the taker's time until the last one. Lock timeouts are retried and counted.

    .venv/bin/python -m bench.queue_bench [--count N] [--out out/bench/queue.json]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import multiprocessing.connection
import os
import platform
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from pvestord.adapters.locks import LockTimeout, queue_lock
from pvestord.adapters.queue import Entry, ExtendQueue

WRITERS = (1, 4, 8)
BACKENDS = ("flock", "lockdir")
RUN_BUDGET = 600.0


def _open(folder: Path, backend: str) -> ExtendQueue:
    path = folder / "extend-queue"
    lock_dir = folder / "lock" if backend == "lockdir" else None
    return ExtendQueue(path, lock=queue_lock(path, lock_dir))


def _writer(folder: Path, backend: str, index: int, count: int, start: Any,
            out: multiprocessing.connection.Connection) -> None:
    queue = _open(folder, backend)
    start.wait()
    timeouts = 0
    began = time.perf_counter()
    for i in range(count):
        entry = Entry(1000 + index, f"w{index}-{i}", origin=f"node{index}")
        while True:
            try:
                queue.append([entry])
                break
            except LockTimeout:
                timeouts += 1
    out.send({"seconds": time.perf_counter() - began, "timeouts": timeouts})


def _taker(folder: Path, backend: str, total: int, start: Any,
           out: multiprocessing.connection.Connection) -> None:
    queue = _open(folder, backend)
    start.wait()
    taken = completes = timeouts = 0
    began = time.perf_counter()
    deadline = time.monotonic() + RUN_BUDGET
    while taken < total and time.monotonic() < deadline:
        batch = queue.pending(lambda e: True)
        if not batch:
            time.sleep(0.001)
            continue
        for entry in batch:
            try:
                taken += queue.complete([entry])
                completes += 1
            except LockTimeout:
                timeouts += 1
    out.send({"seconds": time.perf_counter() - began, "taken": taken, "completes": completes,
              "timeouts": timeouts})


def run_one(base: Path, backend: str, writers: int, count: int) -> dict[str, Any]:
    folder = Path(tempfile.mkdtemp(dir=base, prefix=f"{backend}-{writers}-"))
    (folder / "lock").mkdir()
    ctx = multiprocessing.get_context("fork")
    start = ctx.Event()
    pipes = []
    procs = []
    for role in ["taker"] + [f"writer{i}" for i in range(writers)]:
        recv, send = ctx.Pipe(duplex=False)
        if role == "taker":
            proc = ctx.Process(target=_taker, args=(folder, backend, writers * count, start, send))
        else:
            proc = ctx.Process(target=_writer,
                               args=(folder, backend, int(role[6:]), count, start, send))
        proc.start()
        pipes.append(recv)
        procs.append(proc)
    start.set()
    results = []
    for recv, proc in zip(pipes, procs, strict=True):
        if not recv.poll(RUN_BUDGET):
            for p in procs:
                p.kill()
            raise SystemExit(f"{backend} with {writers} writers overran {RUN_BUDGET} s")
        results.append(recv.recv())
        proc.join(10)
    shutil.rmtree(folder)
    taker, wrote = results[0], results[1:]
    appends = writers * count
    writer_seconds = max(w["seconds"] for w in wrote)
    return {
        "backend": backend, "writers": writers, "appends": appends,
        "appends_per_s": appends / writer_seconds,
        "takes_per_s": taker["taken"] / taker["seconds"],
        "taken": taker["taken"], "lost": appends - taker["taken"],
        "writer_lock_timeouts": sum(w["timeouts"] for w in wrote),
        "taker_lock_timeouts": taker["timeouts"],
        "seconds": max(writer_seconds, taker["seconds"]),
    }


def folders(out_dir: Path) -> dict[str, Path]:
    found = {"disk": out_dir}
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        found["tmpfs"] = shm
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=500, help="appends per writer")
    parser.add_argument("--out", type=Path, default=Path("out/bench/queue.json"))
    args = parser.parse_args()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    rows = []
    for fs, base in folders(args.out.parent).items():
        with tempfile.TemporaryDirectory(dir=base, prefix="queue-bench-") as tmp:
            for backend in BACKENDS:
                for writers in WRITERS:
                    row = {"fs": fs, **run_one(Path(tmp), backend, writers, args.count)}
                    rows.append(row)
                    print(f"{fs:6} {backend:8} {writers} writers: {row['appends_per_s']:7.0f} "
                          f"appends/s {row['takes_per_s']:7.0f} takes/s  lost {row['lost']}  "
                          f"lock timeouts {row['writer_lock_timeouts']}"
                          f"+{row['taker_lock_timeouts']}", flush=True)
    report = {"bench": "queue", "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
              "host": platform.node(), "cpus": os.cpu_count(), "python": platform.python_version(),
              "count_per_writer": args.count, "runs": rows}
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"report: {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
