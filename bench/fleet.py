"""Scenarios 6 and 7: many QEMUs on one node. Idle cost, then bursts.

One pair of daemons and 20 QEMUs (``-machine none``, one thin drive each):
16 drives in VG A, 4 in VG B.

**Idle**: once every drive's threshold is armed and the queue is empty, CPU
time (``utime + stime`` from ``/proc/<pid>/stat``, and with the children it
waited for, i.e. the LVM commands of periodic reconciles) and RSS of each
daemon over a quiet window.

**Burst**: every drive of the burst is brought to just under its threshold,
then one small write each, from parallel threads, crosses them all within a
fraction of a second. The figure is the time from the first QEMU event to
the last "threshold armed" record of those drives. First the 16 drives of VG
A; then 4 more QEMUs start in VG B and 8 drives of A plus the 8 of B cross.
Extensions of one VG are serialized (storage lock), two VGs run in parallel.

Set-up (drives, QEMU starts, bringing drives under their thresholds) and
the QEMUs' shutdown run several at a time (bench.together); what is
measured starts only once all of it is done. All 24 drives, the 4 of the
second burst's QEMUs too, are made (bench.drives) while the daemons start:
the idle window sees 4 LVs that no QEMU uses, which the daemons do not look
at (reconciles read the LVs of running VMs; the node report, whole VGs).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from bench.drives import create_drives
from bench.latency import (
    CHUNK,
    CROSSING,
    EVENT_TIMEOUT,
    FILE_NODE,
    FORMAT_NODE,
    INITIAL,
    IO_TIMEOUT,
    PERCENTAGE,
    VIRTUAL,
    VOLID,
    approach,
    armed_threshold,
    event_time,
)
from bench.together import enter_together, map_together
from pvestord.engine import status
from tests.harness import daemonlog
from tests.harness.daemons import Daemon, NodeBed, ThinStorageSpec, daemons
from tests.harness.lvmbed import VG, MiB, loop_vg
from tests.harness.polling import wait_until
from tests.harness.qemu import Pve9Disk, QemuVM

FIRST_VMID = 200
IN_A = 16
IN_B_IDLE = 4
IN_B_BURST = 8
#: Time for the whole burst to be extended and re-armed, per drive (emulated node).
BURST_TIMEOUT_PER_DRIVE = 20.0
ARM_TIMEOUT = 300.0
#: After the last threshold is armed, before the idle window opens.
SETTLE = 5.0
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
#: QEMUs started (and drives brought under their thresholds) at once: the
#: guest has two CPUs, and each is mostly one thread's work.
START_PARALLEL = 4
#: A QEMU start shares the CPUs with the others started beside it.
LAUNCH_TIMEOUT = 120.0


def cpu_seconds(pid: int) -> tuple[float, float]:
    """(own, own + waited-for children) CPU seconds of ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    # After "pid (comm)": state is fields[0]; utime, stime, cutime, cstime are 11..14.
    utime, stime, cutime, cstime = (int(v) for v in fields[11:15])
    return (utime + stime) / CLOCK_TICKS, (utime + stime + cutime + cstime) / CLOCK_TICKS


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise LookupError(f"no VmRSS for pid {pid}")


def published_after(moment: float, pid: int) -> dict[str, Any]:
    """pvestord's first published view (status.json) written after ``moment``
    (wall clock) by the daemon ``pid``."""
    views: list[dict[str, Any]] = []

    def fresh() -> bool:
        view = status.read(status.STATUS_FILE)
        if view is not None and view.get("pid") == pid and view["time"] > moment:
            views.append(view)
            return True
        return False

    wait_until(fresh, 10 * status.STATUS_INTERVAL, f"a status view newer than {moment:.1f}")
    return views[-1]


def idle_counts(before: Mapping[str, Any], after: Mapping[str, Any],
                qemus: int) -> dict[str, float]:
    """Per minute, between two published views: what pvestord asked of LVM,
    of the VMs' QMP sockets and of pmxcfs. Counts, not times: they do not
    depend on the machine's speed."""
    minutes = (after["time"] - before["time"]) / 60

    def delta(kind: str, key: str) -> int:
        now: int = after["tally"][kind].get(key, 0)
        then: int = before["tally"][kind].get(key, 0)
        return now - then
    return {
        "minutes": minutes,
        "lvm_processes_per_minute": delta("commands", "lvm") / minutes,
        "processes_per_minute": sum(delta("commands", p) for p in after["tally"]["commands"])
        / minutes,
        "qmp_sessions_per_vm_per_minute": delta("events", "qmp_session") / qemus / minutes,
        "pmxcfs_writes_per_minute": (delta("events", "cluster_write")
                                     + delta("events", "cluster_lock_attempt")) / minutes,
    }


