"""The daemon's live view, published for ``pvestord status`` and for metrics.

``pvestord status`` runs as its own process and cannot ask the daemon, so the
daemon writes what it is doing to :data:`STATUS_FILE` (``/run``: gone at a
reboot, never stale across one), replaced atomically (a rename) so a reader
never sees half a file. The file names the daemon's pid and when it was
written: a reader tells a running daemon from a stopped or wedged one.

:class:`Activity` is what the extender records as it works (a few lines at
its decision points); :func:`snapshot` joins it with the daemon's own state
(queue, deferrals, failures) and each VG's capacity account.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pvestord.adapters import atomicfile, tally
from pvestord.engine.memory import forget_vm
from pvestord.policy import capacity
from pvestord.policy.extension import ExtensionState
from pvestord.policy.vanished import Kept, restore_command

#: Where the daemon publishes its view.
STATUS_FILE = Path("/run/pvestord/status.json")
#: How often the view is written (cheap: no LVM, no QMP).
STATUS_INTERVAL = 2.0
#: The last extensions kept for the view.
HISTORY = 20
#: Latency histogram bounds (milliseconds), event to re-armed.
LATENCY_BUCKETS_MS = (50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000)


@dataclass(frozen=True)
class Extension:
    """One extension made: when, what, and where its time went."""

    at: float
    vmid: int
    block_node: str
    vg: str
    lv: str
    old_size: int
    new_size: int
    duration_ms: int
    lock_wait_ms: int
    lvm_ms: int
    #: From the start of the round (the event's arrival) to the extension's end.
    round_ms: int


@dataclass
class DriveView:
    vmid: int
    block_node: str
    #: The LV's name (its VG beside it): as the journal's LV and VG fields.
    lv: str
    vg: str
    state: str
    paused_nospace: bool = False
    reason: str | None = None
    #: The image's measured maximum (its share of the VG's commitment).
    maximum: int = 0


@dataclass
class Activity:
    """What the extender did, as counters and the latest state of each drive."""

    drives: dict[tuple[int, str], DriveView] = field(default_factory=dict)
    last: deque[Extension] = field(default_factory=lambda: deque(maxlen=HISTORY))
    made: int = 0
    failed: int = 0
    lock_wait_ms_total: int = 0
    #: Cumulative counts per bucket bound (ms), plus the sum: a Prometheus histogram.
    latency_counts: list[int] = field(default_factory=lambda: [0] * len(LATENCY_BUCKETS_MS))
    latency_sum_ms: int = 0
    #: Drives whose extension waits for the VG's reserve: their reason.
    held: dict[tuple[int, str], str] = field(default_factory=dict)
    #: Drives being extended right now, by (vmid, file node): an extension
    #: from its migration check through the lock wait to the ``lvextend``, a
    #: migration destination's refresh (:meth:`extending`). Which LVM
    #: command runs is :class:`~pvestord.engine.lvmchanges.LvmChanges`'s.
    _extending: set[tuple[int, str]] = field(default_factory=set, init=False, repr=False)

    @contextlib.contextmanager
    def extending(self, vmid: int, block_node: str) -> Iterator[None]:
        """Around the extension (or refresh) of ``block_node`` of ``vmid``:
        what ``drives`` and status show as ``extending`` meanwhile."""
        key = (vmid, block_node)
        self._extending.add(key)
        try:
            yield
        finally:
            self._extending.discard(key)

    def is_extending(self, vmid: int, block_node: str) -> bool:
        return (vmid, block_node) in self._extending

    def seen(self, vmid: int, block_node: str, lv: str, vg: str, state: ExtensionState, *,
             paused_nospace: bool, maximum: int) -> None:
        self.drives[(vmid, block_node)] = DriveView(vmid, block_node, lv, vg, state.value,
                                                    paused_nospace, maximum=maximum)

    def maxima(self, vg: str) -> dict[str, int]:
        """The measured maxima of ``vg``'s LVs in use here, by LV name."""
        return {d.lv: d.maximum for d in self.drives.values() if d.vg == vg}

    def extended(self, extension: Extension) -> None:
        self.made += 1
        self.last.append(extension)
        self.lock_wait_ms_total += extension.lock_wait_ms
        self.latency_sum_ms += extension.round_ms
        for index, bound in enumerate(LATENCY_BUCKETS_MS):
            if extension.round_ms <= bound:
                self.latency_counts[index] += 1
        self.held.pop((extension.vmid, extension.block_node), None)

    def failure(self) -> None:
        self.failed += 1

    def hold(self, vmid: int, block_node: str, reason: str) -> None:
        self.held[(vmid, block_node)] = reason

    def forget(self, vmid: int) -> None:
        forget_vm(self.drives, vmid)
        forget_vm(self.held, vmid)


