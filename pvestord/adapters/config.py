"""Storage configuration (Proxmox ``storage.cfg``) and daemon settings.

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
- anything else is ignored with a warning (kept in :attr:`StorageConfig.warnings`).
  Proxmox warns and carries on in the same places; so do we, rather than
  refusing a file Proxmox itself runs with.

Every section is kept (:attr:`StorageConfig.sections`), whatever its type; only
``lvm:`` and ``pvestord:`` sections mean anything to us. A ``pvestord:`` storage
(the type of pvestord's Proxmox storage plugin, ``PVE::Storage::Custom::PvestordPlugin``,
an ``lvm`` storage that declares our options) is always *thin-enabled*. An
``lvm:`` storage with ``chunksize`` still is, with a warning: Proxmox's own
parser does not know the option and drops it on its next write of the file.
Our options are validated and an invalid value is a :class:`StorageOptionError`
naming the file, line, storage, option and value; unknown options are kept as
they are (Proxmox adds options over time).
"""

from __future__ import annotations

import math
import re
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from pvestord import paths
from pvestord.adapters import locks, vghealth
from pvestord.adapters.command import KILL_WAIT
from pvestord.errors import ConfigError
from pvestord.policy import capacity
from pvestord.policy.sizes import GiB, MiB, format_size, parse_size

#: Defaults of our ``lvm:`` options (docs/design.md, "Storage configuration").
DEFAULT_CHUNKSIZE = 1 * GiB
DEFAULT_CHUNK_PERCENTAGE = 0.5
DEFAULT_INITIAL_SIZE = 2 * GiB
#: A smaller chunk would mean an extension per handful of writes; LVM's own
#: smallest useful extent is 1 MiB, so anything below is surely a typo (``1``
#: for ``1G``). Chunks need not be a multiple of the extent size: the policy
#: rounds every target up to whole extents (the extent size is only known at
#: run time, from the VG).
MIN_CHUNKSIZE = 1 * MiB

_HEADER = re.compile(r"(\S+):\s*(\S+)\s*")
_OPTION = re.compile(r"\s+(\S+)(?:\s+(.*\S))?\s*")
# PVE::JSONSchema::parse_storage_id and the pve-storage-vgname format.
_STOREID = re.compile(r"[a-z][a-z0-9\-_.]*[a-z0-9]", re.IGNORECASE)
_VGNAME = re.compile(r"[a-zA-Z0-9.+_][a-zA-Z0-9.+_\-]*")
# PVE::JSONSchema's number check; Python's float() would also take "nan", "1_0".
_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})

#: Reports ``(option, reason)`` for the section being read.
_Problem = Callable[[str, str], None]

#: The options this module interprets in an ``lvm:`` or ``pvestord:`` section.
THIN_OPTIONS = ("chunksize", "chunk-percentage", "initial-size", *capacity.OPTIONS)
#: The section type of pvestord's storage plugin (packaging/perl): an ``lvm``
#: storage whose thin options Proxmox itself parses, keeps and writes back.
PLUGIN_TYPE = "pvestord"
#: Section types whose storages are LVM volume groups.
_LVM_TYPES = frozenset({"lvm", PLUGIN_TYPE})


@dataclass(frozen=True)
class Section:
    """One section of the file, any type, options as written (first value wins)."""

    type: str
    id: str
    options: Mapping[str, str | None]
    line: int
    #: Line number of each option, for error messages.
    option_lines: Mapping[str, int]


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
        already at their maximum, and the policy leaves those alone.

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
                    f" use volume group '{vgname}' with different chunksize or"
                    " chunk-percentage; make them agree or restrict them with 'nodes'")
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
        users: dict[str, bool] = {}
        for section in self.sections:
            if section.type not in LVM_TYPES or section.options.get("vgname") != vgname:
                continue
            # An unreadable "disable" counts as enabled, an unreadable
            # "shared" as shared: one lock more, never one fewer.
            if _flag(section.options, "disable", unreadable=False):
                continue
            users[section.id] = _flag(section.options, "shared", unreadable=True)
        return sorted(users.items())


