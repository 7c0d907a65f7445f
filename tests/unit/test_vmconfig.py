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
    RENAMING_LOCK_GRACE,
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


@given(age=st.floats(-1e6, 1e6), quiet=st.floats(0, 1e6), older=st.floats(0, 1e6),
       quieter=st.floats(0, 1e6), job_running=st.booleans(), in_flight=st.booleans(),
       lock=st.sampled_from(sorted(RENAMING_LOCKS)))
def test_a_renaming_lock_goes_stale_only_after_its_grace_with_no_job(
        age: float, quiet: float, older: float, quieter: float, job_running: bool,
        in_flight: bool, lock: str) -> None:
    """Left over once the config's last write and the daemon's last sight of
    a job (or of the lock's arrival) are both a grace away; never while a job
    runs; and never young again as either figure grows."""
    def rule(age: float, quiet: float, job_running: bool) -> ConfigLockRule:
        return config_lock_rule(lock, age=age, in_flight=in_flight, job_running=job_running,
                                quiet=quiet)

    stale = min(abs(age), quiet) >= RENAMING_LOCK_GRACE
    assert rule(age, quiet, job_running) is (
        ConfigLockRule.STALE_RENAMING if stale and not job_running else ConfigLockRule.RENAMING)
    assert rule(age, quiet, True) is ConfigLockRule.RENAMING
    if stale:
        further = age + older if age >= 0 else age - older
        assert rule(further, quiet + quieter, False) is ConfigLockRule.STALE_RENAMING
    # The defaults (a caller that did not look) never call one left over.
    assert config_lock_rule(lock, age=age, in_flight=False) is ConfigLockRule.RENAMING


@given(age=st.floats(-1e6, 1e6), quiet=st.floats(0, 1e6), job_running=st.booleans(),
       in_flight=st.booleans())
def test_the_renaming_figures_leave_a_migrate_lock_alone(
        age: float, quiet: float, job_running: bool, in_flight: bool) -> None:
    assert config_lock_rule("migrate", age=age, in_flight=in_flight, job_running=job_running,
                            quiet=quiet) is config_lock_rule("migrate", age=age,
                                                             in_flight=in_flight)


def test_the_quiet_count_starts_with_the_lock_and_again_at_each_job() -> None:
    """The daemon's half of the figures (QuietRenamingLocks): counted from
    its first look at the lock with no job; a job, another lock or no lock
    starts it again; a VM that stopped is forgotten."""
    from pvestord.engine.migration import QuietRenamingLocks

    now = [1000.0]
    quiet = QuietRenamingLocks(clock=lambda: now[0])
    assert quiet.observe(101, "snapshot-delete", job_running=False) == 0.0
    now[0] += 30
    assert quiet.observe(101, "snapshot-delete", job_running=False) == 30.0
    assert quiet.quiet_for(101, "snapshot-delete") == 30.0
    assert quiet.quiet_for(101, "snapshot") == 0.0
    assert quiet.observe(101, "snapshot-delete", job_running=True) == 0.0  # the commit
    now[0] += 30
    assert quiet.observe(101, "snapshot-delete", job_running=False) == 0.0
    now[0] += 5
    assert quiet.observe(101, "snapshot-delete", job_running=False) == 5.0
    assert quiet.observe(101, "rollback", job_running=False) == 0.0
    assert quiet.quiet_for(101, "snapshot-delete") == 0.0
    assert quiet.observe(101, "migrate", job_running=False) == 0.0
    assert quiet.observe(102, "snapshot", job_running=False) == 0.0
    now[0] += 7
    assert quiet.observe(101, None, job_running=False) == 0.0
    assert quiet.quiet_for(101, "rollback") == 0.0
    quiet.forget(102)
    assert quiet.quiet_for(102, "snapshot") == 0.0


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
    from pvestord.engine.memory import OncePerChange
    from pvestord.engine.migration import QuietRenamingLocks, renaming

    settings = DaemonSettings(node="pve1", queue=tmp_path / "extend-queue",
                              nodes_dir=tmp_path / "nodes", run_dir=tmp_path / "run")
    quiet, said = QuietRenamingLocks(), OncePerChange()
    path = config_path(tmp_path / "nodes", "pve1", 101)
    path.parent.mkdir(parents=True)
    path.write_text(CONFIG.replace("lock: migrate", "lock: snapshot-delete"))
    assert renaming(settings, 101, paused_for_room=False, job_writing=True, job_running=True,
                    quiet=quiet, said=said)
    assert renaming(settings, 101, paused_for_room=True, job_writing=False, job_running=False,
                    quiet=quiet, said=said)
    with pytest.raises(VmBusyError):
        renaming(settings, 101, paused_for_room=False, job_writing=False, job_running=False,
                 quiet=quiet, said=said)
    path.write_text(CONFIG.replace("lock: migrate\n", ""))
    assert not renaming(settings, 101, paused_for_room=False, job_writing=False,
                        job_running=False, quiet=quiet, said=said)
