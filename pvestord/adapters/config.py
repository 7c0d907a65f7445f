"""Proxmox's storage configuration as pvestord uses it: the LVM storages, thin or not.

The file's syntax is :mod:`pvestord.adapters.storagecfg`'s; the values of our
options are read by :mod:`pvestord.policy.storageoptions`. This module
assembles the two into :class:`StorageConfig`.

Every section is kept (:attr:`StorageConfig.sections`), whatever its type; only
``lvm:`` and ``pvestord:`` sections mean anything to us. A ``pvestord:`` storage
(the type of pvestord's Proxmox storage plugin, ``PVE::Storage::Custom::PvestordPlugin``,
an ``lvm`` storage that declares our options) is always *thin-enabled*. An
``lvm:`` storage with ``pvestord-chunksize`` (or its former name ``chunksize``)
still is, with a warning: Proxmox's own parser does not know the option and
drops it on its next write of the file. An option of ours written under its
former, unprefixed name is read as the prefixed one, with a warning (see
:mod:`pvestord.policy.storageoptions`).
Our options are validated and an invalid value is a :class:`StorageOptionError`
naming the file, line, storage, option and value; unknown options are kept as
they are (Proxmox adds options over time). Malformed lines and skipped
sections are kept in :attr:`StorageConfig.warnings`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from pvestord.adapters.storagecfg import Section, parse_sections
from pvestord.errors import ConfigError
from pvestord.policy import capacity, vglocks
from pvestord.policy.proxmox import is_vg_name
from pvestord.policy.storageoptions import (
    CHUNK_PERCENTAGE,
    CHUNKSIZE,
    PREFIX,
    boolean_option,
    sets_thin_option,
    thin_values,
)

#: The section type of pvestord's storage plugin (packaging/perl): an ``lvm``
#: storage whose thin options Proxmox itself parses, keeps and writes back.
PLUGIN_TYPE = "pvestord"
#: Section types whose storages are LVM volume groups.
_LVM_TYPES = frozenset({"lvm", PLUGIN_TYPE})



@dataclass(frozen=True)
class LvmStorage:
    """An ``lvm:`` storage, thin-enabled or not."""

    storeid: str
    vgname: str
    shared: bool
    disabled: bool
    #: The ``nodes`` option: the nodes the storage is restricted to; None = all.
    nodes: frozenset[str] | None
    #: Every option of the section, ours and others, as written.
    options: Mapping[str, str | None]
    thin: ThinStorage | None

    def available_on(self, node: str) -> bool:
        """Whether this storage applies to ``node`` (the ``nodes`` option)."""
        return self.nodes is None or node in self.nodes


@dataclass(frozen=True)
class ThinStorage:
    """A thin-enabled ``lvm:`` storage: what the policy needs from the config."""

    storeid: str
    vgname: str
    chunksize: int
    chunk_percentage: float
    initial_size: int
    shared: bool
    options: Mapping[str, str | None]
    #: thin-warn-free, thin-critical-free, max-overcommit, thin-reserve.
    guards: capacity.Guards = field(default_factory=capacity.Guards)


@dataclass(frozen=True)
class OptionProblem:
    """One invalid value of one of our options."""

    source: str
    line: int
    storeid: str
    option: str
    value: str | None
    reason: str

    def __str__(self) -> str:
        value = "(no value)" if self.value is None else self.value
        return (f"{self.source} line {self.line}: storage '{self.storeid}': "
                f"{self.option} = {value}: {self.reason}")


class StorageOptionError(ConfigError):
    """Options of ours with values we cannot use; every problem is listed."""

    def __init__(self, problems: list[OptionProblem]) -> None:
        self.problems = problems
        super().__init__("; ".join(str(p) for p in problems))


@dataclass(frozen=True)
class StorageConfig:
    """A parsed storage configuration."""

    source: str
    sections: tuple[Section, ...]
    #: Every usable ``lvm:`` storage by id, thin or not, in file order.
    lvm_storages: Mapping[str, LvmStorage]
    #: Malformed lines and skipped sections, as Proxmox would warn about them.
    warnings: tuple[str, ...] = ()

    @property
    def thin_storages(self) -> Mapping[str, ThinStorage]:
        """The thin-enabled ``lvm:`` storages by id."""
        return MappingProxyType({sid: s.thin for sid, s in self.lvm_storages.items()
                                 if s.thin is not None})

    def get(self, storeid: str) -> ThinStorage | None:
        """The thin storage ``storeid``; None when unknown or not thin-enabled."""
        storage = self.lvm_storages.get(storeid)
        return storage.thin if storage is not None else None

    def by_vg(self, vgname: str, node: str | None = None) -> ThinStorage | None:
        """The thin storage that owns volume group ``vgname``, or None (not thin).

        Proxmox allows several storages on one VG (typically the same local VG
        name on every node, each restricted with ``nodes``); with ``node``
        given, storages not available there are left out. A VG shared by a
        thin and a thick storage counts as thin: LVs the thick one created are
        already at their maximum, and the policy leaves those alone. A storage
        with ``disable 1`` still counts: Proxmox stops new users of it, but a
        VM started before keeps writing its disks, and must not pause for
        lack of room because an admin disabled the storage meanwhile.

        :raises ConfigError: several thin storages on this VG (for this node)
            disagree on chunk settings, so we cannot know which ones apply.
        """
        candidates = [s.thin for s in self.lvm_storages.values()
                      if s.thin is not None and s.vgname == vgname
                      and (node is None or s.available_on(node))]
        if not candidates:
            return None
        first = candidates[0]
        for other in candidates[1:]:
            if (other.chunksize, other.chunk_percentage) != (first.chunksize,
                                                             first.chunk_percentage):
                raise ConfigError(
                    f"{self.source}: storages '{first.storeid}' and '{other.storeid}' both"
                    f" use volume group '{vgname}' with different {CHUNKSIZE} or"
                    f" {CHUNK_PERCENTAGE}; make them agree or restrict them with 'nodes'")
        return first

    def vg_users(self, vgname: str) -> list[tuple[str, bool]]:
        """``(storeid, shared)`` of every enabled storage on volume group ``vgname``.

        Thin or thick ``lvm:`` and ``lvmthin:`` alike, whatever their
        ``nodes``: Proxmox locks ``storage-<storeid>`` around a metadata
        change, never the VG, so whoever changes the VG must hold all of
        them (a storage restricted to another node still writes a shared VG
        from there). ``disable 1`` storages are left out: Proxmox allocates
        nothing on them. Sorted by id, the order every holder takes them in.
        """
        return vglocks.vg_users(((s.type, s.id, s.options) for s in self.sections), vgname)


#: Storage types whose volumes live in an LVM VG named by ``vgname``: each
#: one's storage lock guards that VG's metadata (the rule is shared with the
#: Proxmox plugin, :mod:`pvestord.policy.vglocks`).
LVM_TYPES = vglocks.LVM_TYPES



def load_storage_config(path: Path) -> StorageConfig:
    """Read and parse the storage configuration at ``path``.

    :raises ConfigError: the file cannot be read, or one of our options is invalid.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"cannot read storage configuration {path}: {err}") from err
    return parse_storage_config(text, str(path))


