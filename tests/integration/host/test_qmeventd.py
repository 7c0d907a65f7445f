"""qmeventd-py end to end: the real daemon, real QEMU processes, a real queue file.

QEMU connects to the daemon exactly as qemu-server starts it (event chardev
with ``reconnect``); thresholds are armed through the VM's own QMP socket and
crossed with HMP ``qemu-io``.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from pvestord.adapters.queue import ExtendQueue
from pvestord.adapters.vms import local_vm
from pvestord.policy import Reason
from tests.harness.polling import wait_until
from tests.harness.qemu import Disk, QemuVM, create_qcow2

pytestmark = pytest.mark.root

MiB = 1024 * 1024
#: A peer's greeting budget in these tests (the daemon's default is 10 s).
HELLO_TIMEOUT = 1.0

DaemonFactory = Callable[..., Any]


#: QEMU start-up under load: 30 at once on 2 cores can take a while.
LAUNCH_BUDGET = 120.0



def _vm(run_dir: Path, vmid: int, daemon: Any, *, disks: int = 1, size: int = 16 * MiB,
        extra_args: tuple[str, ...] = ()) -> QemuVM:
    images = [create_qcow2(run_dir / f"{vmid}-{i}.qcow2", size) for i in range(disks)]
    # Bounds, not timings: generous so a loaded 2-core machine does not fail them.
    return QemuVM(vmid, run_dir, event_socket=daemon.socket, extra_args=extra_args,
                  launch_timeout=LAUNCH_BUDGET, disks=[
        Disk(path, block_node=f"drive-scsi{i}", file_block_node=f"file-scsi{i}")
        for i, path in enumerate(images)])


def _cross_threshold(vm: QemuVM, disk: int = 0) -> None:
    """Arm a 1 MiB threshold on the file node and write past it; wait for the event."""
    vm.set_write_threshold(f"file-scsi{disk}", 1 * MiB)
    vm.write_pattern(f"drive-scsi{disk}", 0, 2 * MiB, 0x5A)
    event = vm.wait_event("BLOCK_WRITE_THRESHOLD", timeout=60)
    assert event["data"]["node-name"] == f"file-scsi{disk}"


def _connected(daemon: Any, vm: QemuVM, count: int = 1) -> None:
    daemon.wait_record("QEMU's event connection", count=count, VMID=str(vm.vmid),
                       QEMU_PID=str(vm.pid), QMP_SESSION="connected")


def _keys(daemon: Any) -> list[tuple[int, str]]:
    return sorted(e.key for e in daemon.entries())


def test_socket_is_private(run_dir: Path, daemon_factory: DaemonFactory) -> None:
    daemon = daemon_factory()
    mode = daemon.socket.stat().st_mode
    assert stat.S_ISSOCK(mode)
    assert stat.S_IMODE(mode) == 0o600


def test_one_crossed_threshold_gives_one_entry(run_dir: Path,
                                               daemon_factory: DaemonFactory) -> None:
    daemon = daemon_factory()
    with _vm(run_dir, 4242, daemon) as vm:
        _connected(daemon, vm)
        _cross_threshold(vm)
        wait_until(lambda: daemon.entries(), 60, "a queue entry")
        # Another write well past the (now disarmed) threshold adds nothing.
        vm.write_pattern("drive-scsi0", 4 * MiB, 2 * MiB)
        daemon.wait_record("the entry queued", VMID="4242", BLOCK_NODE="file-scsi0",
                           REASON="threshold", ENTRY="queued")
    [entry] = daemon.entries()
    assert entry.key == (4242, "file-scsi0")
    assert entry.reason is Reason.THRESHOLD
    assert entry.origin == "testnode"
    assert entry.n == 1
    assert entry.ts is not None and abs(entry.ts - time.time()) < 600
    assert (run_dir / "extend-queue").read_text().startswith("4242:file-scsi0 ")


def test_thirty_vms_at_once(run_dir: Path, daemon_factory: DaemonFactory) -> None:
    daemon = daemon_factory()
    vmids = range(4300, 4330)
    with contextlib.ExitStack() as stack:
        vms = [stack.enter_context(_vm(run_dir, vmid, daemon, size=8 * MiB))
               for vmid in vmids]
        for vm in vms:
            _connected(daemon, vm)
        for vm in vms:
            vm.set_write_threshold("file-scsi0", 1 * MiB)
        for vm in vms:
            vm.write_pattern("drive-scsi0", 0, 2 * MiB)
        wait_until(lambda: len(daemon.entries()) >= 30, 120, "30 queue entries")
        assert _keys(daemon) == [(vmid, "file-scsi0") for vmid in vmids]
        assert all(e.reason is Reason.THRESHOLD and e.n == 1 for e in daemon.entries())


def test_daemon_killed_and_restarted_loses_nothing(run_dir: Path,
                                                   daemon_factory: DaemonFactory) -> None:
    first = daemon_factory(cleanup_cmd=str(_recorder(run_dir)))
    with _vm(run_dir, 4242, first, disks=2) as vm:
        _connected(first, vm)
        _cross_threshold(vm, disk=0)
        wait_until(lambda: first.entries(), 60, "the first entry")
        assert first.kill() == -signal.SIGKILL
        second = daemon_factory(cleanup_cmd=str(_recorder(run_dir)))
        # QEMU's chardev reconnects on its own (reconnect=1).
        _connected(second, vm)
        _cross_threshold(vm, disk=1)
        wait_until(lambda: len(second.entries()) == 2, 60, "the second entry")
        assert _keys(second) == [(4242, "file-scsi0"), (4242, "file-scsi1")]
    # The VM never exited while the daemons came and went: exactly one cleanup, at the end.
    second.wait_record("the cleanup", VMID="4242", CLEANUP="started")
    wait_until(lambda: _recorded(run_dir), 60, "the cleanup command")
    assert _recorded(run_dir) == ["4242 1 0"]


# -- bad peers ---------------------------------------------------------------------

_FAKE_QEMU = """
import json, socket, sys
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
s.settimeout(30)
greeting = {"QMP": {"version": {"qemu": {"micro": 0, "minor": 2, "major": 7}, "package": ""},
                    "capabilities": []}}
