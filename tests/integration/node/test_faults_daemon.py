"""The engine under faults of its own making: real daemons,
real QEMU, real LVM.

- a leftover ``outgoing`` migration mark with no migration behind it must not
  keep a VM paused on ENOSPC;
- a VM that is busy (the source of a migration in flight, or a destination in
  ``inmigrate``) is retried with a backoff, not in a loop: the
  QMP connections pvestord makes are counted by a proxy on the VM's QMP socket
  path, its LVM processes by ``lvm_faulty``'s markers, over a 10 s window;
- a pass that never ends (a QMP peer that never answers, an ``lvm`` stuck in
  an uninterruptible read of a suspended device, as on a dead SAN path)
  is abandoned at its deadline; VMs on other VGs keep being extended; and the
  watchdog is fed only while the engine makes progress. The
  watchdog's datagrams go to a real ``NOTIFY_SOCKET`` that the test reads.

The figures each test saw are written to ``<out>/faults-daemon-figures.json``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pvestord.engine import migration
from tests.harness.daemonlog import records
from tests.harness.daemons import Daemon, NodeBed, ThinStorageSpec, daemons
from tests.harness.enospcguest import (
    GUEST_PATTERN,
    GUEST_WRITE,
    PREFILL,
    assert_image_holds,
    assert_resumed_and_written,
    extended_size,
    run_guest_until_paused,
    timestamp,
    writer_vm,
)
from tests.harness.enospcguest import allocation as guest_allocation
from tests.harness.faultbed import (
    CHUNK,
    HEADROOM,
    LV0,
    Workload,
    fault_bed,
    grow_elsewhere,
    threshold,
)
from tests.harness.faults import LvmFaults
from tests.harness.lvmbed import VG, GiB, MiB, loop_vg, qcow2_create
from tests.harness.polling import wait_until
from tests.harness.qemu import Pve9Disk, QemuVM
from tests.harness.qmpproxy import CountingQmpProxy, NeverAnsweringQmp
from tests.harness.writerguest import build_writer

#: The measurement window of the busy-loop tests.
WINDOW = 10.0
#: A daemon's start-up and a first pass, under TCG with other guests busy.
START_TIMEOUT = 180.0
#: The watchdog period the tests ask for (``WATCHDOG_USEC``): a ping a second.
WATCHDOG_USEC = 2_000_000
#: The pass deadline the stuck-pass test sets (``--pass-deadline``): well
#: above a pass here (under TCG, with other guests on the same two cores, an
#: lvextend was seen to take 10 s and a whole pass over 30 s), well below
#: the default.
PASS_DEADLINE = 60.0
#: From the stuck command's start to the deadline, the wedge (deadline +
#: pvestord.engine.passes.WEDGE_GRACE) and a few pings missed, with margin.
WEDGE_TIMEOUT = 300.0


# -- the bed ---------------------------------------------------------------------

@pytest.fixture
def bed(vg: VG, tmp_path: Path, out_dir: Path) -> NodeBed:
    return fault_bed(vg, tmp_path, out_dir)


def node(bed: NodeBed, *pvestord_args: str) -> contextlib.AbstractContextManager[
        tuple[Daemon, Daemon]]:
    """Both daemons, pvestord with a process per LVM command (so that
    ``lvm_faulty`` sees each one)."""
    return daemons(bed, pvestord_args=("--no-lvm-shell", *pvestord_args))


def record(out_dir: Path, name: str, figures: dict[str, Any]) -> None:
    path = out_dir.parent / "faults-daemon-figures.json"
    data = json.loads(path.read_text()) if path.exists() else {}
    data[name] = figures
    path.write_text(json.dumps(data, indent=2) + "\n")


def lvm_processes(faults: LvmFaults) -> int:
    """LVM processes pvestord started since the last ``forget_calls``."""
    return sum(len(m.read_text().split()) for m in faults.folder.glob("*.started"))


def log_lines(daemon: Daemon, level: str, **fields: str) -> list[str]:
    """Messages of ``daemon`` at ``level`` carrying every one of ``fields``."""
    return [line.message for line in records(daemon.log_text(), level, **fields)]


class WatchdogListener:
    """A real ``NOTIFY_SOCKET`` (a datagram socket) recording when each
    ``WATCHDOG=1`` arrived."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.pings: list[float] = []
        self.messages: list[str] = []
        threading.Thread(target=self._read, daemon=True, name="notify").start()

    def _read(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                data = self.sock.recv(4096).decode(errors="replace")
                self.messages.append(data)
                if "WATCHDOG=1" in data.split("\n"):
                    self.pings.append(time.monotonic())

    def silent_for(self) -> float:
        return time.monotonic() - (self.pings[-1] if self.pings else 0.0)

    def pings_since(self, since: float) -> int:
        return len([t for t in self.pings if t >= since])

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def watchdog(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[WatchdogListener]:
    listener = WatchdogListener(tmp_path / "notify.sock")
    monkeypatch.setenv("NOTIFY_SOCKET", str(listener.path))
    monkeypatch.setenv("WATCHDOG_USEC", str(WATCHDOG_USEC))
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    yield listener
    listener.close()


def thin_vm(bed: NodeBed, vg: VG, vmid: int, *extra_args: str,
            run_dir: Path | None = None, machine: str = "none") -> tuple[QemuVM, str]:
    lv = f"vm-{vmid}-disk-0.qcow2"
    path = vg.lv_path(lv)
    if not Path(path).exists():
        qcow2_create(vg.create_lv(lv, LV0), 8 * GiB)
    disk = Pve9Disk.for_volume(path, f"thin1:{lv}")
    vm = QemuVM(vmid, run_dir or bed.run_dir, disks=[disk],
                machine=machine, event_socket=bed.event_socket if run_dir is None else None,
                log_path=bed.logs / f"qemu-{vmid}{'-' + run_dir.name if run_dir else ''}.log",
                extra_args=list(extra_args), launch_timeout=120)
    return vm, lv


# -- 2.2: a leftover migration mark ------------------------------------------------

def test_leftover_migration_mark_does_not_keep_a_vm_paused(
        bed: NodeBed, vg: VG, tmp_path: Path, out_dir: Path, faults: LvmFaults) -> None:
    """A fresh mark defers (the hook calls ``begin`` before the migration
    starts), and a VM that paused meanwhile is said once at warning; once the
    mark is past its grace with no migration, the next pass extends and resumes."""
    vmid = 941
    guest = build_writer(tmp_path, out_dir, f"writer-{vmid}", start=PREFILL,
                         length=GUEST_WRITE, pattern=GUEST_PATTERN)
    bed.storages[0] = ThinStorageSpec("thin1", vg.name)  # 256 MiB chunks, as the guest needs
    bed.write_storage_config()
    vm, lv, _ = writer_vm(bed, vg, vmid, guest)
    with vm:
        stop = run_guest_until_paused(vm, guest)
        expected = extended_size(guest_allocation(vm))
        mark = migration.mark_path(bed.run_dir, vmid)
        mark.write_text(f"outgoing {time.time():.3f}\n")  # a hook's begin, and no migration
        proxy = CountingQmpProxy(vm.qmp_path)
        try:
            with node(bed) as (_, pvestord):
                os.utime(mark)  # fresh when the daemon first looks, however slow its start
                wait_until(lambda: log_lines(pvestord, "WARNING", VMID=str(vmid)), 60,
                           "the deferred, paused VM said at warning")
                seen = proxy.connections
                wait_until(lambda: proxy.connections >= seen + 3, 60, "three more passes")
                assert vm.qmp("query-status")["status"] == "io-error"
                assert vg.lv_size(lv) == 64 * MiB
                warned = log_lines(pvestord, "WARNING", VMID=str(vmid))
                assert len(warned) == 1, warned  # once per deferral, not per retry
                # The migration never came: the mark is left over.
                past = time.time() - migration.MARK_GRACE - 1
                os.utime(mark, (past, past))
                aged = time.time()
                resume = assert_resumed_and_written(vm, guest)
                assert vg.lv_size(lv) == expected
                assert not mark.exists()
                wait_until(lambda: len(log_lines(pvestord, "WARNING", VMID=str(vmid))) >= 3, 30,
                           "the stale mark's removal and the resume said at warning")
                record(out_dir, "leftover_mark", {
                    "aged_to_resume_s": round(timestamp(resume) - aged, 3),
                    "stop_to_resume_s": round(timestamp(resume) - timestamp(stop), 3),
                    "qmp_connections_while_deferred": proxy.connections,
                })
        finally:
            proxy.close()
    assert_image_holds(vg, lv, guest, prefilled=PREFILL)


# -- 4.1: busy VMs, no busy loop ---------------------------------------------------

def test_incoming_vm_is_retried_with_backoff_and_refreshed_once(
        bed: NodeBed, vg: VG, out_dir: Path, faults: LvmFaults) -> None:
    vm, lv = thin_vm(bed, vg, 942, "-incoming", "defer")
    with vm:
        assert vm.qmp("query-status")["status"] == "inmigrate"
        proxy = CountingQmpProxy(vm.qmp_path)
        try:
            with node(bed, "--reconcile-interval", "30"):
                wait_until(lambda: proxy.connections >= 1, START_TIMEOUT, "a first pass")
                # Forget before the table changes: the daemon may refresh
                # the moment the metadata grows.
                faults.forget_calls()
                before = proxy.connections
                opened = time.monotonic()
                grow_elsewhere(vg, lv, LV0 + CHUNK)
                wait_until(lambda: vg.device_size(lv) == LV0 + CHUNK, 60,
                           "this node's table caught up with the grown LV")
                # The rest of the window measures the retries, caught up or not.
                time.sleep(max(0.0, opened + WINDOW - time.monotonic()))
                qmp = proxy.connections - before
                lvm = lvm_processes(faults)
                refreshes = len(faults.started("lvchange"))
                record(out_dir, "incoming_busy", {"window_s": WINDOW, "qmp_connections": qmp,
                                                  "lvm_processes": lvm,
                                                  "refreshes": refreshes})
                assert refreshes == 1  # once per table change
                assert qmp < 60, qmp
                assert lvm < 60, lvm
        finally:
            proxy.close()


# In the full node set: the incoming VM's test above takes the same backoff,
# and tests/unit/test_daemon_watchdog.py its rule.
@pytest.mark.node_full
def test_migrating_source_is_retried_with_backoff(
        bed: NodeBed, vg: VG, tmp_path: Path, out_dir: Path, faults: LvmFaults) -> None:
    """A real migration in flight: QEMU to QEMU on this node, the destination
    standing for the other node, slowed to a crawl by ``max-bandwidth``."""
    other = tmp_path / "other"
    other.mkdir()
    source, lv = thin_vm(bed, vg, 943, "-m", "64", "-S", machine="pc")
    destination, _ = thin_vm(bed, vg, 943, "-m", "64", "-S", "-incoming", "defer",
                             run_dir=other, machine="pc")
    uri = f"unix:{tmp_path / 'migration.sock'}"
    with source, destination:
        proxy = CountingQmpProxy(source.qmp_path)
        try:
            with node(bed, "--reconcile-interval", "30"):
                wait_until(lambda: proxy.connections >= 1, START_TIMEOUT, "a first pass")
                # Started once the daemon runs (its start-up under TCG outlasts
                # a slowed migration of an idle VM, which is mostly zero pages).
                destination.qmp("migrate-incoming", uri=uri)
                source.qmp("migrate-set-parameters", max_bandwidth=1024)
                source.qmp("migrate", uri=uri)
                wait_until(lambda: source.qmp("query-migrate").get("status") == "active", 60,
                           "the migration in flight")
                faults.forget_calls()
                before = proxy.connections
                time.sleep(WINDOW)  # the measurement window itself
                qmp = proxy.connections - before
                lvm = lvm_processes(faults)
                status = source.qmp("query-migrate").get("status")
                record(out_dir, "source_busy", {"window_s": WINDOW, "qmp_connections": qmp,
                                                "lvm_processes": lvm})
                assert status == "active", "the migration ended within the window"
                assert vg.lv_size(lv) == LV0  # deferred: never grown on the source
                assert qmp < 60, qmp
                assert lvm < 60, lvm
        finally:
            proxy.close()
            with contextlib.suppress(Exception):
                source.qmp("migrate_cancel")


# -- 2.3: a pass that never ends -----------------------------------------------------

STUCK_LVM = """#!/bin/sh
# Stands in for lvm (test code): an lvextend on VG {vg} never returns (until
# killed); every other command is the real lvm.
if [ "$1" = lvextend ]; then
    case " $* " in *" {vg}/"*)
        echo $$ >> {folder}/stuck.started
        exec sleep 100000 ;;
    esac
fi
exec {real} "$@"
"""


@pytest.mark.faults_full
def test_stuck_pass_is_abandoned_and_other_vgs_are_served(
        bed: NodeBed, vg: VG, tmp_path: Path, out_dir: Path, watchdog: WatchdogListener,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """An lvextend that never returns (with an LVM budget longer than the pass
    deadline) and a QMP peer that never greets: each pass is abandoned at its
    deadline, logged at error (VMID; VG and the VG marked when it was in an
    LVM change), while a VM on another VG is extended and that VG stays
    healthy. Both cancellations take, so the engine is not wedged and the
    watchdog keeps being fed. (An lvm in D state, whose cancellation does not
    take, stopped the pings 31 s after its cancel in a guest run with an
    O_DIRECT read of a suspended dm device; that variant is not kept here: the
    test itself blocked after its ``dmsetup resume``, cause not found.)"""
    health = tmp_path / "vg-unhealthy"
    folder = tmp_path / "stuck-lvm"
    folder.mkdir()
    standin = tmp_path / "lvm_stuck_standin"
    standin.write_text(STUCK_LVM.format(vg=vg.name, folder=folder, real=shutil.which("lvm")))
    standin.chmod(0o755)
    monkeypatch.setenv("PVESTORD_LVM", str(standin))
    with loop_vg(prefix="pvu") as vg2:
        bed.storages.append(ThinStorageSpec("thin2", vg2.name, chunksize="32M",
                                            chunk_percentage=0.5, initial_size="64M"))
        bed.write_storage_config()
        stuck, _ = thin_vm(bed, vg, 951)
        healthy, healthy_lv = thin_vm(bed, vg2, 952)
        hung_qmp = NeverAnsweringQmp(bed.run_dir, 953)
        try:
            with stuck, healthy, node(
                    bed, "--reconcile-interval", "5", "--pass-deadline", str(PASS_DEADLINE),
                    # Budgets past the deadline, so the deadline is what ends the
                    # pass; the lock's lifetime must cover the LVM budget
                    # (DaemonSettings refuses one that does not fit).
                    "--qmp-timeout", "600", "--lvm-timeout", "600", "--lock-lifetime", "1200",
                    "--vg-health-dir", str(health)) as (_, pvestord):
                wait_until(lambda: threshold(healthy) == LV0 - HEADROOM
                           and threshold(stuck) == LV0 - HEADROOM, START_TIMEOUT,
                           "both thresholds armed")
                wait_until(lambda: log_lines(pvestord, "ERROR", VMID="953"), WEDGE_TIMEOUT,
                           "the pass over the never-answering VM abandoned")
                assert not health.exists() or not list(health.iterdir())

                Workload(stuck).cross_threshold()
                wait_until(lambda: (folder / "stuck.started").exists(), 60, "lvextend stuck")
                stuck_at = time.monotonic()
                wait_until(lambda: (health / vg.name).exists(), WEDGE_TIMEOUT,
                           "the VG marked unhealthy")
                wait_until(lambda: log_lines(pvestord, "ERROR", VMID="951", VG=vg.name), 30,
                           "the abandoned pass logged at error with VMID and VG")
                marked_after = round(time.monotonic() - stuck_at, 2)

                work = Workload(healthy)
                work.cross_threshold()
                wait_until(lambda: vg2.lv_size(healthy_lv) == LV0 + CHUNK
                           and threshold(healthy) == LV0 + CHUNK - HEADROOM, WEDGE_TIMEOUT,
                           "the VM on the other VG extended")
                extended_after = round(time.monotonic() - stuck_at, 2)
                assert not (health / vg2.name).exists(), "the other VG marked unhealthy"
                since = time.monotonic()
                wait_until(lambda: watchdog.pings_since(since) >= 3, 60,
                           "pings: every cancellation took, nothing is wedged")
                assert pvestord.proc.poll() is None
                record(out_dir, "stuck_pass", {
                    "pass_deadline_s": PASS_DEADLINE,
                    "vg_marked_s_after_stuck": marked_after,
                    "other_vg_extended_s_after_stuck": extended_after,
                    "pings": len(watchdog.pings),
                })
                work.verify()
                hung_qmp.close()  # so that the daemon's stop need not wait for its pass
        finally:
            hung_qmp.close()
