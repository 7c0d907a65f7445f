"""What a message from a peer means: pure functions, no I/O.

Everything here takes whatever JSON a peer sent (QEMU's events, vzdump's
hello) and never raises: a message we do not understand becomes ``None`` or a
:class:`Rejected` with the reason, and the server logs it. A daemon that one
odd event could crash would lose every other VM's events with it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from pvestord.policy import Reason
from pvestord.policy.proxmox import vmid_from_text
from pvestord.policy.queueformat import Entry, InvalidEntryError, check_block_node

# Proxmox VMIDs are 100..999999999; we accept any positive id that fits
# (pvestord.policy.proxmox.VMID_TEXT).

#: QEMU's rule for ids (``id_wellformed``), which a job id follows; the
#: length cap only keeps a hostile peer's string out of the journal.
_JOB_ID = re.compile(r"[A-Za-z][A-Za-z0-9._-]{0,127}")


@dataclass(frozen=True)
class QueueRequest:
    """A drive needs more room: a queue entry for ``block_node``."""

    block_node: str
    reason: Reason


@dataclass(frozen=True)
class Shutdown:
    """QEMU reported ``SHUTDOWN``; ``guest`` when the guest asked for it."""

    guest: bool


@dataclass(frozen=True)
class Rejected:
    """An event we care about, but malformed: logged, not acted on."""

    event: str
    why: str


@dataclass(frozen=True)
class JobWriteFailed:
    """A block job's write failed (``BLOCK_JOB_ERROR``, operation ``write``)
    and the job is not waiting for room.

    Under ``report`` (qemu-server's jobs pass no ``on-error``) the job has
    already failed, and under ``ignore`` it goes on: there is nothing to
    resume, so this is no queue entry. It is logged, so that a failed
    snapshot delete on a thin storage has its cause in the journal. A job
    whose action is ``stop`` is queued instead (:func:`classify`): pvestord gives
    its thin drives room and resumes it if it paused on ENOSPC.
    """

    job: str
    #: The job's on-error action: ``report`` ends it, ``stop`` pauses it.
    action: str


Action = QueueRequest | Shutdown | JobWriteFailed | Rejected


def classify(message: object) -> Action | None:
    """The action for one QMP event; None for events we do not handle."""
    if not isinstance(message, Mapping):
        return None
    name = message.get("event")
    if not isinstance(name, str):
        return None
    data = message.get("data", {})
    if not isinstance(data, Mapping):
        data = {}
    if name == "BLOCK_WRITE_THRESHOLD":
        node = data.get("node-name")
        if not _is_name(node):
            return Rejected(name, f"bad node-name {node!r}")
        assert isinstance(node, str)
        return QueueRequest(node, Reason.THRESHOLD)
    if name == "BLOCK_IO_ERROR":
        # Only a write that ran out of space means "extend"; any other I/O
        # error is not ours to fix. QEMU sends `nospace` only for ENOSPC.
        if data.get("nospace") is not True:
            return None
        # `device` is always present but empty for -blockdev drives;
        # `node-name` (QEMU >= 2.8) names the BlockBackend's root node.
        for key in ("node-name", "device"):
            value = data.get(key)
            if _is_name(value):
                assert isinstance(value, str)
                return QueueRequest(value, Reason.NOSPACE)
        return Rejected(name, f"no usable node-name or device in {dict(data)!r}")
    if name == "BLOCK_JOB_ERROR":
        if data.get("operation") != "write":
            return None  # a read error is the source's, never room to make
        job, action = data.get("device"), data.get("action")
        if not (isinstance(job, str) and _JOB_ID.fullmatch(job)):
            return Rejected(name, f"bad job id {job!r}")
        if action not in ("ignore", "report", "stop"):
            return Rejected(name, f"bad action {action!r}")
        assert isinstance(action, str)
        if action == "stop" and _is_name(job):
            # Paused, perhaps on ENOSPC (the pass reads io-status): the
            # entry names the job, and looks at every thin drive of the VM.
            return QueueRequest(job, Reason.JOB)
        return JobWriteFailed(job, action)
    if name == "JOB_STATUS_CHANGE":
        # A job that starts (or runs again) makes its target writable: a
        # thin drive the pass arms now, not at the next reconcile.
        if data.get("status") != "running":
            return None
        job = data.get("id")
        if not isinstance(job, str) or not _JOB_ID.fullmatch(job):
            return Rejected(name, f"bad job id {job!r}")
        # An id too long for a queue entry waits for the next reconcile.
        return QueueRequest(job, Reason.JOB) if _is_name(job) else None
    if name == "SHUTDOWN":
        # qmeventd: a missing or non-boolean `guest` counts as "not the guest".
        return Shutdown(data.get("guest") is True)
    return None


def _is_name(value: object) -> bool:
    # QEMU's node-name rule, as the queue format enforces it.
    if not isinstance(value, str):
        return False
    try:
        check_block_node(value)
    except InvalidEntryError:
        return False
    return True


def to_entry(vmid: int, action: QueueRequest, *, origin: str, ts: int) -> Entry | Rejected:
    """The queue entry for an :class:`QueueRequest` of VM ``vmid``, or why there is none
    (a VMID outside Proxmox's range, say)."""
    try:
        return Entry(vmid, action.block_node, action.reason, origin=origin, ts=ts)
    except InvalidEntryError as err:
        return Rejected(action.reason.value, str(err))


Hello = Literal["qmp", "vzdump"]


def hello_kind(message: object) -> Hello | None:
    """Who a peer is, from its first message: QEMU's greeting or vzdump's hello."""
    if not isinstance(message, Mapping):
        return None
    qmp = message.get("QMP")
    if isinstance(qmp, Mapping):
        return "qmp"
    if "vzdump" in message:
        return "vzdump"
    return None


def vzdump_vmid(message: object) -> int | None:
    """The VMID of ``{"vzdump": {"vmid": "N"}}``; None when it is unusable.

    vzdump sends the VMID as a string; a JSON number is accepted too.
    """
    if not isinstance(message, Mapping):
        return None
    body = message.get("vzdump")
    if not isinstance(body, Mapping):
        return None
    vmid = body.get("vmid")
    if isinstance(vmid, bool):
        return None
    if isinstance(vmid, int):
        vmid = str(vmid)
    return vmid_from_text(vmid) if isinstance(vmid, str) else None
