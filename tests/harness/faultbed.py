"""The fault suite's node bed: its storage, its daemons, its workload and the
invariants checked after each recovery (tests/integration/node/test_faults*.py
and the node tests that reuse its 32 MiB chunks).

- :func:`fault_bed`: one thin storage with 32 MiB chunks, the threshold 16 MiB
  below the LV's end, LVs of 64 MiB;
- :func:`node`: qmeventd-py and pvestord, pvestord restartable as systemd's
  ``Restart=on-failure`` would, its LVM going through ``lvm_faulty``
  (:class:`tests.harness.faults.LvmFaults`);
- :class:`Workload`: ``qemu-io`` writes through an NBD export, each with its
  own pattern, that must all succeed and read back;
- :func:`settled` and :func:`final_checks`: what must hold once a fault is over
  (the LV grew exactly the chunks asked for, the threshold is re-armed, the
  queue is clear, the VM runs, the image is consistent);
- :func:`grow_elsewhere`: an LV grown by "another node", this node's
  device-mapper table left at the old size.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from pvestord.adapters.locks import storage_lock
from pvestord.adapters.queue import Entry
from tests.harness.daemons import Daemon, NodeBed, ThinStorageSpec, start_daemon, start_qmeventd
from tests.harness.faults import LvmFaults
from tests.harness.lvmbed import VG, GiB, MiB, measured_maximum, qcow2_check, qcow2_create, sh
from tests.harness.polling import wait_until
from tests.harness.qemu import PatternIo, Pve9Disk, QemuVM, pve9_disk

#: The fault bed's one storage.
STOREID = "thin1"
CHUNK = 32 * MiB
#: chunk-percentage 0.5: the threshold sits this far below the LV's end.
HEADROOM = 16 * MiB
LV0 = 64 * MiB
WRITE = 4 * MiB
#: Reconcile often, so a fault that loses an event recovers within a test.
RECONCILE = 5.0
#: Everything that waits for recovery: a restarted daemon's Python start-up
#: over 9p plus an extension, under TCG.
SETTLE_TIMEOUT = 180.0
#: Waiting for the storage lock behind the daemon's changes (each bounded well below this).
LOCK_WAIT = 120.0


# -- the bed ---------------------------------------------------------------------

class Node:
    """qmeventd-py and pvestord on one bed, restartable, with LVM going through
    ``lvm_faulty``; every pvestord incarnation logs to its own file."""

    def __init__(self, bed: NodeBed, faults: LvmFaults, *pvestord_args: str) -> None:
        self.bed = bed
        self.faults = faults
        # --no-lvm-shell: lvm_faulty sees each command only when it is a process of its own.
        self.pvestord_args = ["--reconcile-interval", str(RECONCILE), "--no-lvm-shell",
                              *pvestord_args]
        self.incarnations = 0
        self.qmeventd_incarnations = 1
        self.qmeventd = start_qmeventd(bed)
        self.pvestord = self.start_pvestord()

    def start_pvestord(self) -> Daemon:
        self.incarnations += 1
        daemon = start_daemon("pvestord", self.bed.pvestord_argv(*self.pvestord_args),
                              self.bed.logs / f"pvestord-{self.incarnations}.log")
        self.pvestord = daemon
        return daemon

    def restart_qmeventd(self) -> Daemon:
        """A new qmeventd-py with its own log file: the first one's lines (its
        "connected", its "queued") must not answer a wait meant for this one."""
        self.qmeventd_incarnations += 1
        daemon = start_daemon("qmeventd-py", self.bed.qmeventd_argv(),
                              self.bed.logs / f"qmeventd-{self.qmeventd_incarnations}.log")
        self.qmeventd = daemon
        return daemon

    def stop(self) -> list[str]:
        failures = []
        for daemon in (self.pvestord, self.qmeventd):
            status = daemon.stop()
            if status != 0:
                failures.append(f"{daemon.name} exited {status}:\n{daemon.log_text()[-3000:]}")
        return failures


def fault_bed(vg: VG, tmp_path: Path, out_dir: Path) -> NodeBed:
    """The fault suite's storage on ``vg``: 32 MiB chunks, the threshold
    16 MiB (:data:`HEADROOM`) below the LV's end, new LVs of 64 MiB (:data:`LV0`)."""
    spec = ThinStorageSpec(STOREID, vg.name, chunksize="32M", chunk_percentage=0.5,
                           initial_size="64M")
    return NodeBed(tmp_path, [spec], logs_dir=out_dir)


@contextlib.contextmanager
def node(bed: NodeBed, faults: LvmFaults, *pvestord_args: str) -> Iterator[Node]:
    """Both daemons; at the end both must stop cleanly (exit 0)."""
    running = Node(bed, faults, *pvestord_args)
    try:
        yield running
    finally:
        failures = running.stop()
    if failures:
        raise RuntimeError("\n".join(failures))


