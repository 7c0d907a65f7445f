"""Another node waiting on a lock directory, for the unit tests of the storage lock.

:func:`waiter` starts ``tests/harness/lockholder.py`` as a second local
process on the same folder, with pmxcfs's expiry emulated at :data:`LIFE`
(about a second instead of 120 s); :func:`events_of` reads what it saw.
Every wait for a real condition is bounded by :data:`PATIENCE`.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from tests.harness.polling import wait_until_async

ROOT = Path(__file__).resolve().parents[2]
#: A lock lifetime short enough for tests, long enough for a loaded machine.
LIFE = 1.5
#: Bound of every wait for a real condition.
PATIENCE = 30.0


async def waiter(lock_dir: Path, lock_id: str, *, wait: float,
                 hold_until: Path | None = None) -> asyncio.subprocess.Process:
    """Another process (another node) waiting for ``lock_id`` with the same
    emulated expiry: it breaks a lock left unrenewed for :data:`LIFE`."""
    args = ["-m", "tests.harness.lockholder", "--lock-dir", str(lock_dir), "--id", lock_id,
            "--timeout", str(wait), "--expire-after", str(LIFE)]
    if hold_until is not None:
        args += ["--hold-until", str(hold_until)]
    return await asyncio.create_subprocess_exec(sys.executable, *args, cwd=ROOT,
                                                stdout=subprocess.PIPE)


async def events_of(proc: asyncio.subprocess.Process) -> list[str]:
    out, _ = await asyncio.wait_for(proc.communicate(), PATIENCE)
    return [json.loads(line)["event"] for line in out.decode().splitlines()]


async def wait_until(condition: Callable[[], object], what: str) -> None:
    await wait_until_async(condition, PATIENCE, what)
