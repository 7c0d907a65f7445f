"""``lock: migrate`` is not taken as left over while the source
QEMU shows a migration under way, a mirror of its local disks into the
target's NBD export included (pvestord.policy.vmconfig, pure)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pvestord.adapters import vmconfig as vmconfig_adapter
from pvestord.adapters.qmp import nbd_nodes_from
from pvestord.adapters.settings import DaemonSettings
from pvestord.adapters.vmconfig import config_path
from pvestord.engine import migration
from pvestord.policy.blockjobs import WRITING, BlockJob
from pvestord.policy.vmconfig import (
    MIGRATE_LOCK_GRACE,
    MIGRATING_STATUSES,
    ConfigLockRule,
    config_lock_rule,
    migration_tasks,
    mirrors_to_nbd,
    nbd_node,
    source_migrating,
    task_alive,
)

JOB_STATUSES = sorted(WRITING | {"concluded", "aborting", "null", "pending", "waiting"})
MIGRATE_STATUSES = [None, "none", "completed", "failed", "cancelled",
                    *sorted(MIGRATING_STATUSES)]
NODES = ["#block123", "#block7", "drive-scsi0", "f-scsi1", "nbd-target"]

jobs_strategy = st.lists(st.builds(
    BlockJob, id=st.sampled_from(["drive-scsi0", "drive-scsi1", "commit-drive-scsi0"]),
    type=st.sampled_from(["mirror", "commit", "stream", "backup"]),
    status=st.sampled_from(JOB_STATUSES), paused=st.booleans(),
    io_status=st.sampled_from(["ok", "nospace"])), max_size=4).map(tuple)


@given(jobs=jobs_strategy, nbd=st.frozensets(st.sampled_from(NODES)),
       targets=st.dictionaries(st.sampled_from(["drive-scsi0", "drive-scsi1"]),
                               st.none() | st.sampled_from(NODES)),
       status=st.sampled_from(MIGRATE_STATUSES), age=st.floats(-1e7, 1e7))
def test_a_migrate_lock_defers_while_the_source_shows_a_migration(
        jobs: tuple[BlockJob, ...], nbd: frozenset[str], targets: dict[str, str | None],
        status: str | None, age: float) -> None:
    """Whatever the config's age: a migration status in flight, or a mirror
    that may write with an NBD target (or an unknown target beside an NBD
    node), keeps ``lock: migrate`` deferring; past the grace with neither it
    is left over. Failed on the old code, which knew query-migrate alone."""
    mirroring = any(job.type == "mirror" and job.status in WRITING
                    and (targets.get(job.id) is None or targets.get(job.id) in nbd)
                    for job in jobs) and bool(nbd)
    under_way = source_migrating(migration_status=status, jobs=jobs, nbd_nodes=nbd,
                                 targets=targets)
    assert under_way is (status in MIGRATING_STATUSES or mirroring)
    rule = config_lock_rule("migrate", age=age, in_flight=under_way)
    if under_way or abs(age) < MIGRATE_LOCK_GRACE:
        assert rule is ConfigLockRule.MIGRATING
    else:
        assert rule is ConfigLockRule.STALE_MIGRATE


def test_eleven_minutes_into_a_local_disk_mirror_the_lock_still_defers() -> None:
    job = BlockJob("drive-scsi1", "mirror", "running", False, "ok", 64 << 30, 1 << 30)
    under_way = source_migrating(migration_status=None, jobs=(job,),
                                 nbd_nodes={"#block410"}, targets={"drive-scsi1": "#block410"})
    assert config_lock_rule("migrate", age=660.0, in_flight=under_way) is \
        ConfigLockRule.MIGRATING
    # The mirror done and cancelled after the switchover, the lock left by a
    # crashed task: left over again.
    assert config_lock_rule("migrate", age=660.0, in_flight=source_migrating(
        migration_status="completed", jobs=())) is ConfigLockRule.STALE_MIGRATE


def test_a_move_disks_mirror_is_no_migration() -> None:
    job = BlockJob("drive-scsi0", "mirror", "ready", False, "ok")
    assert not mirrors_to_nbd((job,), set(), {"drive-scsi0": "#block5"})
    assert not mirrors_to_nbd((job,), {"#block9"}, {"drive-scsi0": "#block5"})


def test_nbd_nodes_as_qemu_names_them() -> None:
    assert nbd_node("nbd", "nbd+unix:///drive-scsi1?socket=/run/qemu-server/101_nbd.migrate")
    assert nbd_node("raw", "nbd://10.0.0.2:60001/drive-scsi1")
    assert nbd_node("raw", "nbd:unix:/run/qemu-server/101_nbd.migrate:exportname=drive-scsi1")
    tree = {"driver": "raw", "file": {"driver": "nbd", "export": "drive-scsi1",
                                      "server": {"type": "unix", "path": "/run/x"}}}
    assert nbd_node("raw", "json:" + json.dumps(tree))
    assert not nbd_node("host_device", "/dev/san/vm-101-disk-0.qcow2")
    assert not nbd_node("qcow2", "json:{not json")
    assert not nbd_node("qcow2", None)
    assert not nbd_node(None, "json:" + json.dumps({"driver": "qcow2"}))


@given(st.lists(st.dictionaries(st.sampled_from(["node-name", "drv", "file"]),
                                st.none() | st.text(max_size=30) | st.integers())))
def test_nbd_nodes_from_any_reply(nodes: list[dict[str, object]]) -> None:
    found = nbd_nodes_from(nodes)
    assert found <= {n["node-name"] for n in nodes if isinstance(n.get("node-name"), str)}


def own_upid(node: str, vmid: int, kind: str = "qmigrate", pid: int | None = None) -> str:
    """A UPID for a task whose worker is this test's own process (alive)."""
    pid = os.getpid() if pid is None else pid
    stat = Path(f"/proc/{os.getpid()}/stat").read_text()
    pstart = int(stat.rpartition(")")[2].split()[19])
    return f"UPID:{node}:{pid:08X}:{pstart:08X}:{int(time.time()):08X}:{kind}:{vmid}:root@pam:"


