"""After a round: re-arm every drive, and resume a VM paused for room that
has room again (:func:`pvestord.policy.may_resume`), and its block jobs
paused on ENOSPC (:func:`pvestord.policy.jobs_to_resume`)."""

from __future__ import annotations

import logging
from collections.abc import Collection

from pvestord import policy
from pvestord.adapters.qmp import RunState, VmMonitor
from pvestord.adapters.service import fields
from pvestord.adapters.vms import LocalVm
from pvestord.engine.drive import Drive, VmOutcome
from pvestord.engine.memory import OncePerChange, forget_vm
from pvestord.policy import Decision
from pvestord.policy.sizes import format_size

log = logging.getLogger(__name__)


def changes_threshold(decision: Decision) -> bool:
    """Whether :func:`arm_or_disarm` has QMP work to do for ``decision``."""
    return isinstance(decision, policy.Arm) or (
        isinstance(decision, policy.AtMaximum) and decision.disarm)


async def arm_or_disarm(monitor: VmMonitor, vm: LocalVm, drive: Drive,
                        decision: Decision) -> None:
    """Carry out the cheap decisions: a threshold armed, or removed at the maximum."""
    node = drive.view.file_node
    if isinstance(decision, policy.Arm):
        await monitor.set_threshold(node, decision.threshold)
        log.info("VM %d %s: threshold armed at %s (LV %s)", vm.vmid, node,
                 format_size(decision.threshold), format_size(drive.lv_size),
                 extra=fields(VMID=vm.vmid, BLOCK_NODE=node, LV=drive.lv,
                              THRESHOLD=decision.threshold))
    elif isinstance(decision, policy.AtMaximum) and decision.disarm:
        await monitor.set_threshold(node, 0)
        log.info("VM %d %s: LV holds the whole image (%s): threshold removed", vm.vmid,
                 node, format_size(drive.maximum),
                 extra=fields(VMID=vm.vmid, BLOCK_NODE=node, LV=drive.lv))


class PausedJobs:
    """What each block job paused on ENOSPC was last given: the VM's thin LVs'
    total size when it was resumed, per (vmid, QEMU pid, job id)."""

    def __init__(self, said: OncePerChange) -> None:
        self._said = said
        self._resumed_at: dict[tuple[int, int, str], int] = {}

    def forget(self, vmid: int) -> None:
        forget_vm(self._resumed_at, vmid)

    async def resume(self, monitor: VmMonitor, vm: LocalVm, run: RunState,
                     drives: list[Drive], *, need_more: bool, failed: bool) -> None:
        """Resume ``vm``'s jobs paused on ENOSPC that may run again."""
        if not run.jobs_paused_for_room:
            return
        room = sum(d.lv_size for d in drives if d.storage is not None)
        resumed_at = {job: size for (vmid, pid, job), size in self._resumed_at.items()
                      if (vmid, pid) == (vm.vmid, vm.pid)}
        for job_id in policy.jobs_to_resume(run.jobs, need_more=need_more, failed=failed,
                                            resumed_at=resumed_at, room=room):
            await monitor.resume_job(job_id)
            self._resumed_at[(vm.vmid, vm.pid, job_id)] = room
            self._said.over((vm.vmid, job_id, "job"))
            log.warning("VM %d: block job %s resumed after it paused on ENOSPC", vm.vmid,
                        job_id, extra=fields(VMID=vm.vmid, JOB=job_id, RESUMED="job"))
        for job in run.jobs:
            if job.paused_for_room and not policy.room_made_since_resume(job.id, resumed_at,
                                                                         room):
                self._said.say((vm.vmid, job.id, "job"), logging.WARNING,
                               "VM %d: block job %s stays paused on ENOSPC: no thin drive"
                               " grew since it was last resumed, so its target is not"
                               " one pvestord grows; give it room and resume it by hand",
                               vm.vmid, job.id, extra=fields(VMID=vm.vmid, JOB=job.id))


async def rearm_and_resume(monitor: VmMonitor, vm: LocalVm, drives: list[Drive],
                           run: RunState, outcome: VmOutcome, *, extended: bool,
                           said: OncePerChange, jobs: PausedJobs,
                           may_not_grow: Collection[str] = ()) -> bool:
    """Re-arm ``drives`` (a fresh look) and resume ``vm`` if it may run again.
    True when the pass must go round again.

    ``may_not_grow``: file nodes the pass may not grow now (the VG's
    reserve, a rename under way): past their threshold, they neither get
    another round nor keep the VM paused."""
    past_threshold = []
    for drive in drives:
        if drive.view.file_node in outcome.errors:
            continue
        decision = policy.decide(drive.state(paused_nospace=False))
        if isinstance(decision, policy.Extend | policy.ExtendPastMaximum):
            past_threshold.append(drive.view.file_node)  # a fast writer, already past it
        await arm_or_disarm(monitor, vm, drive, decision)
    waits_for = policy.needing_more(past_threshold, may_not_grow)
    need_more = waits_for is not None
    outcome.waits_for = waits_for if run.paused_for_room else None
    thin = [d for d in drives if d.storage is not None]
    verdict = policy.may_resume(
        paused_for_room=run.paused_for_room, need_more=need_more,
        nospace=run.nospace_devices,
        usable=[d.identity for d in thin if d.view.file_node not in outcome.errors],
        failing=[d.identity for d in thin if d.view.file_node in outcome.errors],
        unowned_pause=run.paused_on_unowned_error)
    if verdict.blocker is not None:
        _say_blocked(vm, verdict.blocker, outcome, said)
    await jobs.resume(monitor, vm, run, thin, need_more=need_more,
                      failed=bool(outcome.errors))
    if verdict.resume:
        await monitor.cont()
        outcome.resumed = True
        said.over((vm.vmid, "", "resume"))
        if run.paused_on_nospace:
            log.warning("VM %d: resumed after it paused on ENOSPC", vm.vmid,
                        extra=fields(VMID=vm.vmid, RESUMED="nospace"))
        else:
            log.warning("VM %d: resumed after an I/O error pause that no device owns"
                        " (brought by a live migration, which does not carry the"
                        " devices' io-status); its thin drives were given room first",
                        vm.vmid, extra=fields(VMID=vm.vmid, RESUMED="io-error"))
    return policy.another_round(need_more=need_more, paused_for_room=run.paused_for_room,
                                resumed=outcome.resumed, extended=extended)


def _say_blocked(vm: LocalVm, blocker: policy.ResumeBlocker, outcome: VmOutcome,
                 said: OncePerChange) -> None:
    """Why a VM paused for room stays paused (the thin drives got their
    one extension per new ENOSPC, and no more)."""
    extra = fields(VMID=vm.vmid, DEVICE=blocker.device,
                   RESUME_BLOCKED=blocker.because.value)
    if blocker.because is policy.BlockedBecause.NOT_THIN:
        said.say((vm.vmid, "", "resume"), logging.WARNING,
                 "VM %d stays paused: device %s has io-status nospace and is not a thin"
                 " drive: it is out of space, or that status is left over from an"
                 " earlier pause (QEMU keeps it after cont on -blockdev devices). Its"
                 " thin drives got room; resume the VM by hand once %s has room too",
                 vm.vmid, blocker.device, blocker.device, extra=extra)
    else:
        errors = "; ".join(str(e) for e in outcome.errors.values())
        said.say((vm.vmid, "", "resume"), logging.WARNING,
                 "VM %d stays paused: thin drive %s failed: %s", vm.vmid,
                 blocker.device, errors, extra=extra)
