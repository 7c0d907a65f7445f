"""The storage configuration as the daemon and the commands read it.

The daemon's source also keeps a node-local copy of every ``pvestord:``
section (:mod:`pvestord.policy.vanished`) and, while one has vanished from
the file, reads the file as if the copy were still in it: a guest must not
pause because someone edited an unrelated storage on a node without the
plugin. The section's VG and LVs are still there and still the guest's; the
extensions take the same locks as before (the id is the same), so every
pvestord node that kept the copy keeps serialising on it; the copy is only
ever used for what pvestord does, never written to storage.cfg without the
admin asking (``pvestord storage restore``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from pathlib import Path

from pvestord.adapters import keptsections
from pvestord.adapters.config import (
    PLUGIN_TYPE,
    StorageConfig,
    load_storage_config,
    parse_storage_config,
)
from pvestord.adapters.service import fields
from pvestord.engine.memory import Notices, silent
from pvestord.errors import ConfigError
from pvestord.policy.notices import StorageVanished, vanished_key
from pvestord.policy.vanished import (
    Kept,
    observe,
    restore_command,
    section_text,
    vanished_message,
    with_sections,
)

log = logging.getLogger(__name__)


class StorageConfigSource:
    """The storage configuration, re-read when the file changes.

    A file that becomes invalid keeps the last good configuration in force
    (logged once): an admin's typo must not stop extensions cluster-wide.
    """

    def __init__(self, path: Path, kept_file: Path | None = None, *,
                 notices: Notices | None = None) -> None:
        """``kept_file``: where the ``pvestord:`` sections are kept (the
        daemon's); None: not kept (one-shot commands, which must not judge
        what vanished from a copy the daemon owns)."""
        self.path = path
        self._stamp: tuple[int, int] | None = None
        self._config = parse_storage_config("", str(path))
        self._last_problem: str | None = None
        self._kept_file = kept_file
        self._kept: dict[str, Kept] = {}
        self._kept_problem: str | None = None
        #: Vanished sections this daemon has logged its error for.
        self._announced: set[str] = set()
        #: The same, once, to Proxmox's notification system.
        self.notices = notices if notices is not None else silent()
        if kept_file is not None:
            try:
                self._kept = keptsections.read(kept_file)
            except keptsections.KeptSectionsError as err:
                # Started afresh: the next reading of storage.cfg replaces it.
                log.error("%s; starting a new copy of the pvestord sections", err,
                          extra=fields(CONFIG="kept-unreadable"))

    def reload_kept(self) -> None:
        """Read the copy again (SIGHUP: after ``pvestord storage forget``) and
        storage.cfg with it at the next :meth:`get`.

        The copy on disk wins over the one in memory: a section the admin
        forgot is no longer reported or served. One that is still in
        storage.cfg comes back into the copy at once, from the file."""
        if self._kept_file is None:
            return
        try:
            self._kept = keptsections.read(self._kept_file)
        except keptsections.KeptSectionsError as err:
            log.error("%s; keeping the copy in memory", err,
                      extra=fields(CONFIG="kept-unreadable"))
            return
        self._announced &= set(self._kept)
        self._stamp = None

    @property
    def vanished(self) -> Mapping[str, Kept]:
        """The kept ``pvestord:`` sections that are gone from the file, by id."""
        return {sid: k for sid, k in self._kept.items() if k.vanished is not None}

    @property
    def kept(self) -> Mapping[str, Kept]:
        """Every kept ``pvestord:`` section, there or gone, by id."""
        return dict(self._kept)

    def get(self) -> StorageConfig:
        try:
            st = self.path.stat()
            stamp = (st.st_mtime_ns, st.st_size)
        except OSError as err:
            self._problem(f"cannot read storage configuration {self.path}: {err.strerror};"
                          " no storage is thin until it can be read", "unreadable")
            self._config = parse_storage_config("", str(self.path))
            self._stamp = None
            return self._config
        if stamp != self._stamp:
            try:
                self._config = self._load()
                self._stamp = stamp
                if self._last_problem is not None:
                    log.info("storage configuration %s is valid again", self.path,
                             extra=fields(CONFIG="loaded", RECOVERED="yes"))
                self._last_problem = None
                for warning in self._config.warnings:
                    log.warning("%s", warning, extra=fields(CONFIG="warning"))
                thin = sorted(self._config.thin_storages)
                log.info("storage configuration %s: thin storages: %s", self.path,
                         ", ".join(thin) or "none",
                         extra=fields(CONFIG="loaded", STORAGES=",".join(thin)))
            except ConfigError as err:
                self._stamp = stamp  # the same file is not read again until it changes
                self._problem(f"{err}; keeping the previous configuration", "rejected")
        return self._config

    def _load(self) -> StorageConfig:
        if self._kept_file is None:
            return load_storage_config(self.path)
        try:
            text = self.path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as err:
            raise ConfigError(f"cannot read storage configuration {self.path}: {err}") from err
        config = parse_storage_config(text, str(self.path))
        self._observe(text, config)
        gone = self.vanished
        if not gone:
            return config
        try:
            return parse_storage_config(with_sections(text, [k.text for k in gone.values()]),
                                        str(self.path))
        except ConfigError as err:
            # Cannot happen with a copy of a section we once took as valid,
            # unless pvestord's rules changed since: then the file alone.
            log.error("the kept copy of %s no longer reads as a valid storage: %s; its VMs'"
                      " LVs are no longer grown", ", ".join(gone), err,
                      extra=fields(CONFIG="kept-invalid", STORAGE=",".join(gone)))
            return config

    def _observe(self, text: str, config: StorageConfig) -> None:
        """Compare the file with the kept sections; say what vanished or came back."""
        lines = text.split("\n")
        current = {s.id: section_text(lines, s.line) for s in config.sections
                   if s.type == PLUGIN_TYPE}
        seen = observe(self._kept, current, frozenset(s.id for s in config.sections),
                       time.time())
        # Once per section per daemon: also for one that vanished while no
        # daemon ran, or before a restart (the journal of then may be gone).
        for sid, kept in seen.vanished.items():
            if sid in self._announced:
                continue
            self._announced.add(sid)
            when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(kept.seen))
            log.error("%s", vanished_message(kept, str(self.path), when),
                      extra=fields(STORAGE=sid, STORAGE_STATE="vanished",
                                   LAST_SEEN=int(kept.seen), SECTION=kept.text,
                                   RESTORE=restore_command(sid)))
            self.notices.seen(StorageVanished(sid, str(self.path), when, restore_command(sid)))
        for sid in seen.back:
            self._announced.discard(sid)
            self.notices.over(vanished_key(sid))
            log.info("storage '%s' is back in %s", sid, self.path,
                     extra=fields(STORAGE=sid, STORAGE_STATE="back", RECOVERED="yes"))
        if seen.kept == self._kept:
            return
        self._kept = seen.kept
        assert self._kept_file is not None
        try:
            keptsections.write(self._kept_file, self._kept)
        except keptsections.KeptSectionsError as err:
            # Kept in memory meanwhile: only a restart before the file can
            # be written loses the copy.
            if str(err) != self._kept_problem:
                log.error("%s", err, extra=fields(CONFIG="kept-unwritable"))
            self._kept_problem = str(err)
        else:
            self._kept_problem = None

    def _problem(self, message: str, config: str) -> None:
        """Log ``message`` as an error once; the same again only at debug level."""
        if message != self._last_problem:
            log.error("%s", message, extra=fields(CONFIG=config))
            self._last_problem = message
        else:
            log.debug("%s", message, extra=fields(CONFIG=config, STILL_FAILING="yes"))
