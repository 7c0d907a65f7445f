"""HA rules as pve-ha-manager 5.2.0 reads them: parse, check, drop, transform, compile.

``rules.cfg`` (and the legacy ``groups.cfg``, migrated into node-affinity
rules) go through the manager's feasibility checks; every rule any check
flags is dropped, with the manager's own ``Drop rule '<id>', because ...``
message, then the transforms run (merge connected positive rules, infer
implicit negative rules, extend node affinity to positive partners) and the
result is compiled into per-resource node priorities and partner sets.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ha_placement.sectionconfig import Section

#: A rule as the manager holds it: the keys of its section-config entry,
#: ``resources`` as a set and ``nodes`` as {node: priority}.
RuleData = dict[str, Any]

_NODE_ENTRY = re.compile(r"^([a-zA-Z0-9]([a-zA-Z0-9\-]*[a-zA-Z0-9])?)(:(\d+))?$")
_SID = re.compile(r"^(vm|ct|fa):\d+$")


def normalize_sid(text: str) -> str | None:
    """``vm:100`` as written, ``100`` as ``vm:100``; None for anything else."""
    text = text.strip()
    if text.isdigit():
        return f"vm:{text}"
    return text if _SID.match(text) else None


def parse_node_list(text: str) -> dict[str, int]:
    """``node1:2,node2`` -> {node1: 2, node2: 0}; malformed entries are skipped."""
    nodes: dict[str, int] = {}
    for entry in re.split(r"[,;\s]+", text.strip()):
        match = _NODE_ENTRY.match(entry)
        if match:
            nodes[match.group(1)] = int(match.group(4) or 0)
    return nodes


def _flag(value: str | None) -> int:
    return 1 if value is None else int(value.strip() not in ("0", "false", "no", "off"))


def rules_from_sections(sections: Sequence[Section]) -> tuple[dict[str, RuleData], dict[str, int]]:
    """The rules and their order (1-based, as written) from parsed ``rules.cfg`` sections."""
    ids: dict[str, RuleData] = {}
    order: dict[str, int] = {}
    for section in sections:
        if section.kind not in ("node-affinity", "resource-affinity"):
            continue
        rule: RuleData = {"type": section.kind}
        for key, value in section.options:
            if key == "resources":
                rule["resources"] = {sid for sid in (normalize_sid(p) for p in
                                                     re.split(r"[,;\s]+", value or ""))
                                     if sid}
            elif key == "nodes":
                rule["nodes"] = parse_node_list(value or "")
            elif key in ("strict", "disable"):
                rule[key] = _flag(value)
            elif key in ("affinity", "comment"):
                rule[key] = value or ""
        if "resources" not in rule:
            continue
        if section.kind == "node-affinity" and "nodes" not in rule:
            continue
        if section.kind == "resource-affinity" and rule.get("affinity") not in ("positive",
                                                                                 "negative"):
            continue
        ids[section.ident] = rule
        order[section.ident] = len(order) + 1
    return ids, order


@dataclass(frozen=True)
class Group:
    """A legacy HA group (``groups.cfg``)."""

    name: str
    nodes: Mapping[str, int]
    restricted: bool = False
    nofailback: bool = False
    comment: str = ""


def groups_from_sections(sections: Sequence[Section]) -> dict[str, Group]:
    groups: dict[str, Group] = {}
    for section in sections:
        if section.kind != "group":
            continue
        opts = dict(section.options)
        groups[section.ident] = Group(
            section.ident, parse_node_list(opts.get("nodes") or ""),
            restricted=bool(_flag(opts["restricted"])) if "restricted" in opts else False,
            nofailback=bool(_flag(opts["nofailback"])) if "nofailback" in opts else False,
            comment=opts.get("comment") or "")
    return groups


def next_ordinal(order: Mapping[str, int]) -> int:
    # The manager takes the LOWEST ordinal plus one (get_next_ordinal); copied as it is,
    # since the order decides nothing for placement but shows in the compiled config.
    return (min(order.values()) if order else 0) + 1


def migrate_groups(ids: dict[str, RuleData], order: dict[str, int],
                   groups: Mapping[str, Group], resource_groups: Mapping[str, str]) -> None:
    """Add a ``ha-group-<group>`` node-affinity rule for every group a resource uses."""
    members: dict[str, set[str]] = {}
    for sid, group_name in sorted(resource_groups.items()):
        members.setdefault(group_name, set()).add(sid)
    for group_name, sids in sorted(members.items()):
        found = groups.get(group_name)
        if found is None:
            continue
        rule_id = f"ha-group-{group_name}"
        ids[rule_id] = {"type": "node-affinity", "resources": set(sids),
                        "nodes": dict(found.nodes), "strict": int(found.restricted),
                        "comment": found.comment or f"Generated from HA group '{group_name}'."}
        order[rule_id] = next_ordinal(order)


def _enabled(ids: Mapping[str, RuleData], kind: str,
             affinity: str | None = None) -> dict[str, RuleData]:
    return {rid: r for rid, r in ids.items()
            if r["type"] == kind and not r.get("disable")
            and (affinity is None or r.get("affinity") == affinity)}


def disjoint_sets(rules: Mapping[str, RuleData]) -> list[tuple[list[str], set[str]]]:
    """Group rules sharing resources, in one greedy pass as the manager does.

    Rules are visited by their alphabetically lowest resource (then id); each
    joins the first group it shares a resource with. Groups are not merged
    with each other afterwards, exactly as upstream.
    """
    lowest = {rid: min(r["resources"]) if r["resources"] else "" for rid, r in rules.items()}
    groups: list[tuple[list[str], set[str]]] = []
    for rid in sorted(sorted(rules), key=lambda r: lowest[r]):
        resources = rules[rid]["resources"]
        for ruleids, members in groups:
            if members & resources:
                ruleids.append(rid)
                members |= resources
                break
        else:
            groups.append(([rid], set(resources)))
    return groups


def _has_multiple_priorities(rule: RuleData) -> bool:
    return len(set(rule["nodes"].values())) > 1


def check_feasibility(ids: Mapping[str, RuleData],
                      nodes: Sequence[str]) -> dict[str, list[str]]:
    """{rule id: [reasons]} for every rule a feasibility check flags, checks in upstream order."""
    errors: dict[str, list[str]] = {}

    def flag(rid: str, reason: str) -> None:
        errors.setdefault(rid, []).append(reason)

    node_affinity = _enabled(ids, "node-affinity")
    resource_affinity = _enabled(ids, "resource-affinity")
    positive = _enabled(ids, "resource-affinity", "positive")
    negative = _enabled(ids, "resource-affinity", "negative")

    # node affinity: a resource in more than one rule
    used_in: dict[str, list[str]] = {}
    for rid, rule in node_affinity.items():
        for sid in rule["resources"]:
            used_in.setdefault(sid, []).append(rid)
    conflicts = sorted((rid, sid) for sid, rids in used_in.items() if len(rids) > 1
                       for rid in rids)
    for rid, sid in conflicts:
        flag(rid, f"resource '{sid}' is already used in another node affinity rule")

    # resource affinity
    for rid in sorted(r for r, rule in resource_affinity.items() if len(rule["resources"]) < 2):
        flag(rid, "rule is ineffective as there are less than two resources")
    for rid in sorted(r for r, rule in negative.items() if len(rule["resources"]) > len(nodes)):
        flag(rid, "rule defines more resources than available nodes")
    pairs: list[tuple[str, str]] = []
    for ruleids, members in disjoint_sets(positive):
        for nid, nrule in negative.items():
            if len(members & nrule["resources"]) < 2:
                continue
            pairs.append(("negative", nid))
            pairs.extend(("positive", rid) for rid in ruleids)
    for kind, rid in sorted(pairs):
        other = "positive" if kind == "negative" else "negative"
        flag(rid, f"rule shares two or more resources with a {other} resource affinity rule")

    # global: resource affinity against node affinity
    pairs = []
    for rid, rule in resource_affinity.items():
        paired = [nid for nid, nrule in node_affinity.items()
                  if rule["resources"] & nrule["resources"]]
        if any(_has_multiple_priorities(node_affinity[nid]) for nid in paired):
            pairs.append(("resource-affinity", rid))
            pairs.extend(("node-affinity", nid) for nid in paired)
    for kind, rid in sorted(pairs):
        flag(rid, "resources are in a resource affinity rule and cannot be in a node affinity "
             "rule with multiple priorities" if kind == "node-affinity" else
             "resources are in node affinity rules with multiple priorities")
    pairs = []
    for ruleids, members in disjoint_sets(positive):
        paired = [nid for nid, nrule in node_affinity.items() if members & nrule["resources"]]
        if len(paired) > 1:
            pairs.extend(("positive", rid) for rid in ruleids)
            pairs.extend(("node-affinity", nid) for nid in paired)
    for kind, rid in sorted(pairs):
        flag(rid, "resources are in multiple node affinity rules" if kind == "positive" else
             "at least one resource is in a positive resource affinity rule and there are "
             "other resources in at least one other node affinity rule already")
    pairs = []
    for nid, nrule in negative.items():
        allowed: set[str] = set()
        located: set[str] = set()
        paired = []
        for aid, arule in node_affinity.items():
            common = nrule["resources"] & arule["resources"]
            if not common:
                continue
            located |= common
            allowed |= set(arule["nodes"])
            paired.append(aid)
        if len(allowed) < len(located):
            pairs.append(("negative", nid))
            pairs.extend(("node-affinity", aid) for aid in paired)
    for kind, rid in sorted(pairs):
        flag(rid, "two or more resources are restricted to less nodes than available to the "
             "resources" if kind == "negative" else
             "at least one resource is in a negative resource affinity rule and this rule "
             "would restrict these to less nodes than available to the resources")
    return errors


def transform(ids: dict[str, RuleData], order: dict[str, int],
              nodes: Sequence[str]) -> list[str]:
    """Drop the infeasible rules and apply the transforms, in place; the drop messages."""
    errors = check_feasibility(ids, nodes)
    for rid in errors:
        ids.pop(rid, None)
        order.pop(rid, None)
    messages = [f"Drop rule '{rid}', because {reason}."
                for rid in sorted(errors) for reason in errors[rid]]

    # merge connected positive rules
    for ruleids, members in disjoint_sets(_enabled(ids, "resource-affinity", "positive")):
        if len(ruleids) < 2:
            continue
        new_id = "_merged-" + "-".join(ruleids)
        first_order = order[ruleids[0]]
        for rid in ruleids:
            del ids[rid]
            del order[rid]
        ids[new_id] = {"type": "resource-affinity", "affinity": "positive",
                       "resources": set(members)}
        order[new_id] = first_order

    # implicit negative rules between positive partners and their negative partners
    positive = _enabled(ids, "resource-affinity", "positive")
    negative = _enabled(ids, "resource-affinity", "negative")
    for pid, prule in sorted(positive.items()):
        separated_from: dict[str, set[str]] = {}
        for nrule in negative.values():
            for sid in prule["resources"]:
                if sid in nrule["resources"]:
                    for csid in nrule["resources"] - {sid}:
                        separated_from.setdefault(csid, set()).add(sid)
        for csid in sorted(separated_from):
            for sid in sorted(prule["resources"]):
                if sid in separated_from[csid]:
                    continue
                new_id = f"_implicit-negative-{pid}-{sid}-{csid}"
                ids[new_id] = {"type": "resource-affinity", "affinity": "negative",
                               "resources": {sid, csid}}
                order[new_id] = next_ordinal(order)

    # positive partners join the node-affinity rule one of them is in
    node_affinity = _enabled(ids, "node-affinity")
    for prule in _enabled(ids, "resource-affinity", "positive").values():
        for aid in sorted(node_affinity):
            if prule["resources"] & ids[aid]["resources"]:
                ids[aid]["resources"] |= prule["resources"]
                break
    return messages


@dataclass(frozen=True)
class NodeAffinity:
    """A resource's compiled node affinity: every node it may use, with its priority."""

    rule: str
    strict: bool
    #: {node: priority}; a non-strict rule lists every cluster node, others at -1.
    priorities: Mapping[str, int]
    #: The nodes by priority class, highest first.
    classes: tuple[tuple[int, frozenset[str]], ...] = ()


