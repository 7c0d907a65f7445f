"""The CRS scores of pve-ha-manager 5.2.0: lower is better.

* basic: the number of resources using a node (current or target).
* static: TOPSIS over four criteria computed for every online node after
  adding the resource to the candidate: 1 + RMS and 1 + max of the CPU
  load, 1 + RMS and 1 + max of the memory load, weighted 1, 2, 5, 10, all
  minimised; the score is minus the closeness to the ideal.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

#: TOPSIS weights of (RMS cpu, max cpu, RMS mem, max mem), all minimised.
STATIC_WEIGHTS = (1.0, 2.0, 5.0, 10.0)

#: Static scores closer than this are a tie whose winner depends on float rounding
#: (upstream sums over a hash map in random order), so the prediction is uncertain.
FRAGILE_TIE = 1e-12


@dataclass(frozen=True)
class CpuMem:
    """CPUs and bytes of memory: the two figures the static CRS weighs."""

    maxcpu: float
    maxmem: float


class NodeCapacity(CpuMem):
    """A node's CPUs and memory."""


class GuestSize(CpuMem):
    """The CPUs a guest may use (0 means "the whole node", as upstream counts
    it) and its memory; a type of its own so that it is never taken for a node's."""


def basic_scores(users: Mapping[str, int]) -> dict[str, float]:
    """Score per node for the basic CRS: how many resources use it."""
    return {node: float(count) for node, count in users.items()}


def _added_cpu(load: float, node_maxcpu: float, guest_maxcpu: float) -> float:
    return load + (node_maxcpu if guest_maxcpu == 0 else guest_maxcpu)


def static_scores(nodes: Sequence[str], capacity: Mapping[str, NodeCapacity],
                  cpu_load: Mapping[str, float], mem_load: Mapping[str, float],
                  guest: GuestSize) -> dict[str, float]:
    """Score per online node for the static CRS (lower is better)."""
    count = len(nodes)
    if count == 0:
        return {}
    rows: list[tuple[float, float, float, float]] = []
    for candidate in nodes:
        squares_cpu = squares_mem = highest_cpu = highest_mem = 0.0
        for node in nodes:
            cap = capacity[node]
            cpu = cpu_load.get(node, 0.0)
            mem = mem_load.get(node, 0.0)
            if node == candidate:
                cpu = _added_cpu(cpu, cap.maxcpu, guest.maxcpu)
                mem = mem + guest.maxmem
            cpu_share = cpu / cap.maxcpu if cap.maxcpu else 0.0
            mem_share = mem / cap.maxmem if cap.maxmem else 0.0
            squares_cpu += cpu_share * cpu_share
            squares_mem += mem_share * mem_share
            highest_cpu = max(highest_cpu, cpu_share)
            highest_mem = max(highest_mem, mem_share)
        rows.append((1.0 + math.sqrt(squares_cpu / count), 1.0 + highest_cpu,
                     1.0 + math.sqrt(squares_mem / count), 1.0 + highest_mem))
    closeness = topsis_minimise(rows, STATIC_WEIGHTS)
    return {node: -score for node, score in zip(nodes, closeness, strict=True)}


def topsis_minimise(rows: Sequence[Sequence[float]], weights: Sequence[float]) -> list[float]:
    """Closeness of each row to the ideal (1 best, 0 worst) with every criterion minimised."""
    total = sum(abs(w) for w in weights)
    norms = [math.sqrt(sum(row[j] ** 2 for row in rows)) for j in range(len(weights))]
    weighted = [[(row[j] / norms[j] if norms[j] else 0.0) * weights[j] / total
                 for j in range(len(weights))] for row in rows]
    best = [min(col) for col in zip(*weighted, strict=True)]
    worst = [max(col) for col in zip(*weighted, strict=True)]
    out = []
    for row in weighted:
        to_best = math.sqrt(sum((v - b) ** 2 for v, b in zip(row, best, strict=True)))
        to_worst = math.sqrt(sum((v - w) ** 2 for v, w in zip(row, worst, strict=True)))
        denominator = to_best + to_worst
        out.append(to_worst / denominator if denominator else 0.0)
    return out
