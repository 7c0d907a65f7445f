"""``pvestord storage restore``: a vanished ``pvestord:`` section put back in
storage.cfg; ``pvestord storage forget``: one removed on purpose, dropped
from the daemon's copy.

The text is the daemon's copy (:mod:`pvestord.adapters.keptsections`),
appended whole under the lock every writer of storage.cfg takes
(``cfs_lock_file('storage.cfg')``: the lock directory ``file-storage_cfg``
on pmxcfs, the lock :func:`pvestord.adapters.locks.queue_lock` names for any
file), so that it cannot interleave with an edit made from the GUI, the API or
``pvesm``. The file is re-read under the lock: a section that came back
meanwhile, or an id taken by another storage, is never written twice.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pvestord.adapters import atomicfile, keptsections
from pvestord.adapters.locks import Lock, queue_lock
from pvestord.adapters.storagecfg import parse_sections
from pvestord.errors import PvestordError
from pvestord.policy.queueformat import QueueError
from pvestord.policy.vanished import Kept, with_sections

#: storage.cfg is far below this; a bound, not a limit anyone meets.
MAX_READ = 16 << 20


class RestoreError(PvestordError):
    """The section cannot be put back (unknown, already there, I/O)."""


@dataclass(frozen=True)
class Restored:
    kept: Kept
    #: False: only shown (no ``--apply``).
    written: bool


def kept_section(kept_file: Path, storeid: str) -> Kept:
    """The copy of ``storeid``'s section.

    :raises RestoreError: this node keeps no copy of it.
    """
    try:
        kept = keptsections.read(kept_file)
    except keptsections.KeptSectionsError as err:
        raise RestoreError(str(err)) from err
    if storeid not in kept:
        known = ", ".join(kept) or "none"
        raise RestoreError(f"no copy of storage '{storeid}' in {kept_file} (kept here: {known});"
                           " another node's daemon may have one")
    return kept[storeid]


def restore(storage_cfg: Path, kept_file: Path, storeid: str, *, apply: bool,
            lock: Lock | None = None) -> Restored:
    """Put ``storeid``'s kept section back at the end of ``storage_cfg``
    (``apply``), or only find it.

    :raises RestoreError: no copy, the id is in the file already, or the
        file cannot be read or written.
    """
    kept = kept_section(kept_file, storeid)
    if not apply:
        return Restored(kept, written=False)
    lock = lock if lock is not None else queue_lock(storage_cfg)
    try:
        with lock.acquire():
            text = atomicfile.read_bounded(storage_cfg, MAX_READ).decode()
            sections, _ = parse_sections(text, str(storage_cfg))
            there = [s for s in sections if s.id == storeid]
            if there:
                raise RestoreError(f"storage '{storeid}' is in {storage_cfg} already (as"
                                   f" '{there[0].type}: {storeid}', line {there[0].line});"
                                   " nothing written")
            atomicfile.write_atomically(storage_cfg, with_sections(text, [kept.text]).encode())
    except (QueueError, UnicodeDecodeError) as err:
        raise RestoreError(f"cannot put storage '{storeid}' back in {storage_cfg}: {err}") \
            from err
    return Restored(kept, written=True)


def forget(storage_cfg: Path, kept_file: Path, storeid: str) -> Kept:
    """Drop ``storeid`` from the daemon's copy: the admin removed it on purpose.

    The daemon reads the copy again on SIGHUP (``systemctl reload pvestord``).
    Refused for a storage still in storage.cfg: the daemon would keep it.

    :raises RestoreError: no copy of it, it is in the file, or I/O.
    """
    kept = kept_section(kept_file, storeid)
    try:
        text = atomicfile.read_bounded(storage_cfg, MAX_READ).decode()
    except (QueueError, UnicodeDecodeError) as err:
        raise RestoreError(f"cannot read {storage_cfg}: {err}") from err
    if any(s.id == storeid for s in parse_sections(text, str(storage_cfg))[0]):
        raise RestoreError(f"storage '{storeid}' is in {storage_cfg}: nothing to forget")
    try:
        others = keptsections.read(kept_file)
        del others[storeid]
        keptsections.write(kept_file, others)
    except (keptsections.KeptSectionsError, KeyError) as err:
        raise RestoreError(f"cannot forget storage '{storeid}' in {kept_file}: {err}") from err
    return kept
