"""The fault suite: real daemons, real QEMU, real LVM, faults from outside.

Every test runs a writing workload (the ``qemu-io`` tool through an NBD
export of the qcow2 node, each write with its own pattern, every region read
back at the end), injects one fault, lets the system recover the way
production would (a crashed daemon is started again, as systemd's
``Restart=on-failure`` does), then checks the
invariants of :func:`settled` and :meth:`Workload.verify`:

- every byte the workload wrote reads back, and no write failed;
- the VM runs (nothing paused it, nothing left it paused);
- the LV grew exactly the chunks its writes asked for (never twice for one
  crossing) and stays within the measured maximum;
- the threshold is armed for the new size; the queue parses and holds no
  entry for work already done;
- ``qemu-img check`` is clean; the daemon runs and said what happened once.

The workload never writes past the headroom the daemon must restore: with
``qemu-io`` a write past the LV's end fails instead of pausing the VM (the
pause is test_enospc_guest.py's subject), so "no write failed" here means
the daemon recovered before the guest needed it.

Each fault tried appends a record (fault, injection, outcome, recovery time)
to ``<results>/faults.jsonl``; ``python -m tests.harness.reliability`` turns
them into ``docs/reliability.md``. Recovery times are recorded, never
asserted (speed belongs to bench/).

The kill moments of one extension are each held until pvestord is known to
be there (an ``lvm_faulty`` rule and its marker, the storage lock held with
pvestord's lock file open, the queue's lock held with the threshold re-armed),
never slept into, so a slow machine still hits each one. ``make check`` runs
five of them; ``make faults`` (``--faults=full``) all seven.
"""

from __future__ import annotations

import contextlib
import enum
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from pvestord.adapters.locks import queue_lock, storage_lock
from pvestord.paths import LOCAL_LOCK_DIR
from tests.harness.daemonlog import extensions, records
from tests.harness.daemons import Daemon, NodeBed
from tests.harness.faultbed import (
    CHUNK,
    HEADROOM,
    LV0,
    SETTLE_TIMEOUT,
    STOREID,
    Workload,
    entries_of,
    fault_bed,
    final_checks,
    node,
    settled,
    thin_vm,
    threshold,
)
from tests.harness.faults import (
    FaultLog,
    FaultRecord,
    LvmFaults,
    Stopwatch,
    alive,
    kill_unit,
)
from tests.harness.lvmbed import VG, MiB
from tests.harness.polling import wait_until
from tests.harness.qemu import QemuVM, pve9_disk


@pytest.fixture
def bed(vg: VG, tmp_path: Path, out_dir: Path) -> NodeBed:
    return fault_bed(vg, tmp_path, out_dir)


# -- kill -9 of pvestord at many moments -------------------------------------------

class Hold(enum.Enum):
    """What holds pvestord at a moment, so the kill is known to land there."""

    #: An ``lvm_faulty`` rule holds the LVM command; its marker says it is there.
    LVM = "lvm"
    #: The test holds the storage lock; pvestord has the lock file open, waiting.
    STORAGE_LOCK = "storage lock"
    #: Nothing: the kill lands as soon as the entry is in the queue.
    NOTHING = "nothing"
    #: The test holds the queue's lock; the threshold is re-armed for the new
    #: size, so the pass has extended and armed and cannot drop the entry.
    QUEUE_LOCK = "queue lock"


