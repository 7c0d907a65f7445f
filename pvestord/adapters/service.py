"""What both daemons need from their host: logging, sd_notify, the watchdog.

Logs go to the journal with structured fields when the process runs under
systemd (``JOURNAL_STREAM`` names our stderr, or ``--journal`` forces it), and to
stderr otherwise. Fields are passed as ``extra={"VMID": "101", ...}``: upper-case
names become journal fields, so ``journalctl -u pvestord VMID=101`` works, and
the stderr format shows them after the message.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import urllib.parse
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

#: Journal fields our log calls may carry (``extra=``); shown on stderr too.
FIELDS = ("VMID", "BLOCK_NODE", "LV", "VG", "OLD_SIZE", "NEW_SIZE", "DURATION_MS", "REASON",
          "ROUND_STARTED", "QMP_MS", "LOCK_WAIT_MS", "LVM_MS",
          # an LV found left suspended, and resumed (engine/suspension.py)
          "DM_NAME", "DM_STATE",
          # stale device-mapper tables and blocked resumes (extender.py)
          "THRESHOLD", "TABLE", "TABLE_SIZE", "LV_SIZE", "DEVICE", "RESUME_BLOCKED",
          # extensions held back by a live migration (daemon.py)
          "DEFERRED",
          # a thin drive whose device does not pause on ENOSPC (extender.py)
          "WERROR",
          # the metadata watch (nodereport.py)
          "MDA_FREE", "MDA_SIZE",
          # a thin VG crossing its capacity guards (publisher.py)
          "CAPACITY_LEVEL", "VG_FREE",
          # a block job whose write failed (qmeventd_py/session.py); a snapshot
          # delete's job the storage plugin did not prepare (jobroom.py)
          "JOB", "JOB_ACTION", "UNPREPARED_JOB",
          # a VM writing another VM's disk, and that disk's VM (extender.py)
          "OWNER",
          # what was unpaused (settle.py); a failure cleared, or failing again (failures.py)
          "RESUMED", "RECOVERED", "STILL_FAILING",
          # a running VM's copy target reduced under a pause (livereduce.py)
          "LIVE_REDUCTION",
          # a QEMU's event connection and the queue entries it brought (qmeventd_py)
          "QEMU_PID", "QMP_SESSION", "ENTRY",
          # a refused peer, a vzdump backup, a QEMU's end and cleanup (qmeventd_py)
          "DROPPED", "PEER_PID", "PEER_UID", "BACKUP", "TERMINATE", "CLEANUP",
          # the storage configuration, a watched folder, a VM seen (engine, watch.py)
          "CONFIG", "STORAGES", "FOLDER", "WATCH", "VM_STATE",
          # what kind of failure a pass met (failures.py)
          "FAILURE",
          # a pvestord: section gone from storage.cfg, or back (configsource.py); its
          # text to put back and the command that does it
          "STORAGE", "STORAGE_STATE", "LAST_SEEN", "SECTION", "RESTORE",
          # a notification handed to Proxmox's notification system (notify.py)
          "NOTIFICATION", "SEVERITY")


def stderr_value(value: object) -> str:
    """A field's value as the stderr format shows it: as it is, unless it holds
    a blank (a storage.cfg section, a command) or a ``%``: then percent-encoded
    (``urllib.parse.unquote`` gives it back), so that the line stays one line
    of blank-separated ``KEY=value``."""
    text = str(value)
    if "%" in text or any(c.isspace() for c in text):
        return urllib.parse.quote(text, safe="")
    return text


class _FieldsFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        fields = [f"{k}={stderr_value(getattr(record, k))}" for k in FIELDS
                  if hasattr(record, k)]
        return f"{text} [{' '.join(fields)}]" if fields else text


def _journal_wanted() -> bool:
    # systemd sets JOURNAL_STREAM to "dev:inode" of the stream it connected to
    # our stderr; if that is still our stderr, the journal is listening.
    stream = os.environ.get("JOURNAL_STREAM")
    if not stream:
        return False
    try:
        st = os.fstat(sys.stderr.fileno())
    except (OSError, ValueError):
        return False
    return stream == f"{st.st_dev}:{st.st_ino}"


def setup_logging(ident: str, *, verbose: bool = False, journal: bool | None = None) -> None:
    """Route the root logger to the journal or stderr, once per process."""
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.setLevel(logging.DEBUG if verbose else logging.INFO)
    use_journal = _journal_wanted() if journal is None else journal
    handler: logging.Handler
    if use_journal:
        from systemd.journal import JournalHandler

        handler = JournalHandler(SYSLOG_IDENTIFIER=ident)
        handler.setFormatter(logging.Formatter("%(message)s"))
    else:
        stream_handler = logging.StreamHandler(sys.stderr)
        stream_handler.setFormatter(_FieldsFormatter(
            "%(asctime)s " + ident + " %(levelname)s %(name)s: %(message)s"))
        handler = stream_handler
    root.addHandler(handler)
    # qemu.qmp logs every message at DEBUG and each failed connection with a
    # traceback at ERROR; our own one-line errors say the same, so its own
    # output is for --verbose only.
    logging.getLogger("qemu.qmp").setLevel(logging.DEBUG if verbose else logging.CRITICAL)


def fields(**values: Any) -> dict[str, str]:
    """``extra=`` for a log call: journal fields with string values."""
    return {k: str(v) for k, v in values.items()}


def notify(state: str) -> None:
    """``sd_notify(state)``; a no-op when not run by systemd."""
    if not os.environ.get("NOTIFY_SOCKET"):
        return
    try:
        import systemd.daemon
    except ImportError:  # pragma: no cover - systemd-python is a dependency
        log.warning("NOTIFY_SOCKET is set but systemd-python is missing")
        return
    systemd.daemon.notify(state)


def watchdog_interval() -> float | None:
    """Half the watchdog period systemd asked for, or None when it asked for none."""
    usec = os.environ.get("WATCHDOG_USEC")
    pid = os.environ.get("WATCHDOG_PID")
    if not usec or (pid and pid != str(os.getpid())):
        return None
    try:
        return int(usec) / 2e6
    except ValueError:
        return None


async def watchdog_loop(wedged: Callable[[], str | None] | None = None) -> None:
    """Ping systemd's watchdog while the daemon makes progress.

    ``wedged`` says why the daemon makes none (None while it does); without
    it, a stuck event loop is the only thing that stops the pings. A daemon
    whose loop runs but whose work is stuck (a pass that cannot be cancelled)
    stops feeding the watchdog, and systemd restarts it after ``WatchdogSec``.
    """
    interval = watchdog_interval()
    if interval is None:
        return
    stuck: str | None = None
    while True:
        problem = wedged() if wedged is not None else None
        if problem is None:
            notify("WATCHDOG=1")
            if stuck is not None:
                log.info("making progress again: feeding the watchdog again")
            stuck = None
        elif stuck is None:
            log.error("no progress: %s; not feeding the watchdog (systemd restarts the daemon "
                      "when WatchdogSec runs out)", problem)
            stuck = problem
        await asyncio.sleep(interval)
