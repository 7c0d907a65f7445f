"""Block jobs on thin drives: the target's room and when a paused job runs again."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from pvestord.adapters.qmp import block_jobs_from, run_state_from
from pvestord.features import plugin
from pvestord.policy import BlockJob, job_target_size, jobs_to_resume

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
        BlockJob("commit-drive-scsi0", "commit", "paused", True, "nospace"),)
    assert block_jobs_from({"return": []}) == ()
    state = run_state_from({"running": True, "status": "running"}, [], reply)
    assert state.jobs_paused_for_room and not state.paused_for_room


@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=4)
                    | st.dictionaries(st.sampled_from(["device", "type", "status", "paused",
                                                       "io-status"]), inner, max_size=5),
                    max_leaves=20))
def test_block_jobs_from_never_raises(reply: object) -> None:
    for found in block_jobs_from(reply):
        assert isinstance(found.id, str) and isinstance(found.paused, bool)
