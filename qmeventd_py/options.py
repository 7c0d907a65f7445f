"""qmeventd-py's command line and the options it resolves to.

Apart from the server so that every bad flag, a node name no queue entry
could carry and a socket path that is not a socket are refused before
anything listens or logs that it runs.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import socket
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pvestord import paths
from pvestord.adapters.queue import Entry, QueueError
from pvestord.errors import ConfigError
from pvestord.policy import proxmox
from qmeventd_py import cleanup

#: A peer must say who it is this soon after connecting (QEMU greets at once).
HELLO_TIMEOUT = 10.0


@dataclass(frozen=True)
class Options:
    socket: Path
    queue: Path
    lock_dir: Path | None
    cleanup: list[str] | None
    kill_timeout: float
    origin: str
    hello_timeout: float = HELLO_TIMEOUT


def _version() -> str:
    try:
        return importlib.metadata.version("pvestord")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def build_parser() -> argparse.ArgumentParser:
    """The command line's parser (its manual page is written from it too)."""
    p = argparse.ArgumentParser(
        prog="qmeventd-py",
        description="QMP event server for QEMU (drop-in for Proxmox's qmeventd) that"
                    " queues thin-provisioning extensions.")
    p.add_argument("path", nargs="?", type=Path,
                   help="socket path, as qmeventd takes it (same as --socket)")
    p.add_argument("--socket", type=Path, help=f"default: {paths.QMEVENTD_SOCKET}")
    p.add_argument("--queue", type=Path, default=paths.QUEUE,
                   help="extend queue file (default: %(default)s)")
    p.add_argument("--lock-dir", type=Path,
                   help="use lock directories here for the queue lock (pmxcfs style)")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--cleanup-cmd", help="run 'CMD VMID GRACEFUL GUEST' when a VM exits"
                       f" (default: '{cleanup.QM} cleanup' if installed)")
    group.add_argument("--no-cleanup", action="store_true", help="run no cleanup command")
    p.add_argument("-t", "--kill-timeout", type=float, default=cleanup.DEFAULT_KILL_TIMEOUT,
                   help="seconds from SIGTERM to SIGKILL for a shut-down VM"
                        " (default: %(default)g)")
    # --node-name was its first name; it names the cluster node, not a QEMU
    # block node, so it became --node (the alias stays for old unit files).
    p.add_argument("--node", "--node-name", dest="node", metavar="NODE",
                   help="this cluster node's name, recorded as the origin of queue entries"
                   " (default: short host name; --node-name is an old alias)")
    p.add_argument("--hello-timeout", type=float, default=HELLO_TIMEOUT,
                   help="seconds a peer has to send its first message (default: %(default)g)")
    p.add_argument("-f", "--foreground", action="store_true",
                   help="accepted for qmeventd compatibility; we always run in the foreground")
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    p.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    return p


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = build_parser()
    args = p.parse_args(argv)
    if args.path is not None and args.socket is not None and args.path != args.socket:
        p.error("give the socket path once (positional or --socket)")
    return args


def make_options(args: argparse.Namespace) -> Options:
    if args.kill_timeout <= 0:
        raise ConfigError(f"--kill-timeout must be positive, not {args.kill_timeout:g}")
    if args.hello_timeout <= 0:
        raise ConfigError(f"--hello-timeout must be positive, not {args.hello_timeout:g}")
    command: list[str] | None
    if args.no_cleanup:
        command = None
    elif args.cleanup_cmd is not None:
        try:
            command = cleanup.parse_command(args.cleanup_cmd)
        except ValueError as err:
            raise ConfigError(f"--cleanup-cmd {args.cleanup_cmd!r}: {err}") from err
    else:
        command = cleanup.default_command()
    origin = args.node or proxmox.node_name(socket.gethostname())
    try:
        Entry(100, "probe", origin=origin)
    except QueueError as err:
        raise ConfigError(f"node name {origin!r} cannot be a queue entry's origin: {err}"
                          " (use --node)") from err
    sock = args.socket or args.path or paths.QMEVENTD_SOCKET
    if sock.exists() and not stat.S_ISSOCK(sock.stat().st_mode):
        raise ConfigError(f"{sock} exists and is not a socket; not replacing it")
    return Options(socket=sock, queue=args.queue, lock_dir=args.lock_dir, cleanup=command,
                   kill_timeout=args.kill_timeout, origin=origin,
                   hello_timeout=args.hello_timeout)
