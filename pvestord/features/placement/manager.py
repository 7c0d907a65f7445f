"""The HA manager's rounds, as a pure function of a :class:`Cluster` and a list of events.

Each event is applied, then the cluster runs until nothing changes: CRM
rounds (node states, rules, commands, then every service in string order of
its id, repeated until no state changes, then fencing), the LRMs carrying
out migrations and stops, nodes finishing a shutdown; then the 60 s after
which a lost node is fenced pass, and it runs again. Only the order of the
manager's decisions is modelled, not their timing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from pvestord.features.placement.failures import (
    FailureCounters,
    InjectedFailures,
    injected_failures,
)
from pvestord.features.placement.model import (
    Cluster,
    Command,
    Decision,
    Event,
    EventResult,
    NodeFacts,
    Prediction,
    ServiceConfig,
)
from pvestord.features.placement.rebalance import Bundle, best_move
from pvestord.features.placement.rules import RuleSet, build_rules
from pvestord.features.placement.scores import GuestSize, NodeCapacity, basic_scores, static_scores
from pvestord.features.placement.select import (
    Placed,
    StorageFilter,
    select_service_node,
    used_nodes,
)

#: Bound on settle iterations per event: a real cluster always settles well before.
MAX_STEPS = 200


@dataclass
class _Service:
    """The manager's mutable status of one resource during a prediction."""

    state: str
    node: str
    target: str | None = None
    maintenance_node: str | None = None
    failed_nodes: list[str] = field(default_factory=list)
    cmd: tuple[str, str] | None = None
    #: The LRM has reported the migration / stop as done.
    lrm_done: bool = False
    #: ... and it failed (only resources with injected failures fail).
    lrm_error: bool = False
    #: The LRM's start of an ``fa:`` resource in state started: None (not tried yet),
    #: "ok" / "error" (not yet read by the manager), "read".
    start_result: str | None = None


class _Usage:
    """The CRS view of the online nodes (PVE::HA::Usage::Basic / Static)."""

    def __init__(self, online: Sequence[str], static: bool, capacity: Mapping[str, NodeCapacity],
                 sizes: Mapping[str, GuestSize]) -> None:
        self.online = list(online)
        self.online_set = set(online)
        self.static = static
        self.capacity = capacity
        self.sizes = sizes
        self.users: dict[str, set[str]] = {n: set() for n in online}
        self.cpu: dict[str, float] = {n: 0.0 for n in online}
        self.mem: dict[str, float] = {n: 0.0 for n in online}
        self.where: dict[str, tuple[str, ...]] = {}
        #: Bumped on every change; scores are cached per resource and version.
        self.version = 0
        self.cache: dict[str, tuple[int, dict[str, float]]] = {}

    def add(self, sid: str, placed: Placed) -> None:
        nodes = tuple(n for n in used_nodes(self.online_set, placed) if n is not None)
        self.add_on(sid, nodes)

    def add_on(self, sid: str, nodes: tuple[str, ...]) -> None:
        self.version += 1
        self.where[sid] = nodes
        size = self.sizes.get(sid)
        for node in nodes:
            self.users[node].add(sid)
            if self.static and size is not None:
                cap = self.capacity[node]
                self.cpu[node] += cap.maxcpu if size.maxcpu == 0 else size.maxcpu
                self.mem[node] += size.maxmem

    def remove(self, sid: str) -> None:
        self.version += 1
        size = self.sizes.get(sid)
        for node in self.where.pop(sid, ()):
            self.users[node].discard(sid)
            if self.static and size is not None:
                cap = self.capacity[node]
                self.cpu[node] -= cap.maxcpu if size.maxcpu == 0 else size.maxcpu
                self.mem[node] -= size.maxmem

    def score(self, sid: str) -> dict[str, float]:
        cached = self.cache.get(sid)
        if cached is not None and cached[0] == self.version:
            return cached[1]
        result = self._score(sid)
        self.cache[sid] = (self.version, result)
        return result

    def _score(self, sid: str) -> dict[str, float]:
        if not self.static:
            return basic_scores({n: len(u) for n, u in self.users.items()})
        size = self.sizes.get(sid)
        if size is None:
            # Upstream: scoring fails without the guest's stats, every node scores 0.
            return {n: 0.0 for n in self.online}
        return static_scores(self.online, self.capacity, self.cpu, self.mem, size)


