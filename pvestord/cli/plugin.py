"""``pvestord plugin``: the decisions of Proxmox's storage plugin, JSON in and out.

Called by ``PVE::Storage::Custom::PvestordPlugin`` (see :mod:`pvestord.features.plugin`
and, for the locks it takes, :mod:`pvestord.features.pluginlocks`), not by
people: the request is read from stdin, the answer is one JSON line on
stdout; a failure is a message on stderr and exit status 1, which the Perl
side turns into the error of the Proxmox task.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from pvestord.adapters import preparedjobs, vghealth
from pvestord.cli.options import SubCommands, add_command
from pvestord.features import plugin, pluginlocks


def register(sub: SubCommands) -> None:
    parser = add_command(sub, "plugin", _answer,
                         "answer the Proxmox storage plugin (JSON on stdin and stdout)")
    # The daemon's option of the same name: both must read the same marks.
    parser.add_argument("--vg-health-dir", type=Path, default=vghealth.DEFAULT_DIR,
                        metavar="DIR", help="where VGs this node must not change are marked "
                        "(default: %(default)s)")


def _op(text: str) -> Any:
    """The request's op, without judging the rest (each op's parser does)."""
    try:
        data = json.loads(text)
    except ValueError:
        return None
    return data.get("op") if isinstance(data, dict) else None


def _answer(args: argparse.Namespace) -> int:
    """Read one request of pvestord's Proxmox storage plugin
    (PVE::Storage::Custom::PvestordPlugin) as JSON on stdin: op locks (which
    storage locks to take for a change on the VG), alloc, resize, commit or base,
    with the storage's options; print the answer as JSON. Changes nothing
    itself."""
    text = sys.stdin.read()
    if _op(text) == "locks":
        request = pluginlocks.parse_locks_request(json.loads(text))
        answer = pluginlocks.answer_locks(request, vghealth.VgMarks(args.vg_health_dir))
    else:
        answer = asyncio.run(plugin.answer(
            plugin.parse_request(text),
            prepared_jobs=preparedjobs.folder_beside(args.vg_health_dir)))
    print(json.dumps(answer, sort_keys=True))
    return 0


__all__ = ["register"]
