"""Take a pmxcfs-style lock directory from the command line, for the two-node lock tests.

Run on a node of the two-node bed (``python -m tests.harness.lockholder``), it
goes through :class:`pvestord.adapters.locks.LockDirLock` exactly as the daemons do,
and prints one JSON line per step on stdout, flushed, so that the host can
follow it from the node's log::

    {"event": "refused"}
    {"event": "acquired", "waited": 0.01}
    {"event": "released"}
    {"event": "timeout", "waited": 10.02, "message": "..."}

``refused`` comes once, the first time the lock is found held by another:
where pvestord asks for an unlock (an expiry check here, pmxcfs's request on
a real node), so the host knows the holder waits without giving it time.

``--hold-until FILE`` keeps the lock until FILE exists (the host creates it
in the shared folder); ``--expire-after`` shortens pmxcfs's 120 s expiry of
a lock whose holder is gone, so that the stale-lock test takes seconds, not
minutes: the same code path, with a smaller number.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from pvestord.adapters.locks import (
    EmulatedPmxcfsExpiry,
    LockDirLock,
    LockTimeout,
    UnlockRequest,
)


def say(event: str, **fields: object) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


class SayRefused:
    """An unlock request that first says ``refused``, once."""

    def __init__(self, request: UnlockRequest) -> None:
        self.request = request
        self.said = False

    def __call__(self, lock_path: Path) -> None:
        if not self.said:
            say("refused")
            self.said = True
        self.request(lock_path)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lock-dir", type=Path, required=True)
    parser.add_argument("--id", required=True, help="the lock id, e.g. storage-san")
    parser.add_argument("--timeout", type=float, default=10.0)
    parser.add_argument("--hold-until", type=Path, default=None,
                        help="hold until this file exists (default: release at once)")
    parser.add_argument("--expire-after", type=float, default=None,
                        help="expire a holder-less lock after this many seconds "
                        "(default: pmxcfs's 120)")
    args = parser.parse_args()
    expiry = EmulatedPmxcfsExpiry() if args.expire_after is None else EmulatedPmxcfsExpiry(
        args.expire_after)
    lock = LockDirLock(args.lock_dir, args.id, unlock_request=SayRefused(expiry))
    started = time.monotonic()
    try:
        with lock.acquire(args.timeout):
            say("acquired", waited=round(time.monotonic() - started, 3))
            while args.hold_until is not None and not args.hold_until.exists():
                time.sleep(0.1)
    except LockTimeout as err:
        say("timeout", waited=round(time.monotonic() - started, 3), message=str(err))
        return 3
    say("released")
    return 0


if __name__ == "__main__":
    sys.exit(main())