def parse_storage_config(text: str, source: str) -> StorageConfig:
    """Parse ``storage.cfg`` syntax; ``source`` names the text in messages.

    :raises StorageOptionError: one or more of our options have invalid values.
    """
    sections, warnings = parse_sections(text, source)
    problems: list[OptionProblem] = []
    lvm: dict[str, LvmStorage] = {}
    for section in sections:
        if section.type not in _LVM_TYPES:
            continue
        storage = _lvm_storage(section, source, problems, warnings)
        if storage is not None:
            lvm[storage.storeid] = storage
    if problems:
        raise StorageOptionError(problems)
    return StorageConfig(source, tuple(sections), MappingProxyType(lvm), tuple(warnings))


def _lvm_storage(section: Section, source: str, problems: list[OptionProblem],
                 warnings: list[str]) -> LvmStorage | None:
    sid, opts = section.id, section.options

    def problem(option: str, reason: str) -> None:
        problems.append(OptionProblem(source, section.option_lines.get(option, section.line),
                                      sid, option, opts.get(option), reason))

    def former_name(former: str, current: str, current_also_set: bool) -> None:
        line = section.option_lines.get(former, section.line)
        if current_also_set:
            warnings.append(f"{source} line {line}: storage '{sid}': '{former}' ignored:"
                            f" '{current}' is set too (remove the '{former}' line)")
        else:
            warnings.append(f"{source} line {line}: storage '{sid}': '{former}' is"
                            f" deprecated, read as '{current}': rename it in storage.cfg")

    chunksize_set = CHUNKSIZE in opts or CHUNKSIZE.removeprefix(PREFIX) in opts
    thin_enabled = section.type == PLUGIN_TYPE or chunksize_set
    if section.type == "lvm" and chunksize_set:
        warnings.append(lvm_section_warning(source, section.line, sid))
    vgname = opts.get("vgname")
    if vgname is None or not is_vg_name(vgname):
        reason = ("missing (an lvm storage needs its volume group)" if vgname is None
                  else "not a valid volume group name")
        if thin_enabled:
            problem("vgname", reason)
        else:
            # Not ours to judge: Proxmox skips such a section, and so do we.
            warnings.append(f"{source} line {section.line}: storage '{sid}': vgname"
                            f" {reason}; section skipped")
        return None
    shared = boolean_option(opts, "shared", problem)
    disabled = boolean_option(opts, "disable", problem)
    values = thin_values(opts, problem, former_name if thin_enabled else None)
    if not thin_enabled and (present := sets_thin_option(opts)):
        warnings.append(f"{source} line {section.line}: storage '{sid}' sets"
                        f" {', '.join(present)} but no {CHUNKSIZE}: it is not thin-enabled")
    nodes_opt = opts.get("nodes")
    nodes = (frozenset(n for n in re.split(r"[\s,;]+", nodes_opt) if n)
             if nodes_opt is not None else None)
    thin = None
    if thin_enabled:
        thin = ThinStorage(sid, vgname, values.chunksize, values.chunk_percentage,
                           values.initial_size, shared, opts, values.guards)
    return LvmStorage(sid, vgname, shared, disabled, nodes, opts, thin)


