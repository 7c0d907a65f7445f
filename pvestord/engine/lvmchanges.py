"""The LVM commands that change a VG, running now for a pass.

The pass deadline marks a VM's VGs unhealthy only while one of these runs
(:mod:`pvestord.engine.passes`): a command cut off there may have left the
metadata or a table half changed. A pass that was waiting for QMP or for the
storage lock changed nothing, so it is not counted here.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


class LvmChanges:
    """The drives, by (vmid, file node), whose ``lvextend`` or ``lvchange``
    runs right now."""

    def __init__(self) -> None:
        self._running: set[tuple[int, str]] = set()

    @contextlib.contextmanager
    def running(self, vmid: int, node: str) -> Iterator[None]:
        """Around one command that changes the VG for ``node`` of ``vmid``."""
        key = (vmid, node)
        self._running.add(key)
        try:
            yield
        finally:
            self._running.discard(key)

    def of_vm(self, vmid: int) -> bool:
        """Whether a command that changes a VG runs for ``vmid`` now."""
        return any(key[0] == vmid for key in self._running)
