"""Options that several sub-commands share, defined once."""

from __future__ import annotations

import argparse
from pathlib import Path

from pvestord import vghealth
from pvestord.locks import PMXCFS_LOCK_EXPIRY


def add_lock_options(parser: argparse.ArgumentParser) -> None:
    """``--lock-lifetime`` and ``--vg-health-dir``: for every command that
    changes LVM metadata under the storage lock."""
    parser.add_argument("--lock-lifetime", type=float, default=PMXCFS_LOCK_EXPIRY,
                        metavar="SECONDS", help="with --lock-dir off pmxcfs: how long a lock "
                        "directory lives after its holder's last renewal, as pmxcfs's 120 s "
                        "(for tests; pmxcfs's own cannot be made longer) (default: %(default)g)")
    parser.add_argument("--vg-health-dir", type=Path, default=vghealth.DEFAULT_DIR,
                        metavar="DIR", help="where VGs this node must not change are marked "
                        "(default: %(default)s)")
