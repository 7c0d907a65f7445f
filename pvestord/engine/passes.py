"""The passes in flight: one per VM, each with a deadline, and the watchdog's rule.

A pass past its deadline is abandoned: cancelled, logged at error, the VGs of
its VM marked unhealthy if an LVM change of its own was running
(:mod:`pvestord.adapters.vghealth`), and its VM's slot freed, so the other
VMs, and every other VG, keep being served. A pass whose cancellation does
not take (a command in D state) wedges the engine (:func:`engine_wedged`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable, Coroutine, Iterable
from pathlib import Path
from typing import Any

from pvestord.adapters.config import StorageConfig
from pvestord.adapters.service import fields
from pvestord.adapters.settings import DaemonSettings
from pvestord.adapters.vghealth import VgMarks
from pvestord.engine.memory import Notices, silent
from pvestord.policy.lvnames import chain_vmid
from pvestord.policy.notices import VgMarked, marked_key

log = logging.getLogger(__name__)

#: How long a pass cancelled at its deadline may take to end, and how long
#: past ``pass_deadline`` + ``poll_interval`` the queue loop may go without
#: completing an iteration, before the engine counts as wedged and the
#: watchdog stops being fed. A cancelled pass normally ends at once (QMP and
#: lock waits are cancelled, an LVM command is killed); one that does not is
#: waiting for a process that SIGKILL cannot end.
WEDGE_GRACE = 30.0


def engine_wedged(now: float, *, abandoned: Iterable[tuple[int, float]],
                  running: Iterable[tuple[int, float]], loop_progress: float,
                  pass_deadline: float, poll_interval: float,
                  grace: float = WEDGE_GRACE) -> str | None:
    """Why the engine no longer makes progress, or None while it does.

    Wedged means one of: a pass cancelled at its deadline (``abandoned``:
    VMID, when cancelled) has not ended ``grace`` seconds later; a pass
    (``running``: VMID, when started) has run past its deadline plus
    ``grace`` without being abandoned; the queue loop, which starts every
    pass, has not completed an iteration for ``poll_interval`` +
    ``pass_deadline`` + ``grace`` seconds. An idle daemon is not wedged: its
    queue loop completes an iteration every ``poll_interval``.
    """
    for vmid, cancelled in abandoned:
        if now - cancelled > grace:
            return (f"the pass over VM {vmid} was cancelled at its deadline "
                    f"{now - cancelled:.0f} s ago and has not ended")
    for vmid, started in running:
        if now - started > pass_deadline + grace:
            return f"the pass over VM {vmid} has run for {now - started:.0f} s"
    if now - loop_progress > poll_interval + pass_deadline + grace:
        return f"the queue loop has not completed an iteration for {now - loop_progress:.0f} s"
    return None


class Passes:
    """The running passes by VMID, their deadlines, and the abandoned ones."""

    def __init__(self, settings: DaemonSettings, *, config: Callable[[], StorageConfig],
                 changing: Callable[[int], bool], abandon: Callable[[int], None],
                 dev: Path = Path("/dev"), notices: Notices | None = None) -> None:
        self.settings = settings
        #: A VG marked unhealthy is told to Proxmox's notifications once per mark.
        self.notices = notices if notices is not None else silent()
        self._config = config
        #: Where LVM links each active LV, as ``<dev>/<vg>/<lv>``.
        self._dev = dev
        #: Whether an LVM command that changes a VG runs for a VM's pass now
        #: (a wait for QMP or for the storage lock is none).
        self._changing = changing
        #: Called after a pass was abandoned (backoff, wake-up).
        self._abandon = abandon
        self.vg_health = VgMarks(settings.vg_health_dir)
        self.running: dict[int, asyncio.Task[None]] = {}
        #: When each pass in ``running`` started, and its deadline's timer.
        self._started: dict[int, float] = {}
        self._deadlines: dict[int, asyncio.TimerHandle] = {}
        #: Passes cancelled at their deadline that have not ended yet: (VMID, when).
        self.abandoned: dict[asyncio.Task[None], tuple[int, float]] = {}

    def occupied(self, vmid: int) -> bool:
        """Whether ``vmid`` has a pass running, or one still being cancelled."""
        return vmid in self.running or any(v == vmid for v, _ in self.abandoned.values())

    def in_flight(self) -> list[asyncio.Task[None]]:
        return [*self.running.values(), *self.abandoned]

    def start(self, vmid: int, work: Coroutine[Any, Any, None], now: float) -> None:
        task = asyncio.create_task(work, name=f"vm-{vmid}")
        self.running[vmid] = task
        self._started[vmid] = now
        self._deadlines[vmid] = asyncio.get_running_loop().call_later(
            self.settings.pass_deadline, self._overdue, vmid, task)

    def ended(self, vmid: int, task: asyncio.Task[None] | None) -> None:
        """``task``, the pass over ``vmid``, has ended (from its own ``finally``)."""
        if self.running.get(vmid) is task:
            self.running.pop(vmid)
            self._started.pop(vmid, None)
            deadline = self._deadlines.pop(vmid, None)
            if deadline is not None:
                deadline.cancel()
        elif task is not None and self.abandoned.pop(task, None) is not None:
            log.info("VM %d: the pass abandoned at its deadline has ended", vmid,
                     extra=fields(VMID=vmid))

    def _overdue(self, vmid: int, task: asyncio.Task[None]) -> None:
        """A pass ran past its deadline: abandon it, and serve the others."""
        if task.done() or self.running.get(vmid) is not task:
            return
        now = time.monotonic()
        self.running.pop(vmid)
        self._deadlines.pop(vmid, None)
        started = self._started.pop(vmid, now)
        self.abandoned[task] = (vmid, now)
        # An LVM change may be half done (a command that never returned):
        # nothing more may change on those VGs from here until someone looks.
        # A pass stuck outside one (QMP, the storage lock's wait) leaves the
        # VGs as they were.
        vgs = self._vgs_of(vmid) if self._changing(vmid) else []
        message = (f"VM {vmid}: pass abandoned after {now - started:.0f} s (its deadline is "
                   f"{self.settings.pass_deadline:g} s)")
        for vg in vgs:
            # Marked already (an earlier abandoned pass): the same mark, told once.
            if self.vg_health.get(vg) is None:
                self.notices.over(marked_key(vg))
            reason = f"{message}, in the middle of an LVM change"
            self.vg_health.mark(vg, reason)
            self.notices.seen(VgMarked(vg, reason, str(self.vg_health.path(vg))))
            log.error("%s, in the middle of an LVM change on VG %s: VG marked unhealthy",
                      message, vg, extra=fields(VMID=vmid, VG=vg))
        if not vgs:
            log.error("%s, with no LVM change running", message, extra=fields(VMID=vmid))
        task.cancel()
        self._abandon(vmid)

    def _vgs_of(self, vmid: int) -> list[str]:
        """The thin VGs that hold an active LV of ``vmid``'s qcow2 chains,
        snapshot LVs included: a pass may be growing one under a commit."""
        return sorted({storage.vgname for storage in self._config().thin_storages.values()
                       if vmid in self._active_chains(storage.vgname)})

    def _active_chains(self, vg: str) -> set[int]:
        """The VMIDs whose chain LVs are active in ``vg`` on this node."""
        try:
            names = [entry.name for entry in os.scandir(self._dev / vg)]
        except OSError:
            return set()  # no LV of the VG is active here
        return {vmid for vmid in map(chain_vmid, names) if vmid is not None}

    def wedged(self, loop_progress: float) -> str | None:
        """Why the engine makes no progress (the watchdog is not fed then), or None."""
        return engine_wedged(
            time.monotonic(), abandoned=self.abandoned.values(),
            running=self._started.items(), loop_progress=loop_progress,
            pass_deadline=self.settings.pass_deadline,
            poll_interval=self.settings.poll_interval)

    async def finish(self, grace: float) -> None:
        """Let the passes in flight end within ``grace`` seconds; cancel the rest."""
        in_flight = self.in_flight()
        if in_flight:
            _, late = await asyncio.wait(in_flight, timeout=grace)
            for task in late:
                task.cancel()
            if late:
                # A pass whose cancellation does not take (a command in D
                # state) must not hold the stop forever.
                _, stuck = await asyncio.wait(late, timeout=WEDGE_GRACE)
                for task in stuck:
                    log.error("pvestord stopping: a pass does not end (%s)", task.get_name())
