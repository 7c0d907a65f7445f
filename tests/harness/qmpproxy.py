"""Stand-ins on a VM's QMP socket path, for tests that watch or break pvestord's QMP use.

- :class:`CountingQmpProxy` forwards every connection to QEMU's real socket
  (moved aside), counts them and times them: how many QMP connections
  pvestord makes, and how long each held QEMU's only monitor; with a
  :class:`LvmCallsInSessions`, which of the VM's LVM commands ran while a
  session held the monitor;
- :class:`NeverAnsweringQmp` is a hung QEMU: a pidfile naming a live process
  whose command line carries it, and a socket that accepts and never greets;
- :class:`QemuServerStandIn` is qemu-server's own use of the socket: a short
  call every 100 ms, each timed.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from tests.harness.faults import LvmFaults, alive
from tests.harness.qemu import QemuError, QmpConnection


class LvmCallsInSessions:
    """Which LVM commands for a VM's LVs ran while a client held the VM's
    QMP socket: the rule that a pass leaves the socket before it acts.

    Judged by order alone, never by time. The proxy calls :meth:`begin` at a
    session's first request and :meth:`during` at each later one, each
    before it forwards the request: the client is then blocked on the
    reply, inside its session. The ``lvm_faulty`` wrapper (``faults``) logs
    each call's arguments when it starts and exits only after it logged its
    end, and a pass awaits its command's exit: so a call of the VM's that runs
    at a session's first request, or that started after it and before a later
    request, ran inside the session. A call made after a session's last
    request and before its close is not seen: the close cannot be told from
    the next command's start without a clock.
    """

    def __init__(self, faults: LvmFaults, lvs: list[str]) -> None:
        self.faults = faults
        self.lvs = lvs
        #: "<wrapper pid> <arguments>" of each call seen inside a session.
        self.violations: list[str] = []
        self._lock = threading.Lock()

    def _calls(self) -> list[tuple[int, str]]:
        return [call for lv in self.lvs for call in self.faults.calls_naming(lv)]

    def begin(self) -> set[int]:
        calls = self._calls()
        for pid, arguments in calls:
            if alive(pid) and "lvm_faulty" in _cmdline(pid):
                self._violation(pid, arguments, "running at the session's first request")
        return {pid for pid, _ in calls}

    def during(self, before: set[int]) -> None:
        for pid, arguments in self._calls():
            if pid not in before:
                self._violation(pid, arguments, "started inside the session")

    def _violation(self, pid: int, arguments: str, when: str) -> None:
        with self._lock:
            line = f"{pid} lvm {arguments}: {when}"
            if line not in self.violations:
                self.violations.append(line)


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except (FileNotFoundError, ProcessLookupError):
        return ""


class CountingQmpProxy:
    """Stands in for a VM's QMP socket path: a real unix socket that forwards
    every connection to QEMU's own socket (moved aside) and counts them.
    QEMU serves one client at a time; so does this proxy's upstream."""

    def __init__(self, path: Path, lvm_calls: LvmCallsInSessions | None = None) -> None:
        self.path = path
        self.lvm_calls = lvm_calls
        self.upstream = path.with_name(path.name + ".real")
        os.rename(path, self.upstream)
        self.connections = 0
        #: Seconds each finished connection held QEMU's monitor: from QEMU's
        #: first byte (its greeting: it serves this client now) to the end.
        self.sessions: list[float] = []
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._server.bind(str(path))
        self._server.listen(16)
        self._closed = False
        threading.Thread(target=self._accept, daemon=True, name="qmp-proxy").start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            upstream.connect(str(self.upstream))
        except OSError:
            client.close()
            return
        greeted: list[float] = []
        calls_before: list[set[int]] = []

        def pump(src: socket.socket, dst: socket.socket) -> None:
            with contextlib.suppress(OSError):
                while data := src.recv(65536):
                    if src is upstream and not greeted:
                        greeted.append(time.monotonic())
                    if src is client and self.lvm_calls is not None:
                        if calls_before:
                            self.lvm_calls.during(calls_before[0])
                        else:
                            calls_before.append(self.lvm_calls.begin())
                    dst.sendall(data)
            # Either side's end ends the other's at once: QEMU serves the next
            # client only once this one is gone.
            for sock in (src, dst):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

        back = threading.Thread(target=pump, args=(upstream, client), daemon=True)
        back.start()
        pump(client, upstream)
        back.join(30)
        client.close()
        upstream.close()
        if greeted:
            self.sessions.append(time.monotonic() - greeted[0])

    def close(self) -> None:
        self._closed = True
        self._server.close()


class NeverAnsweringQmp:
    """Stands in for a hung QEMU: a pidfile naming a live process whose command
    line carries it (as QEMU's does), and a real unix socket at ``<vmid>.qmp``
    that accepts connections and never sends the QMP greeting."""

    def __init__(self, run_dir: Path, vmid: int) -> None:
        pidfile = run_dir / f"{vmid}.pid"
        self.process = subprocess.Popen(  # noqa: S603 - argument list
            [sys.executable, "-c", "import time; time.sleep(3600)", "-pidfile", str(pidfile)])
        pidfile.write_text(f"{self.process.pid}\n")
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(str(run_dir / f"{vmid}.qmp"))
        self.server.listen(64)
        self.accepted: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True, name="never-answering").start()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = self.server.accept()
                self.accepted.append(conn)  # held open, never written to

    def close(self) -> None:
        self.server.close()
        for conn in self.accepted:
            conn.close()
        self.process.kill()
        self.process.wait(timeout=30)


class QemuServerStandIn:
    """Plays qemu-server on a VM's QMP socket (test code): every ``period`` a
    new connection, the greeting, ``qmp_capabilities``, ``query-status`` and
    disconnect, as ``PVE::QMPClient`` makes each call, with its budget of
    :data:`BUDGET` for all of it (QMPClient.pm). Runs in a thread while used
    as a context manager; :attr:`calls` holds each call's seconds, connect
    included, :attr:`waits` how long each waited for QEMU to serve it (from
    the connect to QEMU's greeting: another client held the monitor), and
    :attr:`failures` the calls that failed or ran out of budget.
    """

    BUDGET = 5.0

    def __init__(self, path: Path, period: float = 0.1) -> None:
        self.path = path
        self.period = period
        self.calls: list[float] = []
        self.waits: list[float] = []
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"qemu-server-{path.name}")

    def __enter__(self) -> QemuServerStandIn:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join(2 * self.BUDGET)

    def _run(self) -> None:
        while not self._stop.is_set():
            began = time.monotonic()
            try:
                self._call()
                self.calls.append(time.monotonic() - began)
            except (OSError, ValueError, EOFError, QemuError) as err:
                self.failures.append(f"after {time.monotonic() - began:.3f} s: {err!r}")
            self._stop.wait(self.period)

    def _call(self) -> None:
        began = time.monotonic()
        connection = QmpConnection(self.path, self.BUDGET)  # greeting and capabilities
        self.waits.append(connection.greeted_at - began)
        try:
            left = self.BUDGET - (time.monotonic() - began)
            if left <= 0:
                raise TimeoutError("the call's budget ran out")
            connection.execute("query-status", {}, left)
        finally:
            connection.close()
        if time.monotonic() - began > self.BUDGET:
            raise TimeoutError("the call's budget ran out")
