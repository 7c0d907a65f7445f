"""A thin VG's capacity account read from LVM (:mod:`pvestord.policy.capacity`).

An LV named as Proxmox names a guest volume (``vm-<vmid>-...``,
``base-<vmid>-...``) on a thin storage's VG is a thin qcow2 LV; any other LV
(another storage's, an admin's) counts at its size. A thin LV's maximum is
the one recorded in its tag (:func:`pvestord.policy.capacity.maximum_from_tags`):
VG metadata, the same on every node, read without activating the LV. An LV
without the tag (made before pvestord recorded it, or by Proxmox's ``lvm``
type) takes the maximum the caller measured (the daemon knows its running
drives'), else counts at its size and is reported as unmeasured: the figure
is then a floor, partial.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from pvestord.adapters import lvm
from pvestord.adapters.lvmshell import LvmShells
from pvestord.policy import capacity
from pvestord.policy.proxmox import is_guest_volume


def is_thin_lv(name: str) -> bool:
    return is_guest_volume(name)


def _maximum(row: lvm.LvRow, measured: Mapping[str, int]) -> int | None:
    """The recorded maximum first: a measure is this node's view alone, and
    every node must count the same; a measure only fills in an untagged LV."""
    recorded = capacity.maximum_from_tags(row.tags)
    return recorded if recorded is not None else measured.get(row.lv)


async def read_account(vg: str, *, maxima: Mapping[str, int] | None = None,
                       samples: Sequence[capacity.Sample] = (), now: float = 0.0,
                       timeout: float = lvm.REPORT_TIMEOUT,  # noqa: ASYNC109
                       shells: LvmShells | None = None,
                       without: Collection[str] = ()) -> capacity.Account:
    """One ``vgs`` and one ``lvs`` of ``vg``, accounted (in its lvm shell
    when there are ``shells``: the daemon reads this every minute).

    ``without``: LVs accounted as already removed (their room free, their
    maximum no longer committed): a rollback's old top, which the rollback
    removes once its new top is made."""
    size, free = await lvm.vg_space(vg, timeout=timeout, shells=shells)
    rows = await lvm.list_lvs(vg, timeout=timeout, shells=shells)
    free += sum(row.size for row in rows if row.lv in without)
    rows = [row for row in rows if row.lv not in without]
    known = maxima or {}
    lvs = [capacity.LvUsage(row.size, _maximum(row, known), is_thin_lv(row.lv))
           for row in rows]
    return capacity.account(vg, size, free, lvs, samples, now)
