"""Which VMs run here: a pidfile naming a live process that still carries it."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pvestord.adapters.vms import local_vm, local_vms


@pytest.fixture
def fake_qemu(tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A stand-in process whose command line carries ``-pidfile <run>/101.pid``, as QEMU's does."""
    pidfile = tmp_path / "101.pid"
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)",  # noqa: S603
                             "-pidfile", str(pidfile)])
    # Between fork and exec the child still shows our own command line.
    deadline = time.monotonic() + 30
    while b"-pidfile" not in Path(f"/proc/{proc.pid}/cmdline").read_bytes():
        assert time.monotonic() < deadline, "stand-in process did not start"
        time.sleep(0.01)
    pidfile.write_text(f"{proc.pid}\n")
    yield proc
    proc.kill()
    proc.wait()


def test_live_process_with_its_pidfile_argument_runs_here(
        tmp_path: Path, fake_qemu: subprocess.Popen[bytes]) -> None:
    vm = local_vm(tmp_path, 101)
    assert vm is not None and vm.pid == fake_qemu.pid
    assert vm.qmp_socket == tmp_path / "101.qmp"
    assert [v.vmid for v in local_vms(tmp_path)] == [101]


def test_recycled_pid_is_not_the_vm(tmp_path: Path) -> None:
    # Our own pid is alive but its command line names no pidfile.
    (tmp_path / "102.pid").write_text(f"{__import__('os').getpid()}\n")
    assert local_vm(tmp_path, 102) is None


def test_dead_process_garbage_and_missing_pidfiles(
        tmp_path: Path, fake_qemu: subprocess.Popen[bytes]) -> None:
    fake_qemu.kill()
    fake_qemu.wait()
    (tmp_path / "103.pid").write_text("not a pid\n")
    assert local_vm(tmp_path, 101) is None
    assert local_vm(tmp_path, 103) is None
    assert local_vm(tmp_path, 104) is None
    assert list(local_vms(tmp_path / "missing")) == []
