"""One prediction's mutable world: what the nodes, the LRMs and the CRM know.

:class:`World` holds the state every part of the manager reads and changes,
and the queries all of them share (membership, quorum, where a resource is,
which node it would go to). The rounds that change it are the subclasses':
the nodes and LRMs (:mod:`.lrm`), each service's state machine
(:mod:`.transitions`), the CRM round around it (:mod:`.crm`), and the driver
(:mod:`.manager`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from ha_placement.failures import FailureCounters
from ha_placement.model import Cluster, Decision, ServiceConfig
from ha_placement.rules import RuleSet
from ha_placement.scores import GuestSize
from ha_placement.select import Placed, StorageFilter, select_service_node
from ha_placement.usage import Usage

#: The states of a resource that the LRM moves to another node while it runs.
MOTION_STATES = frozenset({"migrate", "relocate"})


@dataclass
class ServiceState:
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


class World:
    """The state of hardware, LRMs and the CRM master, and the queries on it."""

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
        #: Lost nodes whose fence waits for their agent lock: rounds still to wait.
        self.fence_pending: dict[str, int] = {}
        #: Rounds run since the current event, and the rounds until the next one
        #: (None: it waits until the cluster has settled).
        self.event_rounds = 0
        self.next_after: int | None = None
        #: The next event comes while the motions started in this one still run: the
        #: LRMs do not finish them before it (an alternative timing, for admin's events).
        self.motions_outlast_event = False
        #: Resources in 'migrate' / 'relocate' whose LRM has not finished the motion yet.
        self.unfinished_motions: set[str] = set()
        self.requests: set[str] = set(cluster.maintenance_requests)
        self.sc: dict[str, ServiceConfig] = {
            sid: self._group_failback(cd) for sid, cd in cluster.services.items()}
        self.ss: dict[str, ServiceState] = {
            sid: ServiceState(st.state, st.node, st.target, st.maintenance_node,
                          list(st.failed_nodes)) for sid, st in cluster.service_status.items()}
        self.commands: list[tuple[str, str, str]] = []
        self.decisions: list[Decision] = []
        self.last_kind: dict[str, Decision] = {}
        self.rules: RuleSet | None = None
        self.first_rules: RuleSet | None = None
        self.rules_nodes: tuple[str, ...] | None = None
        self.usage = Usage([], False, {}, {})
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

    # ---- membership and quorum

    def member(self, node: str) -> bool:
        return self.power.get(node, False) and self.network.get(node, False)

    def quorate(self) -> bool:
        if self.cluster.quorate is not None:
            return self.cluster.quorate
        members = sum(1 for n in self.power if self.member(n))
        return members * 2 > len(self.power)

    def _group_failback(self, cd: ServiceConfig) -> ServiceConfig:
        # A legacy group's nofailback overrides the resource's failback (groups migration).
        group = self.cluster.groups.get(cd.group) if cd.group else None
        return replace(cd, failback=not group.nofailback) if group is not None else cd

    # ---- the CRM's view of the services

    def online_nodes(self) -> list[str]:
        return sorted(n for n, s in self.ns.items() if s == "online")

    def offline_delayed(self, node: str) -> bool:
        return self.ns.get(node, "unknown") != "online" and node in self.delayed

    def placed(self, sid: str) -> Placed:
        sd = self.ss[sid]
        return Placed(sd.state, sd.node, sd.target)

    def set_state(self, sid: str, state: str, node: str | None = None,
                  target: str | None = None) -> None:
        sd = self.ss[sid]
        sd.state = state
        if state in MOTION_STATES and self.motions_outlast_event:
            self.unfinished_motions.add(sid)
        elif state not in MOTION_STATES:
            self.unfinished_motions.discard(sid)
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
