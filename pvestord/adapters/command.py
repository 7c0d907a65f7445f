"""Running external commands: argument lists, a timeout, checked output.

Never a shell. Every call names its timeout; a command that overruns it is
killed (its whole process group, since LVM tools may fork) and reported as a
:class:`~pvestord.errors.CommandError` with ``timed_out`` set. The wait for
the killed command's end is bounded too (:data:`KILL_WAIT`): one that is still
there raises :class:`UnkillableCommandError`, naming what is left of it. Binaries can be
overridden through the environment (``PVESTORD_LVM``, ``PVESTORD_QEMU_IMG``),
as ovirt-imageio does, so the fault tests can put a misbehaving wrapper in the
way.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from pvestord.adapters import budgets, tally
from pvestord.errors import CommandError
from pvestord.policy.procstat import fields_after_name

log = logging.getLogger(__name__)


def binary(name: str) -> str:
    """The path to run for tool ``name`` (``lvm``, ``qemu-img``), honouring overrides."""
    env = "PVESTORD_" + name.upper().replace("-", "_")
    return os.environ.get(env, name)


@dataclass(frozen=True)
class Completed:
    argv: list[str]
    stdout: str
    stderr: str
    returncode: int


def run(argv: Sequence[str], *, timeout: float, check: bool = True,
        input: str | None = None) -> Completed:
    """Run ``argv`` to completion (blocking); for the CLI and tests."""
    args = list(argv)
    log.debug("run: %s", args)
    tally.started(args[0])
    try:
        proc = subprocess.run(  # noqa: S603 - argument list, no shell
            args, input=input, capture_output=True, text=True, timeout=timeout,
            stdin=None if input is not None else subprocess.DEVNULL,
            start_new_session=True, check=False,
        )
    except subprocess.TimeoutExpired as err:
        stderr = err.stderr.decode(errors="replace") if isinstance(err.stderr, bytes) else ""
        raise CommandError(args, None, stderr, timed_out=True, timeout=timeout) from err
    except OSError as err:
        raise CommandError(args, None, str(err)) from err
    done = Completed(args, proc.stdout, proc.stderr, proc.returncode)
    if check and proc.returncode != 0:
        raise CommandError(args, proc.returncode, proc.stderr)
    return done


#: After SIGKILL, how long the command's process, and anything else holding its
#: output pipes, get to go away (:data:`pvestord.adapters.budgets.KILL_WAIT`).
KILL_WAIT = budgets.KILL_WAIT


@dataclass(frozen=True)
class StuckProcess:
    """A process that outlived our SIGKILL: its pid and its start time (in
    clock ticks since boot, ``/proc/<pid>/stat`` field 22), so that a pid
    reused by a new process is not mistaken for it."""

    pid: int
    start_ticks: int

    def alive(self) -> bool:
        """Still the same process, and not a zombie waiting to be reaped."""
        found = process_stat(self.pid)
        return found is not None and found[1] == self.start_ticks and found[0] != "Z"


class UnkillableCommandError(CommandError):
    """A command overran its timeout and did not go away after SIGKILL within
    :data:`KILL_WAIT`: it (or a descendant holding its output) may still be
    running, and may still act (an ``lvm`` in D state writes its metadata
    once its I/O completes). ``stuck`` says which processes to watch."""

    def __init__(self, argv: list[str], stderr: str, *, timeout: float | None,
                 stuck: tuple[StuckProcess, ...]) -> None:
        self.stuck = stuck
        pids = ", ".join(str(p.pid) for p in stuck) or "unknown"
        super().__init__(argv, None, stderr, timed_out=timeout is not None, timeout=timeout)
        self.args = (f"{self.args[0]}; still running {KILL_WAIT:g} s after SIGKILL "
                     f"(pid {pids}): it may still act",)

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.stuck]

    def __str__(self) -> str:
        return str(self.args[0])


def process_stat(pid: int) -> tuple[str, int, int] | None:
    """(state, start time in ticks, process group) of ``pid``, or None if it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = fields_after_name(text)
    try:
        return fields[0], int(fields[19]), int(fields[2])
    except (IndexError, ValueError):
        return None


def stuck_processes(pid: int, pipe_inodes: Sequence[int] = ()) -> tuple[StuckProcess, ...]:
    """What is left of a command started as process group ``pid``: the
    process itself if it has not exited, the members of its process group,
    and any process holding one of the pipes ``pipe_inodes`` (a descendant
    that left the group with ``setsid``)."""
    wanted = {f"pipe:[{inode}]" for inode in pipe_inodes}
    found: dict[int, StuckProcess] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        other = int(entry.name)
        if other == os.getpid():
            continue
        stat = process_stat(other)
        if stat is None or stat[0] == "Z":
            continue
        member = other == pid or stat[2] == pid
        if not member and wanted:
            with contextlib.suppress(OSError):
                member = any(os.readlink(fd) in wanted for fd in (entry / "fd").iterdir())
        if member:
            found[other] = StuckProcess(other, stat[1])
    return tuple(found[p] for p in sorted(found))


