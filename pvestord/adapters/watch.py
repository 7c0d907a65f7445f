"""Waking the daemon when its folders change: inotify on the queue's folder and
on qemu-server's run folder.

inotify is the fast path only; the daemon polls every ``poll_interval`` as well,
because other nodes' writes to the cluster queue reach this node through FUSE,
which reports nothing.

A folder that does not exist yet is awaited through its parent and watched
from the moment it appears. That is the normal case at boot for
``/run/qemu-server``: pvestord starts before any guest (the unit orders it
before ``pve-guests.service``) and qemu-server makes the folder when it starts
the first one. Without this, the daemon would notice new VMs only at its poll.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from pvestord.adapters.service import fields

log = logging.getLogger(__name__)


class FolderWatch:
    """Calls ``wake()`` when a file whose name ``wanted(name)`` accepts is
    created, written and closed, or renamed into one of the folders."""

    def __init__(self, wake: Callable[[], None], wanted: Callable[[str], bool]) -> None:
        self._wake = wake
        self._wanted = wanted
        self._watched: set[Path] = set()
        #: Folders that do not exist yet, each with the watch on its parent.
        self._awaited: dict[Path, int] = {}
        self._manager: Any = None
        self._notifier: Any = None
        self._mask = 0

    def start(self, folders: Iterable[Path], loop: asyncio.AbstractEventLoop) -> None:
        """Watch ``folders``; without pyinotify, say so (the daemon's poll
        then finds every change alone)."""
        try:
            import pyinotify
        except ImportError as err:
            log.warning("pyinotify unavailable (%s): polling only", err)
            return
        self._mask = pyinotify.IN_CLOSE_WRITE | pyinotify.IN_MOVED_TO | pyinotify.IN_CREATE
        self._manager = pyinotify.WatchManager()
        for folder in folders:
            self._watch_or_await(folder)
        self._notifier = pyinotify.AsyncioNotifier(self._manager, loop,
                                                   default_proc_fun=self._on_event)

    def stop(self) -> None:
        if self._notifier is not None:
            self._notifier.stop()
            self._notifier = None

    def _add(self, folder: Path) -> int | None:
        if not folder.is_dir():
            return None  # pyinotify would log an ERROR of its own for it
        result = self._manager.add_watch(str(folder), self._mask, quiet=True)
        wd = result.get(str(folder), -1) if result else -1
        return wd if isinstance(wd, int) and wd >= 0 else None

    def _watch_or_await(self, folder: Path) -> None:
        if self._add(folder) is not None:
            self._watched.add(folder)
            return
        parent_wd = self._add(folder.parent)
        if parent_wd is None:
            log.warning("cannot watch %s or its parent with inotify: polling it", folder,
                        extra=fields(FOLDER=folder, WATCH="polling"))
            return
        # It may have appeared between the two calls.
        if self._add(folder) is not None:
            self._watched.add(folder)
            self._drop_parent_watch(folder.parent, parent_wd)
            return
        self._awaited[folder] = parent_wd
        log.info("%s does not exist yet: watching for it, and polling it meanwhile", folder,
                 extra=fields(FOLDER=folder, WATCH="awaiting"))

    def _drop_parent_watch(self, parent: Path, wd: int) -> None:
        """Stop watching ``parent`` unless it is watched for itself or for
        another awaited folder: its other files' events are only noise."""
        if parent in self._watched or wd in self._awaited.values():
            return
        self._manager.rm_watch(wd, quiet=True)

    def _on_event(self, event: Any) -> None:
        folder = Path(event.path)
        name = str(getattr(event, "name", "") or "")
        if folder in self._watched and self._wanted(name):
            self._wake()
        for awaited, parent_wd in list(self._awaited.items()):
            if folder == awaited.parent and name == awaited.name:
                if self._add(awaited) is None:
                    continue  # not a folder we can watch (yet): keep waiting
                del self._awaited[awaited]
                self._watched.add(awaited)
                self._drop_parent_watch(awaited.parent, parent_wd)
                log.info("%s appeared: watching it", awaited,
                         extra=fields(FOLDER=awaited, WATCH="watching"))
                # Files may have been made in it before the watch was added.
                self._wake()