#: Storage types whose volumes live in an LVM VG named by ``vgname``.
LVM_TYPES = ("lvm", "lvmthin")


def _flag(options: Mapping[str, str | None], option: str, *, unreadable: bool) -> bool:
    """A boolean option as SectionConfig reads it; ``unreadable`` for a value
    that is no boolean (the safer reading for the caller)."""
    if option not in options:
        return False
    text = options[option]
    if text is None:
        return True
    if text.lower() in _TRUE:
        return True
    if text.lower() in _FALSE:
        return False
    return unreadable


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
    sections, warnings = _parse_sections(text, source)
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


def _parse_sections(text: str, source: str) -> tuple[list[Section], list[str]]:
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
        if not _STOREID.fullmatch(sid):
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


def _lvm_storage(section: Section, source: str, problems: list[OptionProblem],
                 warnings: list[str]) -> LvmStorage | None:
    sid, opts = section.id, section.options

    def problem(option: str, reason: str) -> None:
        problems.append(OptionProblem(source, section.option_lines.get(option, section.line),
                                      sid, option, opts.get(option), reason))

    thin_enabled = section.type == PLUGIN_TYPE or "chunksize" in opts
    if section.type == "lvm" and "chunksize" in opts:
        warnings.append(lvm_section_warning(source, section.line, sid))
    vgname = opts.get("vgname")
    if vgname is None or not _VGNAME.fullmatch(vgname):
        reason = ("missing (an lvm storage needs its volume group)" if vgname is None
                  else "not a valid volume group name")
        if thin_enabled:
            problem("vgname", reason)
        else:
            # Not ours to judge: Proxmox skips such a section, and so do we.
            warnings.append(f"{source} line {section.line}: storage '{sid}': vgname"
                            f" {reason}; section skipped")
        return None
    shared = _boolean(opts, "shared", problem)
    disabled = _boolean(opts, "disable", problem)
    chunksize = _size(opts, "chunksize", DEFAULT_CHUNKSIZE, MIN_CHUNKSIZE, problem)
    initial_size = _size(opts, "initial-size", DEFAULT_INITIAL_SIZE, 1, problem)
    percentage = _percentage(opts, problem)
    guards = capacity.parse_guards(opts, problem)
    if not thin_enabled and any(o in opts for o in THIN_OPTIONS):
        present = ", ".join(o for o in THIN_OPTIONS if o in opts)
        warnings.append(f"{source} line {section.line}: storage '{sid}' sets {present}"
                        " but no chunksize: it is not thin-enabled")
    nodes_opt = opts.get("nodes")
    nodes = (frozenset(n for n in re.split(r"[\s,;]+", nodes_opt) if n)
             if nodes_opt is not None else None)
    thin = None
    if thin_enabled:
        thin = ThinStorage(sid, vgname, chunksize, percentage, initial_size, shared, opts,
                           guards)
    return LvmStorage(sid, vgname, shared, disabled, nodes, opts, thin)


def lvm_section_warning(source: str, line: int, storeid: str) -> str:
    """What to tell the admin of a thin ``lvm:`` section (see the module docstring)."""
    return (f"{source} line {line}: storage '{storeid}' is an 'lvm:' section with chunksize:"
            " Proxmox does not know chunksize, chunk-percentage or initial-size there and"
            " drops them on its next edit of storage.cfg (the storage then turns thick);"
            f" change the section header to '{PLUGIN_TYPE}: {storeid}' (pvestord's storage"
            " plugin, see docs/proxmox.md) and keep the options as they are")


def thin_from_options(storeid: str, vgname: str, shared: bool,
                      options: Mapping[str, str | None], source: str) -> ThinStorage:
    """The thin settings of one storage from its options alone (as Proxmox hands
    them to the storage plugin), validated as in a file.

    :raises StorageOptionError: an option has a value we cannot use.
    """
    problems: list[OptionProblem] = []

    def problem(option: str, reason: str) -> None:
        problems.append(OptionProblem(source, 0, storeid, option, options.get(option), reason))

    chunksize = _size(options, "chunksize", DEFAULT_CHUNKSIZE, MIN_CHUNKSIZE, problem)
    initial_size = _size(options, "initial-size", DEFAULT_INITIAL_SIZE, 1, problem)
    percentage = _percentage(options, problem)
    guards = capacity.parse_guards(options, problem)
    if problems:
        raise StorageOptionError(problems)
    return ThinStorage(storeid, vgname, chunksize, percentage, initial_size, shared,
                       MappingProxyType(dict(options)), guards)


