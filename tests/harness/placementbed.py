"""Inputs for the placement model's unit tests (``pvestord placement``, ha_placement).

:data:`FIXTURES` is the folder of the project's own scenarios
(``tests/fixtures/placement/*.json``: nodes, resources, rules, events,
expected decisions); :func:`write_pve_dir` writes a scenario's facts as the
cluster folder ``/etc/pve`` that ha_placement.inputs reads (HA resources,
rules and manager status, members, VM list and configs).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "placement"


def write_pve_dir(root: Path, facts: dict[str, Any], *, thin: bool = False) -> Path:
    """Write ``facts`` (a scenario's) under ``root`` as a cluster folder; with
    ``thin``, each VM has a disk on the thin storage ``san``."""
    ha = root / "ha"
    ha.mkdir(parents=True)
    resources = "".join(f"vm: {sid.split(':')[1]}\n\tstate started\n\n"
                        for sid in facts["services"])
    (ha / "resources.cfg").write_text(resources)
    rules = ""
    for rule in facts["rules"]:
        rules += f"{rule['type']}: {rule['id']}\n\tresources {','.join(rule['resources'])}\n"
        if rule["type"] == "node-affinity":
            rules += "\tnodes " + ",".join(f"{n}:{p}" for n, p in rule["nodes"].items()) + "\n"
        else:
            rules += f"\taffinity {rule['affinity']}\n"
        rules += "\n"
    (ha / "rules.cfg").write_text(rules)
    (ha / "manager_status").write_text(json.dumps({
        "master_node": facts["nodes"][0],
        "node_status": {n: "online" for n in facts["nodes"]},
        "service_status": {sid: {"state": "started", "node": s["node"], "uid": "x"}
                           for sid, s in facts["services"].items()}}))
    (root / ".members").write_text(json.dumps({
        "nodename": facts["nodes"][0], "cluster": {"name": "c", "nodes": 3, "quorate": 1},
        "nodelist": {n: {"id": i, "online": 1} for i, n in enumerate(facts["nodes"], 1)}}))
    (root / ".vmlist").write_text(json.dumps({"ids": {
        sid.split(":")[1]: {"node": s["node"], "type": "qemu", "version": 1}
        for sid, s in facts["services"].items()}}))
    for node in facts["nodes"]:
        (root / "nodes" / node / "qemu-server").mkdir(parents=True)
        (root / "nodes" / node / "lrm_status").write_text('{"mode": "active"}')
    for sid, s in facts["services"].items():
        disk = "scsi0: san:vm-{0}-disk-0.qcow2,size=4G\n" if thin else ""
        (root / "nodes" / s["node"] / "qemu-server" / f"{sid.split(':')[1]}.conf").write_text(
            "memory: 2048\ncores: 2\n" + disk.format(sid.split(":")[1]))
    (root / "datacenter.cfg").write_text("keyboard: en-us\n")
    return root
