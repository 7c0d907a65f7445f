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

from pvestord import __version__, paths
from pvestord.adapters.service import setup_logging
from pvestord.errors import PvestordError

#: Modules that each define ``register(subparsers)``; a sub-command sets
#: ``func(args) -> int`` on its parser.
COMMAND_MODULES = ("pvestord.cli.queue", "pvestord.cli.engine", "pvestord.cli.volume",
                   "pvestord.cli.migration", "pvestord.cli.rank", "pvestord.cli.placement",
                   "pvestord.cli.plugin", "pvestord.cli.status")

Handler = Callable[[argparse.Namespace], int]


def build_parser() -> argparse.ArgumentParser:
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
    parser.add_argument("--queue", type=Path, default=paths.QUEUE, metavar="PATH",
                        help="the cluster extend queue file (default: %(default)s)")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
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