@dataclass(frozen=True)
class Moment:
    """Where pvestord is killed in one extension, and what holds it there."""

    name: str
    hold: Hold
    #: For :attr:`Hold.LVM`: the subcommand, the ``lvm_faulty`` rule that
    #: holds it, and the marker that says it is there.
    subcommand: str = ""
    rule: str = ""
    marker: str = "started"
    #: Kill the LVM command in flight too (OOM or cgroup kill), not just the daemon.
    with_children: bool = True

    @property
    def injection(self) -> str:
        who = "pvestord and its LVM command" if self.with_children else "pvestord alone"
        if self.hold is Hold.LVM:
            return f"SIGKILL to {who} ({self.subcommand} held by `{self.rule}`)"
        if self.hold is Hold.STORAGE_LOCK:
            return ("SIGKILL to pvestord while it waits for the storage lock (its lock file "
                    "open), which another process holds; then released")
        if self.hold is Hold.QUEUE_LOCK:
            return ("SIGKILL to pvestord once the threshold is re-armed for the new size, "
                    "while the queue's lock, held by another process, keeps the entry queued")
        return f"SIGKILL to {who} as soon as the entry is in the queue"


HOOKED = [
    Moment(f"{where}, {who}", Hold.LVM, sub, rule, marker, with_children=children)
    for where, sub, rule, marker in [
        ("inside lvextend, before LVM ran", "lvextend", "before sleep 4", "started"),
        ("after lvextend, before the re-arm", "lvextend", "after sleep 4", "finished"),
    ]
    for who, children in [("with its LVM command", True), ("alone", False)]
]
WAITING = Moment("waiting for the storage lock, which another process holds", Hold.STORAGE_LOCK)
QUEUED = Moment("the entry just queued", Hold.NOTHING)
COMPLETING = Moment("re-armed, before the entry leaves the queue", Hold.QUEUE_LOCK,
                    with_children=False)


def moments(config: pytest.Config) -> list[Moment]:
    """Every moment for ``--faults=full`` (make faults). The quick set (make
    check) takes one kill inside lvextend (with its LVM child), one between
    lvextend and the re-arm (pvestord alone), and the three moments before
    and after the LVM command."""
    if config.getoption("--faults") == "full":
        return [*HOOKED, WAITING, QUEUED, COMPLETING]
    return [HOOKED[0], HOOKED[3], WAITING, QUEUED, COMPLETING]


def has_open(pid: int, path: Path) -> bool:
    """Whether process ``pid`` has ``path`` open (a flock waiter keeps its
    lock file open between tries). Compared by inode: the path the kernel
    shows for a descriptor is the resolved one (``/var/lock`` is a link to
    ``/run/lock``)."""
    try:
        wanted = path.stat()
    except FileNotFoundError:
        return False
    with contextlib.suppress(OSError):
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            with contextlib.suppress(OSError):
                opened = fd.stat()
                if (opened.st_dev, opened.st_ino) == (wanted.st_dev, wanted.st_ino):
                    return True
    return False


@contextlib.contextmanager
def held_at(moment: Moment, bed: NodeBed, vm: QemuVM, faults: LvmFaults, pvestord: Daemon,
            lv_size: int, workload: Workload) -> Iterator[None]:
    """Cross the threshold and hold pvestord at ``moment``; return once it is
    known to be there (never after a guessed delay). The hold ends after the
    ``with`` body (the kill)."""
    with contextlib.ExitStack() as held:
        if moment.hold is Hold.STORAGE_LOCK:
            held.enter_context(storage_lock(STOREID, shared=False).acquire(30))
        elif moment.hold is Hold.LVM:
            faults.rule(moment.subcommand, moment.rule)
        workload.cross_threshold()
        wait_until(lambda: entries_of(bed, vm.vmid), 60, "the entry queued")
        if moment.hold is Hold.LVM:
            wait_until(lambda: getattr(faults, moment.marker)(moment.subcommand), 60,
                       f"{moment.subcommand} {moment.marker}")
        elif moment.hold is Hold.STORAGE_LOCK:
            lock_file = LOCAL_LOCK_DIR / f"pve-storage-{STOREID}"
            wait_until(lambda: has_open(pvestord.proc.pid, lock_file), 60,
                       "pvestord waiting for the storage lock")
            assert not faults.started("lvextend")
        elif moment.hold is Hold.QUEUE_LOCK:
            held.enter_context(queue_lock(bed.queue_path).acquire(30))
            armed = lv_size + CHUNK - HEADROOM
            wait_until(lambda: threshold(vm) == armed, 60, "the threshold re-armed")
            assert entries_of(bed, vm.vmid)  # the queue's lock keeps it there
        yield
        faults.clear()


