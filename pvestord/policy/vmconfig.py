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
  two drives that cannot wait (:func:`grows_while_renaming`), or until the
  lock has sat for :data:`RENAMING_LOCK_GRACE` with no block job in the VM's
  QEMU: then it is left over from a failed task
  (:func:`renaming_lock_left_over`).
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
#: How long a renaming lock holds pvestord back with no block job running in
#: the VM's QEMU, counted from the later of the config's last write and the
#: last time the daemon saw a job there (or saw the lock appear). Between
#: writing the lock and starting its job, and between one disk's job and the
#: next, qemu-server does no more than wait for locks and short commands: the
#: storage lock for each rename and for the storage plugin's room request
#: (``cfs_lock``: 10 s to acquire, then its holder's work, up to the plugin's
#: 300 s command budget), ``blockdev-add`` and ``blockdev-snapshot`` (no job,
#: milliseconds), the guest agent's freeze, and it rewrites the config after
#: each disk. The one long stretch with no job is a snapshot's vmstate save,
#: which lasts as long as writing the guest's RAM. Twice the plugin's budget
#: covers every wait; a vmstate save longer than that is grown through, safely,
#: because the LV grown is the one QEMU has open, re-read under the storage
#: lock qemu-server renames under. Meanwhile a left-over lock costs a guest one
#: pause per chunk, never data: a guest paused for room is grown at once.
RENAMING_LOCK_GRACE = 600.0

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
    #: A renaming lock left over from a failed task
    #: (:func:`renaming_lock_left_over`): extend as usual.
    STALE_RENAMING = "left-over renaming lock"


def config_lock_rule(lock: str | None, *, age: float, in_flight: bool,
                     grace: float = MIGRATE_LOCK_GRACE, job_running: bool = False,
                     quiet: float = 0.0,
                     renaming_grace: float = RENAMING_LOCK_GRACE) -> ConfigLockRule:
    """The pure decision. ``age``: seconds since the config was last written
    (a clock stepped back counts by its distance, as the migration mark's).
    ``job_running`` and ``quiet`` judge a renaming lock
    (:func:`renaming_lock_left_over`); their defaults never call one left over."""
    if lock == "migrate":
        if in_flight or abs(age) < grace:
            return ConfigLockRule.MIGRATING
        return ConfigLockRule.STALE_MIGRATE
    if lock in RENAMING_LOCKS:
        if renaming_lock_left_over(config_age=age, quiet=quiet, job_running=job_running,
                                   grace=renaming_grace):
            return ConfigLockRule.STALE_RENAMING
        return ConfigLockRule.RENAMING
    return ConfigLockRule.NONE


def renaming_lock_left_over(*, config_age: float, quiet: float, job_running: bool,
                            grace: float = RENAMING_LOCK_GRACE) -> bool:
    """Whether a renaming lock is left over from a task that failed or died.

    ``config_age``: seconds since the config was last written (qemu-server
    rewrites it after each disk; a clock stepped back counts by its
    distance). ``quiet``: seconds the daemon has seen this lock with no block
    job in the VM's QEMU, on its own monotonic clock. Both must be past
    ``grace``: the config's age alone would call the lock left over the
    moment a commit that ran longer than the grace ends, just when
    qemu-server renames the LVs; the daemon's count alone would miss a job
    that ran between two of its looks, which the config's rewrite after each
    disk shows. A job running now is the task at work.
    """
    return not job_running and quiet >= grace and abs(config_age) >= grace


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
