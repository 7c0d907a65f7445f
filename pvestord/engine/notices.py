"""The daemon's events, told once each to Proxmox's notification system.

The engine's parts say what they see, as often as they see it
(:meth:`Notices.seen` on every pass a VM is paused for room); the rules of
:mod:`pvestord.policy.notices` keep one notice per occurrence, and
:class:`pvestord.adapters.notify.Notifier` sends it without holding up the pass.
"""

from __future__ import annotations

from pvestord.adapters.notify import Notifier
from pvestord.policy.notices import Announcements, Event, Key


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

    def over(self, key: Key) -> None:
        self.announcements.over(key)

    def lowered(self, key: Key, rank: int) -> None:
        self.announcements.lowered(key, rank)


def silent() -> Notices:
    """For a part built without the daemon's notices."""
    return Notices("")