def test_pvestord_killed_at_every_moment_of_an_extension(
        bed: NodeBed, vg: VG, faults: LvmFaults, fault_log: FaultLog,
        request: pytest.FixtureRequest) -> None:
    vm, lv = thin_vm(bed, vg, 911)
    lv_size = LV0
    with vm, node(bed, faults) as running:
        workload = Workload(vm)
        settled(bed, vm, vg, lv, lv_size)
        for moment in moments(request.config):
            faults.forget_calls()
            with held_at(moment, bed, vm, faults, running.pvestord, lv_size, workload):
                kill_unit(running.pvestord, with_children=moment.with_children)
            before = vg.lv_size(lv)
            clock = Stopwatch()
            restarted = running.start_pvestord()
            lv_size += CHUNK
            settled(bed, vm, vg, lv, lv_size)
            recovery = clock()
            assert restarted.proc.poll() is None
            log = restarted.log_text()
            who = ("the restarted daemon" if extensions(log)
                   else "the killed daemon's LVM command (metadata committed, the restarted "
                   "daemon refreshed the device)" if records(log, TABLE="refreshed")
                   else "the killed daemon's LVM command, before the kill" if before == lv_size
                   else "the killed daemon's orphaned LVM command, after the restart")
            fault_log.record(FaultRecord(
                "kill -9 pvestord during an extension", f"{moment.name}: {moment.injection}",
                f"one chunk ({(lv_size - CHUNK) // MiB} -> {lv_size // MiB} MiB) by {who}; "
                "threshold re-armed, queue clear, no write failed", recovery,
                "test_pvestord_killed_at_every_moment_of_an_extension"))
        final_checks(vm, vg, lv, workload)


# -- qmeventd-py killed -------------------------------------------------------------

def test_qmeventd_killed_while_a_threshold_is_crossed(
        bed: NodeBed, vg: VG, faults: LvmFaults, fault_log: FaultLog) -> None:
    vm, lv = thin_vm(bed, vg, 912)
    with vm, node(bed, faults) as running:
        workload = Workload(vm)
        settled(bed, vm, vg, lv, LV0)
        kill_unit(running.qmeventd)
        workload.cross_threshold()  # QEMU's event has no listener: lost
        clock = Stopwatch()
        restarted = running.restart_qmeventd()
        restarted.wait_record("QEMU's connection", 60, VMID="912", QEMU_PID=str(vm.pid),
                              QMP_SESSION="connected")
        settled(bed, vm, vg, lv, LV0 + CHUNK)  # pvestord's reconcile found it
        recovery = clock()
        # The event path works again: the next crossing goes through the queue.
        workload.cross_threshold()
        restarted.wait_record("the threshold queued", 60, VMID="912", ENTRY="queued",
                              BLOCK_NODE=pve9_disk(vm).file_block_node, REASON="threshold")
        settled(bed, vm, vg, lv, LV0 + 2 * CHUNK)
        fault_log.record(FaultRecord(
            "kill -9 qmeventd-py", "SIGKILL to qmeventd-py, then a threshold crossed with "
            "no listener, then a restart (QEMU reconnects: its event chardev has reconnect=1)",
            "the lost event's extension made by pvestord's reconcile; the next crossing "
            "queued by the restarted qmeventd-py; no write failed", recovery,
            "test_qmeventd_killed_while_a_threshold_is_crossed"))
        final_checks(vm, vg, lv, workload)


# -- QEMU killed, LVM misbehaving -----------------------------------------------------

