"""Several things in one manager round: the project's own scenarios in the simulator's format.

Each folder ``tests/fixtures/placement/sim-*/`` holds a scenario written for this project in
pve-ha-manager's simulator test format (``cmdlist``, ``hardware_status``, ``service_config``,
...), a ``README`` saying how its decisions follow from the manager's round, and
``expected.json``: per ``cmdlist`` step, the decisions in the normalised form the suite check
uses, and where each resource ends (state and node).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ha_placement.events import Unsupported, parse_event, sim_events
from ha_placement.explain import render_json, render_text
from ha_placement.inputs import read_sim_test
from ha_placement.manager import MOTION_KINDS, pending_work, predict
from ha_placement.model import (
    Cluster,
    Decision,
    NodeFacts,
    ServiceConfig,
    ServiceStatus,
)
from ha_placement.rules import RuleData
from ha_placement.suite import model_steps

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


def four_nodes_one_failing() -> Cluster:
    """The facts of sim-maintenance-during-fencing, as a running cluster."""
    nodes = {n: NodeFacts(n) for n in ("node1", "node2", "node3", "node4")}
    where = {"vm:101": "node1", "vm:102": "node2", "vm:103": "node3", "vm:104": "node4",
             "vm:105": "node4"}
    return Cluster(nodes=nodes,
                   services={sid: ServiceConfig(sid, node, "started")
                             for sid, node in where.items()},
                   node_status={n: "online" for n in nodes},
                   service_status={sid: ServiceStatus("started", node)
                                   for sid, node in where.items()})


def test_admin_events_whose_outcome_depends_on_the_fence_say_so() -> None:
    """Command-line events come at times the model cannot know: if the maintenance comes
    while node4's fence still waits, vm:104 and vm:105 end elsewhere; both outcomes are
    given, by name, in the text and in --json."""
    prediction = predict(four_nodes_one_failing(),
                         [parse_event("fail=node4"), parse_event("maintenance=node3")])
    assert [list(s) for s in model_steps(prediction.events[0].decisions)] == [
        ["recover", "vm:104", "node1"], ["recover", "vm:105", "node2"]]
    [dependence] = prediction.timing
    assert dependence.resources == ("vm:104", "vm:105")
    assert dependence.outcomes == {"after": {"vm:104": "node1", "vm:105": "node2"},
                                   "during": {"vm:104": "node2", "vm:105": "node1"}}
    text = render_text(prediction)
    assert "timing: where vm:104, vm:105 end depends on when 'maintenance=node3'" in text
    assert "vm:104 node2, vm:105 node1" in text
    timing = render_json(prediction)["timing"]
    assert timing[0]["resources"] == ["vm:104", "vm:105"]
    assert timing[0]["outcomes"]["during"] == {"vm:104": "node2", "vm:105": "node1"}


def test_events_far_apart_in_effect_give_no_timing_note() -> None:
    prediction = predict(four_nodes_one_failing(),
                         [parse_event("maintenance=node3"), parse_event("fail=node4")])
    assert prediction.timing == ()


def three_nodes_two_on_node1() -> Cluster:
    """vm:101 and vm:102 on node1, vm:103 on node2, node3 empty (basic CRS)."""
    return three_nodes({"vm:101": "node1", "vm:102": "node1", "vm:103": "node2"})


def three_nodes(where: dict[str, str]) -> Cluster:
    nodes = {n: NodeFacts(n) for n in ("node1", "node2", "node3")}
    return Cluster(nodes=nodes,
                   services={sid: ServiceConfig(sid, node, "started")
                             for sid, node in where.items()},
                   node_status={n: "online" for n in nodes},
                   service_status={sid: ServiceStatus("started", node)
                                   for sid, node in where.items()})


def test_a_migration_still_running_when_the_next_event_comes_is_named() -> None:
    """How long a live migration takes on the admin's cluster is not known. While vm:101
    migrates node1 -> node3 the manager counts it on both nodes, so vm:103, leaving node2
    for maintenance, takes node3 (node1 2, node3 1); once it has arrived the two tie at 1
    and node1 wins by name. Both outcomes are given, naming vm:103 and the migration."""
    prediction = predict(three_nodes_two_on_node1(),
                         [parse_event("migrate=vm:101@node3"), parse_event("maintenance=node2")])
    assert [list(s) for s in model_steps(prediction.events[1].decisions)] == [
        ["migrate", "vm:103", "node1"]]
    [dependence] = prediction.timing
    assert dependence.kind == "migration"
    assert dependence.resources == ("vm:103",)
    assert dependence.outcomes == {"after": {"vm:103": "node1"}, "during": {"vm:103": "node3"}}
    assert "vm:101" in dependence.pending
    text = render_text(prediction)
    assert "timing: where vm:103 end depends on when 'maintenance=node2'" in text
    assert "migration of vm:101 (node1 -> node3)" in text
    timing = render_json(prediction)["timing"]
    assert timing[0]["kind"] == "migration"
    assert timing[0]["moving"] == ["vm:101"]
    assert timing[0]["outcomes"] == {"after": {"vm:103": "node1"}, "during": {"vm:103": "node3"}}


def test_a_migration_whose_target_fails_meanwhile_goes_on_at_its_source() -> None:
    """The LRM cannot finish a migration to a node that has left the cluster: the manager
    reads the failure and the resource goes on where it is (next_state_migrate_relocate).
    Had it arrived, node3's fence would recover it to the empty node2."""
    prediction = predict(three_nodes({"vm:101": "node1", "vm:102": "node1"}),
                         [parse_event("migrate=vm:101@node3"), parse_event("fail=node3")])
    assert [list(s) for s in model_steps(prediction.events[1].decisions)] == [
        ["recover", "vm:101", "node2"]]
    [dependence] = prediction.timing
    assert (dependence.kind, dependence.resources) == ("migration", ("vm:101",))
    assert dependence.outcomes == {"after": {"vm:101": "node2"}, "during": {"vm:101": "node1"}}


