"""Automatic rebalancing (``crs: ha-auto-rebalance=1``) with the static CRS, ``bruteforce`` method.

The manager measures how unevenly the online nodes are loaded (the coefficient of
variation of the node loads, a node's load being the mean of its CPU and memory
shares, clamped to [0, 1]); above the threshold it tries every running,
stationary bundle (a resource with its positive-affinity partners, all on one node)
on every node it may go to, and queues the move that leaves the least imbalance
(ties: leader id, source, target) if it improves the imbalance by at least the
margin. One move at a time: the next is looked for once it is done. The hold time
(rounds the imbalance must last) is counted by the driver (:mod:`.manager`), which
knows when the next event comes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ha_placement.scores import GuestSize, NodeCapacity


@dataclass(frozen=True)
class Bundle:
    leader: str
    members: tuple[str, ...]
    source: str
    #: Nodes it may go to (node affinity's preferred class, no negative partner, not source).
    targets: tuple[str, ...]


@dataclass(frozen=True)
class Move:
    leader: str
    source: str
    target: str
    before: float
    after: float


def node_loads(cpu: Mapping[str, float], mem: Mapping[str, float],
               capacity: Mapping[str, NodeCapacity]) -> dict[str, float]:
    return {n: min(1.0, max(0.0, (cpu[n] / capacity[n].maxcpu
                                  + mem[n] / capacity[n].maxmem) / 2)) for n in cpu}


def imbalance(loads: Mapping[str, float]) -> float:
    """Coefficient of variation (population) of the loads, to 15 significant digits."""
    values = list(loads.values())
    if not values:
        return 0.0
    mean = sum(values) / len(values)
    if mean == 0:
        return 0.0
    deviation = math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))
    return float(f"{deviation / mean:.15g}")


def _share(size: GuestSize, cap: NodeCapacity) -> tuple[float, float]:
    return (cap.maxcpu if size.maxcpu == 0 else size.maxcpu), size.maxmem


def best_move(bundles: Sequence[Bundle], cpu: Mapping[str, float], mem: Mapping[str, float],
              capacity: Mapping[str, NodeCapacity], sizes: Mapping[str, GuestSize],
              threshold: float, margin: float) -> Move | None:
    """The move the manager queues now, or None."""
    before = imbalance(node_loads(cpu, mem, capacity))
    if before <= threshold:
        return None
    best: tuple[float, str, str, str] | None = None
    for bundle in bundles:
        for target in bundle.targets:
            moved_cpu, moved_mem = dict(cpu), dict(mem)
            for sid in bundle.members:
                size = sizes.get(sid)
                if size is None:
                    continue
                c, m = _share(size, capacity[bundle.source])
                moved_cpu[bundle.source] -= c
                moved_mem[bundle.source] -= m
                c, m = _share(size, capacity[target])
                moved_cpu[target] += c
                moved_mem[target] += m
            after = imbalance(node_loads(moved_cpu, moved_mem, capacity))
            key = (after, bundle.leader, bundle.source, target)
            if best is None or key < best:
                best = key
    if best is None:
        return None
    after, leader, source, target = best
    if (before - after) / before < margin:
        return None
    return Move(leader, source, target, before, after)
