"""Block jobs on thin drives: the target's room and when a paused job runs again."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from pvestord.adapters.qemu_img import parse_map
from pvestord.adapters.qmp import block_jobs_from, filenames_from, job_graph_from, run_state_from
from pvestord.features import plugin
from pvestord.policy import (
    EVERY_LAYER,
    BlockJob,
    ChainCopy,
    DriveState,
    Extend,
    Extent,
    JobEdges,
    chain_copy,
    data_left_to_copy,
    decide,
    job_target_size,
    jobs_to_resume,
    room_for_copy,
    room_for_jobs,
    writes_drives,
)

MiB = 1024 * 1024
sizes = st.integers(min_value=0, max_value=1 << 44)
extents = st.sampled_from([4 * MiB, 8 * MiB, 32 * MiB])


def job(job_id: str = "mirror0", *, paused: bool = True, io_status: str = "nospace") -> BlockJob:
    return BlockJob(job_id, "mirror", "paused" if paused else "running", paused, io_status)


@given(sizes, sizes, sizes, st.integers(min_value=1, max_value=1 << 34), extents)
def test_a_job_target_holds_what_the_source_can_bring_within_its_maximum(
        lv: int, source: int, maximum: int, chunk: int, extent: int) -> None:
    size = job_target_size(lv, source, maximum, chunk, extent)
    assert size >= lv  # never shrinks
    assert size == lv or size % extent == 0
    cap = -(-maximum // extent) * extent
    assert size <= max(lv, cap)
    assert size >= min(lv + source + chunk, cap)


def test_the_plugin_and_the_daemon_share_one_rule() -> None:
    assert plugin.commit_lv_size is job_target_size


def test_only_a_job_paused_on_enospc_is_resumed() -> None:
    jobs = [job("a"), job("admin", io_status="ok"), job("broken", io_status="failed"),
            job("running", paused=False, io_status="nospace")]
    assert jobs_to_resume(jobs, need_more=False, failed=False, resumed_at={}, room=0) == ["a"]


def test_no_job_resumed_while_a_drive_still_lacks_room() -> None:
    assert jobs_to_resume([job()], need_more=True, failed=False, resumed_at={}, room=0) == []
    assert jobs_to_resume([job()], need_more=False, failed=True, resumed_at={}, room=0) == []


@given(st.integers(min_value=0, max_value=1 << 40), st.integers(min_value=0, max_value=1 << 40))
def test_a_job_is_resumed_again_only_after_room_was_made(before: int, now: int) -> None:
    # Its ENOSPC on a device pvestord does not grow must not become a loop.
    resumed = jobs_to_resume([job()], need_more=False, failed=False,
                             resumed_at={"mirror0": before}, room=now)
    assert resumed == (["mirror0"] if now > before else [])


def test_query_block_jobs_reply_read_and_junk_skipped() -> None:
    reply = [{"device": "commit-drive-scsi0", "type": "commit", "status": "paused",
              "paused": True, "io-status": "nospace", "len": 5, "offset": 1, "busy": False,
              "ready": False, "speed": 0, "auto-finalize": True, "auto-dismiss": True},
             {"device": 5, "type": "mirror", "status": "running", "paused": False,
              "io-status": "ok"},
             {"device": "x", "type": "mirror", "status": "running", "paused": "no",
              "io-status": "ok"}, "junk"]
    assert block_jobs_from(reply) == (
        BlockJob("commit-drive-scsi0", "commit", "paused", True, "nospace", length=5, offset=1),)
    assert block_jobs_from(reply)[0].remaining == 4
    assert block_jobs_from({"return": []}) == ()
    state = run_state_from({"running": True, "status": "running"}, [], reply)
    assert state.jobs_paused_for_room and not state.paused_for_room


@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=4)
                    | st.dictionaries(st.sampled_from(["device", "type", "status", "paused",
                                                       "io-status", "len", "offset"]),
                                      inner, max_size=7),
                    max_leaves=20))
def test_block_jobs_from_never_raises(reply: object) -> None:
    for found in block_jobs_from(reply):
        assert isinstance(found.id, str) and isinstance(found.paused, bool)
        assert found.remaining >= 0


# -- an active commit's target kept ahead of the job

#: x-debug-query-block-graph as QEMU 7.2 gives it for an active commit of
#: the top "f-top" into its base "#block117", next to a mirror "m0" (whose
#: source edge is left out).
GRAPH = {
    "nodes": [{"id": 1, "type": "block-job", "name": "commit0"},
              {"id": 2, "type": "block-driver", "name": "#block361"},
              {"id": 3, "type": "block-driver", "name": "f-top"},
              {"id": 4, "type": "block-driver", "name": "#block117"},
              {"id": 5, "type": "block-backend", "name": "drive-scsi0"},
              {"id": 6, "type": "block-job", "name": "m0"},
              {"id": 7, "type": "block-driver", "name": "tgt"}],
    "edges": [{"parent": 1, "child": 2, "name": "main node", "perm": [], "shared-perm": []},
              {"parent": 1, "child": 3, "name": "source", "perm": [], "shared-perm": []},
              {"parent": 1, "child": 4, "name": "target", "perm": [], "shared-perm": []},
              {"parent": 5, "child": 3, "name": "root", "perm": [], "shared-perm": []},
              {"parent": 6, "child": 7, "name": "target", "perm": [], "shared-perm": []}],
}


def test_job_targets_read_from_the_graph() -> None:
    assert job_graph_from(GRAPH) == {"commit0": JobEdges(target="#block117", source="f-top"),
                                     "m0": JobEdges(target="tgt")}
    assert job_graph_from({"nodes": "x", "edges": []}) == {}
    assert job_graph_from([]) == {}


@given(st.recursive(st.none() | st.booleans() | st.integers(0, 8) | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=4)
                    | st.dictionaries(st.sampled_from(["nodes", "edges", "id", "type", "name",
                                                       "parent", "child"]), inner, max_size=6),
                    max_leaves=30))
def test_job_graph_from_never_raises(graph: object) -> None:
    for job, edges in job_graph_from(graph).items():
        assert isinstance(job, str)
        for node in (edges.target, edges.source, edges.active, edges.base):
            assert node is None or isinstance(node, str)
        assert all(isinstance(node, str) for node in edges.intermediates)


def running(job_id: str, kind: str, length: int, offset: int) -> BlockJob:
    return BlockJob(job_id, kind, "running", False, "ok", length=length, offset=offset)


def test_only_an_active_commit_gives_its_target_room() -> None:
    # A full mirror's len is the whole virtual disk (measured with QEMU 7.2
    # and Proxmox's discard=ignore): growing by it would make the disk thick.
    jobs = [running("commit0", "commit", 64 * MiB, 16 * MiB),
            running("m0", "mirror", 1024 * MiB, 16 * MiB),
            running("c-base", "commit", 1024 * MiB, 0)]  # a commit of a backing layer
    graph = {"commit0": JobEdges(target="#block117"), "m0": JobEdges(target="tgt"),
             "c-base": JobEdges(base="b", intermediates=("mid",))}
    assert room_for_jobs(jobs, graph) == {"#block117": 48 * MiB}


def test_a_commit_that_has_stopped_writing_gives_no_room() -> None:
    # A commit failed half-way and not dismissed keeps its progress.
    for status, room in (("concluded", {}), ("aborting", {}), ("pending", {}),
                         ("paused", {"base": 4}), ("ready", {"base": 4})):
        job = BlockJob("c", "commit", status, status == "paused", "ok", length=5, offset=1)
        assert room_for_jobs([job], {"c": JobEdges(target="base")}) == room, status



def test_jobs_that_write_into_the_vms_drives() -> None:
    """What lets a snapshot delete's job be served through its config lock
    (pvestord.policy.vmconfig.grows_while_renaming): the jobs qemu-server runs
    for it, and a mirror, while they may still write; not a backup."""
    for kind in ("commit", "stream", "mirror"):
        for status, writes in (("running", True), ("paused", True), ("ready", True),
                               ("created", True), ("concluded", False),
                               ("aborting", False), ("null", False)):
            assert writes_drives(BlockJob("j", kind, status, False, "ok")) == writes, \
                (kind, status)
    assert not writes_drives(BlockJob("b", "backup", "running", False, "ok"))

def drive(lv: int, allocation: int, room: int, chunk: int, extent: int) -> DriveState:
    return DriveState(lv_size=lv, allocation=allocation, threshold=0,
                      virtual_size=1 << 40, maximum=1 << 41, extent_size=extent,
                      chunksize=chunk, chunk_percentage=0.5, job_room=room)


@given(st.integers(1, 1 << 16), st.integers(0, 1 << 34), st.integers(0, 1 << 34),
       st.integers(1, 1 << 30), extents, st.lists(st.integers(0, 1 << 30), max_size=8))
def test_a_commit_target_grows_once_for_the_job_however_far_it_has_got(
        lv_extents: int, allocation: int, room: int, chunk: int, extent: int,
        copies: list[int]) -> None:
    """The target is grown once to hold what the job can still write; as the
    job copies, the allocation gains what the remaining work loses, so no pass
    grows it again, whenever it looks (or a restarted daemon looks)."""
    lv = lv_extents * extent
    first = decide(drive(lv, allocation, room, chunk, extent))
    size = first.target if isinstance(first, Extend) else lv
    assert size >= allocation + room + chunk // 2
    for copied in copies:
        copied = min(copied, room)
        later = drive(size, allocation + copied, room - copied, chunk, extent)
        assert not isinstance(decide(later), Extend)


@given(st.integers(0, 1 << 34), st.integers(1, 1 << 34), st.integers(1, 1 << 30), extents)
def test_guest_writes_during_an_active_commit_grow_its_target(
        room: int, written: int, chunk: int, extent: int) -> None:
    first = decide(drive(extent, 0, room, chunk, extent))
    size = first.target if isinstance(first, Extend) else extent
    # The guest wrote ``written`` more during the job: mirrored into the base, too.
    decision = decide(drive(size, 0, room + written, chunk, extent))
    if room + written + -(-chunk // 2) > size:
        assert isinstance(decision, Extend)
        assert decision.target >= room + written + chunk
    else:
        assert not isinstance(decision, Extend)


# -- a stream, or a commit of a backing layer, kept ahead by its data

def _graph(nodes: dict[int, tuple[str, str]], edges: list[tuple[int, str, int]]) -> object:
    return {"nodes": [{"id": i, "type": kind, "name": name}
                      for i, (kind, name) in nodes.items()],
            "edges": [{"parent": parent, "name": name, "child": child,
                       "perm": [], "shared-perm": []} for parent, name, child in edges]}


#: x-debug-query-block-graph of QEMU 7.2 for a ``block-stream`` of "top" (no
#: base: both backing layers are copied) and, in a second VM, a
#: ``block-commit`` of "mid" into "base" under a top, as printed on this machine.
STREAM_GRAPH = _graph(
    {1: ("block-job", "j"), 2: ("block-driver", "#block540"), 3: ("block-driver", "top"),
     4: ("block-driver", "#block248"), 5: ("block-driver", "#block429"),
     6: ("block-driver", "#block025"), 7: ("block-backend", "")},
    [(2, "file", 3), (4, "backing", 5), (3, "file", 6), (3, "backing", 4),
     (1, "main node", 2), (1, "active node", 3), (1, "intermediate node", 5),
     (1, "intermediate node", 4), (7, "root", 2)])
COMMIT_GRAPH = _graph(
    {1: ("block-job", "j"), 2: ("block-driver", "#block508"), 3: ("block-driver", "#block213"),
     4: ("block-driver", "#block497"), 5: ("block-driver", "top"),
     6: ("block-driver", "#block036"), 7: ("block-backend", "")},
    [(2, "backing", 3), (3, "backing", 4), (5, "file", 6), (5, "backing", 2),
     (1, "main node", 5), (1, "intermediate node", 3), (1, "base", 4), (7, "root", 3)])


def test_a_stream_and_a_backing_commit_read_from_the_graph() -> None:
    # The stream's intermediates come top first whatever order QEMU lists them in.
    stream = job_graph_from(STREAM_GRAPH)["j"]
    assert stream == JobEdges(active="top", intermediates=("#block248", "#block429"))
    job = running("j", "stream", 1 << 30, 0)
    # Its layers are read with locking=off, as a commit's must be.
    assert chain_copy(job, stream) == ChainCopy(job, "top", "top", range(1, 3),
                                                unlocked_backings=2)

    commit = job_graph_from(COMMIT_GRAPH)["j"]
    assert commit == JobEdges(base="#block497", intermediates=("#block213",))
    job = running("j", "commit", 1 << 30, 0)
    assert chain_copy(job, commit) == ChainCopy(job, "#block497", "#block213", range(1))


#: x-debug-query-block-graph of QEMU 7.2 for a ``blockdev-mirror`` with
#: ``sync=full`` of "ftop" (over a backing layer) into "ftgt", as printed on
#: this machine.
MIRROR_GRAPH = _graph(
    {1: ("block-job", "mirror-scsi0"), 2: ("block-driver", "#block233"),
     3: ("block-driver", "ftop"), 4: ("block-driver", "ftgt"), 5: ("block-driver", "etgt"),
     6: ("block-driver", "#block199"), 7: ("block-driver", "#block096"),
     8: ("block-driver", "etop"), 9: ("block-backend", "")},
    [(2, "backing", 3), (4, "file", 5), (6, "file", 7), (3, "file", 8), (3, "backing", 6),
     (1, "main node", 2), (1, "source", 3), (1, "target", 4), (9, "root", 4)])


def test_a_mirror_copies_its_whole_source_chain_into_its_target() -> None:
    edges = job_graph_from(MIRROR_GRAPH)["mirror-scsi0"]
    assert edges == JobEdges(target="ftgt", source="ftop")
    job = running("mirror-scsi0", "mirror", 1 << 30, 0)
    assert chain_copy(job, edges) == ChainCopy(job, "ftgt", "ftop", EVERY_LAYER)
    assert 7 in EVERY_LAYER  # however deep the chain


def test_only_jobs_that_copy_layers_and_write_are_chain_copies() -> None:
    # An active commit counts its own progress; a mirror needs both its edges.
    assert chain_copy(running("c", "commit", 5, 0), JobEdges(target="b", source="t")) is None
    assert chain_copy(running("m", "mirror", 5, 0), JobEdges(target="t")) is None
    ready = BlockJob("m", "mirror", "concluded", False, "ok", length=5, offset=5)
    assert chain_copy(ready, JobEdges(target="t", source="s")) is None
    done = BlockJob("s", "stream", "concluded", False, "ok", length=5, offset=5)
    assert chain_copy(done, JobEdges(active="t", intermediates=("m",))) is None
    # A stream of a layer with nothing between it and its base copies nothing.
    assert chain_copy(running("s", "stream", 5, 0), JobEdges(active="t")) is None


def test_a_map_read_and_junk_refused() -> None:
    # As qemu-img 7.2 printed it for top -> mid -> base above.
    printed = [{"start": 0, "length": 8 * MiB, "depth": 2, "present": True, "zero": False,
                "data": True, "offset": 327680},
               {"start": 8 * MiB, "length": 8 * MiB, "depth": 2, "present": False,
                "zero": True, "data": False},
               {"start": 16 * MiB, "length": 8 * MiB, "depth": 1, "present": True,
                "zero": False, "data": True, "offset": 327680}]
    assert parse_map(printed) == [Extent(0, 8 * MiB, 2, True), Extent(8 * MiB, 8 * MiB, 2, False),
                                  Extent(16 * MiB, 8 * MiB, 1, True)]
    for junk in ({"start": 0}, [{"start": "0", "length": 1, "depth": 0, "data": True}],
                 [{"start": 0, "length": 1, "depth": 0}], ["x"],
                 [{"start": 0, "length": 1, "depth": True, "data": True}]):
        try:
            parse_map(junk)
        except (TypeError, KeyError):
            continue
        raise AssertionError(f"{junk!r} read as a map")


def test_filenames_of_the_nodes() -> None:
    nodes = [{"node-name": "f1", "file": "/dev/vg/vm-100-disk-0.qcow2"},
             {"node-name": "f2", "file": 'json:{"backing": {}, "driver": "qcow2", '
                                          '"file": {"driver": "host_device", '
                                          '"filename": "/dev/vg/snap.qcow2"}}'},
             # QEMU 7.2's name of Proxmox's throttle node: its qcow2 child's image.
             {"node-name": "drive-scsi0", "file": 'json:{"throttle-group": "throttle-drive-scsi0",'
                                                   ' "driver": "throttle", "file": {"driver": '
                                                   '"qcow2", "file": {"driver": "file", '
                                                   '"filename": "/dev/vg/top.qcow2"}}}'},
             {"node-name": 3, "file": "/x"}, "junk", {"node-name": "nofile"}]
    assert filenames_from(nodes) == {"f1": "/dev/vg/vm-100-disk-0.qcow2",
                                     "f2": "/dev/vg/snap.qcow2",
                                     "drive-scsi0": "/dev/vg/top.qcow2"}
    assert filenames_from({"return": []}) == {}


CLUSTER = 64 * 1024


@st.composite
def chains(draw: st.DrawFn) -> tuple[list[Extent], int, int]:
    """A map of a stream's target over ``layers`` backing layers, in whole
    clusters, with the number of layers the stream copies."""
    layers = draw(st.integers(1, 4))
    copied = draw(st.integers(1, layers))
    extents, start = [], 0
    for _ in range(draw(st.integers(0, 24))):
        length = draw(st.integers(1, 64)) * CLUSTER
        extents.append(Extent(start, length, draw(st.integers(0, layers)), draw(st.booleans())))
        start += length
    return extents, copied, start


@given(chains(), st.lists(st.integers(0, 1 << 30), max_size=6))
def test_a_stream_target_needs_its_room_once_however_far_the_job_has_got(
        chain: tuple[list[Extent], int, int], offsets: list[int]) -> None:
    """As a stream copies, each range it passes moves to depth 0 (the target
    holds it) and the target's allocation grows by the data moved: allocation
    plus what is left stays put, so no pass grows the target twice, and what
    is left never counts data below the stream's base or already copied."""
    extents, copied, end = chain
    depths = range(1, 1 + copied)
    room = data_left_to_copy(extents, depths, 0)
    assert room == sum(e.length for e in extents if e.data and 1 <= e.depth <= copied)
    for offset in sorted(min(o, end) for o in offsets):
        done = [Extent(e.start, e.length, 0, e.data)
                if e.start + e.length <= offset and e.depth in depths else e for e in extents]
        gained = sum(e.length for e, was in zip(done, extents, strict=True)
                     if e.data and e.depth == 0 and was.depth in depths)
        # Mid-range, the job's offset counts the part of a range already copied.
        assert data_left_to_copy(done, depths, offset) + gained <= room
        assert data_left_to_copy(done, depths, offset) + gained >= room - sum(
            e.length for e in extents if e.start < offset < e.start + e.length)


@given(chains(), st.integers(0, 1 << 31), st.integers(0, 1 << 31))
def test_a_copy_is_given_the_lesser_of_its_data_and_its_work_left(
        chain: tuple[list[Extent], int, int], length: int, offset: int) -> None:
    """A mirror whose bitmap holds only the source's data has ``len -
    offset`` exact and the map loose; one that walks the whole disk the
    other way round. Either bound is kept, never more than the data left."""
    extents, _, _ = chain
    job = BlockJob("m", "mirror", "running", False, "ok", length=length, offset=offset)
    copy = ChainCopy(job, "ftgt", "ftop", EVERY_LAYER)
    room = room_for_copy(copy, extents)
    assert room == min(job.remaining, data_left_to_copy(extents, EVERY_LAYER, offset))
    assert room <= sum(e.length for e in extents if e.data)
    assert room <= max(0, length - offset)
