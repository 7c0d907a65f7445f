"""Which nodes can run a guest's thin volumes: the ``rank_nodes`` hook, as a pure function.

Proxmox's HA rebalancer proposes to ask each storage plugin to order the
candidate nodes for a guest. For thin LVs the question is not free space (a
shared VG has the same free space from every node that sees it) but sight
and health: can this node's LVM reach every VG the guest's volumes live on,
with all their PVs, and does its pvestord run and succeed there? A node
that cannot extend the guest's LVs pauses the guest the first time it fills
a chunk.

So the ranking is a filter with reasons, then an order:

* left out, with every reason found: no report from the node, an unreadable
  report, a stale one (its pvestord is gone or stuck), pvestord stopped, a
  storage not configured for the node, a VG it cannot see, PVs missing, its
  last LVM command on the VG failed;
* the nodes left, in the caller's order (the rebalancer's own preference),
  nodes with warnings (a report more than half-way to stale) after those
  without.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import asdict, dataclass

from pvestord.engine.nodereport import NodeReport
from pvestord.policy.sizes import format_size

#: A report older than this is not trusted (its writer reports every 10 s).
DEFAULT_STALE_AFTER = 60.0


@dataclass(frozen=True)
class Ranked:
    node: str
    #: Why the node is left out (every reason found), or empty.
    reasons: tuple[str, ...]
    #: Things that do not exclude the node but rank it lower.
    warnings: tuple[str, ...]
    #: Seconds since the node's report was made; None without one.
    report_age: float | None

    @property
    def eligible(self) -> bool:
        """No reason leaves the node out (derived, so that the two cannot disagree)."""
        return not self.reasons

    def to_json(self) -> dict[str, object]:
        """The verdict for ``rank-nodes --json``, ``eligible`` second as it always was."""
        return {"node": self.node, "eligible": self.eligible, **asdict(self)}


def judge(node: str, report: NodeReport | None, problem: str | None,
          storages: Collection[str], now: float, stale_after: float) -> Ranked:
    """One node's verdict for a guest whose volumes live on ``storages``."""
    if report is None:
        return Ranked(node, (problem or "no report from this node's pvestord",), (), None)
    age = now - report.time
    # What a stopped or stale report says of the storages is past: only that counts.
    if report.stopped:
        return Ranked(node, ("pvestord was stopped on this node",), (), age)
    if age > stale_after:
        return Ranked(node, (f"report is stale: {age:.0f} s old (limit "
                             f"{stale_after:.0f} s)",), (), age)
    if age < -stale_after:
        # From the future: the node's clock is off, and so is the report's time.
        return Ranked(node, (f"report is dated {-age:.0f} s in the future: clock "
                             "skew",), (), age)
    reasons: list[str] = []
    warnings: list[str] = []
    if age > stale_after / 2:
        warnings.append(f"report is {age:.0f} s old")
    for storeid in sorted(storages):
        view = report.storages.get(storeid)
        if view is None:
            reasons.append(f"storage {storeid} is not configured for this node")
        elif (problem := view.problem()) is not None:
            reasons.append(f"storage {storeid}: {problem}")
        elif view.free < view.extent_size:
            warnings.append(f"storage {storeid}: VG {view.vg} is full"
                            f" ({format_size(view.free)} free)")
    return Ranked(node, tuple(reasons), tuple(warnings), age)


def rank_nodes(storages: Collection[str], candidates: Sequence[str] | None,
               reports: Mapping[str, NodeReport], problems: Mapping[str, str], *,
               now: float, stale_after: float = DEFAULT_STALE_AFTER) -> list[Ranked]:
    """Every candidate judged; eligible ones first, in the caller's order.

    ``candidates`` None: every node that has a report or an unreadable one.
    ``problems``: why a node's report file could not be read, by node.
    """
    if candidates is None:
        candidates = sorted({*reports, *(n for n in problems if n != "*")})
    seen: set[str] = set()
    judged = []
    for node in candidates:
        if node in seen:
            continue
        seen.add(node)
        judged.append(judge(node, reports.get(node), problems.get(node) or problems.get("*"),
                            storages, now, stale_after))
    # sorted() is stable: the caller's order stays within each class.
    return sorted(judged, key=lambda r: (not r.eligible, bool(r.warnings)))
