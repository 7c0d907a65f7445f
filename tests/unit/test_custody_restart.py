"""Custody of a stuck ``lvm`` across a restart of the daemon.

A real process stands for the ``lvm`` that SIGKILL did not end; real lock
directories on a plain folder with the emulated pmxcfs expiry at a lifetime
of about a second; a real second process (``tests/harness/lockholder.py``)
waits on them as another node would; the daemon is pvestord's own
:class:`~pvestord.engine.daemon.Daemon`, run in this process with no VM.

"Stopping the daemon" is what ``asyncio.run`` does to the tasks still there
at the end of ``Daemon.run``: the custodian is cancelled.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from pvestord.adapters.command import UnkillableCommandError, stuck_processes
from pvestord.adapters.locks import vg_lock
from pvestord.adapters.lvm import LvmError
from pvestord.adapters.settings import DaemonSettings
from pvestord.adapters.vghealth import VgMarks
from pvestord.engine.daemon import Daemon
from tests.harness.lockwaiter import LIFE, PATIENCE, events_of, wait_until, waiter


def settings_in(tmp_path: Path) -> DaemonSettings:
    (tmp_path / "run").mkdir(exist_ok=True)
    (tmp_path / "storage.cfg").write_text("lvm: thin1\n\tvgname san\n\tshared 1\n"
                                          "\tpvestord-chunksize 1G\n")
    return DaemonSettings(
        node="n1", queue=tmp_path / "extend-queue", storage_config=tmp_path / "storage.cfg",
        run_dir=tmp_path / "run", nodes_dir=tmp_path / "nodes", inotify=False,
        lvm_shell=False, poll_interval=0.2, reconcile_interval=0.2,
        vg_health_dir=tmp_path / "vg-unhealthy")


@contextlib.asynccontextmanager
async def daemon_running(tmp_path: Path) -> AsyncIterator[Daemon]:
    engine = Daemon(settings_in(tmp_path))
    created = engine._loop_progress
    running = asyncio.create_task(engine.run())
    try:
        # Started: its queue loop went round once (what runs at start came before).
        await wait_until(lambda: running.done() or engine._loop_progress > created,
                         "the daemon started")
        assert not running.done()
        yield engine
    finally:
        engine._stop.set()
        assert await asyncio.wait_for(running, PATIENCE) == 0


async def stop_custodians() -> None:
    """What the end of ``asyncio.run`` does to a custodian: cancel it."""
    tasks = [t for t in asyncio.all_tasks() if t.get_name().startswith("custody of")]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


@contextlib.asynccontextmanager
async def stuck_process() -> AsyncIterator[asyncio.subprocess.Process]:
    """A real process standing for the lvm that SIGKILL did not end."""
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c",
                                                "import time; time.sleep(120)")
    try:
        yield proc
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


@contextlib.asynccontextmanager
async def custody_left_behind(
        tmp_path: Path) -> AsyncIterator[tuple[Path, VgMarks, asyncio.subprocess.Process]]:
    """What a daemon stopping in custody of a stuck ``lvm`` on VG ``san``
    leaves: the lock folder, the VG marks and the stuck process, alive for
    the ``async with``."""
    locks = tmp_path / "locks"
    locks.mkdir()
    health = VgMarks(tmp_path / "vg-unhealthy")
    lock = vg_lock("san", [("thin1", True)], lock_dir=locks, lifetime=LIFE, health=health)
    async with stuck_process() as stuck:
        unkillable = UnkillableCommandError(["lvm", "lvextend"], "", timeout=1.0,
                                            stuck=stuck_processes(stuck.pid))
        with pytest.raises(LvmError):
            async with lock.acquire_async(1.0):
                raise LvmError("extending LV san/x") from unkillable
        # The daemon stops: its custodian goes with it.
        await stop_custodians()
        yield locks, health, stuck


async def test_the_lock_of_a_stuck_command_stays_held_across_a_daemon_restart(
        tmp_path: Path) -> None:
    async with custody_left_behind(tmp_path) as (locks, health, stuck):
        assert (locks / "storage-thin1").is_dir()
        # The next daemon starts and keeps the lock: another node waiting
        # four lifetimes does not get in while the stuck process lives.
        async with daemon_running(tmp_path):
            assert await events_of(await waiter(locks, "storage-thin1",
                                                wait=4 * LIFE)) == ["refused", "timeout"]
            stuck.kill()
            await stuck.wait()
            await wait_until(lambda: not (locks / "storage-thin1").exists(),
                             "the lock released once the stuck process is gone")
            assert list((tmp_path / "vg-custody").iterdir()) == []
    # The VG mark stays for the operator.
    assert health.get("san") is not None


async def test_a_daemon_stopping_hands_its_custody_over(tmp_path: Path) -> None:
    """The custody taken over at start is handed over again at stop, renewed:
    the daemon after it keeps the lock too."""
    async with custody_left_behind(tmp_path) as (locks, _, _):
        async with daemon_running(tmp_path):
            record = tmp_path / "vg-custody" / "san"
            first = json.loads(record.read_text())
            # Renewed by this daemon, and the renewal written down.
            await wait_until(lambda: json.loads(record.read_text()) != first,
                             "the record brought up to date with a renewal")
        async with daemon_running(tmp_path):
            assert await events_of(await waiter(locks, "storage-thin1",
                                                wait=4 * LIFE)) == ["refused", "timeout"]


async def test_a_reused_pid_is_not_taken_for_the_stuck_process(tmp_path: Path) -> None:
    """A record whose pid now belongs to another process (another start
    time) keeps no lock: the record is dropped, and the lock left behind
    expires as any other."""
    locks = tmp_path / "locks"
    (locks / "storage-thin1").mkdir(parents=True)
    folder = tmp_path / "vg-custody"
    folder.mkdir()
    async with stuck_process() as other:
        (ticks,) = [p.start_ticks for p in stuck_processes(other.pid)]
        st = os.stat(locks / "storage-thin1")
        (folder / "san").write_text(json.dumps({
            "vg": "san", "command": ["lvm", "lvextend"], "since": 0.0,
            "stuck": [[other.pid, ticks + 1]],
            "locks": [{"kind": "dir", "path": str(locks / "storage-thin1"), "lifetime": LIFE,
                       "ino": st.st_ino, "mtime_ns": st.st_mtime_ns}]}))
        async with daemon_running(tmp_path):
            await wait_until(lambda: not (folder / "san").exists(), "the record dropped")
            assert await events_of(await waiter(locks, "storage-thin1",
                                                wait=4 * LIFE)) == ["refused", "acquired",
                                                                    "released"]


async def test_a_lock_taken_by_another_while_no_daemon_ran_is_not_adopted(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The lock expired and another holder took it between the daemons: the
    next daemon leaves that holder's directory alone, and takes the lock
    once it is free, keeping it while the stuck process lives."""
    async with custody_left_behind(tmp_path) as (locks, _, _):
        path = locks / "storage-thin1"
        # Another node's: a new directory, which its holder renews (an mtime
        # ahead: the emulated expiry never breaks it while we look).
        path.rmdir()
        spacer = locks / "spacer"
        spacer.mkdir()  # so that the new directory gets another inode
        path.mkdir()
        spacer.rmdir()
        ahead = time.time() + 3600
        os.utime(path, (ahead, ahead))
        theirs = os.stat(path)
        async with daemon_running(tmp_path):
            await wait_until(lambda: "cannot be taken over" in caplog.text,
                             "the daemon's attempt to take the lock over")
            # Not adopted: the other holder's directory is not renewed by us.
            assert os.stat(path).st_mtime_ns == theirs.st_mtime_ns
            path.rmdir()  # the other holder releases it
            await wait_until(lambda: path.exists(), "the lock taken again")
            assert await events_of(await waiter(locks, "storage-thin1",
                                                wait=4 * LIFE)) == ["refused", "timeout"]


async def test_a_stuck_command_of_the_command_line_is_taken_over_by_the_daemon(
        tmp_path: Path) -> None:
    """The command line's hold has no task to keep the lock after it exits:
    it writes the custody down, and the running daemon takes it over."""
    locks = tmp_path / "locks"
    locks.mkdir()
    health = VgMarks(tmp_path / "vg-unhealthy")
    lock = vg_lock("san", [("thin1", True)], lock_dir=locks, lifetime=LIFE, health=health)
    async with stuck_process() as stuck, daemon_running(tmp_path):
        unkillable = UnkillableCommandError(["lvm", "lvcreate"], "", timeout=1.0,
                                            stuck=stuck_processes(stuck.pid))
        with pytest.raises(LvmError), lock.acquire(1.0):
            raise LvmError("creating LV san/x") from unkillable
        assert (locks / "storage-thin1").is_dir()
        assert await events_of(await waiter(locks, "storage-thin1",
                                            wait=4 * LIFE)) == ["refused", "timeout"]
