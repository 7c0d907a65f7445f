"""The storage lock against an ``lvm`` that SIGKILL does not end (docs/operations.md).

Real daemons, real QEMU, real LVM on two VGs, the storage locks as
pmxcfs-style lock directories with the emulated pmxcfs expiry at a shortened
lifetime (``--lock-lifetime``), and ``tests/harness/lvm_faulty``'s
``unkillable`` rule: the ``lvextend`` of one VG leaves a descendant in a
session of its own that keeps the command's pipes (SIGKILL to the command's
process group does not reach it, as it does not end an ``lvm`` in D state),
stays longer than three lock lifetimes, and then runs the real ``lvextend``,
as the stuck command would once its SAN path came back.

What must hold: the daemon gives up the wait (the pass ends with the error),
marks the VG, keeps the lock renewed while the stuck process lives, so that a
second process waiting on the same lock directory (another node, with the
same expiry) enters only after the stuck command has ended; the other VG is
served meanwhile; further changes on the marked VG are refused until the
operator removes the mark.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness import daemonlog
from tests.harness.daemons import NodeBed, ThinStorageSpec
from tests.harness.faultbed import (
    CHUNK,
    LV0,
    SETTLE_TIMEOUT,
    Workload,
    entries_of,
    final_checks,
    node,
    settled,
    thin_vm,
)
from tests.harness.faults import FaultLog, FaultRecord, LvmFaults, Stopwatch, alive
from tests.harness.lvmbed import VG, loop_vg
from tests.harness.polling import wait_until

ROOT = Path(__file__).resolve().parents[3]
#: The lock directories' lifetime: pmxcfs's 120 s, shortened so that the
#: stuck command outlives it twice within a test.
LIFETIME = 45.0
#: The daemon's LVM budget: it must fit in the lifetime with the kill wait
#: (pvestord refuses settings where it does not: 20 + 5 <= 30 s here), and
#: an lvs on a loaded emulated node takes more than 5 s (seen).
LVM_TIMEOUT = 20.0
#: How long the stuck command stays: two lock lifetimes.
STUCK_FOR = 2 * LIFETIME

#: Another node waiting for the lock, with the same emulated expiry; once in,
#: it says whether the stuck command was still alive.
WAITER = """
import json, sys, time
from pathlib import Path
from pvestord.adapters.locks import EmulatedPmxcfsExpiry, LockDirLock
from tests.harness.faults import alive
lock_dir, lock_id, lifetime, folder = sys.argv[1:5]
lock = LockDirLock(Path(lock_dir), lock_id, unlock_request=EmulatedPmxcfsExpiry(float(lifetime)))
print(json.dumps({"waiting": time.time()}), flush=True)
with lock.acquire(600):
    stuck = [int(p) for p in (Path(folder) / "lvextend.stuck").read_text().split()]
    finished = Path(folder) / "lvextend.finished"
    done = [int(p) for p in finished.read_text().split()] if finished.exists() else []
    print(json.dumps({"entered": time.time(), "stuck_alive": [p for p in stuck if alive(p)],
                      "stuck_finished": [p for p in stuck if p in done]}), flush=True)