@dataclass(frozen=True)
class CompiledRules:
    node_affinity: Mapping[str, NodeAffinity] = field(default_factory=dict)
    #: {sid: {partner: rule id}} for positive (keep together) affinity.
    positive: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    #: {sid: {partner: rule id}} for negative (keep apart) affinity.
    negative: Mapping[str, Mapping[str, str]] = field(default_factory=dict)


def compile_rules(ids: Mapping[str, RuleData], nodes: Sequence[str]) -> CompiledRules:
    node_affinity: dict[str, NodeAffinity] = {}
    for rid, rule in sorted(_enabled(ids, "node-affinity").items()):
        priorities = dict(rule["nodes"])
        strict = bool(rule.get("strict"))
        if not strict:
            for node in nodes:
                priorities.setdefault(node, -1)
        classes = tuple((prio, frozenset(n for n, p in priorities.items() if p == prio))
                        for prio in sorted(set(priorities.values()), reverse=True))
        for sid in rule["resources"]:
            node_affinity[sid] = NodeAffinity(rid, strict, priorities, classes)
    positive: dict[str, dict[str, str]] = {}
    negative: dict[str, dict[str, str]] = {}
    for rid, rule in sorted(_enabled(ids, "resource-affinity").items()):
        target = positive if rule["affinity"] == "positive" else negative
        for sid in rule["resources"]:
            for csid in rule["resources"]:
                if csid != sid:
                    target.setdefault(sid, {})[csid] = rid
    return CompiledRules(node_affinity, positive, negative)


