"""A real QEMU process for tests, as a context manager.

In the spirit of QEMU's own ``python/qemu/machine/machine.py``: the process is
always shut down on exit (QMP ``quit``, wait with a timeout, then SIGKILL, with
a warning when QEMU died from a signal the test did not send), and a launch
failure carries the exit code, the full command line and the captured output.

The VM runs with Proxmox's runtime layout: ``<run_dir>/<vmid>.pid`` and a QMP
server socket ``<run_dir>/<vmid>.qmp``; it can also connect as a client to a
qmeventd socket exactly as qemu-server starts it, and it starts, as
qemu-server starts it, with ``-daemonize``: the QEMU then running is no child
of the test, so it is watched through a pidfd. ``daemonize=False`` keeps QEMU
a child, for the harness's own tests of a death by signal.

The test's writes and reads go through the ``qemu-io`` tool over an NBD
export of the block node, one per command (:meth:`QemuVM.qemu_io`), rather
than HMP ``qemu-io``: that prints its results on QEMU's stdout (/dev/null once
daemonized) and runs in QEMU's main loop, holding every QMP command, pvestord's
too, until the write is done, which no guest's write does.

Everything here is synchronous (plain sockets, a reader thread for QEMU's
start-up output) so that sync and async tests can both use it; from an async
test that must keep its event loop serving, wrap calls in
``asyncio.to_thread``.
"""

from __future__ import annotations

import abc
import contextlib
import functools
import hashlib
import itertools
import json
import logging
import os
import re
import select
import signal
import socket
import stat
import subprocess
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

log = logging.getLogger(__name__)

#: Environment override for the QEMU binary (same convention as pvestord.adapters.command).
QEMU_ENV = "PVESTORD_QEMU_SYSTEM_X86_64"

#: How long QEMU may take to create its QMP socket (TCG inside the node guest is slow).
LAUNCH_TIMEOUT = 30.0
#: Budget for one QMP command, and for one qemu-io command of a few MiB under TCG.
QMP_TIMEOUT = 30.0
#: Bytes per second a read_verify is sure to manage, for its default timeout.
VERIFY_RATE = 8 * 1024 * 1024
#: How long QEMU may take to exit after ``quit`` before it is killed.
SHUTDOWN_TIMEOUT = 10.0

_counter = itertools.count(1)

#: qemu-io commands that only read: they get a read-only export, which a
#: guest device on the node allows (it shares reads, not writes).
READ_ONLY_QEMU_IO_COMMANDS = frozenset({"read", "readv", "aio_read", "map", "alloc",
                                        "info", "length"})


class QemuError(Exception):
    """Root of the harness's errors."""


class QemuLaunchError(QemuError):
    """QEMU did not start: carries everything needed to reproduce it."""

    def __init__(self, reason: str, argv: Sequence[str], returncode: int | None,
                 output: Sequence[str]) -> None:
        self.reason = reason
        self.argv = list(argv)
        self.returncode = returncode
        self.output = list(output)
        super().__init__(
            f"QEMU launch failed: {reason} (exit code {returncode})\n"
            f"command: {' '.join(self.argv)}\n"
            "output:\n" + "\n".join(self.output))


class QmpCommandError(QemuError):
    """A QMP command returned an error."""

    def __init__(self, command: str, arguments: Mapping[str, Any], error: Mapping[str, Any]):
        self.command = command
        self.arguments = dict(arguments)
        self.error_class = str(error.get("class", "?"))
        self.desc = str(error.get("desc", "?"))
        super().__init__(f"QMP {command} {self.arguments}: {self.error_class}: {self.desc}")


class QemuIoError(QemuError):
    """A qemu-io command failed; carries its output."""

    def __init__(self, result: QemuIoResult) -> None:
        self.result = result
        super().__init__(
            f"qemu-io {result.node} {result.command!r} failed: {result.error}\n"
            "output:\n" + "\n".join(result.lines))


@dataclass(frozen=True)
class Disk:
    """A qcow2 (or other format) node on top of a file node.

    The file node's driver follows the path: ``host_device`` for a block device
    (an LV, a loop device), ``file`` for a regular file.
    """

    path: str | Path
    block_node: str
    file_block_node: str
    fmt: str = "qcow2"
    file_options: Mapping[str, str] = field(default_factory=dict)
    format_options: Mapping[str, str] = field(default_factory=dict)

    def file_driver(self) -> str:
        return "host_device" if stat.S_ISBLK(os.stat(self.path).st_mode) else "file"

    def args(self) -> list[str]:
        path = str(self.path).replace(",", ",,")
        file_opts = {"driver": self.file_driver(), "filename": path,
                     "node-name": self.file_block_node, **self.file_options}
        fmt_opts = {"driver": self.fmt, "file": self.file_block_node,
                    "node-name": self.block_node, **self.format_options}
        return ["-blockdev", _opts(file_opts), "-blockdev", _opts(fmt_opts)]