def test_admin_commands_read_in_the_same_round_are_named() -> None:
    """Two commands an admin gives seconds apart reach the manager in one round: then
    neither migration of two resources kept apart vetoes the other, both are carried out,
    and negative affinity sends both back. Once the first is carried out, the second is
    refused. Where the manager puts vm:101 depends on that timing: both outcomes."""
    apart: RuleData = {"type": "resource-affinity", "resources": {"vm:101", "vm:102"},
                       "affinity": "negative"}
    cluster = replace(three_nodes({"vm:101": "node1", "vm:102": "node2"}),
                      rules={"keep-apart": apart}, rule_order={"keep-apart": 1})
    prediction = predict(cluster, [parse_event("migrate=vm:101@node3"),
                                   parse_event("migrate=vm:102@node3")])
    assert [list(s) for s in model_steps(prediction.events[1].decisions)] == [
        ["veto", "vm:102", "node3"]]
    [dependence] = prediction.timing
    assert dependence.kind == "same-round"
    assert dependence.resources == ("vm:101",)
    assert dependence.outcomes == {"after": {"vm:101": "node3"}, "during": {"vm:101": "node1"}}
    text = render_text(prediction)
    assert "timing: where vm:101 end depends on when 'migrate=vm:102@node3' comes" in text
    assert "before the manager has read 'migrate=vm:101@node3'" in text
    assert render_json(prediction)["timing"][0]["kind"] == "same-round"


KINDS = ("migrate", "relocate", "manual-migrate", "manual-relocate", "follow", "recover",
         "recover-failed", "auto-rebalance", "veto", "stuck", "back", "move-stopped")


@given(st.lists(st.tuples(st.sampled_from(KINDS), st.sampled_from(["vm:101", "ct:102", "vm:9"]),
                          st.sampled_from(["node1", "node2"]),
                          st.sampled_from(["node2", "node3"])), max_size=8))
def test_pending_work_names_what_each_decision_leaves_running(
        made: list[tuple[str, str, str, str]]) -> None:
    """The alternatives an admin's event gets: a fence after a recovery, the hold after an
    auto-rebalance choice (not both), the migrations of exactly the resources a decision
    started moving, and always, last, the next event read in the same round."""
    decisions = [Decision(kind, sid, source, target) for kind, sid, source, target in made]
    following = parse_event("maintenance=node3")
    work = pending_work(parse_event("fail=node1"), decisions, following)
    kinds = [w.kind for w in work]
    made_kinds = {kind for kind, *_ in made}
    assert ("fence" in kinds) == bool(made_kinds & {"recover", "recover-failed"})
    assert ("hold" in kinds) == ("auto-rebalance" in made_kinds and "fence" not in kinds)
    moving = tuple(sorted({sid for kind, sid, *_ in made if kind in MOTION_KINDS}))
    assert [w.moving for w in work if w.kind == "migration"] == ([moving] if moving else [])
    assert kinds[-1] == "same-round"
    assert work[-1].next_event.after_rounds == 0
    assert all(w.next_event.label == following.label for w in work)


@pytest.mark.parametrize("step", [["skip-round crm 3"], ["skip-round lrm 7"],
                                  ["skip-round lrm 2", "skip-round lrm"]])
def test_skipped_rounds_past_the_watchdog_are_not_modelled(step: list[str]) -> None:
    """The simulator's daemons update their watchdog (60 s) only in the rounds they run:
    three skipped 20 s rounds let the master's (crm) or every active LRM's (lrm) watchdog
    fire and power its node off (TestHardware.pm's loop, Hardware.pm's watchdog_check),
    which the model does not play; it refuses the step instead of predicting a calm run."""
    with pytest.raises(Unsupported, match="watchdog"):
        sim_events([["power node1 on"], step])
    assert sim_events([["power node1 on"], ["skip-round crm 2", "skip-round lrm 2"]])
