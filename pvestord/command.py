"""Running external commands: argument lists, a timeout, checked output.

Never a shell. Every call names its timeout; a command that overruns it is
killed (its whole process group, since LVM tools may fork) and reported as a
:class:`~pvestord.errors.CommandError` with ``timed_out`` set. Binaries can be
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
from collections.abc import Sequence
from dataclasses import dataclass

from pvestord.errors import CommandError

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


# The timeout is ours, not the caller's asyncio.timeout: an overrun must kill
# the process group and say "timed out" with the command's stderr.
async def run_async(argv: Sequence[str], *, timeout: float, check: bool = True,  # noqa: ASYNC109
                    input: str | None = None) -> Completed:
    """Run ``argv`` without blocking the event loop; kill it if it overruns ``timeout``."""
    args = list(argv)
    log.debug("run: %s", args)
    try:
        proc = await asyncio.create_subprocess_exec(
            *args,
            stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
        )
    except OSError as err:
        raise CommandError(args, None, str(err)) from err
    try:
        async with asyncio.timeout(timeout):
            out, err_out = await proc.communicate(
                input.encode() if input is not None else None)
    except TimeoutError:
        kill_group(proc.pid)
        _, err_out = await proc.communicate()
        raise CommandError(args, None, err_out.decode(errors="replace"),
                           timed_out=True, timeout=timeout) from None
    except asyncio.CancelledError:
        kill_group(proc.pid)
        with contextlib.suppress(Exception):
            await asyncio.shield(proc.wait())
        raise
    assert proc.returncode is not None
    done = Completed(args, out.decode(errors="replace"), err_out.decode(errors="replace"),
                     proc.returncode)
    if check and proc.returncode != 0:
        raise CommandError(args, proc.returncode, done.stderr)
    return done


def kill_group(pid: int) -> None:
    """SIGKILL the process group ``pid`` leads (started with ``start_new_session``)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
