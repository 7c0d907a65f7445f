"""The storage lock while it is held: renewal, ``require``,
every storage of a VG, the VG mark and the custodian of a stuck command.

Real lock directories on a plain folder, with the emulated pmxcfs expiry at a
lifetime of about a second, and real second processes
(``tests/harness/lockholder.py``) waiting on them as another node would.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pvestord.adapters.command import UnkillableCommandError, stuck_processes
from pvestord.adapters.config import parse_storage_config
from pvestord.adapters.locks import (
    FlockLock,
    LockDirLock,
    LockLifetimeError,
    LockTimeout,
    vg_lock,
)
from pvestord.adapters.lvm import LvmError
from pvestord.adapters.settings import DaemonSettings
from pvestord.adapters.vghealth import VgMarks, VgUnhealthyError
from pvestord.engine.extender import Extender
from pvestord.errors import ConfigError
from tests.harness.lockwaiter import LIFE, PATIENCE, events_of, wait_until, waiter

ROOT = Path(__file__).resolve().parents[2]

STORAGE_CFG = """\
lvm: thin1
\tvgname san
\tshared 1
\tpvestord-chunksize 1G

lvm: thick1
\tvgname san
\tshared 1

lvm: old1
\tvgname san
\tshared 1
\tdisable 1

lvmthin: pool1
\tvgname other
\tthinpool data

lvm: elsewhere
\tvgname other

