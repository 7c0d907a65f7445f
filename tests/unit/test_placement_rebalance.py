"""Automatic rebalancing with the static CRS (``ha_placement.rebalance``)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ha_placement.rebalance import Bundle, best_move, imbalance, node_loads
from ha_placement.scores import GuestSize, NodeCapacity

GiB = 2**30
NODES = ("node1", "node2", "node3")
CAPACITY = {n: NodeCapacity(24, 32 * GiB) for n in NODES}


def loads_of(placement: dict[str, str], sizes: dict[str, GuestSize]) \
        -> tuple[dict[str, float], dict[str, float]]:
    cpu = {n: 0.0 for n in NODES}
    mem = {n: 0.0 for n in NODES}
    for sid, node in placement.items():
        cpu[node] += sizes[sid].maxcpu
        mem[node] += sizes[sid].maxmem
    return cpu, mem


def bundles(placement: dict[str, str]) -> list[Bundle]:
    return [Bundle(sid, (sid,), node, tuple(n for n in NODES if n != node))
            for sid, node in sorted(placement.items())]


def test_four_guests_on_one_node_are_spread_as_the_manager_logs() -> None:
    """test-crs-static-auto-rebalance2 logs 1.41 -> 0.94, then 0.94 -> 0.35, then no move."""
    sizes = {f"vm:10{i}": GuestSize(2, 8 * GiB) for i in range(1, 5)}
    placement = dict.fromkeys(sizes, "node1")
    seen = []
    while True:
        cpu, mem = loads_of(placement, sizes)
        move = best_move(bundles(placement), cpu, mem, CAPACITY, sizes, 0.3, 0.1)
        if move is None:
            break
        seen.append((move.leader, move.target, round(move.before, 2), round(move.after, 2)))
        placement[move.leader] = move.target
    assert seen == [("vm:101", "node2", 1.41, 0.94), ("vm:102", "node3", 0.94, 0.35)]


def test_a_move_that_improves_too_little_is_not_made() -> None:
    """test-crs-static-auto-rebalance1: one guest; moving it leaves the same imbalance."""
    sizes = {"vm:101": GuestSize(2, 8 * GiB)}
    cpu, mem = loads_of({"vm:101": "node1"}, sizes)
    assert imbalance(node_loads(cpu, mem, CAPACITY)) == pytest.approx(2**0.5)
    assert best_move(bundles({"vm:101": "node1"}), cpu, mem, CAPACITY, sizes, 0.3, 0.1) is None


@given(st.dictionaries(st.sampled_from([f"vm:{i}" for i in range(100, 110)]),
                       st.sampled_from(NODES), min_size=1),
       st.floats(0.0, 1.0), st.floats(0.0, 0.9))
def test_a_queued_move_beats_the_threshold_and_the_margin(
        placement: dict[str, str], threshold: float, margin: float) -> None:
    sizes = {sid: GuestSize(1 + int(sid[3:]) % 4, (1 + int(sid[3:]) % 3) * GiB)
             for sid in placement}
    cpu, mem = loads_of(placement, sizes)
    move = best_move(bundles(placement), cpu, mem, CAPACITY, sizes, threshold, margin)
    if move is not None:
        assert move.before > threshold
        assert (move.before - move.after) / move.before >= margin
        assert move.target != placement[move.leader]


@given(st.lists(st.floats(0.0, 1.0), min_size=1, max_size=8), st.floats(0.01, 1.0))
def test_imbalance_ignores_scale_and_is_zero_when_even(loads: list[float], scale: float) -> None:
    named = {f"n{i}": v for i, v in enumerate(loads)}
    assert imbalance({n: 0.5 for n in named}) == 0.0
    assert imbalance({n: v * scale for n, v in named.items()}) == pytest.approx(
        imbalance(named), abs=1e-9)
