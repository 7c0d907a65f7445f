"""The pass deadline and the progress watchdog, and the busy backoff.

The rules are pure (:func:`pvestord.engine.passes.engine_wedged`, ``VmRetry``); the
process tests run ``pvestord run`` with a real ``NOTIFY_SOCKET`` (a datagram
socket read here) and ``WATCHDOG_USEC``, and read the ``WATCHDOG=1`` datagrams.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pvestord.engine.failures import BUSY_FIRST, BUSY_MAX, VmRetry
from pvestord.engine.passes import WEDGE_GRACE, engine_wedged
from tests.harness.daemonlog import parse
from tests.harness.polling import wait_until_async
from tests.harness.qmpproxy import NeverAnsweringQmp

PVESTORD = str(Path(sys.executable).parent / "pvestord")
TIMEOUT = 60.0
#: A ping every 0.2 s.
WATCHDOG_USEC = 400_000
PING_INTERVAL = WATCHDOG_USEC / 2e6
#: Longer than a datagram already sent can take to reach the reader thread.
IN_FLIGHT = 2.0

seconds = st.floats(min_value=0, max_value=1e5, allow_nan=False)


@given(now=seconds, deadline=st.floats(min_value=0.1, max_value=1e4),
       poll=st.floats(min_value=0.1, max_value=100), since_loop=seconds)
def test_an_idle_engine_is_never_wedged(now: float, deadline: float, poll: float,
                                        since_loop: float) -> None:
    """No pass at all, and a queue loop that completes its iterations: the
    watchdog is fed, however long the daemon has had nothing to do."""
    loop_progress = now - min(since_loop, poll)
    assert engine_wedged(now, abandoned=[], running=[], loop_progress=loop_progress,
                         pass_deadline=deadline, poll_interval=poll) is None


@given(cancelled_ago=seconds, started_ago=seconds,
       deadline=st.floats(min_value=0.1, max_value=1e4))
def test_wedged_exactly_when_a_pass_outlives_its_deadline_and_grace(
        cancelled_ago: float, started_ago: float, deadline: float) -> None:
    now = 1e6
    abandoned = engine_wedged(now, abandoned=[(101, now - cancelled_ago)], running=[],
                              loop_progress=now, pass_deadline=deadline, poll_interval=2)
    assert (abandoned is not None) is (cancelled_ago > WEDGE_GRACE)
    running = engine_wedged(now, abandoned=[], running=[(102, now - started_ago)],
                            loop_progress=now, pass_deadline=deadline, poll_interval=2)
    assert (running is not None) is (started_ago > deadline + WEDGE_GRACE)


def test_a_queue_loop_that_stopped_iterating_is_wedged() -> None:
    now = 1e6
    stalled = now - (2 + 180 + WEDGE_GRACE) - 1
    assert engine_wedged(now, abandoned=[], running=[], loop_progress=stalled,
                         pass_deadline=180, poll_interval=2) is not None


def test_busy_backoff_doubles_to_its_maximum() -> None:
    retry = VmRetry(first=BUSY_FIRST, maximum=BUSY_MAX)
    delays = [retry.failed() for _ in range(8)]
    assert delays[0] == BUSY_FIRST
    assert delays == sorted(delays)
    assert max(delays) == BUSY_MAX
    # Never overflows, however long a migration lasts.
    retry.attempts = 10_000
    assert retry.failed() == BUSY_MAX


# -- the daemon as a process -------------------------------------------------------

class NotifySocket:
    """A real ``NOTIFY_SOCKET``: records each datagram and when it came."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.datagrams: list[tuple[float, str]] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                data = self.sock.recv(4096).decode(errors="replace")
                self.datagrams.append((time.monotonic(), data))

    def pings(self) -> list[float]:
        return [t for t, d in self.datagrams if "WATCHDOG=1" in d.split("\n")]

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def notify(tmp_path: Path) -> Iterator[NotifySocket]:
    listener = NotifySocket(tmp_path / "notify.sock")
    yield listener
    listener.close()


def start(tmp_path: Path, notify: NotifySocket, *extra: str) -> subprocess.Popen[bytes]:
    (tmp_path / "run").mkdir(exist_ok=True)
    (tmp_path / "storage.cfg").write_text("lvm: thin1\n\tvgname vg1\n\tpvestord-chunksize 1G\n")
    argv = [PVESTORD, "--queue", str(tmp_path / "extend-queue"), "run", "--storage-config",
            str(tmp_path / "storage.cfg"), "--run-dir", str(tmp_path / "run"), "--node", "n1",
            "--poll-interval", "0.2", "--no-journal", "--nodes-dir", str(tmp_path / "nodes"),
            "--vg-health-dir", str(tmp_path / "vg-unhealthy"), *extra]
    env = {k: v for k, v in os.environ.items() if k not in ("WATCHDOG_PID", "JOURNAL_STREAM")}
    env.update(NOTIFY_SOCKET=str(notify.path), WATCHDOG_USEC=str(WATCHDOG_USEC))
    with (tmp_path / "pvestord.log").open("wb") as out:
        return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out,  # noqa: S603
                                stderr=subprocess.STDOUT, env=env)


def wait_until(predicate: object, what: str, proc: subprocess.Popen[bytes],
               log: Path) -> None:
    assert callable(predicate)
    deadline = time.monotonic() + TIMEOUT
    while not predicate():
        assert proc.poll() is None, log.read_text()
        assert time.monotonic() < deadline, f"{what}:\n{log.read_text()[-3000:]}"
        time.sleep(0.05)


