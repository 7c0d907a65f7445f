"""``pvestord storage restore ID [--apply]``: put back a ``pvestord:`` section
that vanished from storage.cfg; ``pvestord storage forget ID``: stop keeping
one removed on purpose (see "Rolling install" in operations.md)."""

from __future__ import annotations

import argparse
from pathlib import Path

from pvestord import paths
from pvestord.adapters import keptsections
from pvestord.adapters.lockdir import LockDirLock
from pvestord.cli import options
from pvestord.features import restore


def register(sub: options.SubCommands) -> None:
    storage = sub.add_parser("storage", help="pvestord storages that vanished from storage.cfg")
    ssub = storage.add_subparsers(dest="action", metavar="ACTION", required=True)
    p = options.add_command(ssub, "restore", _restore,
                            "show, or append with --apply, a vanished pvestord section")
    _files(p)
    p.add_argument("--apply", action="store_true",
                   help="append the section to storage.cfg under its cluster lock")
    p.add_argument("--lock-dir", type=Path, default=None, metavar="DIR",
                   help="force a pmxcfs-style lock directory in DIR (default: pmxcfs's for "
                   "/etc/pve, else a flock beside the file)")


    f = options.add_command(ssub, "forget", _forget,
                            "stop keeping a pvestord section removed on purpose")
    _files(f)


def _files(p: argparse.ArgumentParser) -> None:
    p.add_argument("storeid", metavar="ID", help="the storage id")
    p.add_argument("--storage-config", type=Path, default=paths.STORAGE_CFG, metavar="PATH",
                   help="storage.cfg (default: %(default)s)")
    p.add_argument("--state-dir", type=Path, default=paths.STATE_DIR, metavar="DIR",
                   help="the daemon's state folder holding the copy (default: %(default)s)")


def _forget(args: argparse.Namespace) -> int:
    """Drop a vanished pvestord: section from this node's copy, for a storage
    removed on purpose: the daemon stops reporting it and stops growing its
    VMs' LVs once it reads the copy again (systemctl reload pvestord). The text
    is printed a last time. Refused while the storage is in storage.cfg."""
    kept = restore.forget(args.storage_config, args.state_dir / keptsections.FILE_NAME,
                          args.storeid)
    print(kept.text, end="")
    print("# forgotten on this node; now: systemctl reload pvestord (each node keeps"
          " its own copy: forget it on every node that reports it)")
    return 0


def _restore(args: argparse.Namespace) -> int:
    """Print the last copy this node's daemon kept of a pvestord: section, as it
    was written in storage.cfg; with --apply, append it to storage.cfg under
    the lock Proxmox's own edits take (cfs_lock_file 'storage.cfg'). Refused
    when the id is in the file already."""
    lock = (LockDirLock(args.lock_dir, "file-storage_cfg") if args.lock_dir is not None
            else None)
    done = restore.restore(args.storage_config, args.state_dir / keptsections.FILE_NAME,
                           args.storeid, apply=args.apply, lock=lock)
    print(done.kept.text, end="")
    if done.written:
        print(f"# appended to {args.storage_config}")
    else:
        print(f"# not written: 'pvestord storage restore {args.storeid} --apply' appends it"
              f" to {args.storage_config}")
    return 0
