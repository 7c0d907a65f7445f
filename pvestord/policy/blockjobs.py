"""Block jobs that write into thin drives: the room they get, and when a job
paused on ENOSPC may run again. Pure, no I/O.

A ``block-commit``, ``block-stream`` or ``blockdev-mirror`` writes at disk
speed into its target, far faster than a guest. Two rules, one for each side:

- :func:`job_target_size` is what a target must hold before a job copies a
  source into it. The storage plugin applies it before the jobs qemu-server
  announces (a snapshot delete), and offline to ``qemu-img commit``/``rebase``.
- A job started with ``on-error``/``on-target-error`` ``enospc`` or ``stop``
  pauses on ENOSPC instead of failing (``BLOCK_JOB_ERROR``, action ``stop``;
  ``query-block-jobs`` shows it ``paused`` with io-status ``nospace``).
  pvestord gives its thin drives room as for a paused guest (the target's
  failed write counts in its ``wr_highest_offset``, so it is past its
  threshold) and then resumes the job (:func:`jobs_to_resume`). A job on
  ``report`` (qemu-server's default) has already failed when the event
  comes: nothing can be resumed, which is why the plugin grows first.

And one rule for a job that runs: :func:`room_for_jobs`, what an active
commit can still write into its target, which the target must have beyond
its allocation (``DriveState.job_room``): the target is kept ahead of the
job, not a chunk behind a threshold event.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from pvestord.policy.sizes import align_up


@dataclass(frozen=True)
class BlockJob:
    """One entry of ``query-block-jobs``, as far as pausing goes."""

    #: The job id (``device`` in ``query-block-jobs`` and the job events).
    id: str
    #: ``commit``, ``stream``, ``mirror``, ``backup``...
    type: str
    #: QEMU's JobStatus (``running``, ``paused``, ``ready``, ...).
    status: str
    paused: bool
    #: ``ok``, ``failed`` or ``nospace``: why the job stopped on an error.
    io_status: str
    #: The job's progress, ``len`` and ``offset``: work in QEMU's own
    #: unit, bytes for these jobs (see :func:`room_for_jobs` for what they count).
    length: int = 0
    offset: int = 0

    @property
    def remaining(self) -> int:
        """The work the job has still to do (``len - offset``)."""
        return max(0, self.length - self.offset)

    @property
    def paused_for_room(self) -> bool:
        """Paused by QEMU on ENOSPC, not by an admin's ``block-job-pause``
        (whose job keeps io-status ``ok``), nor on a real I/O error."""
        return self.paused and self.io_status == "nospace"


#: The job statuses (QEMU's JobStatus) in which a job may still write: one
#: that concluded or is aborting (a failed job its owner has not dismissed)
#: keeps the progress it stopped at, and must not grow its target.
WRITING = frozenset({"created", "running", "paused", "ready", "standby"})


def job_target_size(target_lv_size: int, source_end: int, target_maximum: int,
                    chunksize: int, extent_size: int) -> int:
    """The size a job's target must have before the job copies a source into it.

    Everything the job copies comes out of the source image, which ends at
    ``source_end``; the target's new clusters and tables cannot take more
    than that, and a chunk on top covers differing table layouts. Capped at
    the target's maximum (the image cannot outgrow it) and never below the
    LV as it is.
    """
    wanted = align_up(target_lv_size + source_end + chunksize, extent_size)
    return max(target_lv_size, min(wanted, align_up(target_maximum, extent_size)))


def jobs_to_resume(jobs: Iterable[BlockJob], *, need_more: bool, failed: bool,
                   resumed_at: Mapping[str, int], room: int) -> list[str]:
    """The ids of the jobs paused on ENOSPC that may run again now.

    ``need_more``: a thin drive is still past its threshold after the round;
    ``failed``: a thin drive's extension failed: then the target may be the
    one without room, and a resumed job would only fail its write again.
    ``room`` is the VM's thin LVs' total size now, ``resumed_at`` that total
    when each job was last resumed: a job is resumed again only once room was
    made since. A job whose ENOSPC is on a device pvestord does not grow (a
    file, a thick LV at its end) is resumed once, pauses again, and stays
    paused for its owner, instead of pausing and resuming in a loop.
    """
    if need_more or failed:
        return []
    return [job.id for job in jobs
            if job.paused_for_room and room_made_since_resume(job.id, resumed_at, room)]


def room_made_since_resume(job_id: str, resumed_at: Mapping[str, int], room: int) -> bool:
    """Whether the VM's thin LVs (``room``, their total size) grew since job
    ``job_id`` was last resumed, or it never was: only then can resuming it
    again help (see :func:`jobs_to_resume`)."""
    return job_id not in resumed_at or room > resumed_at[job_id]


def room_for_jobs(jobs: Iterable[BlockJob], targets: Mapping[str, str]) -> dict[str, int]:
    """What running jobs can still write into each target node, by node-name.

    ``targets`` maps a job id to the node its ``target`` edge names in QEMU's
    job graph (``x-debug-query-block-graph``): the node a mirror-based job
    writes. Only an active commit (type ``commit`` with a ``target`` edge)
    counts: it runs as a mirror from the top into its base whose dirty
    bitmap starts as what the layers above the base hold, and every guest
    write during the job adds to it, so its ``len - offset`` is exactly the
    data still to land in the base. A full mirror's progress covers the
    whole virtual disk (QEMU marks it all dirty when it must zero the
    target, as with Proxmox's ``discard=ignore``), and ``block-stream`` and a
    commit of a backing layer (edge ``base``) count every offset too:
    growing by those would make a sparse disk thick, so their targets are
    kept ahead by threshold events alone.

    The figure is idempotent across passes: as the job copies, the target's
    allocation grows by what the remaining work loses, so ``allocation +
    room`` stays put unless the guest writes more. A daemon that restarts
    mid-job computes the same, and a base the storage plugin grew before
    qemu-server's commit (:func:`job_target_size`) already has it.
    """
    room: dict[str, int] = {}
    for job in jobs:
        node = targets.get(job.id)
        if node is not None and counts_data(job):
            room[node] = room.get(node, 0) + job.remaining
    return room


#: The job types that write into a VM's own drives: a commit into its base, a
#: stream into the layer it fills, a mirror into its target.
DRIVE_WRITING_TYPES = frozenset({"commit", "stream", "mirror"})


def writes_drives(job: BlockJob) -> bool:
    """Whether ``job`` may still write into one of its VM's drives (a
    ``backup`` writes elsewhere; a concluded job writes nothing)."""
    return job.type in DRIVE_WRITING_TYPES and job.status in WRITING


def counts_data(job: BlockJob) -> bool:
    """Whether ``job`` may be an active commit that still writes, whose
    progress counts data (see :func:`room_for_jobs`; only the job graph tells
    an active commit from one of a backing layer). The engine reads the
    graph only while such a job exists."""
    return job.type == "commit" and job.status in WRITING
