"""pvestord's persistent lvm shells against real LVM (:mod:`pvestord.adapters.lvmshell`).

The extension path's two commands (``lvs``, ``lvextend``) go through a shell
per VG. These tests hold it to what a process per command gives: the same
answers, the same typed errors, changes made elsewhere seen at once, and a
shell that dies, hangs or cannot start never costing more than the one
command it was running.

A hung command is made the real way: the test holds LVM's own lock of the VG
(``flock`` on ``/run/lock/lvm/V_<vg>``), so the shell's ``lvextend`` waits
for it, as it would behind another LVM command on the node.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import signal
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from pvestord.adapters import lvm
from pvestord.adapters.lvmshell import LvmShells
from tests.harness.lvmbed import VG, MiB, sh
from tests.harness.polling import wait_until_async

#: LVM's lock file of a VG (global/locking_dir of lvm.conf: the default).
LVM_LOCK_DIR = Path("/run/lock/lvm")


@contextlib.contextmanager
def holding_vg_lock(vg: VG) -> Iterator[None]:
    """LVM's own write lock of ``vg``, as another LVM command would hold it."""
    LVM_LOCK_DIR.mkdir(parents=True, exist_ok=True)
    fd = os.open(LVM_LOCK_DIR / f"V_{vg.name}", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def running(pid: int) -> bool:
    """Whether ``pid`` still runs (a zombie does not: its pipes are closed)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


async def wait_gone(pid: int) -> None:
    await wait_until_async(lambda: not running(pid), 10, f"lvm shell {pid} gone")


def waiting_on_a_file_lock(pid: int) -> bool:
    """Whether ``pid`` is blocked on a file lock: a ``->`` line of
    ``/proc/locks`` (``N: -> FLOCK ADVISORY WRITE <pid> ...``)."""
    for line in Path("/proc/locks").read_text().splitlines():
        fields = line.split()
        if len(fields) > 5 and fields[1] == "->" and fields[5] == str(pid):
            return True
    return False


@pytest.fixture
async def shells() -> AsyncIterator[LvmShells]:
    pool = LvmShells()
    yield pool
    await pool.close()


async def shell_serving_lv_a(vg: VG, shells: LvmShells) -> int:
    """An 8 MiB LV "a" in ``vg``, read once through ``vg``'s shell; the shell's pid."""
    vg.create_lv("a", 8 * MiB)
    await lvm.lv_info(vg.name, "a", shells=shells)
    return shells.pids()[vg.name]


async def test_the_shell_reads_and_extends_as_processes_do(vg: VG, shells: LvmShells) -> None:
    vg.create_lv("a", 8 * MiB)
    in_shell = await lvm.lv_info(vg.name, "a", shells=shells)
    assert in_shell == await lvm.lv_info(vg.name, "a")
    assert in_shell.size == 8 * MiB and in_shell.active
    pid = shells.pids()[vg.name]
    await lvm.extend(vg.name, "a", 16 * MiB, shells=shells)
    assert vg.lv_size("a") == vg.device_size("a") == 16 * MiB
    # The same absolute size again (a retry after a crash) is success, as for a process.
    await lvm.extend(vg.name, "a", 16 * MiB, shells=shells)
    assert (await lvm.lv_info(vg.name, "a", shells=shells)).size == 16 * MiB
    assert shells.pids() == {vg.name: pid}, "one shell served every command"


async def test_changes_made_elsewhere_are_seen_and_kept(vg: VG, shells: LvmShells) -> None:
    """Another LVM process (as another node would) changes the VG between the
    shell's commands: the shell reads the new metadata, and its own change
    keeps the other one (a stale copy written back would lose it, docs/design.md, "Locks")."""
    vg.create_lv("mine", 8 * MiB)
    vg.create_lv("theirs", 8 * MiB)
    await lvm.extend(vg.name, "mine", 12 * MiB, shells=shells)
    sh("lvextend", "-q", "-L", f"{40 * MiB}b", f"{vg.name}/theirs")
    seen = await lvm.lv_info(vg.name, "theirs", shells=shells)
    assert seen.size == 40 * MiB
    assert seen.vg_free == (await lvm.lv_info(vg.name, "theirs")).vg_free
    await lvm.extend(vg.name, "mine", 20 * MiB, shells=shells)
    sh("lvextend", "-q", "-L", f"{48 * MiB}b", f"{vg.name}/theirs")
    await lvm.extend(vg.name, "mine", 24 * MiB, shells=shells)
    assert (vg.lv_size("mine"), vg.lv_size("theirs")) == (24 * MiB, 48 * MiB)
    assert vg.device_size("mine") == 24 * MiB


async def test_lvm_errors_come_back_typed_and_the_shell_stays(vg: VG,
                                                               shells: LvmShells) -> None:
    pid = await shell_serving_lv_a(vg, shells)
    with pytest.raises(lvm.VgFullError, match="volume group is full"):
        await lvm.extend(vg.name, "a", 64 * 1024 * MiB, shells=shells)
    with pytest.raises(lvm.LvMissingError):
        await lvm.lv_info(vg.name, "nosuch", shells=shells)
    with pytest.raises(lvm.LvMissingError):
        await lvm.extend(vg.name, "nosuch", 16 * MiB, shells=shells)
    assert vg.lv_size("a") == 8 * MiB
    assert shells.pids() == {vg.name: pid}, "an LVM error is no reason to restart the shell"
    await lvm.extend(vg.name, "a", 12 * MiB, shells=shells)
    assert vg.lv_size("a") == 12 * MiB


async def test_a_shell_killed_between_commands_is_replaced(vg: VG, shells: LvmShells,
                                                           caplog: pytest.LogCaptureFixture
                                                           ) -> None:
    first = await shell_serving_lv_a(vg, shells)
    os.kill(first, signal.SIGKILL)
    await wait_gone(first)
    with caplog.at_level(logging.WARNING, logger="pvestord.adapters.lvmshell"):
        await lvm.extend(vg.name, "a", 16 * MiB, shells=shells)
    assert vg.lv_size("a") == 16 * MiB
    assert shells.pids()[vg.name] != first
    assert "starting a new lvm shell" in caplog.text


async def test_a_command_over_its_budget_kills_the_shell_and_the_next_works(
        vg: VG, shells: LvmShells) -> None:
    first = await shell_serving_lv_a(vg, shells)
    with holding_vg_lock(vg):
        with pytest.raises(lvm.LvmError, match="timed out after 3 s"):
            await lvm.extend(vg.name, "a", 16 * MiB, timeout=3, shells=shells)
        await wait_gone(first)
    assert vg.lv_size("a") == 8 * MiB
    # The caller retries, as pvestord does with the entry still queued.
    await lvm.extend(vg.name, "a", 16 * MiB, shells=shells)
    assert vg.lv_size("a") == vg.device_size("a") == 16 * MiB
    assert shells.pids()[vg.name] != first


async def test_a_shell_killed_during_a_command_fails_that_command_only(
        vg: VG, shells: LvmShells) -> None:
    first = await shell_serving_lv_a(vg, shells)
    with holding_vg_lock(vg):
        extension = asyncio.create_task(lvm.extend(vg.name, "a", 16 * MiB, shells=shells))
        await wait_until_async(lambda: waiting_on_a_file_lock(first), 60,
                               "lvextend in the shell waiting for the VG lock")
        assert not extension.done()
        os.kill(first, signal.SIGKILL)
        # Whether it had its effect is unknown to the shell's caller: an error, not a retry.
        with pytest.raises(lvm.LvmError, match="lvm shell"):
            await extension
    await lvm.extend(vg.name, "a", 16 * MiB, shells=shells)
    assert vg.lv_size("a") == 16 * MiB


async def test_without_its_profile_lvm_runs_as_processes(vg: VG,
                                                         caplog: pytest.LogCaptureFixture
                                                         ) -> None:
    shells = LvmShells(profile="pvestord-not-installed")
    try:
        vg.create_lv("a", 8 * MiB)
        with caplog.at_level(logging.WARNING, logger="pvestord.adapters.lvmshell"):
            assert (await lvm.lv_info(vg.name, "a", shells=shells)).size == 8 * MiB
            await lvm.extend(vg.name, "a", 16 * MiB, shells=shells)
            with pytest.raises(lvm.VgFullError):
                await lvm.extend(vg.name, "a", 64 * 1024 * MiB, shells=shells)
        assert vg.lv_size("a") == 16 * MiB
        assert shells.pids() == {}
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1, warnings
        assert "pvestord-not-installed" in warnings[0]
        assert "as separate processes" in warnings[0]
    finally:
        await shells.close()
