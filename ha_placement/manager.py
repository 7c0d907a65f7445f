"""The HA manager's rounds, as a pure function of a :class:`Cluster` and a list of events.

Each event is applied, then the cluster runs until nothing changes: CRM
rounds (node states, rules, commands, then every service in string order of
its id, repeated until no state changes, then fencing), the LRMs carrying
out migrations and stops, nodes finishing a shutdown; then the 60 s after
which a lost node is fenced pass, and it runs again. Only the order of the
manager's decisions is modelled, and of timing only what decides that order
when events overlap: a simulator step comes a known number of rounds after
the one before; a fence not yet acknowledged by then waits into it, and any
other work not settled by then goes on in its rounds.

The rounds live beside this driver, split as Manager.pm's work splits:
:mod:`.world` (the state and the queries on it), :mod:`.lrm` (nodes and
LRMs), :mod:`.transitions` (one service's next state), :mod:`.crm` (the
CRM round around them: node states, commands, fencing).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace

from ha_placement.crm import CrmRound
from ha_placement.lrm import LrmRounds
from ha_placement.model import (
    Cluster,
    Decision,
    Event,
    EventResult,
    NodeFacts,
    Prediction,
    TimingDependence,
)
from ha_placement.rebalance import Bundle, best_move
from ha_placement.rules import build_rules
from ha_placement.select import StorageFilter, used_nodes

#: Bound on settle iterations per event: a real cluster always settles well before.
MAX_STEPS = 200

#: Manager rounds from a node's loss to the acknowledged fence, in the simulator's 20 s
#: rounds: 60 s of fence delay put its resources in 'fence', then the manager waits for
#: the node's agent lock, which expires 120 s after its LRM last renewed it.
FENCE_ACK_ROUNDS = 6


class _Manager(CrmRound, LrmRounds):
    """Runs the rounds until the cluster settles after each event, then rebalances."""

    def one_round(self) -> None:
        """One manager round, then one round of every LRM (the simulator's loop)."""
        self.event_rounds += 1
        self.changed = False
        for daemon, round_of in (("crm", self.crm_round), ("lrm", self.lrm_round)):
            if self.skip[daemon]:
                self.skip[daemon] -= 1
                self.changed = True
            else:
                round_of()
        self.hardware_step()

    def settle(self) -> bool:
        """Rounds until nothing changes: True; False when the next event comes first
        (its commands then enter the round in which they arrive, as the manager reads
        them, and what this event started goes on in the next one's rounds)."""
        for _ in range(MAX_STEPS):
            if self.next_event_due():
                return False
            self.one_round()
            if not self.changed:
                return True
        return True

    def next_event_due(self) -> bool:
        return self.next_after is not None and self.event_rounds >= self.next_after

    def finish_pending_fences(self) -> None:
        """Rounds of this event during which a fence from before is still waiting for
        its node's agent lock; the round after the lock expired acknowledges it, after
        the service walk of that round (so an evacuation in it comes first)."""
        while self.fence_pending:
            self.one_round()
            for node in sorted(self.fence_pending):
                self.fence_pending[node] -= 1
                if self.fence_pending[node] <= 0:
                    del self.fence_pending[node]
                    self.lock[node] = False

    def run_event(self, event: Event, next_after: int | None = None,
                  next_while_moving: bool = False) -> EventResult:
        """Apply ``event``, run until settled; ``next_after``: rounds until the next event
        (None: it waits until this one has settled), so a fence not yet acknowledged by
        then is carried into it; ``next_while_moving``: the next event comes while the
        migrations started in this one still run."""
        start = len(self.decisions)
        self.kept_away = set()
        self.event_rounds = 0
        self.next_after = next_after
        self.motions_outlast_event = next_while_moving
        # Motions of the event before that were still running when this one came: they
        # finish once this event's own decisions are made.
        carried = set(self.unfinished_motions)
        for command in event.commands:
            self.apply(command)
        self.finish_pending_fences()
        defer = next_after is not None and next_after < FENCE_ACK_ROUNDS
        for _ in range(MAX_STEPS):
            settled = self.settle()
            # The fence delay passes: lost nodes are fenced (their watchdog fired).
            lost = {n for n in self.power if not self.member(n)} - self.delayed
            # Without quorum, a node whose LRM holds its lock is reset by its watchdog.
            orphaned = set() if self.quorate() else {
                n for n in self.power if self.power[n] and self.lock.get(n)}
            if not lost and not orphaned:
                if not settled:
                    break
                if carried & self.unfinished_motions:
                    self.unfinished_motions -= carried
                    continue
                if self.rebalance():
                    continue
                break
            self.delayed |= lost
            for node in sorted(lost | orphaned):
                if defer and node in lost and node not in orphaned and next_after is not None:
                    # The next event comes before the lost node's agent lock expires: its
                    # resources wait in 'fence' into that event.
                    self.fence_pending[node] = FENCE_ACK_ROUNDS - next_after
                else:
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
        if self.next_after is not None and self.rebalance_round() >= self.next_after:
            # The imbalance has to last the hold time; the next event comes first, and the
            # manager looks again once it has settled after that one.
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

    def rebalance_round(self) -> int:
        """The round of this event in which the manager would queue the move: the hold
        time after the round whose walk settled the cluster (the last round changed
        nothing), since ``load_balance`` counts the rounds before each walk."""
        settled_in = max(self.event_rounds - 2, 0)
        return settled_in + self.cluster.rebalance_hold

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
                     f"settled after each event and the imbalance has lasted "
                     f"{cluster.rebalance_hold} rounds (the hold)")
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


