"""``pvestord plugin``: the decisions of Proxmox's storage plugin, JSON in and out.

Called by ``PVE::Storage::Custom::PvestordPlugin`` (see :mod:`pvestord.features.plugin`),
not by people: the request is read from stdin, the answer is one JSON line on
stdout; a failure is a message on stderr and exit status 1, which the Perl
side turns into the error of the Proxmox task.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

from pvestord.cli.options import SubCommands, add_command
from pvestord.features import plugin


def register(sub: SubCommands) -> None:
    add_command(sub, "plugin", _answer,
                "answer the Proxmox storage plugin (JSON on stdin and stdout)")


def _answer(args: argparse.Namespace) -> int:
    """Read one request of pvestord's Proxmox storage plugin
    (PVE::Storage::Custom::PvestordPlugin) as JSON on stdin: op alloc, resize or
    commit, with the storage's options; print the LV size to use as JSON. Changes
    nothing itself."""
    request = plugin.parse_request(sys.stdin.read())
    print(json.dumps(asyncio.run(plugin.answer(request)), sort_keys=True))
    return 0


__all__ = ["register"]
