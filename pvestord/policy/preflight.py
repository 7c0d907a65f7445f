"""The rules of ``pvestord check``: what each probe's facts mean, and what to do.

Pure: the probes (:mod:`pvestord.features.preflight`) gather facts (a unit's
state, a file's times, LVM's figures); here they become findings, each with
its level and, unless it passed, the words that tell the admin what to do.
Kept apart so that every verdict and every piece of advice can be tested
without a Proxmox node, and the exit status follows from the findings alone.

Levels, as in Proxmox's own upgrade checklists (``pve8to9``): PASS, WARN
(works, but not as it should: slower, or a trap for later), FAIL (something
pvestord or Proxmox needs is broken now), SKIP (not applicable here, or not
knowable from here, with the reason).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from pvestord.policy import lvmetadata
from pvestord.policy.sizes import format_size

#: The Proxmox daemons that load storage plugins at start (``PVE::Storage``
#: loads ``PVE/Storage/Custom/*.pm`` once, when it is compiled): each must have
#: started, or re-executed itself, since the plugin file was installed.
PROXMOX_DAEMONS = ("pvedaemon", "pveproxy", "pvestatd", "pvescheduler",
                   "pve-ha-lrm", "pve-ha-crm")
#: What the LVM profile must set for the persistent shells to work
#: (packaging/lvm/pvestord.profile): ``(section, setting, value)`` as written.
PROFILE_SETTINGS = (("report", "output_format", '"json"'),
                    ("log", "report_command_log", "1"),
                    ("log", "command_log_selection", '"all"'))


class Level(enum.IntEnum):
    """A finding's level; a higher value is worse (SKIP counts as no problem)."""

    PASS = 0
    SKIP = 1
    WARN = 2
    FAIL = 3


@dataclass(frozen=True)
class Finding:
    """One line of the check's report.

    ``check`` names the check it comes from (the ``--json`` key and the
    heading in ``--help``); ``what`` says what was found; ``todo`` what to
    do about it, required for WARN and FAIL (a finding that gives no advice
    is no help at 3 a.m.) and for SKIP (why it was skipped).
    """

    check: str
    level: Level
    what: str
    todo: str = ""

    def __post_init__(self) -> None:
        if self.level is not Level.PASS and not self.todo.strip():
            raise ValueError(f"a {self.level.name} finding must say what to do: {self.what}")

    def line(self) -> str:
        """``LEVEL: what — what to do``, one line as ``pve8to9`` prints it."""
        text = f"{self.level.name}: {self.what}"
        return f"{text} — {self.todo}" if self.todo else text


def exit_status(findings: Iterable[Finding]) -> int:
    """0 when nothing failed or warned, 1 with a failure, 2 with warnings only."""
    worst = max((f.level for f in findings), default=Level.PASS)
    return {Level.FAIL: 1, Level.WARN: 2}.get(worst, 0)


def summary(findings: Sequence[Finding]) -> str:
    """``SUMMARY: N checks: PASS a, WARN b, FAIL c, SKIP d``, by the levels' own names."""
    counts = ", ".join(f"{level.name} {sum(1 for f in findings if f.level is level)}"
                       for level in (Level.PASS, Level.WARN, Level.FAIL, Level.SKIP))
    return f"SUMMARY: {len(findings)} checks: {counts}"


# -- the storage plugin in each Proxmox daemon ----------------------------------


@dataclass(frozen=True)
class UnitState:
    """A systemd unit as ``systemctl show`` reports it."""

    unit: str
    #: ``LoadState``: ``loaded``, ``not-found``, ``masked``...
    load: str
    #: ``ActiveState``: ``active``, ``inactive``, ``reloading``, ``failed``...
    active: str
    #: ``StateChangeTimestamp`` in seconds since the epoch: the last start or
    #: reload (both change the state); None when systemd gave none.
    since: float | None = None
    #: ``UnitFileState``: ``enabled``, ``disabled``, ``masked``...
    enablement: str = ""


def plugin_file(path: str, installed_at: float | None) -> Finding:
    """The plugin's file; ``installed_at`` is its ctime, None when it is missing."""
    if installed_at is None:
        return Finding("plugin", Level.FAIL, f"storage plugin {path} is missing",
                       "reinstall the package (apt install --reinstall pvestord): without"
                       " it Proxmox skips every 'pvestord:' storage")
    return Finding("plugin", Level.PASS, f"storage plugin {path} installed")