def test_migration_tasks_are_read_from_proxmoxs_task_list() -> None:
    active = "\n".join([
        "UPID:pve1:0000ABCD:0012F00D:65A1B2C3:qmigrate:101:root@pam:",
        "UPID:pve1:0000ABCE:0012F00E:65A1B2C4:qmigrate:101:root@pam: 1 65A1B2D0 OK",
        "UPID:pve2:0000ABCF:0012F00F:65A1B2C5:qmigrate:101:root@pam:",   # another node
        "UPID:pve1:0000AB00:0012F000:65A1B2C6:qmigrate:102:root@pam:",   # another VM
        "UPID:pve1:0000AB01:0012F001:65A1B2C7:vzdump:101:root@pam:",     # another task
        "UPID:pve1:zz:0012F001:65A1B2C7:qmigrate:101:root@pam:",         # junk
        "garbage", ""])
    assert migration_tasks(active, "pve1", 101) == [(0xABCD, 0x12F00D), (0xABCE, 0x12F00E)]


@given(st.text())
def test_any_task_list_parses(text: str) -> None:
    for pid, pstart in migration_tasks(text, "pve1", 101):
        assert pid >= 0 and pstart >= 0


def test_a_task_is_alive_only_with_its_own_start() -> None:
    stat = Path(f"/proc/{os.getpid()}/stat").read_text()
    pstart = int(stat.rpartition(")")[2].split()[19])
    assert task_alive(stat, pstart)
    assert not task_alive(stat, pstart + 1)  # a reused pid
    assert task_alive("1 (a) b) c) S " + " ".join(["0"] * 18) + " 77 0", 77)
    assert not task_alive("", 77)


def test_the_running_qmigrate_task_keeps_the_lock_from_aging_out(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Past the grace, with nothing in QEMU to show (the target still
    starting, say), qemu-server's live task keeps ``lock: migrate``
    deferring, under the storage lock too (files only); a dead one does
    not. Failed on the old code, which judged the lock by its age alone."""
    active = tmp_path / "active"
    monkeypatch.setattr(vmconfig_adapter, "TASKS_ACTIVE", active)
    settings = DaemonSettings(node="pve1", queue=tmp_path / "q", nodes_dir=tmp_path / "nodes",
                              run_dir=tmp_path, lock_dir=tmp_path / "locks",
                              vg_health_dir=tmp_path / "marks")
    config = config_path(tmp_path / "nodes", "pve1", 101)
    config.parent.mkdir(parents=True)
    config.write_text("lock: migrate\n")
    written = time.time() - MIGRATE_LOCK_GRACE - 60
    os.utime(config, (written, written))
    assert migration.config_lock(settings, 101, in_flight=False) is ConfigLockRule.STALE_MIGRATE
    active.write_text(own_upid("pve1", 101) + "\n")
    assert migration.config_lock(settings, 101, in_flight=False) is ConfigLockRule.MIGRATING
    # The task ended (its worker gone: a pid no process has), or is another VM's.
    active.write_text(own_upid("pve1", 101, pid=0x7FFFFFF0) + "\n" + own_upid("pve1", 102))
    assert migration.config_lock(settings, 101, in_flight=False) is ConfigLockRule.STALE_MIGRATE
    # Unreadable or absent: the other signs still count, this one says no.
    active.unlink()
    assert not vmconfig_adapter.migration_task_running("pve1", 101)
