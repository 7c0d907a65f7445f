"""Whether a VM may run on another node, from pmxcfs's files as read.

Shrinking a volume needs proof that no node can write it. LVM cannot see
another node's activations (no lvmlockd), and Proxmox keeps no run marker in
``/etc/pve``, so the proof is the ownership pmxcfs keeps: a VM runs only on the
node holding its config (``qm start`` refuses elsewhere; a live migration
moves the config only once the source QEMU is gone), and pmxcfs's ``.vmlist``
names that node. We require quorum, from ``.members``, and ``.vmlist`` naming
this node. pvestatd's status broadcast (``.rrd``) is supporting evidence
only: it can refuse, never allow (see :mod:`pvestord.features.volumes.shrinking`).

Every function here takes the files' text; reading them is the feature's job.
"""

from __future__ import annotations

import json
from dataclasses import dataclass


@dataclass(frozen=True)
class ClusterReport:
    """One node's status line for a VM, from pmxcfs's ``.rrd``."""

    vmid: int
    status: str
    uptime: int
    #: When the reporting node sent it (epoch seconds), if given.
    ctime: int | None
    #: Where ``.vmlist`` says the VM lives, if known.
    node: str | None

    @property
    def running(self) -> bool:
        return self.status not in ("", "stopped") or self.uptime > 0


def parse_rrd(text: str, vmid: int) -> tuple[str, int, int | None] | None:
    """``(status, uptime, ctime)`` of ``vmid`` from a ``.rrd`` dump, or None.

    Lines are ``<key>:<values separated by ':'>``. ``pve2.3-vm/<vmid>``:
    uptime, name, status, template, ctime, ...; the older ``pve2-vm/<vmid>``
    has no status field (running means uptime > 0), as ``PVE::API2Tools``
    reads them.
    """
    found: tuple[str, int, int | None] | None = None
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        values = rest.split(":")
        if key == f"pve2.3-vm/{vmid}":
            status = values[2] if len(values) > 2 else ""
            ctime = _int_or_none(values[4]) if len(values) > 4 else None
            return status, _int_or_none(values[0]) or 0, ctime
        if key == f"pve2-vm/{vmid}" and found is None:
            uptime = _int_or_none(values[0]) or 0
            found = ("running" if uptime else "stopped", uptime, None)
    return found


def _int_or_none(text: str) -> int | None:
    try:
        return int(float(text))
    except ValueError:
        return None


@dataclass(frozen=True)
class Membership:
    """pmxcfs's ``.members``: this node's name and whether it has quorum."""

    nodename: str
    #: False on a standalone node (pmxcfs without corosync: no ``cluster`` key).
    clustered: bool
    quorate: bool


def parse_members(text: str) -> Membership | None:
    """``.members`` as pmxcfs writes it, or None when it is not that.

    Clustered: ``{"nodename": N, "version": V, "cluster": {"name": ...,
    "version": ..., "nodes": ..., "quorate": 0|1}, "nodelist": {...}}``;
    standalone (or before corosync told pmxcfs anything): ``{"nodename": N,
    "version": V}``.
    """
    try:
        data = json.loads(text)
    except ValueError:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("nodename"), str):
        return None
    cluster = data.get("cluster")
    if cluster is None:
        return Membership(data["nodename"], clustered=False, quorate=True)
    if not isinstance(cluster, dict):
        return None
    return Membership(data["nodename"], clustered=True, quorate=cluster.get("quorate") == 1)


def vmlist_owner(text: str, vmid: int) -> str | None:
    """The node ``.vmlist`` says holds ``vmid``'s config, or None (unknown VMID or
    not a VM list: ``{"version": V, "ids": {"<vmid>": {"node": N, ...}}}``)."""
    try:
        node = json.loads(text)["ids"][str(vmid)]["node"]
    except (ValueError, KeyError, TypeError):
        return None
    return node if isinstance(node, str) and node else None


@dataclass(frozen=True)
class ClusterView:
    """What the cluster folder says, as read; None where a file was unreadable."""

    members: str | None
    vmlist: str | None
    rrd: str | None
    #: ``corosync.conf`` exists: this node is (or is joining) a cluster.
    corosync_conf: bool


def cross_node_refusal(view: ClusterView, vmid: int, now: float) -> str | None:
    """Why shrinking ``vmid`` is not proven safe from the other nodes' side, or None.

    Proof is quorum plus ``.vmlist`` naming this node (see the module
    docstring); ``.rrd`` can only refuse, never allow.
    """
    if view.members is None:
        return (f"cannot tell whether VM {vmid} runs on another node: .members cannot be "
                "read; is the cluster file system mounted?")
    members = parse_members(view.members)
    if members is None:
        return f"cannot tell whether VM {vmid} runs on another node: .members is unreadable"
    if members.clustered and not members.quorate:
        return (f"node {members.nodename} has no quorum: its view of where VM {vmid} runs "
                "may be stale (another partition may have started it); try again with quorum")
    if not members.clustered and view.corosync_conf:
        return (f"cannot tell whether VM {vmid} runs on another node: the cluster folder has "
                "a corosync.conf but pmxcfs knows no members yet; try again in a moment")
    parsed = parse_rrd(view.rrd, vmid) if view.rrd is not None else None
    if parsed is not None:
        status, uptime, ctime = parsed
        owner = vmlist_owner(view.vmlist, vmid) if view.vmlist is not None else None
        report = ClusterReport(vmid, status, uptime, ctime, owner)
        if report.running:
            where = f"node {owner}" if owner else "a node"
            age = f", reported {max(0, int(now) - ctime)} s ago" if ctime is not None else ""
            return (f"VM {vmid} is {status or 'running'} on {where} according to .rrd{age}; "
                    "stop it first")
    owner = vmlist_owner(view.vmlist, vmid) if view.vmlist is not None else None
    if owner is None:
        return (f"VM {vmid} is in no node's VM list (.vmlist): cannot tell which node owns "
                "it, so nothing proves it runs nowhere; shrink only volumes of existing VMs")
    if owner != members.nodename:
        return (f"VM {vmid}'s configuration is on node {owner}, not on this node "
                f"({members.nodename}): it may run there; shrink it on {owner}")
    return None


def owned_elsewhere(members_text: str | None, vmlist_text: str | None, vmid: int) -> str | None:
    """Why ``vmid``'s LVs must be left alone here because its config is on
    another node, or None: ``.vmlist`` names a node other than this one
    (``.members``' ``nodename``). Only that positive answer refuses; files
    missing or unreadable, or a VMID in no list (a VM being created), say
    nothing. This is the cleanup of a live migration's source: qemu-server
    moves the config, resumes the VM on the target, stops its QEMU here and
    deactivates the volumes here, the target's QEMU writing them meanwhile.
    """
    if members_text is None or vmlist_text is None:
        return None
    members = parse_members(members_text)
    owner = vmlist_owner(vmlist_text, vmid)
    if members is None or owner is None or owner == members.nodename:
        return None
    return (f"VM {vmid}'s configuration is on node {owner}, not on this node "
            f"({members.nodename}): it may run there (a migration away from here)")


__all__ = [
    "ClusterReport", "ClusterView", "Membership", "cross_node_refusal", "owned_elsewhere",
    "parse_members",
    "parse_rrd", "vmlist_owner",
]