try:
    s.sendall(json.dumps(greeting).encode() + b"\\n")
    while s.recv(4096):
        pass
except (BrokenPipeError, ConnectionResetError):  # hung up on before or while greeting
    pass
"""


def _fake_qemu(sock: Path, **popen: Any) -> subprocess.Popen[bytes]:
    """A process that greets like QEMU but has no -pidfile/-id (a test double)."""
    return subprocess.Popen([sys.executable, "-c", _FAKE_QEMU, str(sock)],  # noqa: S603
                            stdin=subprocess.DEVNULL, **popen)


def test_bad_peers_are_dropped_and_others_served(run_dir: Path,
                                                 daemon_factory: DaemonFactory) -> None:
    daemon = daemon_factory(extra=["--hello-timeout", str(HELLO_TIMEOUT)])
    with _vm(run_dir, 4242, daemon) as vm:
        _connected(daemon, vm)

        with _client(daemon.socket) as s:  # garbage
            s.sendall(b"hello, this is not JSON\n")
            daemon.wait_record("garbage dropped", DROPPED="garbage", PEER_UID="0")
            assert s.recv(16) == b""

        with _client(daemon.socket) as s:  # one 1 MiB line
            with contextlib.suppress(OSError):
                s.sendall(b'{"QMP": "' + b"x" * MiB + b'"}\n')
            daemon.wait_record("a long line dropped", DROPPED="too-long", PEER_UID="0")

        with _client(daemon.socket) as s:  # says nothing at all
            daemon.wait_record("a silent peer dropped", DROPPED="silent",
                               PEER_PID=str(os.getpid()))
            assert s.recv(16) == b""

        fake = _fake_qemu(daemon.socket)  # a QMP greeting, but no VMID on its command line
        try:
            daemon.wait_record("a peer without a VMID dropped", DROPPED="not-a-vm",
                               PEER_PID=str(fake.pid))
            assert fake.wait(10) == 0  # the daemon hung up on it
        finally:
            _reap(fake)

        # A non-root peer: the socket's mode already keeps it out, so open the
        # first gate (socket and folder) to test the second one, the uid check.
        os.chmod(run_dir, 0o711)
        os.chmod(daemon.socket, 0o666)
        nobody = _fake_qemu(daemon.socket, user=65534, group=65534)
        try:
            daemon.wait_record("a non-root peer dropped", DROPPED="not-root",
                               PEER_PID=str(nobody.pid), PEER_UID="65534")
            assert nobody.wait(10) == 0
        finally:
            _reap(nobody)

        # Through all of that the daemon kept serving the real QEMU.
        assert daemon.proc.poll() is None
        _cross_threshold(vm)
        wait_until(lambda: daemon.entries(), 60, "the entry of the good peer")
        assert _keys(daemon) == [(4242, "file-scsi0")]


@contextlib.contextmanager
def _client(path: Path) -> Iterator[socket.socket]:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(30)
    try:
        s.connect(str(path))
        yield s
    finally:
        s.close()


def _reap(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait(10)


# -- end-of-life duties --------------------------------------------------------------

def _recorder(run_dir: Path) -> Path:
    """A cleanup command that appends its arguments to a file."""
    script = run_dir / "record-cleanup"
    if not script.exists():
        script.write_text(f'#!/bin/sh\necho "$@" >> {run_dir}/cleanups\n')
        script.chmod(0o755)
    return script


def _recorded(run_dir: Path) -> list[str]:
    path = run_dir / "cleanups"
    return path.read_text().splitlines() if path.exists() else []


def test_cleanup_runs_once_per_vm_exit(run_dir: Path, daemon_factory: DaemonFactory) -> None:
    daemon = daemon_factory(cleanup_cmd=str(_recorder(run_dir)))
    with _vm(run_dir, 4242, daemon) as quitting, _vm(run_dir, 4243, daemon) as killed:
        _connected(daemon, quitting)
        _connected(daemon, killed)
        killed.send_signal(signal.SIGKILL)
        killed.wait(10)
        daemon.wait_record("the killed VM's cleanup", VMID="4243", CLEANUP="started")
        quitting.qmp("quit")
        quitting.wait(10)
        daemon.wait_record("the quit VM's cleanup", VMID="4242", CLEANUP="started")
    wait_until(lambda: len(_recorded(run_dir)) >= 2, 60, "two cleanups")
    assert daemon.stop() == 0
    # 4243 died without a SHUTDOWN event: not graceful; quit is graceful, not the guest.
    assert sorted(_recorded(run_dir)) == ["4242 1 0", "4243 0 0"]


# QEMU stays alive after a shutdown (Proxmox runs it with -no-shutdown); a
# system_reset with reboot=shutdown gives a real SHUTDOWN event without a guest.
_STAYS_AFTER_SHUTDOWN = ("-no-shutdown", "-action", "reboot=shutdown")


def test_shut_down_vm_is_terminated_then_cleaned_up(run_dir: Path,
                                                    daemon_factory: DaemonFactory) -> None:
    daemon = daemon_factory(cleanup_cmd=str(_recorder(run_dir)))
    with _vm(run_dir, 4244, daemon, extra_args=_STAYS_AFTER_SHUTDOWN) as vm:
        _connected(daemon, vm)
        vm.qmp("system_reset")
        # The daemon sees status "shutdown" and sends SIGTERM; QEMU exits
        # (its exit status, as on a node, is init's).
        vm.wait(20)
        daemon.wait_record("QEMU terminated", VMID="4244", TERMINATE="sigterm",
                           QEMU_PID=str(vm.pid))
        daemon.wait_record("the cleanup", VMID="4244", CLEANUP="started")
    wait_until(lambda: _recorded(run_dir), 60, "the cleanup command")
    assert _recorded(run_dir) == ["4244 1 0"]


def test_backup_keeps_a_shut_down_vm_alive_until_vzdump_hangs_up(
        run_dir: Path, daemon_factory: DaemonFactory) -> None:
    daemon = daemon_factory(cleanup_cmd=str(_recorder(run_dir)))
    with _vm(run_dir, 4245, daemon, extra_args=_STAYS_AFTER_SHUTDOWN) as vm:
        _connected(daemon, vm)
        with _client(daemon.socket) as vzdump:
            # vzdump's hello, as PVE::VZDump::QemuServer sends it (no newline).
            vzdump.sendall(json.dumps({"vzdump": {"vmid": "4245"}}).encode())
            daemon.wait_record("the backup", VMID="4245", BACKUP="started")
            vm.qmp("system_reset")
            daemon.wait_record("the VM kept for its backup", VMID="4245",
                               BACKUP="keeps-alive")
            assert vm.is_running()
            assert vm.qmp("query-status")["status"] == "shutdown"
        daemon.wait_record("the backup's end", VMID="4245", BACKUP="ended")
        vm.wait(20)                      # terminated: raises if it still runs
        daemon.wait_record("the cleanup", VMID="4245", CLEANUP="started")
    wait_until(lambda: _recorded(run_dir), 60, "the cleanup command")
    assert _recorded(run_dir) == ["4245 1 0"]


def test_sigterm_removes_the_socket_and_runs_no_cleanup(
        run_dir: Path, daemon_factory: DaemonFactory) -> None:
    daemon = daemon_factory(cleanup_cmd=str(_recorder(run_dir)))
    with _vm(run_dir, 4246, daemon) as vm:
        _connected(daemon, vm)
        assert daemon.stop() == 0
        assert not daemon.socket.exists()
        assert vm.is_running()
    assert _recorded(run_dir) == []


# -- a hung /etc/pve (docs/operations.md, "When /etc/pve hangs or has no quorum") ----

#: Where a task of a process waits while FUSE (pmxcfs, here bindfs) does not answer.
_FUSE_WAIT = "request_wait_answer"


def _blocked_in_fuse(pid: int) -> bool:
    """Some thread of ``pid`` waits for an answer of a FUSE file system now."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            if (task / "wchan").read_text().strip() == _FUSE_WAIT:
                return True
    return False


