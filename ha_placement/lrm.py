"""The nodes and their LRMs: the simulator's commands, and the LRM rounds.

The hardware (power, network), the LRMs' modes (active, maintenance,
restart, shutdown), their agent locks, and what they do with the CRM's
requests: carry out migrations and stops, try starts (with injected
failures), and let a node finish its shutdown.
"""

from __future__ import annotations

from dataclasses import replace

from ha_placement.failures import InjectedFailures, injected_failures
from ha_placement.model import Command, ServiceConfig
from ha_placement.scores import GuestSize
from ha_placement.world import MOTION_STATES, World


class LrmRounds(World):
    """The simulator's commands on nodes and services, and the LRMs' rounds."""

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
        # An LRM takes its agent lock and then works in the same round; without the lock
        # it does nothing. So a stop and a start on two nodes are done, and their results
        # read by the manager, in the same rounds.
        for node in sorted(self.power):
            if self.power[node] and self.member(node) and self.quorate() \
                    and not self.lock.get(node) and not self._fence_requested(node):
                self.lock[node] = True
                self.changed = True
        for sid in sorted(self.ss):
            sd = self.ss[sid]
            if sd.lrm_done or not self.power.get(sd.node) or not self.member(sd.node) \
                    or not self.lock.get(sd.node):
                continue
            failures = injected_failures(sid)
            if sid in self.unfinished_motions:
                # Still copying the guest to its target (an alternative timing).
                continue
            if sd.state in MOTION_STATES and sd.target is not None \
                    and not self.member(sd.target):
                # The target left the cluster: the LRM's migration fails, and the manager
                # keeps the resource where it is (next_state_migrate_relocate). That is the
                # real LRM (PVEVM/PVECT migrate: the guest's config is still on its source);
                # the simulator's migrate would move it to the lost node, but only a skipped
                # LRM round could let the target go first, and a simulator step that skips
                # that long is refused (events.MAX_SKIPPED_ROUNDS): so this branch is only
                # reached by an admin's event coming while a migration runs.
                sd.lrm_done = sd.lrm_error = True
                self.changed = True
            elif sd.state in ("migrate", "relocate", "request_start_balance"):
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
            elif sd.state == "started" and failures is not None and sd.start_result is None:
                self.lrm_start(sid, failures)
        for node in sorted(self.power):
            if not self.power[node]:
                continue
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
