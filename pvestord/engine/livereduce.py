"""A running VM's copy target made thin while the VM runs, under a pause of a moment.

A live move disk, and the target of a migration with local disks, are
mirrors that qemu-server runs at full speed with no ``on-error``: the plugin
makes their target thick, at the image's maximum, and tags it
:data:`~pvestord.policy.capacity.COPY_TAG` (:mod:`pvestord.features.volumes.copies`).
When the mirror is over the target is the VM's disk, still thick, and the
plugin cannot reduce it: QEMU has it open. The daemon does, on its reconcile
pass over the VM, for each drive whose LV carries the tag:

1. under the VG's storage lock (taken first: no lock wait while the guest
   is paused), one QMP session checks that the VM runs with no block job at
   all (a job writes on while the guest is paused), no block export and no
   lock on its config (qemu-server at work on it), and that the LV is one
   of this VM's disks
   (:func:`pvestord.policy.volumes.live_reduction_refused`), notes the pause
   (:mod:`pvestord.adapters.pausemarks`) and pauses the VM: QMP ``stop``
   drains and flushes every drive, so the image on the LV is whole and
   nothing writes it. The highest offset QEMU wrote to the LV is read;
2. outside any session, ``qemu-img check -U`` reads the image's end (the
   image must be clean), and the target is
   :func:`~pvestord.policy.volumes.live_reduction_target`: the larger end
   plus a chunk, in whole extents, at least ``initial-size``;
3. one more QMP session, held to the end: the VM is still paused with no
   job and QEMU has written nothing since; then ``lvreduce``, the threshold
   armed for the new size, and ``cont``; the tag is dropped after, still
   under the storage lock. Holding
   the session keeps every other QMP client (qemu-server starting a job, an
   admin's ``qm resume``) out between the last look and the ``lvreduce``;
   they wait for the ``lvreduce`` alone, well within their 5 s.

An LV that cannot be reduced whatever the image holds (no more than
``initial-size`` plus a chunk past what QEMU has written already) is only
untagged, without a pause.

Anything unexpected after the pause (the image not clean, QEMU wrote, a job
appeared, an error) leaves the LV as it was, tagged, for the next reconcile
to try again, and the VM is resumed if it is still paused. A daemon killed
while the VM is paused leaves the note: the next pass over the VM (the
first one after a start, for every VM) resumes it
(:meth:`LiveReductions.resume_if_left_paused`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from pvestord import policy
from pvestord.adapters import lvm, pausemarks, qemu_img
from pvestord.adapters.qmp import BlockNodes, ThinDriveView, VmMonitor
from pvestord.adapters.service import fields
from pvestord.adapters.settings import DaemonSettings
from pvestord.adapters.vmconfig import read_config_lock
from pvestord.adapters.vms import LocalVm
from pvestord.engine.drive import DriveCandidate, ms_since
from pvestord.engine.lvfigures import LvFigures
from pvestord.engine.lvmchanges import LvmChanges, VgGates
from pvestord.engine.memory import OncePerChange
from pvestord.errors import PvestordError
from pvestord.policy.capacity import COPY_TAG
from pvestord.policy.lvnames import chain_vmid
from pvestord.policy.sizes import format_size
from pvestord.policy.volumes import live_reduction_refused, live_reduction_target

log = logging.getLogger(__name__)


class NotNow(PvestordError):
    """The reduction was given up after the pause: the LV is left as it was."""


@dataclass(frozen=True)
class LiveReduced:
    """One copy target reduced under its running VM."""

    vmid: int
    vg: str
    lv: str
    lv_size_before: int
    lv_size_after: int
    #: ``qemu-img check``'s image end, and the highest offset QEMU wrote.
    image_end: int
    written_end: int
    threshold: int
    #: From ``stop`` to ``cont``, as the daemon saw them.
    paused_ms: int


class LiveReductions:
    """The reduction of copy targets under running VMs, and the pauses it takes."""

    def __init__(self, settings: DaemonSettings, *, gates: VgGates, figures: LvFigures,
                 changes: LvmChanges, said: OncePerChange,
                 monitor: Callable[[LocalVm], VmMonitor],
                 found: Callable[[Iterable[ThinDriveView]], list[DriveCandidate]]) -> None:
        self.settings = settings
        self.marks = pausemarks.folder_beside(settings.vg_health_dir)
        self._gates = gates
        self._figures = figures
        self._changes = changes
        self._said = said
        self._monitor = monitor
        self._found = found

    async def resume_if_left_paused(self, vm: LocalVm) -> None:
        """Resume ``vm`` if a pause of ours is noted and the VM is paused.

        Run by every pass before anything else: a note left behind means a
        daemon was killed between its ``stop`` and its ``cont`` (or its
        ``cont`` failed). A VM running, or paused for another reason (an I/O
        error, a migration), is not ours to resume: the note just goes, as
        does a note of an earlier QEMU of the VMID.
        """
        note = pausemarks.noted(self.marks, vm.vmid, vm.pid)
        if note is pausemarks.Note.NONE:
            return
        if note is pausemarks.Note.STALE:
            pausemarks.clear(self.marks, vm.vmid)
            return
        async with self._monitor(vm) as monitor:
            run = await monitor.run_state()
            if run.status == "paused":
                await monitor.cont()
                log.warning("VM %d: resumed; it was paused by pvestord to reduce a copy "
                            "target, and left paused (pvestord was stopped or its resume "
                            "failed)", vm.vmid, extra=fields(VMID=vm.vmid, RESUMED="yes",
                                                             LIVE_REDUCTION="resumed"))
        pausemarks.clear(self.marks, vm.vmid)

    async def reduce_all(self, vm: LocalVm) -> list[LiveReduced]:
        """Reduce each of ``vm``'s drives whose LV was a copy target at the
        last LVM read, one after another; a failure is logged and its LV
        left for the next reconcile."""
        if not self._figures.has_copy_targets(vm.vmid):
            return []
        async with self._monitor(vm) as monitor:
            nodes = await monitor.block_nodes()
        drives = self._found(nodes.drives)
        self._figures.keep_tags_of(vm.vmid, {(d.vg, d.lv) for d in drives})
        done: list[LiveReduced] = []
        for drive in drives:
            if drive.storage is None or not self._figures.copy_target(drive.vg, drive.lv):
                continue
            key = (vm.vmid, drive.view.file_node, "live-reduce")
            try:
                reduced = await self._reduce(vm, drive)
            except PvestordError as err:
                self._said.say(key, logging.WARNING,
                               "VM %d %s: copy target LV %s/%s not reduced this time: %s",
                               vm.vmid, drive.view.file_node, drive.vg, drive.lv, err,
                               extra=fields(VMID=vm.vmid, BLOCK_NODE=drive.view.file_node,
                                            VG=drive.vg, LV=drive.lv,
                                            LIVE_REDUCTION="failed"))
                continue
            if reduced is not None:
                self._said.over(key)
                done.append(reduced)
        return done

    async def _reduce(self, vm: LocalVm, drive: DriveCandidate) -> LiveReduced | None:
        storage = drive.storage
        assert storage is not None
        vg, lv, node = drive.vg, drive.lv, drive.view.file_node
        async with self._gates.locked(vg, storage):
            before = await lvm.lv_info(vg, lv, timeout=self.settings.lvm_timeout)
            self._figures.remember(before)
            if COPY_TAG not in before.tags:
                return None  # reduced meanwhile (by a stopped VM's deactivation, by hand)
            # What QEMU has written so far only grows: if the LV is no larger
            # than it plus a chunk (or initial-size), no image end can reduce it.
            if live_reduction_target(before.size, 0, drive.view.allocation, storage.chunksize,
                                     storage.initial_size, before.extent_size) >= before.size:
                await self._untag(vg, lv)
                log.info("VM %d %s: copy target LV %s/%s (%s) has nothing to give back: "
                         "untagged, no pause", vm.vmid, node, vg, lv, format_size(before.size),
                         extra=fields(VMID=vm.vmid, BLOCK_NODE=node, VG=vg, LV=lv,
                                      LIVE_REDUCTION="untagged"))
                return None
            try:
                paused = await self._pause(vm, drive)
                if paused is None:
                    return None
                written, paused_at = paused
                checked = await qemu_img.check(drive.lv_path, force_share=True,
                                               timeout=self.settings.qemu_img_timeout)
                end = checked.image_end_offset
                if checked.status is not qemu_img.CheckStatus.CLEAN or end is None:
                    raise NotNow(f"the image does not check clean ({checked.status.value}, "
                                 f"end {end}): {checked.messages or 'see qemu-img check -U'}")
                target = live_reduction_target(before.size, end, written, storage.chunksize,
                                               storage.initial_size, before.extent_size)
                threshold = policy.threshold(target, storage.chunksize,
                                             storage.chunk_percentage)
                async with self._monitor(vm) as monitor:
                    await self._still_as_paused(monitor, node, written)
                    if target < before.size:
                        with self._changes.running(vm.vmid, node, (vg, lv)):
                            await lvm.reduce(vg, lv, target,
                                             timeout=self.settings.lvm_timeout)
                        self._figures.reduced(vg, lv, target)
                        if threshold > 0:
                            await monitor.set_threshold(node, threshold)
                    await monitor.cont()
                paused_ms = ms_since(paused_at)
                pausemarks.clear(self.marks, vm.vmid)
            finally:
                # The note is still there only when the reduction was given up
                # after the pause, or its cont failed: resume if still paused.
                await self.resume_if_left_paused(vm)
            # The LV holds what it holds plus a chunk now; a crash before
            # this line makes the next reconcile's pass a no-op reduction.
            await self._untag(vg, lv)
        reduced = LiveReduced(vm.vmid, vg, lv, before.size, target, end, written,
                              threshold, paused_ms)
        log.info("VM %d %s: copy target LV %s/%s reduced from %s to %s under the running VM "
                 "(image end %s, written up to %s; the guest paused for %d ms), threshold "
                 "armed at %s", vm.vmid, node, vg, lv, format_size(before.size),
                 format_size(target), format_size(end), format_size(written),
                 reduced.paused_ms, format_size(threshold),
                 extra=fields(VMID=vm.vmid, BLOCK_NODE=node, VG=vg, LV=lv,
                              OLD_SIZE=before.size, NEW_SIZE=target,
                              DURATION_MS=reduced.paused_ms, THRESHOLD=threshold,
                              LIVE_REDUCTION="done"))
        return reduced

    async def _untag(self, vg: str, lv: str) -> None:
        """Drop the copy target's tag (under the storage lock, as any change)."""
        await lvm.remove_tags(vg, lv, [COPY_TAG], timeout=self.settings.lvm_timeout)
        self._figures.untagged(vg, lv)

    async def _pause(self, vm: LocalVm, drive: DriveCandidate) -> tuple[int, float] | None:
        """Pause ``vm`` if it may be paused for ``drive`` now: the highest
        offset QEMU wrote to the LV, read once it is paused, and when the
        pause began. None when it may not (said once, at info: the normal
        state while a job runs)."""
        node = drive.view.file_node
        found = read_config_lock(self.settings.reports_dir, self.settings.node, vm.vmid)
        async with self._monitor(vm) as monitor:
            run = await monitor.run_state()
            refused = live_reduction_refused(
                status=run.status, jobs=len(run.jobs), exports=await monitor.block_exports(),
                lv_vmid=chain_vmid(drive.lv), vmid=vm.vmid,
                config_lock=None if found is None else found.lock)
            if refused is not None:
                self._said.say((vm.vmid, node, "live-reduce-wait"), logging.INFO,
                               "VM %d %s: copy target LV %s/%s stays thick for now: %s",
                               vm.vmid, node, drive.vg, drive.lv, refused,
                               extra=fields(VMID=vm.vmid, BLOCK_NODE=node, VG=drive.vg,
                                            LV=drive.lv, LIVE_REDUCTION="waits"))
                return None
            self._said.over((vm.vmid, node, "live-reduce-wait"))
            # Noted before the stop: a daemon killed the moment after leaves
            # a note of a VM that may be paused, never a pause with no note.
            try:
                pausemarks.note(self.marks, vm.vmid, vm.pid)
            except OSError as err:
                raise NotNow(f"cannot note the pause in {self.marks}: {err}; not "
                             "paused") from err
            paused_at = time.monotonic()
            await monitor.stop()
            return _written_end(await monitor.block_nodes(), node), paused_at

    async def _still_as_paused(self, monitor: VmMonitor, node: str, written: int) -> None:
        """:raises NotNow: someone resumed the VM or started a job, or QEMU
        wrote to the LV, since the pause."""
        run = await monitor.run_state()
        if run.status != "paused":
            raise NotNow(f"the VM is {run.status} again since pvestord paused it")
        if run.jobs:
            raise NotNow("a block job started while the VM was paused")
        if await monitor.block_exports():
            raise NotNow("a block export was added while the VM was paused")
        now = _written_end(await monitor.block_nodes(), node)
        if now != written:
            raise NotNow(f"QEMU wrote to the LV while the VM was paused (up to {now}, "
                         f"{written} before)")


def _written_end(nodes: BlockNodes, node: str) -> int:
    """The highest offset QEMU wrote to the file node ``node``.

    :raises NotNow: the node is gone (the disk was detached meanwhile).
    """
    for view in nodes.drives:
        if view.file_node == node:
            return view.allocation
    raise NotNow(f"block node {node} is gone")


__all__ = ["LiveReduced", "LiveReductions", "NotNow"]
