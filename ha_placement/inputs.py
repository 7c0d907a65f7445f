"""Readers: a Proxmox cluster folder (``/etc/pve`` or a copy) and a simulator test folder.

The only I/O of the package. Both produce a :class:`Cluster`; the simulator
folder (pve-ha-manager's ``src/test/test-*/`` format) also gives its
``cmdlist`` as events.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from ha_placement.errors import HaPlacementError
from ha_placement.events import Unsupported, sim_events
from ha_placement.model import (
    Cluster,
    Event,
    NodeFacts,
    ServiceConfig,
    ServiceStatus,
)
from ha_placement.rules import (
    Group,
    groups_from_sections,
    normalize_sid,
    rules_from_sections,
)
from ha_placement.scores import GuestSize, NodeCapacity
from ha_placement.sectionconfig import parse_sections

MIB = 1024 ** 2
#: The simulator's defaults (Sim/Hardware.pm) when a test gives no stats.
SIM_NODE_CAPACITY = NodeCapacity(24.0, 131072.0 * MIB)
SIM_GUEST_SIZE = GuestSize(4.0, 4096.0 * MIB)


class InputError(HaPlacementError):
    """A cluster or test folder that cannot be read."""


def _json(path: Path, default: Any = None) -> Any:
    text = _text(path)
    try:
        return json.loads(text) if text.strip() else default
    except ValueError as err:
        raise InputError(f"{path} is not JSON: {err}") from err


def _text(path: Path) -> str:
    """The file's text, empty when it is missing."""
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return ""
    except UnicodeDecodeError as err:
        # Hand-edited files (a guest's description, say) may be in another
        # encoding; Proxmox writes UTF-8 and so must whoever edits them.
        raise InputError(f"{path} is not UTF-8 text (byte {err.start}): "
                         "convert it to UTF-8") from err
    except OSError as err:
        raise InputError(f"cannot read {path}: {err}") from err


def _whole_number(where: str, field: str, value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError) as err:
        raise InputError(f"{where}: {field} {value!r} is not a whole number") from err


def _number(where: str, field: str, value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError) as err:
        raise InputError(f"{where}: {field} {value!r} is not a number") from err


def _status(data: Mapping[str, Any]) -> dict[str, ServiceStatus]:
    out = {}
    for sid, sd in (data.get("service_status") or {}).items():
        if not isinstance(sd, dict) or "state" not in sd or "node" not in sd:
            continue
        out[sid] = ServiceStatus(sd["state"], sd["node"], sd.get("target"),
                                 sd.get("maintenance_node"), tuple(sd.get("failed_nodes") or ()))
    return out


def _requests(data: Mapping[str, Any]) -> frozenset[str]:
    return frozenset(n for n, r in (data.get("node_request") or {}).items()
                     if isinstance(r, dict) and r.get("maintenance"))


def _service_state(value: str | None, default: str) -> str:
    state = (value or default).strip()
    return "started" if state == "enabled" else state


# ---- simulator test folders