def test_qemu_killed_in_the_middle_of_an_extension(
        bed: NodeBed, vg: VG, faults: LvmFaults, fault_log: FaultLog) -> None:
    doomed, doomed_lv = thin_vm(bed, vg, 913)
    other, other_lv = thin_vm(bed, vg, 914)
    with doomed, other, node(bed, faults) as running:
        settled(bed, doomed, vg, doomed_lv, LV0)
        settled(bed, other, vg, other_lv, LV0)
        faults.rule("lvextend", "before sleep 4")
        Workload(doomed).cross_threshold()
        wait_until(lambda: faults.started("lvextend"), 60, "lvextend started")
        doomed.send_signal(signal.SIGKILL)
        doomed.wait(timeout=30)
        faults.clear()
        clock = Stopwatch()
        wait_until(lambda: not entries_of(bed, 913) and not faults.running("lvextend"),
                   SETTLE_TIMEOUT,
                   "the dead VM's entry gone and its lvextend finished")
        recovery = clock()
        size = vg.lv_size(doomed_lv)
        assert size in (LV0, LV0 + CHUNK)
        assert running.pvestord.proc.poll() is None
        # The daemon carries on for the VMs still running.
        workload = Workload(other)
        workload.cross_threshold()
        settled(bed, other, vg, other_lv, LV0 + CHUNK)
        fault_log.record(FaultRecord(
            "QEMU killed in the middle of an extension",
            "SIGKILL to QEMU while its lvextend ran (held 4 s by lvm_faulty)",
            f"the extension finished ({LV0 // MiB} -> {size // MiB} MiB), the re-arm found no "
            "VM, the entry was dropped; another VM's extension went through afterwards",
            recovery, "test_qemu_killed_in_the_middle_of_an_extension"))
        final_checks(other, vg, other_lv, workload)


def error_lines(daemon: Daemon, needle: str) -> list[str]:
    """ERROR messages quoting ``needle``: text the test's own fault injected."""
    return [line.message for line in records(daemon.log_text(), "ERROR")
            if needle in line.message]


def test_lvm_failing_hanging_and_slow(
        bed: NodeBed, vg: VG, faults: LvmFaults, fault_log: FaultLog) -> None:
    vm, lv = thin_vm(bed, vg, 915)
    with vm, node(bed, faults, "--lvm-timeout", "5") as running:
        workload = Workload(vm)
        settled(bed, vm, vg, lv, LV0)
        test = "test_lvm_failing_hanging_and_slow"

        faults.rule("lvextend", "before fail 5")
        workload.cross_threshold()
        wait_until(lambda: len(faults.started("lvextend")) >= 2, 120, "lvextend tried again")
        assert len(error_lines(running.pvestord, "injected failure of lvextend")) == 1
        assert entries_of(bed, 915), "the entry must stay queued while LVM fails"
        assert vg.lv_size(lv) == LV0
        faults.clear()
        clock = Stopwatch()
        settled(bed, vm, vg, lv, LV0 + CHUNK)
        fault_log.record(FaultRecord(
            "LVM command fails", "lvextend exits 5 with an error message, every time, until "
            "the rule is removed", "error logged once, entry kept and retried with backoff, "
            "extended once LVM worked again; no write failed", clock(), test))

        faults.forget_calls()
        faults.rule("lvextend", "before hang")
        workload.cross_threshold()
        wait_until(lambda: faults.started("lvextend") and not faults.running("lvextend"), 60,
                   "the hung lvextend killed by its timeout")
        hung = faults.started("lvextend")
        assert entries_of(bed, 915)
        faults.clear()
        clock = Stopwatch()
        settled(bed, vm, vg, lv, LV0 + 2 * CHUNK)
        assert not [pid for pid in hung if alive(pid)]
        fault_log.record(FaultRecord(
            "LVM command hangs", "lvextend never returns (pvestord run --lvm-timeout 5)",
            "the command's process group killed at the timeout, the error logged, the entry "
            "retried; extended once LVM answered; no process left behind", clock(), test))

        faults.rule("lvextend", "before sleep 3")
        workload.cross_threshold()
        clock = Stopwatch()
        settled(bed, vm, vg, lv, LV0 + 3 * CHUNK)
        faults.clear()
        fault_log.record(FaultRecord(
            "LVM command slow", "every lvextend takes 3 s longer",
            "extended once, within the headroom: no write failed", clock(), test))
        final_checks(vm, vg, lv, workload)


