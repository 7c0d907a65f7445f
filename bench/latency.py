"""Scenarios 1 to 3: how long an extension takes, against the floor and the original design.

**Latency** (one thin drive, real qmeventd-py, pvestord, QEMU and LVM): the
writer brings the drive's allocation to just under the threshold, then one
small write crosses it. From QEMU's own ``BLOCK_WRITE_THRESHOLD`` timestamp
to the daemon's "threshold armed" log record that follows the extension,
split with the fields pvestord logs on each extension (pvestord/engine/extender.py):

- queue wait: event to the start of the daemon's round (qmeventd-py, the
  queue file, the wake-up, the scan);
- QMP: the round's observation, the migration check under the lock, and the
  re-arm session (extension record to armed record);
- lock wait and LVM (``lvs`` + ``lvextend``);
- other: what remains (scheduling, policy, Python).

The writer is idle while the daemon works: this measures the extension path,
not a race with a writer (the pause-free scenario does that).

**Floor**: the same QMP and LVM calls, the same options, back to back in
this process on a VM with no daemon, no queue and no lock. Twice: with the
LVM calls in a persistent shell, as the daemon makes them (the floor of
daemon/floor), and as one process per command (the naive floor, scenario 4's
ours/naive-floor).

**Original design**: the same daemon with ``--poll-interval 1
--global-worker --no-inotify --no-lvm-shell``, the proposal's polling,
single worker and one process per LVM command.

**Side by side** (:func:`side_by_side`, what ``bench.run`` uses): the three
are set up at once, each on its own VG, storage id, daemons and QEMU, and
sampled in turn (ours, floor, naive floor, original, then the next round
in a rotated order), so that a change of load on the machine hits the three alike instead
of whichever ran during it. The cost: while one side is sampled, the other
daemons are idle beside it (queue polls, the periodic reconcile).
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.report import summary
from bench.together import enter_together, one_at_a_time
from pvestord.adapters import lvm
from pvestord.adapters.lvmshell import LvmShells
from pvestord.adapters.qmp import VmMonitor
from tests.harness import daemonlog
from tests.harness.daemons import Daemon, NodeBed, ThinStorageSpec, daemons
from tests.harness.lvmbed import VG, GiB, MiB, loop_vg, qcow2_create
from tests.harness.polling import wait_until
from tests.harness.qemu import Disk, Pve9Disk, QemuVM

VMID = 100
#: The volume the benchmarks' VMs attach, as Proxmox VE 9 does on ``scsi0``:
#: throttle over qcow2 ``f<hash>`` over host_device ``e<hash>``.
VOLID = "san:vm-100-disk-0.qcow2"
FILE_NODE = Pve9Disk.for_volume("", VOLID).file_block_node
FORMAT_NODE = Pve9Disk.for_volume("", VOLID).block_node
#: Small chunks: an extension costs the same whatever it adds, and every
#: byte the writer puts in the LV is real memory on the guest's tmpfs.
CHUNK = 16 * MiB
PERCENTAGE = 0.5
INITIAL = 32 * MiB
VIRTUAL = 8 * GiB
#: The write that crosses the threshold: small, so that the event comes
#: at its start and the sample is the daemon's time, not the write's.
CROSSING = 2 * MiB
#: Room left under the threshold by the write that prepares a crossing:
#: qcow2 metadata (L2 tables, refcounts) must not cross it early.
MARGIN = 1 * MiB
CLUSTER = 64 * 1024
#: Per-sample budgets; generous, the node is emulated (2-5 s per extension).
IO_TIMEOUT = 120.0
EVENT_TIMEOUT = 60.0
EXTEND_TIMEOUT = 120.0
ORIGINAL_ARGS = ("--poll-interval", "1", "--global-worker", "--no-inotify", "--no-lvm-shell")


@dataclass(frozen=True)
class Sample:
    """One extension, in seconds on the wall clock."""

    event: float
    round_started: float
    extended: float
    armed: float
    qmp_in_round: float
    lock_wait: float
    lvm: float

    @property
    def total(self) -> float:
        return self.armed - self.event

    @property
    def queue_wait(self) -> float:
        return self.round_started - self.event

    @property
    def qmp(self) -> float:
        return self.qmp_in_round + (self.armed - self.extended)

    @property
    def other(self) -> float:
        return self.total - self.queue_wait - self.qmp - self.lock_wait - self.lvm

    def split(self) -> dict[str, float]:
        return {"total": self.total, "queue_wait": self.queue_wait, "qmp": self.qmp,
                "lock_wait": self.lock_wait, "lvm": self.lvm, "other": self.other,
                "total_without_lvm": self.total - self.lvm}


def split_summary(splits: Sequence[dict[str, float]]) -> dict[str, dict[str, float]]:
    """Per part of the split (total, queue_wait, qmp...), the summary over all samples."""
    keys = splits[0].keys() if splits else ()
    return {key: summary([s[key] for s in splits]) for key in keys}


def storage(vg: VG, storeid: str = "san") -> ThinStorageSpec:
    # Each side of the comparison has its own storage id: the storage lock is
    # a flock named after it, shared by every daemon on the node.
    return ThinStorageSpec(storeid, vg.name, chunksize=f"{CHUNK // MiB}M",
                           chunk_percentage=PERCENTAGE, initial_size=f"{INITIAL // MiB}M")


def thin_disk(vg: VG, vmid: int) -> Disk:
    path = vg.create_lv(f"vm-{vmid}-disk-0.qcow2", INITIAL)
    qcow2_create(path, VIRTUAL)
    return Pve9Disk.for_volume(path, VOLID)


def vg_size(extensions: int) -> int:
    return INITIAL + (extensions + 4) * CHUNK + 64 * MiB


def allocation(vm: QemuVM, node: str) -> int:
    for entry in vm.qmp("query-blockstats", query_nodes=True):
        if entry.get("node-name") == node:
            return int(entry["stats"]["wr_highest_offset"])
    raise LookupError(f"no blockstats for node {node!r}")


def armed_threshold(vm: QemuVM, node: str) -> int:
    return int(vm.named_node(node)["write_threshold"])


def event_time(event: dict[str, Any]) -> float:
    stamp = event["timestamp"]
    return float(stamp["seconds"]) + float(stamp["microseconds"]) / 1e6


def approach(vm: QemuVM, cursor: int) -> int:
    """Write fresh data until the allocation is just under the threshold; the new cursor."""
    threshold = armed_threshold(vm, FILE_NODE)
    if threshold == 0:
        raise RuntimeError("no threshold armed: nothing to cross")
    room = threshold - allocation(vm, FILE_NODE) - MARGIN
    length = max(0, room // CLUSTER * CLUSTER)
    if length:
        vm.write_pattern(FORMAT_NODE, cursor, length, 0x5A, timeout=IO_TIMEOUT)
    return cursor + length


def cross_and_wait(vm: QemuVM, pvestord: Daemon, cursor: int) -> tuple[Sample, int]:
    """Cross the threshold with one small write; the extension it caused, measured."""
    before = armed_threshold(vm, FILE_NODE)
    seen = len(pvestord.log_text())
    vm.write_pattern(FORMAT_NODE, cursor, CROSSING, 0xA5, timeout=IO_TIMEOUT)
    event = vm.wait_event("BLOCK_WRITE_THRESHOLD", timeout=EVENT_TIMEOUT,
                          match=lambda e: e.get("data", {}).get("node-name") == FILE_NODE)
    deadline = time.monotonic() + EXTEND_TIMEOUT
    while True:
        found = extension_after(pvestord.log_text()[seen:])
        if found is not None:
            extended, armed = found
            break
        if time.monotonic() > deadline:
            raise TimeoutError(f"no extension and re-arm within {EXTEND_TIMEOUT:g} s:\n"
                               + pvestord.log_text()[seen:][-3000:])
        time.sleep(0.05)
    after = armed_threshold(vm, FILE_NODE)
    if after <= before:
        raise RuntimeError(f"threshold {after} not above the crossed one {before} after the "
                           "daemon logged the re-arm")
    fields = extended.fields
    sample = Sample(
        event=event_time(event), round_started=float(fields["ROUND_STARTED"]),
        extended=extended.time, armed=armed.time, qmp_in_round=int(fields["QMP_MS"]) / 1000,
        lock_wait=int(fields["LOCK_WAIT_MS"]) / 1000, lvm=int(fields["LVM_MS"]) / 1000)
    return sample, cursor + CROSSING


def extension_after(text: str) -> tuple[daemonlog.LogLine, daemonlog.LogLine] | None:
    """The first extension record of our drive in ``text`` and the re-arm record after it."""
    extended: daemonlog.LogLine | None = None
    for line in daemonlog.parse(text):
        if extended is None:
            if daemonlog.is_extension(line) and line.fields.get("BLOCK_NODE") == FILE_NODE:
                extended = line
        elif daemonlog.is_armed(line, VMID, FILE_NODE):
            return extended, line
    return None


class DaemonSide:
    """One thin drive under its own daemons, ready to be crossed sample after sample."""

    def __init__(self, bed: NodeBed, pvestord: Daemon, vm: QemuVM) -> None:
        self.bed = bed
        self.pvestord = pvestord
        self.vm = vm
        self.cursor = 0
        self.samples: list[Sample] = []

    def sample(self) -> None:
        self.cursor = approach(self.vm, self.cursor)
        sample, self.cursor = cross_and_wait(self.vm, self.pvestord, self.cursor)
        self.samples.append(sample)
        wait_until(lambda: not self.bed.entries(), 30, "the queue to drain")


@contextlib.contextmanager
def daemon_side(out: Path, name: str, extensions: int, pvestord_args: Sequence[str] = (),
                storeid: str = "san") -> Iterator[DaemonSide]:
    logs = out / name
    logs.mkdir(parents=True, exist_ok=True)
    with one_at_a_time(loop_vg(vg_size(extensions), prefix="lat")) as vg, \
            tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        bed = NodeBed(Path(tmp), [storage(vg, storeid)], logs_dir=logs, verbose=False)
        disk = thin_disk(vg, VMID)
        with daemons(bed, pvestord_args=pvestord_args) as (_, pvestord), QemuVM(
                VMID, bed.run_dir, disks=[disk], event_socket=bed.event_socket,
                log_path=logs / "qemu.log") as vm:
            wait_until(lambda: armed_threshold(vm, FILE_NODE) > 0, 60, "the first threshold")
            yield DaemonSide(bed, pvestord, vm)


def daemon_result(side: DaemonSide, pvestord_args: Sequence[str]) -> dict[str, Any]:
    splits = [s.split() for s in side.samples]
    return {"pvestord_args": list(pvestord_args), "chunk": CHUNK, "percentage": PERCENTAGE,
            "summary": split_summary(splits), "samples": [asdict(s) for s in side.samples]}


def daemon_latency(out: Path, name: str, extensions: int,
                   pvestord_args: Sequence[str] = ()) -> dict[str, Any]:
    """Scenario 1 (``pvestord_args`` empty) or 3 (ORIGINAL_ARGS) alone: ``extensions`` samples."""
    with daemon_side(out, name, extensions, pvestord_args) as side:
        for _ in range(extensions):
            side.sample()
    return daemon_result(side, pvestord_args)


async def _floor_once(vm: QemuVM, vg: str, lv: str, target: int,
                      shells: LvmShells | None) -> dict[str, float]:
    """One extension's QMP and LVM calls, as the daemon makes them, with nothing around them."""
    began = time.perf_counter()
    async with VmMonitor(vm.qmp_path, "floor") as monitor:  # the round's observation
        await monitor.run_state()
        await monitor.execute("query-migrate")
        await monitor.block_nodes()
    async with VmMonitor(vm.qmp_path, "floor") as monitor:  # the check under the lock
        await monitor.execute("query-migrate")
    lvm_began = time.perf_counter()
    await lvm.lv_info(vg, lv, shells=shells)
    lvm.device_size(vg, lv)
    await lvm.extend(vg, lv, target, shells=shells)
    lvm_ended = time.perf_counter()
    async with VmMonitor(vm.qmp_path, "floor") as monitor:  # the re-arm
        await monitor.block_nodes()
        await monitor.run_state()
        await monitor.set_threshold(FILE_NODE, target - int(CHUNK * PERCENTAGE))
    ended = time.perf_counter()
    return {"total": ended - began, "qmp": (lvm_began - began) + (ended - lvm_ended),
            "lvm": lvm_ended - lvm_began}


