"""Each node's view of its thin storages, published in the cluster folder.

Every pvestord writes ``<nodes_dir>/<node>/pvestord.json`` every
``report_interval`` seconds (``/etc/pve/nodes/<node>/``, the folder pmxcfs
keeps for each node, beside its ``qemu-server`` configs): for each thin
storage this node may use (the storage's ``nodes`` option), whether the VG is
visible here, how many of its PVs are missing, whether this node's last LVM
command on it succeeded, its free space and its metadata room. The same probe
warns when a VG's LVM metadata runs low (:class:`MetadataWatch`).
``pvestord rank-nodes`` (:mod:`pvestord.features.ranking`) reads every node's file to
tell a placement decision (the ``rank_nodes`` hook proposed for Proxmox's HA
rebalancer) which nodes can run a guest's thin volumes.

Why each node publishes its own view: a shared VG looks the same from every
node *that sees it*. What differs per node is sight: a failed path, a missing
multipath map, an LVM filter, a node whose LVM hangs. Only that node can say,
and only while its pvestord runs: so every report carries its time, and a
reader treats an old one as "unknown", not as "fine". The daemon's report
loop (:func:`report_loop`) probes and publishes; a stopping daemon marks its
report stopped (:func:`publish_stopped`).

The files are small (one line per storage), written atomically as the queue
is (:func:`pvestord.adapters.atomicfile.write_atomically`), so a reader never sees half of one.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from pvestord.adapters import lvm
from pvestord.adapters.atomicfile import write_atomically
from pvestord.adapters.config import StorageConfig
from pvestord.adapters.lvmshell import LvmShells
from pvestord.adapters.service import fields
from pvestord.adapters.settings import DaemonSettings
from pvestord.engine.failures import Failures
from pvestord.engine.lvmchanges import LvmHealth
from pvestord.errors import PvestordError
from pvestord.policy.lvmetadata import extensions_left, metadata_low

log = logging.getLogger(__name__)

#: The format of a report file; a reader refuses any other.
FORMAT = 1
#: A report file larger than this is not ours (pmxcfs caps a file at 1 MiB).
MAX_REPORT_BYTES = 256 * 1024


@dataclass(frozen=True)
class StorageView:
    """One thin storage as one node sees it."""

    vg: str
    #: The VG was found by this node's LVM.
    visible: bool
    pvs: int = 0
    missing_pvs: int = 0
    free: int = 0
    extent_size: int = 0
    #: Room left for the VG's metadata (``vg_mda_free``) and the metadata area's
    #: size (``vg_mda_size``); 0 when unknown (see :func:`metadata_low`).
    mda_free: int = 0
    mda_size: int = 0
    #: This node's LVM commands on the VG succeeded: the report's own probe,
    #: and the daemon's last extension since the previous report.
    lvm_ok: bool = True
    #: What LVM said when it failed, else None.
    error: str | None = None

    def problem(self) -> str | None:
        """Why a guest's volumes on this VG should not run on this node, or None."""
        detail = f" ({self.error})" if self.error else ""
        if not self.visible:
            return f"VG {self.vg} is not visible here{detail}"
        if not self.lvm_ok:
            return f"last LVM command on VG {self.vg} failed{detail}"
        if self.missing_pvs:
            return f"VG {self.vg} is missing {self.missing_pvs} of {self.pvs} PVs here"
        return None


@dataclass(frozen=True)
class NodeReport:
    node: str
    #: Wall-clock seconds (``time.time()``) when the report was made; nodes
    #: of a cluster keep their clocks in step (corosync needs it).
    time: float
    #: Seconds between reports, as the writer was configured.
    interval: float
    storages: Mapping[str, StorageView] = field(default_factory=dict)
    #: The writer stopped cleanly: its node extends nothing until it returns.
    stopped: bool = False

    def to_json(self) -> str:
        data = asdict(self)
        data["format"] = FORMAT
        return json.dumps(data, sort_keys=True) + "\n"


class ReportError(PvestordError):
    """A report file that is not a report (the reader says which and why)."""


