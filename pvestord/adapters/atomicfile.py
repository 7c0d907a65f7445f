"""Files replaced whole: a temporary file in the same directory, fsynced and
renamed over the target, so that readers never take a lock and never see half
a file (the extend queue, its rejected file, the node reports, the daemon's
status and metrics). A target that
is a symbolic link is refused: whoever controls the link would choose where
root writes.

The errors are :class:`pvestord.policy.queueformat.QueueError`, as they were
when this lived in the queue module: its callers catch that.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
import tempfile
from pathlib import Path

from pvestord.adapters import tally
from pvestord.policy.queueformat import QueueError

log = logging.getLogger(__name__)


def refuse_symlink(path: Path) -> None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as err:
        raise QueueError(f"cannot stat {path}: {err.strerror}") from err
    if stat.S_ISLNK(st.st_mode):
        raise QueueError(f"{path} is a symbolic link; refusing to follow it (a link would "
                         "let its owner choose where root writes); replace it with a file")
    if not stat.S_ISREG(st.st_mode):
        raise QueueError(f"{path} is not a regular file")


def read_bounded(path: Path, max_read: int) -> bytes:
    """The file at ``path`` (empty if missing); refused through a link or past
    ``max_read`` bytes."""
    refuse_symlink(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return b""
    except OSError as err:
        raise QueueError(f"cannot open {path}: {err.strerror}") from err
    try:
        size = os.fstat(fd).st_size
        if size > max_read:
            raise QueueError(f"{path} is {size} bytes, far beyond the queue's bound; "
                             "refusing to read it: move it aside and check who writes it")
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)
    except OSError as err:
        raise QueueError(f"cannot read {path}: {err.strerror}") from err
    finally:
        os.close(fd)


def write_atomically(path: Path, data: bytes) -> None:
    """A cluster file replaced whole: :func:`replace_whole`, durable, and counted
    as a write to pmxcfs.

    Also what the node reports (:mod:`pvestord.engine.nodereport`) are written with.
    """
    tally.happened("cluster_write")
    replace_whole(path, data)


def replace_whole(path: Path, data: bytes, *, durable: bool = True) -> None:
    """Temporary file in the same directory, fsync, rename over ``path``, fsync the directory.

    The temporary file's name is unpredictable and created exclusively
    (``mkstemp``): whoever may write in the directory cannot plant a link
    there that makes root write elsewhere. A file rewritten every few seconds
    whose loss in a crash costs nothing passes ``durable=False``: no fsync,
    so no journal commit each time.
    """
    refuse_symlink(path)
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as err:
        raise QueueError(f"cannot create a temporary file beside {path}: {err.strerror}") from err
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            with contextlib.suppress(OSError):  # pmxcfs decides modes itself
                os.fchmod(fd, 0o644)
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, path)
    except OSError as err:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise QueueError(f"cannot write {path}: {err.strerror}") from err
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if not durable:
        return
    try:
        dfd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        os.fsync(dfd)
    except OSError as err:  # some FUSE file systems cannot fsync a directory
        log.debug("fsync of %s: %s", path.parent, err.strerror)
    finally:
        os.close(dfd)


def remove_leftover_temporaries(path: Path) -> None:
    """Remove the temporaries of :func:`write_atomically` beside ``path``.

    Only under the lock every writer of ``path`` holds: any temporary file
    that exists then was left by a writer that died."""
    prefix = f".{path.name}."
    try:
        names = [e.name for e in os.scandir(path.parent)
                 if e.name.startswith(prefix) and e.name.endswith(".tmp")]
    except OSError:
        return
    for name in names:
        with contextlib.suppress(OSError):
            os.unlink(path.parent / name)
            log.info("removed %s, left by a writer that died", path.parent / name)
