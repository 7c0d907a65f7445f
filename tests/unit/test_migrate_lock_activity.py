"""REVIEW-3 H4: ``lock: migrate`` is not taken as left over while the source
QEMU shows a migration under way, a mirror of its local disks into the
target's NBD export included (pvestord.policy.vmconfig, pure)."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from pvestord.adapters.qmp import nbd_nodes_from
from pvestord.policy.blockjobs import WRITING, BlockJob
from pvestord.policy.vmconfig import (
    MIGRATE_LOCK_GRACE,
    MIGRATING_STATUSES,
    ConfigLockRule,
    config_lock_rule,
    mirrors_to_nbd,
    nbd_node,
    source_migrating,
)

JOB_STATUSES = sorted(WRITING | {"concluded", "aborting", "null", "pending", "waiting"})
MIGRATE_STATUSES = [None, "none", "completed", "failed", "cancelled",
                    *sorted(MIGRATING_STATUSES)]
NODES = ["#block123", "#block7", "drive-scsi0", "f-scsi1", "nbd-target"]

jobs_strategy = st.lists(st.builds(
    BlockJob, id=st.sampled_from(["drive-scsi0", "drive-scsi1", "commit-drive-scsi0"]),
    type=st.sampled_from(["mirror", "commit", "stream", "backup"]),
    status=st.sampled_from(JOB_STATUSES), paused=st.booleans(),
    io_status=st.sampled_from(["ok", "nospace"])), max_size=4).map(tuple)


@given(jobs=jobs_strategy, nbd=st.frozensets(st.sampled_from(NODES)),
       targets=st.dictionaries(st.sampled_from(["drive-scsi0", "drive-scsi1"]),
                               st.none() | st.sampled_from(NODES)),
       status=st.sampled_from(MIGRATE_STATUSES), age=st.floats(-1e7, 1e7))
def test_a_migrate_lock_defers_while_the_source_shows_a_migration(
        jobs: tuple[BlockJob, ...], nbd: frozenset[str], targets: dict[str, str | None],
        status: str | None, age: float) -> None:
    """Whatever the config's age: a migration status in flight, or a mirror
    that may write with an NBD target (or an unknown target beside an NBD
    node), keeps ``lock: migrate`` deferring; past the grace with neither it
    is left over. Failed on the old code, which knew query-migrate alone."""
    mirroring = any(job.type == "mirror" and job.status in WRITING
                    and (targets.get(job.id) is None or targets.get(job.id) in nbd)
                    for job in jobs) and bool(nbd)
    under_way = source_migrating(migration_status=status, jobs=jobs, nbd_nodes=nbd,
                                 targets=targets)
    assert under_way is (status in MIGRATING_STATUSES or mirroring)
    rule = config_lock_rule("migrate", age=age, in_flight=under_way)
    if under_way or abs(age) < MIGRATE_LOCK_GRACE:
        assert rule is ConfigLockRule.MIGRATING
    else:
        assert rule is ConfigLockRule.STALE_MIGRATE


def test_the_reviews_case_eleven_minutes_into_a_local_disk_mirror() -> None:
    job = BlockJob("drive-scsi1", "mirror", "running", False, "ok", 64 << 30, 1 << 30)
    under_way = source_migrating(migration_status=None, jobs=(job,),
                                 nbd_nodes={"#block410"}, targets={"drive-scsi1": "#block410"})
    assert config_lock_rule("migrate", age=660.0, in_flight=under_way) is \
        ConfigLockRule.MIGRATING
    # The mirror done and cancelled after the switchover, the lock left by a
    # crashed task: left over again.
    assert config_lock_rule("migrate", age=660.0, in_flight=source_migrating(
        migration_status="completed", jobs=())) is ConfigLockRule.STALE_MIGRATE


def test_a_move_disks_mirror_is_no_migration() -> None:
    job = BlockJob("drive-scsi0", "mirror", "ready", False, "ok")
    assert not mirrors_to_nbd((job,), set(), {"drive-scsi0": "#block5"})
    assert not mirrors_to_nbd((job,), {"#block9"}, {"drive-scsi0": "#block5"})


def test_nbd_nodes_as_qemu_names_them() -> None:
    assert nbd_node("nbd", "nbd+unix:///drive-scsi1?socket=/run/qemu-server/101_nbd.migrate")
    assert nbd_node("raw", "nbd://10.0.0.2:60001/drive-scsi1")
    assert nbd_node("raw", "nbd:unix:/run/qemu-server/101_nbd.migrate:exportname=drive-scsi1")
    tree = {"driver": "raw", "file": {"driver": "nbd", "export": "drive-scsi1",
                                      "server": {"type": "unix", "path": "/run/x"}}}
    assert nbd_node("raw", "json:" + json.dumps(tree))
    assert not nbd_node("host_device", "/dev/san/vm-101-disk-0.qcow2")
    assert not nbd_node("qcow2", "json:{not json")
    assert not nbd_node("qcow2", None)
    assert not nbd_node(None, "json:" + json.dumps({"driver": "qcow2"}))


@given(st.lists(st.dictionaries(st.sampled_from(["node-name", "drv", "file"]),
                                st.none() | st.text(max_size=30) | st.integers())))
def test_nbd_nodes_from_any_reply(nodes: list[dict[str, object]]) -> None:
    found = nbd_nodes_from(nodes)
    assert found <= {n["node-name"] for n in nodes if isinstance(n.get("node-name"), str)}
