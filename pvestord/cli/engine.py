"""``pvestord run``, ``pvestord drives`` and ``pvestord extend``: the engine's commands."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import sys
from pathlib import Path

from pvestord import paths
from pvestord.adapters.vms import local_vm, local_vms
from pvestord.cli import options
from pvestord.engine import daemon, status
from pvestord.engine.configsource import StorageConfigSource
from pvestord.engine.drive import DriveRow
from pvestord.engine.extender import Extender, drive_reports
from pvestord.errors import PvestordError
from pvestord.policy import Reason
from pvestord.policy.sizes import format_size

#: ``pvestord run``'s options in seconds, by DaemonSettings field, with what
#: each one bounds; the default shown is the field's.
_SECONDS_OPTIONS = (
    ("poll_interval", "read the queue at least this often, for other nodes' writes"),
    ("reconcile_interval", "check every thin drive this often"),
    ("lvm_timeout", "budget of one LVM command; one that overruns it is killed and "
     "retried later"),
    ("qmp_timeout", "budget of a QMP greeting and of each QMP command, for a QEMU that "
     "accepts and never answers"),
    ("report_interval", "look at this node's thin storages this often, and publish the "
     "view (for rank-nodes) when it changed or is two intervals old"),
    ("pass_deadline", "abandon a pass over one VM that takes longer than this, mark the "
     "VG it was changing unhealthy and serve the other VMs"),
)


def register(sub: options.SubCommands) -> None:
    run = options.add_command(sub, "run", _run,
                              "run the extension daemon (what pvestord.service starts)")
    options.add_node_options(run)
    default = options.setting_default
    for name, what in _SECONDS_OPTIONS:
        run.add_argument(f"--{name.replace('_', '-')}", type=float, metavar="SECONDS",
                         default=default(name), help=f"{what} (default: %(default)s)")
    run.add_argument("--nodes-dir", type=Path, metavar="DIR",
                     default=default("nodes_dir"),
                     help="where node reports are published (default: 'nodes' beside the "
                     "queue, /etc/pve/nodes)")
    run.add_argument("--state-dir", type=Path, metavar="DIR",
                     default=default("state_dir"),
                     help="node-local state: the copy of storage.cfg's pvestord sections "
                     f"(default: {paths.STATE_DIR}, or 'state' beside --vg-health-dir"
                     " when that is given)")
    run.add_argument("--global-worker", action="store_true",
                     help="one extension at a time for all VGs, as the original proposal "
                     "(for comparison; default: one per VG)")
    run.add_argument("--lvm-shell", action=argparse.BooleanOptionalAction,
                     default=default("lvm_shell"),
                     help="run an extension's LVM commands in a persistent lvm shell per VG, "
                     "which skips LVM's start-up; needs /etc/lvm/profile/pvestord.profile "
                     "and falls back to one process per command without it "
                     "(default: %(default)s)")
    run.add_argument("--no-inotify", action="store_true",
                     help="poll only, do not wake on local queue writes")
    run.add_argument("--journal", action=argparse.BooleanOptionalAction, default=None,
                     help="log to the journal (default: when started by systemd)")

    drives = options.add_command(sub, "drives", _drives,
                                 "show the thin drives of the VMs running here")
    options.add_node_options(drives)
    options.add_json_option(drives)
    drives.add_argument("--status-file", type=Path, default=status.STATUS_FILE, metavar="PATH",
                        help="the running daemon's published view, whose states (extending, "
                        "paused, deferred, failed, held) are shown over this look's "
                        "(default: %(default)s)")

    extend = options.add_command(sub, "extend", _extend, "extend one thin drive by a chunk now")
    options.add_node_options(extend)
    extend.add_argument("vmid", type=int, metavar="VMID")
    extend.add_argument("block_node", metavar="BLOCK-NODE",
                        help="the drive's file node-name (see 'pvestord drives')")


def _run(args: argparse.Namespace) -> int:
    """Grow every thin LV of the VMs running on this node ahead of their
    writes: take this node's entries from the cluster extend queue, extend the LV by a
    chunk under the storage lock, re-arm QEMU's write threshold, resume a VM paused on
    ENOSPC; and reconcile every thin drive at start and periodically. Logs to the
    journal under systemd, else to stderr. Stops cleanly on SIGTERM."""
    settings = options.settings_from(args, poll_interval=args.poll_interval,
                                     reconcile_interval=args.reconcile_interval,
                                     lvm_timeout=args.lvm_timeout, qmp_timeout=args.qmp_timeout,
                                     global_worker=args.global_worker, inotify=not args.no_inotify,
                                     lvm_shell=args.lvm_shell,
                                     report_interval=args.report_interval, nodes_dir=args.nodes_dir,
                                     pass_deadline=args.pass_deadline,
                                     state_dir=args.state_dir)
    return daemon.run(settings, verbose=args.verbose, journal=args.journal)


def _drives(args: argparse.Namespace) -> int:
    """Every thin-drive candidate of every VM running on this node: VM,
    node-name, LV, LV size, allocation (QEMU's highest write), threshold, maximum
    (qemu-img measure), and state."""
    # One command's few LVM calls: a shell would still pay LVM's start-up once.
    settings = options.settings_from(args, lvm_shell=False)

    async def collect() -> list[DriveRow]:
        extender = Extender(settings, StorageConfigSource(settings.storage_config).get)
        reports: list[DriveRow] = []
        for vm in local_vms(settings.run_dir):
            try:
                reports += await drive_reports(extender, vm)
            except PvestordError as err:
                print(f"pvestord: VM {vm.vmid}: {err}")
        return reports

    reports = asyncio.run(collect())
    said = _daemon_says(args.status_file)
    states = {(r.vmid, r.block_node): said.get((r.vmid, r.block_node), (r.state.value, None))
              for r in reports}
    if args.json:
        print(json.dumps([{**_json_row(r), "state": states[(r.vmid, r.block_node)][0],
                           "problem": r.problem or states[(r.vmid, r.block_node)][1]}
                          for r in reports], indent=2))
        return 0
    header = ("VMID", "BLOCK-NODE", "LV", "STORAGE", "LV SIZE", "ALLOCATED", "THRESHOLD",
              "MAXIMUM", "STATE")
    rows = [(str(r.vmid), r.block_node, r.lv_path, r.storage or "-", format_size(r.lv_size),
             format_size(r.allocation), format_size(r.threshold) if r.threshold else "-",
             format_size(r.maximum),
             states[(r.vmid, r.block_node)][0] if r.storage else "not thin")
            for r in reports]
    widths = [max(len(c) for c in col) for col in zip(header, *rows, strict=True)]
    for row in (header, *rows):
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    for r in reports:
        problem = r.problem or states[(r.vmid, r.block_node)][1]
        if problem:
            print(f"VM {r.vmid} {r.block_node}: {problem}")
    if not rows:
        print("(no thin drives on this node)")
    return 0


def _json_row(row: DriveRow) -> dict[str, object]:
    """``row`` for ``drives --json``: its fields in order, the LV's path under
    the key ``lv`` it has always had."""
    return {("lv" if key == "lv_path" else key): value
            for key, value in dataclasses.asdict(row).items()}


def _daemon_says(path: Path) -> dict[tuple[int, str], tuple[str, str | None]]:
    """The live daemon's word on drives, or nothing, said on stderr: without
    it ``drives`` shows only what its own look can see."""
    view = status.read(path)
    problem = (f"no view published at {path}" if view is None
               else status.daemon_state(view))
    if view is None or problem is not None:
        print(f"pvestord: {problem}: states are this look's only (extending, paused, "
              "deferred, failed and held are known to a running daemon)", file=sys.stderr)
        return {}
    return status.daemon_says(view)


def _extend(args: argparse.Namespace) -> int:
    """Extend a thin drive of a VM running here by one chunk, through the
    daemon's own code path (storage lock, policy cap at the maximum, threshold re-armed)."""
    settings = options.settings_from(args, lvm_shell=False)
    vm = local_vm(settings.run_dir, args.vmid)
    if vm is None:
        raise PvestordError(f"VM {args.vmid} is not running on this node")

    async def extend() -> int:
        extender = Extender(settings, StorageConfigSource(settings.storage_config).get)
        # Checked before any LVM command: a name that is no thin drive's must
        # not fall back to every drive of the VM.
        known, thin = await extender.thin_block_nodes(vm)
        if args.block_node not in known:
            raise PvestordError(f"VM {args.vmid} has no block node {args.block_node!r}")
        if args.block_node not in thin:
            raise PvestordError(
                f"VM {args.vmid}: block node {args.block_node!r} is not a thin drive's "
                f"(thin drives: {', '.join(sorted(thin)) or 'none'})")
        outcome = await extender.handle(vm, {args.block_node: Reason.MANUAL})
        if outcome.errors:
            raise PvestordError("; ".join(str(e) for e in outcome.errors.values()))
        print(f"VM {args.vmid} {args.block_node}: "
              + ("extended" if outcome.extensions else "nothing to do (at its maximum?)"))
        return 0

    return asyncio.run(extend())
