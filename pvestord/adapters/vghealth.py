"""VGs this node must not change any more until an operator has looked.

Some failures leave this node unable to vouch for a VG's metadata: an
``lvm`` that could not be killed (D state on a dead SAN path) may still write
metadata computed from an old sequence number once its I/O completes, and a
pass that never ended may hold a half-done change. Another LVM metadata change
on that VG from this node could then be the second writer that loses an
update, so every further change on it is refused until the mark is cleared.

The mark is a file, one per VG, under a folder of pvestord's own in ``/run``:

- it outlives a daemon restart (a watchdog restart does not make a stuck
  ``lvm`` go away), and a reboot clears it (as it clears the stuck process);
- an operator sees it (``ls /run/pvestord/vg-unhealthy``, ``pvestord drives``)
  and clears it by removing the file once the VG has been checked.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

from pvestord.errors import PvestordError
from pvestord.policy.proxmox import is_vg_name

log = logging.getLogger(__name__)

#: Where the marks live on a node.
DEFAULT_DIR = Path("/run/pvestord/vg-unhealthy")
# A mark's file name is the VG name itself (pvestord.policy.proxmox.is_vg_name).
# A VG name never starts with a hyphen, so our temporary files do.
#: Bytes of a reason kept in the mark.
REASON_LIMIT = 4096


class VgUnhealthyError(PvestordError):
    """A change was refused because the VG is marked unhealthy on this node."""

    def __init__(self, vg: str, mark: VgMark) -> None:
        self.vg = vg
        self.mark = mark
        super().__init__(
            f"VG {vg} is marked unhealthy on this node since {time.ctime(mark.since)}:"
            f" {mark.reason}; no LVM change is made on it until an operator has checked"
            f" it and removed {mark.path}")


@dataclass(frozen=True)
class VgMark:
    """Why and since when a VG is marked."""

    path: Path
    since: float
    reason: str


class VgMarks:
    """The marks under one folder (:data:`DEFAULT_DIR` on a node)."""

    def __init__(self, folder: Path = DEFAULT_DIR) -> None:
        self.folder = folder

    def path(self, vg: str) -> Path:
        """The file that marks ``vg`` (whether it is there or not)."""
        return self._path(vg)

    def _path(self, vg: str) -> Path:
        if not is_vg_name(vg):
            raise PvestordError(f"not a VG name: {vg!r}")
        return self.folder / vg

    def mark(self, vg: str, reason: str) -> None:
        """Mark ``vg``: logged at error, kept until removed by hand."""
        path = self._path(vg)
        path.parent.mkdir(parents=True, exist_ok=True)
        text = reason.replace("\n", " ")[:REASON_LIMIT]
        temporary = path.with_name(f"-{os.getpid()}-{vg}")
        temporary.write_text(text + "\n")
        os.replace(temporary, path)
        log.error("VG %s marked unhealthy: %s; no LVM change is made on it until an operator"
                  " has checked it and removed %s", vg, text, path)

    def get(self, vg: str) -> VgMark | None:
        """The mark on ``vg``, or None when it is healthy."""
        path = self._path(vg)
        try:
            since = path.stat().st_mtime
            reason = path.read_text().strip()
        except FileNotFoundError:
            return None
        return VgMark(path, since, reason)

    def check(self, vg: str) -> None:
        """Raise :class:`VgUnhealthyError` when ``vg`` is marked."""
        mark = self.get(vg)
        if mark is not None:
            raise VgUnhealthyError(vg, mark)

    def marked(self) -> dict[str, VgMark]:
        """Every marked VG."""
        try:
            names = sorted(os.listdir(self.folder))
        except FileNotFoundError:
            return {}
        marks = {}
        for name in names:
            if not is_vg_name(name):
                continue
            mark = self.get(name)
            if mark is not None:
                marks[name] = mark
        return marks
