"""A qemu-server config's lock: parsed from the main section only, and what it
means for extensions (pvestord.policy.vmconfig), read from a real file."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pvestord.adapters.vmconfig import config_path, read_config_lock
from pvestord.policy.vmconfig import (
    MIGRATE_LOCK_GRACE,
    RENAMING_LOCKS,
    ConfigLockRule,
    config_lock,
    config_lock_rule,
)

CONFIG = """boot: order=scsi0
cores: 2
lock: migrate
memory: 2048
scsi0: san1:vm-101-disk-0.qcow2,size=32G
#lock: backup in a description is a comment

[snap1]
lock: snapshot
scsi0: san1:vm-101-disk-0.qcow2,size=32G
"""


def test_main_section_lock() -> None:
    assert config_lock(CONFIG) == "migrate"


def test_a_snapshot_sections_lock_is_history() -> None:
    text = CONFIG.replace("lock: migrate\n", "")
    assert config_lock(text) is None


def test_no_lock_and_odd_lines() -> None:
    assert config_lock("") is None
    assert config_lock("lockx: migrate\n lock: migrate\nlock:\n") is None
    assert config_lock("lock:snapshot-delete\n") == "snapshot-delete"


@given(st.text())
def test_any_text_parses_without_error(text: str) -> None:
    lock = config_lock(text)
    assert lock is None or lock in text


@given(age=st.floats(-1e6, 1e6), in_flight=st.booleans(),
       lock=st.sampled_from([None, "migrate", "backup", "clone", *sorted(RENAMING_LOCKS)]))
def test_rule(age: float, in_flight: bool, lock: str | None) -> None:
    rule = config_lock_rule(lock, age=age, in_flight=in_flight)
    if lock == "migrate":
        fresh = in_flight or abs(age) < MIGRATE_LOCK_GRACE
        assert rule is (ConfigLockRule.MIGRATING if fresh else ConfigLockRule.STALE_MIGRATE)
    elif lock in RENAMING_LOCKS:
        assert rule is ConfigLockRule.RENAMING
    else:
        assert rule is ConfigLockRule.NONE


def test_read_from_this_nodes_folder(tmp_path: Path) -> None:
    path = config_path(tmp_path, "pve1", 101)
    assert read_config_lock(tmp_path, "pve1", 101) is None
    path.parent.mkdir(parents=True)
    path.write_text(CONFIG)
    os.utime(path, (1000.0, 1000.0))
    found = read_config_lock(tmp_path, "pve1", 101, now=1030.0)
    assert found is not None and found.lock == "migrate" and found.age == 30.0
    assert read_config_lock(tmp_path, "pve2", 101) is None


def test_engine_reads_this_nodes_config(tmp_path: Path) -> None:
    """The engine's view (pvestord.engine.migration.config_lock): the config on
    this node's folder under the settings' nodes dir, aged by its mtime."""
    from pvestord.adapters.settings import DaemonSettings
    from pvestord.engine.migration import config_lock

    settings = DaemonSettings(node="pve1", queue=tmp_path / "extend-queue",
                              nodes_dir=tmp_path / "nodes", run_dir=tmp_path / "run")
    assert config_lock(settings, 101, in_flight=False) is ConfigLockRule.NONE
    path = config_path(tmp_path / "nodes", "pve1", 101)
    path.parent.mkdir(parents=True)
    path.write_text(CONFIG)
    assert config_lock(settings, 101, in_flight=False) is ConfigLockRule.MIGRATING
    old = path.stat().st_mtime - MIGRATE_LOCK_GRACE - 1
    os.utime(path, (old, old))
    assert config_lock(settings, 101, in_flight=False) is ConfigLockRule.STALE_MIGRATE
    assert config_lock(settings, 101, in_flight=True) is ConfigLockRule.MIGRATING
    path.write_text(CONFIG.replace("lock: migrate", "lock: snapshot"))
    assert config_lock(settings, 101, in_flight=False) is ConfigLockRule.RENAMING


def test_the_engine_lets_a_commit_under_snapshot_delete_through(tmp_path: Path) -> None:
    """qemu-server's snapshot delete commits under its lock: the engine's
    stand-back (pvestord.engine.migration.renaming) lets the pass through for
    the job's target, as for a paused guest, and refuses a VM with neither."""
    from pvestord.adapters.qmp import VmBusyError
    from pvestord.adapters.settings import DaemonSettings
    from pvestord.engine.migration import renaming

    settings = DaemonSettings(node="pve1", queue=tmp_path / "extend-queue",
                              nodes_dir=tmp_path / "nodes", run_dir=tmp_path / "run")
    path = config_path(tmp_path / "nodes", "pve1", 101)
    path.parent.mkdir(parents=True)
    path.write_text(CONFIG.replace("lock: migrate", "lock: snapshot-delete"))
    assert renaming(settings, 101, paused_for_room=False, job_writing=True)
    assert renaming(settings, 101, paused_for_room=True, job_writing=False)
    with pytest.raises(VmBusyError):
        renaming(settings, 101, paused_for_room=False, job_writing=False)
    path.write_text(CONFIG.replace("lock: migrate\n", ""))
    assert not renaming(settings, 101, paused_for_room=False, job_writing=False)
