"""Everything ``pvestord run`` can be told, checked once when the daemon starts.

Apart from the storage configuration because it comes from another place
(the command line, not ``storage.cfg``) and changes only with a restart,
while the storage configuration is re-read whenever the file changes.
"""

from __future__ import annotations

import math
import socket
from dataclasses import dataclass, field, fields
from pathlib import Path

from pvestord import paths
from pvestord.adapters import budgets, keptsections, preparedjobs, vghealth
from pvestord.adapters.command import KILL_WAIT
from pvestord.errors import ConfigError
from pvestord.policy import proxmox


def _seconds(default: float) -> float:
    """A field that holds a duration in seconds: checked positive and finite."""
    return field(default=default, metadata={"seconds": True})


def _short_hostname() -> str:
    # Proxmox node names are the short host name (PVE::INotify::nodename).
    return proxmox.node_name(socket.gethostname())


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
    poll_interval: float = _seconds(2.0)
    #: Seconds between full reconcile passes (every thin drive of every local
    #: VM: threshold armed, headroom, not paused on ENOSPC). Events are the
    #: fast path; this is what makes correctness independent of them.
    reconcile_interval: float = _seconds(30.0)
    #: Budget of one LVM command (``lvs``, ``lvextend``, a migration's
    #: refresh). It runs under the storage lock, and a change starts only
    #: while the lock is guaranteed for this plus the wait after a kill
    #: (checked below against ``lock_lifetime``; :mod:`pvestord.adapters.budgets`).
    lvm_timeout: float = _seconds(budgets.LVM_DAEMON)
    #: Budget of one QMP session (connect, batch, disconnect). qemu-server
    #: shares the socket, so a connection may wait for its turn.
    qmp_timeout: float = _seconds(10.0)
    #: Budget of one ``qemu-img info`` / ``measure`` (metadata only).
    qemu_img_timeout: float = _seconds(30.0)
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
    report_interval: float = _seconds(10.0)
    #: How long a storage lock directory lives after its holder's last
    #: renewal. pmxcfs's is 120 s and cannot be made longer; on a plain
    #: folder (``lock_dir`` off pmxcfs: the two-node bed, tests) the emulated
    #: expiry uses this, so that tests can shorten it.
    lock_lifetime: float = _seconds(budgets.PMXCFS_LOCK_EXPIRY)
    #: Seconds a pass over one VM may take before it is abandoned (cancelled,
    #: logged, the VG it was changing marked unhealthy). A normal pass takes
    #: well under a second; every wait in it has its own budget (QMP 10 s per
    #: call, the storage lock 10 s, LVM 30 s per command), so only a wait that
    #: ignores its budget (an ``lvm`` in D state) gets here.
    pass_deadline: float = _seconds(180.0)
    #: Where the marks of VGs this node must not change any more live
    #: (:mod:`pvestord.adapters.vghealth`).
    vg_health_dir: Path = vghealth.DEFAULT_DIR
    #: Node-local state that must outlive a restart and a rewrite of
    #: /etc/pve: the copy of storage.cfg's ``pvestord:`` sections
    #: (:mod:`pvestord.adapters.keptsections`). None: ``/var/lib/pvestord``
    #: for the node's daemon, and a ``state`` folder beside the VG marks for
    #: a daemon given its own marks folder (a test's, which must not write
    #: the node's state), as the status file follows them too.
    state_dir: Path | None = None

    @property
    def kept_sections(self) -> Path:
        if self.state_dir is not None:
            folder = self.state_dir
        elif self.vg_health_dir == vghealth.DEFAULT_DIR:
            folder = paths.STATE_DIR
        else:
            folder = self.vg_health_dir.parent / "state"
        return folder / keptsections.FILE_NAME

    @property
    def prepared_jobs(self) -> Path:
        """Where the storage plugin records the snapshot deletes it prepared."""
        return preparedjobs.folder_beside(self.vg_health_dir)

    @property
    def reports_dir(self) -> Path:
        return self.nodes_dir if self.nodes_dir is not None else paths.nodes_dir(self.queue)

    def __post_init__(self) -> None:
        for setting in fields(self):
            if not setting.metadata.get("seconds"):
                continue
            value = getattr(self, setting.name)
            if not (math.isfinite(value) and value > 0):
                raise ConfigError(f"{setting.name.replace('_', '-')} = {value}: must be a"
                                  " positive number of seconds")
        # An LVM change starts only while the lock is guaranteed for its whole
        # budget (Held.require): with renewals every RENEW_SHARE of the
        # lifetime, that is at least (1 - RENEW_SHARE) of it, less the margin.
        # lvm_timeout is the budget of every LVM change made under these
        # settings' locks: the daemon's extensions and refreshes, and the
        # migration hint's (pvestord.features.migrationhint).
        guaranteed = budgets.guaranteed_hold(self.lock_lifetime)
        if self.lvm_timeout + KILL_WAIT > guaranteed:
            raise ConfigError(
                f"lvm-timeout = {self.lvm_timeout:g} s: with {KILL_WAIT:g} s to see a killed"
                f" command end, it must fit in the {guaranteed:.1f} s a storage lock of"
                f" lifetime {self.lock_lifetime:g} s is surely held; otherwise no LVM change"
                " could ever start")
        if not self.node:
            raise ConfigError("node name is empty")
