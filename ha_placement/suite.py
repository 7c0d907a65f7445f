"""Checking the model against pve-ha-manager's own simulator suite.

Each ``src/test/test-*/`` folder has inputs and the manager's log
(``log.expect``). The placement lines of that log, in order, are the oracle;
the model's decisions for the same inputs and ``cmdlist`` must equal them.
Scenarios using what the model does not cover are counted, with the reason,
not guessed.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ha_placement.events import Unsupported, sim_command
from ha_placement.inputs import read_sim_test
from ha_placement.manager import predict
from ha_placement.model import Decision

#: A normalised placement decision: (kind, sid, node or "").
Step = tuple[str, str, str]

#: What a placeholder of a log template matches: the decision's resource and
#: node by name (the ``veto`` line names the node first), the nodes a
#: recovery tried, and words the decision does not depend on.
_FIELDS = {
    "sid": r"(?P<sid>\S+)",
    "node": r"(?P<node>\S+)",
    "tried": r"(?P<tried>.*)",
    "word": r"\S+",
    "command": r"[^']*",
    "move": r"(?:migrate|relocate)",
    "which": r"(?:new|current)",
    "rest": r".*",
}


def _log_line(template: str) -> re.Pattern[str]:
    """The whole message ``template``, literal but for its ``{field}`` placeholders."""
    pattern = re.escape(template)
    for name, group in _FIELDS.items():
        pattern = pattern.replace(re.escape("{" + name + "}"), group)
    return re.compile(f"^{pattern}$")


#: The manager's placement messages, by the kind of decision each logs.
_TEMPLATES: tuple[tuple[str, str], ...] = (
    ("migrate", "migrate service '{sid}' to node '{node}' (running)"),
    ("manual-migrate", "migrate service '{sid}' to node '{node}'"),
    ("relocate", "relocate service '{sid}' to node '{node}'"),
    ("follow", "crm command '{command}' - {move} service '{sid}' to node '{node}' (service{rest}"),
    ("veto", "crm command '{command}' error - service '{word}' on node '{node}' in negative "
             "affinity with service '{sid}'"),
    ("recover", "recover service '{sid}' from fenced node '{word}' to node '{node}'"),
    ("recover", "recover service '{sid}' to previous failed and fenced node '{node}' again"),
    ("recover-failed", "recovering service '{sid}' from fenced node '{word}' failed, no "
                       "recovery node found"),
    ("back", "moving service '{sid}' back to '{node}', node came back from maintenance."),
    ("retry-here", "Start Error Recovery: Tried all available nodes for service '{sid}', "
                   "retry start on current node. Tried nodes: {tried}"),
    ("give-up", "recovery policy for service {sid} failed, entering error state. "
                "Failed nodes: {tried}"),
    ("auto-rebalance", "auto rebalance - {move} {sid} to {node} ({rest}"),
    ("rebalance-start", "service {sid}: re-balance selected {which} node {node} for startup"),
)
_PATTERNS = tuple((kind, _log_line(template)) for kind, template in _TEMPLATES)
_CRM_LINE = re.compile(r"^\S+\s+\d+\s+\S+/crm: (.*)$")


def parse_log(text: str) -> list[Step]:
    """The manager's placement decisions in a simulator log, in order.

    A failed recovery is logged every round; it counts once until the
    resource gets another decision.
    """
    steps: list[Step] = []
    last: dict[str, Step] = {}
    for line in text.splitlines():
        match = _CRM_LINE.match(line)
        if not match:
            continue
        message = match.group(1).strip()
        for kind, pattern in _PATTERNS:
            found = pattern.match(message)
            if not found:
                continue
            fields = found.groupdict()
            # A failed recovery names no node; retry-here and give-up, the nodes tried.
            node = fields.get("node") or fields.get("tried", "").replace(" ", "")
            step: Step = (kind, fields["sid"], node)
            if kind == "recover-failed" and last.get(step[1]) == step:
                break
            steps.append(step)
            last[step[1]] = step
            break
    return steps


_KIND = {"manual-relocate": "relocate"}


def model_steps(decisions: Iterable[Decision]) -> list[Step]:
    """The model's decisions in the normalised form of :func:`parse_log`."""
    out: list[Step] = []
    for d in decisions:
        if d.kind in ("stuck", "move-stopped", "kept-away"):
            continue
        node = "" if d.kind == "recover-failed" else \
            ",".join(d.tried) if d.kind in ("retry-here", "give-up") else (d.target or "")
        out.append((_KIND.get(d.kind, d.kind), d.sid, node))
    return out


