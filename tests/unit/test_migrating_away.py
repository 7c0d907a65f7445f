"""Whether a VM is the source of a live migration: query-migrate and the run state together."""

from __future__ import annotations

from typing import Any

import pytest

from pvestord.adapters.qmp import BlockNodes, RunState
from pvestord.engine.migration import migrating_away
from pvestord.policy import BlockJob, JobEdges


def mirror(status: str = "ready") -> BlockJob:
    """qemu-server's mirror of a local disk (its job id is the drive's)."""
    return BlockJob("drive-scsi1", "mirror", status, False, "ok", 10, 10)


class FakeMonitor:
    """Stands in for a VmMonitor: canned query-migrate, run state, block
    jobs, NBD nodes and job graph (the mirror's target edge)."""

    def __init__(self, migrate: Any, status: str, jobs: tuple[BlockJob, ...] = (),
                 nbd: frozenset[str] = frozenset(),
                 graph: dict[str, JobEdges] | None = None) -> None:
        self.migrate = migrate
        self.status = status
        self.jobs = jobs
        self.nbd = nbd
        self.graph = graph or {}

    async def execute(self, command: str) -> Any:
        assert command == "query-migrate"
        return self.migrate

    async def run_state(self) -> RunState:
        return RunState(self.status == "running", self.status, (), (), self.jobs)

    async def block_jobs(self) -> tuple[BlockJob, ...]:
        return self.jobs

    async def block_nodes(self) -> BlockNodes:
        return BlockNodes([], set(self.nbd), {}, self.nbd)

    async def job_graph(self) -> dict[str, JobEdges]:
        return self.graph


@pytest.mark.parametrize(("migrate", "status", "away"), [
    ({}, "running", False),                                   # never migrated
    ({"status": "active"}, "running", True),                  # source, pre-copy
    ({"status": "active"}, "io-error", True),                 # source, paused on ENOSPC
    ({"status": "pre-switchover"}, "finish-migrate", True),
    ({"status": "completed"}, "postmigrate", True),           # source, VM gone to the other node
    ({"status": "completed"}, "finish-migrate", True),
    ({"status": "completed"}, "running", False),              # destination, after the switchover
    ({"status": "completed"}, "io-error", False),             # destination, arrived paused
    ({"status": "failed"}, "running", False),                 # the VM stayed here
    ({"status": "cancelled"}, "running", False),
    (["junk"], "running", False),
])
async def test_migrating_away(migrate: Any, status: str, away: bool) -> None:
    assert await migrating_away(FakeMonitor(migrate, status)) is away  # type: ignore[arg-type]


@pytest.mark.parametrize(("jobs", "nbd", "graph", "away"), [
    # --with-local-disks: the local disk mirrored into the target's NBD
    # export before `migrate` (query-migrate empty): migrating away.
    ((mirror("running"),), {"#block123"}, {"drive-scsi1": JobEdges(target="#block123")}, True),
    ((mirror("ready"),), {"#block123"}, {"drive-scsi1": JobEdges(target="#block123")}, True),
    # No job graph (a debug command): any NBD node with a mirror counts.
    ((mirror("running"),), {"#block123"}, {}, True),
    # A move disk's mirror into a local LV: not a migration.
    ((mirror("running"),), set(), {"drive-scsi1": JobEdges(target="new-lv")}, False),
    ((mirror("running"),), {"#block9"}, {"drive-scsi1": JobEdges(target="new-lv")}, False),
    # A mirror that concluded writes nothing more.
    ((mirror("concluded"),), {"#block123"}, {}, False),
    # A commit is never the migration's.
    ((BlockJob("drive-scsi1", "commit", "running", False, "ok"),), {"#block123"}, {}, False),
])
async def test_a_mirror_into_an_nbd_export_is_migrating_away(
        jobs: tuple[BlockJob, ...], nbd: set[str], graph: dict[str, JobEdges],
        away: bool) -> None:
    """The source's mirror of its local disks counts (failed on
    the old code, which asked query-migrate alone)."""
    monitor = FakeMonitor({}, "running", jobs, frozenset(nbd), graph)
    assert await migrating_away(monitor) is away  # type: ignore[arg-type]
