"""One service's next state in a CRM round (``next_state_*`` of Manager.pm).

Each function reads the resource's status and config and the node states,
and moves it on: a stopped resource starts or follows a manual move, a
started one follows commands, failed starts, rules and maintenance, a
migration ends, a fenced node's resources are recovered.
"""

from __future__ import annotations

from dataclasses import replace

from ha_placement.model import Decision, ServiceConfig
from ha_placement.world import World


class Transitions(World):
    """The per-service state machine the CRM round walks."""

    def next_state(self, sid: str) -> None:
        sd = self.ss[sid]
        cd = self.sc.get(sid) or ServiceConfig(sid, sd.node, "disabled")
        state = sd.state
        if state == "stopped":
            self.next_stopped(sid, cd)
        elif state == "started":
            self.next_started(sid, cd)
        elif state == "request_start":
            self.next_request_start(sid, cd)
        elif state in ("migrate", "relocate", "request_start_balance"):
            if sd.lrm_done and sd.state != "request_start_balance" and cd.node != sd.node:
                # The guest is not where the manager thinks: the LRM answers EWRONG_NODE.
                self.set_state(sid, "error")
                return
            if sd.lrm_done and sd.lrm_error:
                # The migration failed: the resource goes on where it is.
                req = "started" if cd.state == "started" else "request_stop"
                self.set_state(sid, req, node=sd.node)
                return
            if sd.lrm_done and sd.state == "request_start_balance" and sid in self.running:
                # The LRM does not move a running guest: IGNORED, it starts where it is.
                req = "started" if cd.state == "started" else "request_stop"
                self.set_state(sid, req, node=sd.node)
                return
            if sd.lrm_done:
                req = "started" if cd.state == "started" else "request_stop"
                self.set_state(sid, req, node=sd.target)
                self.sc[sid] = replace(cd, node=self.ss[sid].node)
                return
            if self.offline_delayed(sd.node):
                self.set_state(sid, "fence")
        elif state == "recovery":
            self.next_recovery(sid, cd)
        elif state == "request_stop":
            if sd.lrm_done:
                self.set_state(sid, "error" if sd.lrm_error else "stopped")
            elif self.offline_delayed(sd.node):
                self.set_state(sid, "fence")
        elif state == "freeze":
            if self.lrm_mode.get(sd.node) == "active" and self.member(sd.node):
                self.set_state(sid, "started" if cd.state == "started" else "request_stop")
        elif state == "error" and cd.state == "disabled":
            sd.failed_nodes = []
            self.set_state(sid, "stopped")

    def next_stopped(self, sid: str, cd: ServiceConfig) -> None:
        sd = self.ss[sid]
        if sd.node != cd.node:
            sd.node = cd.node
        if sd.cmd is not None:
            task, target = sd.cmd
            sd.cmd = None
            if task in ("migrate", "relocate") and self.ns.get(target) == "online" \
                    and sd.node != target:
                self.record(Decision("move-stopped", sid, sd.node, target,
                                     note=f"manual {task} of a stopped resource"))
                self.set_state(sid, task, node=sd.node, target=target)
                return
        if cd.state == "disabled":
            return
        if self.offline_delayed(sd.node) and self.ns.get(sd.node) != "maintenance":
            self.set_state(sid, "fence")
            return
        if cd.state == "started":
            self.set_state(sid, "request_start", node=sd.node)

    def next_request_start(self, sid: str, cd: ServiceConfig) -> None:
        sd = self.ss[sid]
        if self.cluster.rebalance_on_start:
            node, decision = self.choose(sid, "best-score")
            chosen = node if node is not None else sd.node
            self.record(replace(decision, kind="rebalance-start", target=chosen))
            if chosen != sd.node:
                self.set_state(sid, "request_start_balance", node=sd.node, target=chosen)
                return
        self.set_state(sid, "started", node=sd.node)

    def next_started(self, sid: str, cd: ServiceConfig) -> None:
        sd = self.ss[sid]
        node_state = self.ns.get(sd.node, "unknown")
        if node_state != "online":
            if self.offline_delayed(sd.node):
                self.set_state(sid, "fence")
            if node_state != "maintenance":
                return
            sd.maintenance_node = sd.node
        if cd.state in ("disabled", "stopped"):
            self.set_state(sid, "request_stop")
            return
        if cd.state != "started":
            return
        if sd.cmd is not None:
            task, target = sd.cmd
            sd.cmd = None
            if task in ("migrate", "relocate"):
                if self.ns.get(target) == "online" and sd.node != target:
                    self.record(Decision(f"manual-{task}", sid, sd.node, target))
                    self.set_state(sid, task, node=sd.node, target=target)
            elif task == "stop":
                self.set_state(sid, "request_stop")
                self.sc[sid] = replace(cd, state="stopped")
            return
        preference = "none"
        if sd.start_result in ("ok", "error"):
            if sd.start_result == "ok":
                sd.failed_nodes = []
                sd.start_result = "read"
            else:
                sd.failed_nodes.append(sd.node)
                if len(sd.failed_nodes) > cd.max_relocate:
                    self.record(Decision("give-up", sid, sd.node, None,
                                         note="start failed on too many nodes (max_relocate "
                                         f"{cd.max_relocate}): error state",
                                         tried=tuple(sd.failed_nodes)))
                    self.set_state(sid, "error")
                    return
                preference = "try-next"
                # Unless it moves, the LRM tries to start it here again.
                sd.start_result = None
                self.changed = True
        if preference == "none" and self.stays_trivially(sid):
            return
        node, decision = self.choose(sid, preference, explain=False)
        fallback = sd.maintenance_node
        if node != sd.node or (fallback is not None and fallback != sd.node):
            # A move, no node, or a fallback not taken: worth its reasons.
            node, decision = self.choose(sid, preference)
        if node is None and preference == "try-next":
            self.record(replace(decision, kind="retry-here", target=sd.node,
                                note="its start failed on every node it may go to",
                                tried=tuple(sd.failed_nodes)))
        if node is not None and node != sd.node:
            if sd.maintenance_node is not None:
                if node == sd.maintenance_node:
                    self.record(replace(decision, kind="back"))
                    sd.maintenance_node = None
                elif sd.node != sd.maintenance_node:
                    sd.maintenance_node = None
            kind = "migrate" if cd.kind == "vm" else "relocate"
            self.record(replace(decision, kind=kind))
            self.set_state(sid, kind, node=sd.node, target=node)
            return
        if node is not None and node == sd.node and fallback is not None \
                and fallback != sd.node and self.ns.get(fallback) == "online" \
                and sid not in self.kept_away:
            self.kept_away.add(sid)
            self.record(replace(decision, kind="kept-away",
                                note=f"does not return to maintenance node {fallback}"))
        if node is None and node_state == "maintenance":
            previous = self.last_kind.get(sid)
            if previous is None or previous.kind != "stuck":
                self.record(replace(decision, kind="stuck", target=None,
                                    note=f"stays on maintenance node {sd.node}"))
        if sd.maintenance_node is not None and sd.node == sd.maintenance_node \
                and node_state == "online":
            sd.maintenance_node = None

    def next_recovery(self, sid: str, cd: ServiceConfig) -> None:
        sd = self.ss[sid]
        fenced = sd.node
        node, decision = self.choose(sid, "best-score")
        if node is not None:
            # The fenced node is off: nothing runs there any more.
            self.fa_running.discard(sid)
            self.record(replace(decision, kind="recover", source=fenced))
            sd.node = node
            self.sc[sid] = replace(cd, node=node)
            self.set_state(sid, "started" if cd.state == "started" else "request_stop",
                           node=node)
            return
        previous = self.last_kind.get(sid)
        if previous is None or previous.kind != "recover-failed":
            self.record(replace(decision, kind="recover-failed", source=fenced, target=None))
        if cd.state == "disabled":
            sd.failed_nodes = []
            self.set_state(sid, "stopped")
