"""``/proc/<pid>/stat``, read as the kernel writes it.

A process is known by its pid *and* its start time (field 22, in clock
ticks since boot): a pid alone may have been reused by another process.
"""

from __future__ import annotations


def fields_after_name(stat: str) -> list[str]:
    """The fields after the command name (field 2). The name is in
    parentheses and may itself hold spaces and parentheses, so the last
    ``)`` ends it. Of the list: [0] is the state (field 3), [2] the process
    group (field 5), [19] the start time (field 22)."""
    return stat.rpartition(")")[2].split()
