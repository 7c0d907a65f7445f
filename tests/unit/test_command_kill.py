"""The wait after killing a command is bounded, even for a command that
survives SIGKILL: real processes.

SIGKILL cannot be ignored, so a command that "survives" it is produced in the
two ways that exist:

- a descendant that left the command's process group (``setsid``) and holds
  its output pipes: real here, exactly what ``communicate()`` used to wait
  for without end;
- a process in uninterruptible sleep (D state: ``lvm`` on a SAN path that
  queues I/O). That cannot be produced without a stuck device, so one test
  replaces ``kill_group`` with :func:`sigkill_lost_in_d_state`, a kill that
  does nothing, and the real process it was meant for runs on.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pvestord.adapters import command
from pvestord.adapters.command import KILL_WAIT, UnkillableCommandError, run_async
from pvestord.errors import CommandError
from tests.harness.faults import alive
from tests.harness.polling import wait_until_async

#: Slack for a loaded test machine on top of the timeout and the kill wait.
SLACK = 10.0

#: A command that starts a descendant in its own session, which inherits (and
#: so holds) stdout and stderr, writes its pid to a file, and sleeps.
ESCAPER = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                         start_new_session=True)
open(sys.argv[1], "w").write(str(child.pid))
time.sleep(120)
"""

#: The same descendant, left in the command's process group.
STAYER = ESCAPER.replace("start_new_session=True", "start_new_session=False")


@contextlib.contextmanager
def reaped(pid_file: Path) -> Iterator[None]:
    """Kill whatever pid the command wrote, whatever the test's outcome."""
    try:
        yield
    finally:
        with contextlib.suppress(FileNotFoundError, ValueError, ProcessLookupError):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)


def sigkill_lost_in_d_state(pid: int) -> None:
    """Stands in for a SIGKILL to a process in D state: it has no effect (yet)."""


async def test_a_descendant_holding_the_pipes_after_sigkill_is_not_waited_for(
        tmp_path: Path) -> None:
    pid_file = tmp_path / "descendant"
    with reaped(pid_file):
        started = time.monotonic()
        with pytest.raises(UnkillableCommandError) as info:
            await asyncio.wait_for(run_async([sys.executable, "-c", ESCAPER, str(pid_file)],
                                             timeout=1.0), 1.0 + KILL_WAIT + SLACK)
        took = time.monotonic() - started
        descendant = int(pid_file.read_text())
        assert descendant in info.value.pids
        assert info.value.timed_out and info.value.timeout == 1.0
        assert took >= 1.0 + KILL_WAIT * 0.9
        assert all(p.alive() for p in info.value.stuck if p.pid == descendant)
        os.kill(descendant, signal.SIGKILL)
        # Polled: the descendant is no child of ours to wait for.
        await wait_until_async(lambda: not any(p.alive() for p in info.value.stuck), SLACK,
                               "the killed descendant gone")


async def test_a_command_and_its_group_killed_at_the_timeout_is_a_plain_timeout(
        tmp_path: Path) -> None:
    pid_file = tmp_path / "descendant"
    with reaped(pid_file):
        with pytest.raises(CommandError) as info:
            await asyncio.wait_for(run_async([sys.executable, "-c", STAYER, str(pid_file)],
                                             timeout=1.0), 1.0 + KILL_WAIT + SLACK)
        # Not unkillable: the descendant died with the group, so nothing held
        # the pipes and the kill wait ended with the command.
        assert not isinstance(info.value, UnkillableCommandError)
        assert info.value.timed_out
        descendant = int(pid_file.read_text())
        await wait_until_async(lambda: not alive(descendant), SLACK, "the group's descendant gone")


async def test_a_process_sigkill_does_not_end_is_not_waited_for(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(command, "kill_group", sigkill_lost_in_d_state)
    pid_file = tmp_path / "self"
    script = "import os, sys, time; open(sys.argv[1], 'w').write(str(os.getpid())); " \
             "time.sleep(120)"
    with reaped(pid_file):
        with pytest.raises(UnkillableCommandError) as info:
            await asyncio.wait_for(run_async([sys.executable, "-c", script, str(pid_file)],
                                             timeout=1.0), 1.0 + KILL_WAIT + SLACK)
        assert int(pid_file.read_text()) in info.value.pids
        assert "may still act" in str(info.value)


async def test_output_and_status_still_come_back(tmp_path: Path) -> None:
    done = await run_async([sys.executable, "-c", "import sys; print('out'); "
                            "print('err', file=sys.stderr); sys.exit(3)"],
                           timeout=30, check=False)
    assert (done.stdout, done.stderr, done.returncode) == ("out\n", "err\n", 3)
    echoed = await run_async(["cat"], timeout=30, input="fed\n")
    assert echoed.stdout == "fed\n"
    with pytest.raises(CommandError) as info:
        await run_async([sys.executable, "-c", "import sys; sys.exit(2)"], timeout=30)
    assert info.value.returncode == 2