"""


@pytest.fixture
def vg2() -> Iterator[VG]:
    with loop_vg() as volume_group:
        yield volume_group


@pytest.fixture
def bed(vg: VG, vg2: VG, tmp_path: Path, out_dir: Path) -> NodeBed:
    specs = [ThinStorageSpec(storeid, group.name, chunksize="32M", chunk_percentage=0.5,
                             initial_size="64M", shared=True)
             for storeid, group in (("thin1", vg), ("thin2", vg2))]
    return NodeBed(tmp_path, specs, logs_dir=out_dir)


def errors_for(text: str, vmid: int) -> int:
    return sum(1 for line in daemonlog.parse(text)
               if line.level == "ERROR" and line.fields.get("VMID") == str(vmid))


@pytest.mark.faults_full
def test_an_lvm_sigkill_does_not_end_keeps_the_lock_and_marks_the_vg(
        bed: NodeBed, vg: VG, vg2: VG, tmp_path: Path, faults: LvmFaults,
        fault_log: FaultLog) -> None:
    lock_dir = tmp_path / "pve-locks"
    lock_dir.mkdir()
    marks = tmp_path / "vg-unhealthy"
    stuck_vm, stuck_lv = thin_vm(bed, vg, 931)
    other_vm, other_lv = thin_vm(bed, vg2, 932)
    test = "test_an_lvm_sigkill_does_not_end_keeps_the_lock_and_marks_the_vg"
    with stuck_vm, other_vm, node(bed, faults, "--lock-dir", str(lock_dir), "--lock-lifetime",
                                  str(LIFETIME), "--lvm-timeout", str(LVM_TIMEOUT),
                                  "--vg-health-dir", str(marks)) as running:
        stuck_work, other_work = Workload(stuck_vm), Workload(other_vm)
        settled(bed, stuck_vm, vg, stuck_lv, LV0)
        settled(bed, other_vm, vg2, other_lv, LV0)

        # The stuck command stays at least STUCK_FOR, and while the hold file
        # exists (until the other VG has been served).
        hold = faults.folder / "lvextend.hold"
        hold.touch()
        faults.rule("lvextend", f"before unkillable {STUCK_FOR:g} {vg.name}")
        stuck_work.cross_threshold()
        clock = Stopwatch()
        wait_until(lambda: (marks / vg.name).exists(), 120, f"VG {vg.name} marked unhealthy")
        marked_after = clock()
        stuck = [int(p) for p in (faults.folder / "lvextend.stuck").read_text().split()]
        assert stuck and all(alive(p) for p in stuck)
        assert str(stuck[0]) in (marks / vg.name).read_text()
        assert (lock_dir / "storage-thin1").is_dir(), "the lock was let go under the stuck lvm"
        assert running.pvestord.proc.poll() is None
        wait_until(lambda: errors_for(running.pvestord.log_text(), 931) >= 1, 60,
                   "the pass's error logged for VM 931")

        waiter = subprocess.Popen(  # noqa: S603 - argument list
            [sys.executable, "-c", WAITER, str(lock_dir), "storage-thin1", str(LIFETIME),
             str(faults.folder)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
        try:
            assert waiter.stdout is not None
            waiting = json.loads(waiter.stdout.readline())["waiting"]
            # The other VG is served while the stuck command lives.
            other_work.cross_threshold()
            settled(bed, other_vm, vg2, other_lv, LV0 + CHUNK)
            served_while_stuck = all(alive(p) for p in stuck)
            # The stuck lvextend and the other VG's: no more may start on the
            # marked VG from here on.
            lvextends_so_far = len(faults.started("lvextend"))
            hold.unlink()  # its I/O completes: it runs the real lvextend
            line = waiter.stdout.readline()
            waiter.wait(timeout=60)
        finally:
            hold.unlink(missing_ok=True)  # never leave the stuck command waiting
            if waiter.poll() is None:
                waiter.kill()
                waiter.wait()
        entered = json.loads(line)
        assert entered["stuck_alive"] == [], "another node entered while the stuck lvm lived"
        assert entered["stuck_finished"] == stuck[:1]
        waited = entered["entered"] - waiting
        assert waited > LIFETIME, "the waiter got in within one lifetime: the lock was not kept"
        assert served_while_stuck
        assert not (lock_dir / "storage-thin1").exists()
        faults.clear()
        # The stuck lvextend ran late, under the kept lock: the LV has its chunk.
        wait_until(lambda: vg.lv_size(stuck_lv) == LV0 + CHUNK, 60, "the late lvextend's chunk")
        recovery = clock()
        fault_log.record(FaultRecord(
            "lvm that SIGKILL does not end (D state), slower than the lock's lifetime",
            f"lvextend of one VG left a descendant in its own session holding the pipes for "
            f"{STUCK_FOR:g} s or more (lock lifetime {LIFETIME:g} s; pvestord run "
            f"--lvm-timeout {LVM_TIMEOUT:g}), which then ran the real lvextend",
            f"the pass gave up {LVM_TIMEOUT:g} s + the kill wait after the start and marked "
            f"the VG ({marked_after:.1f} s after the crossing); the lock stayed renewed "
            f"until the stuck process ended: a second process waiting on it (same expiry) "
            f"got in after {waited:.1f} s, with the stuck process gone; the other VG's "
            "extension went through meanwhile; no write failed", recovery, test))

        # Marked: every pass on this VG is refused before any LVM change (the
        # first error was the stuck lvextend's, then the refusal), and the
        # entry stays queued, until the operator removes the mark.
        wait_until(lambda: errors_for(running.pvestord.log_text(), 931) >= 2, 120,
                   "the refusal logged for VM 931")
        assert len(faults.started("lvextend")) == lvextends_so_far
        assert entries_of(bed, 931), "the refused entry must stay queued"
        assert (marks / vg.name).exists()
        # The operator has checked the VG and removes the mark: the next pass
        # reads the LV under the lock, finds the chunk there and re-arms.
        (marks / vg.name).unlink()
        clock = Stopwatch()
        settled(bed, stuck_vm, vg, stuck_lv, LV0 + CHUNK)
        stuck_work.cross_threshold()
        settled(bed, stuck_vm, vg, stuck_lv, LV0 + 2 * CHUNK, timeout=SETTLE_TIMEOUT)
        fault_log.record(FaultRecord(
            "change on a VG marked unhealthy", "the queued extension of the VG marked after "
            "the stuck lvextend", "refused before any LVM command, the entry kept; once the "
            "mark was removed the drive was re-armed and the next crossing extended; no "
            "write failed", clock(), test))
        assert time.time() > waiting
        final_checks(stuck_vm, vg, stuck_lv, stuck_work)
        final_checks(other_vm, vg2, other_lv, other_work)


#: Another node waiting for the lock; once in, it says which ``lvextend``
#: wrappers still ran.
SLOW_WAITER = """
import json, sys, time
from pathlib import Path
from pvestord.adapters.locks import EmulatedPmxcfsExpiry, LockDirLock
from tests.harness.faults import alive
lock_dir, lock_id, lifetime, folder = sys.argv[1:5]
lock = LockDirLock(Path(lock_dir), lock_id, unlock_request=EmulatedPmxcfsExpiry(float(lifetime)))
with lock.acquire(600):
    started = Path(folder) / "lvextend.started"
    pids = [int(p) for p in started.read_text().split()] if started.exists() else []
    print(json.dumps({"entered": time.time(), "running": [p for p in pids if alive(p)]}),
          flush=True)
