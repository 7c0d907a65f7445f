"""The facts a prediction starts from, the events, and what comes out: frozen dataclasses."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from ha_placement.rules import Group, RuleData, RuleSet
from ha_placement.scores import GuestSize, NodeCapacity
from ha_placement.select import Selection

#: datacenter.cfg ``ha: shutdown_policy`` values.
SHUTDOWN_POLICIES = ("conditional", "freeze", "failover", "migrate")


@dataclass(frozen=True)
class ServiceConfig:
    """One ``resources.cfg`` entry (requested state, after defaults)."""

    sid: str
    node: str
    #: started, stopped, disabled or ignored.
    state: str
    failback: bool = True
    max_restart: int = 1
    max_relocate: int = 1
    group: str | None = None

    @property
    def kind(self) -> str:
        return self.sid.split(":", 1)[0]


@dataclass(frozen=True)
class ServiceStatus:
    """One ``manager_status`` service entry: the manager's own state of a resource."""

    state: str
    node: str
    target: str | None = None
    maintenance_node: str | None = None
    failed_nodes: tuple[str, ...] = ()


@dataclass(frozen=True)
class NodeFacts:
    """A node: is it powered and on the cluster network, and its LRM's mode."""

    name: str
    power: bool = True
    network: bool = True
    #: active, maintenance, restart, shutdown or disarm.
    lrm_mode: str = "active"


@dataclass(frozen=True)
class Cluster:
    """Everything the manager reads, at one moment."""

    nodes: Mapping[str, NodeFacts]
    services: Mapping[str, ServiceConfig]
    rules: Mapping[str, RuleData] = field(default_factory=dict)
    rule_order: Mapping[str, int] = field(default_factory=dict)
    groups: Mapping[str, Group] = field(default_factory=dict)
    #: The manager's node states; empty for a cluster whose manager has not run yet.
    node_status: Mapping[str, str] = field(default_factory=dict)
    #: The manager's service states; a configured resource missing here is added.
    service_status: Mapping[str, ServiceStatus] = field(default_factory=dict)
    #: Nodes with a pending ``node-maintenance enable`` request.
    maintenance_requests: frozenset[str] = frozenset()
    crs: str = "basic"
    rebalance_on_start: bool = False
    auto_rebalance: bool = False
    #: ``crs: ha-auto-rebalance-threshold / -margin / -method``.
    rebalance_threshold: float = 0.3
    rebalance_margin: float = 0.1
    rebalance_method: str = "bruteforce"
    #: ``crs: ha-auto-rebalance-hold-duration``: manager rounds the imbalance must last.
    rebalance_hold: int = 3
    shutdown_policy: str = "conditional"
    #: Static CRS: node CPUs and memory, guest sizes (by sid, and by non-HA guest id).
    capacity: Mapping[str, NodeCapacity] = field(default_factory=dict)
    sizes: Mapping[str, GuestSize] = field(default_factory=dict)
    #: Running guests that are not HA resources: {guest id: node}; they load nodes too.
    other_guests: Mapping[str, str] = field(default_factory=dict)
    #: None: quorate when more than half of the nodes are members.
    quorate: bool | None = None
    disarmed: bool = False
    locked: frozenset[str] = frozenset()
    #: Where the facts came from, for the output.
    source: str = ""


@dataclass(frozen=True)
class Command:
    """One thing that happens: ``verb`` on ``subject`` (a node or a sid), ``arg`` if any.

    Verbs: maintenance, end-maintenance, fail, return, shutdown, reboot,
    power-on, power-off, network-on, network-off, start, stop, disable,
    stop-now (ha-manager crm-command stop SID TIMEOUT), migrate, relocate, delay,
    add (``arg``: "NODE [STATE [RUNNING]]"), delete, restart-lrm (the node's LRM
    restarts: its resources freeze meanwhile), skip-crm / skip-lrm (``arg``: how many
    manager / LRM rounds do not run, as the simulator's ``skip-round``; at most
    ``events.MAX_SKIPPED_ROUNDS``, past which the simulator's watchdog fires), set-size
    (``arg``: "maxcpu=N maxmem=BYTES", either or both: a guest's size for the static CRS).
    """

    verb: str
    subject: str = ""
    arg: str = ""


@dataclass(frozen=True)
class Event:
    label: str
    commands: tuple[Command, ...]
    #: Manager rounds between the previous event and this one; None: it comes once the
    #: cluster has settled after the previous one (an admin's events, whose timing is
    #: not known). A simulator step comes 5 rounds after the one before, or later after
    #: a ``delay``; what is still in progress then (a fence) overlaps with it.
    after_rounds: int | None = None
    #: It comes while the migrations and relocations the event before started are still
    #: running: their LRMs have not finished them (a live migration takes as long as the
    #: guest's memory takes to copy; the simulator's LRM finishes one in the round it
    #: starts it, so this is only ever set for an alternative timing of admin's events).
    while_moving: bool = False


@dataclass(frozen=True)
class Decision:
    """A placement the manager makes (or refuses), in the order it makes them.

    kind: migrate / relocate (its own choice), manual-migrate / manual-relocate
    (an admin's command carried out), follow (a positive partner gets the same
    command), veto (a negative partner blocks the command), recover,
    recover-failed, back (returns to its maintenance node), rebalance-start,
    stuck (stays on a node that is not online: no node to go to), kept-away (its
    maintenance node is back but it stays), move-stopped (a manual motion of a
    stopped resource), retry-here (its start failed on every node it may go to:
    started again where it is), give-up (its start failed on more than
    ``max_relocate`` + 1 nodes: error state, left to the admin), auto-rebalance (the
    manager moves it to even out the node loads; the move follows as manual-migrate
    or manual-relocate).
    """

    kind: str
    sid: str
    source: str | None
    target: str | None
    selection: Selection | None = None
    note: str = ""
    #: retry-here, give-up: the nodes its start failed on, in order.
    tried: tuple[str, ...] = ()


@dataclass(frozen=True)
class EventResult:
    label: str
    decisions: tuple[Decision, ...]
    #: {sid: (state, node)} once the manager has settled after the event.
    placement: Mapping[str, tuple[str, str]]
    #: {sid: why it has no node} at the end of the event.
    unplaced: Mapping[str, str]
    node_states: Mapping[str, str]


@dataclass(frozen=True)
class TimingDependence:
    """Where the end placement depends on when the next event comes, which the model
    cannot know for an admin's events: each outcome, and the resources it changes."""

    event: str
    next_event: str
    #: What may still be in progress: "fence", "hold" (auto-rebalance's), "migration".
    kind: str
    #: The same, told.
    pending: str
    resources: tuple[str, ...]
    #: {"after": {sid: node}, "during": {sid: node}}: the end placement of ``resources``
    #: when the next event comes once the cluster has settled, or while it is pending.
    outcomes: Mapping[str, Mapping[str, str]]
    #: kind "migration": the resources whose migration or relocation may still run.
    moving: tuple[str, ...] = ()


@dataclass(frozen=True)
class Prediction:
    rules: RuleSet
    events: tuple[EventResult, ...]
    warnings: tuple[str, ...]
    crs: str
    options: Mapping[str, bool]
    timing: tuple[TimingDependence, ...] = ()