def read_sim_test(folder: Path) -> tuple[Cluster, list[Event]]:
    """A pve-ha-manager simulator test folder: the cluster, and its ``cmdlist`` as events."""
    if not (folder / "cmdlist").is_file():
        raise InputError(f"{folder} has no cmdlist: not a simulator test folder")
    steps = _json(folder / "cmdlist", [])
    hardware = _json(folder / "hardware_status")
    if hardware is None:
        hardware = {n: {"power": "off", "network": "off", "maxcpu": SIM_NODE_CAPACITY.maxcpu,
                        "maxmem": SIM_NODE_CAPACITY.maxmem} for n in ("node1", "node2", "node3")}
    nodes = {n: NodeFacts(n, power=h.get("power") == "on", network=h.get("network") == "on")
             for n, h in sorted(hardware.items())}
    capacity = {n: NodeCapacity(_number(f"{folder / 'hardware_status'}: {n}", "maxcpu",
                                        h["maxcpu"]),
                                _number(f"{folder / 'hardware_status'}: {n}", "maxmem",
                                        h["maxmem"]))
                for n, h in hardware.items() if "maxcpu" in h and "maxmem" in h}
    config = _json(folder / "service_config")
    if config is None:
        config = {"vm:101": {"node": "node1"}, "vm:102": {"node": "node2"},
                  "vm:103": {"node": "node3"}, "vm:104": {"node": "node1"},
                  "vm:105": {"node": "node2"}, "vm:106": {"node": "node3"}}
    config_file = folder / "service_config"
    services = {sid: ServiceConfig(sid, c["node"], _service_state(c.get("state"), "disabled"),
                                   failback=bool(c.get("failback", 1)),
                                   max_restart=_whole_number(f"{config_file}: {sid}",
                                                             "max_restart",
                                                             c.get("max_restart", 1)),
                                   max_relocate=_whole_number(f"{config_file}: {sid}",
                                                              "max_relocate",
                                                              c.get("max_relocate", 1)),
                                   group=c.get("group"))
                for sid, c in sorted(config.items())}
    stats = _json(folder / "static_service_stats")
    stats_file = folder / "static_service_stats"
    sizes = ({sid: GuestSize(_number(f"{stats_file}: {sid}", "maxcpu", s.get("maxcpu", 0)),
                             _number(f"{stats_file}: {sid}", "maxmem", s.get("maxmem", 0)))
              for sid, s in stats.items()} if stats is not None
             else {sid: SIM_GUEST_SIZE for sid in services})
    dc_file = str(folder / "datacenter.cfg")
    dc = _json(folder / "datacenter.cfg", {}) or {}
    crs = dc.get("crs") or {}
    manager = _json(folder / "manager_status", {}) or {}
    ids, order = rules_from_sections(parse_sections(_text(folder / "rules_config")))
    groups = groups_from_sections(parse_sections(_text(folder / "groups")))
    cluster = Cluster(
        nodes=nodes, services=services, rules=ids, rule_order=order, groups=groups,
        node_status=dict(manager.get("node_status") or {}), service_status=_status(manager),
        maintenance_requests=_requests(manager),
        crs=str(crs.get("ha", "basic")),
        rebalance_on_start=bool(crs.get("ha-rebalance-on-start", 0)),
        auto_rebalance=bool(crs.get("ha-auto-rebalance", 0)),
        rebalance_threshold=_number(dc_file, "ha-auto-rebalance-threshold",
                                    crs.get("ha-auto-rebalance-threshold", 0.3)),
        rebalance_margin=_number(dc_file, "ha-auto-rebalance-margin",
                                 crs.get("ha-auto-rebalance-margin", 0.1)),
        rebalance_method=str(crs.get("ha-auto-rebalance-method", "bruteforce")),
        rebalance_hold=_whole_number(dc_file, "ha-auto-rebalance-hold-duration",
                                     crs.get("ha-auto-rebalance-hold-duration", 3)),
        shutdown_policy=str((dc.get("ha") or {}).get("shutdown_policy", "conditional")),
        capacity=capacity, sizes=sizes, disarmed=bool(manager.get("disarm")),
        source=f"simulator test {folder}")
    return cluster, sim_events(steps)


def read_sim_scenario(folder: Path, events: Sequence[Event] = (),
                      crs: str | None = None) -> tuple[Cluster, list[Event]]:
    """A simulator test folder as ``pvestord placement --sim-test`` plays it.

    The cmdlist's first step (pve-ha-manager's tests power the nodes on there)
    is the starting point ``events`` need: they follow that step, in
    place of the rest of the cmdlist; with none the whole cmdlist is played.
    ``crs``, when given, overrides the folder's datacenter.cfg. A command the
    model does not cover is an :class:`InputError` naming the folder.
    """
    try:
        cluster, steps = read_sim_test(folder)
    except Unsupported as err:
        raise InputError(f"{folder}: the model does not cover {err}") from err
    if crs:
        cluster = replace(cluster, crs=crs)
    return cluster, [*steps[:1], *events] if events else steps


# ---- a Proxmox cluster folder


