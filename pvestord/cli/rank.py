"""``pvestord rank-nodes VMID``: which nodes can run a guest's thin volumes.

The command behind the ``rank_nodes`` hook proposed for Proxmox's HA
rebalancer; see :mod:`pvestord.features.ranking` for the rules and
:mod:`pvestord.engine.nodereport` for what every node publishes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path

from pvestord import paths
from pvestord.adapters import lvm
from pvestord.adapters.config import StorageConfig, load_storage_config
from pvestord.adapters.vmlvs import find_vm_lvs
from pvestord.cli import options
from pvestord.engine import nodereport
from pvestord.errors import PvestordError
from pvestord.features import ranking
from pvestord.policy.volumes import check_vmid


class RankError(PvestordError):
    """The guest's storages cannot be found out."""


def _names(text: str) -> list[str]:
    """A comma-separated list of names, blanks dropped (an option's value)."""
    return [name for name in (part.strip() for part in text.split(",")) if name]


def register(sub: options.SubCommands) -> None:
    rank = options.add_command(
        sub, "rank-nodes", _run, "order the nodes that can run a VM's thin volumes",
        epilog="Exit status: 0 when at least one candidate is eligible, 3 when none is, 1 on "
        "error.")
    rank.add_argument("vmid", type=int, metavar="VMID")
    # Both narrow the judgement to names given as one comma-separated value.
    for flag, metavar, meaning in (
        ("--candidates", "NODE,NODE,...", "the nodes to judge, in order of preference "
         "(default: every node with a report, by name)"),
        ("--storages", "STOREID,...", "the VM's thin storages (default: those holding an "
         "LV of its disks and their snapshot LVs, as this node's LVM lists them)"),
    ):
        rank.add_argument(flag, type=_names, metavar=metavar, help=meaning)
    options.add_stale_after_option(rank, ranking.DEFAULT_STALE_AFTER,
                                   "ignore reports older than this")
    rank.add_argument("--nodes-dir", type=Path, default=None, metavar="DIR",
                      help="where the node reports live (default: 'nodes' beside the queue, "
                      "/etc/pve/nodes)")
    rank.add_argument("--storage-config", type=Path, default=paths.STORAGE_CFG,
                      metavar="PATH", help="storage.cfg (default: %(default)s)")
    options.add_json_option(rank)


async def vm_storages(config: StorageConfig, vmid: int) -> set[str]:
    """The thin storages holding an LV of ``vmid``'s qcow2 chains (its disks and
    their ``snap_vm-<vmid>-*`` snapshot LVs), by this node's LVM."""
    def failed(storeid: str, vgname: str, err: lvm.LvmError) -> RankError:
        return RankError(f"cannot list VG {vgname} of storage {storeid} here "
                         f"({err}): name the VM's storages with --storages")

    lvs = await find_vm_lvs(config, vmid, active_only=False, failed=failed)
    return {storage.storeid for storage, _ in lvs}


def _run(args: argparse.Namespace) -> int:
    """Judge every candidate node for the VM's thin volumes from the reports
    each node's pvestord publishes: nodes that cannot see a VG of the VM, miss PVs of
    it, whose last LVM command on it failed, whose pvestord is stopped or whose report
    is stale are left out, each with its reasons. The others come first, in the order
    given."""
    vmid = check_vmid(args.vmid)
    config = load_storage_config(args.storage_config)
    storages: list[str] | None = args.storages
    if storages is None:
        storages = sorted(asyncio.run(vm_storages(config, vmid)))
        if not storages:
            raise RankError(f"VM {vmid} has no LV on a thin storage: nothing to rank for")
    else:
        unknown = [s for s in storages if config.get(s) is None]
        if unknown:
            raise RankError(f"not a thin storage in {args.storage_config}: "
                            f"{', '.join(unknown)}")
    nodes_dir = args.nodes_dir if args.nodes_dir is not None else paths.nodes_dir(args.queue)
    reports, problems = nodereport.read_reports(nodes_dir)
    ranked = ranking.rank_nodes(storages, args.candidates, reports, problems,
                                now=time.time(), stale_after=args.stale_after)
    if args.json:
        print(json.dumps({"vmid": vmid, "storages": storages,
                          "nodes": [r.to_json() for r in ranked]}, indent=2))
    else:
        print(f"VM {vmid} on {', '.join(storages)}:")
        for r in ranked:
            age = "no report" if r.report_age is None else f"report {r.report_age:.0f} s old"
            verdict = "eligible" if r.eligible else "left out"
            print(f"  {r.node}: {verdict} ({age})")
            for line in (*r.reasons, *(f"warning: {w}" for w in r.warnings)):
                print(f"    {line}")
        if not ranked:
            print(f"  (no node reports in {nodes_dir})")
    return 0 if any(r.eligible for r in ranked) else 3
