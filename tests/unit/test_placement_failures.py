"""Injected failures (the simulator's ``fa:`` resources) and the manager's restart and
relocation policy (``max_restart``, ``max_relocate``) in the placement model."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from ha_placement.explain import cannot_place, render_json, render_text
from ha_placement.failures import (
    FailureCounters,
    InjectedFailures,
    injected_failures,
)
from ha_placement.manager import predict
from ha_placement.model import (
    Cluster,
    Event,
    NodeFacts,
    ServiceConfig,
    ServiceStatus,
)

NODES = ("node1", "node2", "node3")


def test_the_id_digits_say_what_fails() -> None:
    assert injected_failures("vm:130") is None
    assert injected_failures("fa:130") == InjectedFailures(3, 0, False, None)
    assert injected_failures("fa:1501") == InjectedFailures(5, 0, True, None)
    assert injected_failures("fa:120001") == InjectedFailures(2, 0, False, "node1")
    assert injected_failures("fa:109") == InjectedFailures(0, 9, False, None)


@given(st.integers(0, 9), st.integers(1, 30))
def test_n_tries_fail_then_one_succeeds_and_the_count_starts_over(failing: int,
                                                                  tries: int) -> None:
    counters = FailureCounters({}, {})
    failures = InjectedFailures(failing, failing, False, None)
    outcomes = [counters.try_start("fa:1", failures, NODES[i % 3]) for i in range(tries)]
    expected = [(i % (failing + 1)) == failing for i in range(tries)]
    assert outcomes == expected


@given(st.integers(1, 9), st.lists(st.sampled_from(NODES), min_size=1, max_size=12))
def test_failures_limited_to_a_node_happen_only_there(failing: int, nodes: list[str]) -> None:
    counters = FailureCounters({}, {})
    failures = InjectedFailures(failing, failing, False, "node2")
    for node in nodes:
        ok = counters.try_migrate("fa:1", failures, node)
        assert ok or node == "node2"


def one_failing_resource(start_failures: int, max_restart: int, max_relocate: int) -> Cluster:
    sid = f"fa:1{start_failures}0"
    return Cluster(
        nodes={n: NodeFacts(n) for n in NODES},
        services={sid: ServiceConfig(sid, "node1", "started", max_restart=max_restart,
                                     max_relocate=max_relocate)},
        node_status={n: "online" for n in NODES},
        service_status={sid: ServiceStatus("started", "node1")})


@given(st.integers(0, 9), st.integers(0, 3), st.integers(0, 2))
def test_restart_then_relocate_then_error(start_failures: int, max_restart: int,
                                          max_relocate: int) -> None:
    """Each node gets ``max_restart`` + 1 start tries; a failed node is never tried again;
    after ``max_relocate`` + 1 failed nodes the resource is left in error."""
    prediction = predict(one_failing_resource(start_failures, max_restart, max_relocate),
                         [Event("(settle)", ())])
    sid = f"fa:1{start_failures}0"
    decisions = prediction.events[-1].decisions
    failed_visits = start_failures // (max_restart + 1)
    moves = [d.target for d in decisions if d.kind == "relocate"]
    state, node = prediction.events[-1].placement[sid]
    if failed_visits > max_relocate:
        assert state == "error"
        assert [d.kind for d in decisions][-1] == "give-up"
        assert decisions[-1].tried == ("node1", *moves)
        assert len(moves) == max_relocate
    else:
        assert state == "started"
        assert len(moves) == failed_visits
        assert node == (moves[-1] if moves else "node1")
    assert len(set(moves)) == len(moves) and "node1" not in moves


def test_a_resource_left_in_error_cannot_be_placed() -> None:
    """Exit status 3: its start failed on max_relocate + 1 nodes."""
    gives_up = predict(one_failing_resource(9, 0, 1), [Event("(settle)", ())])
    assert [d.kind for d in gives_up.events[-1].decisions] == ["relocate", "give-up"]
    assert cannot_place(gives_up)
    recovers = predict(one_failing_resource(1, 0, 1), [Event("(settle)", ())])
    assert not cannot_place(recovers)


def test_json_names_the_nodes_tried_as_the_text_does() -> None:
    """give-up and retry-here carry the nodes the start failed on, in order, in both forms."""
    gives_up = predict(one_failing_resource(9, 0, 1), [Event("(settle)", ())])
    decision = render_json(gives_up)["events"][-1]["decisions"][-1]
    assert decision["action"] == "give-up"
    assert decision["tried"] == ["node1", "node2"]
    assert "(tried node1, node2)" in render_text(gives_up)
    # every node fails once (max_restart 0): the third failure finds no untried node
    retries = predict(one_failing_resource(3, 0, 3), [Event("(settle)", ())])
    decisions = render_json(retries)["events"][-1]["decisions"]
    retry = [d for d in decisions if d["action"] == "retry-here"]
    assert retry and retry[0]["tried"] == ["node1", "node2", "node3"]
    moved = [d for d in decisions if d["action"] == "relocate"]
    assert moved and all("tried" not in d for d in moved)
