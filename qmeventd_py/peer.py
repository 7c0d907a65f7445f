"""Who is on the other end of an accepted connection, and which VM it is.

The kernel tells us the peer's pid and uid (``SO_PEERCRED``). A pid alone can
be recycled, so we pin the process with a pidfd: ``SO_PEERPIDFD`` (Linux 6.5)
refers to the very process that connected; on older kernels ``pidfd_open``
right after ``accept`` leaves a tiny window in which the peer could exit and
its pid be reused before we open it (Proxmox's qmeventd has the same window).
After reading ``/proc/<pid>/cmdline`` we check through the pidfd that the
process is still alive: then the command line we read is its own.

The VMID comes from the command line: ``-id N`` (Proxmox's QEMU, what
qmeventd reads) or else the ``-pidfile .../<vmid>.pid`` argument that
qemu-server always passes and upstream QEMU understands.
"""

from __future__ import annotations

import os
import signal
import socket
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pvestord.errors import PvestordError
from pvestord.policy.proxmox import pidfile_vmid, vmid_from_text

#: ``SO_PEERPIDFD`` from <asm-generic/socket.h>; Python 3.11 does not name it.
SO_PEERPIDFD = getattr(socket, "SO_PEERPIDFD", 77)



class PeerError(PvestordError):
    """A peer we cannot or will not serve; the message says why.

    :attr:`why` says it in one word, for the journal's ``DROPPED`` field
    (``journalctl -u qmeventd-py DROPPED=not-root``): ``credentials``,
    ``gone``, ``identity``, ``not-a-vm``, ``not-root``, ``silent``,
    ``closed``, ``garbage``, ``too-long``, ``early-data``, ``unknown-hello``,
    ``bad-greeting``, ``negotiation`` or ``bad-hello``.
    """

    def __init__(self, message: str, *, why: str) -> None:
        super().__init__(message)
        self.why = why


@dataclass
class Peer:
    """An accepted peer: its credentials and a pidfd pinning its process."""

    pid: int
    uid: int
    gid: int
    pidfd: int | None

    def close(self) -> None:
        if self.pidfd is not None:
            os.close(self.pidfd)
            self.pidfd = None

    def alive(self) -> bool:
        """Whether the pinned process still exists (signal 0 through the pidfd)."""
        if self.pidfd is None:
            return False
        try:
            signal.pidfd_send_signal(self.pidfd, 0)
        except ProcessLookupError:
            return False
        return True

    def describe(self) -> str:
        return f"pid {self.pid} uid {self.uid}"


def identify(conn: socket.socket) -> Peer:
    """Credentials of ``conn``'s peer, with its process pinned.

    :raise PeerError: the kernel gave no usable credentials, or the peer is gone.
    """
    try:
        raw = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except OSError as err:
        raise PeerError(f"no peer credentials: {err}", why="credentials") from err
    pid, uid, gid = struct.unpack("3i", raw)
    if pid <= 0:
        raise PeerError("peer credentials carry no pid", why="credentials")
    pidfd: int | None
    try:
        pidfd = conn.getsockopt(socket.SOL_SOCKET, SO_PEERPIDFD)
    except OSError:
        try:
            pidfd = os.pidfd_open(pid)
        except ProcessLookupError as err:
            raise PeerError(f"peer pid {pid} exited before it could be pinned",
                            why="gone") from err
        except OSError as err:
            raise PeerError(f"cannot pin peer pid {pid}: {err}", why="credentials") from err
    return Peer(pid, uid, gid, pidfd)


def vmid_from_argv(argv: Sequence[str]) -> int | None:
    """The VMID named by a QEMU command line: ``-id N``, else ``-pidfile .../N.pid``."""
    for flag in ("-id", "--id"):
        value = _option(argv, flag)
        if value is not None:
            return vmid_from_text(value)
    for flag in ("-pidfile", "--pidfile"):
        value = _option(argv, flag)
        if value is not None:
            return pidfile_vmid(Path(value).name)
    return None


def _option(argv: Sequence[str], flag: str) -> str | None:
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(flag + "="):
            return arg[len(flag) + 1:]
    return None


def vmid_of(peer: Peer, proc: Path = Path("/proc")) -> int:
    """The VMID of a QEMU peer, read from its command line.

    :raise PeerError: no usable ``-id``/``-pidfile`` argument, or the process
        exited while we read it (its pid may already name someone else).
    """
    try:
        raw = (proc / str(peer.pid) / "cmdline").read_bytes()
    except OSError as err:
        raise PeerError(f"cannot read the command line of pid {peer.pid}: {err}",
                        why="identity") from err
    if not peer.alive():
        raise PeerError(f"peer pid {peer.pid} exited while we identified it", why="gone")
    argv = [a.decode(errors="replace") for a in raw.split(b"\0")]
    vmid = vmid_from_argv(argv)
    if vmid is None:
        # Quoted: a peer's command line is its own to write, newlines and
        # all, and must not forge lines of our log.
        shown = " ".join(argv)[:300]
        raise PeerError(f"pid {peer.pid} has no usable -id or -pidfile <vmid>.pid"
                        f" argument: {shown!r}", why="not-a-vm")
    return vmid
