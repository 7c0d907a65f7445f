"""``pvestord queue list|add|remove|flush``: look at and edit the cluster extend queue.

Tables for people, ``--json`` for scripts. Exit status as the rest of the
command line: 0 success, 2 bad arguments, 1 anything else.
"""

from __future__ import annotations

import argparse
import json
import socket
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pvestord.adapters.locks import DEFAULT_TIMEOUT, queue_lock
from pvestord.adapters.queue import Entry, ExtendQueue, InvalidEntryError, RejectedLine, parse_key
from pvestord.cli.options import SubCommands, add_command, add_json_option, argument_type
from pvestord.policy import Reason, proxmox


def register(sub: SubCommands) -> None:
    parser = sub.add_parser(
        "queue", help="show or edit the cluster extend queue",
        description="Show or edit the cluster extend queue (one line per drive waiting to grow).")
    parser.add_argument("--lock-dir", type=Path, metavar="PATH",
                        help="take the queue lock as a pmxcfs-style lock directory in PATH "
                             "(default: pmxcfs's when the queue is on /etc/pve, else flock)")
    parser.add_argument("--lock-timeout", type=_seconds, default=DEFAULT_TIMEOUT, metavar="SECONDS",
                        help="give up waiting for the queue lock after this long "
                             "(default: %(default)g, as Proxmox's cfs_lock)")
    cmds = parser.add_subparsers(dest="queue_command", metavar="ACTION", required=True)

    p = add_command(cmds, "list", _list, "list queued drives (or rejected lines)")
    add_json_option(p)
    p.add_argument("--rejected", action="store_true",
                   help="show the lines moved aside because they did not parse")

    p = add_command(cmds, "add", _add, "queue drives by hand")
    p.add_argument("keys", nargs="+", type=_KEY, metavar="VMID:BLOCK-NODE")
    p.add_argument("--reason", default=Reason.MANUAL.value, choices=[r.value for r in Reason],
                   help="why (default: %(default)s)")

    p = add_command(cmds, "remove", _remove, "drop drives from the queue")
    p.add_argument("keys", nargs="+", type=_KEY, metavar="VMID:BLOCK-NODE")

    add_command(cmds, "flush", _flush, "drop every queued drive")


_KEY = argument_type(parse_key, InvalidEntryError)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value <= 3600:
        raise argparse.ArgumentTypeError(f"expected seconds between 0 and 3600, got {text!r}")
    return value


def _queue(args: argparse.Namespace) -> ExtendQueue:
    path: Path = args.queue
    return ExtendQueue(path, lock=queue_lock(path, args.lock_dir), lock_timeout=args.lock_timeout)


def _local_node() -> str | None:
    name = proxmox.node_name(socket.gethostname())
    try:
        Entry(100, "x", origin=name)
    except InvalidEntryError:
        return None
    return name


def _when(ts: int | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts)) if ts else "-"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    lines = [header, *rows]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip()
                     for line in lines)


def entry_json(entry: Entry) -> dict[str, Any]:
    return {"vmid": entry.vmid, "block_node": entry.block_node, "reason": entry.reason.value,
            "origin": entry.origin, "ts": entry.ts, "n": entry.n, "id": entry.id,
            "extra": dict(entry.extra)}


def rejected_json(line: RejectedLine) -> dict[str, Any]:
    return {"ts": line.ts, "error": line.error, "line": line.text, "length": line.length,
            "truncated": line.truncated, "sha256": line.sha256}


def _list(args: argparse.Namespace) -> int:
    queue = _queue(args)
    if args.rejected:
        rejected = queue.rejected()
        if args.json:
            print(json.dumps([rejected_json(r) for r in rejected], indent=2))
        elif rejected:
            print(_table(("REJECTED", "WHY", "LINE"),
                         [(_when(r.ts), r.error, _shorten(r.text, 60)) for r in rejected]))
        else:
            print(f"no rejected lines ({queue.rejected_path})")
        return 0
    entries = queue.entries()
    if args.json:
        print(json.dumps([entry_json(e) for e in entries], indent=2))
    elif entries:
        print(_table(("VMID", "BLOCK-NODE", "REASON", "EVENTS", "SINCE", "ORIGIN"),
                     [(str(e.vmid), e.block_node, e.reason.value, str(e.n), _when(e.ts),
                       e.origin or "-") for e in entries]))
    else:
        print(f"queue is empty ({queue.path})")
    return 0


def _shorten(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def _add(args: argparse.Namespace) -> int:
    origin = _local_node()
    entries = [Entry(vmid, name, Reason(args.reason), origin=origin) for vmid, name in args.keys]
    _queue(args).append(entries)
    print(f"queued {len(entries)} drive(s)")
    return 0


def _remove(args: argparse.Namespace) -> int:
    removed = _queue(args).remove(args.keys)
    print(f"removed {removed} of {len(args.keys)} drive(s)")
    return 0


def _flush(args: argparse.Namespace) -> int:
    removed = _queue(args).flush()
    print(f"removed {removed} drive(s)")
    return 0
