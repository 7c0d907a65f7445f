"""The values of pvestord's storage options: defaults, limits, and how each is read.

Pure, and apart from the file's syntax, because two callers read the same
values: the ``storage.cfg`` parser (:mod:`pvestord.adapters.config`) and the
storage plugin, which gets a storage's options from Proxmox, not from a file.
Both must accept and refuse exactly the same text. Every reader takes the
options as written (``None``: a bare key) and reports an unusable value to
``problem(option, reason)``, then goes on with the default, so one pass over
a section lists every problem at once.

Every option of ours is named with :data:`PREFIX`. Proxmox's storage plugins
share one namespace of properties, and ``PVE::SectionConfig`` refuses to load
when two plugins declare the same one: were Proxmox's own LVM plugin to
declare ``chunksize`` (thin LVM in Proxmox would want one), a plugin of ours
declaring it too would stop ``PVE::Storage`` from loading in every Proxmox
daemon. The names before the prefix (:data:`FORMER_NAMES`) are still read, so
existing sections keep their values; the prefixed name wins when both are set.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import NamedTuple

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

#: What every option name of ours starts with (see the module docstring).
PREFIX = "pvestord-"
CHUNKSIZE = PREFIX + "chunksize"
CHUNK_PERCENTAGE = PREFIX + "chunk-percentage"
INITIAL_SIZE = PREFIX + "initial-size"
#: The options of ours in an ``lvm:`` or ``pvestord:`` section.
THIN_OPTIONS = (CHUNKSIZE, CHUNK_PERCENTAGE, INITIAL_SIZE, *capacity.OPTIONS)
#: Each option's name before it took the prefix -> its name now. Deprecated,
#: still read: sections written before the rename keep their values.
FORMER_NAMES: Mapping[str, str] = MappingProxyType(
    {name.removeprefix(PREFIX): name for name in THIN_OPTIONS})

# PVE::JSONSchema's number check; Python's float() would also take "nan", "1_0".
_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})

Options = Mapping[str, str | None]
#: Reports ``(option, reason)`` for the storage being read.
Problem = Callable[[str, str], None]
#: Reports ``(former, current, current_also_set)``: a former name was written;
#: when the current name is set too, the former one is ignored.
FormerName = Callable[[str, str, bool], None]


class ThinValues(NamedTuple):
    """What a thin storage's options set, each value usable or its default."""

    chunksize: int
    chunk_percentage: float
    initial_size: int
    guards: capacity.Guards


def thin_values(opts: Options, problem: Problem,
                former_name: FormerName | None = None) -> ThinValues:
    """Every thin option of one storage, under its current or its former name;
    each unusable value is told to ``problem`` under the name it was written
    with, each former name to ``former_name``."""
    current, written_as = with_current_names(opts, former_name)

    def problem_as_written(option: str, reason: str) -> None:
        problem(written_as.get(option, option), reason)

    chunksize = size_option(current, CHUNKSIZE, DEFAULT_CHUNKSIZE, MIN_CHUNKSIZE,
                            problem_as_written)
    initial_size = size_option(current, INITIAL_SIZE, DEFAULT_INITIAL_SIZE, 1,
                               problem_as_written)
    percentage = chunk_percentage(current, problem_as_written)
    guards = capacity.parse_guards(current, problem_as_written)
    return ThinValues(chunksize, percentage, initial_size, guards)


def with_current_names(opts: Options, former_name: FormerName | None = None
                       ) -> tuple[dict[str, str | None], dict[str, str]]:
    """``opts`` with each option of ours set under a former name also set under
    its current name, unless that is set already (the current name wins: it is
    what Proxmox's GUI, API and ``pvesm`` now write, and the former line may
    just be left over); and, for each current name taken from a former one,
    that former name.
    """
    current = dict(opts)
    written_as: dict[str, str] = {}
    for former, name in FORMER_NAMES.items():
        if former not in opts:
            continue
        if former_name is not None:
            former_name(former, name, name in opts)
        if name not in opts:
            current[name] = opts[former]
            written_as[name] = former
    return current, written_as


def sets_thin_option(opts: Options) -> list[str]:
    """The options of ours ``opts`` sets, under either name, as written."""
    return [o for o in opts if o in THIN_OPTIONS or o in FORMER_NAMES]


def size_option(opts: Options, option: str, default: int, minimum: int,
                problem: Problem) -> int:
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


def chunk_percentage(opts: Options, problem: Problem) -> float:
    option = CHUNK_PERCENTAGE
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


def _truth(opts: Options, option: str) -> bool | None:
    """A boolean option as SectionConfig reads it; None for a value that is no boolean.

    Absent is false; a bare key is a boolean set to 1, as in SectionConfig.
    """
    if option not in opts:
        return False
    text = opts[option]
    if text is None:
        return True
    if text.lower() in _TRUE:
        return True
    if text.lower() in _FALSE:
        return False
    return None


def boolean_option(opts: Options, option: str, problem: Problem) -> bool:
    """A boolean option of ours: a value that is no boolean is a problem (and false)."""
    value = _truth(opts, option)
    if value is None:
        problem(option, "not a boolean (0 or 1)")
        return False
    return value


def flag(opts: Options, option: str, *, unreadable: bool) -> bool:
    """A boolean option of any storage; ``unreadable`` for a value that is no
    boolean (the safer reading for the caller)."""
    value = _truth(opts, option)
    return unreadable if value is None else value
