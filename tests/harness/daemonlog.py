"""Reading pvestord's stderr log (``--no-journal``): the demo, node tests and bench.

A line is ``<asctime> pvestord <LEVEL> <logger>: <message> [KEY=value ...]``
(pvestord.service): the time has milliseconds, and the structured journal
fields follow the message in brackets.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from dataclasses import dataclass

#: An extension as pvestord words it, for the demo's display only: tests and
#: bench read the fields (:func:`extensions`), which rewording cannot break.
EXTENDED = re.compile(r"LV (\S+) extended (\S+ \S+) -> (\S+ \S+) in (\d+) ms")
_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) (\S+) (\w+) (\S+): (.*?)"
                   r"(?: \[((?:[A-Z_]+=\S*)(?: [A-Z_]+=\S*)*)\])?$")


@dataclass(frozen=True)
class LogLine:
    #: Unix time the record was made (the asctime, local time, to the millisecond).
    time: float
    level: str
    logger: str
    message: str
    fields: dict[str, str]


def parse_line(line: str) -> LogLine | None:
    """One daemon log line; None for anything else (tracebacks, QEMU noise)."""
    m = _LINE.match(line)
    if m is None:
        return None
    seconds = time.mktime(time.strptime(m.group(1), "%Y-%m-%d %H:%M:%S"))
    fields = dict(kv.split("=", 1) for kv in m.group(7).split(" ")) if m.group(7) else {}
    return LogLine(seconds + int(m.group(2)) / 1000, m.group(4), m.group(5), m.group(6), fields)


def parse(text: str) -> Iterator[LogLine]:
    for raw in text.splitlines():
        line = parse_line(raw)
        if line is not None:
            yield line


def records(text: str, level: str | None = None, **fields: str) -> list[LogLine]:
    """The lines of ``text`` at ``level`` (any when None) carrying every one of
    ``fields`` with that value (``VMID="101"``)."""
    return [line for line in parse(text) if (level is None or line.level == level)
            and all(line.fields.get(k) == v for k, v in fields.items())]


# pvestord logs no event name, so a record is known by the fields only it carries.
#: An LV extension: its sizes and how long it took (a migration's refresh has
#: the sizes but no duration).
_EXTENSION_FIELDS = ("LV", "OLD_SIZE", "NEW_SIZE", "DURATION_MS")
#: A write threshold armed on a block node.
_ARMED_FIELDS = ("VMID", "BLOCK_NODE", "THRESHOLD")


def is_extension(line: LogLine) -> bool:
    return all(k in line.fields for k in _EXTENSION_FIELDS)


def extensions(text: str, **fields: str) -> list[LogLine]:
    """The extensions pvestord logged in ``text`` with ``fields`` (``VMID="101"``)."""
    return [line for line in records(text, **fields) if is_extension(line)]


def is_armed(line: LogLine, vmid: int, node: str) -> bool:
    return (all(k in line.fields for k in _ARMED_FIELDS)
            and line.fields["VMID"] == str(vmid) and line.fields["BLOCK_NODE"] == node)