def idle_cost(daemons_: Sequence[Daemon], seconds: float, qemus: int) -> dict[str, Any]:
    """CPU % of one core and RSS of each daemon over ``seconds`` of nothing
    happening, and pvestord's idle counts (:func:`idle_counts`)."""
    pvestord = next(d for d in daemons_ if d.name == "pvestord")
    first = published_after(time.time(), pvestord.proc.pid)
    before = {d.name: cpu_seconds(d.proc.pid) for d in daemons_}
    began = time.monotonic()
    time.sleep(seconds)  # the measurement window itself
    elapsed = time.monotonic() - began
    last = published_after(time.time(), pvestord.proc.pid)
    result: dict[str, Any] = {"seconds": elapsed, "counts": idle_counts(first, last, qemus)}
    for d in daemons_:
        own, total = cpu_seconds(d.proc.pid)
        result[d.name] = {
            "cpu_percent": 100 * (own - before[d.name][0]) / elapsed,
            "cpu_percent_with_children": 100 * (total - before[d.name][1]) / elapsed,
            "rss_bytes": rss_bytes(d.proc.pid)}
    return result


class Fleet:
    """QEMUs with one thin drive each, on a shared bed; stopped when the stack closes."""

    def __init__(self, bed: NodeBed, stack: contextlib.ExitStack, paths: Mapping[int, str]) -> None:
        self.bed = bed
        self.stack = stack
        #: Each VMID's drive, made beforehand (bench.drives).
        self.paths = paths
        self.vms: dict[int, QemuVM] = {}
        #: Guest offset written up to, per VM: each burst writes fresh data.
        self.cursors: dict[int, int] = {}

    def start(self, vmids: Sequence[int]) -> None:
        """Start the QEMUs of ``vmids``, several at a time.

        Pure set-up: the daemons see QEMUs appear in any order, as on a node
        whose VMs are started together; the idle window and the bursts begin
        only once every threshold is armed.
        """
        vms = [QemuVM(vmid, self.bed.run_dir,
                      disks=[Pve9Disk.for_volume(self.paths[vmid], VOLID)],
                      event_socket=self.bed.event_socket,
                      log_path=self.bed.logs / f"qemu-{vmid}.log",
                      launch_timeout=LAUNCH_TIMEOUT) for vmid in vmids]
        enter_together(self.stack, vms, parallel=START_PARALLEL)
        self.vms.update(zip(vmids, vms, strict=True))

    def wait_armed(self, vmids: Sequence[int]) -> None:
        wait_until(lambda: all(armed_threshold(self.vms[v], FILE_NODE) > 0 for v in vmids),
                   ARM_TIMEOUT, f"thresholds of VMs {vmids[0]}..{vmids[-1]}", interval=1.0)
        wait_until(lambda: not self.bed.entries(), ARM_TIMEOUT, "the queue to drain")


def burst(fleet: Fleet, pvestord: Daemon, vmids: Sequence[int]) -> dict[str, Any]:
    """Cross the thresholds of ``vmids`` together; first event to last re-arm."""
    cursors: dict[int, int] = {}

    def prepare(vmid: int) -> None:
        cursors[vmid] = approach(fleet.vms[vmid], fleet.cursors.get(vmid, 0))

    # Bringing each drive under its threshold is set-up: before the first event.
    map_together(prepare, vmids, parallel=START_PARALLEL)
    seen = len(pvestord.log_text())
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(vmids)) as pool:
        writes = [pool.submit(fleet.vms[v].write_pattern, FORMAT_NODE, cursors[v], CROSSING,
                              0xA5, timeout=IO_TIMEOUT) for v in vmids]
        for write in writes:
            write.result()
    for v in vmids:
        fleet.cursors[v] = cursors[v] + CROSSING
    events = {v: event_time(fleet.vms[v].wait_event(
        "BLOCK_WRITE_THRESHOLD", timeout=EVENT_TIMEOUT,
        match=lambda e: e.get("data", {}).get("node-name") == FILE_NODE)) for v in vmids}
    deadline = time.monotonic() + BURST_TIMEOUT_PER_DRIVE * len(vmids)
    while True:
        armed = rearmed_after(pvestord.log_text()[seen:], vmids)
        if len(armed) == len(vmids):
            break
        if time.monotonic() > deadline:
            raise TimeoutError(f"burst: {len(vmids) - len(armed)} of {len(vmids)} drives not "
                               "extended and re-armed in time")
        time.sleep(0.1)
    first = min(events.values())
    return {"drives": len(vmids), "seconds": max(armed.values()) - first,
            "event_spread": max(events.values()) - first,
            "per_drive": {str(v): armed[v] - events[v] for v in vmids}}


