"""``pvestord run`` as a real process on files alone (no VM, no LVM needed):
start, clean stop, bad input in its configuration and its queue."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pvestord.adapters.queue import Entry, ExtendQueue
from pvestord.policy import Reason

PVESTORD = str(Path(sys.executable).parent / "pvestord")
TIMEOUT = 60.0


class Run:
    def __init__(self, tmp: Path, *extra: str, make_run_dir: bool = True) -> None:
        self.tmp = tmp
        self.queue = tmp / "extend-queue"
        self.log = tmp / "pvestord.log"
        if make_run_dir:
            (tmp / "run").mkdir(exist_ok=True)
        self.argv = [PVESTORD, "--queue", str(self.queue), "run", "--storage-config",
                     str(tmp / "storage.cfg"), "--run-dir", str(tmp / "run"), "--node", "n1",
                     "--poll-interval", "0.2", "--no-journal", *extra]
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(  # noqa: S603 - argument list
                self.argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)

    def text(self) -> str:
        return self.log.read_text()

    def wait_log(self, needle: str) -> None:
        deadline = time.monotonic() + TIMEOUT
        while needle not in self.text():
            assert self.proc.poll() is None, self.text()
            assert time.monotonic() < deadline, f"{needle!r} not logged:\n{self.text()}"
            time.sleep(0.05)

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=TIMEOUT)


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Run]:
    (tmp_path / "storage.cfg").write_text(
        "lvm: thin1\n\tvgname vg1\n\tchunksize 1G\n\tshared 1\n")
    run = Run(tmp_path)
    yield run
    if run.proc.poll() is None:
        run.proc.kill()
        run.proc.wait(timeout=TIMEOUT)


def test_starts_and_stops_cleanly_on_sigterm(daemon: Run) -> None:
    daemon.wait_log("pvestord started on node n1")
    assert "thin storages: thin1" in daemon.text()
    assert daemon.stop() == 0
    assert "pvestord stopped" in daemon.text()


def test_entries_of_vms_not_running_here_leave_only_if_ours(daemon: Run) -> None:
    daemon.wait_log("pvestord started")
    queue = ExtendQueue(daemon.queue)
    queue.append([Entry(101, "drive-scsi0", Reason.THRESHOLD, origin="n1"),
                  Entry(102, "drive-scsi0", Reason.THRESHOLD, origin="othernode")])
    daemon.wait_log("entry 101:drive-scsi0 dropped")
    # Another node's VM: left for that node to take.
    assert [e.key for e in queue.list()] == [(102, "drive-scsi0")]
    assert daemon.stop() == 0


def test_malformed_queue_lines_are_set_aside_not_lost(daemon: Run) -> None:
    daemon.wait_log("pvestord started")
    daemon.queue.write_bytes(b"not a queue line; rm -rf /\n\xff\xfe\x00garbage\n"
                             b"103:drive-scsi0 reason=threshold origin=othernode\n")
    ExtendQueue(daemon.queue).append([Entry(104, "d0", Reason.THRESHOLD, origin="othernode")])
    rejected = ExtendQueue(daemon.queue).rejected()
    assert len(rejected) == 2
    assert {e.vmid for e in ExtendQueue(daemon.queue).list()} == {103, 104}
    time.sleep(1)
    assert daemon.proc.poll() is None
    assert daemon.stop() == 0


def test_invalid_storage_config_keeps_the_last_good_one(daemon: Run) -> None:
    daemon.wait_log("thin storages: thin1")
    time.sleep(0.05)  # a new mtime
    (daemon.tmp / "storage.cfg").write_text(
        "lvm: thin1\n\tvgname vg1\n\tchunksize 1G\n\tchunk-percentage 1.5\n")
    daemon.wait_log("chunk-percentage = 1.5")
    daemon.wait_log("keeping the previous configuration")
    time.sleep(1)  # several polls later...
    assert daemon.text().count("chunk-percentage = 1.5") == 1  # ...logged once
    (daemon.tmp / "storage.cfg").write_text("lvm: thin1\n\tvgname vg1\n\tchunksize 2G\n")
    daemon.wait_log("is valid again")
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
    (tmp_path / "storage.cfg").write_text("lvm: thin1\n\tvgname vg1\n\tchunksize 1G\n")
    run = Run(tmp_path, "--poll-interval", "3600", "--reconcile-interval", "3600",
              make_run_dir=False)
    run_dir = tmp_path / "run"
    pidfile = run_dir / "101.pid"
    # A process whose command line names the pidfile, as QEMU's does.
    vm = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)",  # noqa: S603
                           "-pidfile", str(pidfile)])
    try:
        run.wait_log(f"{run_dir} does not exist yet")
        # Normal at boot: said once at INFO, never as an error.
        assert "ERROR" not in run.text()
        run_dir.mkdir()
        run.wait_log(f"{run_dir} appeared: watching it")
        pidfile.write_text(f"{vm.pid}\n")
        run.wait_log("VM 101 runs here")
        assert run.stop() == 0
    finally:
        vm.kill()
        vm.wait(timeout=TIMEOUT)
        if run.proc.poll() is None:
            run.proc.kill()
            run.proc.wait(timeout=TIMEOUT)
