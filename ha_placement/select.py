"""``select_service_node`` of pve-ha-manager 5.2.0, with the reasons for every step.

One resource, one call: the online nodes, narrowed by node affinity (its
highest priority class online), then failback=0 stickiness, nodes where a
start failed, negative and positive resource affinity, the maintenance
fallback, staying put, and last the CRS score with the node name as
tie-break. Each node left out carries the reason, and the step that decided
is named.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field

from ha_placement.rules import CompiledRules
from ha_placement.scores import FRAGILE_TIE

#: States in which a resource occupies its current node (if online).
CURRENT_NODE_STATES = frozenset({"started", "request_stop", "fence", "freeze", "error",
                                 "recovery", "migrate", "relocate"})
#: States in which a resource occupies its target node (if online).
TARGET_NODE_STATES = frozenset({"migrate", "relocate", "request_start_balance"})


@dataclass(frozen=True)
class Placed:
    """Where a resource is, as the manager's service status says."""

    state: str
    node: str
    target: str | None = None


def used_nodes(online: Collection[str], placed: Placed) -> tuple[str | None, str | None]:
    """(current, target) nodes a resource occupies among ``online`` (get_used_service_nodes)."""
    if placed.state in ("stopped", "request_start"):
        return None, None
    current = placed.node if placed.state in CURRENT_NODE_STATES and placed.node in online \
        else None
    target = placed.target if (placed.state in TARGET_NODE_STATES and placed.target is not None
                               and placed.target in online) else None
    return current, target


@dataclass(frozen=True)
class Selection:
    """One answer of ``select_service_node`` and why."""

    sid: str
    preference: str
    current: str
    #: The chosen node, or None when no node is left.
    node: str | None
    #: The deciding step: "failback=0 stickiness", "maintenance fallback", "stays",
    #: "lowest score", "tie -> alphabetical", "try-next", "no node".
    step: str
    #: The nodes left when the scores were looked at (or would have been).
    candidates: tuple[str, ...]
    #: Every node left out, with the reason.
    excluded: Mapping[str, str]
    scores: Mapping[str, float] = field(default_factory=dict)
    #: The winner's score equals (or, static: is within 1e-12 of) the runner-up's.
    tie: bool = False
    fragile_tie: bool = False
    #: {node: partners there} for positive affinity, over online nodes.
    together: Mapping[str, int] = field(default_factory=dict)
    #: {node: partner} for negative affinity, over online nodes.
    separate: Mapping[str, str] = field(default_factory=dict)
    node_affinity: str | None = None
    #: The node it left for maintenance and may return to (step 5), if any.
    maintenance_node: str | None = None


#: Left out by a storage hook (``--as-if-storage-hook``): {node: reason}, and a rank
#: (lower first) that breaks score ties before the node name.
StorageFilter = Callable[[str, list[str]], tuple[dict[str, str], dict[str, int]]]


