"""What a qemu-server VM config's ``lock`` says to pvestord: pure rules.

qemu-server writes ``lock: <what>`` into the main section of
``/etc/pve/nodes/<node>/qemu-server/<vmid>.conf`` while a long operation
runs, and removes it at the end (or ``qm unlock`` does, after a crash). Two of
those operations concern the extension of the VM's LVs:

- ``migrate``: ``QemuMigrate::phase1`` writes it *before* the target's QEMU
  starts and activates (and refreshes) the LVs there. An LV grown on the
  source from then on may be shorter on the target; so the lock counts as
  "migrating away", as the migration hint's mark does.
- ``snapshot``, ``snapshot-delete``, ``rollback``: the VM's LVs are being
  renamed (the current LV to ``snap_...``, a snapshot LV back to the disk's
  name) while QEMU keeps its devices open. A name read now may not be the
  device QEMU writes, so pvestord stands back until the lock is gone, but for
  two drives that cannot wait (:func:`grows_while_renaming`).
"""

from __future__ import annotations

import enum
import re

#: qemu-server's lock values that rename the LVs under a running VM.
RENAMING_LOCKS = frozenset({"snapshot", "snapshot-delete", "rollback"})
#: How long a ``lock: migrate`` defers extensions with no migration in flight,
#: from the config's last write: qemu-server starts the target's QEMU first
#: (over ssh, activating every volume), which can take minutes with many
#: disks or huge pages; past this a lock with nothing in flight is left over
#: from a crashed migration task (``qm unlock`` clears it), and a guest paused
#: for room must not wait for an admin.
MIGRATE_LOCK_GRACE = 600.0

_LOCK_LINE = re.compile(r"lock:\s*([A-Za-z0-9_-]+)\s*")


def config_lock(text: str) -> str | None:
    """The ``lock`` of a VM config's main section, or None.

    The main section ends at the first ``[section]`` (a snapshot,
    ``[PENDING]``, ``[special:cloudinit]``): a snapshot's copy of an old lock
    is history, not a lock.
    """
    for line in text.splitlines():
        if line.startswith("["):
            return None
        match = _LOCK_LINE.fullmatch(line)
        if match:
            return match.group(1)
    return None


class ConfigLockRule(enum.Enum):
    """What a VM's config lock means for extending its LVs here."""

    NONE = "no lock that concerns extensions"
    #: ``lock: migrate``, recent or with a migration in flight: defer.
    MIGRATING = "lock: migrate"
    #: ``lock: migrate`` past :data:`MIGRATE_LOCK_GRACE` with nothing in flight.
    STALE_MIGRATE = "left-over lock: migrate"
    #: A snapshot, its deletion or a rollback renames the LVs: stand back.
    RENAMING = "LVs being renamed"


def config_lock_rule(lock: str | None, *, age: float, in_flight: bool,
                     grace: float = MIGRATE_LOCK_GRACE) -> ConfigLockRule:
    """The pure decision. ``age``: seconds since the config was last written
    (a clock stepped back counts by its distance, as the migration mark's)."""
    if lock == "migrate":
        if in_flight or abs(age) < grace:
            return ConfigLockRule.MIGRATING
        return ConfigLockRule.STALE_MIGRATE
    if lock in RENAMING_LOCKS:
        return ConfigLockRule.RENAMING
    return ConfigLockRule.NONE


def grows_while_renaming(*, paused_nospace: bool, job_writing: bool) -> bool:
    """Whether a drive is still grown while its VM's LVs are being renamed.

    Two cannot wait for the lock to go: a guest paused on ENOSPC (it must not
    wait out a whole snapshot task), and the drives of a VM in which a block
    job writes (``job_writing``). That job is qemu-server's own snapshot
    delete: a commit into the first snapshot, or a stream into the child of
    an intermediate one, under ``lock: snapshot-delete``, at disk speed, with
    QEMU's default ``on-error=report``. The storage plugin's grant before it
    has one chunk of margin for what the guest writes meanwhile; standing
    back would fail the job, and so the admin's delete, whenever the guest
    writes more. Both are safe because the LV grown is the one QEMU has
    open, read again under the storage lock Proxmox renames under
    (:mod:`pvestord.engine.binding`); and qemu-server renames LVs only
    after the job has completed.
    """
    return paused_nospace or job_writing
