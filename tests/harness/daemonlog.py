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

#: An extension as pvestord logs it; groups: LV path, old size, new size, ms.
EXTENDED = re.compile(r"LV (\S+) extended (\S+ \S+) -> (\S+ \S+) in (\d+) ms")
ARMED = re.compile(r"VM (\d+) (\S+): threshold armed at ")
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


def is_extension(line: LogLine) -> bool:
    return EXTENDED.search(line.message) is not None


def is_armed(line: LogLine, vmid: int, node: str) -> bool:
    m = ARMED.match(line.message)
    return m is not None and int(m.group(1)) == vmid and m.group(2) == node