def parse_report(text: str, source: str) -> NodeReport:
    """A report from its JSON text; :class:`ReportError` naming ``source`` if it is not one."""
    try:
        data = json.loads(text)
    except ValueError as err:
        raise ReportError(f"{source}: not JSON: {err}") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ReportError(f"{source}: not a pvestord node report of format {FORMAT}")
    try:
        node, when, interval = data["node"], data["time"], data["interval"]
        if not (isinstance(node, str) and node and _finite(when) and _finite(interval)):
            raise TypeError("node, time or interval")
        storages = {}
        for storeid, view in dict(data.get("storages", {})).items():
            if not isinstance(storeid, str) or not isinstance(view, dict):
                raise TypeError(f"storage {storeid!r}")
            storages[storeid] = _view(view)
        stopped = data.get("stopped", False)
        if not isinstance(stopped, bool):
            raise TypeError("stopped")
    except (KeyError, TypeError, ValueError) as err:
        raise ReportError(f"{source}: malformed report ({err})") from None
    return NodeReport(node=node, time=float(when), interval=float(interval),
                      storages=storages, stopped=stopped)


def _finite(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _view(data: Mapping[str, Any]) -> StorageView:
    vg, visible, lvm_ok, error = data["vg"], data["visible"], data["lvm_ok"], data.get("error")
    counts = {k: data.get(k, 0) for k in ("pvs", "missing_pvs", "free", "extent_size",
                                           "mda_free", "mda_size")}
    if not (isinstance(vg, str) and isinstance(visible, bool) and isinstance(lvm_ok, bool)
            and (error is None or isinstance(error, str))
            and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0
                    for v in counts.values())):
        raise TypeError(f"storage view of VG {vg!r}")
    return StorageView(vg=vg, visible=visible, lvm_ok=lvm_ok, error=error, **counts)


#: The report's file name in its node's folder.
REPORT_NAME = "pvestord.json"


def report_path(nodes_dir: Path, node: str) -> Path:
    if not node or "/" in node or node.startswith("."):
        raise ValueError(f"node name {node!r} cannot name a folder")
    return nodes_dir / node / REPORT_NAME


#: An unchanged report is written again after this many report intervals,
#: so that its readers see it is alive (rank-nodes calls a report older than
#: 30 s "getting old" and one older than 60 s stale; the default interval is
#: 10 s). Every write to ``/etc/pve`` goes to every node through corosync:
#: at idle, 3 a minute instead of 6.
HEARTBEAT_INTERVALS = 2


def publish_due(previous: NodeReport | None, report: NodeReport) -> bool:
    """Whether ``report`` is to be written, the last one written being
    ``previous``: when it says something new (a VG's sight, free space, an
    LVM failure, a stop), or when ``previous`` is :data:`HEARTBEAT_INTERVALS`
    intervals old (or from the future: a clock that stepped back)."""
    if previous is None or replace(previous, time=report.time) != report:
        return True
    age = report.time - previous.time
    return not 0 <= age < HEARTBEAT_INTERVALS * report.interval


def publish(nodes_dir: Path, report: NodeReport) -> Path:
    """Write ``report`` atomically as ``<nodes_dir>/<node>/pvestord.json``."""
    path = report_path(nodes_dir, report.node)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, report.to_json().encode())
    return path


def read_reports(nodes_dir: Path) -> tuple[dict[str, NodeReport], dict[str, str]]:
    """Every node's report, and for each unreadable one the reason, by node.

    A broken report leaves its node out with a reason instead of hiding it;
    a node folder with no report is no node of ours (pmxcfs keeps folders of
    nodes long gone), unless the caller names it as a candidate.
    """
    reports: dict[str, NodeReport] = {}
    problems: dict[str, str] = {}
    try:
        paths = sorted(nodes_dir.glob(f"*/{REPORT_NAME}"))
    except OSError as err:
        return reports, {"*": f"cannot list {nodes_dir}: {err.strerror}"}
    for path in paths:
        node = path.parent.name
        try:
            if path.stat().st_size > MAX_REPORT_BYTES:
                raise ReportError(f"{path}: larger than {MAX_REPORT_BYTES} bytes")
            report = parse_report(path.read_text(errors="replace"), str(path))
            if report.node != node:
                raise ReportError(f"{path}: written for node {report.node!r}")
        except (OSError, ReportError) as err:
            problems[node] = str(err)
            continue
        reports[node] = report
    return reports, problems