def plugin_loaded(daemon: str, state: UnitState | None, installed_at: float | None,
                  when: str = "") -> Finding:
    """Whether ``daemon`` runs code that includes the plugin installed at
    ``installed_at`` (the file's ctime: dpkg keeps a file's mtime from the
    package, but the rename into place sets its ctime).

    ``state.since`` is systemd's last state change of the unit: a start, or
    a reload, which makes a PVE::Daemon re-execute itself in place (same pid,
    same process start time, new code). ``when`` is ``installed_at`` as the
    admin's clock shows it, for the message."""
    what = f"{daemon} has loaded the storage plugin"
    restart = f"systemctl reload-or-restart {daemon}"
    if state is None:
        return Finding("plugin", Level.SKIP, f"{daemon}: systemd not reachable",
                       f"after installing or upgrading pvestord, run '{restart}'")
    if state.load != "loaded":
        return Finding("plugin", Level.SKIP, f"{daemon}: not installed on this node"
                       f" ({state.load})", "nothing to do unless this is a Proxmox VE node")
    if state.active != "active":
        return Finding("plugin", Level.SKIP, f"{daemon}: not running ({state.active})",
                       "it loads the plugin when it starts; check again once it runs")
    if installed_at is None:
        return Finding("plugin", Level.SKIP, f"{daemon}: no plugin file to compare with",
                       "install the plugin first (see above)")
    if state.since is None:
        return Finding("plugin", Level.WARN, f"{daemon}: systemd does not say when it started",
                       f"run '{restart}' to be sure it has the plugin")
    # systemd says whole seconds: a reload in the second of the install
    # counts as after it (a script that installs and restarts at once).
    if state.since < math.floor(installed_at):
        return Finding("plugin", Level.FAIL, f"{daemon} runs code from before the storage"
                       f" plugin was installed{f' ({when})' if when else ''}: it knows no"
                       " 'pvestord:' storage", f"run '{restart}'")
    return Finding("plugin", Level.PASS, what)


# -- the event socket ---------------------------------------------------------


#: Who listens on qmeventd's socket.
class Owner(enum.Enum):
    QMEVENTD_PY = "qmeventd-py"
    QMEVENTD = "qmeventd"
    OTHER = "another program"
    NOBODY = "nobody"
    #: A socket listens there, but whose it is cannot be read (not root).
    UNKNOWN = "unknown"


HAND_OVER = ("systemctl mask --now qmeventd.service && systemctl enable --now"
             " qmeventd-py.service")


def socket_owner(path: str, owner: Owner, program: str = "") -> Finding:
    """Who listens on ``path``; ``program`` names an :attr:`Owner.OTHER`."""
    if owner is Owner.QMEVENTD_PY:
        return Finding("event-socket", Level.PASS, f"qmeventd-py listens on {path}")
    if owner is Owner.QMEVENTD:
        return Finding("event-socket", Level.WARN, f"Proxmox's qmeventd listens on {path}:"
                       " thin disks grow only at pvestord's 30 s reconcile, not on their"
                       " write-threshold events", f"hand the socket over: {HAND_OVER}")
    if owner is Owner.UNKNOWN:
        return Finding("event-socket", Level.SKIP, f"a program listens on {path}, but which"
                       " cannot be seen from here", "run the check as root")
    if owner is Owner.OTHER:
        return Finding("event-socket", Level.WARN, f"{program or 'an unknown program'}"
                       f" listens on {path}, neither qmeventd-py nor qmeventd",
                       f"stop it, then {HAND_OVER}")
    return Finding("event-socket", Level.FAIL, f"nobody listens on {path}: no VM's exit"
                   " is cleaned up (qm cleanup) and no thin event is seen",
                   "systemctl enable --now qmeventd-py.service (journalctl -u qmeventd-py"
                   " if it does not start)")


def qmeventd_masked(state: UnitState | None) -> Finding:
    """qmeventd.service must be masked: qemu-server's upgrades restart it
    otherwise, and its start stops qmeventd-py (``Conflicts=``)."""
    if state is None:
        return Finding("event-socket", Level.SKIP, "qmeventd.service: systemd not reachable",
                       "check by hand: systemctl is-enabled qmeventd.service says 'masked'")
    if state.load in ("masked", "not-found") or state.enablement.startswith("masked"):
        return Finding("event-socket", Level.PASS, f"qmeventd.service is {state.load}")
    return Finding("event-socket", Level.WARN, f"qmeventd.service is not masked"
                   f" ({state.enablement or state.load}): an upgrade of qemu-server restarts"
                   " it, which stops qmeventd-py", "systemctl mask qmeventd.service")


# -- the LVM profile ------------------------------------------------------------


