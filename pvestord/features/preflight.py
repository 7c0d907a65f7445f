"""``pvestord check``'s probes: the facts of this node, each gathered with a bound.

Every probe only looks: it reads files, ``/proc`` and reports, asks systemd
and LVM, and takes and releases the queue lock once (the only way to know that
a lock can be had). What the facts mean is :mod:`pvestord.policy.preflight`'s.
Every path is a field of :class:`Where`, so that the tests run the command
against a tree of their own; ``systemctl`` and ``lvm`` are found through
``PVESTORD_SYSTEMCTL`` and ``PVESTORD_LVM`` as elsewhere
(:func:`pvestord.adapters.command.binary`).

The signals, and why these:

- **Plugin loaded by each daemon.** A Perl module leaves no trace in a running
  process (it is read, compiled and closed: ``/proc/<pid>/maps`` shows only
  shared objects), so what can be known is *when* the daemon's code was
  loaded, against when the plugin file was put in place. Not the process's
  start time: ``systemctl reload`` makes a PVE::Daemon re-execute itself in
  place (same pid, same start time, new code), and Proxmox's own upgrades
  reload. systemd's ``StateChangeTimestamp`` moves at a start and at a reload
  alike. Not the file's mtime either: dpkg keeps the mtime recorded in the
  package (its build time); the ctime is set when dpkg renames the file into
  place.
- **Who listens on the event socket.** ``/proc/net/unix`` lists listening
  sockets by the name they were bound with, ``/proc/<pid>/fd`` says which
  process holds each, and its command line says what program that is. No
  connection is made: both qmeventd and qmeventd-py would log a dropped
  peer. qmeventd-py binds a temporary name beside the path and renames it
  (:mod:`qmeventd_py.listener`), so that name counts too.
"""

from __future__ import annotations

import asyncio
import os
import re
import stat
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from pvestord import paths
from pvestord.adapters import command, keptsections, lvm
from pvestord.adapters.atomicfile import read_bounded
from pvestord.adapters.config import StorageConfig, StorageOptionError, load_storage_config
from pvestord.adapters.locks import queue_lock
from pvestord.adapters.queue import MAX_READ, parse_queue
from pvestord.engine import metrics
from pvestord.errors import ConfigError, PvestordError
from pvestord.policy import preflight
from pvestord.policy.preflight import Finding, Owner, UnitState, VgMetadata
from pvestord.policy.vanished import restore_command

#: Budget of one ``systemctl show`` (all units at once).
SYSTEMCTL_TIMEOUT = 10.0
#: Budget of ``pvs``: a SAN path that queues I/O may hold it.
PVS_TIMEOUT = 30.0
#: How long the queue lock may take to get: a healthy holder keeps it for
#: well under a second; pmxcfs without quorum refuses at once.
LOCK_TIMEOUT = 5.0

PLUGIN = Path("/usr/share/perl5/PVE/Storage/Custom/PvestordPlugin.pm")
LVM_PROFILE = Path("/etc/lvm/profile/pvestord.profile")
#: The units the check asks systemd about.
QMEVENTD = "qmeventd.service"


@dataclass(frozen=True)
class Where:
    """Every place the check looks; the defaults are a Proxmox node's."""

    node: str
    queue: Path = paths.QUEUE
    storage_config: Path = paths.STORAGE_CFG
    lock_dir: Path | None = None
    plugin: Path = PLUGIN
    lvm_profile: Path = LVM_PROFILE
    event_socket: Path = paths.QMEVENTD_SOCKET
    metrics_dir: Path = metrics.METRICS_FILE.parent
    proc: Path = Path("/proc")
    #: The number of extensions the VGs' metadata should hold; None: the
    #: most their thin storages' chunks can make.
    extensions: int | None = None
    daemons: Sequence[str] = preflight.PROXMOX_DAEMONS
    #: The daemon's copy of the ``pvestord:`` sections.
    kept_sections: Path = paths.STATE_DIR / keptsections.FILE_NAME


def run_checks(where: Where) -> list[Finding]:
    """Every check, in the order an admin fixes things: code loaded, events,
    LVM, configuration, the cluster files, metrics."""
    units = unit_states([f"{d}.service" for d in where.daemons] + [QMEVENTD])
    found = plugin_checks(where, units)
    found.append(preflight.socket_owner(str(where.event_socket),
                                        *socket_owner(where.event_socket, where.proc)))
    found.append(preflight.qmeventd_masked(units.get(QMEVENTD) if units else None))
    found.append(preflight.lvm_profile(str(where.lvm_profile), _text(where.lvm_profile)))
    config, storage_found = storage_checks(where)
    found += storage_found
    if config is not None:
        found += metadata_checks(config, where)
    found += queue_checks(where)
    exists = where.metrics_dir.is_dir()
    found.append(preflight.metrics(str(where.metrics_dir), exists,
                                   exists and os.access(where.metrics_dir, os.W_OK)))
    return found


# -- systemd and the plugin -------------------------------------------------------


