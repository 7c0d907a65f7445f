"""How often a waiter tries a pmxcfs lock: at cfs_lock's pace once the wait is long.

Every ``mkdir`` on /etc/pve is a message to every node of the cluster and a
write of each node's database, failed attempts included.
"""

from __future__ import annotations

import pytest

from pvestord.adapters import lockheld
from pvestord.adapters.lockheld import RETRY_MAX_PMXCFS, Backoff

#: cfs_lock's own wait for a lock (PVE::Cluster), which pvestord's waiters share.
CFS_LOCK_WAIT = 10.0


def attempts_within(seconds: float, cap: float) -> int:
    """Attempts a waiter makes while a lock stays held for ``seconds``: its pauses,
    taken from the back-off without sleeping, until they add up to that."""
    backoff = Backoff(timeout=3600.0, cap=cap)
    waited, attempts = 0.0, 1
    while waited < seconds:
        pause = backoff.next_pause()
        assert pause is not None
        waited += pause
        attempts += 1
    return attempts


@pytest.mark.parametrize("jitter", [0.0, 0.5, 1.0])
def test_a_long_wait_on_pmxcfs_goes_at_cfs_locks_pace(monkeypatch: pytest.MonkeyPatch,
                                                      jitter: float) -> None:
    monkeypatch.setattr(lockheld, "jitter", lambda: jitter)
    # cfs_lock retries about once a second: 10 attempts in its 10 s wait.
    assert attempts_within(CFS_LOCK_WAIT, RETRY_MAX_PMXCFS) <= 2 * CFS_LOCK_WAIT + 12


def test_a_short_hold_is_retried_within_milliseconds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lockheld, "jitter", lambda: 1.0)
    # A lock held for 10 ms (one quick change) is tried again within a few ms of its release.
    backoff = Backoff(timeout=3600.0, cap=RETRY_MAX_PMXCFS)
    waited = 0.0
    while waited < 0.010:
        pause = backoff.next_pause()
        assert pause is not None
        waited += pause
    assert waited < 0.030
