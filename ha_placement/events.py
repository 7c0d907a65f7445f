"""Events: the command line's ``maintenance=node3``, and a simulator ``cmdlist`` step."""

from __future__ import annotations

import re
from collections.abc import Sequence

from ha_placement.errors import HaPlacementError
from ha_placement.model import Command, Event
from ha_placement.rules import normalize_sid

NODE_EVENTS = ("maintenance", "end-maintenance", "fail", "return", "shutdown", "reboot")
SERVICE_EVENTS = ("start", "stop")
MOTION_EVENTS = ("migrate", "relocate")

EVENT_HELP = (
    "maintenance=NODE, end-maintenance=NODE, fail=NODE (network and power lost: fenced, "
    "then its resources recovered), return=NODE (back online), shutdown=NODE, reboot=NODE "
    "(as datacenter.cfg's shutdown_policy says), start=SID, stop=SID, migrate=SID@NODE, "
    "relocate=SID@NODE"
)


class EventError(HaPlacementError):
    """An event the command line cannot read."""


class Unsupported(HaPlacementError):
    """A simulator command outside the model; ``category`` says which kind."""

    def __init__(self, category: str, command: str) -> None:
        super().__init__(f"{category}: {command}")
        self.category = category
        self.command = command


def parse_event(text: str) -> Event:
    """One command-line event, e.g. ``maintenance=node3`` or ``migrate=vm:101@node2``."""
    verb, sep, value = text.partition("=")
    verb = verb.strip().lower()
    value = value.strip()
    if not sep or not value:
        raise EventError(f"event {text!r}: expected VERB=VALUE, one of {EVENT_HELP}")
    if verb in NODE_EVENTS:
        return Event(text, (Command(verb, value),))
    if verb in SERVICE_EVENTS:
        sid = normalize_sid(value)
        if sid is None:
            raise EventError(f"event {text!r}: {value!r} is not a resource id like vm:100")
        return Event(text, (Command(verb, sid),))
    if verb in MOTION_EVENTS:
        who, at, node = value.partition("@")
        sid = normalize_sid(who)
        if sid is None or not at or not node:
            raise EventError(f"event {text!r}: expected {verb}=SID@NODE")
        return Event(text, (Command(verb, sid, node),))
    raise EventError(f"event {text!r}: unknown event {verb!r}; events are {EVENT_HELP}")


_SIM_UNSUPPORTED = {
    "disarm-ha": "disarm", "arm-ha": "disarm", "lock": "locks", "unlock": "locks",
    "cfs": "cfs failure",
    "pve-manager-version": "version upgrade (group migration)",
    "set-dynamic-stats": "changing guest stats",
    "manual-migrate": "migration outside HA",
}


def sim_command(text: str) -> Command:
    """One pve-ha-manager simulator command (``Sim/Hardware.pm``) as a model command."""
    words = text.split()
    if not words:
        raise Unsupported("empty command", text)
    head = words[0]
    if head in ("power", "network") and len(words) == 3 and words[2] in ("on", "off"):
        return Command(f"{head}-{words[2]}", words[1])
    if head in ("reboot", "shutdown") and len(words) == 2:
        return Command(head, words[1])
    if head == "delay":
        return Command("delay")
    if head == "restart-lrm" and len(words) == 2:
        return Command("restart-lrm", words[1])
    if head == "skip-round" and len(words) in (2, 3) and words[1] in ("crm", "lrm") \
            and (len(words) == 2 or words[2].isdigit()):
        return Command(f"skip-{words[1]}", "", words[2] if len(words) == 3 else "1")
    if head == "crm" and len(words) >= 3:
        action = words[2]
        if action == "enable-node-maintenance" and len(words) == 3:
            return Command("maintenance", words[1])
        if action == "disable-node-maintenance" and len(words) == 3:
            return Command("end-maintenance", words[1])
        raise Unsupported(_SIM_UNSUPPORTED.get(action, "CRM start/stop"), text)
    if head == "service" and len(words) >= 3:
        sid, action = words[1], words[2]
        if action in ("started", "enabled") and len(words) == 3:
            return Command("start", sid)
        if action in ("stopped", "disabled", "ignored") and len(words) == 3:
            return Command({"stopped": "stop", "disabled": "disable",
                            "ignored": "ignore"}[action], sid)
        if action in ("migrate", "relocate") and len(words) == 4:
            return Command(action, sid, words[3])
        if action == "add" and 4 <= len(words) <= 6:
            return Command("add", sid, " ".join(words[3:]))
        if action == "delete" and len(words) == 3:
            return Command("delete", sid)
        if action == "set-static-stats" and len(words) in (5, 7) \
                and {words[3], *words[5:6]} <= {"maxcpu", "maxmem"}:
            return Command("set-size", sid, _static_stats(words[3:]))
        if action == "stop" and len(words) == 4:
            return Command("stop-now", sid, words[3])
        raise Unsupported(_SIM_UNSUPPORTED.get(action, "other service command"), text)
    raise Unsupported(_SIM_UNSUPPORTED.get(head, "other simulator command"), text)