pvestord: plugin1
\tvgname san
\tshared 1
"""


async def test_a_held_lock_directory_is_renewed(tmp_path: Path) -> None:
    lock = LockDirLock(tmp_path, "storage-san1", lifetime=LIFE)
    async with lock.acquire_async() as held:
        first_mtime = os.stat(lock.path).st_mtime_ns
        first = held.renewed_at
        await wait_until(lambda: held.renewed_at > first, "a renewal")
        assert os.stat(lock.path).st_mtime_ns > first_mtime
        held.require(0.5)
    assert not lock.path.exists()


async def test_another_process_never_enters_while_the_holder_renews(tmp_path: Path) -> None:
    lock = LockDirLock(tmp_path, "storage-san1", lifetime=LIFE)
    async with lock.acquire_async() as held:
        took = time.monotonic()
        # Four lifetimes of waiting, each long enough for its expiry to strike.
        assert await events_of(await waiter(tmp_path, "storage-san1",
                                            wait=4 * LIFE)) == ["refused", "timeout"]
        assert time.monotonic() - took > 2 * LIFE
        held.require(0.1)  # still ours, and renewed


def test_an_unrenewed_lock_is_expired_by_the_same_waiter(tmp_path: Path,
                                                         caplog: pytest.LogCaptureFixture
                                                         ) -> None:
    """The control: the waiter's emulated expiry does strike at this
    lifetime, so the test above shows the renewal, not a lenient waiter."""
    lock = LockDirLock(tmp_path, "storage-san1", lifetime=LIFE)
    with lock.acquire():  # the command line's hold: no renewal
        done = subprocess.run(  # noqa: S603 - argument list, our own helper
            [sys.executable, "-m", "tests.harness.lockholder", "--lock-dir", str(tmp_path),
             "--id", "storage-san1", "--timeout", str(4 * LIFE), "--expire-after", str(LIFE)],
            cwd=ROOT, capture_output=True, text=True, timeout=PATIENCE, check=True)
    assert [json.loads(line)["event"] for line in done.stdout.splitlines()] == [
        "refused", "acquired", "released"]


def test_require_refuses_what_could_outlive_the_lock(tmp_path: Path) -> None:
    lock = LockDirLock(tmp_path, "storage-san1", lifetime=12.0)
    with lock.acquire() as held:
        held.require(5.0)  # 12 s, less 1 s of margin, less what has passed
        with pytest.raises(LockLifetimeError, match="guaranteed for"):
            held.require(11.5)
        os.rmdir(lock.path)  # expired meanwhile ...
        os.mkdir(lock.path)  # ... and taken by another holder
        assert not lock.renew(held)  # type: ignore[arg-type]
        with pytest.raises(LockLifetimeError, match="taken by another holder"):
            held.require(0.0)
    assert lock.path.is_dir(), "the other holder's lock was removed"
    with FlockLock(tmp_path / "flock").acquire() as forever:
        forever.require(1e9)  # flock does not expire


def test_the_settings_refuse_an_lvm_timeout_the_lock_cannot_cover() -> None:
    DaemonSettings(node="n1", lock_lifetime=16, lvm_timeout=3)
    with pytest.raises(ConfigError, match="lvm-timeout"):
        DaemonSettings(node="n1", lock_lifetime=16, lvm_timeout=10)


def test_every_enabled_storage_of_a_vg_is_locked_in_order() -> None:
    config = parse_storage_config(STORAGE_CFG, "storage.cfg")
    assert config.vg_users("san") == [("plugin1", True), ("thick1", True), ("thin1", True)]
    assert config.vg_users("other") == [("elsewhere", False), ("pool1", False)]
    assert config.vg_users("none") == []


async def test_a_thick_storage_lock_on_the_vg_blocks_the_thin_extension(
        tmp_path: Path) -> None:
    """Proxmox holds ``storage-thick1`` for an lvcreate on the VG; the
    extender's lock for thin1's LV must wait for it: every storage on the VG
    is locked, since Proxmox locks a storage by its id."""
    locks = tmp_path / "locks"
    locks.mkdir()
    config = parse_storage_config(STORAGE_CFG, "storage.cfg")
    thin = config.get("thin1")
    assert thin is not None
    extender = Extender(DaemonSettings(node="n1", lock_dir=locks,
                                       vg_health_dir=tmp_path / "marks"), lambda: config)
    release = tmp_path / "release"
    proxmox = await waiter(locks, "storage-thick1", wait=PATIENCE, hold_until=release)
    assert proxmox.stdout is not None
    first = json.loads(await asyncio.wait_for(proxmox.stdout.readline(), PATIENCE))
    assert first["event"] == "acquired"
    with pytest.raises(LockTimeout, match="storage-thick1"):
        async with extender.gates.storage_lock(thin).acquire_async(1.0):
            pytest.fail("extended while Proxmox held storage-thick1")
    assert not (locks / "storage-thin1").exists(), "a lock taken before the wait was kept"
    release.touch()
    assert await events_of(proxmox) == ["released"]
    async with extender.gates.storage_lock(thin).acquire_async(PATIENCE):
        assert sorted(p.name for p in locks.iterdir()) == [
            "storage-plugin1", "storage-thick1", "storage-thin1"]
    assert list(locks.iterdir()) == []


async def test_a_marked_vg_is_refused_before_any_lock_is_taken(tmp_path: Path) -> None:
    locks = tmp_path / "locks"
    locks.mkdir()
    health = VgMarks(tmp_path / "marks")
    health.mark("san", "an lvextend (pid 1234) did not end after SIGKILL")
    config = parse_storage_config(STORAGE_CFG, "storage.cfg")
    thin = config.get("thin1")
    assert thin is not None
    extender = Extender(DaemonSettings(node="n1", lock_dir=locks,
                                       vg_health_dir=tmp_path / "marks"), lambda: config)
    with pytest.raises(VgUnhealthyError, match="pid 1234"):
        async with extender.gates.storage_lock(thin).acquire_async(1.0):
            pytest.fail("a change started on a marked VG")
    assert list(locks.iterdir()) == []
    async with vg_lock("other", config.vg_users("other"), lock_dir=locks,
                       health=health).acquire_async(1.0):
        pass  # other VGs are served


async def test_a_stuck_command_keeps_the_locks_until_it_is_gone(tmp_path: Path) -> None:
    locks = tmp_path / "locks"
    locks.mkdir()
    health = VgMarks(tmp_path / "marks")
    lock = vg_lock("san", [("thin1", True), ("thick1", True)], lock_dir=locks, lifetime=LIFE,
                   health=health)
    # A real process standing for the lvm that SIGKILL did not end.
    stuck = await asyncio.create_subprocess_exec(sys.executable, "-c",
                                                 "import time; time.sleep(120)")
    try:
        unkillable = UnkillableCommandError(["lvm", "lvextend"], "", timeout=1.0,
                                            stuck=stuck_processes(stuck.pid))
        with pytest.raises(LvmError):
            async with lock.acquire_async(1.0):
                raise LvmError("extending LV san/x") from unkillable
        assert stuck.returncode is None, "the pass waited for the stuck command to end"
        mark = health.get("san")
        assert mark is not None and str(stuck.pid) in mark.reason
        # Held and renewed by the custodian: another node waiting four
        # lifetimes does not get in.
        assert await events_of(await waiter(locks, "storage-thick1",
                                            wait=4 * LIFE)) == ["refused", "timeout"]
        assert (locks / "storage-thin1").is_dir()
    finally:
        stuck.kill()
        await stuck.wait()
    await wait_until(lambda: not list(locks.iterdir()), "the custodian's release")
    with pytest.raises(VgUnhealthyError):
        async with lock.acquire_async(1.0):
            pytest.fail("a change started on a VG marked by the stuck command")
