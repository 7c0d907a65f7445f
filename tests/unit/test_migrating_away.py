"""Whether a VM is the source of a live migration: query-migrate and the run state together."""

from __future__ import annotations

from typing import Any

import pytest

from pvestord.adapters.qmp import RunState
from pvestord.engine.migration import migrating_away


class FakeMonitor:
    """Stands in for a VmMonitor: canned query-migrate and run state."""

    def __init__(self, migrate: Any, status: str) -> None:
        self.migrate = migrate
        self.status = status

    async def execute(self, command: str) -> Any:
        assert command == "query-migrate"
        return self.migrate

    async def run_state(self) -> RunState:
        return RunState(self.status == "running", self.status, (), ())


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