def _mounted(point: Path) -> bool:
    return any(line.split()[4] == str(point)
               for line in Path("/proc/self/mountinfo").read_text().splitlines())


@contextlib.contextmanager
def _fuse_folder(run_dir: Path) -> Iterator[tuple[Path, Path, subprocess.Popen[bytes]]]:
    """A FUSE mount standing in for pmxcfs (bindfs of a plain folder, in the
    foreground so that SIGSTOP to it hangs every access, as a hung pmxcfs
    does): yields the mount point, the plain folder behind it, the server."""
    backing, mount = run_dir / "pve-backing", run_dir / "pve"
    backing.mkdir()
    mount.mkdir()
    server = subprocess.Popen(["bindfs", "-f", str(backing), str(mount)],  # noqa: S603
                              stdin=subprocess.DEVNULL)
    try:
        wait_until(lambda: _mounted(mount), 30, "the bindfs mount")
        yield mount, backing, server
    finally:
        server.send_signal(signal.SIGCONT)
        subprocess.run(["umount", str(mount)], check=False, timeout=30)  # noqa: S603
        server.wait(30)


def test_hung_queue_folder_never_holds_up_shutdown_and_cleanup(
        run_dir: Path, daemon_factory: DaemonFactory) -> None:
    """pmxcfs hangs (its FUSE server stopped) while a VM crosses its threshold:
    the append waits in a thread; meanwhile another VM's SHUTDOWN is handled
    (SIGTERM, then the cleanup command) and further events are taken; once
    pmxcfs answers again, each entry lands exactly once."""
    with _fuse_folder(run_dir) as (pve, backing, fuse):
        daemon = daemon_factory(cleanup_cmd=str(_recorder(run_dir)),
                                extra=["--queue", str(pve / "extend-queue")])
        with _vm(run_dir, 4250, daemon, disks=2) as writer, \
                _vm(run_dir, 4251, daemon, extra_args=_STAYS_AFTER_SHUTDOWN) as quitter:
            _connected(daemon, writer)
            _connected(daemon, quitter)
            assert daemon.proc is not None
            fuse.send_signal(signal.SIGSTOP)
            try:
                _cross_threshold(writer, 0)
                wait_until(lambda: _blocked_in_fuse(daemon.proc.pid), 30,
                           "qmeventd-py's append waiting for the hung FUSE server")
                quitter.qmp("system_reset")              # the guest shut down
                quitter.wait(30)                         # terminated meanwhile
                wait_until(lambda: _recorded(run_dir) == ["4251 1 0"], 60,
                           "the cleanup command, with the queue still hung")
                _cross_threshold(writer, 1)              # events still taken
                assert writer.qmp("query-status")["status"] == "running"
                assert _blocked_in_fuse(daemon.proc.pid)
                assert not (backing / "extend-queue").exists()
            finally:
                fuse.send_signal(signal.SIGCONT)
            queue = ExtendQueue(backing / "extend-queue")
            want = [(4250, "file-scsi0"), (4250, "file-scsi1")]
            wait_until(lambda: sorted(e.key for e in queue.entries()) == want, 60,
                       "both entries in the queue once pmxcfs answers")
            assert [e.n for e in queue.entries()] == [1, 1]
        assert daemon.stop() == 0
    assert _recorded(run_dir).count("4251 1 0") == 1              # once, not again


