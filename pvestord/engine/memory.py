"""What the engine remembers per VM, and says once per change.

Keys are tuples that start with the VM's VMID, so that all of a VM's can be
dropped when it no longer runs here (:func:`forget_vm`): a VM must not leave
figures, or things said, for its next start. Conditions that last many
passes are logged at their level once per change (:class:`OncePerChange`).
"""

from __future__ import annotations

import logging
from collections.abc import MutableMapping
from typing import TypeVar

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
