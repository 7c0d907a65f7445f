"""A writer through QEMU's own block layer that meets the end of a thin LV as a guest would.

The ``qemu-io`` tool on an NBD export of a drive's qcow2 node, 4 MiB per
write, paced. An extension takes about 3 s in the node guest (``lvextend``
under TCG inside TCG), and a CI machine with CPU steal makes that longer, so
the writer treats ENOSPC as a guest with ``werror=enospc`` would: it tries
the write again until the daemon has grown the LV. The threshold event is
the only way the LV grows then (qemu-io's errors raise no
``BLOCK_IO_ERROR``), so a daemon that stopped arming thresholds still fails
the tests that use it. Shared by the engine's node tests (test_engine.py)
and the plugin's linked clones (test_proxmox_templates.py).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from tests.harness.lvmbed import MiB
from tests.harness.qemu import QemuVM

WRITE = 4 * MiB
#: Bytes per second the paced writer aims at.
PACE = 48 * MiB
#: How long a write may wait for the daemon to grow the LV.
EXTEND_TIMEOUT = 60.0
#: What qemu-io prints for a write past the end of the LV.
ENOSPC = "No space left on device"
#: Between tries of a write that met the end of the LV.
RETRY_PAUSE = 0.5

log = logging.getLogger(__name__)


@dataclass
class WriteOutcome:
    """What a paced writer met: errors it could not get past, and its stalls."""

    errors: list[str] = field(default_factory=list)
    #: Offsets whose first try met the end of the LV and went through once
    #: the daemon had grown it (a guest would have paused there, then resumed).
    stalls: list[int] = field(default_factory=list)


def paced_write(vm: QemuVM, node: str, start: int, total: int, pattern: int) -> WriteOutcome:
    """Write ``total`` bytes from ``start`` at most at ``PACE``.

    A write that fails with ENOSPC is tried again every ``RETRY_PAUSE`` until
    it goes through (see the module docstring); any other failure, or one
    still failing after ``EXTEND_TIMEOUT``, is an error. Retrying, rather than
    waiting for the LV's size to change, has no race with an extension that
    lands between the failure and a look at the size.
    """
    outcome = WriteOutcome()
    began = time.monotonic()
    with vm.io_session() as io:
        for offset in range(start, start + total, WRITE):
            result = io.write_pattern(node, offset, WRITE, pattern, check=False)
            if not result.ok and result.error == ENOSPC:
                outcome.stalls.append(offset)
                deadline = time.monotonic() + EXTEND_TIMEOUT
                while not result.ok and result.error == ENOSPC and time.monotonic() < deadline:
                    time.sleep(RETRY_PAUSE)
                    result = io.write_pattern(node, offset, WRITE, pattern, check=False)
            if not result.ok:
                outcome.errors.append(f"offset {offset}: {result.error}")
            ahead = (offset + WRITE - start) / PACE - (time.monotonic() - began)
            if ahead > 0:
                time.sleep(ahead)
    if outcome.stalls:
        log.info("writer met the end of the LV at %d of %d writes", len(outcome.stalls),
                 total // WRITE)
    return outcome