def select_service_node(rules: CompiledRules, node_states: Mapping[str, str],
                        online: Collection[str], sid: str, placed: Mapping[str, Placed],
                        failback: bool, preference: str, maintenance_node: str | None,
                        failed_nodes: tuple[str, ...],
                        score: Callable[[str], Mapping[str, float]], fragile: bool,
                        storage: StorageFilter | None = None, explain: bool = True) -> Selection:
    """The node the manager picks for ``sid`` (None: none), and the reasons.

    ``node_states`` is the manager's view of every node (for the reasons),
    ``online`` the nodes in state online, ``placed`` every resource's state,
    ``score`` the CRS score of each online node for ``sid``. With ``explain`` False
    the node and step are the same, but the reasons (``excluded``) are left empty:
    the manager asks that for every resource every round.
    """
    current = placed[sid].node
    excluded: dict[str, str] = {}
    if explain:
        excluded = {node: (state if state != "unknown" else "offline")
                    for node, state in node_states.items() if node not in online}
    affinity = rules.node_affinity.get(sid)
    if affinity is None:
        allowed = set(online)
        pri = set(online)
    else:
        online_set = online if isinstance(online, (set, frozenset)) else set(online)
        allowed = set(affinity.priorities.keys() & online_set)
        for node in online if explain else ():
            if node not in affinity.priorities:
                excluded[node] = f"not in strict rule {affinity.rule}"
        pri = set()
        for _, members in affinity.classes:
            pri = set(members & online_set)
            if pri:
                break
        for node in allowed - pri if explain else ():
            excluded[node] = (f"lower priority class ({affinity.priorities[node]}) than "
                              f"{{{','.join(sorted(pri))}}} in rule {affinity.rule}")
    rule_id = affinity.rule if affinity else None

    def answer(node: str | None, step: str, **extra: object) -> Selection:
        if not explain:
            return Selection(sid, preference, current, node, step, (), {},
                             **extra)  # type: ignore[arg-type]
        return Selection(sid, preference, current, node, step,
                         tuple(sorted(pri)), dict(sorted(excluded.items())),
                         together=dict(sorted(together.items())),
                         separate=dict(sorted(separate.items())), node_affinity=rule_id,
                         maintenance_node=maintenance_node,
                         **extra)  # type: ignore[arg-type]

    together: dict[str, int] = {}
    separate: dict[str, str] = {}
    if storage is not None and pri:
        # Where the proposed rank_nodes hook would drop candidates: after node affinity.
        left_out, _ = storage(sid, sorted(allowed))
        for node, reason in left_out.items():
            if node in allowed:
                allowed.discard(node)
                pri.discard(node)
                excluded[node] = f"storage: {reason}"
    if not pri:
        return answer(None, "no node")

    for partner in sorted(rules.positive.get(sid, {})):
        if partner in placed:
            cur, tgt = used_nodes(online, placed[partner])
            where = tgt if tgt is not None else cur
            if where is not None:
                together[where] = together.get(where, 0) + 1
    for partner in sorted(rules.negative.get(sid, {})):
        if partner in placed:
            for where in used_nodes(online, placed[partner]):
                if where is not None:
                    separate.setdefault(where, partner)

    if (preference == "none" and not failback and current in allowed
            and (together.get(current) or current not in separate)):
        return answer(current, "failback=0 stickiness")

    if preference == "try-next":
        for node in failed_nodes:
            if node in pri:
                pri.discard(node)
                excluded[node] = "start failed there before"

    for node, partner in separate.items():
        if node in pri:
            pri.discard(node)
            rule = rules.negative[sid][partner]
            excluded[node] = f"hosts {partner} (negative affinity, rule {rule})"

    reachable = {n: c for n, c in together.items() if n in pri}
    if reachable:
        majority = sorted(sorted(reachable), key=lambda n: -reachable[n])[0]
        partners = [p for p in sorted(rules.positive.get(sid, {})) if p in placed]
        for node in sorted(pri - {majority}) if explain else ():
            excluded[node] = (f"not the positive-affinity majority node ({majority}, "
                              f"{reachable[majority]} of {','.join(partners)})")
        pri = {majority}

    if maintenance_node is not None and maintenance_node in pri:
        return answer(maintenance_node, "maintenance fallback")
    if preference == "none" and current in pri:
        return answer(current, "stays")
    if not pri:
        return answer(None, "no node")

    scores = score(sid)
    ranks: dict[str, int] = {}
    if storage is not None:
        _, ranks = storage(sid, sorted(pri))
    nodes = sorted(pri, key=lambda n: (scores.get(n, 0.0), ranks.get(n, 0), n))
    shown = {n: scores.get(n, 0.0) for n in nodes}
    if preference == "try-next" and current in nodes:
        index = nodes.index(current)
        chosen = nodes[index + 1] if index < len(nodes) - 1 else nodes[0]
        return answer(chosen, "try-next", scores=shown)
    chosen = nodes[0]
    tie = len(nodes) > 1 and scores.get(nodes[1], 0.0) == scores.get(chosen, 0.0)
    near = fragile and len(nodes) > 1 and not tie and \
        abs(scores.get(nodes[1], 0.0) - scores.get(chosen, 0.0)) < FRAGILE_TIE
    return answer(chosen, "tie -> alphabetical" if tie else "lowest score", scores=shown,
                  tie=tie or near, fragile_tie=near)
