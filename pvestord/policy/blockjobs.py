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

And two rules for a job that runs, what it can still write into its
target, which the target must have beyond its allocation
(``DriveState.job_room``): the target is kept ahead of the job, not a chunk
behind a threshold event. :func:`room_for_jobs` counts an active commit's
progress; :func:`room_for_copy` counts, for a stream, a commit of a backing
layer or a mirror (:func:`chain_copy`), the data its source layers still
hold past the job's offset, from their allocation map.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

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


#: pmxcfs keeps whole-second mtimes: a config written in the same second as
#: the plugin's record may look up to a second younger than it.
PREPARED_SLACK = 2.0


def prepared_for_delete(prepared_age: float | None, lock_age: float,
                        slack: float = PREPARED_SLACK) -> bool:
    """Whether the storage plugin prepared a running snapshot delete's job.

    qemu-server writes ``lock: snapshot-delete`` into the VM config, then,
    disk by disk, reads the chain through the storage (where the plugin grows
    the job's target and records it, :mod:`pvestord.adapters.preparedjobs`)
    and starts the job; it writes the config again only once a disk is done.
    So a prepared job's target was recorded after the config's last write:
    ``prepared_age`` (None: never recorded) is not older than ``lock_age``.
    """
    return prepared_age is not None and prepared_age <= lock_age + slack


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


def room_for_jobs(jobs: Iterable[BlockJob], graph: Mapping[str, JobEdges]) -> dict[str, int]:
    """What running active commits can still write into each target node, by node-name.

    ``graph`` holds each job's edges in QEMU's job graph
    (``x-debug-query-block-graph``); the ``target`` edge names the node a
    mirror-based job writes. Only an active commit (type ``commit`` with a
    ``target`` edge) counts here: it runs as a mirror from the top into its
    base whose dirty bitmap starts as what the layers above the base hold,
    and every guest write during the job adds to it, so its ``len - offset``
    is exactly the data still to land in the base. A full mirror's progress
    covers the whole virtual disk (QEMU marks it all dirty when it must zero
    the target, as with Proxmox's ``discard=ignore``), and ``block-stream``
    and a commit of a backing layer count every offset too: growing by those
    would make a sparse disk thick. The three are counted from the data
    they copy instead (:func:`chain_copy`, :func:`room_for_copy`).

    The figure is idempotent across passes: as the job copies, the target's
    allocation grows by what the remaining work loses, so ``allocation +
    room`` stays put unless the guest writes more. A daemon that restarts
    mid-job computes the same, and a base the storage plugin grew before
    qemu-server's commit (:func:`job_target_size`) already has it.
    """
    room: dict[str, int] = {}
    for job in jobs:
        edges = graph.get(job.id)
        if edges is not None and edges.target is not None and counts_data(job):
            room[edges.target] = room.get(edges.target, 0) + job.remaining
    return room


@dataclass(frozen=True)
class JobEdges:
    """A block job's edges in QEMU's job graph, by the nodes' names.

    As QEMU names them: seen in 7.2's graph, and read in its source as of
    June 2025, after 10.0 (``block_job_add_bdrv`` in ``block/mirror.c``,
    ``stream.c`` and ``commit.c``): a mirror and an active commit write
    through ``target`` and read their ``source`` (for qemu-server's mirror,
    the drive's throttle node); ``block-stream`` writes into its ``active
    node``; a commit of a backing layer into its ``base``. A stream's and a
    commit's ``intermediate node`` edges are the layers whose data the job
    copies (a stream's: those below its active node, down to its base; a
    commit's: its top down to the layer over its base).
    """

    target: str | None = None
    source: str | None = None
    active: str | None = None
    base: str | None = None
    #: The intermediate nodes, the top of the chain first.
    intermediates: tuple[str, ...] = field(default_factory=tuple)


@dataclass(frozen=True)
class ChainCopy:
    """A job that copies the data of backing-chain layers into a target, in
    offset order: a ``block-stream`` (into the layer over them), a
    ``block-commit`` of a backing layer (into the layer under them), or a
    mirror (a whole chain into a new image: qemu-server's move disk)."""

    job: BlockJob
    #: The format node the job writes.
    target: str
    #: The node whose allocation map (``qemu-img map``) shows, by depth,
    #: which layer holds each range: the stream's target itself, the
    #: commit's top, the mirror's source.
    mapped: str
    #: The depths of that map whose data the job copies.
    depths: range
    #: How many backing layers under the mapped image are opened without
    #: locks, as well as the image itself: those a commit holds against
    #: readers (see :func:`pvestord.adapters.qemu_img.allocation_map`).
    unlocked_backings: int = 0


