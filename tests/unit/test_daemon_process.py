"""``pvestord run`` as a real process on files alone (no VM, no LVM needed):
start, clean stop, bad input in its configuration and its queue."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from pvestord.adapters.queue import Entry, ExtendQueue
from pvestord.policy import Reason
from tests.harness.daemonlog import LogLine
from tests.harness.daemons import Daemon

PVESTORD = str(Path(sys.executable).parent / "pvestord")
TIMEOUT = 60.0


class Run(Daemon):
    """``pvestord -v run`` on files in ``tmp`` (tests/harness/daemons.py:
    up at ``READY=1``, its records known by their journal fields)."""

    def __init__(self, tmp: Path, *extra: str, make_run_dir: bool = True) -> None:
        self.tmp = tmp
        self.queue = tmp / "extend-queue"
        if make_run_dir:
            (tmp / "run").mkdir(exist_ok=True)
        super().__init__("pvestord", [
            PVESTORD, "-v", "--queue", str(self.queue), "run",
            "--storage-config", str(tmp / "storage.cfg"), "--run-dir", str(tmp / "run"),
            "--node", "n1", "--poll-interval", "0.2", "--no-journal", *extra],
            tmp / "pvestord.log")

    def record(self, what: str, *, level: str | None = None, **fields: str) -> LogLine:
        """The first record with these journal fields, within TIMEOUT."""
        return self.wait_record(what, TIMEOUT, level, 1, **fields)


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Run]:
    (tmp_path / "storage.cfg").write_text(
        "lvm: thin1\n\tvgname vg1\n\tpvestord-chunksize 1G\n\tshared 1\n")
    run = Run(tmp_path)
    yield run
    if run.proc.poll() is None:
        run.kill()


def test_starts_and_stops_cleanly_on_sigterm(daemon: Run) -> None:
    daemon.wait_ready(TIMEOUT)
    daemon.record("the configuration read", CONFIG="loaded", STORAGES="thin1")
    assert daemon.stop() == 0
    assert "STOPPING=1" in daemon.notified


def test_entries_of_vms_not_running_here_leave_only_if_ours(daemon: Run) -> None:
    daemon.wait_ready(TIMEOUT)
    queue = ExtendQueue(daemon.queue)
    queue.append([Entry(101, "drive-scsi0", Reason.THRESHOLD, origin="n1"),
                  Entry(102, "drive-scsi0", Reason.THRESHOLD, origin="othernode")])
    daemon.record("our entry dropped", VMID="101", ENTRY="dropped")
    # Another node's VM: left for that node to take.
    assert [e.key for e in queue.entries()] == [(102, "drive-scsi0")]
    assert daemon.stop() == 0


def test_an_entry_without_origin_is_dropped_only_where_its_vm_belongs(daemon: Run) -> None:
    """A plain ``VMID:NODE`` line (no origin) of a VM not running here: left for
    the node whose folder holds the VM's config, dropped here when the config
    is here or nowhere."""
    for node, vmid in (("othernode", 106), ("n1", 107)):
        config = daemon.tmp / "nodes" / node / "qemu-server" / f"{vmid}.conf"
        config.parent.mkdir(parents=True, exist_ok=True)
        config.write_text("scsi0: thin1:vm-1-disk-0.qcow2,size=32G\n")
    daemon.wait_ready(TIMEOUT)
    queue = ExtendQueue(daemon.queue)
    queue.append([Entry(106, "drive-scsi0", Reason.THRESHOLD),
                  Entry(107, "drive-scsi0", Reason.THRESHOLD),
                  Entry(108, "drive-scsi0", Reason.THRESHOLD)])
    daemon.record("the entry of a VM configured here dropped", VMID="107", ENTRY="dropped")
    daemon.record("the entry of a VM configured nowhere dropped", VMID="108", ENTRY="dropped")
    assert [e.key for e in queue.entries()] == [(106, "drive-scsi0")]
    assert daemon.stop() == 0


def test_malformed_queue_lines_are_set_aside_not_lost(daemon: Run) -> None:
    daemon.wait_ready(TIMEOUT)
    daemon.queue.write_bytes(b"not a queue line; rm -rf /\n\xff\xfe\x00garbage\n"
                             b"103:drive-scsi0 reason=threshold origin=othernode\n")
    ExtendQueue(daemon.queue).append([Entry(104, "d0", Reason.THRESHOLD, origin="othernode")])
    rejected = ExtendQueue(daemon.queue).rejected()
    assert len(rejected) == 2
    # One of ours behind them: once it is dropped, the daemon has read past
    # the garbage, and runs on.
    ExtendQueue(daemon.queue).append([Entry(105, "d0", Reason.THRESHOLD, origin="n1")])
    daemon.record("the entry behind the garbage dropped", VMID="105", ENTRY="dropped")
    assert {e.vmid for e in ExtendQueue(daemon.queue).entries()} == {103, 104}
    assert daemon.proc.poll() is None
    assert daemon.stop() == 0


def _rewrite(path: Path, text: str) -> None:
    """``text`` into ``path`` with an mtime a second past the last: changed
    for the daemon's stat even within one tick of the file system's clock."""
    before = path.stat().st_mtime_ns
    path.write_text(text)
    os.utime(path, ns=(before + 1_000_000_000, before + 1_000_000_000))


def test_invalid_storage_config_keeps_the_last_good_one(daemon: Run) -> None:
    config = daemon.tmp / "storage.cfg"
    daemon.record("the configuration read", CONFIG="loaded", STORAGES="thin1")
    bad = "lvm: thin1\n\tvgname vg1\n\tpvestord-chunksize 1G\n\tpvestord-chunk-percentage 1.5\n"
    _rewrite(config, bad)
    daemon.record("the bad configuration rejected", level="ERROR", CONFIG="rejected")
    _rewrite(config, bad)  # the same mistake, read again...
    daemon.record("the bad configuration read again", CONFIG="rejected", STILL_FAILING="yes")
    assert len(daemon.records(level="ERROR", CONFIG="rejected")) == 1  # ...logged once
    _rewrite(config, "lvm: thin1\n\tvgname vg1\n\tpvestord-chunksize 2G\n")
    daemon.record("the configuration valid again", CONFIG="loaded", RECOVERED="yes")
    assert daemon.proc.poll() is None
    assert daemon.stop() == 0


def test_missing_queue_folder_and_bad_arguments(tmp_path: Path) -> None:
    bad = subprocess.run([PVESTORD, "run", "--poll-interval", "-1"],  # noqa: S603
                         capture_output=True, text=True, timeout=TIMEOUT)
    assert bad.returncode == 1
    assert "poll-interval" in bad.stderr
    usage = subprocess.run([PVESTORD, "run", "--no-such-option"],  # noqa: S603
                           capture_output=True, text=True, timeout=TIMEOUT)
    assert usage.returncode == 2
    assert "unrecognized arguments" in usage.stderr


def test_run_folder_made_after_start_is_watched(tmp_path: Path) -> None:
    """qemu-server makes /run/qemu-server when it starts the first guest, after
    pvestord started at boot. A VM started then must be seen at once, not at
    the next poll: here the poll and the reconcile are an hour apart, so only
    the watch can tell the daemon."""
    (tmp_path / "storage.cfg").write_text("lvm: thin1\n\tvgname vg1\n\tpvestord-chunksize 1G\n")
    run = Run(tmp_path, "--poll-interval", "3600", "--reconcile-interval", "3600",
              make_run_dir=False)
    run_dir = tmp_path / "run"
    pidfile = run_dir / "101.pid"
    # A process whose command line names the pidfile, as QEMU's does.
    vm = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)",  # noqa: S603
                           "-pidfile", str(pidfile)])
    try:
        run.record("the run folder awaited", FOLDER=str(run_dir), WATCH="awaiting")
        # Normal at boot: said once at INFO, never as an error.
        assert run.records(level="ERROR") == []
        run_dir.mkdir()
        run.record("the run folder watched", FOLDER=str(run_dir), WATCH="watching")
        pidfile.write_text(f"{vm.pid}\n")
        run.record("the VM seen", VMID="101", VM_STATE="arrived")
        assert run.stop() == 0
    finally:
        vm.kill()
        vm.wait(timeout=TIMEOUT)
        if run.proc.poll() is None:
            run.kill()
