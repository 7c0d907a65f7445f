"""Is the VM running anywhere? This node's pid files and pmxcfs's files, read.

The rules are :mod:`pvestord.policy.cluster`'s; this module reads what they
judge.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

from pvestord.adapters.vms import local_vm
from pvestord.features.volumes.storage import VolumeSettings
from pvestord.policy.cluster import (
    ClusterReport,
    ClusterView,
    cross_node_refusal,
    owned_elsewhere,
    parse_rrd,
    vmlist_owner,
)
from pvestord.policy.volumes import ShrinkRefused


def cluster_report(cluster_dir: Path, vmid: int) -> ClusterReport | None:
    """What the cluster folder's ``.rrd`` says about ``vmid``; None when it says nothing.

    :raises ShrinkRefused: there is no ``.rrd`` to ask (pmxcfs not mounted).
    """
    rrd = cluster_dir / ".rrd"
    try:
        text = rrd.read_text(errors="replace")
    except OSError as err:
        raise ShrinkRefused(
            f"cannot tell whether VM {vmid} runs on another node: {rrd} cannot be read "
            f"({err.strerror}); is the cluster file system mounted?") from err
    parsed = parse_rrd(text, vmid)
    if parsed is None:
        return None
    node = None
    with contextlib.suppress(OSError):
        node = vmlist_owner((cluster_dir / ".vmlist").read_text(errors="replace"), vmid)
    status, uptime, ctime = parsed
    return ClusterReport(vmid, status, uptime, ctime, node)


def read_cluster_view(cluster_dir: Path) -> ClusterView:
    def read(name: str) -> str | None:
        try:
            return (cluster_dir / name).read_text(errors="replace")
        except OSError:
            return None
    return ClusterView(read(".members"), read(".vmlist"), read(".rrd"),
                       (cluster_dir / "corosync.conf").exists())


def refuse_if_running_here(settings: VolumeSettings, vmid: int, *, prefix: str = "",
                           outcome: str = "stop it first") -> None:
    """:raises ShrinkRefused: ``vmid`` runs on this node (its qemu-server pidfile
    names a live QEMU); the message starts with ``prefix`` and ends with ``outcome``."""
    vm = local_vm(settings.run_dir, vmid)
    if vm is not None:
        raise ShrinkRefused(f"{prefix}VM {vmid} is running on this node (pid {vm.pid}); "
                            f"{outcome}")


def refuse_if_owned_elsewhere(settings: VolumeSettings, vmid: int, *, prefix: str = "",
                              outcome: str = "nothing changed") -> None:
    """:raises ShrinkRefused: pmxcfs's ``.vmlist`` places ``vmid`` on another
    node (:func:`owned_elsewhere`); files it cannot read refuse nothing."""
    view = read_cluster_view(settings.cluster_dir)
    why = owned_elsewhere(view.members, view.vmlist, vmid)
    if why is not None:
        raise ShrinkRefused(f"{prefix}{why}; {outcome}")


def refuse_if_running(settings: VolumeSettings, vmid: int) -> None:
    """:raises ShrinkRefused: the VM runs here, or this node cannot prove it runs nowhere
    else (:func:`cross_node_refusal`)."""
    refuse_if_running_here(settings, vmid)
    why = cross_node_refusal(read_cluster_view(settings.cluster_dir), vmid, time.time())
    if why is not None:
        raise ShrinkRefused(f"{why} (cluster folder {settings.cluster_dir})")
