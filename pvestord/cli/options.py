"""Options that several sub-commands share, defined once."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeAlias, TypeVar

from pvestord.adapters.settings import DaemonSettings

#: What each command module's ``register`` adds its commands to.
SubCommands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"
#: What ``main`` calls with the parsed arguments; its exit status.
Handler = Callable[[argparse.Namespace], int]

T = TypeVar("T")

_SETTINGS = {setting.name: setting for setting in dataclasses.fields(DaemonSettings)}


def setting_default(name: str) -> Any:
    """:class:`DaemonSettings`' default for its field ``name``: what an option
    left out gives, so ``--help`` shows the default the daemon really uses."""
    default = _SETTINGS[name].default
    if default is dataclasses.MISSING:
        raise TypeError(f"DaemonSettings.{name} has no plain default")
    return default


def add_command(sub: SubCommands, name: str, handler: Handler, summary: str,
                **options: Any) -> argparse.ArgumentParser:
    """The sub-command ``name``, listed with ``summary``, that ``main`` runs
    with ``handler``. Its ``--help`` description is the handler's docstring
    (unless ``options`` give one): the words a user reads are the ones the
    code is documented with, kept in one place."""
    options.setdefault("description", handler.__doc__)
    parser = sub.add_parser(name, help=summary, **options)
    parser.set_defaults(func=handler)
    return parser


def add_json_option(parser: argparse.ArgumentParser, help: str = "JSON for scripts") -> None:
    parser.add_argument("--json", action="store_true", help=help)


def add_stale_after_option(parser: argparse.ArgumentParser, default: float, help: str) -> None:
    """``--stale-after``: how old a node report may be and still count."""
    parser.add_argument("--stale-after", type=float, default=default, metavar="SECONDS",
                        help=f"{help} (default: %(default)s)")


def argument_type(parse: Callable[[str], T],
                  errors: type[Exception] | tuple[type[Exception], ...] = ValueError,
                  ) -> Callable[[str], T]:
    """An argparse ``type`` from ``parse``: a value it refuses with ``errors``
    is a usage error (exit 2) that says why, in ``parse``'s own words."""
    def convert(text: str) -> T:
        try:
            return parse(text)
        except errors as err:
            raise argparse.ArgumentTypeError(str(err)) from err
    return convert


def add_lock_options(parser: argparse.ArgumentParser) -> None:
    """``--lock-lifetime`` and ``--vg-health-dir``: for every command that
    changes LVM metadata under the storage lock."""
    parser.add_argument("--lock-lifetime", type=float, default=setting_default("lock_lifetime"),
                        metavar="SECONDS", help="with --lock-dir off pmxcfs: how long a lock "
                        "directory lives after its holder's last renewal, as pmxcfs's 120 s "
                        "(for tests; pmxcfs's own cannot be made longer) (default: %(default)g)")
    parser.add_argument("--vg-health-dir", type=Path, default=setting_default("vg_health_dir"),
                        metavar="DIR", help="where VGs this node must not change are marked "
                        "(default: %(default)s)")


def add_node_options(parser: argparse.ArgumentParser) -> None:
    """Where this node's configuration, QEMUs and locks are: for every command
    that looks at the VMs running here."""
    parser.add_argument("--storage-config", type=Path,
                        default=setting_default("storage_config"),
                        metavar="PATH", help="storage.cfg to read thin options from "
                        "(default: %(default)s)")
    parser.add_argument("--run-dir", type=Path, default=setting_default("run_dir"), metavar="DIR",
                        help="where QEMU's <vmid>.pid and <vmid>.qmp live "
                        "(default: %(default)s)")
    parser.add_argument("--lock-dir", type=Path, default=setting_default("lock_dir"), metavar="DIR",
                        help="force pmxcfs-style lock directories in DIR (default: chosen by "
                        "where the queue lives)")
    add_lock_options(parser)
    parser.add_argument("--node", default=None, metavar="NAME",
                        help="this node's name in the cluster (default: short host name)")


def settings_from(args: argparse.Namespace, **overrides: object) -> DaemonSettings:
    """The daemon's settings from :func:`add_node_options`' options."""
    values: dict[str, object] = {
        "queue": args.queue, "storage_config": args.storage_config, "run_dir": args.run_dir,
        "lock_dir": args.lock_dir, "lock_lifetime": args.lock_lifetime,
        "vg_health_dir": args.vg_health_dir, **overrides,
    }
    if args.node:
        values["node"] = args.node
    return DaemonSettings(**values)  # type: ignore[arg-type]