class MetadataWatch:
    """Warns once when a VG's metadata room falls below :func:`metadata_low`, and
    once when it is back above (an admin grew the area or removed LVs)."""

    def __init__(self) -> None:
        self._low: set[str] = set()

    def check(self, view: StorageView) -> None:
        if not view.visible or not view.lvm_ok or view.mda_size <= 0:
            return
        low = metadata_low(view.mda_free, view.mda_size)
        extra = fields(VG=view.vg, MDA_FREE=view.mda_free, MDA_SIZE=view.mda_size)
        if low and view.vg not in self._low:
            self._low.add(view.vg)
            log.warning("VG %s: LVM metadata nearly full: %d bytes left of its %d-byte area"
                        " (room for about %d more extensions); when it is full every"
                        " lvcreate and lvextend in the VG fails: see 'LVM metadata' in"
                        " docs/operations.md", view.vg, view.mda_free, view.mda_size,
                        extensions_left(view.mda_free), extra=extra)
        elif not low and view.vg in self._low:
            self._low.discard(view.vg)
            log.info("VG %s: LVM metadata has room again: %d bytes left of %d", view.vg,
                     view.mda_free, view.mda_size, extra=extra)


async def probe(vg: str, *, timeout: float,  # noqa: ASYNC109
                shells: LvmShells | None = None) -> StorageView:
    """How ``vg`` looks from this node now: one ``vgs``, in the VG's lvm
    shell when there are ``shells`` (a report every interval at idle must
    not start an LVM process each time)."""
    try:
        seen = await lvm.probe_vg(vg, timeout=timeout, shells=shells)
    except lvm.LvMissingError as err:
        return StorageView(vg=vg, visible=False, lvm_ok=False, error=str(err))
    except lvm.LvmError as err:
        return StorageView(vg=vg, visible=True, lvm_ok=False, error=str(err))
    return StorageView(vg=vg, visible=True, pvs=seen.pvs, missing_pvs=seen.missing_pvs,
                       free=seen.free, extent_size=seen.extent_size, mda_free=seen.mda_free,
                       mda_size=seen.mda_size)


async def make_report(node: str, config: StorageConfig, health: LvmHealth, *,
                      interval: float, lvm_timeout: float, metadata: MetadataWatch,
                      shells: LvmShells | None = None) -> NodeReport:
    """This node's report: one probe per VG of the thin storages it may use,
    each with how our last LVM change on it ended (``health``); ``metadata``
    warns of a VG's metadata running low."""
    thin = {storeid: storage for storeid, storage in config.lvm_storages.items()
            if storage.thin is not None and not storage.disabled and storage.available_on(node)}
    probes: dict[str, StorageView] = {}
    for storage in thin.values():
        if storage.vgname not in probes:
            view = await probe(storage.vgname, timeout=lvm_timeout, shells=shells)
            metadata.check(view)
            failed = health.take(storage.vgname)
            if view.lvm_ok and failed is not None:
                view = replace(view, lvm_ok=False, error=f"last extension failed: {failed}")
            probes[storage.vgname] = view
    storages = {storeid: probes[s.vgname] for storeid, s in sorted(thin.items())}
    return NodeReport(node=node, time=time.time(), interval=interval, storages=storages)


async def report_loop(settings: DaemonSettings, config: Callable[[], StorageConfig],
                      health: LvmHealth, failures: Failures, stop: asyncio.Event, *,
                      shells: LvmShells | None = None) -> None:
    """Probe every ``report_interval`` and publish this node's report when it
    changed or its heartbeat is due (:func:`publish_due`) until
    ``stop``; problems said once per change. Its ``vgs`` run in the VGs' lvm
    ``shells`` when there are any."""
    published: NodeReport | None = None
    metadata = MetadataWatch()
    while not stop.is_set():
        try:
            report = await make_report(
                settings.node, config(), health, interval=settings.report_interval,
                lvm_timeout=settings.lvm_timeout, metadata=metadata, shells=shells)
            if publish_due(published, report):
                publish(settings.reports_dir, report)
                published = report
        except (OSError, PvestordError) as err:
            failures.note_error((0, "report"), f"cannot publish this node's report in "
                                f"{settings.reports_dir}: {err}", logging.WARNING)
        else:
            failures.clear_error((0, "report"), "node report published again")
            for storeid, view in report.storages.items():
                problem = view.problem()
                if problem is None:
                    failures.clear_error((0, f"vg {view.vg}"), f"VG {view.vg} healthy again")
                else:
                    failures.note_error((0, f"vg {view.vg}"), f"storage {storeid}: {problem}",
                                        logging.WARNING, VG=view.vg)
        await asyncio.sleep(settings.report_interval)


def publish_stopped(settings: DaemonSettings) -> None:
    """Tell rank-nodes at once that this node extends nothing now."""
    report = NodeReport(node=settings.node, time=time.time(),
                                   interval=settings.report_interval, stopped=True)
    try:
        publish(settings.reports_dir, report)
    except (OSError, PvestordError) as err:
        log.warning("cannot mark this node's report stopped: %s", err)