def _property_string(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for part in text.split(","):
        key, sep, value = part.strip().partition("=")
        if sep:
            out[key.strip()] = value.strip()
    return out


def read_datacenter(text: str) -> dict[str, dict[str, str]]:
    """``crs: ha=static,ha-rebalance-on-start=1`` and ``ha: shutdown_policy=migrate``."""
    out: dict[str, dict[str, str]] = {}
    for line in text.splitlines():
        match = re.match(r"^(crs|ha):\s*(.*)$", line.strip())
        if match:
            out[match.group(1)] = _property_string(match.group(2))
    return out


def _guest_size(text: str, kind: str) -> tuple[GuestSize, bool]:
    conf: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("["):
            break  # snapshots follow; the current config comes first
        key, sep, value = line.partition(":")
        if sep:
            conf[key.strip()] = value.strip()
    locked = "lock" in conf

    def number(key: str, default: float) -> float:
        try:
            return float(conf[key])
        except (KeyError, ValueError):
            return default

    if kind == "vm":
        cpu = number("vcpus", 0) or number("sockets", 1) * number("cores", 1)
        mem = number("memory", 512)
    else:
        cpu = number("cpulimit", 0) or number("cores", 0)
        mem = number("memory", 512)
    return GuestSize(cpu, mem * MIB), locked


def read_pve_dir(folder: Path, guests_file: Path | None = None,
                 crs_override: str | None = None,
                 shutdown_policy: str | None = None) -> Cluster:
    """A Proxmox cluster folder as the HA manager would read it."""
    ha = folder / "ha"
    if not ha.is_dir() and not (folder / ".members").exists():
        raise InputError(f"{folder} has neither ha/ nor .members: not a Proxmox cluster folder")
    members = _json(folder / ".members", {}) or {}
    nodelist = members.get("nodelist") or {}
    manager = _json(ha / "manager_status", {}) or {}
    vmlist = (_json(folder / ".vmlist", {}) or {}).get("ids") or {}
    node_names = set(nodelist) | set(manager.get("node_status") or {})
    nodes_dir = folder / "nodes"
    if nodes_dir.is_dir():
        node_names |= {p.name for p in nodes_dir.iterdir() if p.is_dir()}
    known = dict(manager.get("node_status") or {})
    nodes = {}
    for name in sorted(node_names):
        if nodelist:
            online = bool((nodelist.get(name) or {}).get("online"))
        else:
            # No .members (a copied tree): the manager's view of the node is all there is.
            online = known.get(name) in ("online", "maintenance")
        lrm = _json(nodes_dir / name / "lrm_status", {}) or {}
        nodes[name] = NodeFacts(name, power=online, network=online,
                                lrm_mode=str(lrm.get("mode") or "active"))
    status = _status(manager)
    services = {}
    resources_file = ha / "resources.cfg"
    for section in parse_sections(_text(resources_file)):
        if section.kind not in ("vm", "ct"):
            continue
        sid = normalize_sid(f"{section.kind}:{section.ident}")
        if sid is None:
            continue
        opts = dict(section.options)
        node = status[sid].node if sid in status else \
            (vmlist.get(section.ident) or {}).get("node")
        if node is None:
            continue
        services[sid] = ServiceConfig(
            sid, node, _service_state(opts.get("state"), "started"),
            failback=(opts.get("failback") or "1").strip() != "0",
            max_restart=_whole_number(f"{resources_file}: {sid}", "max_restart",
                                      opts.get("max_restart") or 1),
            max_relocate=_whole_number(f"{resources_file}: {sid}", "max_relocate",
                                       opts.get("max_relocate") or 1),
            group=opts.get("group"))
    ids, order = rules_from_sections(parse_sections(_text(ha / "rules.cfg")))
    groups: dict[str, Group] = groups_from_sections(parse_sections(_text(ha / "groups.cfg")))
    dc_file = folder / "datacenter.cfg"
    dc = read_datacenter(_text(dc_file))
    crs = dc.get("crs", {})

    sizes: dict[str, GuestSize] = {}
    locked: set[str] = set()
    for vmid, entry in vmlist.items():
        kind = "ct" if entry.get("type") == "lxc" else "vm"
        conf_dir = "lxc" if kind == "ct" else "qemu-server"
        path = nodes_dir / str(entry.get("node")) / conf_dir / f"{vmid}.conf"
        text = _text(path)
        if text:
            size, is_locked = _guest_size(text, kind)
            sizes[f"{kind}:{vmid}"] = size
            if is_locked:
                locked.add(f"{kind}:{vmid}")
    capacity: dict[str, NodeCapacity] = {}
    other_guests: dict[str, str] = {}
    if guests_file is not None:
        resources = _json(guests_file)
        if not isinstance(resources, list):
            raise InputError(f"{guests_file}: expected the JSON list of 'pvesh get "
                             "/cluster/resources --output-format json'")
        for res in resources:
            if not isinstance(res, dict):
                continue
            if res.get("type") == "node" and "maxcpu" in res and "maxmem" in res:
                where = f"{guests_file}: node {res.get('node')}"
                capacity[str(res.get("node"))] = NodeCapacity(
                    _number(where, "maxcpu", res["maxcpu"]),
                    _number(where, "maxmem", res["maxmem"]))
            elif res.get("type") in ("qemu", "lxc") and "vmid" in res:
                sid = f"{'ct' if res['type'] == 'lxc' else 'vm'}:{res['vmid']}"
                if sid not in sizes and "maxcpu" in res and "maxmem" in res:
                    sizes[sid] = GuestSize(_number(f"{guests_file}: {sid}", "maxcpu",
                                                   res["maxcpu"]),
                                           _number(f"{guests_file}: {sid}", "maxmem",
                                                   res["maxmem"]))
                if res.get("status") == "running" and sid not in services:
                    other_guests[sid] = str(res.get("node"))
    quorate = (members.get("cluster") or {}).get("quorate")
    return Cluster(
        nodes=nodes, services=services, rules=ids, rule_order=order, groups=groups,
        node_status=dict(manager.get("node_status") or {}), service_status=status,
        maintenance_requests=_requests(manager),
        crs=crs_override or crs.get("ha", "basic"),
        rebalance_on_start=crs.get("ha-rebalance-on-start", "0") == "1",
        auto_rebalance=crs.get("ha-auto-rebalance", "0") == "1",
        rebalance_threshold=_number(f"{dc_file}: crs", "ha-auto-rebalance-threshold",
                                    crs.get("ha-auto-rebalance-threshold", "0.3")),
        rebalance_margin=_number(f"{dc_file}: crs", "ha-auto-rebalance-margin",
                                 crs.get("ha-auto-rebalance-margin", "0.1")),
        rebalance_method=crs.get("ha-auto-rebalance-method", "bruteforce"),
        rebalance_hold=_whole_number(f"{dc_file}: crs", "ha-auto-rebalance-hold-duration",
                                     crs.get("ha-auto-rebalance-hold-duration", "3")),
        shutdown_policy=shutdown_policy or dc.get("ha", {}).get("shutdown_policy",
                                                                "conditional"),
        capacity=capacity, sizes=sizes, other_guests=other_guests,
        quorate=None if quorate is None else bool(quorate),
        disarmed=bool(manager.get("disarm")), locked=frozenset(locked),
        source=f"cluster folder {folder}")


_DISK_KEY = re.compile(r"^(scsi|virtio|sata|ide|efidisk|tpmstate|unused|rootfs|mp)\d*$")


def read_guest_storages(folder: Path) -> dict[str, set[str]]:
    """{sid: storage ids its volumes are on}, from the guest configs of a cluster folder."""
    out: dict[str, set[str]] = {}
    vmlist = (_json(folder / ".vmlist", {}) or {}).get("ids") or {}
    for vmid, entry in vmlist.items():
        kind = "ct" if entry.get("type") == "lxc" else "vm"
        conf_dir = "lxc" if kind == "ct" else "qemu-server"
        text = _text(folder / "nodes" / str(entry.get("node")) / conf_dir / f"{vmid}.conf")
        stores: set[str] = set()
        for line in text.splitlines():
            if line.startswith("["):
                break
            key, sep, value = line.partition(":")
            if not sep or not _DISK_KEY.match(key.strip()):
                continue
            volume = value.strip().split(",", 1)[0]
            storeid, colon, _ = volume.partition(":")
            if colon and storeid and storeid != "none":
                stores.add(storeid)
        out[f"{kind}:{vmid}"] = stores
    return out
