"""What the engine remembers per VM, and says once per change.

Keys are tuples that start with the VM's VMID, so that all of a VM's can be
dropped when it no longer runs here (:func:`forget_vm`): a VM must not leave
figures, or things said, for its next start. Conditions that last many
passes are logged at their level once per change (:class:`OncePerChange`);
an ENOSPC that stays is answered once (:class:`EnospcAnswers`).

The daemon's events are told once each to Proxmox's notification system
(:class:`Notices`): the engine's parts say what they see, as often as they
see it (:meth:`Notices.seen` on every pass a VM is paused for room); the
rules of :mod:`pvestord.policy.notices` keep one notice per occurrence, and
:class:`pvestord.adapters.notify.Notifier` sends it without holding up the
pass.
"""

from __future__ import annotations

import logging
from collections.abc import MutableMapping
from typing import TypeVar

from pvestord import policy
from pvestord.adapters.notify import Notifier
from pvestord.adapters.vms import LocalVm
from pvestord.engine.drive import Drive
from pvestord.policy.notices import Announcements, Event
from pvestord.policy.notices import Key as NoticeKey

log = logging.getLogger(__name__)

Key = TypeVar("Key", bound=tuple[object, ...])
Value = TypeVar("Value")


def forget_vm(remembered: MutableMapping[Key, Value], vmid: int) -> None:
    """Drop every entry of ``remembered`` whose key starts with ``vmid``: a VM
    that no longer runs here must not leave figures for its next start."""
    for key in [k for k in remembered if k[0] == vmid]:
        del remembered[key]


class OncePerChange:
    """The last message logged per (vmid, node, topic); a repeat goes to DEBUG."""

    def __init__(self) -> None:
        self._said: dict[tuple[int, str, str], str] = {}

    def say(self, key: tuple[int, str, str], level: int, message: str, *args: object,
            extra: dict[str, str]) -> None:
        text = message % args
        if self._said.get(key) == text:
            log.debug(message, *args, extra=extra)
        else:
            self._said[key] = text
            log.log(level, message, *args, extra=extra)

    def over(self, key: tuple[int, str, str]) -> None:
        """The condition behind ``key`` ended: the next occurrence is said again."""
        self._said.pop(key, None)

    def forget(self, vmid: int) -> None:
        forget_vm(self._said, vmid)


class EnospcAnswers:
    """The LV size we left after answering a drive's ENOSPC, by (vmid, QEMU
    pid, file node): a ``nospace`` that stays (a VM whose resume is blocked,
    sticky io-status) is answered once (:func:`pvestord.policy.enospc_is_new`)."""

    def __init__(self) -> None:
        self._sizes: dict[tuple[int, int, str], int] = {}

    def qemu_seen(self, vm: LocalVm) -> None:
        """``vm`` runs as its QEMU now: what an earlier QEMU of it was answered
        is moot (it ended)."""
        for key in [k for k in self._sizes if k[0] == vm.vmid and k[1] != vm.pid]:
            del self._sizes[key]

    def is_new(self, vm: LocalVm, drive: Drive) -> bool:
        """Whether ``drive``'s ENOSPC has not been answered at its size yet."""
        answered = self._sizes.get((vm.vmid, vm.pid, drive.view.file_node))
        chunksize = drive.storage.chunksize if drive.storage else 1
        return policy.enospc_is_new(answered, drive.lv_size, drive.view.allocation, chunksize)

    def answered(self, vm: LocalVm, drive: Drive, size: int) -> None:
        """``drive``'s ENOSPC was answered with its LV at ``size``."""
        self._sizes[(vm.vmid, vm.pid, drive.view.file_node)] = size

    def forget(self, vmid: int) -> None:
        forget_vm(self._sizes, vmid)


class Notices:
    """What was announced, and the sender (None: a part built without one,
    in tests and the CLI, says its events to nobody)."""

    def __init__(self, hostname: str, notifier: Notifier | None = None) -> None:
        self.announcements = Announcements(hostname)
        self.notifier = notifier

    def seen(self, event: Event) -> None:
        notice = self.announcements.seen(event)
        if notice is not None and self.notifier is not None:
            self.notifier.send(notice)

    def over(self, key: NoticeKey) -> None:
        self.announcements.over(key)

    def lowered(self, key: NoticeKey, rank: int) -> None:
        self.announcements.lowered(key, rank)


def silent() -> Notices:
    """For a part built without the daemon's notices."""
    return Notices("")