#: Rounds until the next event in the alternatives of :func:`timing_dependences`: a
#: simulator step's gap (the fence is still waiting), or one round (within the hold).
_DURING_FENCE = 5
_DURING_HOLD = 1


def _run(cluster: Cluster, events: Sequence[Event],
         storage: StorageFilter | None) -> tuple[_Manager, list[EventResult]]:
    manager = _Manager(cluster, storage)
    results = [manager.run_event(event, following.after_rounds if following else None,
                                 following.while_moving if following else False)
               for event, following in zip(events, [*events[1:], None], strict=True)]
    return manager, results


def timing_dependences(cluster: Cluster, events: Sequence[Event],
                       results: Sequence[EventResult],
                       storage: StorageFilter | None) -> list[TimingDependence]:
    """For an admin's events (no known gap), the end placements that change when the next
    event comes while work of the one before is pending (:func:`pending_work`)."""
    found = []
    final = results[-1].placement
    for index, (event, result) in enumerate(zip(events[:-1], results[:-1], strict=True)):
        following = events[index + 1]
        if following.after_rounds is not None:
            continue
        told: list[tuple[tuple[str, ...], dict[str, dict[str, str]]]] = []
        for work in pending_work(event, result.decisions, following):
            alternative = list(events)
            alternative[index + 1] = work.next_event
            _, other = _run(cluster, alternative, storage)
            other_final = other[-1].placement
            changed = tuple(sid for sid in sorted(set(final) | set(other_final))
                            if final.get(sid) != other_final.get(sid))
            outcomes = {"after": {sid: final[sid][1] for sid in changed if sid in final},
                        "during": {sid: other_final[sid][1] for sid in changed
                                   if sid in other_final}}
            if changed and (changed, outcomes) not in told:
                # The same outcomes from two kinds of pending work: the first one says it.
                told.append((changed, outcomes))
                found.append(TimingDependence(
                    event.label, following.label, work.kind, work.told, changed,
                    outcomes, work.moving))
    return found


#: Decisions that start a running resource's migration or relocation.
MOTION_KINDS = frozenset({"migrate", "relocate", "manual-migrate", "manual-relocate"})


@dataclass(frozen=True)
class PendingWork:
    """Work an event may leave in progress when an admin's next event comes."""

    #: As :attr:`TimingDependence.kind`.
    kind: str
    told: str
    #: The next event, coming while the work is still in progress.
    next_event: Event
    #: kind "migration": the resources still moving.
    moving: tuple[str, ...] = ()


def pending_work(event: Event, decisions: Sequence[Decision],
                 following: Event) -> list[PendingWork]:
    """What an event's decisions may leave in progress when ``following`` comes."""
    kinds = {d.kind for d in decisions}
    found = []
    if kinds & {"recover", "recover-failed"}:
        found.append(PendingWork("fence", "a fence not yet acknowledged",
                                 replace(following, after_rounds=_DURING_FENCE)))
    elif "auto-rebalance" in kinds:
        found.append(PendingWork("hold", "the auto-rebalance hold",
                                 replace(following, after_rounds=_DURING_HOLD)))
    motions = {d.sid: (d.source, d.target) for d in decisions if d.kind in MOTION_KINDS}
    if motions:
        told = ", ".join(f"{sid} ({source} -> {target})"
                         for sid, (source, target) in sorted(motions.items()))
        found.append(PendingWork("migration", f"the migration of {told}",
                                 replace(following, while_moving=True), tuple(sorted(motions))))
    # An admin's commands seconds apart reach the manager in one round: it reads them
    # together and carries out neither before the other is read. Last: the kinds above
    # name what is pending more precisely when they give the same outcomes.
    found.append(PendingWork("same-round", f"'{event.label}'",
                             replace(following, after_rounds=0)))
    return found


def predict(cluster: Cluster, events: Sequence[Event],
            storage: StorageFilter | None = None) -> Prediction:
    """What the manager decides after each event, in order (a pure function of its inputs)."""
    if not events:
        events = [Event("(no event)", ())]
    manager, results = _run(cluster, events, storage)
    rules = manager.first_rules or build_rules(cluster.rules, cluster.rule_order,
                                               sorted(cluster.nodes))
    options = {"rebalance_on_start": cluster.rebalance_on_start,
               "auto_rebalance": cluster.auto_rebalance}
    return Prediction(rules, tuple(results), tuple(warnings_for(cluster)),
                      cluster.crs if manager.static or cluster.crs != "static" else "basic",
                      options, tuple(timing_dependences(cluster, events, results, storage)))


def node_facts(names: Iterable[str], down: Callable[[str], bool] = lambda _: False) \
        -> dict[str, NodeFacts]:
    return {n: NodeFacts(n, power=not down(n), network=not down(n)) for n in names}