def _size(opts: Mapping[str, str | None], option: str, default: int, minimum: int,
          problem: _Problem) -> int:
    if option not in opts:
        return default
    text = opts[option]
    if text is None:
        problem(option, "needs a value")
        return default
    try:
        size = parse_size(text)
    except ValueError:
        problem(option, "not a size (a number with an optional K, M, G or T suffix,"
                " e.g. 1G or 512M)")
        return default
    if size < minimum:
        problem(option, f"must be at least {format_size(minimum)}")
        return default
    return size


def _percentage(opts: Mapping[str, str | None], problem: _Problem) -> float:
    option = "chunk-percentage"
    if option not in opts:
        return DEFAULT_CHUNK_PERCENTAGE
    text = opts[option]
    if text is None or not _NUMBER.fullmatch(text):
        problem(option, "not a number (the share of a chunk left free when the"
                " threshold fires, e.g. 0.5)")
        return DEFAULT_CHUNK_PERCENTAGE
    value = float(text)
    if not (math.isfinite(value) and 0 < value < 1):
        problem(option, "must be between 0 and 1 (both excluded)")
        return DEFAULT_CHUNK_PERCENTAGE
    return value


def _boolean(opts: Mapping[str, str | None], option: str, problem: _Problem) -> bool:
    if option not in opts:
        return False
    text = opts[option]
    if text is None:  # a bare key is a boolean set to 1, as in SectionConfig
        return True
    if text.lower() in _TRUE:
        return True
    if text.lower() in _FALSE:
        return False
    problem(option, "not a boolean (0 or 1)")
    return False


# ---------------------------------------------------------------------------
# Daemon settings


def _short_hostname() -> str:
    # Proxmox node names are the short host name (PVE::INotify::nodename).
    return socket.gethostname().split(".", 1)[0]


