"""Fixtures for the host tier: real QEMU processes on plain files, no LVM."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from pvestord.adapters.queue import Entry, ExtendQueue
from tests.harness.polling import wait_until
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

#: How long the daemon may take to create its socket, and to exit on SIGTERM.
DAEMON_START_TIMEOUT = 90.0  # a bound: generous for a loaded machine
DAEMON_STOP_TIMEOUT = 30.0



class Daemon:
    """``qmeventd-py`` run from the venv, its log kept in a file."""

    def __init__(self, run_dir: Path, *, name: str = "qmeventd", extra: Sequence[str] = (),
                 cleanup_cmd: str | None = None) -> None:
        self.socket = run_dir / "qmeventd.sock"
        self.queue_path = run_dir / "extend-queue"
        self.log_path = run_dir / f"{name}.log"
        self.argv = [str(Path(sys.executable).parent / "qmeventd-py"),
                     "--socket", str(self.socket), "--queue", str(self.queue_path),
                     "--node", "testnode", "-v", *extra]
        self.argv += ["--cleanup-cmd", cleanup_cmd] if cleanup_cmd else ["--no-cleanup"]
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Daemon:
        log = open(self.log_path, "ab")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=log,  # noqa: S603
                                stderr=subprocess.STDOUT)
        self.proc = proc
        log.close()
        wait_until(lambda: "listening on" in self.log() or proc.poll() is not None,
                   DAEMON_START_TIMEOUT, "qmeventd-py to listen")
        assert proc.poll() is None, f"qmeventd-py exited:\n{self.log()}"
        return self

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def wait_log(self, pattern: str, timeout: float = 90.0, count: int = 1) -> None:
        regex = re.compile(pattern)
        try:
            wait_until(lambda: len(regex.findall(self.log())) >= count, timeout,
                       f"log line /{pattern}/ x{count}")
        except TimeoutError as err:
            raise AssertionError(f"{err}\n--- daemon log ---\n{self.log()[-6000:]}") from None

    def entries(self) -> list[Entry]:
        return ExtendQueue(self.queue_path).list()

    def kill(self, sig: int = signal.SIGKILL) -> int:
        assert self.proc is not None
        self.proc.send_signal(sig)
        return self.proc.wait(DAEMON_STOP_TIMEOUT)

    def stop(self) -> int | None:
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        self.proc.terminate()
        try:
            return self.proc.wait(DAEMON_STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(DAEMON_STOP_TIMEOUT)
            raise AssertionError(f"qmeventd-py ignored SIGTERM:\n{self.log()}") from None


@pytest.fixture
def daemon_factory(run_dir: Path) -> Iterator[Callable[..., Daemon]]:
    started: list[Daemon] = []

    def start(**kwargs: Any) -> Daemon:
        daemon = Daemon(run_dir, name=f"qmeventd{len(started)}", **kwargs)
        started.append(daemon)
        return daemon.start()

    yield start
    for daemon in started:
        daemon.stop()
