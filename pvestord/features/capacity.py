"""The capacity guard of a new thin volume (``volume create``, the plugin's alloc).

Below ``thin-critical-free``, or past ``max-overcommit``, a new thin volume is
refused with a message saying which option and which figures; running VMs are
not concerned (the daemon keeps extending them). The maxima of the existing
volumes are measured only when ``max-overcommit`` is set, the one guard that
needs them: a creation on a storage without it costs one ``vgs`` and one ``lvs``.
"""

from __future__ import annotations

import asyncio
import logging

from pvestord.adapters import lvm, qemu_img, vgspace
from pvestord.adapters.config import ThinStorage
from pvestord.errors import PvestordError
from pvestord.policy import capacity, maximum_size

log = logging.getLogger(__name__)

#: LVs measured at once for ``max-overcommit``: each measure is two processes
#: that mostly wait (a header read on the SAN, a process start), so a few at a
#: time cut the wall time under the lock without loading the node.
MEASURE_CONCURRENCY = 4


class CapacityRefusedError(PvestordError):
    """A new thin volume would take room the storage's guards keep."""


async def _maxima(vg: str, extent_size: int) -> dict[str, int]:
    """The maxima of ``vg``'s thin LVs this node can read (active ones).

    Two short ``qemu-img`` runs per LV, :data:`MEASURE_CONCURRENCY` LVs at a
    time: this runs under the storage lock, inside the plugin's time budget.
    """
    maxima: dict[str, int] = {}
    slots = asyncio.Semaphore(MEASURE_CONCURRENCY)

    async def measure(lv: str) -> None:
        async with slots:
            try:
                image = await qemu_img.info(f"/dev/{vg}/{lv}", force_share=True)
                maxima[lv] = maximum_size(await qemu_img.maximum_required(image), extent_size)
            except PvestordError as err:
                log.debug("%s/%s: maximum unknown: %s", vg, lv, err)

    thin = [row.lv for row in await lvm.list_lvs(vg)
            if row.active and vgspace.is_thin_lv(row.lv)]
    async with asyncio.TaskGroup() as group:
        for lv in thin:
            group.create_task(measure(lv))
    return maxima


async def check_new_volume(storage: ThinStorage, *, lv_size: int, maximum: int,
                           extent_size: int, replaces: str | None = None) -> capacity.Account:
    """The guards on the VG as it will be once the volume is made: without
    the LV it ``replaces`` (a rollback's old top, removed by the rollback).

    :raises CapacityRefusedError: the guards refuse it (the message says why)."""
    guards = storage.guards
    maxima = (await _maxima(storage.vgname, extent_size)
              if guards.max_overcommit is not None else None)
    account = await vgspace.read_account(storage.vgname, maxima=maxima,
                                         without=() if replaces is None else (replaces,))
    refusal = capacity.new_volume_refusal(account, guards, lv_size=lv_size, maximum=maximum,
                                          storeid=storage.storeid)
    if refusal is not None:
        raise CapacityRefusedError(refusal)
    return account