@dataclass(frozen=True)
class DaemonSettings:
    """Everything ``pvestord run`` can be told; the defaults are a Proxmox node's.

    The CLI maps flags onto these fields; nothing else reads the environment.
    """

    #: This node's name, as written in queue entries (``origin``) and matched
    #: against a storage's ``nodes`` option.
    node: str = field(default_factory=_short_hostname)
    #: The cluster extend queue (pmxcfs on Proxmox).
    queue: Path = paths.QUEUE
    #: Proxmox's storage configuration, or a file in the same syntax.
    storage_config: Path = paths.STORAGE_CFG
    #: Where ``<vmid>.pid`` (is the VM local and running?) and ``<vmid>.qmp``
    #: (its QMP socket) live; tests point it at their own directory.
    run_dir: Path = paths.QEMU_SERVER_RUN
    #: Where the queue and storage locks live. None: follow from where the
    #: queue lives (pmxcfs lock directories under ``/etc/pve``, else ``flock``
    #: files in ``/var/lock/pve-manager``).
    lock_dir: Path | None = None
    #: Seconds between reads of the queue for entries written by other nodes,
    #: which FUSE (pmxcfs) does not report through inotify. The original
    #: proposal polled every second; 2 s halves the idle cost, and local
    #: entries (the common case: the VM runs where its event arises) come
    #: through inotify at once.
    poll_interval: float = 2.0
    #: Seconds between full reconcile passes (every thin drive of every local
    #: VM: threshold armed, headroom, not paused on ENOSPC). Events are the
    #: fast path; this is what makes correctness independent of them.
    reconcile_interval: float = 30.0
    #: Budget of one LVM command (``lvs``, ``lvextend``). It runs under the
    #: storage lock, and a change starts only while the lock is guaranteed
    #: for this plus the wait after a kill (checked below against
    #: ``lock_lifetime``).
    lvm_timeout: float = 30.0
    #: Budget of one QMP session (connect, batch, disconnect). qemu-server
    #: shares the socket, so a connection may wait for its turn.
    qmp_timeout: float = 10.0
    #: Budget of one ``qemu-img info`` / ``measure`` (metadata only).
    qemu_img_timeout: float = 30.0
    #: One worker for every drive, as in the original proposal, instead of
    #: one per volume group (extensions in different VGs run concurrently).
    #: Kept as a real option so the benchmark can compare the two.
    global_worker: bool = False
    #: Run an extension's ``lvs`` and ``lvextend`` in a persistent ``lvm``
    #: shell per VG (:mod:`pvestord.adapters.lvmshell`), which skips LVM's start-up.
    #: Without its profile installed, pvestord falls back to a process per
    #: command by itself; False forces that (the fault tests put a wrapper in
    #: place of ``lvm``, which sees only the shell's start).
    lvm_shell: bool = True
    #: Wake on inotify for local queue writes. False: polling only, at
    #: ``poll_interval`` (the original proposal's behaviour, for the benchmark).
    inotify: bool = True
    #: Where each node publishes its view of the thin storages for
    #: ``pvestord rank-nodes`` (:mod:`pvestord.engine.nodereport`). None: the
    #: ``nodes`` folder beside the queue (``/etc/pve/nodes``, pmxcfs's
    #: per-node folders).
    nodes_dir: Path | None = None
    #: Seconds between two reports of this node's view (one ``vgs`` per VG).
    report_interval: float = 10.0
    #: How long a storage lock directory lives after its holder's last
    #: renewal. pmxcfs's is 120 s and cannot be made longer; on a plain
    #: folder (``lock_dir`` off pmxcfs: the two-node bed, tests) the emulated
    #: expiry uses this, so that tests can shorten it.
    lock_lifetime: float = locks.PMXCFS_LOCK_EXPIRY
    #: Seconds a pass over one VM may take before it is abandoned (cancelled,
    #: logged, the VG it was changing marked unhealthy). A normal pass takes
    #: well under a second; every wait in it has its own budget (QMP 10 s per
    #: call, the storage lock 10 s, LVM 30 s per command), so only a wait that
    #: ignores its budget (an ``lvm`` in D state) gets here.
    pass_deadline: float = 180.0
    #: Where the marks of VGs this node must not change any more live
    #: (:mod:`pvestord.adapters.vghealth`).
    vg_health_dir: Path = vghealth.DEFAULT_DIR

    @property
    def reports_dir(self) -> Path:
        return self.nodes_dir if self.nodes_dir is not None else paths.nodes_dir(self.queue)

    def __post_init__(self) -> None:
        for name in ("poll_interval", "reconcile_interval", "lvm_timeout", "qmp_timeout",
                     "qemu_img_timeout", "report_interval", "pass_deadline"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ConfigError(f"{name.replace('_', '-')} = {value}: must be a positive"
                                  " number of seconds")
        if not (math.isfinite(self.lock_lifetime) and self.lock_lifetime > 0):
            raise ConfigError(f"lock-lifetime = {self.lock_lifetime}: must be a positive"
                              " number of seconds")
        # An LVM change starts only while the lock is guaranteed for its whole
        # budget (Held.require): with renewals every RENEW_SHARE of the
        # lifetime, that is at least (1 - RENEW_SHARE) of it, less the margin.
        guaranteed = self.lock_lifetime * (1 - locks.RENEW_SHARE - locks.MARGIN_SHARE)
        if self.lvm_timeout + KILL_WAIT > guaranteed:
            raise ConfigError(
                f"lvm-timeout = {self.lvm_timeout:g} s: with {KILL_WAIT:g} s to see a killed"
                f" command end, it must fit in the {guaranteed:.1f} s a storage lock of"
                f" lifetime {self.lock_lifetime:g} s is surely held; otherwise no LVM change"
                " could ever start")
        if not self.node:
            raise ConfigError("node name is empty")
