"""The pass's model of a VM's drives: what one look saw, and what a pass did.

A :class:`DriveCandidate` is QEMU's view of a drive with its LV and storage,
as a QMP session sees it; a :class:`Drive` adds what LVM and ``qemu-img``
say, read after that session; the policy's input is built from it
(:meth:`Drive.state`). :class:`VmOutcome` is
what the daemon's bookkeeping reads after a pass; :class:`DriveRow` is one
line of ``pvestord drives``.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from pvestord.adapters.config import StorageConfig, ThinStorage
from pvestord.adapters.lvm import lv_from_path
from pvestord.adapters.qmp import RunState, ThinDriveView
from pvestord.errors import PvestordError
from pvestord.policy import (
    DriveIdentity,
    DriveState,
    ExtensionState,
    Reason,
    paused_out_of_room,
)


class StaleTableError(PvestordError):
    """This node's device-mapper table of an LV is larger than the LV's metadata."""


@dataclass(frozen=True)
class DriveCandidate:
    """What QEMU and ``storage.cfg`` say of a drive: no LVM read yet.

    A pass builds these inside its QMP session and leaves the session before
    it asks LVM or ``qemu-img`` anything (:class:`Drive`): qemu-server and
    pvestatd share the VM's only QMP socket, with a 5 s budget per call.
    """

    view: ThinDriveView
    vg: str
    #: The LV QEMU writes: the path's, or the one its device is now called
    #: after a rename under the running VM (:mod:`pvestord.engine.binding`).
    lv: str
    storage: ThinStorage | None
    #: The device number the drive is bound to; None where nothing bound it.
    device: int | None = field(default=None, kw_only=True)

    @property
    def lv_path(self) -> str:
        """The LV QEMU writes, as a path: its node's path but during a rename."""
        return f"/dev/{self.vg}/{self.lv}"

    @property
    def identity(self) -> DriveIdentity:
        return DriveIdentity(self.view.path,
                             frozenset({self.view.file_node, self.view.format_node}))


def candidates(views: Iterable[ThinDriveView], config: StorageConfig,
               node: str | None) -> list[DriveCandidate]:
    """The views on an LV (``/dev/VG/LV``), each with its storage on this node;
    a qcow2 on a plain file or another kind of device is not ours."""
    found = []
    for view in views:
        vg_lv = lv_from_path(view.path)
        if vg_lv is not None:
            vg, lv = vg_lv
            found.append(DriveCandidate(view, vg, lv, config.by_vg(vg, node)))
    return found


def thin_block_nodes(found: Iterable[DriveCandidate]) -> set[str]:
    """The file and qcow2 node-names of the thin drives among ``found``."""
    return {name for c in found if c.storage is not None
            for name in (c.view.file_node, c.view.format_node)}


@dataclass(frozen=True)
class Drive(DriveCandidate):
    """A thin-drive candidate joined with its LV's figures and its image's maximum."""

    maximum: int
    extent_size: int
    #: The LV's size in LVM's metadata, as last read or set by us.
    lv_size: int

    def state(self, *, lv_size: int | None = None, paused_nospace: bool = False,
              reason: Reason = Reason.ARM, job_room: int = 0) -> DriveState:
        storage = self.storage
        return DriveState(
            lv_size=self.lv_size if lv_size is None else lv_size,
            allocation=self.view.allocation, threshold=self.view.threshold,
            virtual_size=self.view.virtual_size, maximum=self.maximum,
            extent_size=self.extent_size,
            chunksize=storage.chunksize if storage else 1,
            chunk_percentage=storage.chunk_percentage if storage else 0.5,
            paused_nospace=paused_nospace, reason=reason, thin=storage is not None,
            job_room=job_room)

    def paused_for_room(self, run: RunState, *, lv_size: int | None = None) -> bool:
        """Whether ``run`` shows the VM paused because this drive ran out of
        room (:func:`pvestord.policy.paused_out_of_room`), its LV at
        ``lv_size`` (by default, the size the pass knows)."""
        return paused_out_of_room(
            device_says_nospace=run.nospace_on(self.view.path, self.identity.block_nodes),
            unowned_pause=run.paused_on_unowned_error,
            lv_size=self.lv_size if lv_size is None else lv_size,
            allocation=self.view.allocation,
            chunksize=self.storage.chunksize if self.storage else 1)


@dataclass(frozen=True)
class DriveRow:
    """One drive's figures for ``pvestord drives`` (LV size read from LVM)."""

    vmid: int
    block_node: str
    format_node: str
    #: The path QEMU opened for the drive (``/dev/<vg>/<lv>``); ``lv`` in ``drives --json``.
    lv_path: str
    storage: str | None
    lv_size: int
    device_size: int
    allocation: int
    threshold: int
    maximum: int
    virtual_size: int
    state: ExtensionState
    #: Why the drive needs an operator or a refresh (a stale table); None when fine.
    problem: str | None = None


@dataclass
class RoundTimings:
    """Where one round's time went, logged with each extension it made.

    The benchmarks split an extension's latency with these (bench/latency.py):
    the queue wait ends when the round starts; QMP, the lock wait and LVM
    follow. Wall-clock for the start, so it compares with QEMU's event timestamp.
    """

    started_wall: float = field(default_factory=time.time)
    started: float = field(default_factory=time.monotonic)
    #: The round's QMP observation before its extensions.
    observe_ms: int = 0


@dataclass
class VmOutcome:
    """What one pass over a VM did, for the caller's bookkeeping."""

    #: File node-names of thin drives seen in the VM.
    drives: set[str] = field(default_factory=set)
    #: Every node-name the VM has: an entry naming none of them is stale.
    known_nodes: set[str] = field(default_factory=set)
    extensions: int = 0
    resumed: bool = False
    #: Per file node: the error that stopped its work this pass.
    errors: dict[str, PvestordError] = field(default_factory=dict)
    #: The thin drive, past its threshold again, that kept the VM paused for
    #: room at the pass's last re-arm; None when nothing did.
    waits_for: str | None = None


def ms_since(start: float) -> int:
    return round((time.monotonic() - start) * 1000)