@dataclass(frozen=True)
class Pve9Disk(Disk):
    """A disk as Proxmox VE 9 puts it on QEMU's command line for qcow2 on LVM
    (docs/proxmox.md, "QEMU as qemu-server starts it"; qemu-server's ``Blockdev.pm``): a
    throttle node ``drive-<id>`` in its own throttle group, over the qcow2
    node ``f<hash>``, over the ``host_device`` node ``e<hash>``, one nested
    ``-blockdev`` JSON, with ``cache.direct``, ``aio=native``,
    ``detect-zeroes=on`` and ``discard=ignore`` on every node, and no image
    locks (pve-qemu's patch "block/file: change locking default to off", so
    Proxmox's own ``qemu-img info`` of a running VM's chain works; stock QEMU
    needs ``locking=off`` said on the file node). The hash is
    qemu-server's: the first 30 hex digits of the SHA-256 of
    ``drive=<id>,volid=<storeid>:<volname>``. ``discard-no-unref`` (QEMU 8.1
    and later) is set when the QEMU here knows it.

    :attr:`block_node` is the qcow2 node and :attr:`file_block_node` the
    file node, as for :class:`Disk`; :attr:`top_node` is what a device uses.
    """

    drive_id: str = "scsi0"

    @classmethod
    def for_volume(cls, path: str | Path, volid: str, drive_id: str = "scsi0", *,
                   snapshot: str | None = None) -> Pve9Disk:
        """The disk of ``volid``, or the nodes qemu-server gives its ``snapshot``."""
        digest = pve9_node_hash(drive_id, volid, snapshot)
        return cls(path, f"f{digest}", f"e{digest}", drive_id=drive_id)

    @property
    def top_node(self) -> str:
        return f"drive-{self.drive_id}"

    @property
    def throttle_group(self) -> str:
        return f"throttle-{self.top_node}"

    def format_blockdev(self) -> dict[str, Any]:
        """The qcow2 node over its file node, as ``-blockdev`` and ``blockdev-add`` take it."""
        common: dict[str, Any] = {"detect-zeroes": "on", "discard": "ignore"}
        cache = {"direct": True, "no-flush": False}
        file_node = {"aio": "native", "cache": cache, **common, "driver": self.file_driver(),
                     "filename": str(self.path), "locking": "off",
                     "node-name": self.file_block_node, "read-only": False}
        fmt_node: dict[str, Any] = {"cache": cache, **common, "driver": "qcow2",
                                    "file": file_node, "node-name": self.block_node,
                                    "read-only": False}
        if qemu_version() >= (8, 1):
            fmt_node["discard-no-unref"] = True
        return fmt_node

    def throttle_blockdev(self, child: str | dict[str, Any]) -> dict[str, Any]:
        """The top throttle node over ``child`` (a node or its name)."""
        return {"detect-zeroes": "on", "discard": "ignore", "driver": "throttle",
                "file": child, "node-name": self.top_node, "read-only": False,
                "throttle-group": self.throttle_group}

    def args(self) -> list[str]:
        group = {"id": self.throttle_group, "limits": {}, "qom-type": "throttle-group"}
        return ["-object", json.dumps(group),
                "-blockdev", json.dumps(self.throttle_blockdev(self.format_blockdev()))]


def pve9_disk(vm: QemuVM, index: int = 0) -> Pve9Disk:
    """The VM's ``index``-th disk, which has Proxmox VE 9's block graph."""
    disk = vm.disks[index]
    assert isinstance(disk, Pve9Disk), f"disk {index} of VM {vm.vmid} is {disk!r}"
    return disk


def pve9_node_hash(drive_id: str, volid: str, snapshot: str | None = None) -> str:
    """qemu-server's node-name hash (Blockdev.pm ``get_node_name``)."""
    snap = "" if snapshot is None else f"snap={snapshot},"
    return hashlib.sha256(f"drive={drive_id},{snap}volid={volid}".encode()).hexdigest()[:30]