def lvm_section_warning(source: str, line: int, storeid: str) -> str:
    """What to tell the admin of a thin ``lvm:`` section (see the module docstring)."""
    return (f"{source} line {line}: storage '{storeid}' is an 'lvm:' section with"
            f" {CHUNKSIZE}: Proxmox does not know pvestord's options there and drops them"
            " on its next edit of storage.cfg (the storage then turns thick); change the"
            f" section header to '{PLUGIN_TYPE}: {storeid}' (pvestord's storage plugin, see"
            " docs/proxmox.md)")


def thin_from_options(storeid: str, vgname: str, shared: bool,
                      options: Mapping[str, str | None], source: str) -> ThinStorage:
    """The thin settings of one storage from its options alone (as Proxmox hands
    them to the storage plugin), validated as in a file.

    :raises StorageOptionError: an option has a value we cannot use.
    """
    problems: list[OptionProblem] = []

    def problem(option: str, reason: str) -> None:
        problems.append(OptionProblem(source, 0, storeid, option, options.get(option), reason))

    # Not told about former names: the daemon, reading the same storage.cfg,
    # says so once per edit of the file, where a warning here would come with
    # every disk Proxmox creates.
    values = thin_values(options, problem)
    if problems:
        raise StorageOptionError(problems)
    return ThinStorage(storeid, vgname, values.chunksize, values.chunk_percentage,
                       values.initial_size, shared, MappingProxyType(dict(options)),
                       values.guards)
