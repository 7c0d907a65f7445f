"""The capacity guard of a new thin volume (``volume create``, the plugin's alloc).

Below ``thin-critical-free``, or past ``max-overcommit``, a new thin volume is
refused with a message saying which option and which figures; running VMs are
not concerned (the daemon keeps extending them). The maxima of the existing
volumes are the ones recorded in their LV tags (:mod:`pvestord.adapters.vgspace`):
one ``vgs`` and one ``lvs``, the same figures on every node, so
``max-overcommit`` holds across the cluster. Nothing is measured: this runs
under the storage lock (the plugin's alloc), and a ``qemu-img`` per LV there
would keep the lock for minutes on a large VG, while every node's change of
the VG waits for it. An LV without
the tag counts at its LV size, as the status reports (``unmeasured``).
"""

from __future__ import annotations

from pvestord.adapters import vgspace
from pvestord.adapters.config import ThinStorage
from pvestord.errors import PvestordError
from pvestord.policy import capacity


class CapacityRefusedError(PvestordError):
    """A new thin volume would take room the storage's guards keep."""


async def check_new_volume(storage: ThinStorage, *, lv_size: int, maximum: int,
                           replaces: str | None = None) -> capacity.Account:
    """The guards on the VG as it will be once the volume is made: without
    the LV it ``replaces`` (a rollback's old top, removed by the rollback).

    :raises CapacityRefusedError: the guards refuse it (the message says why)."""
    guards = storage.guards
    account = await vgspace.read_account(storage.vgname,
                                         without=() if replaces is None else (replaces,))
    refusal = capacity.new_volume_refusal(account, guards, lv_size=lv_size, maximum=maximum,
                                          storeid=storage.storeid)
    if refusal is not None:
        raise CapacityRefusedError(refusal)
    return account