class _Manager:
    """One prediction's mutable world: hardware, LRMs and the CRM master."""

    def __init__(self, cluster: Cluster, storage: StorageFilter | None) -> None:
        self.cluster = cluster
        self.storage = storage
        self.power = {n: f.power for n, f in cluster.nodes.items()}
        self.network = {n: f.network for n, f in cluster.nodes.items()}
        self.lrm_mode = {n: f.lrm_mode for n, f in cluster.nodes.items()}
        #: Does the node's LRM hold its agent lock (fencing waits until it is free)?
        self.lock = {n: f.power and f.network for n, f in cluster.nodes.items()}
        #: Guests already running though the manager has not started them (``add ... 1``).
        self.running: set[str] = set()
        #: Pending shutdown: node -> reboot?
        self.shutdown: dict[str, bool] = {}
        self.power_on_next: set[str] = set()
        self.ns: dict[str, str] = dict(cluster.node_status)
        self.delayed: set[str] = set()
        self.requests: set[str] = set(cluster.maintenance_requests)
        self.sc: dict[str, ServiceConfig] = {
            sid: self._group_failback(cd) for sid, cd in cluster.services.items()}
        self.ss: dict[str, _Service] = {
            sid: _Service(st.state, st.node, st.target, st.maintenance_node,
                          list(st.failed_nodes)) for sid, st in cluster.service_status.items()}
        self.commands: list[tuple[str, str, str]] = []
        self.decisions: list[Decision] = []
        self.last_kind: dict[str, Decision] = {}
        self.rules: RuleSet | None = None
        self.first_rules: RuleSet | None = None
        self.rules_nodes: tuple[str, ...] | None = None
        self.usage = _Usage([], False, {}, {})
        self.static = cluster.crs == "static" and all(
            n in cluster.capacity for n in cluster.nodes)
        self.changed = False
        #: Resources already reported as not returning to their maintenance node.
        self.kept_away: set[str] = set()
        #: Injected failures (``fa:`` resources): try counters, the LRMs' restart
        #: tries per (node, sid), and which of them run.
        self.fail_tries = FailureCounters({}, {})
        self.restart_tries: dict[tuple[str, str], int] = {}
        self.fa_running: set[str] = set()
        #: Guest sizes (static CRS); the simulator's set-static-stats changes them.
        self.sizes: dict[str, GuestSize] = dict(cluster.sizes)
        #: Nodes whose LRM restarts once their resources are frozen.
        self.lrm_restarting: set[str] = set()
        #: Rounds still to skip: {"crm": n, "lrm": n}.
        self.skip = {"crm": 0, "lrm": 0}

    # ---- hardware and LRMs

    def member(self, node: str) -> bool:
        return self.power.get(node, False) and self.network.get(node, False)

    def quorate(self) -> bool:
        if self.cluster.quorate is not None:
            return self.cluster.quorate
        members = sum(1 for n in self.power if self.member(n))
        return members * 2 > len(self.power)

    def apply(self, command: Command) -> None:
        verb, subject, arg = command.verb, command.subject, command.arg
        if verb == "maintenance":
            self.commands.append(("enable-node-maintenance", subject, ""))
        elif verb == "end-maintenance":
            self.commands.append(("disable-node-maintenance", subject, ""))
        elif verb in ("fail", "network-off"):
            self.network[subject] = False
        elif verb == "power-off":
            self.power[subject] = False
        elif verb == "return":
            self.power[subject] = self.network[subject] = True
            self.shutdown.pop(subject, None)
            self._lrm_start(subject)
        elif verb == "power-on":
            if not self.power.get(subject):
                self.power[subject] = self.network[subject] = True
                self.shutdown.pop(subject, None)
                self._lrm_start(subject)
        elif verb == "network-on":
            self.network[subject] = True
        elif verb in ("shutdown", "reboot"):
            self._shutdown_request(subject, reboot=verb == "reboot")
        elif verb == "restart-lrm":
            if self.power.get(subject) and subject not in self.shutdown:
                self.lrm_mode[subject] = "restart"
                self.lrm_restarting.add(subject)
        elif verb == "set-size":
            old = self.sizes.get(subject, GuestSize(0.0, 0.0))
            values = dict(part.split("=", 1) for part in arg.split())
            self.sizes[subject] = GuestSize(float(values.get("maxcpu", old.maxcpu)),
                                            float(values.get("maxmem", old.maxmem)))
        elif verb in ("skip-crm", "skip-lrm"):
            self.skip[verb[5:]] += int(arg or "1")
        elif verb in ("start", "stop", "disable", "ignore"):
            state = {"start": "started", "stop": "stopped", "disable": "disabled",
                     "ignore": "ignored"}[verb]
            if subject in self.sc:
                self.sc[subject] = replace(self.sc[subject], state=state)
        elif verb == "add" and subject not in self.sc:
            node, *rest = arg.split()
            state = rest[0] if rest else "started"
            self.sc[subject] = ServiceConfig(subject, node,
                                             "started" if state == "enabled" else state)
            if len(rest) > 1 and rest[1] == "1":
                self.running.add(subject)
        elif verb == "delete":
            self.sc.pop(subject, None)
        elif verb == "stop-now":
            self.commands.append(("stop", subject, arg))
        elif verb in ("migrate", "relocate"):
            self.commands.append((verb, subject, arg))

    def _group_failback(self, cd: ServiceConfig) -> ServiceConfig:
        # A legacy group's nofailback overrides the resource's failback (groups migration).
        group = self.cluster.groups.get(cd.group) if cd.group else None
        return replace(cd, failback=not group.nofailback) if group is not None else cd

    def _lrm_start(self, node: str) -> None:
        # A (re)started LRM comes up active, or in maintenance if that is still requested.
        self.lrm_mode[node] = "maintenance" if node in self.requests else "active"

    def _shutdown_request(self, node: str, reboot: bool) -> None:
        if not self.power.get(node) or node in self.shutdown:
            return
        self.shutdown[node] = reboot
        policy = self.cluster.shutdown_policy
        if node in self.requests or self.lrm_mode.get(node) == "maintenance" or policy == "migrate":
            self.lrm_mode[node] = "maintenance"
        elif policy == "freeze" or (policy == "conditional" and reboot):
            self.lrm_mode[node] = "restart"
        else:
            self.lrm_mode[node] = "shutdown"

    def lrm_round(self) -> None:
        for sid in sorted(self.ss):
            sd = self.ss[sid]
            if sd.lrm_done or not self.power.get(sd.node) or not self.member(sd.node):
                continue
            failures = injected_failures(sid)
            if sd.state in ("migrate", "relocate", "request_start_balance"):
                if sd.target is not None and self.member(sd.target):
                    sd.lrm_done = True
                    self.changed = True
                    if failures is not None and not (
                            sd.state == "request_start_balance" and sid in self.fa_running):
                        sd.lrm_error = not self.fail_tries.try_migrate(sid, failures, sd.node)
                        if not sd.lrm_error:
                            # The simulator's guest runs on no node after a move.
                            self.fa_running.discard(sid)
            elif sd.state == "request_stop":
                sd.lrm_done = True
                self.changed = True
                if failures is not None and sid in self.fa_running:
                    sd.lrm_error = failures.stop_fails
                    if not sd.lrm_error:
                        self.fa_running.discard(sid)
            elif sd.state == "started" and failures is not None and sd.start_result is None \
                    and self.lock.get(sd.node):
                self.lrm_start(sid, failures)
        for node in sorted(self.power):
            if not self.power[node]:
                continue
            if self.member(node) and self.quorate() and not self.lock.get(node) \
                    and not self._fence_requested(node):
                self.lock[node] = True
                self.changed = True
            if node in self.lrm_restarting and self._active_services(node) == 0:
                # Every resource is frozen: the LRM exits and its successor comes up.
                self.lrm_restarting.discard(node)
                self._lrm_start(node)
                self.changed = True
            mode = self.lrm_mode.get(node, "active")
            if node not in self.shutdown:
                if node in self.requests and mode == "active" and self.member(node):
                    self.lrm_mode[node] = "maintenance"
                    self.changed = True
                elif node not in self.requests and mode == "maintenance":
                    self.lrm_mode[node] = "active"
                    self.changed = True
                continue
            if mode == "shutdown" or self._active_services(node) == 0:
                self._finish_shutdown(node)

    def lrm_start(self, sid: str, failures: InjectedFailures) -> None:
        """One LRM round's start try; the manager hears of it on success or after
        ``max_restart`` local retries (each retry is a later round)."""
        sd = self.ss[sid]
        self.changed = True
        key = (sd.node, sid)
        if sid in self.fa_running or self.fail_tries.try_start(sid, failures, sd.node):
            self.fa_running.add(sid)
            self.restart_tries[key] = 0
            sd.start_result = "ok"
            return
        cd = self.sc.get(sid)
        max_restart = cd.max_restart if cd is not None else 0
        if self.restart_tries.get(key, 0) >= max_restart:
            self.restart_tries[key] = 0
            sd.start_result = "error"
            return
        self.restart_tries[key] = self.restart_tries.get(key, 0) + 1

    def _fence_requested(self, node: str) -> bool:
        """An LRM does not take its agent lock while the manager wants its node fenced."""
        return self.ns.get(node) == "fence" or any(
            sd.node == node and sd.state == "fence" for sd in self.ss.values())

    def _active_services(self, node: str) -> int:
        return sum(1 for sd in self.ss.values() if sd.node == node
                   and sd.state not in ("stopped", "freeze", "error"))

    def _finish_shutdown(self, node: str) -> None:
        reboot = self.shutdown.pop(node)
        self.power[node] = False
        self.lock[node] = False
        self.changed = True
        if reboot:
            self.power_on_next.add(node)

    def hardware_step(self) -> None:
        for node in sorted(self.power_on_next):
            self.power[node] = True
            self._lrm_start(node)
            self.changed = True
        self.power_on_next.clear()

    # ---- the CRM

    def online_nodes(self) -> list[str]:
        return sorted(n for n, s in self.ns.items() if s == "online")

    def placed(self, sid: str) -> Placed:
        sd = self.ss[sid]
        return Placed(sd.state, sd.node, sd.target)

    def set_state(self, sid: str, state: str, node: str | None = None,
                  target: str | None = None) -> None:
        sd = self.ss[sid]
        sd.state = state
        if node is not None:
            sd.node = node
        sd.target = target
        sd.lrm_done = False
        sd.lrm_error = False
        sd.start_result = None
        self.usage.remove(sid)
        self.usage.add(sid, self.placed(sid))
        self.changed = True

    def record(self, decision: Decision) -> None:
        self.decisions.append(decision)
        self.last_kind[decision.sid] = decision

    def choose(self, sid: str, preference: str,
               explain: bool = True) -> tuple[str | None, Decision]:
        sd = self.ss[sid]
        assert self.rules is not None
        placed = {s: self.placed(s) for s in self._partners(sid)}
        placed[sid] = self.placed(sid)
        selection = select_service_node(
            self.rules.compiled, self.ns, self.usage.online_set, sid, placed,
            self.sc[sid].failback, preference, sd.maintenance_node, tuple(sd.failed_nodes),
            self.usage.score, self.static, self.storage, explain)
        return selection.node, Decision("", sid, sd.node, selection.node, selection)

    def stays_trivially(self, sid: str) -> bool:
        """No rule, no fallback, on an online node: the manager keeps it there, always."""
        assert self.rules is not None
        compiled = self.rules.compiled
        sd = self.ss[sid]
        return (self.storage is None and sd.maintenance_node is None
                and sd.node in self.usage.online_set and sid not in compiled.node_affinity
                and sid not in compiled.positive and sid not in compiled.negative)

    def _partners(self, sid: str) -> Iterable[str]:
        assert self.rules is not None
        compiled = self.rules.compiled
        for partner in (*compiled.positive.get(sid, {}), *compiled.negative.get(sid, {})):
            if partner in self.ss:
                yield partner

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

    def offline_delayed(self, node: str) -> bool:
        return self.ns.get(node, "unknown") != "online" and node in self.delayed

    def recompute_usage(self) -> None:
        self.usage = _Usage(self.online_nodes(), self.static, self.cluster.capacity,
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
            self.ss[sid] = _Service(state, cd.node)
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

    # ---- one event

    def settle(self) -> None:
        for _ in range(MAX_STEPS):
            self.changed = False
            for daemon, round_of in (("crm", self.crm_round), ("lrm", self.lrm_round)):
                if self.skip[daemon]:
                    self.skip[daemon] -= 1
                    self.changed = True
                else:
                    round_of()
            self.hardware_step()
            if not self.changed:
                return

    def run_event(self, event: Event) -> EventResult:
        start = len(self.decisions)
        self.kept_away = set()
        for command in event.commands:
            self.apply(command)
        for _ in range(MAX_STEPS):
            self.settle()
            # The fence delay passes: lost nodes are fenced (their watchdog fired).
            lost = {n for n in self.power if not self.member(n)} - self.delayed
            # Without quorum, a node whose LRM holds its lock is reset by its watchdog.
            orphaned = set() if self.quorate() else {
                n for n in self.power if self.power[n] and self.lock.get(n)}
            if not lost and not orphaned:
                if self.rebalance():
                    continue
                break
            self.delayed |= lost
            for node in sorted(lost | orphaned):
                self.lock[node] = False
                if node in orphaned or (self.power.get(node) and not self.network.get(node)):
                    self.power[node] = False
                    self.shutdown.pop(node, None)
        return EventResult(event.label, tuple(self.decisions[start:]), self.placement(),
                           self.unplaced(), dict(sorted(self.ns.items())))

    def rebalance(self) -> bool:
        """``load_balance``, once the cluster has settled: True when it queued a move."""
        cluster = self.cluster
        if not (cluster.auto_rebalance and self.static and self.rules is not None
                and cluster.rebalance_method == "bruteforce" and self.quorate()):
            return False
        if any(sd.state in ("migrate", "relocate") or (
                sd.cmd is not None and sd.cmd[0] in ("migrate", "relocate"))
               for sd in self.ss.values()):
            return False
        usage = self.usage
        move = best_move(self.bundles(), usage.cpu, usage.mem, cluster.capacity, self.sizes,
                         cluster.rebalance_threshold, cluster.rebalance_margin)
        if move is None:
            return False
        self.record(Decision("auto-rebalance", move.leader, move.source, move.target,
                             note=f"node imbalance {move.before:.2f} -> {move.after:.2f}"))
        task = "migrate" if self.sc[move.leader].kind == "vm" else "relocate"
        self.queue_motion(task, move.leader, move.target)
        return True

    def bundles(self) -> list[Bundle]:
        """Running resources with their running positive partners, all on one node."""
        assert self.rules is not None
        compiled = self.rules.compiled
        online = self.usage.online_set
        found: dict[str, Bundle] = {}
        for sid in sorted(self.ss):
            sd = self.ss[sid]
            if sd.state != "started":
                continue
            members, nodes, moving = [sid], {sd.node}, False
            for partner in compiled.positive.get(sid, {}):
                other = self.ss.get(partner)
                if other is None:
                    continue
                if other.state in ("migrate", "relocate"):
                    moving = True
                    break
                if other.state == "started":
                    members.append(partner)
                    nodes.add(other.node)
            if moving or len(nodes) > 1:
                continue
            members.sort()
            leader = members[0]
            if leader in found:
                continue
            source = self.ss[leader].node
            affinity = compiled.node_affinity.get(leader)
            targets = set(online)
            if affinity is not None:
                for _, class_nodes in affinity.classes:
                    targets = set(class_nodes & online)
                    if targets:
                        break
            for partner in compiled.negative.get(leader, {}):
                if partner in self.ss:
                    for node in used_nodes(online, self.placed(partner)):
                        targets.discard(node or "")
            targets.discard(source)
            if targets:
                found[leader] = Bundle(leader, tuple(members), source, tuple(sorted(targets)))
        return [found[leader] for leader in sorted(found)]

    def placement(self) -> dict[str, tuple[str, str]]:
        return {sid: (sd.state, sd.node) for sid, sd in sorted(self.ss.items())}

    def unplaced(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for sid, sd in sorted(self.ss.items()):
            node_state = self.ns.get(sd.node, "unknown")
            if sd.state == "recovery":
                out[sid] = f"no recovery node found (fenced node {sd.node})"
            elif sd.state == "started" and node_state == "maintenance":
                out[sid] = f"stays on maintenance node {sd.node}: no node to go to"
        return out


def warnings_for(cluster: Cluster) -> list[str]:
    """What the model does not cover, when present in the facts."""
    found = []
    if cluster.auto_rebalance and (cluster.crs != "static"
                                   or cluster.rebalance_method != "bruteforce"):
        found.append("ha-auto-rebalance is on: its moves are modelled only with the static "
                     "CRS and the bruteforce method, not here")
    elif cluster.auto_rebalance:
        found.append("ha-auto-rebalance is on: its moves are predicted once the cluster has "
                     "settled after each event; the hold time only delays them")
    if cluster.crs == "dynamic":
        found.append("CRS 'dynamic' scores measured load, which is not modelled: predicted "
                     "with the static scores instead")
    elif cluster.crs == "static" and not all(n in cluster.capacity for n in cluster.nodes):
        found.append("CRS 'static' without node CPU/memory for every node: the manager falls "
                     "back to 'basic', and so does this prediction")
    if cluster.disarmed:
        found.append("HA is disarmed: the manager places nothing until it is armed again "
                     "(not modelled)")
    for sid, status in sorted(cluster.service_status.items()):
        if status.state in ("error", "freeze", "fence"):
            found.append(f"{sid} is in state '{status.state}': its recovery is not modelled "
                         "beyond the manager's state machine")
    for sid in sorted(cluster.locked):
        found.append(f"{sid} has a lock in its guest config: recovery may be blocked "
                     "(not modelled)")
    if cluster.quorate is False:
        found.append("the cluster has no quorum: the manager does nothing")
    return found


def predict(cluster: Cluster, events: Sequence[Event],
            storage: StorageFilter | None = None) -> Prediction:
    """What the manager decides after each event, in order (a pure function of its inputs)."""
    manager = _Manager(cluster, storage)
    if not events:
        events = [Event("(no event)", ())]
    results = [manager.run_event(event) for event in events]
    rules = manager.first_rules or build_rules(cluster.rules, cluster.rule_order,
                                               sorted(cluster.nodes))
    options = {"rebalance_on_start": cluster.rebalance_on_start,
               "auto_rebalance": cluster.auto_rebalance}
    return Prediction(rules, tuple(results), tuple(warnings_for(cluster)),
                      cluster.crs if manager.static or cluster.crs != "static" else "basic",
                      options)


def node_facts(names: Iterable[str], down: Callable[[str], bool] = lambda _: False) \
        -> dict[str, NodeFacts]:
    return {n: NodeFacts(n, power=not down(n), network=not down(n)) for n in names}
