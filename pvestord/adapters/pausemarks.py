"""Which VMs the daemon has paused itself, to reduce a copy target under them.

The daemon pauses a running VM for a moment (QMP ``stop``) to reduce its
copy target's LV (:mod:`pvestord.engine.livereduce`), and resumes it at
once. A daemon killed in between would leave the guest paused with nobody
to resume it: a paused VM looks like any other paused VM, and pvestord
never resumes one that someone else paused. So the daemon writes
``<folder>/<vmid>`` before its ``stop`` and removes it after its ``cont``;
the next daemon's first pass over the VM finds the file and resumes a VM it
finds paused.

The folder is node-local, beside the VG marks (``/run/pvestord``): a pause
is of a QEMU on this node, and a reboot ends both.
"""

from __future__ import annotations

from pathlib import Path


def folder_beside(vg_health_dir: Path) -> Path:
    """The marks' folder for a node whose VG marks are in ``vg_health_dir``."""
    return vg_health_dir.parent / "paused-for-reduction"


def note(folder: Path, vmid: int) -> None:
    """Record that we are about to pause ``vmid``.

    :raises OSError: the file could not be written; the caller must not pause.
    """
    folder.mkdir(parents=True, exist_ok=True)
    (folder / str(vmid)).touch()


def noted(folder: Path, vmid: int) -> bool:
    """Whether a pause of ``vmid`` of ours may still hold."""
    return (folder / str(vmid)).exists()


def clear(folder: Path, vmid: int) -> None:
    """The pause of ``vmid`` of ours is over (or never began)."""
    (folder / str(vmid)).unlink(missing_ok=True)


__all__ = ["clear", "folder_beside", "note", "noted"]
