"""Live migration, the engine's side: a source whose config has held ``lock:
migrate`` for 11 minutes, while qemu-server mirrors a local disk into the
target's NBD export (``--with-local-disks``, before ``migrate``), does not
extend its shared thin drive; once the mirror is gone the lock is left over
and the drive is grown as usual.

The pass runs whole through :class:`~pvestord.engine.extender.Extender`,
with the stand-ins of test_leftover_renaming_lock.py: QEMU a fake on a real
Unix socket, ``lvm`` a script (``PVESTORD_LVM``), the storage lock a real
lock directory, this node's table the fake's metadata.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

from pvestord.adapters.config import parse_storage_config
from pvestord.adapters.vmconfig import config_path
from pvestord.adapters.vms import LocalVm
from pvestord.engine.extender import Extender
from pvestord.engine.migration import ExtensionsDeferred
from pvestord.policy import Reason
from pvestord.policy.vmconfig import MIGRATE_LOCK_GRACE
from tests.harness.extenderbed import (
    STORAGE_CFG,
    VMID,
    FakeQemu,
    GiB,
    MiB,
    bed_settings,
    extensions,
    fake_lvm_bed,
    grown_to,
    running,
)


@pytest.fixture
def bed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return fake_lvm_bed(tmp_path, monkeypatch)


NBD_URI = "nbd+unix:///drive-scsi1?socket=/run/qemu-server/101_nbd.migrate"


class MigratingQemu(FakeQemu):
    """The source of a ``--with-local-disks`` migration: besides its thin
    drive on the SAN, a local disk mirrored into the target's NBD export
    (qemu-server's job id is the drive's; the target a node named by QEMU)
    while :attr:`mirroring`. query-migrate stays empty meanwhile."""

    def __init__(self, folder: Path) -> None:
        super().__init__(folder)
        self.mirroring = False

    def reply(self, command: str, arguments: dict[str, Any]) -> object:
        self.jobs = [{"device": "drive-scsi1", "type": "mirror", "status": "ready",
                      "io-status": "ok", "paused": False, "busy": False, "ready": True,
                      "len": 8 * GiB, "offset": 8 * GiB, "speed": 0}] if self.mirroring else []
        answer = super().reply(command, arguments)
        if not self.mirroring:
            return answer
        if command == "query-named-block-nodes":
            assert isinstance(answer, list)
            return [*answer, {"node-name": "#block410", "drv": "nbd", "file": NBD_URI,
                              "ro": False, "image": {"virtual-size": 8 * GiB}}]
        if command == "x-debug-query-block-graph":
            return {"nodes": [{"id": 1, "type": "block-job", "name": "drive-scsi1"},
                              {"id": 2, "type": "block-driver", "name": "f-scsi1"},
                              {"id": 3, "type": "block-driver", "name": "#block410"}],
                    "edges": [{"parent": 1, "child": 2, "name": "source", "perm": [],
                               "shared-perm": []},
                              {"parent": 1, "child": 3, "name": "target", "perm": [],
                               "shared-perm": []}]}
        return answer


async def test_the_source_defers_while_it_mirrors_into_the_targets_nbd_export(
        bed: Path) -> None:
    """Failed on the old code: the lock past its grace with query-migrate
    empty was taken as left over, and the drive grown during the mirror."""
    settings = bed_settings(bed)
    config = config_path(bed / "nodes", "pve1", VMID)
    config.parent.mkdir(parents=True)
    config.write_text("lock: migrate\nscsi0: san1:vm-101-disk-0.qcow2,size=32G\n"
                      "scsi1: local-lvm:vm-101-disk-1,size=8G\n")
    # Written by QemuMigrate::phase1 11 minutes ago; the mirror has run since.
    written = time.time() - MIGRATE_LOCK_GRACE - 60
    os.utime(config, (written, written))
    storage = parse_storage_config(STORAGE_CFG, "storage.cfg")
    extender = Extender(settings, lambda: storage)
    qemu = MigratingQemu(bed)
    vm = LocalVm(VMID, os.getpid(), bed / f"{VMID}.qmp")
    threshold_event = {"e0": Reason.THRESHOLD}
    try:
        async with running(qemu, vm.qmp_socket):
            qemu.mirroring = True
            qemu.fill()
            with pytest.raises(ExtensionsDeferred, match="migrating away"):
                await extender.handle(vm, threshold_event)
            assert extensions(bed) == []
            # The check made just before the storage lock (the pass's look
            # may be older) sees the mirror too.
            assert await extender.migrations.away_now(vm)
            # The migration failed and qemu-server's task died: the mirror is
            # gone, the lock left over. The drive is grown as usual.
            qemu.mirroring = False
            assert not await extender.migrations.away_now(vm)
            outcome = await extender.handle(vm, threshold_event)
            assert outcome.errors == {}
            assert extensions(bed) == [grown_to(GiB + 256 * MiB)]
    finally:
        await extender.close()
