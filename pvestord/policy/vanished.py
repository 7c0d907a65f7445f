"""``pvestord:`` sections that vanished from storage.cfg, and how to put them back.

Proxmox parses storage.cfg without ``allow_unknown`` and writes back only the
sections whose type it knows (``PVE::SectionConfig``): one storage edit made
on a node that lacks pvestord's plugin (a rolling install, a node re-installed
from scratch) rewrites the file without any ``pvestord:`` section, for the
whole cluster. The storage and its options are gone; its LVs and running
guests are not.

So every node that runs pvestord keeps the last text it saw of each
``pvestord:`` section, verbatim, with when it saw it (:class:`Kept`).
:func:`observe` compares that with each new reading of the file: a kept
section whose id no longer appears, under any type, has *vanished*. An id
that is still there under another type is not: the admin changed it on
purpose on a node that knows both types, and the file says what they want.

Nothing here reads or writes a file; the texts come from
:mod:`pvestord.adapters.storagecfg`'s line numbers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Kept:
    """One ``pvestord:`` section as last seen in storage.cfg."""

    storeid: str
    #: The section verbatim: header, option lines, ``\\n``-terminated, no blank line.
    text: str
    #: Unix time of the last reading of storage.cfg that had it.
    seen: float
    #: Unix time of the first reading that lacked it; None while it is there.
    vanished: float | None = None


@dataclass(frozen=True)
class Observation:
    """What one reading of storage.cfg changed in the kept sections."""

    kept: dict[str, Kept]
    #: Ids that vanished with this reading (not those already gone before).
    newly_vanished: tuple[str, ...]
    #: Ids that were gone and are back under their type.
    back: tuple[str, ...]

    @property
    def vanished(self) -> dict[str, Kept]:
        """Every kept section that is gone, by id."""
        return {sid: k for sid, k in self.kept.items() if k.vanished is not None}


def section_text(lines: Sequence[str], header_line: int) -> str:
    """The section whose header is line ``header_line`` (1-based) of ``lines``,
    as written: up to the first empty line, as Proxmox's parser ends it
    (comment lines inside it stay: they do not end it)."""
    end = header_line
    while end < len(lines) and lines[end] != "":
        end += 1
    return "".join(line + "\n" for line in lines[header_line - 1:end])


def observe(kept: Mapping[str, Kept], current: Mapping[str, str], ids: frozenset[str],
            now: float) -> Observation:
    """The kept sections after a reading of storage.cfg.

    ``current`` is the text of each ``pvestord:`` section in it, ``ids``
    every section id in it, any type.
    """
    result: dict[str, Kept] = {}
    newly: list[str] = []
    back: list[str] = []
    for sid, text in current.items():
        if sid in kept and kept[sid].vanished is not None:
            back.append(sid)
        result[sid] = Kept(sid, text, now)
    for sid, old in kept.items():
        if sid in result or sid in ids:
            continue  # there, as ours or (deliberately) as another type
        if old.vanished is None:
            newly.append(sid)
            old = replace(old, vanished=now)
        result[sid] = old
    return Observation(dict(sorted(result.items())), tuple(sorted(newly)), tuple(sorted(back)))


def with_sections(text: str, sections: Sequence[str]) -> str:
    """``text`` with ``sections`` appended, each after a blank line as Proxmox
    writes them: the file a restore writes, and the one the daemon reads
    while sections are gone."""
    out = text
    for section in sections:
        if out and not out.endswith("\n"):
            out += "\n"
        if out and not out.endswith("\n\n"):
            out += "\n"
        out += section
    return out


def restore_command(storeid: str) -> str:
    return f"pvestord storage restore {storeid} --apply"


def vanished_message(kept: Kept, source: str, when: str) -> str:
    """The journal's error for a section that vanished: what happened, what
    pvestord does meanwhile, and the exact text to put back, on one line
    (``when``: :attr:`Kept.seen` as the admin reads times)."""
    return (f"storage '{kept.storeid}' vanished from {source} (last seen {when}): most likely a"
            " storage edit on a node without pvestord's plugin, which drops every 'pvestord:'"
            " section cluster-wide; pvestord keeps growing the LVs of its running VMs with the"
            " last settings, but Proxmox cannot start, create or migrate its disks until the"
            f" section is back: run '{restore_command(kept.storeid)}' on this node, which"
            f" appends exactly {kept.text!r} under the storage.cfg lock (see 'Rolling install'"
            " in operations.md)")