class FloorSide:
    """The daemon's calls for one extension after another, on a QEMU with no daemon.

    ``lvm_shell``: LVM's calls in a persistent shell, as the daemon makes them;
    else one process per command (the naive floor). One event loop serves
    every sample, so that the shell lives from one to the next.
    """

    def __init__(self, vm: QemuVM, vg: VG, lv: str, *, lvm_shell: bool) -> None:
        self.vm = vm
        self.vg = vg
        self.lv = lv
        self.size = INITIAL
        self.samples: list[dict[str, float]] = []
        self.loop = asyncio.Runner()
        self.shells = LvmShells() if lvm_shell else None
        if self.shells is not None:
            # Its start-up is paid once, before the samples, as the daemon's is.
            self.loop.run(lvm.lv_info(vg.name, lv, shells=self.shells))
            if not self.shells.pids():
                raise RuntimeError("floor: the lvm shell did not start (see the warning)")

    def sample(self) -> None:
        self.size += CHUNK
        self.samples.append(self.loop.run(_floor_once(self.vm, self.vg.name, self.lv,
                                                      self.size, self.shells)))

    def close(self) -> None:
        if self.shells is not None:
            self.loop.run(self.shells.close())
        self.loop.close()


@contextlib.contextmanager
def floor_side(out: Path, extensions: int, *, lvm_shell: bool = True) -> Iterator[FloorSide]:
    name = "floor" if lvm_shell else "naive_floor"
    logs = out / name
    logs.mkdir(parents=True, exist_ok=True)
    with one_at_a_time(loop_vg(vg_size(extensions), prefix="flr")) as vg, \
            tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        disk = thin_disk(vg, VMID)
        lv = f"vm-{VMID}-disk-0.qcow2"
        with QemuVM(VMID, Path(tmp), disks=[disk], log_path=logs / "qemu.log") as vm:
            side = FloorSide(vm, vg, lv, lvm_shell=lvm_shell)
            try:
                yield side
            finally:
                side.close()
            final = vg.lv_size(lv)
            if final != side.size or vg.device_size(lv) != final:
                raise RuntimeError(f"{name}: LV is {final}, device {vg.device_size(lv)}, "
                                   f"expected {side.size}")


