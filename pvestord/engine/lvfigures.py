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

from pvestord import policy
from pvestord.adapters import lvm, qemu_img
from pvestord.adapters.config import StorageConfig
from pvestord.adapters.lvmshell import LvmShells
from pvestord.adapters.qmp import ThinDriveView, VmMonitor
from pvestord.adapters.settings import DaemonSettings
from pvestord.engine.drive import Drive, VmOutcome

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
        self._maximum_cache: dict[tuple[object, ...], int] = {}
        #: The latest whole-VG ``lvs`` per VG: (when started, its task).
        self._vg_reports: dict[str, tuple[float, asyncio.Future[list[lvm.LvRow]]]] = {}

    async def sizes_of(self, vg: str, lv: str, *, fresh: bool,
                       shared: bool = False) -> tuple[int, int]:
        """(LV size, extent size); from LVM when ``fresh`` or not known yet.

        ``shared``: a report of the whole VG at most :data:`VG_REPORT_SHARE`
        old will do. A reconcile sweep starts every local VM's pass at once;
        one ``lvs`` of the VG then serves all of them, where one per drive
        made LVM most of the daemon's idle cost (bench/fleet.py).
        """
        size = self._lv_sizes.get((vg, lv))
        extent = self._extent_sizes.get(vg)
        if fresh and shared and extent is not None:
            rows = await self._vg_report(vg)
            if lv in rows:
                self._lv_sizes[(vg, lv)] = rows[lv]
                return rows[lv], extent
        if fresh or size is None or extent is None:
            info = await lvm.lv_info(vg, lv, timeout=self.settings.lvm_timeout,
                                     shells=self.shells)
            size, extent = self.remember(info)
        return size, extent

    async def _vg_report(self, vg: str) -> dict[str, int]:
        """LV sizes of ``vg`` by name, from one ``lvs`` shared by concurrent callers."""
        taken = self._vg_reports.get(vg)
        if taken is None or time.monotonic() - taken[0] > VG_REPORT_SHARE:
            task = asyncio.ensure_future(lvm.list_lvs(vg, timeout=self.settings.lvm_timeout))
            taken = (time.monotonic(), task)
            self._vg_reports[vg] = taken
        # shield: one caller's cancellation (a shutdown) must not fail the others'.
        rows = await asyncio.shield(taken[1])
        return {row.lv: row.size for row in rows}

    def changed(self, vg: str) -> None:
        """We changed an LV of ``vg``: a shared report from before must not serve."""
        self._vg_reports.pop(vg, None)

    def remember(self, info: lvm.LvInfo) -> tuple[int, int]:
        """Keep what LVM just said of an LV: (its size, its VG's extent size)."""
        self._lv_sizes[(info.vg, info.lv)] = info.size
        self._extent_sizes[info.vg] = info.extent_size
        return info.size, info.extent_size

    def grown(self, vg: str, lv: str, size: int) -> None:
        """We extended ``vg/lv`` to ``size``."""
        self._lv_sizes[(vg, lv)] = size

    def size(self, vg: str, lv: str) -> int | None:
        """The LV's size as last read or set by us; None if never known."""
        return self._lv_sizes.get((vg, lv))

    async def maximum(self, view: ThinDriveView, extent_size: int) -> int:
        """The LV size that holds the whole image, from a cached ``qemu-img measure``."""
        info = qemu_img.parse_info(view.image)
        key = (info.virtual_size, info.cluster_size, info.extended_l2, info.refcount_bits,
               tuple((b.name, b.granularity) for b in info.bitmaps))
        measured = self._maximum_cache.get(key)
        if measured is None:
            measured = await qemu_img.maximum_required(
                info, timeout=self.settings.qemu_img_timeout)
            self._maximum_cache[key] = measured
        return policy.maximum_size(measured, extent_size)

    async def drives(self, monitor: VmMonitor, config: StorageConfig,
                     outcome: VmOutcome | None = None, *, fresh: bool = False,
                     shared: bool = False) -> list[Drive]:
        """The VM's thin-drive candidates, QEMU's view joined with these figures."""
        drives: list[Drive] = []
        views, names = await monitor.thin_drives()
        if outcome is not None:
            outcome.known_nodes |= names
        for view in views:
            vg_lv = lvm.lv_from_path(view.path)
            if vg_lv is None:
                continue  # a qcow2 on a plain file or another kind of device: not ours
            vg, lv = vg_lv
            storage = config.by_vg(vg, self.settings.node)
            size, extent = await self.sizes_of(vg, lv, fresh=fresh, shared=shared)
            drives.append(Drive(view, vg, lv, storage, await self.maximum(view, extent),
                                extent, size))
        return drives