@dataclass(frozen=True)
class RuleSet:
    """The rules after the manager's checks and transforms."""

    #: The surviving rules, as the manager holds them after the transforms.
    ids: Mapping[str, RuleData]
    order: Mapping[str, int]
    #: ``Drop rule 'x', because ...`` for each dropped rule and reason.
    messages: tuple[str, ...]
    compiled: CompiledRules

    @property
    def active(self) -> list[str]:
        return sorted(rid for rid, r in self.ids.items() if not r.get("disable"))

    @property
    def dropped(self) -> list[tuple[str, str]]:
        found = []
        for message in self.messages:
            match = re.match(r"Drop rule '(.*)', because (.*)\.$", message)
            if match:
                found.append((match.group(1), match.group(2)))
        return found


def build_rules(ids: Mapping[str, RuleData], order: Mapping[str, int], nodes: Sequence[str],
                groups: Mapping[str, Group] | None = None,
                resource_groups: Mapping[str, str] | None = None) -> RuleSet:
    """Check, transform and compile ``ids`` for a cluster of ``nodes`` (a pure function)."""
    work = {rid: {k: (set(v) if isinstance(v, set) else dict(v) if isinstance(v, dict) else v)
                  for k, v in rule.items()} for rid, rule in ids.items()}
    work_order = dict(order)
    if groups and resource_groups:
        migrate_groups(work, work_order, groups, resource_groups)
    messages = transform(work, work_order, nodes)
    return RuleSet(work, work_order, tuple(messages), compile_rules(work, nodes))