def floor(out: Path, extensions: int, *, lvm_shell: bool = True) -> dict[str, Any]:
    """Scenario 2 alone: the daemon's calls for ``extensions`` extensions, in a tight loop."""
    with floor_side(out, extensions, lvm_shell=lvm_shell) as side:
        for _ in range(extensions):
            side.sample()
    return {"summary": split_summary(side.samples), "samples": side.samples}


def side_by_side(out: Path, extensions: int) -> dict[str, dict[str, Any]]:
    """Scenarios 1, 2, 3 and 4's naive floor set up together and sampled in turn:
    their raw results by name."""
    with contextlib.ExitStack() as stack:
        sides = enter_together(stack, [
            daemon_side(out, "latency", extensions),
            floor_side(out, extensions, lvm_shell=True),
            floor_side(out, extensions, lvm_shell=False),
            daemon_side(out, "original", extensions, ORIGINAL_ARGS, storeid="sanorig")])
        ours: DaemonSide = sides[0]
        floor_: FloorSide = sides[1]
        naive: FloorSide = sides[2]
        original: DaemonSide = sides[3]
        turns: list[Callable[[], None]] = [ours.sample, floor_.sample, naive.sample,
                                           original.sample]
        for round_ in range(extensions):
            # Rotated each round: no side always follows the same other side.
            shift = round_ % len(turns)
            for turn in turns[shift:] + turns[:shift]:
                turn()
    order = "sampled in turn with the other three sides (rotating order), all set up at once"
    return {
        "latency": {**daemon_result(ours, ()), "interleaved": order},
        "floor": {"summary": split_summary(floor_.samples), "samples": floor_.samples,
                  "interleaved": order},
        "naive_floor": {"summary": split_summary(naive.samples), "samples": naive.samples,
                        "interleaved": order},
        "original": {**daemon_result(original, ORIGINAL_ARGS), "interleaved": order},
    }