def _holds_open(pid: int, path: Path) -> bool:
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            if os.readlink(fd) == str(path):
                return True
    return False


def test_queue_lock_held_past_its_timeout_loses_nothing(
        run_dir: Path, daemon_factory: DaemonFactory) -> None:
    """Another process holds the queue lock longer than qmeventd-py's lock
    timeout: the append fails, is retried, and the entry lands once the lock
    is free (before, the lock timeout ended the appender for good)."""
    daemon = daemon_factory()
    lock_path = daemon.queue_path.with_name(daemon.queue_path.name + ".lock")
    assert daemon.proc is not None
    pid = daemon.proc.pid
    with _vm(run_dir, 4252, daemon) as vm:
        _connected(daemon, vm)
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            _cross_threshold(vm)
            wait_until(lambda: _holds_open(pid, lock_path), 30, "the append waiting for the lock")
            # The lock timeout (10 s) ends that wait: the lock file is closed.
            wait_until(lambda: not _holds_open(pid, lock_path), 60, "the append giving up once")
            assert daemon.entries() == []
        finally:
            os.close(fd)
        wait_until(lambda: _keys(daemon) == [(4252, "file-scsi0")], 60, "the retried entry")
        assert [e.n for e in daemon.entries()] == [1]
        _cross_threshold(vm)                                # the appender still works
        wait_until(lambda: [e.n for e in daemon.entries()] == [2], 60, "a second event merged")
    assert daemon.stop() == 0


def test_a_daemonized_qemu_is_found_and_its_events_queued(
        run_dir: Path, daemon_factory: DaemonFactory) -> None:
    """qemu-server starts QEMU with ``-daemonize``: the process that connects
    to qmeventd-py and writes the pidfile is then no child of the caller,
    and its stdout is closed. qmeventd-py still names its VM (by the pidfile
    on its command line) and queues its threshold, and pvestord's view of
    running VMs (``local_vm``) finds it by its pidfile."""
    daemon = daemon_factory()
    vm = _vm(run_dir, 4250, daemon)
    with vm:
        found = local_vm(run_dir, 4250)
        assert found is not None and (found.pid, found.qmp_socket) == (vm.pid, vm.qmp_path)
        vm.set_write_threshold("file-scsi0", 1 * MiB)
        vm.write_pattern("drive-scsi0", 0, 2 * MiB, 0x5A, timeout=60)
        wait_until(lambda: daemon.entries(), 60, "the daemonized VM's entry")
        [entry] = daemon.entries()
        assert (entry.key, entry.reason) == ((4250, "file-scsi0"), Reason.THRESHOLD)
    assert not vm.is_running()
