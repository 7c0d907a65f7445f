"""Several things in one manager round: the project's own scenarios in the simulator's format.

Each folder ``tests/fixtures/placement/sim-*/`` holds a scenario written for this project in
pve-ha-manager's simulator test format (``cmdlist``, ``hardware_status``, ``service_config``,
...), a ``README`` saying how its decisions follow from the manager's round, and
``expected.json``: per ``cmdlist`` step, the decisions in the normalised form the suite check
uses, and where each resource ends (state and node).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pvestord.features.placement.inputs import read_sim_test
from pvestord.features.placement.manager import predict
from pvestord.features.placement.suite import model_steps

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "placement"
SIM_SCENARIOS = sorted(p for p in FIXTURES.glob("sim-*") if (p / "cmdlist").is_file())


@pytest.mark.parametrize("folder", SIM_SCENARIOS, ids=[p.name for p in SIM_SCENARIOS])
def test_round_scenario_gives_the_derived_decisions(folder: Path) -> None:
    expected = json.loads((folder / "expected.json").read_text())
    cluster, events = read_sim_test(folder)
    prediction = predict(cluster, events)
    assert len(prediction.events) == len(expected["events"])
    for result, want in zip(prediction.events, expected["events"], strict=True):
        assert result.label == want["event"]
        assert [list(step) for step in model_steps(result.decisions)] == want["decisions"], \
            want["event"]
        assert {sid: list(where) for sid, where in result.placement.items()} == want["final"], \
            want["event"]