# -- the queue file mistreated ------------------------------------------------------

def test_queue_file_garbage_deleted_truncated_and_symlinked(
        bed: NodeBed, vg: VG, tmp_path: Path, faults: LvmFaults, fault_log: FaultLog) -> None:
    vm, lv = thin_vm(bed, vg, 916)
    test = "test_queue_file_garbage_deleted_truncated_and_symlinked"
    with vm, node(bed, faults) as running:
        workload = Workload(vm)
        settled(bed, vm, vg, lv, LV0)
        size = LV0

        with bed.queue_path.open("ab") as queue:
            queue.write(b"\x00\xffgarbage\n916\nnot:an:entry reason=???\n" + b"x" * 5000 + b"\n")
        workload.cross_threshold()
        clock = Stopwatch()
        size += CHUNK
        settled(bed, vm, vg, lv, size)
        rejected = bed.queue.rejected()
        assert len(rejected) == 4, rejected
        fault_log.record(FaultRecord(
            "queue file holds garbage", "binary junk, a bare VMID, a malformed entry and a "
            "5000-byte line appended to the queue", "the 4 bad lines moved to "
            "extend-queue.rejected with their reasons, the real entry handled", clock(), test))

        bed.queue_path.unlink()
        workload.cross_threshold()
        clock = Stopwatch()
        size += CHUNK
        settled(bed, vm, vg, lv, size)
        fault_log.record(FaultRecord(
            "queue file deleted", "extend-queue removed while both daemons run",
            "the next entry created it again and was handled", clock(), test))

        running.pvestord.proc.send_signal(signal.SIGSTOP)
        try:
            workload.cross_threshold()
            wait_until(lambda: entries_of(bed, 916), 60, "the entry queued")
            bed.queue_path.write_bytes(b"")
        finally:
            running.pvestord.proc.send_signal(signal.SIGCONT)
        clock = Stopwatch()
        size += CHUNK
        settled(bed, vm, vg, lv, size)
        fault_log.record(FaultRecord(
            "queue file truncated", "emptied after qmeventd-py queued an entry and before "
            "pvestord (held by SIGSTOP) took it", "the entry lost with the truncation; "
            "pvestord's reconcile extended the drive anyway", clock(), test))

        decoy = tmp_path / "decoy"
        decoy.write_text("root's file\n")
        bed.queue_path.unlink(missing_ok=True)
        bed.queue_path.symlink_to(decoy)
        try:
            workload.cross_threshold()
            clock = Stopwatch()
            size += CHUNK
            wait_until(lambda: vg.lv_size(lv) == size and threshold(vm) == size - HEADROOM,
                       SETTLE_TIMEOUT, "extended by the reconcile while the queue is a symlink")
            recovery = clock()
            running.qmeventd.wait_record("the entry given up, loudly", 60, "ERROR",
                                         VMID="916", ENTRY="lost",
                                         BLOCK_NODE=pve9_disk(vm).file_block_node)
            assert decoy.read_text() == "root's file\n"
            assert running.pvestord.proc.poll() is None
            assert running.qmeventd.proc.poll() is None
        finally:
            bed.queue_path.unlink()
        workload.cross_threshold()
        size += CHUNK
        settled(bed, vm, vg, lv, size)
        fault_log.record(FaultRecord(
            "queue file replaced by a symlink", "extend-queue made a symlink to another file "
            "while both daemons run", "nothing read or written through it (the target is "
            "unchanged); qmeventd-py retried and logged the entry as lost; pvestord's "
            "reconcile extended the drive; both kept running and worked normally once the "
            "link was gone", recovery, test))
        final_checks(vm, vg, lv, workload)