@functools.cache
def qemu_version() -> tuple[int, int]:
    """The (major, minor) version of the QEMU the harness starts."""
    out = subprocess.run([  # noqa: S603 - argument list, no shell
                         os.environ.get(QEMU_ENV, "qemu-system-x86_64"), "--version"],
                         capture_output=True, text=True, timeout=30, check=True).stdout
    found = re.search(r"version (\d+)\.(\d+)", out)
    if found is None:
        raise QemuError(f"cannot read QEMU's version from {out!r}")
    return int(found[1]), int(found[2])


def _opts(values: Mapping[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in values.items())


@dataclass(frozen=True)
class QemuIoResult:
    """The output of one ``qemu-io`` command, parsed."""

    node: str
    command: str
    lines: tuple[str, ...]
    ok: bool
    #: The errno text ("No space left on device"), "pattern mismatch", or the
    #: first output line when the output is not understood; None when ok.
    error: str | None


_DONE = re.compile(r"^(wrote|read) \d+/\d+ bytes at offset \d+")
_FAILED = re.compile(r"^\w+ failed: (.*)$")
_MISMATCH = re.compile(r"^Pattern verification failed")


def parse_qemu_io(node: str, command: str, lines: Sequence[str]) -> QemuIoResult:
    """Turn qemu-io's human output into a result."""
    error: str | None = None
    done = False
    for line in lines:
        if m := _FAILED.match(line):
            error = error or m.group(1)
        elif _MISMATCH.match(line):
            error = error or "pattern mismatch"
        elif _DONE.match(line):
            done = True
    if error is None and not done:
        error = lines[0] if lines else "no output"
    return QemuIoResult(node, command, tuple(lines), error is None, error)


#: Events tolerated before a QMP greeting (see :meth:`QmpConnection._read_greeting`).
EVENTS_BEFORE_GREETING = 64


class QmpConnection:
    """A minimal synchronous QMP client on a unix socket (test code only)."""

    def __init__(self, path: Path, timeout: float) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        self.sock.connect(str(path))
        self._buf = b""
        self.events: list[dict[str, Any]] = []
        self.greeting = self._read_greeting()
        #: When QEMU greeted: it serves this client from then on.
        self.greeted_at = time.monotonic()
        self.lock = threading.Lock()
        self.execute("qmp_capabilities", {}, timeout)

    def _read_greeting(self) -> dict[str, Any]:
        """The greeting, keeping the events QEMU may send before it.

        QEMU's QMP monitor goes back to capabilities negotiation only when
        it handles the new connection's OPENED event (``monitor_qmp_event``
        in QEMU's monitor/qmp.c); closing the previous connection leaves it in
        command mode. The monitor runs in an I/O thread while events come
        from the main loop, so an event emitted as a client connects (a
        RESUME just after another client's ``cont``) can reach that client
        before its greeting. The fleet benchmark failed on exactly that.
        """
        for _ in range(EVENTS_BEFORE_GREETING):
            msg = self._read()
            if "QMP" in msg:
                return msg
            if "event" not in msg:
                break
            self.events.append(msg)
        raise QemuError(f"unexpected QMP greeting: {msg}")

    def _read(self) -> dict[str, Any]:
        # Our own buffer: a socket file object is unusable after one timeout.
        while b"\n" not in self._buf:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise EOFError("QMP socket closed")
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        msg: dict[str, Any] = json.loads(line)
        return msg

    def execute(self, command: str, arguments: Mapping[str, Any], timeout: float) -> Any:
        with self.lock:
            self.sock.settimeout(timeout)
            msg: dict[str, Any] = {"execute": command}
            if arguments:
                msg["arguments"] = dict(arguments)
            log.debug("--> %s", msg)
            self.sock.sendall(json.dumps(msg).encode() + b"\n")
            while True:
                reply = self._read()
                log.debug("<-- %s", reply)
                if "event" in reply:
                    self.events.append(reply)
                elif "error" in reply:
                    raise QmpCommandError(command, arguments, reply["error"])
                elif "return" in reply:
                    return reply["return"]

    def wait_event(self, match: Callable[[dict[str, Any]], bool],
                   timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        with self.lock:
            while True:
                for i, event in enumerate(self.events):
                    if match(event):
                        return self.events.pop(i)
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no matching QMP event within {timeout:g} s;"
                                       f" seen: {self.events}")
                self.sock.settimeout(left)
                try:
                    msg = self._read()
                except TimeoutError:
                    continue
                log.debug("<-- %s", msg)
                if "event" in msg:
                    self.events.append(msg)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()


class PatternIo(abc.ABC):
    """Patterned writes and checked reads on top of :meth:`qemu_io`."""

    @abc.abstractmethod
    def qemu_io(self, node: str, command: str, *, timeout: float = QMP_TIMEOUT) -> QemuIoResult:
        """Run one ``qemu-io`` command on ``node`` and parse its output."""

    def write_pattern(self, node: str, offset: int, length: int, pattern: int = 0xAB, *,
                      check: bool = True, timeout: float = QMP_TIMEOUT) -> QemuIoResult:
        """Write ``length`` bytes of ``pattern`` at ``offset``.

        :raise QemuIoError: the write failed and ``check`` is set.
        """
        result = self.qemu_io(node, f"write -P {pattern:#x} {offset} {length}", timeout=timeout)
        if check and not result.ok:
            raise QemuIoError(result)
        return result

    def read_verify(self, node: str, offset: int, length: int, pattern: int = 0xAB, *,
                    timeout: float | None = None) -> bool:
        """True when the range reads back as ``pattern``, False on a mismatch.

        The default timeout grows with ``length``: qemu-io compares every byte
        after the read, and under nested TCG a 768 MiB compare was seen to
        take most of 30 s.

        :raise QemuIoError: the read itself failed.
        """
        if timeout is None:
            timeout = QMP_TIMEOUT + length / VERIFY_RATE
        result = self.qemu_io(node, f"read -P {pattern:#x} {offset} {length}", timeout=timeout)
        if result.ok:
            return True
        if result.error == "pattern mismatch":
            return False
        raise QemuIoError(result)


class QemuVM(PatternIo):
    """A QEMU process with Proxmox's pidfile/QMP layout; use as a context manager.

    :param vmid: names ``<run_dir>/<vmid>.pid`` and ``<run_dir>/<vmid>.qmp``.
    :param run_dir: a writable folder (keep it short: unix socket paths are
        limited to 107 bytes).
    :param disks: block nodes to create.
    :param machine: ``none`` for block-only tests, ``pc`` for guest devices.
    :param event_socket: a qmeventd socket QEMU connects to as a client.
    :param extra_args: appended to the command line (``-device ...``).
    :param daemonize: start as qemu-server does (``-daemonize``); False keeps
        QEMU a child of the test, whose exit status is then known.
    """

    def __init__(self, vmid: int, run_dir: str | Path, *, disks: Sequence[Disk] = (),
                 machine: str = "none", event_socket: str | Path | None = None,
                 reconnect: int = 1, extra_args: Sequence[str] = (),
                 log_path: str | Path | None = None, daemonize: bool = True,
                 launch_timeout: float = LAUNCH_TIMEOUT,
                 shutdown_timeout: float = SHUTDOWN_TIMEOUT) -> None:
        self.vmid = vmid
        # Absolute: a daemonized QEMU changes its directory to /.
        self.run_dir = Path(run_dir).absolute()
        self.pid_path = self.run_dir / f"{vmid}.pid"
        self.qmp_path = self.run_dir / f"{vmid}.qmp"
        #: The harness's own monitor. ``<vmid>.qmp`` serves one client at a
        #: time and belongs to the system under test (pvestord connects to it
        #: per batch, as qemu-server does); the harness never holds it.
        self.harness_qmp_path = self.run_dir / f"{vmid}.harness.qmp"
        self.log_path = Path(log_path) if log_path else self.run_dir / f"{vmid}.log"
        self.disks = list(disks)
        self.machine = machine
        self.event_socket = event_socket
        self.reconnect = reconnect
        self.extra_args = list(extra_args)
        self.daemonize = daemonize
        self.launch_timeout = launch_timeout
        self.shutdown_timeout = shutdown_timeout
        self.output: list[str] = []
        self._proc: subprocess.Popen[bytes] | None = None
        self._reader: threading.Thread | None = None
        self._qmp: QmpConnection | None = None
        self._signals_sent: set[int] = set()
        #: Where the VM's NBD server listens once a qemu-io command started it.
        self.nbd_path = self.run_dir / f"{vmid}.nbd"
        self._nbd_lock = threading.Lock()
        self._nbd_serving = False
        #: A daemonized QEMU's pid (from its pidfile) and a pidfd on it.
        self._daemon_pid: int | None = None
        self._pidfd: int | None = None

    # -- process ---------------------------------------------------------------

    @property
    def argv(self) -> list[str]:
        argv = [os.environ.get(QEMU_ENV, "qemu-system-x86_64"),
                "-machine", self.machine, "-nodefaults",
                # qemu-server's -daemonize excludes -nographic; -display none stays.
                *(["-daemonize"] if self.daemonize else ["-nographic"]), "-display", "none",
                "-accel", "tcg",
                "-pidfile", str(self.pid_path),
                "-qmp", f"unix:{self.qmp_path},server=on,wait=off",
                "-qmp", f"unix:{self.harness_qmp_path},server=on,wait=off"]
        if self.event_socket is not None:
            argv += ["-chardev", f"socket,id=qmp-event,path={self.event_socket},"
                                 f"reconnect={self.reconnect}",
                     "-mon", "chardev=qmp-event,mode=control"]
        for disk in self.disks:
            argv += disk.args()
        return argv + self.extra_args

    @property
    def pid(self) -> int:
        if self._daemon_pid is not None:
            return self._daemon_pid
        if self._proc is None:
            raise QemuError("QEMU is not running")
        return self._proc.pid

    @property
    def returncode(self) -> int | None:
        """QEMU's exit code; always None for a daemonized QEMU, whose exit
        status only init sees."""
        return None if self._proc is None or self.daemonize else self._proc.poll()

    def is_running(self) -> bool:
        if self._pidfd is not None:
            return not _exited(self._pidfd, 0)
        return self._proc is not None and not self.daemonize and self._proc.poll() is None

    def launch(self) -> QemuVM:
        """Start QEMU and connect to its QMP socket.

        :raise QemuLaunchError: QEMU exited or did not open its QMP socket in time.
        """
        if self._proc is not None:
            raise QemuError("already launched")
        for path in (self.qmp_path, self.harness_qmp_path):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        argv = self.argv
        log.info("launching: %s", " ".join(argv))
        self._log_file = open(self.log_path, "a", buffering=1)  # noqa: SIM115
        self._log_file.write(f"# {' '.join(argv)}\n")
        try:
            self._proc = subprocess.Popen(  # noqa: S603 - argument list, no shell
                argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT, bufsize=0)
        except OSError as err:
            raise QemuLaunchError(str(err), argv, None, []) from err
        self._reader = threading.Thread(target=self._read_output, daemon=True,
                                        name=f"qemu-{self.vmid}-output")
        self._reader.start()
        deadline = time.monotonic() + self.launch_timeout
        if self.daemonize:
            self._await_daemon(argv)
        last_err: Exception | None = None
        while True:
            if not self.is_running():
                self._reader.join(5)
                raise QemuLaunchError("QEMU exited during start-up", argv,
                                      self.returncode, self.output)
            if time.monotonic() > deadline:
                self._kill_quietly()
                raise QemuLaunchError(
                    f"no QMP socket after {self.launch_timeout:g} s ({last_err})", argv,
                    self._proc.returncode, self.output)
            if self.harness_qmp_path.exists() and self.qmp_path.exists():
                try:
                    self._qmp = QmpConnection(self.harness_qmp_path, QMP_TIMEOUT)
                    return self
                except (OSError, EOFError, ValueError) as err:
                    last_err = err
            time.sleep(0.02)

    def _await_daemon(self, argv: Sequence[str]) -> None:
        """Wait for the daemonizing parent: it exits 0 once its child has
        written the pidfile and opened its monitors, or with the error."""
        assert self._proc is not None
        try:
            code = self._proc.wait(self.launch_timeout)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait(self.shutdown_timeout)
            raise QemuLaunchError(f"not daemonized after {self.launch_timeout:g} s", argv,
                                  None, self.output) from None
        if code != 0:
            if self._reader is not None:
                self._reader.join(5)
            raise QemuLaunchError("QEMU exited during start-up", argv, code, self.output)
        self._daemon_pid = int(self.pid_path.read_text())
        self._pidfd = os.pidfd_open(self._daemon_pid)

    def _read_output(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        for raw in self._proc.stdout:
            line = raw.decode(errors="replace").rstrip("\r\n")
            self._log_file.write(line + "\n")
            self.output.append(line)

    def send_signal(self, sig: int) -> None:
        """Signal QEMU; the shutdown check then knows the test meant it."""
        self._signals_sent.add(sig)
        if self._pidfd is not None:
            signal.pidfd_send_signal(self._pidfd, sig)
        elif self._proc is not None:
            self._proc.send_signal(sig)

    def wait(self, timeout: float) -> int | None:
        """Wait for QEMU to exit on its own; returns its exit code (None for a
        daemonized QEMU: see :attr:`returncode`).

        :raise subprocess.TimeoutExpired: QEMU still runs after ``timeout``.
        """
        if self._pidfd is not None:
            if not _exited(self._pidfd, timeout):
                raise subprocess.TimeoutExpired(f"QEMU {self.vmid}", timeout)
            return None
        if self._proc is None:
            raise QemuError("QEMU was never launched")
        return self._proc.wait(timeout)

    def _kill_quietly(self) -> None:
        if self.is_running():
            self.send_signal(signal.SIGKILL)
            self.wait(self.shutdown_timeout)

    def shutdown(self) -> None:
        """QMP ``quit``, wait, then kill; idempotent. Warns about unexpected deaths."""
        proc = self._proc
        if proc is None:
            return
        if self.is_running() and self._qmp is not None:
            with contextlib.suppress(OSError, EOFError, QemuError, ValueError):
                self._qmp.execute("quit", {}, self.shutdown_timeout)
        try:
            self.wait(self.shutdown_timeout)
        except subprocess.TimeoutExpired:
            log.warning("QEMU %s did not exit %g s after quit; killing it",
                        self.vmid, self.shutdown_timeout)
            self._kill_quietly()
        if self._qmp is not None:
            self._qmp.close()
            self._qmp = None
        if self._reader is not None:
            self._reader.join(5)
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None
        self._log_file.close()
        for path in (self.qmp_path, self.harness_qmp_path, self.nbd_path):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        rc = None if self.daemonize else proc.returncode
        if rc is not None and rc < 0 and -rc not in self._signals_sent:
            warnings.warn(f"QEMU {self.vmid} died from signal {-rc} the test did not send;"
                          f" output:\n" + "\n".join(self.output[-50:]), stacklevel=2)

    def __enter__(self) -> QemuVM:
        return self.launch() if self._proc is None else self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.shutdown()
        if exc is not None and self.output:
            log.error("QEMU %s output:\n%s", self.vmid, "\n".join(self.output[-100:]))

    # -- monitor ---------------------------------------------------------------

    def _client(self) -> QmpConnection:
        if self._qmp is None:
            raise QemuError("QEMU is not running")
        return self._qmp

    def qmp(self, command: str, arguments: Mapping[str, Any] | None = None, *,
            timeout: float = QMP_TIMEOUT, **kwargs: Any) -> Any:
        """Run a QMP command; keyword names get ``_`` turned into ``-``.

        :raise QmpCommandError: QEMU answered with an error.
        """
        args = dict(arguments or {})
        args.update({k.replace("_", "-"): v for k, v in kwargs.items()})
        return self._client().execute(command, args, timeout)

    def hmp(self, command_line: str, *, timeout: float = QMP_TIMEOUT) -> str:
        """Run an HMP command through ``human-monitor-command``; returns its text."""
        out = self.qmp("human-monitor-command", {"command-line": command_line},
                       timeout=timeout)
        return str(out)

    def events(self) -> list[dict[str, Any]]:
        """The QMP events seen so far on our QMP connection (and not yet waited for)."""
        return list(self._client().events)

    def wait_event(self, name: str, *, timeout: float = QMP_TIMEOUT,
                   match: Callable[[dict[str, Any]], bool] | None = None) -> dict[str, Any]:
        """Wait for (and consume) an event called ``name``.

        :raise TimeoutError: none came in time.
        """
        return self._client().wait_event(
            lambda e: e.get("event") == name and (match is None or match(e)), timeout)

    def set_write_threshold(self, block_node: str, threshold: int) -> None:
        self.qmp("block-set-write-threshold", node_name=block_node, write_threshold=threshold)

    def named_node(self, block_node: str) -> dict[str, Any]:
        """The ``query-named-block-nodes`` entry of ``block_node``."""
        for node in self.qmp("query-named-block-nodes", flat=True):
            if node.get("node-name") == block_node:
                return dict(node)
        raise QemuError(f"no block node {block_node!r}")

    def format_node_on(self, path: str) -> str:
        """The qcow2 node open on ``path``: also one QEMU opened by itself
        from an image's backing file, under a name of its own choosing."""
        for node in self.qmp("query-named-block-nodes", flat=True):
            if node.get("drv") == "qcow2" and node.get("file") == path:
                return str(node["node-name"])
        raise QemuError(f"no qcow2 node on {path}")

    # -- block jobs ------------------------------------------------------------

    def wait_job(self, job: str, *, timeout: float) -> str:
        """Wait until ``job`` is ``ready`` (a mirror or an active commit waiting
        to be completed) or ``concluded`` (done, or failed); return which."""
        event = self.wait_event("JOB_STATUS_CHANGE", timeout=timeout, match=lambda e: (
            e["data"]["id"] == job and e["data"]["status"] in ("ready", "concluded")))
        return str(event["data"]["status"])

    def job_completed_cleanly(self, *, timeout: float) -> bool:
        """Wait for ``BLOCK_JOB_COMPLETED``: False when it carries an error or a
        ``BLOCK_JOB_ERROR`` came first (a job on ``on-error=report`` fails at once)."""
        completed = self.wait_event("BLOCK_JOB_COMPLETED", timeout=timeout)
        return "error" not in completed["data"] and not any(
            e["event"] == "BLOCK_JOB_ERROR" for e in self.events())

    def run_job_to_completion(self, job: str, *, timeout: float) -> bool:
        """Complete a job that becomes ``ready`` (as qemu-server's ``complete``
        mode does) and say whether it ended cleanly."""
        if self.wait_job(job, timeout=timeout) != "ready":
            return False
        self.qmp("job-complete", id=job)
        return self.job_completed_cleanly(timeout=timeout)

    # -- qemu-io ---------------------------------------------------------------

    def qemu_io(self, node: str, command: str, *, timeout: float = QMP_TIMEOUT) -> QemuIoResult:
        """Run one command of the ``qemu-io`` tool on ``node`` of this VM.

        The tool reaches the node through an NBD export made for this one
        command and removed after it (:meth:`_exported`), so every write goes
        through QEMU's block layer as a guest's would (thresholds, qcow2
        allocation, ENOSPC at the LV's end) while QEMU's main loop stays free
        for pvestord's QMP session, and the result is read on the tool's own
        output, which a daemonized QEMU would otherwise send to /dev/null.
        Writes get a writable export, reads a read-only one, which a guest
        device on the node (sharing reads, not writes) allows.

        :raise QemuError: QEMU refused the export (an unknown node...).
        """
        writable = command.split(maxsplit=1)[0] not in READ_ONLY_QEMU_IO_COMMANDS
        with self._exported(node, writable=writable) as image_opts:
            return run_qemu_io(node, [*([] if writable else ["-r"]), "--image-opts", image_opts],
                               command, timeout)

    @contextlib.contextmanager
    def _exported(self, node: str, *, writable: bool) -> Iterator[str]:
        """Export ``node`` over NBD for one client; yields its ``--image-opts``.

        The export lives only as long as the command: a writable export is a
        user of the node that keeps migration from inactivating it and a
        block job from dropping it, which a guest's writes never do.
        """
        with self._nbd_lock:
            if not self._nbd_serving:
                self.qmp("nbd-server-start",
                         addr={"type": "unix", "data": {"path": str(self.nbd_path)}})
                self._nbd_serving = True
        export = f"qemu-io-{next(_counter)}"
        self.qmp("block-export-add", type="nbd", id=export, node_name=node, name=export,
                 writable=writable)
        try:
            yield (f"driver=nbd,server.type=unix,server.path={self.nbd_path},"
                   f"export={export}")
        finally:
            # "hard": the tool has exited, but QEMU may not have seen its
            # connection close yet, and "safe" would refuse the removal then.
            # A QEMU the test killed meanwhile took its exports with it.
            if self.is_running():
                self.qmp("block-export-del", id=export, mode="hard")
                self.wait_event("BLOCK_EXPORT_DELETED",
                                match=lambda e: e["data"]["id"] == export)

    @contextlib.contextmanager
    def io_session(self) -> Iterator[IoSession]:
        """``qemu-io`` commands through one tool process and one export per
        node for the whole block, where a writer's loop would otherwise pay a
        process and an export per command (about 0.4 s in the node guest).
        Nothing may need the nodes free meanwhile: no migration, no
        ``blockdev-del`` of a node written, no job replacing it.
        """
        with contextlib.ExitStack() as stack:
            yield IoSession(self, stack)


class IoSession(PatternIo):
    """One interactive ``qemu-io`` process per node, each on its own export,
    opened at a node's first command and closed with the session.

    The tool prints its prompt, flushed, before it reads each command, so a
    command's output (stderr merged in) is exactly what comes before the
    next prompt.
    """

    PROMPT = b"qemu-io> "

    def __init__(self, vm: QemuVM, stack: contextlib.ExitStack) -> None:
        self._vm = vm
        self._stack = stack
        self._tools: dict[str, subprocess.Popen[bytes]] = {}

    def qemu_io(self, node: str, command: str, *, timeout: float = QMP_TIMEOUT) -> QemuIoResult:
        """Run ``command`` on ``node``; a tool that died gives a failed result."""
        tool = self._tools.get(node) or self._open(node, timeout)
        assert tool.stdin is not None
        try:
            tool.stdin.write(command.encode() + b"\n")
            output = self._until_prompt(tool, timeout)
        except (BrokenPipeError, EOFError) as err:
            return QemuIoResult(node, command, (), False, f"qemu-io ended: {err}")
        return parse_qemu_io(node, command, output.decode(errors="replace").splitlines())

    def _open(self, node: str, timeout: float) -> subprocess.Popen[bytes]:
        from pvestord.adapters.command import binary

        image_opts = self._stack.enter_context(self._vm._exported(node, writable=True))
        tool = subprocess.Popen(  # noqa: S603 - argument list, no shell
            [binary("qemu-io"), "--image-opts", image_opts], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, bufsize=0)
        # Closed before the export goes (the stack unwinds in reverse).
        self._stack.callback(self._close, tool)
        self._tools[node] = tool
        try:
            opened = self._until_prompt(tool, timeout)
        except EOFError as err:
            raise QemuError(f"qemu-io could not open {node}'s export: {err}") from None
        if opened.strip():
            raise QemuError(f"qemu-io on {node}'s export: {opened.decode(errors='replace')}")
        return tool

    def _until_prompt(self, tool: subprocess.Popen[bytes], timeout: float) -> bytes:
        assert tool.stdout is not None
        deadline = time.monotonic() + timeout
        poller = select.poll()
        poller.register(tool.stdout, select.POLLIN)
        data = b""
        while not data.endswith(self.PROMPT):
            left = deadline - time.monotonic()
            if left <= 0:
                raise QemuError(f"qemu-io gave no prompt in {timeout:g} s; said: {data!r}")
            if poller.poll(left * 1000):
                chunk = os.read(tool.stdout.fileno(), 65536)
                if not chunk:
                    raise EOFError(data.decode(errors="replace"))
                data += chunk
        return data[:-len(self.PROMPT)]

    def _close(self, tool: subprocess.Popen[bytes]) -> None:
        assert tool.stdin is not None
        with contextlib.suppress(BrokenPipeError):
            tool.stdin.close()
        try:
            tool.wait(QMP_TIMEOUT)
        except subprocess.TimeoutExpired:
            tool.kill()
            tool.wait()


def _exited(pidfd: int, timeout: float) -> bool:
    """Whether the process behind ``pidfd`` has exited, waiting up to
    ``timeout`` seconds: a pidfd polls readable once its process is gone,
    reaped or not, so this also serves a process that is no child of ours."""
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    return bool(poller.poll(timeout * 1000))


def image_io(path: str | Path, command: str, *, timeout: float = QMP_TIMEOUT,
             check: bool = True) -> QemuIoResult:
    """Run one command of the ``qemu-io`` tool on a qcow2 image no QEMU has
    open (or ``-U`` would be needed): the test's writes and checks of an
    image before a VM starts or after it quits.

    :raise QemuIoError: the command failed (a pattern mismatch included) and
        ``check`` is set.
    """
    result = run_qemu_io(str(path), ["-f", "qcow2", str(path)], command, timeout)
    if check and not result.ok:
        raise QemuIoError(result)
    return result


def run_qemu_io(target: str, image_args: Sequence[str], command: str,
                timeout: float) -> QemuIoResult:
    """Run ``qemu-io IMAGE_ARGS -c COMMAND`` and parse what it said; a
    non-zero exit counts as a failure even where the output looks fine."""
    from pvestord.adapters.command import binary

    done = subprocess.run(  # noqa: S603 - argument list, no shell
        [binary("qemu-io"), *image_args, "-c", command],
        capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
        check=False)
    result = parse_qemu_io(target, command, (done.stdout + done.stderr).splitlines())
    if done.returncode != 0 and result.ok:
        result = QemuIoResult(result.node, command, result.lines, False,
                              f"qemu-io exited {done.returncode}")
    return result


@contextlib.contextmanager
def running(vmid: int, run_dir: str | Path, **kwargs: Any) -> Iterator[QemuVM]:
    """``with running(4242, tmp, disks=[...]) as vm:``, a shorthand for QemuVM."""
    with QemuVM(vmid, run_dir, **kwargs) as vm:
        yield vm


def create_qcow2(path: str | Path, size: int | str, *, options: Sequence[str] = (),
                 timeout: float = 30.0) -> Path:
    """``qemu-img create -f qcow2`` (a plain file or a block device)."""
    from pvestord.adapters.command import binary, run

    argv = [binary("qemu-img"), "create", "-q", "-f", "qcow2"]
    for opt in options:
        argv += ["-o", opt]
    run([*argv, str(path), str(size)], timeout=timeout)
    return Path(path)
