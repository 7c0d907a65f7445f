"""``pvestord status [--json]``: what the running daemon is doing, from its published view.

The daemon writes its view to ``/run/pvestord/status.json`` every few seconds
(:mod:`pvestord.engine.status`); this reads it and says plainly when the
daemon does not run or has stopped updating it. Exit status 0 when the view
is the live daemon's, 1 otherwise (the view, if any, is still shown).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from pvestord.cli.options import SubCommands, add_command, add_json_option
from pvestord.engine import status
from pvestord.policy.sizes import format_size


def register(sub: SubCommands) -> None:
    p = add_command(sub, "status", _run,
                    "the running daemon's view: drives, queue, VG capacity, extensions")
    add_json_option(p, help="the published view as JSON")
    p.add_argument("--file", type=Path, default=status.STATUS_FILE, metavar="PATH",
                   help="the published view (default: %(default)s)")


def _partial(unmeasured: int) -> str:
    """What the admin must know of the maxima: all recorded (the same figure
    on every node), or a floor because some LVs lack the tag."""
    if not unmeasured:
        return ""
    return (f" (partial: {unmeasured} LV(s) with no recorded maximum counted at their size;"
            " see 'pvestord volume record-maxima')")


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "not filling"
    if seconds >= 2 * 86400:
        return f"{seconds / 86400:.1f} days"
    return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds / 60:.0f} min"


def _text(view: dict[str, Any]) -> list[str]:
    lines = [f"node {view['node']}, pvestord pid {view['pid']}, as of "
             f"{time.ctime(view['time'])}; queue {view['queue_length']}, "
             f"{view['paused_vms']} VM(s) paused on ENOSPC"]
    for row in view.get("storages", []):
        if row["vanished"] is None:
            continue
        # First, and loud: every other line can look healthy meanwhile.
        lines.append(f"STORAGE {row['storage']} VANISHED from storage.cfg at "
                     f"{time.ctime(row['vanished'])} (last seen {time.ctime(row['seen'])}):"
                     " Proxmox no longer knows it; pvestord keeps growing its running VMs'"
                     f" LVs. Put it back with: {row['restore']}")
    for vg, acc in view["vgs"].items():
        lines.append(
            f"VG {vg} [{acc['health']}]: {format_size(acc['free'])} free of "
            f"{format_size(acc['size'])}; thin LVs {format_size(acc['thin_allocated'])} of "
            f"{format_size(acc['thin_virtual'])} maxima{_partial(acc['unmeasured'])}; "
            f"overcommit {acc['overcommit']:.2f}; full in {_duration(acc['time_to_full'])}")
    for d in view["drives"]:
        why = f": {d['reason']}" if d.get("reason") else ""
        lines.append(f"  VM {d['vmid']} {d['block_node']} {d['vg']}/{d['lv']}: {d['state']}{why}")
    ext = view["extensions"]
    lines.append(f"extensions: {ext['made']} made, {ext['failed']} failed")
    for e in ext["last"]:
        lines.append(f"  {time.strftime('%H:%M:%S', time.localtime(e['at']))} VM {e['vmid']}"
                     f" {e['vg']}/{e['lv']} {format_size(e['old_size'])} ->"
                     f" {format_size(e['new_size'])}"
                     f": {e['round_ms']} ms (lock {e['lock_wait_ms']} ms,"
                     f" LVM {e['lvm_ms']} ms)")
    return lines


def _run(args: argparse.Namespace) -> int:
    """Show what the pvestord daemon on this node is doing right now: each
    thin drive's state, the extend queue, each thin VG's capacity and health, and the
    last extensions with their latencies. Read from the file the daemon publishes."""
    view = status.read(args.file)
    if view is None:
        print(f"pvestord: the daemon does not run (no {args.file}; it is written by a"
              " running 'pvestord run')", file=sys.stderr)
        return 1
    problem = status.daemon_state(view)
    if args.json:
        print(json.dumps({**view, "live": problem is None, "problem": problem}, indent=1))
    else:
        print("\n".join(_text(view)))
    if problem is not None:
        print(f"pvestord: {problem}", file=sys.stderr)
        return 1
    return 0
