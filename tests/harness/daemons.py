"""qmeventd-py and pvestord as real processes, for the node tier, the demo and bench.

A :class:`NodeBed` is one node's worth of Proxmox layout in a folder: the
qemu-server run folder (``<vmid>.pid``, ``<vmid>.qmp``), the extend queue, a
storage.cfg, and the qmeventd socket. :func:`daemons` starts both daemons
against it, and stops them with SIGTERM at the end, checking they exit 0
(a daemon that crashed or hung fails the test that used it).

A test waits for what a daemon does, never for its wording: a daemon is up
when it says ``READY=1`` on its ``NOTIFY_SOCKET``, as systemd hears it, and
a log record is known by its journal fields (:meth:`Daemon.wait_record`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pvestord.adapters.queue import Entry, ExtendQueue
from pvestord.adapters.vmconfig import config_path
from tests.harness.daemonlog import LogLine, records

VENV_BIN = Path(sys.executable).parent
#: Python start-up plus the first config read; generous because a loaded
#: 2-core machine running several emulated guests needed over 30 s.
START_TIMEOUT = 180.0
STOP_TIMEOUT = 60.0


@dataclass
class ThinStorageSpec:
    storeid: str
    vgname: str
    chunksize: str = "256M"
    chunk_percentage: float = 0.5
    initial_size: str = "256M"
    shared: bool = False

    def section(self) -> str:
        """A section of pvestord's storage plugin type, as an admin defines it
        (docs/proxmox.md): every test then runs against what users run."""
        return (f"pvestord: {self.storeid}\n\tvgname {self.vgname}\n\tcontent images\n"
                "\tsnapshot-as-volume-chain 1\n"
                f"\tshared {int(self.shared)}\n\tpvestord-chunksize {self.chunksize}\n"
                f"\tpvestord-chunk-percentage {self.chunk_percentage}\n"
                f"\tpvestord-initial-size {self.initial_size}\n")


@dataclass
class NodeBed:
    root: Path
    storages: list[ThinStorageSpec] = field(default_factory=list)
    node: str = "nodea"
    #: Where daemon and QEMU logs go (default: ``root/logs``); the node tier
    #: points it at the shared results folder so a failure can be read.
    logs_dir: Path | None = None
    #: Debug logging (every QMP message); the benchmarks turn it off, as it
    #: costs the daemons time and CPU they would not spend in production.
    verbose: bool = True

    def __post_init__(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.logs.mkdir(parents=True, exist_ok=True)
        self.write_storage_config()

    @property
    def run_dir(self) -> Path:
        return self.root / "run"

    @property
    def logs(self) -> Path:
        return self.logs_dir if self.logs_dir is not None else self.root / "logs"

    @property
    def queue_path(self) -> Path:
        return self.root / "extend-queue"

    @property
    def storage_cfg(self) -> Path:
        return self.root / "storage.cfg"

    @property
    def event_socket(self) -> Path:
        return self.root / "qmeventd.sock"

    @property
    def queue(self) -> ExtendQueue:
        return ExtendQueue(self.queue_path)

    def entries(self) -> list[Entry]:
        return self.queue.entries()

    @property
    def state_dir(self) -> Path:
        """The daemon's node-local state (its copy of the storages' sections)."""
        return self.root / "state"

    def write_storage_config(self) -> None:
        text = "dir: local\n\tpath /var/lib/vz\n\tcontent iso\n\n" + "\n".join(
            s.section() for s in self.storages)
        self.storage_cfg.write_text(text)
        # The bed adds and removes storages on purpose, between tests as an
        # admin would with `pvestord storage forget`: a storage it dropped is
        # not one that vanished.
        shutil.rmtree(self.state_dir, ignore_errors=True)

    def write_vm_config(self, vmid: int, volid: str, lock: str | None = None) -> None:
        """VM ``vmid``'s config as qemu-server keeps it on pmxcfs (``volid``
        its ``scsi0``), with ``lock`` in its main section as qemu-server
        writes it for the length of a snapshot, its deletion or a migration."""
        path = config_path(self.root / "nodes", self.node, vmid)
        path.parent.mkdir(parents=True, exist_ok=True)
        lines = ["boot: order=scsi0", f"scsi0: {volid},size=4G"]
        path.write_text("\n".join(([f"lock: {lock}"] if lock else []) + lines) + "\n")

    def pvestord_argv(self, *extra: str) -> list[str]:
        return [str(VENV_BIN / "pvestord"), "--queue", str(self.queue_path),
                *(["-v"] if self.verbose else []), "run",
                "--storage-config", str(self.storage_cfg), "--run-dir", str(self.run_dir),
                "--state-dir", str(self.state_dir),
                "--node", self.node, "--no-journal", *extra]

    def qmeventd_argv(self, *extra: str) -> list[str]:
        return [str(VENV_BIN / "qmeventd-py"), "--socket", str(self.event_socket),
                "--queue", str(self.queue_path), "--no-cleanup", "-f",
                *(["-v"] if self.verbose else []), "--node", self.node, *extra]


class Daemon:
    """One daemon process with its log file; stopped with SIGTERM.

    It runs with ``NOTIFY_SOCKET`` set, as under systemd: what it notifies
    (``READY=1``, ``STATUS=...``, ``STOPPING=1``) is collected in
    :attr:`notified`. A thread reads the socket all the time, because a
    daemon's ``sd_notify`` blocks once a datagram socket's queue is full.
    """

    def __init__(self, name: str, argv: Sequence[str], log_path: Path,
                 env: Mapping[str, str] | None = None) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self._log = log_path.open("ab")
        # A short path of its own: a socket's path is limited to 107 bytes.
        self._notify_dir = Path(tempfile.mkdtemp(prefix="notify-"))
        self._notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._notify.bind(str(self._notify_dir / "sock"))
        self._notify.settimeout(0.1)
        #: Every line the daemon sent to its NOTIFY_SOCKET, in order.
        self.notified: list[str] = []
        self._listening = True
        self._reader = threading.Thread(target=self._read_notifications, daemon=True,
                                        name=f"{name}-notify")
        self._reader.start()
        self.proc = subprocess.Popen(  # noqa: S603 - argument list
            self.argv, stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {}),
                 "NOTIFY_SOCKET": str(self._notify_dir / "sock")})

    def _read_notifications(self) -> None:
        while self._listening:
            try:
                datagram = self._notify.recv(4096)
            except TimeoutError:
                continue
            except OSError:
                return
            self.notified.extend(datagram.decode(errors="replace").splitlines())

    def wait_ready(self, timeout: float | None = None) -> None:
        """Until the daemon notifies ``READY=1`` (systemd's ``Type=notify``)."""
        self._wait("READY=1", lambda: "READY=1" in self.notified, timeout)

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def records(self, level: str | None = None, **fields: str) -> list[LogLine]:
        """The daemon's log records at ``level`` with these journal fields."""
        return records(self.log_text(), level, **fields)

    def wait_record(self, what: str, timeout: float | None = None, level: str | None = None,
                    count: int = 1, **fields: str) -> LogLine:
        """The ``count``-th log record with these journal fields, once there is one."""
        found: list[LogLine] = []

        def logged() -> bool:
            found[:] = self.records(level, **fields)
            return len(found) >= count

        self._wait(f"{what} ({fields})", logged, timeout)
        return found[count - 1]

    def _wait(self, what: str, condition: Callable[[], bool], timeout: float | None) -> None:
        """Poll ``condition`` while the daemon runs, for ``timeout`` (default
        :data:`START_TIMEOUT`); its log in the error if it exits or times out."""
        budget = START_TIMEOUT if timeout is None else timeout
        deadline = time.monotonic() + budget
        while not condition():
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited {self.proc.returncode} before "
                                   f"{what}:\n{self.log_text()[-4000:]}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.name}: no {what} within {budget:g} s:\n"
                                   f"{self.log_text()[-4000:]}")
            time.sleep(0.05)

    def kill(self) -> None:
        """SIGKILL, as a crash would."""
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=STOP_TIMEOUT)
        self._close_notify()

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=STOP_TIMEOUT)
                raise RuntimeError(f"{self.name} did not stop within {STOP_TIMEOUT} s on "
                                   f"SIGTERM:\n{self.log_text()[-4000:]}") from None
        self._close_notify()
        self._log.close()
        return self.proc.returncode

    def _close_notify(self) -> None:
        """Stop listening once the process is gone: its last word is read."""
        if not self._listening:
            return
        self._listening = False
        self._reader.join()
        self._notify.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            while True:
                self.notified.extend(
                    self._notify.recv(4096).decode(errors="replace").splitlines())
        self._notify.close()
        shutil.rmtree(self._notify_dir, ignore_errors=True)


