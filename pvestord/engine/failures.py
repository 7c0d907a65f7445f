"""Failures of a pass: retried with a backoff per VM, logged once per change of state."""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass

from pvestord.adapters.service import fields
from pvestord.engine.migration import ExtensionsDeferred
from pvestord.errors import PassDeferred

log = logging.getLogger(__name__)

#: Retry delays after a failed pass, per VM: doubling from the first to the last.
BACKOFF_FIRST = 1.0
BACKOFF_MAX = 60.0
#: Retry delays for a busy VM (migrating): doubling from the first to the
#: last, reset once a pass finds it not busy. Short, because the VM may be
#: paused and waiting for the end of the migration; a backoff at all, because
#: a retry at once opened thousands of QMP connections a second to a
#: migrating QEMU.
BUSY_FIRST = 0.5
BUSY_MAX = 4.0


@dataclass
class VmRetry:
    attempts: int = 0
    not_before: float = 0.0
    first: float = BACKOFF_FIRST
    maximum: float = BACKOFF_MAX

    def failed(self) -> float:
        delay = min(self.maximum, self.first * 2.0 ** min(self.attempts, 64))
        self.attempts += 1
        self.not_before = time.monotonic() + delay
        return delay


class Failures:
    """Per-VM backoffs (failed, busy) and the errors said, once each."""

    def __init__(self, *, reconcile: Callable[[int], None], wake: Callable[[], None]) -> None:
        #: Asks for a full pass over a VM when its backoff ends.
        self._reconcile = reconcile
        self._wake = wake
        self._retry: dict[int, VmRetry] = {}
        self._busy: dict[int, VmRetry] = {}
        #: What was said of a VM's deferral (migrating, paused), until it ends.
        self._said_deferral: dict[int, str] = {}
        self._errors: dict[tuple[int, str], str] = {}

    @property
    def errors(self) -> dict[tuple[int, str], str]:
        """The errors said and not yet cleared, by (vmid, node): for status."""
        return dict(self._errors)

    @property
    def busy(self) -> set[int]:
        """VMs in a busy backoff (a migration defers them): for status."""
        return set(self._busy)

    def waiting(self, vmid: int, now: float) -> bool:
        """Whether ``vmid``'s backoff (failed or busy) has not ended yet."""
        return any(retry is not None and now < retry.not_before
                   for retry in (self._retry.get(vmid), self._busy.get(vmid)))

    def forget(self, vmid: int) -> None:
        """``vmid`` no longer runs here."""
        self._retry.pop(vmid, None)
        self._busy.pop(vmid, None)
        self._said_deferral.pop(vmid, None)

    def not_busy(self, vmid: int) -> None:
        """A pass found ``vmid`` not busy: its busy backoff starts over."""
        self._busy.pop(vmid, None)
        self._said_deferral.pop(vmid, None)

    def succeeded(self, vmid: int) -> None:
        self._retry.pop(vmid, None)

    def backoff(self, vmid: int) -> None:
        # Whatever failed, the VM gets a full pass when its backoff ends: a
        # failed reconcile has no queue entry to bring it back.
        self._reconcile(vmid)
        delay = self._retry.setdefault(vmid, VmRetry()).failed()
        log.debug("VM %d: next attempt in %g s", vmid, delay)

    def busy_backoff(self, vmid: int, err: PassDeferred) -> None:
        """Retry a busy VM soon, but not at once; say a deferral once, and warn
        once if the VM waits paused."""
        self._reconcile(vmid)
        delay = self._busy.setdefault(vmid, VmRetry(first=BUSY_FIRST, maximum=BUSY_MAX)).failed()
        asyncio.get_running_loop().call_later(delay, self._wake)
        if isinstance(err, ExtensionsDeferred):
            # Said once per deferral (and once more if the VM pauses for room
            # meanwhile), with the DEFERRED field: the journal shows when a
            # migration held extensions back.
            said = self._said_deferral.get(vmid)
            if err.paused and said != "paused":
                self._said_deferral[vmid] = "paused"
                log.warning("VM %d is paused for room and migrating away: its extension is "
                            "deferred to the destination, or to the end of the migration here",
                            vmid, extra=fields(VMID=vmid, DEFERRED="paused"))
                return
            if said is None:
                self._said_deferral[vmid] = "migrating"
                log.info("VM %d is migrating away: its extensions are deferred", vmid,
                         extra=fields(VMID=vmid, DEFERRED="migrating"))
                return
        deferred = "busy"  # a VM in a migration's state: nothing to do before it ends
        if isinstance(err, ExtensionsDeferred):
            deferred = "paused" if err.paused else "migrating"
        log.debug("%s; next attempt in %g s", err, delay,
                  extra=fields(VMID=vmid, DEFERRED=deferred))

    def note_error(self, key: tuple[int, str], error: str | BaseException,
                   level: int = logging.ERROR, **journal: str) -> None:
        """Log ``error`` once at ``level``, the same again at debug level.
        An exception's kind goes into the ``FAILURE`` field, in words
        (``LockTimeout`` is ``lock-timeout``): the journal finds every lock
        timeout of a night without matching messages. ``journal`` adds
        fields of the caller's (the ``VG`` of a VG's problem)."""
        message = str(error)
        where = {**_where(key), **fields(**journal)}
        if isinstance(error, BaseException):
            where = {**where, **fields(FAILURE=failure_kind(error))}
        if self._errors.get(key) != message:
            self._errors[key] = message
            log.log(level, "%s (will retry)", message, extra=where)
        else:
            log.debug("still failing: %s", message, extra={**where, **fields(STILL_FAILING="yes")})

    def clear_error(self, key: tuple[int, str], message: str) -> None:
        if self._errors.pop(key, None) is not None:
            log.info("%s", message, extra={**_where(key), **fields(RECOVERED="yes")})


def failure_kind(error: BaseException) -> str:
    """``error``'s class name in lower-case words: ``CommandError`` is
    ``command``, ``LockTimeout`` ``lock-timeout``."""
    name = type(error).__name__.removesuffix("Error") or type(error).__name__
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "-", name).lower()


def _where(key: tuple[int, str]) -> dict[str, str]:
    """The journal fields of a failure's key: its VM and block node, none
    for the daemon's own (VMID 0: the queue, the node report, a VG)."""
    vmid, node = key
    return fields(VMID=vmid, BLOCK_NODE=node) if vmid else {}