"""


def test_an_lvm_slower_than_the_lock_is_killed_before_the_lock_could_expire(
        bed: NodeBed, vg: VG, tmp_path: Path, faults: LvmFaults,
        fault_log: FaultLog) -> None:
    lock_dir = tmp_path / "pve-locks"
    lock_dir.mkdir()
    marks = tmp_path / "vg-unhealthy"
    vm, lv = thin_vm(bed, vg, 933)
    with vm, node(bed, faults, "--lock-dir", str(lock_dir), "--lock-lifetime", str(LIFETIME),
                  "--lvm-timeout", str(LVM_TIMEOUT), "--vg-health-dir", str(marks)):
        work = Workload(vm)
        settled(bed, vm, vg, lv, LV0)
        faults.rule("lvextend", f"before sleep {STUCK_FOR:g} {vg.name}")
        work.cross_threshold()
        wait_until(lambda: faults.running("lvextend"), 120, "the slow lvextend started")
        waiter = subprocess.Popen(  # noqa: S603 - argument list
            [sys.executable, "-c", SLOW_WAITER, str(lock_dir), "storage-thin1", str(LIFETIME),
             str(faults.folder)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
        try:
            assert waiter.stdout is not None
            entered = json.loads(waiter.stdout.readline())
            waiter.wait(timeout=60)
        finally:
            if waiter.poll() is None:
                waiter.kill()
                waiter.wait()
        assert entered["running"] == [], "another node entered while our lvextend ran"
        assert not (marks / vg.name).exists(), "a command that SIGKILL ended marked the VG"
        faults.clear()
        clock = Stopwatch()
        settled(bed, vm, vg, lv, LV0 + CHUNK)
        fault_log.record(FaultRecord(
            "lvm slower than the storage lock's lifetime",
            f"every lvextend of the VG sleeps {STUCK_FOR:g} s before running (lock lifetime "
            f"{LIFETIME:g} s; pvestord run --lvm-timeout {LVM_TIMEOUT:g})",
            "killed at its timeout, well inside the lock's guaranteed life; a second process "
            "waiting on the lock got in only once no lvextend ran; the VG not marked; "
            "extended once LVM was quick again; no write failed", clock(),
            "test_an_lvm_slower_than_the_lock_is_killed_before_the_lock_could_expire"))
        final_checks(vm, vg, lv, work)


@pytest.mark.faults_full
def test_custody_of_a_stuck_lvm_survives_a_pvestord_restart(
        bed: NodeBed, vg: VG, tmp_path: Path, faults: LvmFaults,
        fault_log: FaultLog) -> None:
    """pvestord is restarted (SIGTERM, then a new one) while the
    ``lvextend`` SIGKILL did not end still lives. The storage lock must stay
    held, renewed by the new daemon, until the stuck process has gone: a
    second node waiting on it gets in only then.

    On the old code the stopping daemon left the lock unrenewed and the new
    one did not take it again: the waiter's emulated expiry broke it one
    lifetime after the stop, while the stuck process (kept by the hold file)
    still lived, so the waiter's line has ``stuck_alive`` set.
    """
    lock_dir = tmp_path / "pve-locks"
    lock_dir.mkdir()
    marks = tmp_path / "vg-unhealthy"
    record = tmp_path / "vg-custody" / vg.name
    lock = lock_dir / "storage-thin1"
    vm, lv = thin_vm(bed, vg, 934)
    test = "test_custody_of_a_stuck_lvm_survives_a_pvestord_restart"
    with vm, node(bed, faults, "--lock-dir", str(lock_dir), "--lock-lifetime",
                  str(LIFETIME), "--lvm-timeout", str(LVM_TIMEOUT),
                  "--vg-health-dir", str(marks)) as running:
        work = Workload(vm)
        settled(bed, vm, vg, lv, LV0)
        hold = faults.folder / "lvextend.hold"
        hold.touch()
        faults.rule("lvextend", f"before unkillable {STUCK_FOR:g} {vg.name}")
        work.cross_threshold()
        # The mark comes just before custody begins (the record, on the new
        # code, at the same moment): the old code is judged by the waiter below.
        wait_until(lambda: (marks / vg.name).exists(), 120, f"VG {vg.name} marked")
        stuck = [int(p) for p in (faults.folder / "lvextend.stuck").read_text().split()]
        assert stuck and all(alive(p) for p in stuck)

        # The restart: the old daemon stops cleanly, a new one starts.
        assert running.pvestord.stop() == 0
        stopped_at = time.time()
        assert lock.is_dir(), "the stopping daemon released the lock under the stuck lvm"
        clock = Stopwatch()
        restarted = running.start_pvestord()
        entered_file = tmp_path / "waiter.out"
        with entered_file.open("w") as out:
            waiter = subprocess.Popen(  # noqa: S603 - argument list
                [sys.executable, "-c", WAITER, str(lock_dir), "storage-thin1", str(LIFETIME),
                 str(faults.folder)], cwd=ROOT, stdout=out, text=True)
        try:
            def lines() -> list[dict[str, object]]:
                return [json.loads(x) for x in entered_file.read_text().splitlines()]

            def renewed_past_expiry() -> bool:
                # Renewed after the moment it would have expired unrenewed:
                # the new daemon keeps it (the lock folder is local: one clock).
                try:
                    return lock.stat().st_mtime > stopped_at + LIFETIME
                except FileNotFoundError:
                    return False

            wait_until(lambda: len(lines()) > 1 or renewed_past_expiry(), 4 * LIFETIME,
                       "the waiter in, or the lock renewed past its unrenewed expiry")
            assert len(lines()) == 1, (
                f"another node entered while the stuck lvm lived: {lines()[1:]}")
            assert all(alive(p) for p in stuck)
            assert "took over lock" in restarted.log_text()
            assert stuck[0] in [pid for pid, _ in json.loads(record.read_text())["stuck"]]
            hold.unlink()  # its I/O completes: it runs the real lvextend and ends
            wait_until(lambda: len(lines()) > 1, 120, "the waiter in")
            waiter.wait(timeout=60)
        finally:
            hold.unlink(missing_ok=True)  # never leave the stuck command waiting
            if waiter.poll() is None:
                waiter.kill()
                waiter.wait()
        entered = lines()[1]
        assert entered["stuck_alive"] == [], "another node entered while the stuck lvm lived"
        assert entered["stuck_finished"] == stuck[:1]
        wait_until(lambda: not record.exists(), 60, "the custody record removed")
        faults.clear()
        wait_until(lambda: vg.lv_size(lv) == LV0 + CHUNK, 60, "the late lvextend's chunk")
        fault_log.record(FaultRecord(
            "pvestord restarted while an lvm SIGKILL did not end lives",
            f"lvextend left a descendant in its own session holding the pipes (lock lifetime "
            f"{LIFETIME:g} s; pvestord run --lvm-timeout {LVM_TIMEOUT:g}); pvestord stopped "
            "with SIGTERM and started again while it lived",
            "the stopping daemon renewed the lock and wrote its custody down; the new one "
            "took the same lock directory over and renewed it past the moment it would have "
            "expired; a second process waiting on it got in only after the stuck process "
            "ended; the custody record was removed", clock(), test))
        (marks / vg.name).unlink()
        final_checks(vm, vg, lv, work)
