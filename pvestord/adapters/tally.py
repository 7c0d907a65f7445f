"""What this process asked of the outside world, counted.

An idle node must cost its SAN and its cluster almost nothing: no LVM
process per minute, a QMP session or two per VM, a few writes to pmxcfs.
Each adapter counts here where it starts a program, opens a QMP session or
replaces a cluster file; the daemon publishes the totals (``pvestord
status``, the metrics) and the fleet benchmark reads them over its idle
window. One tally per process: the question is what this process did,
whichever of its parts did it.
"""

from __future__ import annotations

from collections import Counter

#: Programs started, by name (``lvm``, ``qemu-img``, ...).
COMMANDS: Counter[str] = Counter()
#: Events that are not programs: ``qmp_session``, ``cluster_write``.
EVENTS: Counter[str] = Counter()


def started(program: str) -> None:
    COMMANDS[program.rsplit("/", 1)[-1]] += 1


def happened(event: str) -> None:
    EVENTS[event] += 1


def snapshot() -> dict[str, dict[str, int]]:
    """The totals so far, as JSON."""
    return {"commands": dict(sorted(COMMANDS.items())), "events": dict(sorted(EVENTS.items()))}
