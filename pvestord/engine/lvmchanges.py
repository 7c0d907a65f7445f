"""The LVM commands that change a VG, running now for a pass.

The pass deadline marks a VM's VGs unhealthy only while one of these runs
(:mod:`pvestord.engine.passes`): a command cut off there may have left the
metadata or a table half changed. A pass that was waiting for QMP or for the
storage lock changed nothing, so it is not counted here.

A change that did not end on its own (killed at its timeout, or cut off with
its pass) may have been killed between the suspend and the resume of its LV's
table: such LVs are noted (:meth:`LvmChanges.take_killed`) for the check of
suspended LVs (:mod:`pvestord.engine.suspension`), which is woken at once.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator

from pvestord.adapters.locks import unkillable_cause
from pvestord.errors import CommandError


def _killed(exc: BaseException) -> bool:
    """Whether ``exc`` says our command was killed and has ended: a timeout,
    or a cancellation (ours kills the command). One that SIGKILL did not end
    may still resume its LV itself: it is the custodian's, not ours."""
    if unkillable_cause(exc) is not None:
        return False
    if isinstance(exc, asyncio.CancelledError):
        return True
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, CommandError) and cause.timed_out:
            return True
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return False


class LvmChanges:
    """The drives, by (vmid, file node), whose ``lvextend`` or ``lvchange``
    runs right now."""

    def __init__(self, on_killed: Callable[[], None] | None = None) -> None:
        self._running: set[tuple[int, str]] = set()
        self._killed: set[tuple[str, str]] = set()
        self.on_killed = on_killed

    @contextlib.contextmanager
    def running(self, vmid: int, node: str, lv: tuple[str, str] | None = None) -> Iterator[None]:
        """Around one command that changes the VG for ``node`` of ``vmid``;
        ``lv``: the (VG, LV) whose table it reloads."""
        key = (vmid, node)
        self._running.add(key)
        try:
            yield
        except BaseException as exc:
            if lv is not None and _killed(exc):
                self._killed.add(lv)
                if self.on_killed is not None:
                    self.on_killed()
            raise
        finally:
            self._running.discard(key)

    def of_vm(self, vmid: int) -> bool:
        """Whether a command that changes a VG runs for ``vmid`` now."""
        return any(key[0] == vmid for key in self._running)

    def vms(self) -> set[int]:
        """The VMs with a command that changes a VG running now."""
        return {key[0] for key in self._running}

    def take_killed(self) -> set[tuple[str, str]]:
        """The (VG, LV)s whose change of ours was killed since the last call."""
        killed, self._killed = self._killed, set()
        return killed
