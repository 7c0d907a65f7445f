"""A prediction, told: human text per event and decision, or JSON for scripts."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ha_placement import MODEL
from ha_placement.model import Decision, Prediction, TimingDependence
from ha_placement.select import Selection

#: The storage verdict of a node for a resource: (eligible, reasons, warnings).
StorageVerdict = tuple[bool, tuple[str, ...], tuple[str, ...]]
StorageView = Callable[[str, str], StorageVerdict | None]

HOOK_NOTE = ("--as-if-storage-hook: nodes the proposed rank_nodes storage hook would leave out "
             "are dropped after node affinity. This is NOT what Proxmox does today: nothing in "
             "pve-ha-manager 5.2.0 consults storage.")

_ACTION = {
    "migrate": "migrate", "relocate": "relocate",
    # Carried out from the manager's command queue: an admin's or auto-rebalance's.
    "manual-migrate": "migrate (queued command)", "manual-relocate": "relocate (queued command)",
    "follow": "follows (positive affinity)", "recover": "recovered",
    "back": "returns from maintenance", "rebalance-start": "start (rebalance-on-start)",
    "move-stopped": "moved while stopped",
    "auto-rebalance": "chosen by auto-rebalance (queues the move)",
}


def _score(value: float) -> str:
    value += 0.0  # no "-0" for a negated zero
    return f"{value:g}" if value == int(value) else f"{value:.6f}"


def selection_lines(sel: Selection) -> list[str]:
    lines = []
    candidates = " ".join(sel.candidates) or "none"
    lines.append(f"candidates: {candidates}")
    for node, reason in sel.excluded.items():
        lines.append(f"  {node}: {reason}")
    if sel.node_affinity:
        lines.append(f"node affinity: rule {sel.node_affinity}")
    if sel.maintenance_node and sel.maintenance_node != sel.current:
        lines.append(f"maintenance fallback: {sel.maintenance_node}")
    if sel.together:
        lines.append("positive affinity partners on: " + ", ".join(
            f"{n} ({c})" for n, c in sel.together.items()))
    if sel.separate:
        lines.append("negative affinity partners on: " + ", ".join(
            f"{n} ({p})" for n, p in sel.separate.items()))
    if sel.scores:
        ordered = sorted(sel.scores.items(), key=lambda kv: (kv[1], kv[0]))
        lines.append("scores (lower wins): " + " ".join(f"{n}={_score(v)}" for n, v in ordered))
    step = sel.step
    if sel.fragile_tie:
        step += " (tie (float-fragile): the static scores differ by less than 1e-12, upstream "
        step += "may pick either)"
    lines.append(f"decided by: {step}")
    return lines


def decision_lines(d: Decision, storage: StorageView | None) -> list[str]:
    if d.kind == "stuck":
        head = f"{d.sid}  stays on {d.source} (not online): no node  [cannot be placed]"
    elif d.kind == "kept-away":
        head = f"{d.sid}  stays on {d.source}: {d.note}"
    elif d.kind == "recover-failed":
        head = f"{d.sid}  recovery from fenced {d.source} failed: no node  [cannot be placed]"
    elif d.kind in ("retry-here", "give-up"):
        head = f"{d.sid}  {'started again on' if d.kind == 'retry-here' else 'stays on'} " \
            f"{d.source}: {d.note} (tried {', '.join(d.tried)})"
        if d.kind == "give-up":
            head += "  [cannot be placed]"
    elif d.kind == "veto":
        head = f"{d.sid}  command to {d.target} refused: {d.note}  [cannot be placed]"
    else:
        head = f"{d.sid}  {d.source} -> {d.target}  {_ACTION.get(d.kind, d.kind)}"
        if d.note:
            head += f" ({d.note})"
    lines = [head]
    if d.selection is not None:
        lines.extend(f"    {line}" for line in selection_lines(d.selection))
    if storage is not None and d.target and d.kind not in ("veto",):
        verdict = storage(d.sid, d.target)
        if verdict is not None:
            lines.append("    storage: " + _verdict_text(verdict))
    return lines


def _verdict_text(verdict: StorageVerdict) -> str:
    eligible, reasons, warnings = verdict
    text = "eligible" if eligible else "left out by rank-nodes: " + "; ".join(reasons)
    if warnings:
        text += " (warnings: " + "; ".join(warnings) + ")"
    return text


def behaviour_warnings(prediction: Prediction) -> list[str]:
    """Outcomes admins ask about: no return after maintenance, stuck on a maintenance node."""
    found = []
    for event in prediction.events:
        for d in event.decisions:
            sel = d.selection
            if d.kind == "kept-away" and sel is not None:
                why = ("failback=0 keeps it where it is" if sel.step == "failback=0 stickiness"
                       else "positive affinity is applied before the maintenance fallback"
                       if sel.together else f"the fallback node is not a candidate ({sel.step})")
                found.append(f"{d.sid} will not return to its maintenance node after "
                             f"'{event.label}': {why}")
            elif d.kind == "stuck":
                found.append(f"{d.sid} stays on maintenance node {d.source} after "
                             f"'{event.label}': no candidate is left and the manager does not "
                             "fall back to a lower node-affinity class; the node cannot "
                             "finish entering maintenance")
    return found


def timing_warning(dependence: TimingDependence) -> str:
    """One timing dependence, with both outcomes."""
    when, why = _WHILE_PENDING[dependence.kind]

    def where(outcome: str) -> str:
        nodes = dependence.outcomes.get(outcome, {})
        return ", ".join(f"{sid} {nodes.get(sid, '(gone)')}" for sid in dependence.resources)
    return (f"timing: where {', '.join(dependence.resources)} end depends on when "
            f"'{dependence.next_event}' comes after '{dependence.event}', which the model "
            f"cannot know: once the cluster has settled: {where('after')}; "
            f"{when.format(dependence.pending)}: {where('during')} ({why})")


#: Per kind of pending work: when the next event comes, and why the manager decides
#: otherwise then.
_WHILE_PENDING = {
    "fence": ("while {} is pending",
              "the manager then walks the resources before it finishes that"),
    "hold": ("while {} is pending",
             "the manager then walks the resources before it finishes that"),
    "migration": ("while {} is still running",
                  "until its LRM has finished, the manager counts a moving resource on both "
                  "nodes, and a move to a node that fails meanwhile fails: the resource goes "
                  "on at its source"),
    "same-round": ("before the manager has read {}",
                   "it then reads both events' commands in the same round and carries out "
                   "neither before the other is read"),
}


def storage_warnings(prediction: Prediction, storage: StorageView | None) -> list[str]:
    found: list[str] = []
    if storage is None:
        return found
    for event in prediction.events:
        for d in event.decisions:
            if d.target and d.kind not in ("veto", "stuck", "recover-failed", "kept-away",
                                           "retry-here", "give-up"):
                verdict = storage(d.sid, d.target)
                if verdict is not None and not verdict[0]:
                    found.append(f"HA will put {d.sid} on {d.target}, which cannot serve its "
                                 f"thin storage here ({'; '.join(verdict[1])})")
    return found


def header(prediction: Prediction, hook: bool) -> list[str]:
    opts = prediction.options
    lines = [f"model: {MODEL}; CRS {prediction.crs}; rebalance-on-start "
             f"{'on' if opts.get('rebalance_on_start') else 'off'}; auto-rebalance "
             f"{'on' if opts.get('auto_rebalance') else 'off'}"]
    rules = prediction.rules
    dropped = "; ".join(f"{rid} ({why})" for rid, why in rules.dropped) or "none"
    lines.append(f"rules: {len(rules.active)} active ({', '.join(rules.active) or '-'}); "
                 f"dropped: {dropped}")
    if hook:
        lines.append(HOOK_NOTE)
    return lines


def render_text(prediction: Prediction, storage: StorageView | None = None,
                hook: bool = False, verbose_events: bool = True) -> str:
    lines = header(prediction, hook)
    for index, event in enumerate(prediction.events, 1):
        lines.append(f"event {index}: {event.label}")
        if not event.decisions:
            lines.append("  no placement decision")
        for d in event.decisions:
            lines.extend(f"  {line}" for line in decision_lines(d, storage))
        for sid, why in event.unplaced.items():
            lines.append(f"  unplaced: {sid}: {why}")
    warnings = [*prediction.warnings, *behaviour_warnings(prediction),
                *storage_warnings(prediction, storage),
                *(timing_warning(t) for t in prediction.timing)]
    if warnings:
        lines.append("warnings:")
        lines.extend(f"  {w}" for w in warnings)
    if prediction.events:
        final = prediction.events[-1].placement
        lines.append("final: " + ", ".join(f"{sid} {node}" + ("" if state == "started"
                                                              else f" ({state})")
                                          for sid, (state, node) in final.items()))
    return "\n".join(lines) + "\n"


def selection_json(sel: Selection) -> dict[str, Any]:
    return {"candidates": list(sel.candidates), "excluded": dict(sel.excluded),
            "scores": dict(sel.scores), "step": sel.step, "tie": sel.tie,
            "fragile_tie": sel.fragile_tie, "node_affinity": sel.node_affinity,
            "affinity": {"together": dict(sel.together), "separate": dict(sel.separate)},
            "maintenance_node": sel.maintenance_node, "preference": sel.preference}


def decision_json(d: Decision, storage: StorageView | None) -> dict[str, Any]:
    out: dict[str, Any] = {"sid": d.sid, "action": d.kind, "from": d.source, "to": d.target}
    if d.note:
        out["note"] = d.note
    if d.kind in ("retry-here", "give-up"):
        # The nodes its start failed on, in order: what the text output lists as "tried".
        out["tried"] = list(d.tried)
    if d.selection is not None:
        out.update(selection_json(d.selection))
    if storage is not None and d.selection is not None:
        nodes = {*d.selection.candidates, *([d.target] if d.target else [])}
        view: dict[str, Any] = {}
        for node in sorted(nodes):
            verdict = storage(d.sid, node)
            if verdict is not None:
                view[node] = {"eligible": verdict[0], "reasons": list(verdict[1]),
                              "warnings": list(verdict[2])}
        out["storage"] = view
    return out


def render_json(prediction: Prediction, storage: StorageView | None = None,
                hook: bool = False) -> dict[str, Any]:
    final: Mapping[str, tuple[str, str]] = (prediction.events[-1].placement
                                            if prediction.events else {})
    unplaced: dict[str, str] = dict(prediction.events[-1].unplaced) if prediction.events else {}
    return {
        "model": MODEL, "crs": prediction.crs, "options": dict(prediction.options),
        "storage_hook": HOOK_NOTE if hook else None,
        "rules": {"active": prediction.rules.active,
                  "dropped": [{"id": rid, "reason": why} for rid, why in prediction.rules.dropped]},
        "events": [{"event": e.label,
                    "decisions": [decision_json(d, storage) for d in e.decisions],
                    "unplaced": dict(e.unplaced), "node_states": dict(e.node_states)}
                   for e in prediction.events],
        "final": {sid: node for sid, (_, node) in final.items()},
        "final_states": {sid: state for sid, (state, _) in final.items()},
        "unplaced": unplaced,
        "warnings": [*prediction.warnings, *behaviour_warnings(prediction),
                     *storage_warnings(prediction, storage),
                     *(timing_warning(t) for t in prediction.timing)],
        "timing": [{"event": t.event, "next_event": t.next_event, "kind": t.kind,
                    "pending": t.pending, "moving": list(t.moving),
                    "resources": list(t.resources),
                    "outcomes": {k: dict(v) for k, v in t.outcomes.items()}}
                   for t in prediction.timing],
    }


def cannot_place(prediction: Prediction) -> bool:
    """Some resource has no node after some event (exit status 3)."""
    for event in prediction.events:
        if event.unplaced:
            return True
        if any(d.kind in ("veto", "stuck", "recover-failed", "give-up")
               for d in event.decisions):
            return True
    return False
