"""The storage configuration as the daemon and the commands read it."""

from __future__ import annotations

import logging
from pathlib import Path

from pvestord.adapters.config import StorageConfig, load_storage_config, parse_storage_config
from pvestord.adapters.service import fields
from pvestord.errors import ConfigError

#: The daemon's messages keep the logger name they always had.
log = logging.getLogger("pvestord.engine.daemon")


class StorageConfigSource:
    """The storage configuration, re-read when the file changes.

    A file that becomes invalid keeps the last good configuration in force
    (logged once): an admin's typo must not stop extensions cluster-wide.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._stamp: tuple[int, int] | None = None
        self._config = parse_storage_config("", str(path))
        self._last_problem: str | None = None

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
                self._config = load_storage_config(self.path)
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

    def _problem(self, message: str, config: str) -> None:
        """Log ``message`` as an error once; the same again only at debug level."""
        if message != self._last_problem:
            log.error("%s", message, extra=fields(CONFIG=config))
            self._last_problem = message
        else:
            log.debug("%s", message, extra=fields(CONFIG=config, STILL_FAILING="yes"))
