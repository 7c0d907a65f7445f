"""Block jobs on thin drives: the target's room and when a paused job runs again."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from pvestord.adapters.qmp import block_jobs_from, job_targets_from, run_state_from
from pvestord.features import plugin
from pvestord.policy import (
    BlockJob,
    DriveState,
    Extend,
    decide,
    job_target_size,
    jobs_to_resume,
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
#: the top "f-top" into its base "#block117", next to a mirror "m0".
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
    assert job_targets_from(GRAPH) == {"commit0": "#block117", "m0": "tgt"}
    assert job_targets_from({"nodes": "x", "edges": []}) == {}
    assert job_targets_from([]) == {}


@given(st.recursive(st.none() | st.booleans() | st.integers(0, 8) | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=4)
                    | st.dictionaries(st.sampled_from(["nodes", "edges", "id", "type", "name",
                                                       "parent", "child"]), inner, max_size=6),
                    max_leaves=30))
def test_job_targets_from_never_raises(graph: object) -> None:
    for job, node in job_targets_from(graph).items():
        assert isinstance(job, str) and isinstance(node, str)


def running(job_id: str, kind: str, length: int, offset: int) -> BlockJob:
    return BlockJob(job_id, kind, "running", False, "ok", length=length, offset=offset)


def test_only_an_active_commit_gives_its_target_room() -> None:
    # A full mirror's len is the whole virtual disk (measured with QEMU 7.2
    # and Proxmox's discard=ignore): growing by it would make the disk thick.
    jobs = [running("commit0", "commit", 64 * MiB, 16 * MiB),
            running("m0", "mirror", 1024 * MiB, 16 * MiB),
            running("c-base", "commit", 1024 * MiB, 0)]  # a commit of a backing layer
    targets = {"commit0": "#block117", "m0": "tgt"}
    assert room_for_jobs(jobs, targets) == {"#block117": 48 * MiB}


def test_a_commit_that_has_stopped_writing_gives_no_room() -> None:
    # A commit failed half-way and not dismissed keeps its progress.
    for status, room in (("concluded", {}), ("aborting", {}), ("pending", {}),
                         ("paused", {"base": 4}), ("ready", {"base": 4})):
        job = BlockJob("c", "commit", status, status == "paused", "ok", length=5, offset=1)
        assert room_for_jobs([job], {"c": "base"}) == room, status



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