def ready(daemon: Daemon, timeout: float | None = None) -> Daemon:
    """``daemon`` once it is ready (it listens, or has read its config);
    stopped if it never is."""
    try:
        daemon.wait_ready(timeout)
    except BaseException:
        daemon.stop()
        raise
    return daemon


def start_daemon(name: str, argv: Sequence[str], log_path: Path,
                 timeout: float | None = None) -> Daemon:
    """``argv`` started and ready."""
    return ready(Daemon(name, argv, log_path), timeout)


def spawn_qmeventd(bed: NodeBed, *extra: str) -> Daemon:
    """qmeventd-py on ``bed``, started but not yet ready."""
    return Daemon("qmeventd-py", bed.qmeventd_argv(*extra), bed.logs / "qmeventd.log")


def spawn_pvestord(bed: NodeBed, *extra: str) -> Daemon:
    """pvestord on ``bed``, started but not yet ready."""
    return Daemon("pvestord", bed.pvestord_argv(*extra), bed.logs / "pvestord.log")


def start_qmeventd(bed: NodeBed, *extra: str, timeout: float | None = None) -> Daemon:
    return ready(spawn_qmeventd(bed, *extra), timeout)


def start_pvestord(bed: NodeBed, *extra: str, timeout: float | None = None) -> Daemon:
    return ready(spawn_pvestord(bed, *extra), timeout)


@contextlib.contextmanager
def daemons(bed: NodeBed, *, pvestord_args: Sequence[str] = (),
            start_timeout: float | None = None) -> Iterator[tuple[Daemon, Daemon]]:
    """Both daemons on ``bed`` (qmeventd-py, pvestord); on exit, each one that
    started must stop cleanly (exit 0), or the test fails with its log.

    ``start_timeout`` overrides :data:`START_TIMEOUT` for each daemon's start.
    """
    # Both start at once, as systemd starts the two units: neither waits on
    # the other, and each one's start-up (mostly Python's imports, seconds
    # under TCG) takes a core of its own.
    started = [spawn_qmeventd(bed)]
    try:
        started.append(spawn_pvestord(bed, *pvestord_args))
        for daemon in started:
            daemon.wait_ready(start_timeout)
        yield started[0], started[1]
    finally:
        failures = [f"{d.name} exited {status}:\n{d.log_text()[-4000:]}"
                    for d in reversed(started) if (status := d.stop()) != 0]
    if failures:
        raise RuntimeError("\n".join(failures))