def missing_profile_settings(text: str) -> list[str]:
    """The :data:`PROFILE_SETTINGS` that ``text`` (an LVM profile) does not set
    as needed, as ``section/setting``. A line-wise reading, enough for the
    file the package ships and its hand edits; LVM's own parser is stricter."""
    section = ""
    found: set[tuple[str, str, str]] = set()
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if line.endswith("{"):
            section = line[:-1].strip()
        elif line == "}":
            section = ""
        elif "=" in line:
            key, _, value = line.partition("=")
            found.add((section, key.strip(), value.strip()))
    return [f"{s}/{k}" for s, k, v in PROFILE_SETTINGS if (s, k, v) not in found]


def lvm_profile(path: str, text: str | None) -> Finding:
    """The profile of pvestord's persistent lvm shells; ``text`` None: missing."""
    slower = ("pvestord runs a process per LVM command instead of its persistent"
              " shells: every extension is slower")
    if text is None:
        return Finding("lvm-profile", Level.WARN, f"LVM profile {path} is missing: {slower}",
                       "reinstall the package (apt install --reinstall pvestord)")
    missing = missing_profile_settings(text)
    if missing:
        return Finding("lvm-profile", Level.WARN, f"LVM profile {path} does not set"
                       f" {', '.join(missing)} as shipped: {slower}",
                       "restore it: apt install --reinstall pvestord")
    return Finding("lvm-profile", Level.PASS, f"LVM profile {path} in place")


# -- LVM metadata against the extensions ------------------------------------------


@dataclass(frozen=True)
class VgMetadata:
    """A VG's metadata figures from its PVs: the smallest area (every area
    holds the whole VG's text, so the smallest fills first) and its free
    room; ``vg_size`` and the smallest chunk of its thin storages."""

    vg: str
    mda_size: int
    mda_free: int
    vg_size: int
    chunksize: int


def expected_segments(meta: VgMetadata, extensions: int | None = None) -> int:
    """How many segments the VG's metadata should hold: ``extensions`` when
    the admin says, else the most that chunk extensions can make."""
    if extensions is not None:
        return max(0, extensions)
    return lvmetadata.segments_possible(meta.vg_size, meta.chunksize)


def lvm_metadata(meta: VgMetadata, extensions: int | None = None) -> Finding:
    """The VG's metadata area against the extensions its thin disks will make."""
    vg = meta.vg
    bigger = ("move the VG to PVs with a bigger area (pvcreate --metadatasize 128m on a new"
              " PV, vgextend, pvmove, vgreduce; docs/operations.md, 'LVM metadata')")
    if meta.mda_size <= 0:
        return Finding("lvm-metadata", Level.FAIL, f"VG {vg}: no PV holds a metadata area",
                       "pvs -o+pv_mda_count: give a PV a metadata area (pvchange"
                       " --metadataignore n)")
    holds = lvmetadata.segments_room(meta.mda_size)
    if lvmetadata.metadata_low(meta.mda_free, meta.mda_size):
        return Finding("lvm-metadata", Level.FAIL, f"VG {vg}: LVM metadata nearly full,"
                       f" {format_size(max(0, meta.mda_free))} left of its"
                       f" {format_size(meta.mda_size)} area (about"
                       f" {lvmetadata.extensions_left(meta.mda_free)} more extensions): when"
                       " it is full every lvcreate and lvextend in the VG fails", bigger)
    wanted = expected_segments(meta, extensions)
    figures = (f"its {format_size(meta.mda_size)} metadata area holds about {holds}"
               f" segments")
    basis = (f"{wanted} expected" if extensions is not None else
             f"up to {wanted} ({format_size(meta.vg_size)} in"
             f" {format_size(meta.chunksize)} chunks)")
    if holds < wanted:
        return Finding("lvm-metadata", Level.WARN, f"VG {vg}: {figures}, thin extensions may"
                       f" make {basis}", f"before it fills, {bigger}; or say how many you"
                       " expect with --extensions")
    return Finding("lvm-metadata", Level.PASS, f"VG {vg}: {figures}, enough for {basis}")


def vg_not_visible(vg: str, storeids: Sequence[str]) -> Finding:
    return Finding("lvm-metadata", Level.FAIL, f"VG {vg} of storage {', '.join(storeids)}"
                   " is not visible on this node: its thin disks cannot run here",
                   "check the SAN paths (multipath -ll, iscsiadm -m session), then pvscan;"
                   " or restrict the storage with 'nodes'")


def lvm_unreadable(problem: str) -> Finding:
    return Finding("lvm-metadata", Level.FAIL, f"cannot read LVM's PVs: {problem}",
                   "run 'pvs' by hand to see why; pvestord cannot extend anything without LVM")


# -- queue, lock, metrics ----------------------------------------------------------


