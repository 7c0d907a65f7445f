"""Conditions that last many passes are logged at their level once per change."""

from __future__ import annotations

import logging

from pvestord.engine.pervm import forget_vm

log = logging.getLogger(__name__)


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
