"""Failures injected through a resource's id: the simulator's ``fa:`` resources.

pve-ha-manager's simulator has a resource type ``fa`` whose id digits say how
it misbehaves (``Sim/Resources/VirtFail.pm``): after a free first digit, how
many start tries fail, how many migration tries fail, whether a stop fails,
(what ``exists`` answers, which placement never asks), and to which node the
start and migration failures are limited (0: every node). The try counters are
one per resource for the whole simulated cluster, reset by a success. Real
guests never fail this way; the type exists so that the manager's restart and
relocation policy (``max_restart``, ``max_relocate``) can be checked against
the simulator's logs.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass


@dataclass(frozen=True)
class InjectedFailures:
    #: Start tries that fail before one succeeds.
    start: int
    #: Migration tries that fail before one succeeds.
    migrate: int
    #: A stop of the running resource fails.
    stop_fails: bool
    #: The node the start and migration failures happen on; None: every node.
    only_on: str | None


def injected_failures(sid: str) -> InjectedFailures | None:
    """The failures an ``fa:`` resource id asks for; None for any other resource."""
    kind, _, name = sid.partition(":")
    if kind != "fa":
        return None
    # The id's leading digits: a free one, then up to five that say how it
    # fails; an id with fewer than two of those fails in no way.
    leading = list(itertools.takewhile(str.isdecimal, name))
    digits: list[int | None] = [int(d) for d in leading[1:6]] if len(leading) >= 3 else []
    start, migrate, stop, _exists, limit = (digits + [None] * 5)[:5]
    return InjectedFailures(start or 0, migrate or 0, bool(stop),
                            f"node{limit}" if limit else None)


@dataclass
class FailureCounters:
    """The simulator's try counters: per resource, shared by every node."""

    start: dict[str, int]
    migrate: dict[str, int]

    def try_start(self, sid: str, failures: InjectedFailures, node: str) -> bool:
        """One start try of ``sid`` on ``node``; True when it succeeds."""
        return self._try(self.start, sid, failures.start, failures.only_on, node)

    def try_migrate(self, sid: str, failures: InjectedFailures, node: str) -> bool:
        """One migration try of ``sid`` away from ``node``; True when it succeeds."""
        return self._try(self.migrate, sid, failures.migrate, failures.only_on, node)

    @staticmethod
    def _try(counter: dict[str, int], sid: str, failing: int, only_on: str | None,
             node: str) -> bool:
        if only_on is None or only_on == node:
            counter[sid] = counter.get(sid, 0) + 1
            if failing >= counter[sid]:
                return False
        counter[sid] = 0
        return True