# The timeout is ours, not the caller's asyncio.timeout: an overrun must kill
# the process group and say "timed out" with the command's stderr.
async def run_async(argv: Sequence[str], *, timeout: float, check: bool = True,  # noqa: ASYNC109
                    input: str | None = None) -> Completed:
    """Run ``argv`` without blocking the event loop; kill it if it overruns ``timeout``.

    After the kill, the wait for its end is bounded by :data:`KILL_WAIT`;
    a command that outlives it raises :class:`UnkillableCommandError`.
    Our own pipes, not :meth:`asyncio.subprocess.Process.communicate`'s, so
    that we know their inodes and can name whoever still holds them.
    """
    args = list(argv)
    log.debug("run: %s", args)
    loop = asyncio.get_running_loop()
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    inodes = (os.fstat(out_r).st_ino, os.fstat(err_r).st_ino)
    tally.started(args[0])
    try:
        proc = await asyncio.create_subprocess_exec(
            *args,
            stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
            stdout=out_w, stderr=err_w, start_new_session=True,
        )
    except OSError as err:
        for fd in (out_r, out_w, err_r, err_w):
            os.close(fd)
        raise CommandError(args, None, str(err)) from err
    finally:
        with contextlib.suppress(OSError):
            os.close(out_w)
        with contextlib.suppress(OSError):
            os.close(err_w)
    readers = [asyncio.StreamReader(), asyncio.StreamReader()]
    transports: list[asyncio.ReadTransport] = []
    for fd, reader in zip((out_r, err_r), readers, strict=True):
        transport, _ = await loop.connect_read_pipe(
            _protocol_for(reader), os.fdopen(fd, "rb", buffering=0))
        transports.append(transport)
    outputs = [asyncio.ensure_future(reader.read()) for reader in readers]

    async def finish() -> None:
        if input is not None and proc.stdin is not None:
            with contextlib.suppress(OSError):
                proc.stdin.write(input.encode())
                await proc.stdin.drain()
            proc.stdin.close()
        await asyncio.gather(*outputs)
        await proc.wait()

    def partial_stderr() -> str:
        done = outputs[1]
        if done.done() and not done.cancelled() and done.exception() is None:
            return done.result().decode(errors="replace")
        return ""

    finished = asyncio.ensure_future(finish())
    abandoned = False
    try:
        try:
            async with asyncio.timeout(timeout):
                await asyncio.shield(finished)
        except TimeoutError:
            stuck = await _kill(proc.pid, finished, inodes, args[0],
                                "%s did not end within %g s of SIGKILL: pid %s still running")
            if stuck is not None:
                abandoned = True
                raise UnkillableCommandError(args, partial_stderr(), timeout=timeout,
                                             stuck=stuck) from None
            raise CommandError(args, None, partial_stderr(),
                               timed_out=True, timeout=timeout) from None
        except asyncio.CancelledError:
            stuck = await _kill(proc.pid, finished, inodes, args[0],
                                "%s cancelled and killed, but still running %g s later (pid %s)")
            if stuck is not None:
                abandoned = True
                # Still a cancellation, but one that says what it left behind
                # (the storage lock must not be released under it).
                left = UnkillableCommandError(args, partial_stderr(), timeout=timeout,
                                              stuck=stuck)
                raise asyncio.CancelledError(str(left)) from left
            raise
    finally:
        if abandoned:
            # Keep reading its pipes until it goes: a closed pipe would SIGPIPE
            # a process that may be in the middle of its work.
            _LEFT_BEHIND.add(asyncio.ensure_future(_close_when_done(finished, transports)))
        else:
            finished.cancel()
            for task in outputs:
                task.cancel()
            for transport in transports:
                transport.close()
    out, err_out = (o.result() for o in outputs)
    assert proc.returncode is not None
    done = Completed(args, out.decode(errors="replace"), err_out.decode(errors="replace"),
                     proc.returncode)
    if check and proc.returncode != 0:
        raise CommandError(args, proc.returncode, done.stderr)
    return done


#: Clean-ups of commands that outlived their kill, kept referenced until done.
_LEFT_BEHIND: set[asyncio.Future[None]] = set()


def _protocol_for(reader: asyncio.StreamReader) -> Callable[[], asyncio.StreamReaderProtocol]:
    return lambda: asyncio.StreamReaderProtocol(reader)


async def _kill(pid: int, finished: asyncio.Future[None], pipe_inodes: Sequence[int],
                command: str, still_running: str) -> tuple[StuckProcess, ...] | None:
    """Kill the command's process group (an overrun or a cancellation: both end
    it the same way); None once it ended, else what is left of it, logged with
    ``still_running`` (command, :data:`KILL_WAIT`, pids)."""
    kill_group(pid)
    if await _ended(finished):
        return None
    stuck = stuck_processes(pid, pipe_inodes)
    log.error(still_running, command, KILL_WAIT, ", ".join(str(p.pid) for p in stuck) or "?")
    return stuck


async def _ended(finished: asyncio.Future[None]) -> bool:
    """Whether the killed command ended (exit and pipes closed) within :data:`KILL_WAIT`.

    Shielded, so that a cancellation of the caller does not cut the wait
    short; the wait itself is what is bounded.
    """
    try:
        async with asyncio.timeout(KILL_WAIT):
            await asyncio.shield(finished)
    except TimeoutError:
        return False
    except Exception:  # a failed read still means it ended
        return True
    return True


async def _close_when_done(finished: asyncio.Future[None],
                           transports: list[asyncio.ReadTransport]) -> None:
    try:
        with contextlib.suppress(Exception):
            await finished
    finally:
        for transport in transports:
            transport.close()
        _LEFT_BEHIND.discard(asyncio.current_task())  # type: ignore[arg-type,unused-ignore]


def kill_group(pid: int) -> None:
    """SIGKILL the process group ``pid`` leads (started with ``start_new_session``)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
