"""The CRM round: node states, rules, commands, the service walk, fencing.

Node states follow the LRMs' membership and modes (``NodeStatus::update``);
admin commands become requests (migrations respect negative affinity and
bring positive partners along); every service is moved on until nothing
changes, and a lost node's resources wait for its fencing before recovery.
"""

from __future__ import annotations

from ha_placement.model import Decision
from ha_placement.rules import build_rules
from ha_placement.transitions import Transitions
from ha_placement.usage import Usage
from ha_placement.world import ServiceState


class CrmRound(Transitions):
    """One CRM master round over the world."""

    def crm_round(self) -> None:
        if not self.quorate():
            return
        self.update_nodes()
        # add new services, drop ignored or removed ones
        for sid in sorted(self.sc):
            cd = self.sc[sid]
            if sid in self.ss or cd.state == "ignored":
                continue
            state = "request_start" if cd.state == "started" else "request_stop"
            self.ss[sid] = ServiceState(state, cd.node)
            self.changed = True
        for sid in sorted(self.ss):
            if sid not in self.sc or self.sc[sid].state == "ignored":
                del self.ss[sid]
                self.changed = True
        self.recompute_usage()
        self.compile_rules()
        self.crm_commands()
        while True:
            repeat = False
            for sid in sorted(self.ss):
                last = self.ss[sid].state
                self.next_state(sid)
                sd = self.ss[sid]
                if self.lrm_mode.get(sd.node) == "restart" and sd.state in (
                        "started", "stopped", "request_stop"):
                    self.set_state(sid, "freeze")
                if sd.state != last:
                    repeat = True
            fenced: dict[str, bool] = {}
            for sid in sorted(self.ss):
                sd = self.ss[sid]
                if sd.state != "fence":
                    continue
                if sd.node not in fenced:
                    fenced[sd.node] = self.fence_node(sd.node)
                if fenced[sd.node]:
                    self.set_state(sid, "recovery")
                    repeat = True
            for node in sorted(n for n in self.ns if n not in fenced):
                if self.ns[node] == "fence" and self.fence_node(node):
                    repeat = True
            if not repeat:
                break

    def update_nodes(self) -> bool:
        """NodeStatus::update; True when the node list changed."""
        changed_list = False
        for node in sorted(self.power):
            if not self.member(node):
                continue
            self.delayed.discard(node)
            mode = self.lrm_mode.get(node, "active")
            state = self.ns.get(node)
            if state is None:
                changed_list = True
            if state == "online":
                if mode == "maintenance":
                    self.ns[node] = "maintenance"
            elif state in (None, "unknown", "gone") or (
                    state == "maintenance" and mode != "maintenance"):
                self.ns[node] = "online"
        for node in sorted(self.ns):
            if self.member(node):
                continue
            state = self.ns[node]
            if state == "online" or (
                    state == "maintenance" and self.lrm_mode.get(node) != "maintenance"):
                self.ns[node] = "unknown"
        return changed_list

    def recompute_usage(self) -> None:
        self.usage = Usage(self.online_nodes(), self.static, self.cluster.capacity,
                            self.sizes)
        for sid in sorted(self.ss):
            self.usage.add(sid, self.placed(sid))
        for guest, node in sorted(self.cluster.other_guests.items()):
            if guest not in self.ss and node in self.usage.online_set:
                self.usage.add_on(guest, (node,))

    def compile_rules(self) -> None:
        nodes = tuple(sorted(self.ns))
        if self.rules is not None and nodes == self.rules_nodes:
            return
        groups = {sid: c.group for sid, c in self.sc.items() if c.group}
        self.rules = build_rules(self.cluster.rules, self.cluster.rule_order, nodes,
                                 self.cluster.groups, groups)
        self.rules_nodes = nodes
        if self.first_rules is None:
            self.first_rules = self.rules

    def fence_node(self, node: str) -> bool:
        if self.ns.get(node) != "fence":
            self.ns[node] = "fence"
            self.changed = True
        # The agent lock is free once the node's LRM let it go: its watchdog fired after
        # the fence delay, it shut down cleanly, or its LRM has not taken it yet.
        if not self.lock.get(node):
            self.ns[node] = "unknown"
            return True
        return False

    def crm_commands(self) -> None:
        commands, self.commands = self.commands, []
        for verb, subject, arg in commands:
            if verb in ("migrate", "relocate"):
                sd = self.ss.get(subject)
                if sd is None or self.ns.get(arg) != "online" or sd.node == arg:
                    continue
                self.queue_motion(verb, subject, arg)
            elif verb == "stop":
                if subject in self.ss:
                    self.ss[subject].cmd = ("stop", arg)
            elif verb == "enable-node-maintenance":
                if self.ns.get(subject) == "online" and not self.cluster.disarmed:
                    self.requests.add(subject)
            elif verb == "disable-node-maintenance":
                self.requests.discard(subject)

    def queue_motion(self, task: str, sid: str, target: str) -> None:
        assert self.rules is not None
        compiled = self.rules.compiled
        for csid in sorted(compiled.negative.get(sid, {})):
            other = self.ss.get(csid)
            if other is None:
                continue
            if other.node and other.node != target:
                continue
            if other.target and other.target != target:
                continue
            self.record(Decision("veto", sid, self.ss[sid].node, target,
                                 note=f"{csid} on {target} in negative affinity (rule "
                                 f"{compiled.negative[sid][csid]})"))
            return
        self.ss[sid].cmd = (task, target)
        for csid in sorted(compiled.positive.get(sid, {})):
            other = self.ss.get(csid)
            if other is None:
                continue
            if other.node == target or other.target == target:
                continue
            self.record(Decision("follow", csid, other.node, target,
                                 note=f"positive affinity with {sid} (rule "
                                 f"{compiled.positive[sid][csid]})"))
            other.cmd = (task, target)
