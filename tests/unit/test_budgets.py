"""The budgets table (pvestord.adapters.budgets): each budget once, and the
lock's lifetime holding every LVM change made under it."""

from __future__ import annotations

import time

import pytest

from pvestord.adapters import budgets, command, lockheld, lvm
from pvestord.adapters.lockheld import Held, LockLifetimeError
from pvestord.adapters.settings import DaemonSettings
from pvestord.features import migrationhint


def test_a_volume_commands_change_fits_in_a_pmxcfs_lock() -> None:
    """``pvestord volume`` changes LVM for up to LVM_CHANGE under a pmxcfs lock."""
    guaranteed = budgets.guaranteed_hold(budgets.PMXCFS_LOCK_EXPIRY)
    assert guaranteed >= budgets.LVM_CHANGE + budgets.KILL_WAIT


def test_the_daemons_defaults_pass_their_own_check() -> None:
    settings = DaemonSettings(node="n1")
    assert settings.lvm_timeout == budgets.LVM_DAEMON
    assert settings.lock_lifetime == budgets.PMXCFS_LOCK_EXPIRY


def test_the_modules_read_the_table() -> None:
    assert lockheld.DEFAULT_TIMEOUT == budgets.STORAGE_LOCK_WAIT
    assert lockheld.PMXCFS_LOCK_EXPIRY == budgets.PMXCFS_LOCK_EXPIRY
    assert command.KILL_WAIT == budgets.KILL_WAIT
    assert lvm.CHANGE_TIMEOUT == budgets.LVM_CHANGE
    assert budgets.PAUSED_STORAGE_LOCK_WAIT == budgets.STORAGE_LOCK_WAIT + budgets.HOLD_BUDGET


async def test_a_migration_refresh_needs_the_settings_budget_not_more(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The migration's refresh runs under a lock the settings checked for
    ``lvm_timeout``: it requires that budget (it required 40 s, which a
    lifetime the settings accept could not cover)."""
    lifetime = 16.0
    settings = DaemonSettings(node="n1", lock_lifetime=lifetime, lvm_timeout=3)
    refreshed: list[float] = []

    async def lv_info(vg: str, lv: str, **_: object) -> lvm.LvInfo:
        return lvm.LvInfo(vg, lv, 2 << 30, 4 << 20, 0, True, True)

    async def refresh(vg: str, lv: str, *, timeout: float) -> None:  # noqa: ASYNC109
        refreshed.append(timeout)

    monkeypatch.setattr(lvm, "lv_info", lv_info)
    monkeypatch.setattr(lvm, "device_size", lambda vg, lv: 1 << 30)
    monkeypatch.setattr(lvm, "refresh", refresh)
    held = Held("storage-thin1", lifetime, time.monotonic())
    action = await migrationhint.catch_up("san", "vm-100-disk-0.qcow2",
                                          budget=settings.lvm_timeout, held=held)
    assert action.action == "refreshed" and refreshed == [settings.lvm_timeout]
    with pytest.raises(LockLifetimeError):
        held.require(lvm.CHANGE_TIMEOUT + command.KILL_WAIT)