def rules_as_json(rules: Mapping[str, RuleData]) -> dict[str, Any]:
    """The rules in the JSON shape upstream's rules test prints (``ids`` without digest)."""
    out: dict[str, Any] = {}
    for rid, rule in rules.items():
        entry: dict[str, Any] = {}
        for key, value in rule.items():
            if key == "resources":
                entry[key] = {sid: 1 for sid in sorted(value)}
            elif key == "nodes":
                entry[key] = {n: {"priority": p} for n, p in sorted(value.items())}
            else:
                entry[key] = value
        out[rid] = entry
    return out


def compiled_as_json(compiled: CompiledRules) -> dict[str, Any]:
    """The compiled rules in the JSON shape upstream's rules test prints."""
    return {
        "node-affinity": {sid: {"nodes": {n: {"priority": p}
                                          for n, p in sorted(na.priorities.items())}}
                          for sid, na in sorted(compiled.node_affinity.items())},
        "resource-affinity": {
            "positive": {sid: {c: 1 for c in sorted(p)} for sid, p in compiled.positive.items()},
            "negative": {sid: {c: 1 for c in sorted(p)} for sid, p in compiled.negative.items()},
        },
    }


def sids_of(ids: Iterable[RuleData]) -> set[str]:
    return {sid for rule in ids for sid in rule["resources"]}
