"""``pvestord placement [EVENT ...]``: where Proxmox HA will put each resource, and why.

A prediction from a model of pve-ha-manager 5.2.0 (:mod:`ha_placement`),
read from a cluster folder or a simulator test folder; it never writes
anything and never calls ``ha-manager``. ``--storage-view`` and
``--as-if-storage-hook`` judge the targets with ``rank-nodes``' own code.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from ha_placement import HA_MANAGER_VERSION, MODEL
from ha_placement.errors import HaPlacementError
from ha_placement.events import EVENT_HELP, EventError, parse_event
from ha_placement.explain import (
    StorageVerdict,
    StorageView,
    cannot_place,
    render_json,
    render_text,
)
from ha_placement.inputs import read_guest_storages, read_pve_dir, read_sim_scenario
from ha_placement.manager import predict
from ha_placement.model import Event
from ha_placement.select import StorageFilter
from ha_placement.suite import model_steps
from pvestord.adapters.config import load_storage_config
from pvestord.cli import options
from pvestord.engine import nodereport
from pvestord.errors import PvestordError
from pvestord.features import ranking


class PlacementError(PvestordError):
    """The prediction cannot be made from these inputs."""


def register(sub: options.SubCommands) -> None:
    # Its description is built from the event list and laid out by hand.
    cmd = options.add_command(
        sub, "placement", _run,
        "predict where Proxmox HA puts each resource after an event, and why",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=f"Predict the HA manager's placement decisions ({MODEL}) for a cluster "
        "and a list of events, each with its reasons: the candidate nodes, every node left "
        "out and why (not online, node affinity, negative or positive resource affinity, "
        "failed starts), the CRS scores, the step that decided (failback=0 stickiness, "
        "maintenance fallback, stays, lowest score, tie -> alphabetical). Resources are "
        "processed in string order of their ids (vm:1000 before vm:101), as the manager "
        "does.\n\nEvents (applied in order; after each the manager runs until it settles):\n  "
        + EVENT_HELP.replace(", ", "\n  ") + "\nWith no event: what the manager does next "
        "from the current state.",
        epilog="Auto-rebalance is modelled for the static CRS. Not modelled (warned when "
        "present): the dynamic CRS and its auto-rebalance, disarmed HA, locks, services in "
        "error. Exit status: 0 every resource has a node, 3 some "
        "resource cannot be placed (stuck on a maintenance node, no recovery node, a command "
        "refused), 1 error, 2 bad arguments.")
    cmd.add_argument("events", nargs="*", metavar="EVENT", help="see above")
    source = cmd.add_mutually_exclusive_group()
    source.add_argument("--pve-dir", type=Path, default=Path("/etc/pve"), metavar="DIR",
                        help="the cluster folder: ha/*.cfg, ha/manager_status, "
                        "nodes/*/lrm_status, .members, .vmlist, datacenter.cfg, guest "
                        "configs (default: %(default)s)")
    source.add_argument("--sim-test", type=Path, metavar="DIR",
                        help="a pve-ha-manager simulator test folder (src/test/test-*/); its "
                        "cmdlist gives the events unless EVENTs follow its first step")
    cmd.add_argument("--guests", type=Path, metavar="FILE",
                     help="'pvesh get /cluster/resources --output-format json': node "
                     "CPUs/memory for the static CRS and the running non-HA guests")
    cmd.add_argument("--crs", choices=("basic", "static", "dynamic"),
                     help="the CRS mode (default: datacenter.cfg's)")
    cmd.add_argument("--shutdown-policy", choices=("conditional", "freeze", "failover",
                                                   "migrate"),
                     help="for shutdown/reboot events (default: datacenter.cfg's)")
    cmd.add_argument("--ha-behavior", choices=(HA_MANAGER_VERSION,), default=HA_MANAGER_VERSION,
                     help="the pve-ha-manager behaviour to model (default: %(default)s)")
    cmd.add_argument("--storage-view", action="store_true",
                     help="mark every target with rank-nodes' verdict on the guest's thin "
                     "storages")
    cmd.add_argument("--as-if-storage-hook", action="store_true",
                     help="drop the nodes rank-nodes leaves out, as the proposed rank_nodes "
                     "storage hook would (NOT what Proxmox does today)")
    cmd.add_argument("--storage-config", type=Path, metavar="PATH",
                     help="storage.cfg (default: storage.cfg in the cluster folder)")
    options.add_stale_after_option(cmd, ranking.DEFAULT_STALE_AFTER,
                                   "ignore node reports older than this")
    cmd.add_argument("--replay", action="store_true",
                     help="print only the decisions, one per line, in the normalised form "
                     "compared with a simulator log.expect")
    options.add_json_option(cmd)


def _storage(args: argparse.Namespace, pve_dir: Path) -> tuple[StorageView, StorageFilter]:
    config = load_storage_config(args.storage_config or pve_dir / "storage.cfg")
    reports, problems = nodereport.read_reports(pve_dir / "nodes")
    guest_stores = read_guest_storages(pve_dir)
    now = time.time()

    def thin(sid: str) -> list[str]:
        return sorted(s for s in guest_stores.get(sid, set()) if config.get(s) is not None)

    def view(sid: str, node: str) -> StorageVerdict | None:
        storages = thin(sid)
        if not storages:
            return None
        verdict = ranking.judge(node, reports.get(node), problems.get(node) or problems.get("*"),
                                storages, now, args.stale_after)
        return verdict.eligible, verdict.reasons, verdict.warnings

    def hook(sid: str, candidates: list[str]) -> tuple[dict[str, str], dict[str, int]]:
        storages = thin(sid)
        if not storages:
            return {}, {}
        ranked = ranking.rank_nodes(storages, candidates, reports, problems, now=now,
                                    stale_after=args.stale_after)
        left_out = {r.node: "; ".join(r.reasons) for r in ranked if not r.eligible}
        # rank-nodes puts warned nodes last: a tie-break before the node name.
        ranks = {r.node: int(bool(r.warnings)) for r in ranked if r.eligible}
        return left_out, ranks

    return view, hook


def _run(args: argparse.Namespace) -> int:
    try:
        given = [parse_event(text) for text in args.events]
    except EventError as err:
        print(f"pvestord placement: {err}", file=sys.stderr)
        return 2
    try:
        return _predict(args, given)
    except HaPlacementError as err:
        # The model's errors are not pvestord's (it imports nothing of ours):
        # made one here, so that main prints it as every command's.
        raise PlacementError(str(err)) from err


def _predict(args: argparse.Namespace, given: list[Event]) -> int:
    if args.sim_test is not None:
        pve_dir = args.sim_test
        cluster, events = read_sim_scenario(pve_dir, given, args.crs)
    else:
        pve_dir = args.pve_dir
        cluster = read_pve_dir(pve_dir, args.guests, args.crs, args.shutdown_policy)
        events = given
    view: StorageView | None = None
    hook: StorageFilter | None = None
    if args.storage_view or args.as_if_storage_hook:
        view, storage_hook = _storage(args, pve_dir)
        if args.as_if_storage_hook:
            hook = storage_hook
    prediction = predict(cluster, events, hook)
    if args.replay:
        for kind, sid, node in model_steps(d for e in prediction.events for d in e.decisions):
            print(f"{kind} {sid} {node}".rstrip())
    elif args.json:
        print(json.dumps(render_json(prediction, view, hook is not None), indent=2))
    else:
        print(render_text(prediction, view, hook is not None), end="")
    return 3 if cannot_place(prediction) else 0