def thin_vm(bed: NodeBed, vg: VG, vmid: int) -> tuple[QemuVM, str]:
    lv = f"vm-{vmid}-disk-0.qcow2"
    qcow2_create(vg.create_lv(lv, LV0), 8 * GiB)
    disk = Pve9Disk.for_volume(vg.lv_path(lv), f"{STOREID}:{lv}")
    vm = QemuVM(vmid, bed.run_dir, disks=[disk],
                event_socket=bed.event_socket, log_path=bed.logs / f"qemu-{vmid}.log")
    return vm, lv


# -- the workload and the invariants ----------------------------------------------

def allocation(vm: QemuVM) -> int:
    for entry in vm.qmp("query-blockstats", query_nodes=True):
        if entry.get("node-name") == pve9_disk(vm).file_block_node:
            return int(entry["stats"]["wr_highest_offset"])
    raise AssertionError("no blockstats for the disk's file node")


def threshold(vm: QemuVM) -> int:
    return int(vm.named_node(pve9_disk(vm).file_block_node)["write_threshold"])


class Workload:
    """Sequential 4 MiB writes, each with its own pattern; every one must succeed."""

    def __init__(self, vm: QemuVM) -> None:
        self.vm = vm
        self.cursor = 0
        self.written: list[tuple[int, int]] = []  # (offset, pattern)

    def _pattern(self) -> int:
        return len(self.written) % 251 + 1

    def write_one(self, io: PatternIo | None = None) -> None:
        pattern = self._pattern()
        result = (io or self.vm).write_pattern(pve9_disk(self.vm).block_node, self.cursor,
                                               WRITE, pattern, check=False)
        assert result.ok, f"write at {self.cursor} failed: {result.error}"
        self.written.append((self.cursor, pattern))
        self.cursor += WRITE

    def cross_threshold(self) -> tuple[int, int]:
        """Write until the image crosses the armed threshold (inside the headroom:
        no write can fail). Returns (threshold crossed, allocation after)."""
        armed = threshold(self.vm)
        assert armed > 0, "no threshold armed"
        with self.vm.io_session() as io:
            while allocation(self.vm) <= armed:
                self.write_one(io)
        return armed, allocation(self.vm)

    def verify(self) -> None:
        with self.vm.io_session() as io:
            bad = [offset for offset, pattern in self.written
                   if not io.read_verify(pve9_disk(self.vm).block_node, offset, WRITE,
                                         pattern, timeout=120)]
        assert not bad, f"regions that do not read back: {bad}"


def entries_of(bed: NodeBed, vmid: int) -> list[Entry]:
    return [e for e in bed.entries() if e.vmid == vmid]


def is_settled(bed: NodeBed, vm: QemuVM, vg: VG, lv: str, lv_size: int) -> bool:
    return (vg.lv_size(lv) == lv_size and threshold(vm) == lv_size - HEADROOM
            and not entries_of(bed, vm.vmid))


def settled(bed: NodeBed, vm: QemuVM, vg: VG, lv: str, lv_size: int, *,
            timeout: float = SETTLE_TIMEOUT) -> None:
    """Wait until the drive is as it must be after a recovery, then check it."""
    wait_until(lambda: is_settled(bed, vm, vg, lv, lv_size), timeout,
               f"LV {lv} at {lv_size // MiB} MiB, threshold re-armed, queue clear "
               f"(LV now {vg.lv_size(lv) // MiB} MiB, threshold {threshold(vm)})")
    assert vg.device_size(lv) == lv_size
    assert lv_size <= measured_maximum(8 * GiB, vg.extent_size())
    status = vm.qmp("query-status")
    assert (status["status"], status["running"]) == ("running", True), status
    bed.queue.entries()  # parses


def final_checks(vm: QemuVM, vg: VG, lv: str, workload: Workload) -> None:
    workload.verify()
    vm.shutdown()
    assert qcow2_check(vg.lv_path(lv))["exit"] == 0


# -- another node ------------------------------------------------------------------

def dm_name(vg: VG, lv: str) -> str:
    return f"{vg.name.replace('-', '--')}-{lv.replace('-', '--')}"


def grow_elsewhere(vg: VG, lv: str, size: int, storeid: str = STOREID) -> None:
    """As if another node grew the LV: the metadata grows, and this node's
    device-mapper table is put back to the old size (no refresh here yet).

    Under the storage lock, as another node's ``lvextend`` would be: a
    running pvestord compares and refreshes tables under that lock, so it
    can neither refresh between the ``lvextend`` and the reload (leaving the
    old table after its refresh) nor before the lag is checked here."""
    name = dm_name(vg, lv)
    with storage_lock(storeid, shared=False).acquire(LOCK_WAIT):
        table = sh("dmsetup", "table", name).strip()
        sh("lvextend", "-q", "-L", f"{size}b", f"{vg.name}/{lv}")
        sh("dmsetup", "load", name, "--table", table)
        sh("dmsetup", "resume", name)
        assert vg.lv_size(lv) == size and vg.device_size(lv) < size
