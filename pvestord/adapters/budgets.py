"""The storage lock's budgets and the LVM commands' run under it, each stated
once, with why it is what it is.

A wait or a command under the storage lock must end while the lock is surely
ours: pmxcfs expires a lock directory :data:`PMXCFS_LOCK_EXPIRY` after its
holder's last renewal, and the holder renews it every
:data:`~pvestord.adapters.lockheld.RENEW_SHARE` of that lifetime, keeping a
:data:`~pvestord.adapters.lockheld.MARGIN_SHARE` in reserve; what is left is
:func:`guaranteed_hold`. An LVM change starts only while its budget plus
:data:`KILL_WAIT` fits in what is left of that (``Held.require``), and the
settings refuse a ``--lvm-timeout`` that could never fit
(:class:`pvestord.adapters.settings.DaemonSettings`).

Modules keep the names their callers know (``lockheld.DEFAULT_TIMEOUT``,
``lvm.CHANGE_TIMEOUT``, ``command.KILL_WAIT``...) but read the number here;
:class:`~pvestord.adapters.settings.DaemonSettings`' defaults do too.
"""

from __future__ import annotations

# --- the storage lock ----------------------------------------------------------

#: How long a waiter tries for a storage (or queue) lock before giving up:
#: ``cfs_lock``'s own default, so pvestord waits no longer than Proxmox does.
STORAGE_LOCK_WAIT = 10.0
#: A holder should be done by then: ``cfs_lock`` aborts its locked code after 60 s.
HOLD_BUDGET = 60.0
#: The storage-lock wait when the VM waits paused for the extension: every
#: holder lets go within its own wait plus :data:`HOLD_BUDGET` (Proxmox holds
#: the lock for a whole allocation, tens of seconds with metadata
#: preallocation on a SAN). Waiting it out takes the lock the moment it is
#: free; giving up and retrying would leave the guest paused through the gaps.
PAUSED_STORAGE_LOCK_WAIT = STORAGE_LOCK_WAIT + HOLD_BUDGET
#: pmxcfs expires a lock directory unchanged for longer than this
#: (``CFS_LOCK_TIMEOUT`` in pmxcfs's memdb.c); it cannot be made longer.
PMXCFS_LOCK_EXPIRY = 120.0

# --- commands ------------------------------------------------------------------

#: After SIGKILL, how long the command's process, and anything else holding its
#: output pipes, get to go away. A killed process exits in milliseconds; one
#: that is still there after this is in uninterruptible sleep (D state: I/O
#: on a SAN path that queues while it has no path) or left a descendant
#: outside its process group. Bounded so that no caller waits without end
#: under the storage lock: every LVM change's budget counts this wait.
KILL_WAIT = 5.0
#: One LVM report (``lvs``/``vgs``) outside the daemon: device scanning under
#: emulation takes ~0.4 s, a busy SAN seconds.
LVM_REPORT = 30.0
#: One LVM command of the daemon and of the commands built on its settings
#: (``pvestord run``'s ``--lvm-timeout``, ``pvestord migration``): an
#: ``lvextend`` or a refresh under the storage lock, also every report the
#: daemon reads. Its budget plus :data:`KILL_WAIT` must fit in
#: :func:`guaranteed_hold` of the lock's lifetime (80 s on pmxcfs), which the
#: settings check; 30 s leaves room for tests to shorten the lifetime.
LVM_DAEMON = 30.0
#: One LVM metadata change of a volume command (``pvestord volume`` ...,
#: run by the storage plugin): an ``lvcreate``, ``lvextend``, ``lvreduce``,
#: ``lvremove`` or tag change. Longer than :data:`LVM_DAEMON` (a create on a
#: busy SAN), and still within :func:`guaranteed_hold` of pmxcfs's lifetime
#: with :data:`KILL_WAIT` (45 of 80 s; a unit test holds it).
LVM_CHANGE = 40.0

# --- the lock's lifetime -------------------------------------------------------

#: A holder renews its lock directory every this share of the lifetime: 30 s
#: on pmxcfs, so that three renewals in a row may fail before it can expire.
RENEW_SHARE = 0.25
#: ``Held.require`` keeps this share of the lifetime in reserve (10 s on
#: pmxcfs): the judge of a lock's age is pmxcfs on the lowest-id node, with
#: its own clock and message latency, and our renewal is timed from before
#: the call, not from when pmxcfs saw it.
MARGIN_SHARE = 1 / 12


def guaranteed_hold(lifetime: float) -> float:
    """How long a renewed lock of ``lifetime`` is surely ours at the least:
    the lifetime less a renewal period and the margin."""
    return lifetime * (1 - RENEW_SHARE - MARGIN_SHARE)
