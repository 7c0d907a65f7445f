"""The check for LVs left suspended (docs/operations.md, "An LV left suspended").

A loop of the daemon: at start, every ``interval`` (the reconcile interval),
and at once after a change of ours was killed (:class:`LvmChanges` wakes it),
it reads this node's device-mapper state and resumes the VM disk LVs of our
thin VGs that :func:`pvestord.policy.suspended.judge` says were left
suspended. Each resume is logged at warning with its fields; a resume that
fails is an error (once, in the journal and ``pvestord status``'s errors),
and both are counted (``dm_resumed``, ``dm_resume_failed`` in the tally the
metrics publish).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from pathlib import Path

from pvestord.adapters import dm, tally
from pvestord.adapters.config import StorageConfig
from pvestord.adapters.service import fields
from pvestord.adapters.vghealth import VgMarks
from pvestord.engine.failures import Failures
from pvestord.engine.lvmchanges import LvmChanges
from pvestord.errors import PvestordError
from pvestord.policy.binding import dm_name
from pvestord.policy.suspended import GRACE, judge, ours

log = logging.getLogger(__name__)


class SuspendedLvs:
    """What the check remembers between looks: when each suspended LV was
    first seen so, and the LVs whose change of ours was killed."""

    def __init__(self, config: Callable[[], StorageConfig], changes: LvmChanges,
                 failures: Failures, health_dir: Path, *, lvm_timeout: float,
                 grace: float = GRACE) -> None:
        self.config = config
        self.changes = changes
        self.failures = failures
        self.health = VgMarks(health_dir)
        self.lvm_timeout = lvm_timeout
        self.grace = grace
        self.seen: dict[str, float] = {}
        self.killed: set[str] = set()
        self.wake = asyncio.Event()
        #: dm names whose resume failed, for the status (cleared once resumed).
        self.failed: set[str] = set()

    async def check(self) -> None:
        """One look; resumes what is to be resumed."""
        self.killed |= {dm_name(vg, lv) for vg, lv in self.changes.take_killed()}
        vgs = {storage.vgname for storage in self.config().thin_storages.values()}
        if not vgs:
            return
        suspended = ours(await dm.devices(), vgs)
        verdict = judge(suspended, now=time.monotonic(), seen=self.seen,
                        changing=self.changes.vms(), unhealthy=self.health.marked(),
                        killed=self.killed, grace=self.grace)
        self.seen = dict(verdict.seen)
        # A killed change's LV that is not suspended needs nothing; one that
        # waits (its VM busy again, its VG marked) keeps its note.
        self.killed &= set(verdict.waiting)
        for name, why in verdict.waiting.items():
            log.debug("device %s is suspended, not resumed yet: %s", name, why)
        for lv in verdict.resume:
            key = (lv.vmid, f"suspended {lv.dm_name}")
            log.warning("VM %d: LV %s/%s found suspended with no LVM change of ours on it "
                        "(a command killed between suspend and resume): resuming it",
                        lv.vmid, lv.vg, lv.lv,
                        extra=fields(VMID=lv.vmid, VG=lv.vg, LV=lv.lv, DM_NAME=lv.dm_name,
                                     DM_STATE="suspended"))
            try:
                how = await dm.resume_left_suspended(lv.vg, lv.lv, lv.dm_name,
                                                     lvm_timeout=self.lvm_timeout)
            except PvestordError as err:
                tally.happened("dm_resume_failed")
                self.failed.add(lv.dm_name)
                self.failures.note_error(
                    key, f"VM {lv.vmid}: LV {lv.vg}/{lv.lv} is suspended and could not be "
                    f"resumed: {err}; the guest's I/O on it hangs until it is resumed "
                    f"(dmsetup info {lv.dm_name})", VG=lv.vg, LV=lv.lv, DM_NAME=lv.dm_name)
                continue
            tally.happened("dm_resumed")
            self.failed.discard(lv.dm_name)
            self.killed.discard(lv.dm_name)
            self.seen.pop(lv.dm_name, None)
            self.failures.clear_error(key, f"VM {lv.vmid}: LV {lv.vg}/{lv.lv} resumed")
            log.warning("VM %d: LV %s/%s resumed (%s)", lv.vmid, lv.vg, lv.lv, how,
                        extra=fields(VMID=lv.vmid, VG=lv.vg, LV=lv.lv, DM_NAME=lv.dm_name,
                                     DM_STATE="resumed"))

    async def loop(self, interval: float) -> None:
        """Check at start, every ``interval``, and when woken; a look that
        fails is an error to retry, never the end of the loop."""
        while True:
            try:
                await self.check()
            except PvestordError as err:
                self.failures.note_error((0, "dm-check"), f"cannot check for LVs left "
                                         f"suspended: {err}")
            else:
                self.failures.clear_error((0, "dm-check"), "LVs left suspended checked again")
            # Sooner while something waits out its grace.
            wait = min(interval, self.grace / 2) if self.seen else interval
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await self.wake.wait()
            self.wake.clear()