@dataclass(frozen=True)
class ScenarioResult:
    name: str
    #: None when modelled; else why not (a category).
    not_modelled: str | None
    single_trigger: bool
    crs: str
    expected: tuple[Step, ...]
    predicted: tuple[Step, ...]

    @property
    def matched(self) -> bool:
        return self.not_modelled is None and self.expected == self.predicted


def _crs(folder: Path) -> dict[str, object]:
    crs = (_read_json(folder / "datacenter.cfg") or {}).get("crs")
    return crs if isinstance(crs, dict) else {}


def _not_modelled(folder: Path, steps: Sequence[Sequence[str]], log: str) -> str | None:
    crs = _crs(folder)
    if crs.get("ha") == "dynamic":
        return "dynamic CRS"
    if crs.get("ha-auto-rebalance") and crs.get("ha-auto-rebalance-method",
                                                "bruteforce") != "bruteforce":
        return "auto-rebalance (topsis)"
    if (_read_json(folder / "manager_status") or {}).get("disarm"):
        return "disarm"
    if any((folder / name).exists() for name in ("service_status_node1", "service_status_node2",
                                                  "service_status_node3")):
        return "LRM state given by the test"
    for step in steps:
        for command in step:
            try:
                sim_command(command)
            except Unsupported as err:
                return err.category
    return None


def _read_json(path: Path) -> dict[str, object] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def is_single_trigger(steps: Sequence[Sequence[str]]) -> bool:
    """Power on, then at most one step that is not a wait."""
    rest = [s for s in steps[1:] if s and not all(c.startswith("delay") for c in s)]
    return len(rest) <= 1


def run_scenario(folder: Path) -> ScenarioResult:
    log = (folder / "log.expect").read_text()
    steps = json.loads((folder / "cmdlist").read_text())
    expected = tuple(parse_log(log))
    crs = str(_crs(folder).get("ha", "basic"))
    reason = _not_modelled(folder, steps, log)
    single = is_single_trigger(steps)
    if reason is not None:
        return ScenarioResult(folder.name, reason, single, crs, expected, ())
    cluster, events = read_sim_test(folder)
    prediction = predict(cluster, events)
    predicted = tuple(model_steps(d for e in prediction.events for d in e.decisions))
    return ScenarioResult(folder.name, None, single, crs, expected, predicted)


def run_suite(test_dir: Path) -> list[ScenarioResult]:
    """Every ``test-*`` scenario of a pve-ha-manager ``src/test`` folder."""
    return [run_scenario(folder) for folder in sorted(test_dir.glob("test-*"))
            if (folder / "log.expect").is_file() and (folder / "cmdlist").is_file()]


def summary(results: Sequence[ScenarioResult]) -> dict[str, Any]:
    modelled = [r for r in results if r.not_modelled is None]
    reasons: dict[str, list[str]] = {}
    for r in results:
        if r.not_modelled is not None:
            reasons.setdefault(r.not_modelled, []).append(r.name)
    return {
        "scenarios": len(results),
        "modelled": len(modelled),
        "matched": sum(1 for r in modelled if r.matched),
        "with_decisions": sum(1 for r in modelled if r.expected),
        "decisions": sum(len(r.expected) for r in modelled),
        "single_trigger_modelled": sum(1 for r in modelled if r.single_trigger),
        "single_trigger_matched": sum(1 for r in modelled if r.single_trigger and r.matched),
        "mismatched": [r.name for r in modelled if not r.matched],
        "not_modelled": {k: sorted(v) for k, v in sorted(reasons.items())},
    }
