"""Proxmox section-config text (``rules.cfg``, ``groups.cfg``, ``resources.cfg``), parsed."""

from __future__ import annotations

import re
from dataclasses import dataclass

_HEADER = re.compile(r"^(\S+):\s*(\S+)\s*$")
_OPTION = re.compile(r"^\s+(\S+)(\s+(.*\S))?\s*$")


@dataclass(frozen=True)
class Section:
    kind: str
    ident: str
    #: (key, value) in file order; a key written alone (``disable``) has value None.
    options: tuple[tuple[str, str | None], ...]


def parse_sections(text: str) -> list[Section]:
    """Every ``kind: id`` section with its indented ``key value`` lines; comments skipped."""
    sections: list[Section] = []
    kind: str | None = None
    ident = ""
    options: list[tuple[str, str | None]] = []

    def close() -> None:
        if kind is not None:
            sections.append(Section(kind, ident, tuple(options)))

    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        header = _HEADER.match(line)
        if header and not line[0].isspace():
            close()
            kind, ident, options = header.group(1).lower(), header.group(2), []
            continue
        option = _OPTION.match(line)
        if option and kind is not None:
            options.append((option.group(1), option.group(3)))
    close()
    return sections