def unit_states(units: Sequence[str]) -> dict[str, UnitState] | None:
    """Each unit as systemd has it; None when systemd cannot be asked (no
    systemd, no bus: a container, a chroot)."""
    argv = [command.binary("systemctl"), "show", "--timestamp=unix",
            "-p", "Id,LoadState,ActiveState,UnitFileState,StateChangeTimestamp", *units]
    try:
        done = command.run(argv, timeout=SYSTEMCTL_TIMEOUT)
    except PvestordError:
        return None
    blocks = [b for b in done.stdout.strip().split("\n\n") if b.strip()]
    if len(blocks) != len(units):
        return None
    # One block per unit asked, in the order asked (an alias's Id is the unit it names).
    return {unit: _unit_state(unit, block) for unit, block in zip(units, blocks, strict=True)}


def _unit_state(unit: str, block: str) -> UnitState:
    props = dict(line.partition("=")[::2] for line in block.splitlines())
    stamp = props.get("StateChangeTimestamp", "")
    since: float | None = None
    if stamp.startswith("@"):
        try:
            since = float(stamp[1:])
        except ValueError:
            since = None
    return UnitState(unit, props.get("LoadState", ""), props.get("ActiveState", ""), since,
                     props.get("UnitFileState", ""))


def _installed_at(path: Path) -> float | None:
    """When ``path`` was put in place: its ctime (see the module docstring)."""
    try:
        return path.stat().st_ctime
    except OSError:
        return None


def plugin_checks(where: Where, units: Mapping[str, UnitState] | None) -> list[Finding]:
    installed = _installed_at(where.plugin)
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(installed)) if installed else ""
    found = [preflight.plugin_file(str(where.plugin), installed)]
    for daemon in where.daemons:
        state = units.get(f"{daemon}.service") if units is not None else None
        found.append(preflight.plugin_loaded(daemon, state, installed, when))
    return found


# -- the event socket ---------------------------------------------------------------

#: ``/proc/net/unix``'s flag of a listening socket (``__SO_ACCEPTCON``).
_ACCEPTING = 0x10000


def listening_inodes(socket_path: Path, proc: Path) -> list[int]:
    """Socket inodes listening at ``socket_path`` (or at qmeventd-py's
    temporary name beside it, renamed over the path)."""
    temporary = re.compile(rf"\.{re.escape(socket_path.name)}\.\d+")
    folder = os.path.realpath(socket_path.parent)
    found = []
    try:
        lines = (proc / "net" / "unix").read_text().splitlines()[1:]
    except OSError:
        return []
    for line in lines:
        cols = line.split(None, 7)
        if len(cols) < 8:
            continue
        try:
            flags, inode = int(cols[3], 16), int(cols[6])
        except ValueError:
            continue
        if not flags & _ACCEPTING or cols[7].startswith("@"):
            continue  # not listening, or an abstract name (no file)
        bound = Path(cols[7])
        if (bound.name == socket_path.name or temporary.fullmatch(bound.name)) and \
                os.path.realpath(bound.parent) == folder:
            found.append(inode)
    return found


def holders(inodes: Sequence[int], proc: Path) -> dict[int, list[str]]:
    """The pid and command line of every process holding one of ``inodes``."""
    wanted = {f"socket:[{inode}]" for inode in inodes}
    found: dict[int, list[str]] = {}
    try:
        entries = list(proc.iterdir())
    except OSError:
        return found
    for entry in entries:
        if not entry.name.isdigit():
            continue
        try:
            fds = list((entry / "fd").iterdir())
            if not any(os.readlink(fd) in wanted for fd in fds):
                continue
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue  # gone meanwhile, or not ours to read
        found[int(entry.name)] = [a.decode(errors="replace") for a in cmdline if a]
    return found


def program_of(cmdline: Sequence[str]) -> Owner:
    """Which event server a command line is: ``/usr/bin/qmeventd-py`` runs
    as ``python3 /usr/bin/qmeventd-py``, Proxmox's qmeventd as itself."""
    words = [os.path.basename(w) for w in cmdline[:3]]
    if "qmeventd-py" in words or "qmeventd_py" in cmdline[:4]:
        return Owner.QMEVENTD_PY
    if words[:1] == ["qmeventd"]:
        return Owner.QMEVENTD
    return Owner.OTHER


def socket_owner(socket_path: Path, proc: Path) -> tuple[Owner, str]:
    """Who listens on ``socket_path``, and its command line when it is no
    event server of ours or Proxmox's."""
    try:
        is_socket = stat.S_ISSOCK(socket_path.stat().st_mode)
    except OSError:
        is_socket = False
    if not is_socket:
        return Owner.NOBODY, ""
    inodes = listening_inodes(socket_path, proc)
    if not inodes:
        return Owner.NOBODY, ""  # a socket file left behind: connections are refused
    held = holders(inodes, proc)
    if not held:
        # /proc/net/unix is for everyone, another user's /proc/<pid>/fd is not.
        return Owner.UNKNOWN, ""
    owners = {pid: program_of(cmdline) for pid, cmdline in held.items()}
    kinds = set(owners.values())
    if len(kinds) == 1 and Owner.OTHER not in kinds:
        return kinds.pop(), ""
    # The program and its script by name: enough to recognise, never a long path.
    named = "; ".join(f"pid {pid} ({' '.join(os.path.basename(w) for w in held[pid][:2])})"
                      for pid in sorted(held))
    return Owner.OTHER, named


