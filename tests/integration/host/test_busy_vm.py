"""A busy VM is retried with a backoff, not in a loop: real QEMU,
a real pvestord process, the QMP connections it makes counted by a proxy on
the VM's socket path over a 10 s window.

Two busy states QEMU really is in here: a destination started with
``-incoming defer`` (run state ``inmigrate``), and the source of a migration
in flight (QEMU to QEMU on this host, slowed by ``max-bandwidth``). No LVM:
the VMs have no thin drive, which is all this needs (the pass is refused on
the VM's state before it looks at any drive). The node tier's
test_faults_daemon.py does the same with thin drives and counts LVM too.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.harness.polling import wait_until
from tests.harness.qemu import QemuVM
from tests.harness.qmpproxy import CountingQmpProxy

PVESTORD = str(Path(sys.executable).parent / "pvestord")
WINDOW = 10.0
START_TIMEOUT = 90.0
#: Each pass opens one QMP connection; a backoff from 0.5 s doubling to a few
#: seconds makes about ten in the window. Thousands without one.
MOST_CONNECTIONS = 40


class Pvestord:
    def __init__(self, run_dir: Path, tmp: Path) -> None:
        (tmp / "storage.cfg").write_text("dir: local\n\tpath /var/lib/vz\n")
        self.log = tmp / "pvestord.log"
        argv = [PVESTORD, "--queue", str(tmp / "extend-queue"), "-v", "run",
                "--storage-config", str(tmp / "storage.cfg"), "--run-dir", str(run_dir),
                "--node", "n1", "--no-journal", "--no-lvm-shell",
                "--nodes-dir", str(tmp / "nodes"), "--reconcile-interval", "30"]
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(  # noqa: S603 - argument list
                argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=60)


@pytest.fixture
def out(tmp_path: Path) -> Path:
    return Path(os.environ.get("PVESTORD_TEST_OUT", str(tmp_path)))



def count_window(proxy: CountingQmpProxy, daemon: Pvestord) -> int:
    wait_until(lambda: proxy.connections >= 1 or daemon.proc.poll() is not None,
               START_TIMEOUT, "pvestord's first pass")
    assert daemon.proc.poll() is None, daemon.log.read_text()[-3000:]
    before = proxy.connections
    time.sleep(WINDOW)  # the measurement window itself
    return proxy.connections - before


def record(out: Path, name: str, connections: int) -> None:
    path = out / "busy-figures.json"
    data = json.loads(path.read_text()) if path.exists() else {}
    data[name] = {"window_s": WINDOW, "qmp_connections": connections}
    path.write_text(json.dumps(data, indent=2) + "\n")


def test_incoming_vm_is_retried_with_backoff(run_dir: Path, tmp_path: Path,
                                             out: Path) -> None:
    with QemuVM(761, run_dir, extra_args=["-incoming", "defer"]) as vm:
        assert vm.qmp("query-status")["status"] == "inmigrate"
        proxy = CountingQmpProxy(vm.qmp_path)
        try:
            daemon = Pvestord(run_dir, tmp_path)
            try:
                connections = count_window(proxy, daemon)
            finally:
                assert daemon.stop() == 0, daemon.log.read_text()[-3000:]
        finally:
            proxy.close()
    record(out, "incoming", connections)
    assert 1 <= connections <= MOST_CONNECTIONS, connections


def test_migrating_source_is_retried_with_backoff(run_dir: Path, tmp_path: Path,
                                                  out: Path) -> None:
    other = run_dir / "other"
    other.mkdir()
    uri = f"unix:{run_dir / 'mig.sock'}"
    with QemuVM(762, run_dir, machine="pc", extra_args=["-m", "64", "-S"]) as source, \
            QemuVM(762, other, machine="pc",
                   extra_args=["-m", "64", "-S", "-incoming", "defer"]) as destination:
        destination.qmp("migrate-incoming", uri=uri)
        source.qmp("migrate-set-parameters", max_bandwidth=4096)
        source.qmp("migrate", uri=uri)
        wait_until(lambda: source.qmp("query-migrate").get("status") == "active", 30,
                   "the migration in flight")
        proxy = CountingQmpProxy(source.qmp_path)
        try:
            daemon = Pvestord(run_dir, tmp_path)
            try:
                connections = count_window(proxy, daemon)
                assert source.qmp("query-migrate").get("status") == "active"
            finally:
                assert daemon.stop() == 0, daemon.log.read_text()[-3000:]
        finally:
            proxy.close()
            source.qmp("migrate_cancel")
    record(out, "source", connections)
    assert 1 <= connections <= MOST_CONNECTIONS, connections
