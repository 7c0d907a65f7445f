"""Which VMs the daemon has paused itself, to reduce a copy target under them.

The daemon pauses a running VM for a moment (QMP ``stop``) to reduce its
copy target's LV (:mod:`pvestord.engine.livereduce`), and resumes it at
once. A daemon killed in between would leave the guest paused with nobody
to resume it: a paused VM looks like any other paused VM, and pvestord
never resumes one that someone else paused. So the daemon writes
``<folder>/<vmid>`` before its ``stop`` and removes it after its ``cont``;
the next daemon's first pass over the VM finds the file and resumes a VM it
finds paused.

The note names the QEMU paused (its pid and start time): a note left for a
QEMU that has ended since (the VM stopped, or crashed, meanwhile) is stale,
and must not resume a new QEMU of the same VMID that someone else paused.

The folder is node-local, beside the VG marks (``/run/pvestord``): a pause
is of a QEMU on this node, and a reboot ends both.
"""

from __future__ import annotations

import enum
from pathlib import Path

from pvestord.adapters.command import process_stat


class Note(enum.Enum):
    """What the folder says of a VM's QEMU."""

    NONE = "no pause of ours noted"
    #: Noted for this very QEMU: the pause may still hold.
    OURS = "paused by pvestord"
    #: Noted for another QEMU of the VMID, which has ended.
    STALE = "noted for a QEMU that has ended"


def folder_beside(vg_health_dir: Path) -> Path:
    """The notes' folder for a node whose VG marks are in ``vg_health_dir``."""
    return vg_health_dir.parent / "paused-for-reduction"


def _identity(pid: int) -> str | None:
    """``<pid> <start time>`` of a live process; None when it is gone."""
    stat = process_stat(pid)
    return None if stat is None else f"{pid} {stat[1]}"


def note(folder: Path, vmid: int, qemu_pid: int) -> None:
    """Record that we are about to pause ``vmid``, whose QEMU is ``qemu_pid``.

    :raises OSError: the QEMU is gone, or the file could not be written;
        the caller must not pause.
    """
    identity = _identity(qemu_pid)
    if identity is None:
        raise FileNotFoundError(f"no process {qemu_pid}")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / str(vmid)).write_text(identity + "\n")


def noted(folder: Path, vmid: int, qemu_pid: int) -> Note:
    """What is noted of ``vmid``, whose QEMU now is ``qemu_pid``."""
    try:
        text = (folder / str(vmid)).read_text().strip()
    except FileNotFoundError:
        return Note.NONE
    except OSError:
        return Note.STALE  # unreadable: never a reason to resume
    return Note.OURS if text == _identity(qemu_pid) else Note.STALE


def clear(folder: Path, vmid: int) -> None:
    """The pause of ``vmid`` of ours is over (or never began)."""
    (folder / str(vmid)).unlink(missing_ok=True)


__all__ = ["Note", "clear", "folder_beside", "note", "noted"]
