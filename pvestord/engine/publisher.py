"""The loop that publishes the daemon's view: status file, metrics, VG accounts.

The drive states and counters are written every :data:`status.STATUS_INTERVAL`
(no LVM, no QMP: a JSON dump and a rename). The VG accounts cost one ``vgs``
and one ``lvs`` per thin VG (in the VG's lvm shell, where one runs), so they
are read every :data:`ACCOUNT_INTERVAL` only; each reading is a growth
sample, and a VG crossing below its ``thin-warn-free`` or
``thin-critical-free`` is warned about once per crossing.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pvestord.adapters import vgspace
from pvestord.adapters.config import StorageConfig
from pvestord.adapters.lvmshell import LvmShells
from pvestord.adapters.service import fields
from pvestord.engine import metrics, status
from pvestord.engine.memory import Notices, silent
from pvestord.errors import PvestordError
from pvestord.policy import capacity
from pvestord.policy.notices import LowSpace, low_space_key
from pvestord.policy.sizes import format_size
from pvestord.policy.vanished import Kept

log = logging.getLogger(__name__)

#: Seconds between two readings of the VG accounts (LVM processes at idle).
ACCOUNT_INTERVAL = 60.0


@dataclass
class DaemonView:
    """What only the daemon knows, handed to each publication."""

    queue_length: int
    errors: dict[tuple[int, str], str]
    deferred: set[int]
    lvm_shell_restarts: int


class Publisher:
    def __init__(self, node: str, activity: status.Activity,
                 storage_config: Callable[[], StorageConfig], *,
                 kept: Callable[[], Mapping[str, Kept]] = dict,
                 status_file: Path = status.STATUS_FILE,
                 metrics_file: Path | None = metrics.METRICS_FILE,
                 shells: LvmShells | None = None,
                 notices: Notices | None = None) -> None:
        self.node = node
        #: A crossing also goes to Proxmox's notifications, once.
        self.notices = notices if notices is not None else silent()
        #: The accounts' ``vgs`` and ``lvs`` run in the VGs' lvm shells.
        self.shells = shells
        self.activity = activity
        self._storage_config = storage_config
        #: The kept ``pvestord:`` sections (:mod:`pvestord.policy.vanished`).
        self._kept = kept
        self.status_file = status_file
        self.metrics_file = metrics_file
        self._samples: dict[str, list[capacity.Sample]] = {}
        self._levels: dict[str, capacity.Level] = {}
        self._accounts: dict[str, dict[str, Any]] = {}
        self._accounted_at = -ACCOUNT_INTERVAL

    async def refresh_accounts(self) -> None:
        now = time.time()
        guards = {s.vgname: s.guards for s in self._storage_config().thin_storages.values()}
        for vg, vg_guards in sorted(guards.items()):
            try:
                account = await vgspace.read_account(
                    vg, maxima=self.activity.maxima(vg), samples=self._samples.get(vg, []),
                    now=now, shells=self.shells)
            except PvestordError as err:
                log.debug("VG %s: no capacity account: %s", vg, err)
                self._accounts.pop(vg, None)
                continue
            samples = [*self._samples.get(vg, []),
                       capacity.Sample(now, account.size - account.free)]
            self._samples[vg] = capacity.keep_samples(samples, now)
            level = capacity.level(account.free, account.size, vg_guards)
            if capacity.warn_now(self._levels.get(vg), level):
                limit = (vg_guards.critical_free if level is capacity.Level.CRITICAL
                         else vg_guards.warn_free)
                log.warning("%s: below its thin-%s-free of %s%s", account,
                            "critical" if level is capacity.Level.CRITICAL else "warn", limit,
                            "; new thin volumes are refused" if level is capacity.Level.CRITICAL
                            else "", extra=fields(VG=vg, CAPACITY_LEVEL=level.name.lower(),
                                                  VG_FREE=account.free))
                self.notices.seen(LowSpace(vg, level.name.lower(), format_size(account.free),
                                           format_size(account.size), str(limit)))
            elif level is capacity.Level.OK:
                self.notices.over(low_space_key(vg))
            else:
                # Back from critical to warn: critical again is a new crossing.
                self.notices.lowered(low_space_key(vg), int(level))
            self._levels[vg] = level
            self._accounts[vg] = status.account_view(account, level)
        for gone in set(self._accounts) - set(guards):
            del self._accounts[gone]

    def publish(self, view: DaemonView) -> dict[str, Any]:
        drives = status.drive_rows(self.activity, errors=view.errors, deferred=view.deferred)
        paused = len({d.vmid for d in drives if d.paused_nospace})
        snap = status.snapshot(
            node=self.node, pid=os.getpid(), now=time.time(), activity=self.activity,
            drives=drives, queue_length=view.queue_length, paused_vms=paused,
            accounts=self._accounts, lvm_shell_restarts=view.lvm_shell_restarts,
            sections=self._kept())
        status.publish(self.status_file, snap)
        if self.metrics_file is not None and self.metrics_file.parent.is_dir():
            # No node_exporter folder: no node_exporter to read it; not created for it.
            status.write_atomically(self.metrics_file, metrics.render(snap))
        return snap

    async def loop(self, view: Callable[[], DaemonView]) -> None:
        while True:
            try:
                if time.monotonic() - self._accounted_at >= ACCOUNT_INTERVAL:
                    self._accounted_at = time.monotonic()
                    await self.refresh_accounts()
                self.publish(view())
            except (OSError, PvestordError) as err:
                log.warning("cannot publish the daemon's status in %s: %s",
                            self.status_file, err)
            except Exception as err:  # the extensions must outlive any bug in a view
                log.exception("publishing the daemon's status failed: %r", err)
            await asyncio.sleep(status.STATUS_INTERVAL)
