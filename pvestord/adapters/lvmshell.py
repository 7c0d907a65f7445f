"""A persistent ``lvm`` shell per VG: LVM's start-up paid once, not per command.

Most of an ``lvextend``'s time on a node is LVM starting: reading its
configuration, loading its libraries, finding devices (docs/design.md, "LVM";
``bench/lvm_shell.py`` measures it). ``lvm`` with no arguments is a shell that
keeps that state between commands, and lvmdbusd keeps one for the same reason.
We talk to it the way lvmdbusd does:

- The shell starts with ``LVM_COMMAND_PROFILE=pvestord``
  (``/etc/lvm/profile/pvestord.profile``, shipped by the package), which turns
  on JSON reports and LVM's command log report. Inside the shell neither can
  be set per command with ``--config`` (LVM says "not allowed here").
- ``LVM_REPORT_FD`` sends each command's report to a pipe of ours: one JSON
  document per command, whose ``log`` ends with the command's own status
  (``log_context`` ``shell``, ``log_ret_code`` 1 for success). That is how we
  know that a command finished and whether it worked: the shell prints no
  prompt and no exit status.

LVM re-reads the metadata from disk for each command in the shell, as a new
process would, so a change made by another node is seen (the node tests check
it). The shell keeps no LVM lock between commands.

Failures, and what they mean for the caller:

- The shell cannot start (no profile, no ``lvm``): :class:`LvmShells` runs the
  command as a plain process instead and says so in the log, at most once a
  minute. The shell is an optimisation, never a requirement.
- A command fails in LVM: :class:`~pvestord.errors.CommandError` with LVM's
  error messages, exactly as a plain command's failure.
- A command overruns its budget, or the shell dies or answers nonsense during
  a command: the shell is killed (its whole process group) and the call fails
  as a plain command would; the next call starts a new shell. We do not run
  the command again in a plain process, because whether it had its effect is
  unknown; the caller's retry decides, as after any failed command (pvestord's
  extensions are to absolute sizes, so a retry is safe).
- The killed shell does not end within
  :data:`~pvestord.adapters.command.KILL_WAIT` (D state): the wait is given up and
  the call raises :class:`~pvestord.adapters.command.UnkillableCommandError` naming
  its pid; the storage lock's holder then marks the VG and keeps the lock
  (:class:`pvestord.adapters.locks.VgLock`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pvestord.adapters import tally
from pvestord.adapters.command import (
    KILL_WAIT,
    Completed,
    StuckProcess,
    UnkillableCommandError,
    binary,
    kill_group,
    run_async,
    stuck_processes,
)
from pvestord.errors import CommandError, PvestordError

log = logging.getLogger(__name__)

#: The LVM command profile the shell runs with (``<profile_dir>/pvestord.profile``).
PROFILE = "pvestord"
#: LVM's ``ECMD_PROCESSED``: the command did what it was asked.
ECMD_PROCESSED = 1
#: How long a shell may take to start and answer its first command.
START_TIMEOUT = 30.0
#: After a shell failed to start, plain commands for this long before trying again.
RETRY_START_AFTER = 60.0
#: An argument that needs no quoting on the shell's command line.
_BARE = re.compile(r"^[^\s\"'\\]+$")
#: One that double quotes make a single word (LVM's own splitting of the line).
_QUOTABLE = re.compile(r"^[^\"'\\\n\r]*$")
#: Lines of the shell's stderr kept for error messages.
STDERR_LINES = 20
#: Options our commands carry for a plain ``lvm`` process that the shell's
#: profile sets already. LVM 2.03.31 (Proxmox VE 9's) refuses them in the
#: shell ("Argument --reportformat cannot be used in interactive mode") and
#: fails the command; 2.03.16 took them.
SET_BY_PROFILE = {"--reportformat": "json"}


class LvmShellError(PvestordError):
    """The shell itself failed: it would not start, died, or broke the protocol."""


class _NotDelivered(LvmShellError):
    """The shell was gone before it could read the command: sending it again is safe."""


def report_errors(stdout: str) -> list[str]:
    """The error messages in the command log of a JSON report on ``stdout``.

    lvm2 2.03.31 (Proxmox VE 9's) writes a failing ``--reportformat json``
    command's errors there, in the report's ``log``, and nothing to stderr
    ("Volume group ... not found", "Failed to find logical volume" included);
    2.03.16 wrote them to stderr.
    """
    try:
        document = json.loads(stdout)
    except ValueError:
        return []
    entries = document.get("log") if isinstance(document, dict) else None
    if not isinstance(entries, list):
        return []
    return [str(entry.get("log_message", "")) for entry in entries
            if isinstance(entry, dict) and entry.get("log_type") == "error"]


async def run_lvm_process(argv: Sequence[str], *, timeout: float,  # noqa: ASYNC109
                          check: bool = True) -> Completed:
    """``argv`` as a plain ``lvm`` process; a failure's :class:`CommandError`
    carries LVM's error messages from stderr or, where LVM put them, from
    its JSON report's log (:func:`report_errors`), as a shell's answer does."""
    done = await run_async(argv, timeout=timeout, check=False)
    if done.returncode != 0 and check:
        errors = done.stderr if done.stderr.strip() else "\n".join(
            f"  {message}" for message in report_errors(done.stdout))
        raise CommandError(list(argv), done.returncode, errors)
    return done


def command_line(args: Sequence[str]) -> str:
    """``args`` as one line for the shell; :class:`ValueError` if it cannot be said.

    LVM splits the line on white space, and double quotes group words. Our
    arguments are options, sizes, checked VG/LV names and ``--config``
    strings; a quote, a backslash or a line break in one is refused rather
    than escaped, since LVM's splitting has no escapes. An option the
    profile sets (:data:`SET_BY_PROFILE`) is left out when it asks for the
    profile's value, and refused when it asks for another.
    """
    words: list[str] = []
    rest = iter(args)
    for arg in rest:
        if arg in SET_BY_PROFILE:
            value = next(rest, None)
            if value != SET_BY_PROFILE[arg]:
                raise ValueError(f"argument {arg} {value} cannot be passed to the lvm shell,"
                                 f" whose profile sets {SET_BY_PROFILE[arg]}")
            continue
        if _BARE.match(arg):
            words.append(arg)
        elif _QUOTABLE.match(arg):
            words.append(f'"{arg}"')
        else:
            raise ValueError(f"argument {arg!r} cannot be passed to the lvm shell")
    return " ".join(words) + "\n"


def command_status(document: dict[str, Any], command: str) -> tuple[int, list[str]]:
    """(``log_ret_code`` of ``command``, its error messages) from one report document.

    :raise LvmShellError: the document has no status of ``command`` (the shell
        and we disagree about which command it answers).
    """
    entries = document.get("log")
    if not isinstance(entries, list) or not entries:
        raise LvmShellError(f"lvm shell answered {command} without a command log: "
                            f"{json.dumps(document)[:300]}")
    last = entries[-1]
    if not (isinstance(last, dict) and last.get("log_context") == "shell"
            and last.get("log_type") == "status" and last.get("log_object_name") == command):
        raise LvmShellError(f"lvm shell's last log entry is not the status of {command}: "
                            f"{last!r}")
    try:
        status = int(last["log_ret_code"])
    except (KeyError, TypeError, ValueError) as err:
        raise LvmShellError(f"lvm shell's status of {command} is unreadable: {last!r}") from err
    errors = [str(e.get("log_message", "")) for e in entries
              if isinstance(e, dict) and e.get("log_type") == "error"]
    return status, errors


@dataclass(frozen=True)
class Answer:
    """What the shell said to one command."""

    #: LVM's ``log_ret_code`` of the command (:data:`ECMD_PROCESSED`: success).
    status: int
    #: LVM's error messages, in order.
    errors: list[str]
    #: The command's report document (JSON text).
    document: str


class ReportPipe:
    """Our end of the shell's ``LVM_REPORT_FD``: one JSON document per command.

    The shell writes each command's report when the command ends, in as many
    pieces as it likes; a document is complete when it decodes.
    """

    def __init__(self, reader: asyncio.StreamReader, transport: asyncio.ReadTransport) -> None:
        self._reader = reader
        self._transport = transport
        self._buffer = ""
        self._decoder = json.JSONDecoder()

    @classmethod
    async def open(cls, read_end: int) -> ReportPipe:
        """Read the pipe ``read_end`` (which this takes over) on the running loop."""
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=1 << 20)
        transport, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(read_end, "rb", buffering=0))
        return cls(reader, transport)

    async def next_document(self) -> str:
        """The next complete JSON document from the pipe, as text.

        :raises LvmShellError: the pipe ended (the shell exited).
        """
        while True:
            text = self._buffer.lstrip()
            if text.endswith("}\n") or text.endswith("}"):
                try:
                    _, end = self._decoder.raw_decode(text)
                except ValueError:
                    pass
                else:
                    self._buffer = text[end:]
                    return text[:end]
            chunk = await self._reader.read(65536)
            if not chunk:
                raise LvmShellError("the shell exited")
            self._buffer += chunk.decode(errors="replace")

    def close(self) -> None:
        self._transport.close()


class LvmShell:
    """One ``lvm`` shell process; :meth:`run` sends one command at a time."""

    def __init__(self, name: str, profile: str = PROFILE) -> None:
        #: For log messages: the VG this shell serves.
        self.name = name
        self.profile = profile
        self._lock = asyncio.Lock()
        self._proc: asyncio.subprocess.Process | None = None
        self._reports: ReportPipe | None = None
        self._stderr: deque[str] = deque(maxlen=STDERR_LINES)
        self._drains: list[asyncio.Task[None]] = []

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.returncode is None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    async def start(self) -> None:
        """Start the shell (unless it runs) and check that it answers;
        :class:`LvmShellError` if not."""
        async with self._lock:
            await self._ensure_started()

    async def _ensure_started(self) -> None:
        """A running shell: this one, or a new one if it exited since its last command."""
        if self._proc is not None and self._proc.returncode is not None:
            log.warning("lvm shell for %s exited with status %d since its last command; "
                        "starting a new lvm shell", self.name, self._proc.returncode)
            await self._kill()
        if not self.running:
            await self._start()

    async def _start(self) -> None:
        read_end, write_end = os.pipe()
        env = dict(os.environ, LC_ALL="C", LVM_REPORT_FD=str(write_end),
                   LVM_COMMAND_PROFILE=self.profile,
                   # LVM stops logging to its log file after a number of lines
                   # per process, which a long-lived shell reaches.
                   LVM_LOG_FILE_MAX_LINES="0")
        tally.started("lvm")
        try:
            self._proc = await asyncio.create_subprocess_exec(
                binary("lvm"), stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                pass_fds=(write_end,), env=env, start_new_session=True)
        except OSError as err:
            os.close(read_end)
            raise LvmShellError(f"cannot start the lvm shell: {err}") from err
        finally:
            os.close(write_end)
        self._reports = await ReportPipe.open(read_end)
        self._stderr.clear()
        assert self._proc.stdout is not None and self._proc.stderr is not None
        self._drains = [asyncio.create_task(_drain(self._proc.stdout, None)),
                        asyncio.create_task(_drain(self._proc.stderr, self._stderr))]
        try:
            answer = await self._send(["version"], START_TIMEOUT)
        except (LvmShellError, CommandError) as err:
            await self._kill()
            raise LvmShellError(f"lvm shell did not start: {err}") from err
        if answer.status != ECMD_PROCESSED:
            await self._kill()
            raise LvmShellError(f"lvm shell did not start: version failed: {answer.errors}")
        log.debug("lvm shell for %s started (pid %d)", self.name, self._proc.pid)

    async def run(self, argv: Sequence[str], *, timeout: float,  # noqa: ASYNC109
                  check: bool = True) -> Completed:
        """Run ``argv`` (``[lvm, command, args...]``) in the shell, as
        :func:`pvestord.adapters.command.run_async` would run it as a process.

        ``stdout`` of the result is the report document (JSON, with the same
        ``report`` list as a plain ``--reportformat json`` command);
        ``stderr`` is LVM's error messages.
        """
        args = list(argv)
        async with self._lock:
            try:
                await self._ensure_started()
                answer = await self._send(args[1:], timeout, argv=args)
            except _NotDelivered as err:
                # It died between two commands (killed, OOM): it never saw this one.
                log.warning("%s; starting a new lvm shell", err)
                await self._start()
                answer = await self._send(args[1:], timeout, argv=args)
        stderr = "\n".join(f"  {message}" for message in answer.errors)
        returncode = 0 if answer.status == ECMD_PROCESSED else answer.status
        done = Completed(args, answer.document, stderr, returncode)
        if check and returncode != 0:
            raise CommandError(args, returncode, stderr)
        return done

    async def _send(self, args: Sequence[str], timeout: float,  # noqa: ASYNC109
                    argv: Sequence[str] | None = None) -> Answer:
        """Write one command, read its report document; (status, error messages)."""
        shown = list(argv) if argv is not None else ["lvm", *args]
        proc = self._proc
        assert proc is not None and proc.stdin is not None
        line = command_line(args)
        started = time.monotonic()
        try:
            # A pipe whose reader is gone refuses the write: nothing was sent.
            # One line never fills the pipe, so drain() does not wait for the shell.
            proc.stdin.write(line.encode())
            await proc.stdin.drain()
        except OSError as err:
            await self._kill()
            raise _NotDelivered(f"lvm shell for {self.name} did not take {args[0]}: "
                                f"{err or type(err).__name__}") from err
        assert self._reports is not None
        try:
            async with asyncio.timeout(timeout):
                document = await self._reports.next_document()
        except TimeoutError:
            await self._kill(shown, timeout)
            raise CommandError(shown, None, self._stderr_text(), timed_out=True,
                               timeout=timeout) from None
        except (OSError, LvmShellError) as err:
            await self._kill(shown)
            raise LvmShellError(f"lvm shell for {self.name} failed during "
                                f"{' '.join(args[:1])}: {err}; stderr: "
                                f"{self._stderr_text() or '(none)'}") from err
        except asyncio.CancelledError:
            # The command's end is unknown: the next caller must not read its report.
            try:
                await asyncio.shield(self._kill(shown))
            except UnkillableCommandError as left:
                # Still a cancellation, saying what it left behind.
                raise asyncio.CancelledError(str(left)) from left
            raise
        try:
            status, errors = command_status(json.loads(document), args[0])
        except (ValueError, LvmShellError) as err:
            await self._kill()
            raise LvmShellError(f"lvm shell for {self.name}: {err}") from err
        log.debug("lvm shell %s: %s -> %d in %.3f s", self.name, args[0], status,
                  time.monotonic() - started)
        return Answer(status, errors, document)

    def _stderr_text(self) -> str:
        return "\n".join(self._stderr)

    async def close(self, timeout: float = 10.0) -> None:  # noqa: ASYNC109
        """Ask the shell to exit; kill it if it does not."""
        proc = self._proc
        if proc is None:
            return
        if proc.returncode is None and proc.stdin is not None:
            with contextlib.suppress(OSError):
                proc.stdin.write(b"exit\n")
                await proc.stdin.drain()
                proc.stdin.close()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(proc.wait(), timeout)
        await self._kill()

    async def _kill(self, argv: Sequence[str] | None = None,
                    timeout: float | None = None) -> None:  # noqa: ASYNC109
        """Kill the shell's process group; wait at most :data:`KILL_WAIT` for it.

        :raise UnkillableCommandError: the shell is still there after that
            (D state): its command (``argv``, which overran ``timeout``) may
            still act. The shell is forgotten all the same.
        """
        proc, self._proc = self._proc, None
        stuck: tuple[StuckProcess, ...] | None = None
        if proc is not None:
            if proc.returncode is None:
                kill_group(proc.pid)
                try:
                    async with asyncio.timeout(KILL_WAIT):
                        await asyncio.shield(proc.wait())
                except TimeoutError:
                    stuck = stuck_processes(proc.pid)
            if proc.stdin is not None:
                proc.stdin.close()
        if self._reports is not None:
            self._reports.close()
        for task in self._drains:
            task.cancel()
        await asyncio.gather(*self._drains, return_exceptions=True)
        self._drains = []
        self._reports = None
        if stuck is not None:
            shown = list(argv) if argv is not None else [binary("lvm"), "(shell)"]
            log.error("lvm shell for %s did not end within %g s of SIGKILL: pid %s still "
                      "running", self.name, KILL_WAIT,
                      ", ".join(str(p.pid) for p in stuck) or "?")
            raise UnkillableCommandError(shown, self._stderr_text(), timeout=timeout,
                                         stuck=stuck)


async def _drain(stream: asyncio.StreamReader, keep: deque[str] | None) -> None:
    """Read ``stream`` to its end so that the shell never blocks on a full pipe."""
    while line := await stream.readline():
        if keep is not None:
            keep.append(line.decode(errors="replace").rstrip())


class LvmShells:
    """One :class:`LvmShell` per VG, started on first use.

    Per VG because pvestord runs extensions of different VGs at the same
    time; one shell would put them back in one line. Each shell runs one
    command at a time, as the per-VG gate would anyway.
    """

    def __init__(self, profile: str = PROFILE) -> None:
        self.profile = profile
        self._shells: dict[str, LvmShell] = {}
        #: When the last start failed (monotonic): plain commands until the retry.
        self._failed_at: float | None = None
        #: Shell starts, for the metrics: more than one per VG is a restart.
        self.starts = 0

    async def run(self, vg: str, argv: Sequence[str], *, timeout: float,  # noqa: ASYNC109
                  check: bool = True) -> Completed:
        """Run ``argv`` in ``vg``'s shell, or as a process while shells cannot start."""
        try:
            command_line(argv[1:])
        except ValueError:
            return await run_lvm_process(argv, timeout=timeout, check=check)
        if self._failed_at is not None:
            if time.monotonic() - self._failed_at < RETRY_START_AFTER:
                return await run_lvm_process(argv, timeout=timeout, check=check)
            self._failed_at = None
        shell = self._shells.get(vg)
        if shell is None:
            shell = self._shells[vg] = LvmShell(vg, self.profile)
        if not shell.running:
            self.starts += 1
            try:
                await shell.start()
            except LvmShellError as err:
                self._failed_at = time.monotonic()
                log.warning("%s; running LVM commands as separate processes for %g s (is "
                            "/etc/lvm/profile/%s.profile installed?)", err, RETRY_START_AFTER,
                            self.profile)
                return await run_lvm_process(argv, timeout=timeout, check=check)
        return await shell.run(argv, timeout=timeout, check=check)

    def pids(self) -> dict[str, int]:
        """The running shells' process ids, by VG: for tests and ``status``."""
        return {vg: pid for vg, s in self._shells.items() if (pid := s.pid) is not None
                and s.running}

    async def close(self) -> None:
        await asyncio.gather(*(s.close() for s in self._shells.values()),
                             return_exceptions=True)
        self._shells.clear()
