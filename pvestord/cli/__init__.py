"""The ``pvestord`` command line: one sub-command group per module in this package.

Exit status: 0 on success, 2 on bad arguments (argparse's convention, one line
saying why), 1 on any other failure, printed as ``pvestord: message``.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NoReturn

from pvestord import __version__, paths
from pvestord.adapters.service import setup_logging
from pvestord.errors import PvestordError

#: Each sub-command and the module whose ``register(subparsers)`` defines it;
#: a sub-command sets ``func(args) -> int`` on its parser. Only the module of
#: the command asked for is imported: Proxmox runs ``pvestord plugin`` for each
#: storage call (pvestatd's status every 10 s), and the other modules' imports
#: (the engine, placement) would be paid on each.
COMMANDS = {
    "queue": "pvestord.cli.queue",
    "run": "pvestord.cli.engine", "drives": "pvestord.cli.engine",
    "extend": "pvestord.cli.engine",
    "volume": "pvestord.cli.volume",
    "migration": "pvestord.cli.migration",
    "rank-nodes": "pvestord.cli.rank",
    "placement": "pvestord.cli.placement",
    "plugin": "pvestord.cli.plugin",
    "status": "pvestord.cli.status",
    "check": "pvestord.cli.check",
    "storage": "pvestord.cli.storage",
}

Handler = Callable[[argparse.Namespace], int]


def global_options(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("--queue", type=Path, default=paths.QUEUE, metavar="PATH",
                        help="the cluster extend queue file (default: %(default)s)")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    return parser


class _CommandFinder(argparse.ArgumentParser):
    """Reads the global options only, to find the sub-command; what it cannot
    read is left to the full parser, whose messages name every command."""

    def error(self, message: str) -> NoReturn:
        raise ValueError(message)


def requested_command(argv: Sequence[str]) -> str | None:
    """The sub-command ``argv`` names, when it is a known one."""
    try:
        _, rest = global_options(_CommandFinder(add_help=False)).parse_known_args(argv)
    except ValueError:
        return None
    command = next((arg for arg in rest if not arg.startswith("-")), None)
    return command if command in COMMANDS else None


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser of every sub-command, or of ``command`` alone (its module
    is then the only one imported)."""
    parser = argparse.ArgumentParser(
        prog="pvestord",
        description=(
            "Thin provisioning for qcow2 disks on thick, shared LVM. 'pvestord run' is the "
            "daemon that grows each thin LV ahead of its guest's writes; the other commands "
            "inspect and edit the cluster extend queue and the thin drives of this node."
        ),
        epilog="Exit status: 0 success, 1 failure, 2 bad arguments.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    global_options(parser)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    modules = [COMMANDS[command]] if command else list(dict.fromkeys(COMMANDS.values()))
    for name in modules:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    parser = build_parser(requested_command(argv))
    args = parser.parse_args(argv)
    if args.command != "run":
        # The daemon sets up its own logging; commands log warnings to stderr.
        setup_logging("pvestord", verbose=args.verbose, journal=False)
        if not args.verbose:
            logging.getLogger().setLevel(logging.WARNING)
    handler: Handler = args.func
    try:
        return handler(args)
    except PvestordError as err:
        print(f"pvestord: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # `pvestord queue list | head`: the reader left; not an error of ours.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