def drive_rows(activity: Activity, *, errors: Mapping[tuple[int, str], str],
               deferred: Iterable[int]) -> list[DriveView]:
    """Each drive's state as ``status`` shows it: what the daemon is doing now
    (extending, deferred, failed, held by the reserve) over what it last saw."""
    deferred_vms = set(deferred)
    rows: list[DriveView] = []
    for key, seen in sorted(activity.drives.items()):
        row = DriveView(**asdict(seen))
        failed = errors.get(key) or errors.get((key[0], ""))
        if activity.is_extending(*key):
            row.state = "extending"
        elif failed is not None:
            row.state, row.reason = "failed", failed
        elif key[0] in deferred_vms:
            row.state, row.reason = "deferred", "the VM is migrating"
        elif key in activity.held:
            row.state, row.reason = "held-by-reserve", activity.held[key]
        elif seen.paused_nospace:
            row.state = "paused-on-enospc"
        rows.append(row)
    return rows


def account_view(account: capacity.Account, level: capacity.Level) -> dict[str, Any]:
    view = asdict(account)
    view["committed"] = account.committed
    view["health"] = level.name.lower()
    return view


def snapshot(*, node: str, pid: int, now: float, activity: Activity,
             drives: list[DriveView], queue_length: int, paused_vms: int,
             accounts: Mapping[str, dict[str, Any]], lvm_shell_restarts: int,
             sections: Mapping[str, Kept] | None = None) -> dict[str, Any]:
    """The published view: a JSON object (see docs/operations.md).

    ``sections``: the kept copy of storage.cfg's ``pvestord:`` sections; each
    is a ``storages`` row, ``vanished`` (a time) when it is gone from the file.
    """
    return {
        "version": 1, "node": node, "pid": pid, "time": now,
        "queue_length": queue_length, "paused_vms": paused_vms,
        "drives": [asdict(d) for d in drives],
        "vgs": dict(sorted(accounts.items())),
        "extensions": {
            "made": activity.made, "failed": activity.failed,
            "lock_wait_ms_total": activity.lock_wait_ms_total,
            "latency_buckets_ms": list(LATENCY_BUCKETS_MS),
            "latency_counts": list(activity.latency_counts),
            "latency_sum_ms": activity.latency_sum_ms,
            "last": [asdict(e) for e in activity.last],
        },
        "lvm_shell_restarts": lvm_shell_restarts,
        "storages": [{"storage": k.storeid, "seen": k.seen, "vanished": k.vanished,
                      "section": k.text,
                      "restore": restore_command(k.storeid) if k.vanished is not None else None}
                     for _, k in sorted((sections or {}).items())],
        # What the daemon asked of the outside world since it started: at
        # idle, these should hardly move (docs/operations.md, "Idle cost").
        "tally": tally.snapshot(),
    }


def write_atomically(path: Path, text: str) -> None:
    """``text`` at ``path`` by a rename: a reader sees the old file or the new one.

    Rewritten every :data:`STATUS_INTERVAL`, and worthless after a crash: not
    fsynced. The node_exporter folder may be writable by another user, hence
    a temporary file no one can guess or plant a link at."""
    path.parent.mkdir(parents=True, exist_ok=True)
    atomicfile.replace_whole(path, text.encode(), durable=False)


def publish(path: Path, view: Mapping[str, Any]) -> None:
    write_atomically(path, json.dumps(view, indent=1, sort_keys=True) + "\n")


def read(path: Path = STATUS_FILE) -> dict[str, Any] | None:
    """The published view, None when there is none (the daemon never ran since boot)."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    return data if isinstance(data, dict) else None


#: Drive states only the running daemon knows: ``pvestord drives``, which
#: looks for itself, cannot see them.
DAEMON_STATES = frozenset({"extending", "paused-on-enospc", "deferred", "held-by-reserve",
                           "failed"})


def daemon_says(view: Mapping[str, Any]) -> dict[tuple[int, str], tuple[str, str | None]]:
    """What the daemon's view says of each drive beyond a look's own states:
    (vmid, block node) -> (state, reason). A malformed row is skipped."""
    said: dict[tuple[int, str], tuple[str, str | None]] = {}
    for row in view.get("drives") or []:
        if not isinstance(row, dict) or row.get("state") not in DAEMON_STATES:
            continue
        vmid, node, reason = row.get("vmid"), row.get("block_node"), row.get("reason")
        if isinstance(vmid, int) and isinstance(node, str):
            said[(vmid, node)] = (str(row["state"]), reason if isinstance(reason, str) else None)
    return said


def daemon_state(view: Mapping[str, Any], *, now: float | None = None,
                 max_age: float = 10 * STATUS_INTERVAL) -> str | None:
    """Why ``view`` is not the live daemon's (its pid gone, too old); None when it is."""
    pid = view.get("pid")
    written = view.get("time")
    if not isinstance(pid, int) or not isinstance(written, int | float):
        return "the status file is unreadable"
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return f"pvestord (pid {pid}) does not run; this view is from {time.ctime(written)}"
    except PermissionError:
        pass
    age = (time.time() if now is None else now) - written
    if age > max_age:
        return (f"pvestord (pid {pid}) has not updated its status for {age:.0f} s"
                " (wedged, or stopping)")
    return None
