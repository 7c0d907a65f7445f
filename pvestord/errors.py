"""The root of every error pvestord raises on purpose.

Callers that want "anything that went wrong in our code, with a readable
message" catch :class:`PvestordError`; the CLI prints it as ``prog: message``
and exits 1, the daemons log it and carry on or exit 1. A wrapped cause is kept
as ``__cause__`` (``raise ... from err``); :class:`asyncio.CancelledError` is
never wrapped.
"""

from __future__ import annotations


class PvestordError(Exception):
    """Base class of every deliberate pvestord error."""


class PassDeferred(PvestordError):
    """Not a failure: a VM's pass stops here and comes back later.

    The VM is in a migration's state, its extensions wait for a migration to
    end, or a drive's LV is unknown until the next look. The pass backs the VM
    off briefly and counts no error. Not a :class:`~pvestord.adapters.qmp.QmpError`:
    a handler of failed QMP conversations must not take a deferral for one.
    """


class ConfigError(PvestordError):
    """A configuration file or option has a value we cannot use."""


class CommandError(PvestordError):
    """An external command failed: says the command, exit status and stderr."""

    def __init__(self, argv: list[str], returncode: int | None, stderr: str,
                 *, timed_out: bool = False, timeout: float | None = None) -> None:
        self.argv = argv
        self.returncode = returncode
        self.stderr = stderr
        self.timed_out = timed_out
        self.timeout = timeout
        what = (f"timed out after {timeout:g} s" if timed_out
                else f"exited with status {returncode}")
        detail = stderr.strip().splitlines()[-1] if stderr.strip() else "no stderr"
        super().__init__(f"{argv[0]} {what}: {detail} (command: {' '.join(argv)})")
