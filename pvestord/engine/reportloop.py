"""The daemon's node-report loop: this node's view of its thin storages,
published every ``report_interval`` for ``rank-nodes``
(:mod:`pvestord.engine.nodereport`)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from pvestord.adapters.config import StorageConfig
from pvestord.adapters.lvmshell import LvmShells
from pvestord.adapters.settings import DaemonSettings
from pvestord.engine import nodereport
from pvestord.engine.failures import Failures
from pvestord.engine.nodereport import LvmHealth
from pvestord.errors import PvestordError

log = logging.getLogger(__name__)


async def report_loop(settings: DaemonSettings, config: Callable[[], StorageConfig],
                      health: LvmHealth, failures: Failures, stop: asyncio.Event, *,
                      shells: LvmShells | None = None) -> None:
    """Probe every ``report_interval`` and publish this node's report when it
    changed or its heartbeat is due (:func:`nodereport.publish_due`) until
    ``stop``; problems said once per change. Its ``vgs`` run in the VGs' lvm
    ``shells`` when there are any."""
    published: nodereport.NodeReport | None = None
    while not stop.is_set():
        try:
            report = await nodereport.make_report(
                settings.node, config(), health, interval=settings.report_interval,
                lvm_timeout=settings.lvm_timeout, shells=shells)
            if nodereport.publish_due(published, report):
                nodereport.publish(settings.reports_dir, report)
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
    report = nodereport.NodeReport(node=settings.node, time=time.time(),
                                   interval=settings.report_interval, stopped=True)
    try:
        nodereport.publish(settings.reports_dir, report)
    except (OSError, PvestordError) as err:
        log.warning("cannot mark this node's report stopped: %s", err)