# -- a lock holder killed; a QEMU that accepts and never answers ---------------------------

def test_storage_lock_holder_killed(
        bed: NodeBed, vg: VG, tmp_path: Path, faults: LvmFaults, fault_log: FaultLog) -> None:
    lock_dir = tmp_path / "pve-locks"
    lock_dir.mkdir()
    vm, lv = thin_vm(bed, vg, 917)
    with vm, node(bed, faults, "--lock-dir", str(lock_dir)) as running:
        workload = Workload(vm)
        settled(bed, vm, vg, lv, LV0)
        holder = subprocess.Popen(  # noqa: S603 - argument list
            [sys.executable, "-c", HOLDER, str(lock_dir)], stdout=subprocess.PIPE, text=True)
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "held"
        holder.kill()
        holder.wait(timeout=30)
        lock = lock_dir / "storage-thin1"
        assert lock.is_dir(), "a killed holder leaves its lock directory behind"
        # As if it died 110 s ago: pmxcfs expires a lock 120 s after its last touch.
        past = time.time() - 110
        os.utime(lock, (past, past))
        workload.cross_threshold()
        clock = Stopwatch()
        settled(bed, vm, vg, lv, LV0 + CHUNK)
        recovery = clock()
        assert running.pvestord.proc.poll() is None
        fault_log.record(FaultRecord(
            "storage lock holder killed", "a process took the pmxcfs-style lock "
            "storage-thin1 and was killed with SIGKILL; its lock directory backdated by 110 s",
            "pvestord waited, the lock expired at 120 s as pmxcfs's do, the extension went "
            "through; no write failed", recovery, "test_storage_lock_holder_killed"))
        final_checks(vm, vg, lv, workload)


HOLDER = """
import sys, time
from pathlib import Path
from pvestord.adapters.locks import LockDirLock
with LockDirLock(Path(sys.argv[1]), "storage-thin1").acquire(10):
    print("held", flush=True)
    time.sleep(3600)
"""


def test_vm_whose_qmp_socket_never_answers(
        bed: NodeBed, vg: VG, faults: LvmFaults, fault_log: FaultLog) -> None:
    hung, hung_lv = thin_vm(bed, vg, 918)
    other, other_lv = thin_vm(bed, vg, 919)
    with hung, other, node(bed, faults, "--qmp-timeout", "3") as running:
        settled(bed, hung, vg, hung_lv, LV0)
        settled(bed, other, vg, other_lv, LV0)
        hung_work = Workload(hung)
        hung_work.cross_threshold()
        hung.send_signal(signal.SIGSTOP)  # its socket still accepts; nothing answers
        try:
            workload = Workload(other)
            workload.cross_threshold()
            settled(bed, other, vg, other_lv, LV0 + CHUNK)
            # The pass over the hung VM failed (its QMP timed out), loudly.
            running.pvestord.wait_record("the hung VM's timeout", 60, "ERROR", VMID="918",
                                         BLOCK_NODE="")
            assert running.pvestord.proc.poll() is None
        finally:
            hung.send_signal(signal.SIGCONT)
        clock = Stopwatch()
        settled(bed, hung, vg, hung_lv, LV0 + CHUNK)
        fault_log.record(FaultRecord(
            "QMP socket accepts and never answers", "QEMU stopped with SIGSTOP just after its "
            "threshold crossed (pvestord run --qmp-timeout 3)",
            "each pass over it ended at the timeout with the error logged; another VM was "
            "extended meanwhile; after SIGCONT its own extension went through",
            clock(), "test_vm_whose_qmp_socket_never_answers"))
        final_checks(other, vg, other_lv, workload)
        final_checks(hung, vg, hung_lv, hung_work)