def _static_stats(pairs: Sequence[str]) -> str:
    """``maxcpu 8.0 maxmem 8192`` (MiB) as ``maxcpu=8.0 maxmem=8589934592`` (bytes)."""
    out = []
    for key, value in zip(pairs[::2], pairs[1::2], strict=True):
        try:
            number = float(value)
        except ValueError as err:
            raise Unsupported("changing guest stats", " ".join(pairs)) from err
        out.append(f"{key}={number * 1024**2 if key == 'maxmem' else number}")
    return " ".join(out)


#: The simulator applies a ``cmdlist`` step every 5 loop iterations of 20 s.
SIM_ROUNDS_PER_STEP = 5
SIM_ROUND_SECONDS = 20
#: The simulator's watchdog timeout (Sim/Hardware.pm). A CRM or LRM updates its watchdog
#: only in the rounds it runs, and every loop checks every node's watchdog, also in the
#: skipped rounds: after N skipped rounds the last update is 20 * N s (and the second the
#: round's iterations add) old, so from 3 skipped rounds on the master's (crm) or the
#: active LRMs' (lrm) watchdog fires and powers their node off.
SIM_WATCHDOG_SECONDS = 60
MAX_SKIPPED_ROUNDS = SIM_WATCHDOG_SECONDS // SIM_ROUND_SECONDS - 1


def _check_skips(step: Sequence[str], commands: Sequence[Command]) -> None:
    """Refuse a step whose skipped rounds outlast the watchdog: what follows (a node
    powered off by its watchdog, another node taking the manager lock) is not modelled.
    Skips of one step add up (TestHardware.pm adds them); the next step comes only after
    5 rounds, when at most 2 skipped ones have long run out."""
    for daemon in ("crm", "lrm"):
        rounds = sum(int(c.arg) for c in commands if c.verb == f"skip-{daemon}")
        if rounds > MAX_SKIPPED_ROUNDS:
            raise Unsupported(
                f"{rounds} skipped {daemon} rounds: the watchdog fires after "
                f"{SIM_WATCHDOG_SECONDS} s", "; ".join(step))


def sim_events(steps: Sequence[Sequence[str]]) -> list[Event]:
    """A ``cmdlist``: every step (its commands together) is one event, with the rounds
    since the step before (``delay N`` holds the next step back by at least N s)."""
    events = []
    gap: int | None = None
    for step in steps:
        commands = tuple(sim_command(c) for c in step)
        _check_skips(step, commands)
        events.append(Event("; ".join(step) if step else "(wait)", commands, gap))
        step_seconds = SIM_ROUNDS_PER_STEP * SIM_ROUND_SECONDS
        delay = max((int(c.split()[1]) for c in step
                     if re.match(r"^delay\s+\d+\s*$", c)), default=0)
        gap = SIM_ROUNDS_PER_STEP * max(1, -(-delay // step_seconds))
    return events


def is_fa(sid: str) -> bool:
    return bool(re.match(r"^fa:", sid))
