"""Processes for the queue and lock tests: real writers, a taker and lock holders.

Run as ``python tests/unit/helpers_queue.py ROLE ...``; each prints one JSON
line with what it did, so the test can check it.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from pvestord.adapters.locks import FlockLock, LockDirLock, LockTimeout, queue_lock
from pvestord.adapters.queue import Entry, ExtendQueue, parse_queue


def open_queue(path: Path, backend: str, lock_dir: Path | None) -> ExtendQueue:
    if backend == "lockdir":
        assert lock_dir is not None
        return ExtendQueue(path, lock=queue_lock(path, lock_dir))
    return ExtendQueue(path, lock=queue_lock(path))


def wait_for(go: Path, budget: float = 60.0) -> None:
    deadline = time.monotonic() + budget
    while not go.exists():
        if time.monotonic() > deadline:
            raise SystemExit(f"no go file {go} after {budget} s")
        time.sleep(0.01)


def writer(args: argparse.Namespace) -> None:
    queue = open_queue(args.queue, args.backend, args.lock_dir)
    wait_for(args.go)
    timeouts = 0
    start = time.monotonic()
    for i in range(args.count):
        entry = Entry(1000 + args.writer, f"w{args.writer}-{i}", origin=f"node{args.writer}")
        while True:
            try:
                queue.append([entry])
                break
            except LockTimeout:
                # Nothing was written; an event source retries (qmeventd does).
                timeouts += 1
    print(json.dumps({"writer": args.writer, "appended": args.count, "lock_timeouts": timeouts,
                      "seconds": time.monotonic() - start}))


def taker(args: argparse.Namespace) -> None:
    queue = open_queue(args.queue, args.backend, args.lock_dir)
    wait_for(args.go)
    taken: list[list[object]] = []
    rounds = 0
    bad: list[str] = []
    timeouts = 0
    start = time.monotonic()
    deadline = start + args.budget
    while len(taken) < args.total and time.monotonic() < deadline:
        rounds += 1
        # The file as any lock-free reader sees it must always parse in full.
        try:
            raw = args.queue.read_bytes()
        except FileNotFoundError:
            raw = b""
        _, rejected = parse_queue(raw)
        bad.extend(r.text for r in rejected)
        batch = queue.pending(lambda e: True)
        if not batch:
            time.sleep(0.002)
            continue
        try:
            removed = queue.complete(batch)
        except LockTimeout:
            timeouts += 1  # nothing removed: the next round takes the batch again
            continue
        if removed != len(batch):
            bad.append(f"complete removed {removed} of {len(batch)}")
        taken.extend([e.vmid, e.block_node] for e in batch)
    print(json.dumps({"taken": taken, "rounds": rounds, "bad": bad, "lock_timeouts": timeouts,
                      "seconds": time.monotonic() - start}))


def hold(args: argparse.Namespace) -> None:
    lock = (FlockLock(args.path) if args.kind == "flock"
            else LockDirLock(args.path.parent, args.path.name))
    with lock.acquire(timeout=args.timeout):
        print(json.dumps({"held": os.getpid()}), flush=True)
        time.sleep(args.seconds)
        # CLOCK_MONOTONIC is system-wide: the test compares it with its own.
        last_held = time.monotonic()
    print(json.dumps({"last_held": last_held}), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="role", required=True)
    for role in ("writer", "taker"):
        p = sub.add_parser(role)
        p.add_argument("--queue", type=Path, required=True)
        p.add_argument("--backend", choices=("flock", "lockdir"), required=True)
        p.add_argument("--lock-dir", type=Path)
        p.add_argument("--go", type=Path, required=True)
    w = sub.choices["writer"]
    w.add_argument("--writer", type=int, required=True)
    w.add_argument("--count", type=int, required=True)
    t = sub.choices["taker"]
    t.add_argument("--total", type=int, required=True)
    t.add_argument("--budget", type=float, default=120.0)
    h = sub.add_parser("hold")
    h.add_argument("--kind", choices=("flock", "lockdir"), required=True)
    h.add_argument("--path", type=Path, required=True)
    h.add_argument("--seconds", type=float, required=True)
    h.add_argument("--timeout", type=float, default=10.0)
    args = parser.parse_args()
    {"writer": writer, "taker": taker, "hold": hold}[args.role](args)


if __name__ == "__main__":
    main()
