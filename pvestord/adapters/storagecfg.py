"""The syntax of Proxmox's ``storage.cfg``: sections and their options, as written.

The file is parsed the way ``PVE::SectionConfig::parse_config`` parses it, so
pvestord sees the storages Proxmox sees:

- a section starts with a header line ``type: id`` (``^(\\S+):\\s*(\\S+)\\s*$``;
  the type is lower-cased, the id must be a valid storage id);
- option lines start with whitespace (Proxmox writes a tab): ``key value``, or
  a bare ``key`` (a boolean set to 1);
- an empty line ends the section; a line that holds only blanks does *not*
  (Proxmox treats it as a malformed option line);
- a line whose first non-blank character is ``#`` is skipped everywhere, even
  inside a section, and does not end it;
- anything else is ignored with a warning. Proxmox warns and carries on in
  the same places; so do we, rather than refusing a file Proxmox itself runs
  with.

What the options mean is :mod:`pvestord.adapters.config`'s part; this module
only finds them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from pvestord.policy.proxmox import is_storage_id

_HEADER = re.compile(r"(\S+):\s*(\S+)\s*")
_OPTION = re.compile(r"\s+(\S+)(?:\s+(.*\S))?\s*")


@dataclass(frozen=True)
class Section:
    """One section of the file, any type, options as written (first value wins)."""

    type: str
    id: str
    options: Mapping[str, str | None]
    line: int
    #: Line number of each option, for error messages.
    option_lines: Mapping[str, int]



def parse_sections(text: str, source: str) -> tuple[list[Section], list[str]]:
    """Every valid section of ``text``, and a warning for each line or section skipped."""
    sections: list[Section] = []
    warnings: list[str] = []
    seen: dict[str, int] = {}
    lines = text.split("\n")
    index = 0

    def next_line() -> tuple[int, str] | None:
        nonlocal index
        while index < len(lines):
            index += 1
            line = lines[index - 1]
            if not line.lstrip().startswith("#"):
                return index, line
        return None

    while (item := next_line()) is not None:
        lineno, line = item
        if line == "":
            continue
        header = _HEADER.fullmatch(line)
        if header is None:
            warnings.append(f"{source} line {lineno}: ignored line outside a section: {line!r}")
            continue
        type_, sid = header.group(1).lower(), header.group(2)
        skip = None
        if not is_storage_id(sid):
            skip = f"storage ID '{sid}' contains illegal characters"
        elif sid in seen:
            skip = f"duplicate storage ID '{sid}' (first on line {seen[sid]})"
        options: dict[str, str | None] = {}
        option_lines: dict[str, int] = {}
        while (item := next_line()) is not None and item[1] != "":
            optno, optline = item
            if skip is not None:
                continue
            option = _OPTION.fullmatch(optline)
            if option is None:
                warnings.append(f"{source} line {optno}: storage '{sid}': ignored line"
                                f" {optline!r}")
                continue
            key, value = option.group(1), option.group(2)
            if key in options:
                warnings.append(f"{source} line {optno}: storage '{sid}': duplicate option"
                                f" '{key}' ignored (first on line {option_lines[key]})")
                continue
            options[key] = value
            option_lines[key] = optno
        if skip is not None:
            warnings.append(f"{source} line {lineno}: section skipped: {skip}")
            continue
        seen[sid] = lineno
        sections.append(Section(type_, sid, MappingProxyType(options), lineno,
                                MappingProxyType(option_lines)))
    return sections, warnings