# -- storage.cfg and LVM metadata -------------------------------------------------------


def storage_checks(where: Where) -> tuple[StorageConfig | None, list[Finding]]:
    """Each thin storage's settings; the config, when it could be read."""
    path = str(where.storage_config)
    try:
        config = load_storage_config(where.storage_config)
    except StorageOptionError as err:
        return None, [preflight.storage_unreadable(path, str(p)) for p in err.problems]
    except ConfigError as err:
        return None, [preflight.storage_unreadable(path, str(err))]
    found = [preflight.storage_warning(w) for w in config.warnings]
    ids = {section.id for section in config.sections}
    try:
        kept = keptsections.read(where.kept_sections)
    except keptsections.KeptSectionsError as err:
        found.append(preflight.storage_warning(str(err)))
        kept = {}
    # Whether or not the daemon noticed yet: the file is what Proxmox reads.
    found += [preflight.storage_vanished(sid, path, restore_command(sid))
              for sid in sorted(set(kept) - ids)]
    here = 0
    for storage in config.lvm_storages.values():
        thin = storage.thin
        if thin is None:
            continue
        if storage.disabled:
            found.append(preflight.storage_skipped(thin.storeid, "disabled"))
        elif not storage.available_on(where.node):
            found.append(preflight.storage_skipped(
                thin.storeid, f"not for this node ({where.node})"))
        else:
            here += 1
            found.append(preflight.storage_settings(
                thin.storeid, thin.vgname, shared=thin.shared, chunksize=thin.chunksize,
                chunk_percentage=thin.chunk_percentage, initial_size=thin.initial_size))
    for vg in sorted(thin_vgs(config, where.node)):
        try:
            config.by_vg(vg, where.node)
        except ConfigError as err:
            found.append(preflight.storage_conflict(str(err)))
    if not here:
        found.append(preflight.no_thin_storage(path, where.node))
    return config, found


def thin_vgs(config: StorageConfig, node: str) -> dict[str, list[tuple[str, int]]]:
    """Each VG of an enabled thin storage of ``node``: its ``(storeid, chunksize)``s."""
    vgs: dict[str, list[tuple[str, int]]] = {}
    for storage in config.lvm_storages.values():
        if storage.thin is None or storage.disabled or not storage.available_on(node):
            continue
        vgs.setdefault(storage.vgname, []).append((storage.storeid, storage.thin.chunksize))
    return vgs


def metadata_checks(config: StorageConfig, where: Where) -> list[Finding]:
    vgs = thin_vgs(config, where.node)
    if not vgs:
        return []
    try:
        pvs = asyncio.run(lvm.pv_metadata(timeout=PVS_TIMEOUT))
    except PvestordError as err:
        return [preflight.lvm_unreadable(str(err))]
    found = []
    for vg, storages in sorted(vgs.items()):
        mine = [pv for pv in pvs if pv.vg == vg]
        if not mine:
            found.append(preflight.vg_not_visible(vg, [sid for sid, _ in storages]))
            continue
        # Every area holds the whole VG's text: the smallest one fills first.
        areas = [pv for pv in mine if pv.mda_size > 0]
        meta = VgMetadata(
            vg, min((pv.mda_size for pv in areas), default=0),
            min((pv.mda_free for pv in areas), default=0), mine[0].vg_size,
            min(chunk for _, chunk in storages))
        found.append(preflight.lvm_metadata(meta, where.extensions))
    return found


# -- the cluster files ------------------------------------------------------------------


def queue_checks(where: Where) -> list[Finding]:
    """The queue read (its lines parsed as the daemon parses them), and its
    lock taken and released."""
    path = where.queue
    problem = None
    entries = rejected = 0
    if not path.parent.is_dir():
        problem = f"its folder {path.parent} does not exist (is /etc/pve mounted?)"
    else:
        try:
            parsed, bad = parse_queue(read_bounded(path, MAX_READ))
            entries, rejected = len(parsed), len(bad)
        except (OSError, PvestordError) as err:
            problem = str(err)
    found = [preflight.queue(str(path), problem, entries, rejected)]
    lock = queue_lock(path, where.lock_dir)
    if problem is not None:
        found.append(preflight.lock_not_tried(lock.name))
        return found
    lock_problem = None
    try:
        with lock.acquire(timeout=LOCK_TIMEOUT):
            pass
    except (OSError, PvestordError) as err:
        lock_problem = str(err)
    found.append(preflight.lock(lock.name, lock_problem))
    return found


def _text(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return None