#: The depths of a map a mirror of a whole chain copies (``sync=full``, the
#: only mode qemu-server uses): every layer. A mirror of the top alone
#: copies less; counting all errs on the side of room.
EVERY_LAYER = range(0, 1 << 16)


def chain_copy(job: BlockJob, edges: JobEdges) -> ChainCopy | None:
    """``job`` as a copy of layers into a target, or None when it is none
    (an active commit, whose progress counts data itself; a job that no
    longer writes; one whose edges QEMU did not show).

    A stream's map is its target's own: depth 0 is what the target holds
    already (the stream copies only what it lacks), depths 1 to k the k
    intermediate layers. A commit's map is its top's: depths 0 to k-1 its
    k intermediate layers, depth k the base it writes. A mirror's map is its
    source's, every depth of it.
    """
    if job.status not in WRITING:
        return None
    if job.type == "mirror" and edges.target is not None and edges.source is not None:
        return ChainCopy(job, edges.target, edges.source, EVERY_LAYER)
    if not edges.intermediates:
        return None
    layers = len(edges.intermediates)
    if job.type == "stream" and edges.active is not None:
        return ChainCopy(job, edges.active, edges.active, range(1, 1 + layers),
                         unlocked_backings=layers)
    if job.type == "commit" and edges.base is not None and edges.target is None:
        return ChainCopy(job, edges.base, edges.intermediates[0], range(layers),
                         unlocked_backings=layers - 1)
    return None


@dataclass(frozen=True)
class Extent:
    """One range of ``qemu-img map --output=json``: where its data lies."""

    start: int
    length: int
    #: How many backing layers down from the mapped image the range is found.
    depth: int
    #: Whether the range holds data (not a hole, not a zero cluster).
    data: bool


def data_left_to_copy(extents: Sequence[Extent], depths: range, offset: int) -> int:
    """The bytes a stream or a commit of a backing layer still copies into
    its target: the data of the layers at ``depths`` past the job's
    ``offset``.

    Both jobs walk the disk in offset order, and their ``offset`` in
    ``query-block-jobs`` is where they are, so data before it has been
    copied. Zero clusters are counted out: they cost the target no data.
    The figure is idempotent, as :func:`room_for_jobs`'s: what the job
    copies leaves this sum for the target's allocation (a commit over a
    base cluster it overwrites in place counts it once too often, which
    errs on the side of room).
    """
    return sum(max(0, extent.start + extent.length - max(extent.start, offset))
               for extent in extents if extent.data and extent.depth in depths)


def room_for_copy(copy: ChainCopy, extents: Sequence[Extent]) -> int:
    """What ``copy`` can still write into its target, given the allocation
    map of its mapped image: the lesser of two bounds on it.

    :func:`data_left_to_copy` past the job's offset bounds every job that
    walks the disk once in offset order, with an offset that never passes
    its position: a stream, a commit, and a mirror whose first pass covers
    the whole disk (QEMU marks it all dirty when it must zero a target that
    cannot unmap, as with Proxmox's ``discard=ignore``; its offset then
    runs with the position, zeroes included). A mirror whose dirty bitmap
    starts as the source's data alone (a zero-initialised target) has
    ``len - offset`` as the exact figure instead, and its offset lags its
    position, so the first bound is loose but still a bound. What the guest
    writes during the job behind its position is left to threshold events:
    it comes at the guest's speed, not the job's.
    """
    return min(copy.job.remaining,
               data_left_to_copy(extents, copy.depths, copy.job.offset))


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
    an active commit from one of a backing layer)."""
    return job.type == "commit" and job.status in WRITING


#: The job types whose target only the job graph names.
GRAPH_TYPES = frozenset({"commit", "stream", "mirror"})


def needs_job_graph(job: BlockJob) -> bool:
    """Whether ``job``'s room can be known only from QEMU's job graph: a
    commit, a stream or a mirror that may still write. The engine reads the
    graph only while such a job exists, so a pass without one costs nothing
    more."""
    return job.type in GRAPH_TYPES and job.status in WRITING