def rearmed_after(text: str, vmids: Sequence[int]) -> dict[int, float]:
    """VMID -> time of the first re-arm that follows an extension of its drive in ``text``."""
    wanted = set(vmids)
    extended: set[int] = set()
    armed: dict[int, float] = {}
    for line in daemonlog.parse(text):
        vmid = int(line.fields.get("VMID", "0"))
        if vmid not in wanted or vmid in armed:
            continue
        if daemonlog.is_extension(line):
            extended.add(vmid)
        elif vmid in extended and daemonlog.is_armed(line, vmid, FILE_NODE):
            armed[vmid] = line.time
    return armed


def _vg_size(drives: int, extensions: int) -> int:
    return drives * (INITIAL + (extensions + 1) * CHUNK) + 128 * MiB


@contextlib.contextmanager
def _bed(out: Path) -> Iterator[tuple[NodeBed, VG, VG]]:
    logs = out / "fleet"
    logs.mkdir(parents=True, exist_ok=True)
    with loop_vg(_vg_size(IN_A, 2), prefix="fla") as vg_a, \
            loop_vg(_vg_size(IN_B_IDLE + IN_B_BURST, 1), prefix="flb") as vg_b, \
            tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        specs = [ThinStorageSpec(name, vg.name, chunksize=f"{CHUNK // MiB}M",
                                 chunk_percentage=PERCENTAGE, initial_size=f"{INITIAL // MiB}M")
                 for name, vg in (("sana", vg_a), ("sanb", vg_b))]
        yield NodeBed(Path(tmp), specs, logs_dir=logs, verbose=False), vg_a, vg_b


def run(out: Path, idle_seconds: float) -> dict[str, Any]:
    """Idle cost with 20 QEMUs, then the one-VG and two-VG bursts."""
    results: dict[str, Any] = {}
    setup: dict[str, float] = {}
    in_a = [FIRST_VMID + i for i in range(IN_A)]
    in_b = [FIRST_VMID + IN_A + i for i in range(IN_B_BURST)]
    began = time.monotonic()

    def timed_drives(vg_a: VG, vg_b: VG) -> dict[int, str]:
        paths = create_drives([(vg_a, v) for v in in_a] + [(vg_b, v) for v in in_b],
                              INITIAL, VIRTUAL)
        setup["drives_made"] = time.monotonic() - began
        return paths

    with _bed(out) as (bed, vg_a, vg_b), \
            concurrent.futures.ThreadPoolExecutor(max_workers=1) as background:
        setup["vgs_made"] = time.monotonic() - began
        # The daemons' start-ups and the lvcreates are each single-threaded
        # work: side by side they use both CPUs. The drives all exist before
        # the first QEMU starts, so what the daemons see from then on is as before.
        drives = background.submit(timed_drives, vg_a, vg_b)
        with daemons(bed) as (qmeventd, pvestord), contextlib.ExitStack() as stack:
            setup["daemons_started"] = time.monotonic() - began
            fleet = Fleet(bed, stack, drives.result())
            fleet.start(in_a + in_b[:IN_B_IDLE])
            fleet.wait_armed(list(fleet.vms))
            setup["qemus_armed"] = time.monotonic() - began
            print("bench: fleet set-up (s since its start): "
                  + ", ".join(f"{step} {at:.0f}" for step, at in setup.items()), flush=True)
            time.sleep(SETTLE)
            results["idle"] = {"qemus": len(fleet.vms),
                               **idle_cost([qmeventd, pvestord], idle_seconds,
                                           len(fleet.vms))}
            results["burst_one_vg"] = burst(fleet, pvestord, in_a)
            fleet.start(in_b[IN_B_IDLE:])
            fleet.wait_armed(list(fleet.vms))
            results["burst_two_vgs"] = burst(fleet, pvestord, in_a[:IN_B_BURST] + in_b)
    results["setup_seconds"] = setup
    return results