def stop(proc: subprocess.Popen[bytes]) -> int:
    proc.terminate()
    return proc.wait(timeout=TIMEOUT)


def test_an_idle_daemon_keeps_feeding_the_watchdog(tmp_path: Path,
                                                   notify: NotifySocket) -> None:
    proc = start(tmp_path, notify)
    log = tmp_path / "pvestord.log"
    try:
        wait_until(lambda: any(d == "READY=1" for _, d in notify.datagrams), "READY=1", proc,
                   log)
        ready = time.monotonic()
        wait_until(lambda: len([t for t in notify.pings() if t > ready]) >= 10,
                   "ten pings from a daemon with nothing to do", proc, log)
    finally:
        assert stop(proc) == 0


def test_a_pass_past_its_deadline_is_abandoned_and_the_daemon_goes_on(
        tmp_path: Path, notify: NotifySocket) -> None:
    """A QMP peer that never answers, with a QMP budget longer than the pass
    deadline: the pass is cancelled at its deadline and logged at error with
    the VM's id; no VG is marked (it stopped before any LVM change); the
    cancellation took, so the engine is not wedged and the pings go on."""
    (tmp_path / "run").mkdir()
    hung = NeverAnsweringQmp(tmp_path / "run", 4141)
    log = tmp_path / "pvestord.log"
    proc = start(tmp_path, notify, "--pass-deadline", "1", "--qmp-timeout", "600")
    try:
        def abandoned() -> list[str]:
            return [line.message for line in parse(log.read_text())
                    if line.level == "ERROR" and line.fields.get("VMID") == "4141"]

        wait_until(abandoned, "the pass abandoned at its deadline", proc, log)
        since = time.monotonic()
        wait_until(lambda: len([t for t in notify.pings() if t > since]) >= 10,
                   "pings after the abandoned pass", proc, log)
        assert len(hung.accepted) >= 1
        assert not (tmp_path / "vg-unhealthy").exists()
    finally:
        hung.close()
        assert stop(proc) == 0


# -- a wedged engine, in process -------------------------------------------------

async def test_a_pass_that_ignores_its_cancellation_stops_the_pings(
        tmp_path: Path, notify: NotifySocket, monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine wedged while the event loop runs: the pings stop.

    No wait the product makes can ignore a cancellation any more (every kill
    wait is bounded, tests/unit/test_command_kill.py), so the wedge is a
    stand-in: the pass over a VM swallows its cancellation, as a bug would.
    Everything else is the daemon's own, run in this process: its loops find
    the VM (a live process carrying the pidfile), start the pass, abandon it
    at its deadline, and its watchdog loop pings a real ``NOTIFY_SOCKET``;
    only the grace before "wedged" is shortened.
    """
    from pvestord.adapters.settings import DaemonSettings
    from pvestord.adapters.vms import LocalVm
    from pvestord.engine import daemon as daemon_module
    from pvestord.engine import passes

    monkeypatch.setattr(passes, "engine_wedged",
                        functools.partial(engine_wedged, grace=0.5))
    monkeypatch.setenv("NOTIFY_SOCKET", str(notify.path))
    monkeypatch.setenv("WATCHDOG_USEC", str(WATCHDOG_USEC))
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    released = asyncio.Event()

    async def swallows_its_cancellation(self: object, vm: LocalVm,
                                        entries: object) -> None:
        while not released.is_set():
            with contextlib.suppress(asyncio.CancelledError):
                await released.wait()

    monkeypatch.setattr(daemon_module.Daemon, "_pass_inner", swallows_its_cancellation)
    (tmp_path / "run").mkdir()
    (tmp_path / "storage.cfg").write_text("lvm: thin1\n\tvgname vg1\n\tpvestord-chunksize 1G\n")
    settings = DaemonSettings(
        node="n1", queue=tmp_path / "extend-queue", storage_config=tmp_path / "storage.cfg",
        run_dir=tmp_path / "run", nodes_dir=tmp_path / "nodes", inotify=False,
        lvm_shell=False, poll_interval=0.2, pass_deadline=0.5,
        vg_health_dir=tmp_path / "vg-unhealthy")
    engine = daemon_module.Daemon(settings)
    vm = NeverAnsweringQmp(tmp_path / "run", 4242)
    running = asyncio.create_task(engine.run())
    try:
        await wait_for_async(lambda: engine.wedged() is not None, "the engine seen wedged")
        assert "VM 4242" in (engine.wedged() or "")
        # The loop asks before each ping, and the wedge lasts until released:
        # no ping is sent from here on. One sent just before may still be on
        # its way to the reader thread, so the window looked at starts later.
        quiet_from = time.monotonic() + IN_FLIGHT
        await wait_for_async(lambda: time.monotonic() > quiet_from + 10 * PING_INTERVAL,
                             "ten ping intervals")
        assert [t for t in notify.pings() if t > quiet_from] == [], "pinged while wedged"
        assert not running.done()
        last_ping = max(notify.pings(), default=0.0)

        released.set()  # the pass ends after all: progress again, and pings
        await wait_for_async(lambda: engine.wedged() is None, "the wedge gone")
        await wait_for_async(lambda: max(notify.pings(), default=0.0) > last_ping,
                             "pings again")
        assert not (tmp_path / "vg-unhealthy").exists()  # stuck before any LVM change
    finally:
        released.set()
        engine._stop.set()
        assert await asyncio.wait_for(running, TIMEOUT) == 0
        vm.close()


async def wait_for_async(predicate: Callable[[], bool], what: str) -> None:
    await wait_until_async(predicate, TIMEOUT, what, interval=0.02)
