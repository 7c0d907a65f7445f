"""``pvestord placement``: the model's decisions on the project's own scenarios, its properties,
the cluster-folder reader and the command.

The scenarios in ``tests/fixtures/placement/`` are facts written in this project's own format
(nodes, resources, rules, events, expected decisions); the check against pve-ha-manager's own
suite is in ``test_placement_suite.py``.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ha_placement import MODEL, scores
from ha_placement.events import EventError, parse_event, sim_command
from ha_placement.explain import cannot_place, render_json, render_text
from ha_placement.inputs import read_pve_dir
from ha_placement.manager import predict
from ha_placement.model import (
    Cluster,
    Event,
    NodeFacts,
    Prediction,
    ServiceConfig,
    ServiceStatus,
)
from ha_placement.rules import RuleData
from pvestord.cli import main
from pvestord.engine.nodereport import NodeReport, StorageView, publish
from tests.harness.placementbed import FIXTURES, write_pve_dir

SCENARIOS = sorted(FIXTURES.glob("*.json"))


def rule_data(rule: dict[str, Any]) -> RuleData:
    out: RuleData = {"type": rule["type"], "resources": set(rule["resources"])}
    if rule["type"] == "node-affinity":
        out["nodes"] = dict(rule["nodes"])
        if rule.get("strict"):
            out["strict"] = 1
    else:
        out["affinity"] = rule["affinity"]
    return out


def cluster_from_facts(facts: dict[str, Any]) -> Cluster:
    """A running cluster: every node online, every resource started where the facts say."""
    nodes = {n: NodeFacts(n) for n in facts["nodes"]}
    services = {sid: ServiceConfig(sid, s["node"], s.get("state", "started"),
                                   failback=s.get("failback", True))
                for sid, s in facts["services"].items()}
    rules = {r["id"]: rule_data(r) for r in facts["rules"]}
    return Cluster(
        nodes=nodes, services=services, rules=rules,
        rule_order={rid: i for i, rid in enumerate(rules, 1)},
        node_status={n: "online" for n in nodes},
        service_status={sid: ServiceStatus("started", s.node) for sid, s in services.items()
                        if s.state == "started"})


def steps(prediction: Prediction, index: int) -> list[list[str]]:
    return [[d.kind, d.sid, d.target or ""] for d in prediction.events[index].decisions]


@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_scenario_facts(path: Path) -> None:
    facts = json.loads(path.read_text())
    prediction = predict(cluster_from_facts(facts),
                         [parse_event(e["event"]) for e in facts["events"]])
    for index, expected in enumerate(facts["events"]):
        result = prediction.events[index]
        assert steps(prediction, index) == expected["decisions"], expected["event"]
        assert {sid: node for sid, (_, node) in result.placement.items()} == expected["final"]
        assert sorted(result.unplaced) == sorted(expected.get("unplaced", []))
    assert (3 if cannot_place(prediction) else 0) == facts["exit_status"]


def test_forum_scenario_1_explains_why_the_pair_never_returns() -> None:
    facts = json.loads((FIXTURES / "forum-s1-keep-together.json").read_text())
    prediction = predict(cluster_from_facts(facts),
                         [parse_event("maintenance=node3"), parse_event("end-maintenance=node3")])
    stay = prediction.events[1].decisions[0].selection
    assert stay is not None and stay.step == "stays" and stay.together == {"node2": 1}
    assert stay.excluded["node3"].startswith("not the positive-affinity majority node")
    text = render_text(prediction)
    assert "positive affinity is applied before the maintenance fallback" in text
    assert MODEL in text


def test_forum_scenario_2_names_every_node_left_out() -> None:
    facts = json.loads((FIXTURES / "forum-s2-keep-apart.json").read_text())
    prediction = predict(cluster_from_facts(facts), [parse_event("maintenance=node3")])
    stuck = prediction.events[0].decisions[0].selection
    assert stuck is not None and stuck.node is None
    assert stuck.excluded == {
        "node1": "lower priority class (-1) than {node2} in rule prefer-2-3",
        "node2": "hosts vm:102 (negative affinity, rule keep-apart)",
        "node3": "maintenance"}


def test_failback_zero_keeps_resources_away_after_maintenance() -> None:
    facts = json.loads((FIXTURES / "string-order.json").read_text())
    cluster = cluster_from_facts(facts)
    cluster = replace(cluster, services={sid: replace(s, failback=False)
                                         for sid, s in cluster.services.items()})
    prediction = predict(cluster, [parse_event("maintenance=node3"),
                                   parse_event("end-maintenance=node3")])
    kept = [d for d in prediction.events[1].decisions]
    assert [d.kind for d in kept] == ["kept-away", "kept-away"]
    assert all(d.selection and d.selection.step == "failback=0 stickiness" for d in kept)


def test_static_scores_prefer_the_emptier_node() -> None:
    capacity = {n: scores.NodeCapacity(32, 100e9) for n in ("a", "b")}
    result = scores.static_scores(["a", "b"], capacity, {"a": 8, "b": 0}, {"a": 40e9, "b": 0},
                                  scores.GuestSize(2, 4e9))
    assert result["b"] < result["a"]


def test_bad_events_are_refused() -> None:
    for text in ("maintenance", "explode=node1", "migrate=vm:101", "start=vmx"):
        with pytest.raises(EventError):
            parse_event(text)
    assert parse_event("migrate=101@node2").commands[0].subject == "vm:101"
    assert sim_command("crm node3 enable-node-maintenance").verb == "maintenance"


# -- properties

NODES = ["node1", "node2", "node3", "node4"]


@st.composite
def clusters(draw: st.DrawFn) -> tuple[Cluster, list[Event]]:
    count = draw(st.integers(3, 4))
    nodes = NODES[:count]
    numbers = draw(st.lists(st.sampled_from([100, 101, 102, 1000, 1001, 110, 200]), min_size=2,
                            max_size=6, unique=True))
    sids = [f"vm:{n}" for n in numbers]
    services = {sid: {"node": draw(st.sampled_from(nodes)),
                      "failback": draw(st.booleans())} for sid in sids}
    rules: list[dict[str, Any]] = []
    for index in range(draw(st.integers(0, 3))):
        members = draw(st.lists(st.sampled_from(sids), min_size=1, max_size=3, unique=True))
        if draw(st.booleans()):
            chosen = draw(st.lists(st.sampled_from(nodes), min_size=1, max_size=count,
                                   unique=True))
            rules.append({"id": f"na{index}", "type": "node-affinity", "resources": members,
                          "nodes": {n: draw(st.integers(0, 2)) for n in chosen},
                          "strict": draw(st.booleans())})
        else:
            rules.append({"id": f"ra{index}", "type": "resource-affinity", "resources": members,
                          "affinity": draw(st.sampled_from(["positive", "negative"]))})
    facts = {"nodes": nodes, "services": services, "rules": rules}
    verb = draw(st.sampled_from(["maintenance", "fail", "end-maintenance", "return"]))
    node = draw(st.sampled_from(nodes))
    events = [parse_event(f"{verb}={node}")]
    if verb in ("end-maintenance", "return"):
        events.insert(0, parse_event(f"{'maintenance' if verb == 'end-maintenance' else 'fail'}"
                                     f"={node}"))
    # First the manager settles what the random start violates; then the trigger.
    return cluster_from_facts(facts), [Event("(settle)", ()), *events]


PROPERTY = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPERTY
@given(clusters())
def test_no_decision_targets_a_node_that_is_not_online(case: tuple[Cluster, list[Event]]) -> None:
    cluster, events = case
    prediction = predict(cluster, events)
    for event, result in zip(events, prediction.events, strict=True):
        gone = {c.subject for c in event.commands if c.verb in ("maintenance", "fail")}
        if event.label == "(settle)":
            continue
        for d in result.decisions:
            if d.selection is None or d.target is None or d.kind in ("kept-away",):
                continue
            assert d.target in d.selection.candidates and d.target not in d.selection.excluded
            assert d.target not in gone, (event.label, d)


@PROPERTY
@given(clusters())
def test_strict_node_affinity_and_negative_affinity_hold(
        case: tuple[Cluster, list[Event]]) -> None:
    cluster, events = case
    prediction = predict(cluster, events)
    compiled = prediction.rules.compiled
    where = {sid: s.node for sid, s in cluster.services.items()}
    for result in prediction.events:
        for d in result.decisions:
            if d.kind not in ("migrate", "relocate", "recover", "back") or d.target is None:
                continue
            affinity = compiled.node_affinity.get(d.sid)
            if affinity is not None and affinity.strict:
                assert d.target in affinity.priorities
            for partner in compiled.negative.get(d.sid, {}):
                assert where.get(partner) != d.target, (d, where)
            where[d.sid] = d.target


@PROPERTY
@given(clusters())
def test_same_input_same_output_whatever_the_order(case: tuple[Cluster, list[Event]]) -> None:
    cluster, events = case
    first = predict(cluster, events)
    reordered = replace(cluster, services=dict(reversed(list(cluster.services.items()))),
                        rules=dict(reversed(list(cluster.rules.items()))))
    assert predict(reordered, events) == first
    assert render_json(first) == render_json(predict(cluster, events))


@PROPERTY
@given(st.lists(st.sampled_from([100, 101, 102, 1000, 1001, 110, 200, 99]), min_size=2,
                max_size=8, unique=True))
def test_resources_are_walked_in_string_order(numbers: list[int]) -> None:
    facts = {"nodes": NODES, "services": {f"vm:{n}": {"node": "node4"} for n in numbers},
             "rules": []}
    prediction = predict(cluster_from_facts(facts), [parse_event("maintenance=node4")])
    moved = [d.sid for d in prediction.events[0].decisions]
    assert moved == sorted(f"vm:{n}" for n in numbers)
    if "vm:1000" in moved and "vm:101" in moved:
        assert moved.index("vm:1000") < moved.index("vm:101")


# -- the cluster folder and the command

def test_command_on_a_cluster_folder_exits_3_when_a_vm_is_stuck(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    facts = json.loads((FIXTURES / "forum-s2-keep-apart.json").read_text())
    pve = write_pve_dir(tmp_path / "pve", facts)
    assert main(["placement", "--pve-dir", str(pve), "maintenance=node3", "--json"]) == 3
    out = json.loads(capsys.readouterr().out)
    assert out["model"] == MODEL
    assert out["unplaced"] == {"vm:101": "stays on maintenance node node3: no node to go to"}
    assert out["events"][0]["decisions"][0]["excluded"]["node2"].startswith("hosts vm:102")
    assert main(["placement", "--pve-dir", str(pve)]) == 0
    assert "no placement decision" in capsys.readouterr().out


def test_command_help_names_the_events(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["placement", "--help"])
    out = capsys.readouterr().out
    assert "end-maintenance=NODE" in out and "Exit status" in out
    assert main(["placement", "--pve-dir", "/nonexistent", "explode=1"]) == 2
    assert main(["placement", "--pve-dir", "/nonexistent", "fail=node1"]) == 1


def test_storage_view_and_hook(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    facts = {"nodes": ["node1", "node2", "node3"],
             "services": {"vm:101": {"node": "node3"}, "vm:102": {"node": "node1"}},
             "rules": []}
    pve = write_pve_dir(tmp_path / "pve", facts, thin=True)
    (pve / "storage.cfg").write_text(
        "lvm: san\n\tvgname san\n\tshared 1\n\tpvestord-chunksize 1G\n")
    good = StorageView(vg="san", visible=True, pvs=4, free=10 << 30, extent_size=4 << 20)
    broken = StorageView(vg="san", visible=True, pvs=4, missing_pvs=3)
    for node, view in (("node1", good), ("node2", broken), ("node3", good)):
        publish(pve / "nodes", NodeReport(node, time.time(), 10.0, {"san": view}))
    # basic CRS: node2 is empty, so HA picks it although its storage is broken
    assert main(["placement", "--pve-dir", str(pve), "maintenance=node3", "--storage-view",
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    decision = out["events"][0]["decisions"][0]
    assert decision["to"] == "node2" and decision["storage"]["node2"]["eligible"] is False
    assert any("HA will put vm:101 on node2" in w for w in out["warnings"])
    assert main(["placement", "--pve-dir", str(pve), "maintenance=node3",
                 "--as-if-storage-hook", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    decision = out["events"][0]["decisions"][0]
    assert decision["to"] == "node1"
    assert decision["excluded"]["node2"] == "storage: storage san: VG san is missing 3 of 4 " \
        "PVs here"
    assert "NOT what Proxmox does today" in out["storage_hook"]


def test_cluster_folder_in_maintenance_returns_after_end_maintenance(tmp_path: Path) -> None:
    facts = {"nodes": ["node1", "node2", "node3"],
             "services": {"vm:101": {"node": "node2"}, "vm:102": {"node": "node1"}},
             "rules": []}
    pve = write_pve_dir(tmp_path / "pve", facts)
    status = json.loads((pve / "ha" / "manager_status").read_text())
    status["node_status"]["node3"] = "maintenance"
    status["node_request"] = {"node3": {"maintenance": 1}}
    status["service_status"]["vm:101"]["maintenance_node"] = "node3"
    (pve / "ha" / "manager_status").write_text(json.dumps(status))
    (pve / "nodes" / "node3" / "lrm_status").write_text('{"mode": "maintenance"}')
    (pve / ".members").unlink()  # a copied tree without it: the manager's view decides
    cluster = read_pve_dir(pve)
    assert cluster.maintenance_requests == frozenset({"node3"})
    nothing = predict(cluster, [])
    assert nothing.events[0].decisions == ()
    back = predict(cluster, [parse_event("end-maintenance=node3")])
    assert steps(back, 0) == [["back", "vm:101", "node3"], ["migrate", "vm:101", "node3"]]
    decision = back.events[0].decisions[0]
    assert decision.selection is not None
    assert decision.selection.step == "maintenance fallback"


def test_what_is_not_modelled_is_warned(tmp_path: Path) -> None:
    facts = {"nodes": ["node1", "node2", "node3"], "services": {"vm:101": {"node": "node1"}},
             "rules": []}
    pve = write_pve_dir(tmp_path / "pve", facts)
    (pve / "datacenter.cfg").write_text("crs: ha=static,ha-auto-rebalance=1\n")
    conf = pve / "nodes" / "node1" / "qemu-server" / "101.conf"
    conf.write_text(conf.read_text() + "lock: backup\n")
    members = json.loads((pve / ".members").read_text())
    members["cluster"]["quorate"] = 0
    (pve / ".members").write_text(json.dumps(members))
    warnings = " / ".join(predict(read_pve_dir(pve), []).warnings)
    for part in ("ha-auto-rebalance", "falls back to 'basic'", "vm:101 has a lock",
                 "no quorum"):
        assert part in warnings
