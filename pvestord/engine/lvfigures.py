"""What the pass remembers of LVM and the images between looks.

The event path runs no LVM command before the lock: an LV's size is read on
every reconcile pass and otherwise remembered from our last read or
extension (QEMU 7.2 does not re-read a ``host_device``'s size when it grows,
so its figure cannot be used); the extent size is cached per VG; the
``qemu-img measure`` maximum per image geometry. A reconcile sweep shares one
whole-VG ``lvs`` between the passes it starts together.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable

from pvestord import policy
from pvestord.adapters import lvm, qemu_img
from pvestord.adapters.lvmshell import LvmShells
from pvestord.adapters.qmp import ThinDriveView
from pvestord.adapters.settings import DaemonSettings
from pvestord.engine.drive import Drive, DriveCandidate
from pvestord.policy.capacity import COPY_TAG
from pvestord.policy.lvnames import chain_vmid

#: Seconds a whole-VG ``lvs`` may serve other reconcile passes of the same
#: sweep (they start together); never an extension's own read under the lock.
VG_REPORT_SHARE = 2.0


class LvFigures:
    """LV sizes, extent sizes, shared VG reports and image maximums."""

    def __init__(self, settings: DaemonSettings, shells: LvmShells | None) -> None:
        self.settings = settings
        self.shells = shells
        self._extent_sizes: dict[str, int] = {}
        self._lv_sizes: dict[tuple[str, str], int] = {}
        #: The device each remembered size was read from, where a binding
        #: named it: a rename gives a name another LV, whose size is not the
        #: one remembered under that name.
        self._lv_devices: dict[tuple[str, str], int] = {}
        self._maximum_cache: dict[tuple[object, ...], int] = {}
        #: Each LV's tags as last read (a copy target's tag: :meth:`copy_target`).
        self._lv_tags: dict[tuple[str, str], tuple[str, ...]] = {}
        #: The latest whole-VG ``lvs`` per VG: (when started, its task).
        self._vg_reports: dict[str, tuple[float, asyncio.Future[list[lvm.LvRow]]]] = {}

    async def sizes_of(self, vg: str, lv: str, *, fresh: bool, shared: bool = False,
                       device: int | None = None) -> tuple[int, int]:
        """(LV size, extent size); from LVM when ``fresh`` or not known yet.

        ``shared``: a report of the whole VG at most :data:`VG_REPORT_SHARE`
        old will do. A reconcile sweep starts every local VM's pass at once;
        one ``lvs`` of the VG then serves all of them, where one per drive
        made LVM most of the daemon's idle cost (bench/fleet.py).
        """
        size = self._remembered_size(vg, lv, device)
        extent = self._extent_sizes.get(vg)
        if fresh and shared and extent is not None:
            rows = await self._vg_report(vg)
            row = rows.get(lv)
            if row is not None:
                size = self._lv_sizes[(vg, lv)] = row.size
                self._lv_tags[(vg, lv)] = row.tags
                fresh = False
        if fresh or size is None or extent is None:
            info = await lvm.lv_info(vg, lv, timeout=self.settings.lvm_timeout,
                                     shells=self.shells)
            size, extent = self.remember(info)
        if device is not None:
            self._lv_devices[(vg, lv)] = device
        return size, extent

    async def _vg_report(self, vg: str) -> dict[str, lvm.LvRow]:
        """The LVs of ``vg`` by name, from one ``lvs`` shared by concurrent callers."""
        taken = self._vg_reports.get(vg)
        if taken is None or time.monotonic() - taken[0] > VG_REPORT_SHARE:
            task = asyncio.ensure_future(lvm.list_lvs(vg, timeout=self.settings.lvm_timeout,
                                                       shells=self.shells))
            taken = (time.monotonic(), task)
            self._vg_reports[vg] = taken
        # shield: one caller's cancellation (a shutdown) must not fail the others'.
        rows = await asyncio.shield(taken[1])
        return {row.lv: row for row in rows}

    def _remembered_size(self, vg: str, lv: str, device: int | None) -> int | None:
        """The size remembered of ``vg/lv``, if it was remembered of ``device``
        (a live snapshot gives the name to a new, smaller LV)."""
        known = self._lv_devices.get((vg, lv))
        if device is not None and known is not None and known != device:
            return None
        return self._lv_sizes.get((vg, lv))

    def changed(self, vg: str) -> None:
        """We changed an LV of ``vg``: a shared report from before must not serve."""
        self._vg_reports.pop(vg, None)

    def remember(self, info: lvm.LvInfo) -> tuple[int, int]:
        """Keep what LVM just said of an LV: (its size, its VG's extent size)."""
        self._lv_sizes[(info.vg, info.lv)] = info.size
        self._lv_tags[(info.vg, info.lv)] = info.tags
        self._extent_sizes[info.vg] = info.extent_size
        return info.size, info.extent_size

    def copy_target(self, vg: str, lv: str) -> bool:
        """Whether ``vg/lv`` carried the copy target's tag when LVM was last
        asked (a reconcile pass reads every drive's LV)."""
        return COPY_TAG in self._lv_tags.get((vg, lv), ())

    def has_copy_targets(self, vmid: int) -> bool:
        """Whether an LV of ``vmid``'s was a copy target when last read: the
        live reduction looks at the VM's drives only then (no QMP session
        for every VM on every reconcile)."""
        return any(COPY_TAG in tags and chain_vmid(lv) == vmid
                   for (_, lv), tags in self._lv_tags.items())

    def keep_tags_of(self, vmid: int, drives: set[tuple[str, str]]) -> None:
        """Forget the tags of ``vmid``'s LVs other than ``drives`` (its disks
        now): a disk detached while tagged must not cost its VM a QMP session
        on every reconcile."""
        for key in [key for key in self._lv_tags
                    if chain_vmid(key[1]) == vmid and key not in drives]:
            del self._lv_tags[key]

    def reduced(self, vg: str, lv: str, size: int) -> None:
        """We reduced ``vg/lv`` to ``size``."""
        self._lv_sizes[(vg, lv)] = size
        self.changed(vg)

    def untagged(self, vg: str, lv: str) -> None:
        """We dropped ``vg/lv``'s copy target tag."""
        tags = self._lv_tags.get((vg, lv), ())
        self._lv_tags[(vg, lv)] = tuple(t for t in tags if t != COPY_TAG)

    def grown(self, vg: str, lv: str, size: int) -> None:
        """We extended ``vg/lv`` to ``size``."""
        self._lv_sizes[(vg, lv)] = size

    def size(self, vg: str, lv: str) -> int | None:
        """The LV's size as last read or set by us; None if never known."""
        return self._lv_sizes.get((vg, lv))

    async def maximum(self, view: ThinDriveView, extent_size: int) -> int:
        """The LV size that holds the whole image, from a cached ``qemu-img measure``."""
        key = _geometry(view)
        measured = self._maximum_cache.get(key)
        if measured is None:
            measured = await qemu_img.maximum_required(
                qemu_img.parse_info(view.image), timeout=self.settings.qemu_img_timeout)
            self._maximum_cache[key] = measured
        return policy.maximum_size(measured, extent_size)

    async def drives(self, found: Iterable[DriveCandidate], *, fresh: bool = False,
                     shared: bool = False) -> list[Drive]:
        """``found`` joined with their LV sizes and maxima, read from LVM and
        ``qemu-img`` where :meth:`sizes_of` says so: never inside a QMP session."""
        drives: list[Drive] = []
        for candidate in found:
            size, extent = await self.sizes_of(candidate.vg, candidate.lv, fresh=fresh,
                                               shared=shared, device=candidate.device)
            drives.append(self._join(candidate, await self.maximum(candidate.view, extent),
                                     extent, size))
        return drives

    def remembered(self, found: Iterable[DriveCandidate]) -> list[Drive] | None:
        """``found`` joined from what is remembered alone, or None when any
        figure would have to be read: a re-arm after our own extension stays
        in its QMP session only when it needs no LVM and no ``qemu-img``."""
        drives: list[Drive] = []
        for candidate in found:
            size = self._remembered_size(candidate.vg, candidate.lv, candidate.device)
            extent = self._extent_sizes.get(candidate.vg)
            measured = self._maximum_cache.get(_geometry(candidate.view))
            if size is None or extent is None or measured is None:
                return None
            drives.append(self._join(candidate, policy.maximum_size(measured, extent),
                                     extent, size))
        return drives

    @staticmethod
    def _join(candidate: DriveCandidate, maximum: int, extent: int, size: int) -> Drive:
        return Drive(candidate.view, candidate.vg, candidate.lv, candidate.storage,
                     maximum, extent, size, device=candidate.device)


def _geometry(view: ThinDriveView) -> tuple[object, ...]:
    """What ``qemu-img measure``'s answer depends on: the maximum cache's key."""
    info = qemu_img.parse_info(view.image)
    return (info.virtual_size, info.cluster_size, info.extended_l2, info.refcount_bits,
            tuple((b.name, b.granularity) for b in info.bitmaps))
