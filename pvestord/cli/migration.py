"""``pvestord migration begin|end VMID --role incoming|outgoing``: the live-migration hint.

What a storage hook (the ``live-migration`` hint proposed for Proxmox's
storage API) calls around a live migration; see :mod:`pvestord.features.migrationhint`.
Correctness does not depend on it: without it the daemons defer and refresh
on their own, possibly with a pause.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json

from pvestord.adapters.config import load_storage_config
from pvestord.cli import options
from pvestord.features import migrationhint as migration
from pvestord.policy.sizes import format_size


def register(sub: options.SubCommands) -> None:
    mig = sub.add_parser(
        "migration", help="live-migration hint: begin/end of a VM's migration on this node",
        description="Tell pvestord a live migration of a VM starts or ends on this node. "
        "outgoing begin: stop extending the VM's thin LVs here and give each one more chunk "
        "first; incoming begin: refresh every thin LV of the VM that another node grew. "
        "Call outgoing begin on the source before incoming begin on the destination.")
    msub = mig.add_subparsers(dest="phase", metavar="PHASE", required=True)
    for phase in ("begin", "end"):
        p = options.add_command(msub, phase, _run, f"the migration {phase}s")
        p.add_argument("vmid", type=int, help="the VM's id")
        p.add_argument("--role", required=True, choices=[r.value for r in migration.Role],
                       help="this node's side of the migration")
        options.add_json_option(p)
        options.add_node_options(p)


def _run(args: argparse.Namespace) -> int:
    settings = options.settings_from(args)
    config = load_storage_config(settings.storage_config)
    role = migration.Role(args.role)
    step = migration.begin if args.phase == "begin" else migration.end
    actions = asyncio.run(step(settings, config, args.vmid, role))
    if args.json:
        print(json.dumps([dataclasses.asdict(a) for a in actions]))
    else:
        for a in actions:
            print(f"{a.vg}/{a.lv}: {a.action} {format_size(a.old)} -> {format_size(a.new)}")
    return 0
