"""qmeventd's duties when a VM ends: the cleanup command, and stopping a VM
that shut down.

Proxmox starts QEMU with ``-no-shutdown``: after the guest powers off, QEMU
stays in the ``shutdown`` state. qmeventd then asks ``query-status`` and, unless
a backup (vzdump) still needs the process, sends SIGTERM; a QEMU that has not
exited ``kill_timeout`` seconds later gets SIGKILL. When the QEMU's monitor
connection closes, it runs ``qm cleanup VMID GRACEFUL GUEST`` (tap devices,
volume deactivation, hookscripts). We do the same, through the pidfd that
pins the process, so a recycled pid is never signalled.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shlex
import signal
from collections.abc import Sequence
from pathlib import Path

from pvestord.adapters.command import run_async
from pvestord.adapters.service import fields
from pvestord.errors import CommandError

log = logging.getLogger(__name__)

#: Proxmox's cleanup command; used by default when it is installed.
QM = Path("/usr/sbin/qm")
#: qmeventd's default ``-t``: seconds between SIGTERM and SIGKILL.
DEFAULT_KILL_TIMEOUT = 60.0
#: ``qm cleanup`` deactivates volumes and runs hookscripts; give it time,
#: but not forever: a hung cleanup must not pile up processes.
CLEANUP_TIMEOUT = 300.0


def default_command() -> list[str] | None:
    """``qm cleanup`` when this is a Proxmox node, else no cleanup."""
    return [str(QM), "cleanup"] if QM.exists() else None


def parse_command(text: str) -> list[str]:
    """``--cleanup-cmd`` is split like a shell would, but never run by one."""
    argv = shlex.split(text)
    if not argv:
        raise ValueError("empty cleanup command")
    return argv


async def run_cleanup(command: Sequence[str], vmid: int, graceful: bool, guest: bool) -> bool:
    """Run ``COMMAND VMID GRACEFUL GUEST``; log the outcome, never raise (but cancel).

    :return: whether the command succeeded.
    """
    argv = [*command, str(vmid), "1" if graceful else "0", "1" if guest else "0"]
    log.info("VM %d: running cleanup: %s", vmid, " ".join(argv),
             extra=fields(VMID=vmid, CLEANUP="started"))
    try:
        await run_async(argv, timeout=CLEANUP_TIMEOUT)
    except CommandError as err:
        log.error("VM %d: cleanup failed: %s", vmid, err,
                  extra=fields(VMID=vmid, CLEANUP="failed"))
        return False
    return True


async def wait_exit(pidfd: int) -> None:
    """Wait until the process behind ``pidfd`` exits (callers bound the wait).

    A pidfd becomes readable when its process exits, so the wait is one
    reader callback on the event loop, no polling.
    """
    loop = asyncio.get_running_loop()
    exited = loop.create_future()

    def on_exit() -> None:
        if not exited.done():
            exited.set_result(None)

    loop.add_reader(pidfd, on_exit)
    try:
        await exited
    finally:
        loop.remove_reader(pidfd)


async def exits_within(pidfd: int, seconds: float) -> bool:
    """True when the process behind ``pidfd`` exits within ``seconds``."""
    try:
        await asyncio.wait_for(wait_exit(pidfd), seconds)
    except TimeoutError:
        return False
    return True


def signal_pidfd(pidfd: int, sig: int) -> bool:
    """Send ``sig`` through ``pidfd``; False when the process is already gone."""
    try:
        signal.pidfd_send_signal(pidfd, sig)
    except ProcessLookupError:
        return False
    return True


async def terminate(vmid: int, pid: int, pidfd: int, kill_timeout: float) -> None:
    """SIGTERM, then SIGKILL after ``kill_timeout`` s if the process is still there.

    ``pidfd`` stays owned by the caller; we duplicate it so that the caller
    closing its copy (the connection ending) does not cut our wait short.
    """
    def extra(sent: str) -> dict[str, str]:
        return fields(VMID=vmid, QEMU_PID=pid, TERMINATE=sent)

    fd = os.dup(pidfd)
    try:
        log.info("VM %d: terminating QEMU pid %d", vmid, pid, extra=extra("sigterm"))
        if not signal_pidfd(fd, signal.SIGTERM):
            log.info("VM %d: QEMU pid %d already exited", vmid, pid, extra=extra("gone"))
            return
        if await exits_within(fd, kill_timeout):
            return
        if signal_pidfd(fd, signal.SIGKILL):
            log.warning("VM %d: QEMU pid %d ignored SIGTERM for %g s; sent SIGKILL",
                        vmid, pid, kill_timeout, extra=extra("sigkill"))
    finally:
        with contextlib.suppress(OSError):
            os.close(fd)
