"""What a qemu-server VM config's ``lock`` says to pvestord: pure rules.

qemu-server writes ``lock: <what>`` into the main section of
``/etc/pve/nodes/<node>/qemu-server/<vmid>.conf`` while a long operation
runs, and removes it at the end (or ``qm unlock`` does, after a crash). Two of
those operations concern the extension of the VM's LVs:

- ``migrate``: ``QemuMigrate::phase1`` writes it *before* the target's QEMU
  starts and activates (and refreshes) the LVs there. An LV grown on the
  source from then on may be shorter on the target; so the lock counts as
  "migrating away", as the migration hint's mark does. It is taken as left
  over only when nothing of a migration shows in the source QEMU
  (:func:`source_migrating`): with ``--with-local-disks`` qemu-server mirrors
  the local disks into the target over NBD, for hours if they are large,
  before ``migrate`` starts, and meanwhile neither ``query-migrate`` nor the
  config changes: judged by the config's age alone, the lock would stop
  deferring while the target QEMU already has the LVs open.
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
import json
import re
from collections.abc import Collection, Iterable, Mapping

from pvestord.policy.blockjobs import WRITING, BlockJob
from pvestord.policy.procstat import fields_after_name

#: qemu-server's lock values that rename the LVs under a running VM.
RENAMING_LOCKS = frozenset({"snapshot", "snapshot-delete", "rollback"})
#: How long a ``lock: migrate`` defers extensions with no migration in flight
#: (:func:`source_migrating`), from the config's last write: qemu-server
#: starts the target's QEMU first (over ssh, activating every volume), which
#: can take minutes with many disks or huge pages; past this a lock with
#: nothing in flight is left over from a crashed migration task (``qm
#: unlock`` clears it), and a guest paused for room must not wait for an
#: admin. A long stretch after the target's start (the local disks' NBD
#: mirror) shows in the source QEMU, so it never ages the lock out.
MIGRATE_LOCK_GRACE = 600.0
#: ``query-migrate`` statuses of a migration in flight (``completed`` leaves
#: the source in run state ``postmigrate``, which the engine checks apart).
MIGRATING_STATUSES = frozenset({
    "setup", "active", "postcopy-active", "postcopy-paused", "postcopy-recover",
    "pre-switchover", "device", "wait-unplug", "cancelling"})
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


def nbd_node(drv: object, file: object) -> bool:
    """Whether a node of ``query-named-block-nodes`` reads or writes an NBD
    export: its driver is ``nbd`` (a protocol node, or ``drive-mirror``'s
    target with ``format: nbd`` as qemu-server's local-disk mirror has long
    used), or its filename is an NBD URI or a ``json:`` name with an ``nbd``
    driver in it (a format node over such a protocol node takes its
    filename: ``nbd+unix:///drive-scsi0?socket=...``, ``nbd://host:port/...``,
    the old ``nbd:unix:...:exportname=...``)."""
    if drv == "nbd":
        return True
    if not isinstance(file, str):
        return False
    if file.startswith("nbd:") or file.startswith("nbd+"):
        return True
    if not file.startswith("json:"):
        return False
    try:
        tree = json.loads(file[len("json:"):])
    except ValueError:
        return False
    todo = [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, dict):
            if node.get("driver") == "nbd":
                return True
            todo.extend(node.values())
    return False


def mirrors_to_nbd(jobs: Iterable[BlockJob], nbd_nodes: Collection[str],
                   targets: Mapping[str, str | None]) -> bool:
    """Whether a mirror job that may still write has an NBD export as its
    target: the local disks of a live migration being copied into the
    target QEMU, which has the shared thin LVs open already.

    ``nbd_nodes``: the VM's nodes that are NBD clients (:func:`nbd_node`);
    ``targets``: each job's target node-name from QEMU's job graph, None or
    absent when the graph did not say (it is a debug command): then any NBD
    node counts, since a VM's own drives are never NBD on Proxmox and a
    mirror is the only job qemu-server points at one. A mirror that
    concluded or is aborting writes nothing more, and no migration waits on
    it.
    """
    if not nbd_nodes:
        return False
    for job in jobs:
        if job.type != "mirror" or job.status not in WRITING:
            continue
        target = targets.get(job.id)
        if target is None or target in nbd_nodes:
            return True
    return False


def source_migrating(*, migration_status: str | None, jobs: Iterable[BlockJob] = (),
                     nbd_nodes: Collection[str] = (),
                     targets: Mapping[str, str | None] | None = None,
                     task_running: bool = False) -> bool:
    """Whether the source shows a live migration under way: the
    ``query-migrate`` status of one in flight, a mirror of a local disk into
    the target over NBD (:func:`mirrors_to_nbd`), which qemu-server runs
    between the target's start and ``migrate``, or qemu-server's
    ``qmigrate`` task still running here (``task_running``,
    :func:`migration_tasks`). Any keeps ``lock: migrate`` from being taken as
    left over (:func:`config_lock_rule`'s ``in_flight``)."""
    return task_running or migration_status in MIGRATING_STATUSES or mirrors_to_nbd(
        jobs, nbd_nodes, {} if targets is None else targets)


def migration_tasks(active: str, node: str, vmid: int) -> list[tuple[int, int]]:
    """The ``(pid, pstart)`` of every ``qmigrate`` task of ``vmid`` started on
    ``node`` that Proxmox's task list ``active`` (``/var/log/pve/tasks/active``)
    names, finished or not: only the process tells (:func:`task_alive`).

    Each line starts with a UPID, ``UPID:<node>:<pid>:<pstart>:<starttime>:
    <type>:<id>:<user>:``, the numbers in hexadecimal; a finished task's
    line carries its end and status after it. ``pstart`` is the worker's
    start time in clock ticks (``/proc/<pid>/stat``, field 22): Proxmox's own
    ``check_process_running`` takes a task as running only while a process
    with that pid and that start lives, which a reused pid or a reboot never
    matches. Lines that are not UPIDs are skipped.
    """
    found = []
    for line in active.splitlines():
        parts = line.split(" ", 1)[0].split(":")
        if len(parts) < 8 or parts[0] != "UPID" or parts[1] != node:
            continue
        if parts[5] != "qmigrate" or parts[6] != str(vmid):
            continue
        try:
            found.append((int(parts[2], 16), int(parts[3], 16)))
        except ValueError:
            continue
    return found


def task_alive(stat: str, pstart: int) -> bool:
    """Whether ``/proc/<pid>/stat``'s text ``stat`` is the task's worker:
    its start time (field 22, counted after the command's closing
    parenthesis, which may itself hold spaces) is the UPID's ``pstart``."""
    fields = fields_after_name(stat)
    return len(fields) > 19 and fields[19] == str(pstart)


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
    ``in_flight``: the source QEMU shows a migration under way
    (:func:`source_migrating`): then ``lock: migrate`` defers whatever its age.
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
