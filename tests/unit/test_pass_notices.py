"""What a pass says of a VM's drives that are not plainly its own work.

- A snapshot delete's block job the storage plugin did not prepare (qemu-server
  called the storage in a way the plugin does not recognise): said at
  warning once, with the job's target, because the daemon's growth behind
  the job can come too late (``pvestord/engine/jobroom.py``).
- Another VM's disk attached to a VM: grown as any of its drives, and said
  once with its owner.

The pass runs whole through :class:`~pvestord.engine.extender.Extender` on
the fake-QEMU, fake-lvm bed of :mod:`tests.harness.extenderbed`.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

import pytest

from pvestord.adapters import preparedjobs
from pvestord.adapters.config import parse_storage_config
from pvestord.adapters.vmconfig import config_path
from pvestord.adapters.vms import LocalVm
from pvestord.engine.extender import Extender
from pvestord.policy import Reason
from tests.harness.extenderbed import (
    LV,
    STORAGE_CFG,
    VMID,
    FakeQemu,
    GiB,
    bed_settings,
    extensions,
    fake_lvm_bed,
    running,
)


async def two_threshold_passes(extender: Extender, qemu: FakeQemu, vm: LocalVm) -> None:
    """The guest writes past its threshold and a pass follows, twice; then the
    extender is closed."""
    try:
        async with running(qemu, vm.qmp_socket):
            for _ in range(2):
                qemu.fill()
                await extender.handle(vm, {"e0": Reason.THRESHOLD})
    finally:
        await extender.close()


@pytest.fixture
def bed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return fake_lvm_bed(tmp_path, monkeypatch)


class FakeQemuWithJobGraph(FakeQemu):
    """:class:`FakeQemu` whose block jobs are active commits into its drive's
    qcow2 node, as ``x-debug-query-block-graph`` shows qemu-server's
    ``block-commit`` of a snapshot delete."""

    def reply(self, command: str, arguments: dict[str, Any]) -> object:
        if command != "x-debug-query-block-graph":
            return super().reply(command, arguments)
        nodes: list[dict[str, object]] = [{"id": 1, "type": "block-driver", "name": "d0"}]
        edges: list[dict[str, object]] = []
        for number, job in enumerate(self.jobs, start=2):
            nodes.append({"id": number, "type": "block-job", "name": job["device"]})
            edges.append({"parent": number, "child": 1, "name": "target"})
        return {"nodes": nodes, "edges": edges}


@pytest.mark.parametrize("prepared", [False, True])
async def test_a_snapshot_delete_job_the_plugin_did_not_prepare_is_said_once(
        bed: Path, caplog: pytest.LogCaptureFixture, prepared: bool) -> None:
    settings = bed_settings(bed)
    config = config_path(bed / "nodes", "pve1", VMID)
    config.parent.mkdir(parents=True)
    config.write_text("lock: snapshot-delete\nscsi0: san1:vm-101-disk-0.qcow2,size=32G\n")
    written = time.time() - 60
    os.utime(config, (written, written))
    if prepared:
        # The plugin grew the job's target after qemu-server wrote the lock.
        preparedjobs.note(settings.prepared_jobs, "san", LV)
    storage = parse_storage_config(STORAGE_CFG, "storage.cfg")
    extender = Extender(settings, lambda: storage)
    qemu = FakeQemuWithJobGraph(bed)
    qemu.jobs = [{"device": "commit-drive-scsi0", "type": "commit", "status": "running",
                  "io-status": "ok", "paused": False, "busy": True, "ready": False,
                  "len": GiB, "offset": 0, "speed": 0}]
    vm = LocalVm(VMID, os.getpid(), bed / f"{VMID}.qmp")
    caplog.set_level(logging.DEBUG, logger="pvestord")
    await two_threshold_passes(extender, qemu, vm)
    # Said at warning once; each pass after that repeats it at debug only.
    said = [r for r in caplog.records if hasattr(r, "UNPREPARED_JOB")]
    if prepared:
        assert said == []
    else:
        assert [r.levelno for r in said] == [logging.WARNING, logging.DEBUG]
        record = said[0]
        assert (record.__dict__["VG"], record.__dict__["LV"]) == ("san", LV)
    # Prepared or not, the job's target is grown ahead of it.
    assert extensions(bed)


async def test_another_vms_disk_attached_to_a_vm_is_grown_and_said_once(
        bed: Path, caplog: pytest.LogCaptureFixture) -> None:
    settings = bed_settings(bed)
    storage = parse_storage_config(STORAGE_CFG, "storage.cfg")
    extender = Extender(settings, lambda: storage)
    qemu = FakeQemu(bed)
    # VM 202 has VM 101's disk attached (qm set 202 --scsi1 san1:vm-101-disk-0.qcow2).
    vm = LocalVm(202, os.getpid(), bed / "202.qmp")
    caplog.set_level(logging.DEBUG, logger="pvestord")
    await two_threshold_passes(extender, qemu, vm)
    said = [r for r in caplog.records if hasattr(r, "OWNER")]
    assert [(r.levelno, r.__dict__["OWNER"], r.__dict__["LV"]) for r in said] == [
        (logging.INFO, str(VMID), LV), (logging.DEBUG, str(VMID), LV)]
    assert len(extensions(bed)) == 2