def queue(path: str, problem: str | None, entries: int, rejected: int) -> Finding:
    """The extend queue as read: ``problem`` when it could not be read."""
    if problem is not None:
        return Finding("queue", Level.FAIL, f"extend queue {path}: {problem}",
                       "check /etc/pve (pvecm status; systemctl status pve-cluster) or"
                       " --queue")
    if rejected:
        return Finding("queue", Level.WARN, f"extend queue {path}: {rejected} line(s) that do"
                       " not parse", "see them with 'pvestord queue list --rejected'; the"
                       " next change of the queue moves them aside")
    return Finding("queue", Level.PASS, f"extend queue {path} readable, {entries} queued")


def lock(name: str, problem: str | None) -> Finding:
    """The queue lock ``name``, taken and released: ``problem`` when not."""
    if problem is not None:
        return Finding("lock", Level.FAIL, f"queue lock {name}: {problem}",
                       "without quorum /etc/pve is read-only (pvecm status); a lock held"
                       " for minutes is a stuck holder: see 'The storage lock' in"
                       " docs/operations.md")
    return Finding("lock", Level.PASS, f"queue lock {name} taken and released")


def lock_not_tried(name: str) -> Finding:
    return Finding("lock", Level.SKIP, f"queue lock {name}: not tried",
                   "the queue's folder is missing (above); fix that first")


def metrics(folder: str, exists: bool, writable: bool) -> Finding:
    """node_exporter's textfile folder, where the daemon writes pvestord.prom."""
    if not exists:
        return Finding("metrics", Level.SKIP, f"no node_exporter folder {folder}: no"
                       " metrics are written", "optional: apt install"
                       " prometheus-node-exporter to get pvestord.prom there")
    if not writable:
        return Finding("metrics", Level.FAIL, f"node_exporter folder {folder} is not"
                       " writable: the daemon cannot write pvestord.prom",
                       f"let root write it (ls -ld {folder})")
    return Finding("metrics", Level.PASS, f"node_exporter folder {folder}: the daemon"
                   " writes pvestord.prom there")


# -- storage.cfg -------------------------------------------------------------------


def storage_unreadable(path: str, problem: str) -> Finding:
    return Finding("storage", Level.FAIL, f"{path}: {problem}",
                   "fix the option named (pvesm set <storage> --<option> <value>, or edit"
                   " the file); the daemon refuses to start on it")


def storage_vanished(storeid: str, path: str, restore: str) -> Finding:
    """A ``pvestord:`` section the daemon kept that is gone from storage.cfg."""
    return Finding("storage", Level.FAIL,
                   f"storage '{storeid}' is gone from {path} but pvestord kept its section"
                   " (an edit from a node without the plugin drops every pvestord: storage)",
                   f"'{restore}' puts it back; if it was removed on purpose, 'pvestord storage"
                   f" forget {storeid}' and 'systemctl reload pvestord' (operations.md,"
                   " Rolling install)")


def storage_warning(warning: str) -> Finding:
    """A line Proxmox too would warn about, or a deprecated option name."""
    return Finding("storage", Level.WARN, warning,
                   "edit storage.cfg as the message says (docs/proxmox.md)")


def no_thin_storage(path: str, node: str) -> Finding:
    return Finding("storage", Level.WARN, f"{path}: no 'pvestord:' storage for node {node}:"
                   " pvestord has nothing to do here", "make a storage thin (docs/operations.md,"
                   " /usr/share/doc/pvestord/examples/storage.cfg.example), or restrict"
                   " it with 'nodes' where it does not belong")


def storage_conflict(problem: str) -> Finding:
    return Finding("storage", Level.FAIL, problem,
                   "make the storages on that VG agree, or restrict them with 'nodes'")


def storage_skipped(storeid: str, why: str) -> Finding:
    return Finding("storage", Level.SKIP, f"storage {storeid}: {why}",
                   "nothing to do here; it is checked on the nodes that use it")


def storage_settings(storeid: str, vg: str, *, shared: bool, chunksize: int,
                     chunk_percentage: float, initial_size: int) -> Finding:
    """A thin storage whose options all read: what they come to, in words."""
    what = (f"storage {storeid}: VG {vg}, chunks of {format_size(chunksize)} with"
            f" {chunk_percentage:.0%} left free at the threshold, new disks at"
            f" {format_size(initial_size)}")
    # Not shared is no fault in itself (a VG of one node); it only means
    # Proxmox's and our locks are this node's flock files, said here so that an
    # admin whose VG is in fact on the SAN sees it.
    return Finding("storage", Level.PASS,
                   f"{what}, {'shared' if shared else 'not shared (locks on this node only)'}")
