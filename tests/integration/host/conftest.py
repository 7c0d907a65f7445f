"""Fixtures for the host tier: real QEMU processes on plain files, no LVM."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from pvestord.adapters.queue import Entry, ExtendQueue
from tests.harness.daemonlog import LogLine
from tests.harness.daemons import Daemon
from tests.harness.qemu import QEMU_ENV


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Tests marked root need real privileges (peer uid 0, setuid children).
    if os.geteuid() == 0:
        return
    skip = pytest.mark.skip(reason="needs root")
    for item in items:
        if "root" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session", autouse=True)
def _qemu_available() -> None:
    qemu = os.environ.get(QEMU_ENV, "qemu-system-x86_64")
    if shutil.which(qemu) is None:
        pytest.fail(f"{qemu} is not on PATH: the host tier needs a real QEMU")


@pytest.fixture
def run_dir() -> Iterator[Path]:
    """A short folder for sockets and pidfiles (unix socket paths max 107 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="pvq-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


# -- qmeventd-py as a real subprocess --------------------------------------------

#: How long the daemon may take to be ready, and to log what a test waits for.
DAEMON_START_TIMEOUT = 90.0  # bounds: generous for a loaded machine
DAEMON_WAIT_TIMEOUT = 90.0



class Qmeventd:
    """``qmeventd-py`` run from the venv as :class:`tests.harness.daemons.Daemon`
    runs it: up once it notifies ``READY=1``, its log records known by their
    journal fields, never by their wording."""

    def __init__(self, run_dir: Path, *, name: str = "qmeventd", extra: Sequence[str] = (),
                 cleanup_cmd: str | None = None) -> None:
        self.name = name
        self.socket = run_dir / "qmeventd.sock"
        self.queue_path = run_dir / "extend-queue"
        self.log_path = run_dir / f"{name}.log"
        self.argv = [str(Path(sys.executable).parent / "qmeventd-py"),
                     "--socket", str(self.socket), "--queue", str(self.queue_path),
                     "--node", "testnode", "-v", *extra]
        self.argv += ["--cleanup-cmd", cleanup_cmd] if cleanup_cmd else ["--no-cleanup"]
        self.process: Daemon | None = None

    def start(self) -> Qmeventd:
        self.process = Daemon(self.name, self.argv, self.log_path)
        self.process.wait_ready(DAEMON_START_TIMEOUT)
        return self

    @property
    def proc(self) -> subprocess.Popen[bytes]:
        assert self.process is not None, "not started"
        return self.process.proc

    def wait_record(self, what: str, *, count: int = 1, **fields: str) -> LogLine:
        """The ``count``-th log record with these journal fields, once there is one."""
        assert self.process is not None, "not started"
        return self.process.wait_record(what, DAEMON_WAIT_TIMEOUT, count=count, **fields)

    def entries(self) -> list[Entry]:
        return ExtendQueue(self.queue_path).entries()

    def kill(self) -> int:
        """SIGKILL, as a crash would; its exit status."""
        assert self.process is not None, "not started"
        self.process.kill()
        return self.proc.returncode

    def stop(self) -> int | None:
        """SIGTERM; its exit status, None when it never started."""
        return None if self.process is None else self.process.stop()


@pytest.fixture
def daemon_factory(run_dir: Path) -> Iterator[Callable[..., Qmeventd]]:
    started: list[Qmeventd] = []

    def start(**kwargs: Any) -> Qmeventd:
        daemon = Qmeventd(run_dir, name=f"qmeventd{len(started)}", **kwargs)
        started.append(daemon)
        return daemon.start()

    yield start
    for daemon in started:
        daemon.stop()
