"""A snapshot lock left behind by a failed task stops holding a VM back.

qemu-server writes ``lock: snapshot-delete`` before it commits a deleted
snapshot's data, and a delete that fails leaves it there until ``qm unlock``.
pvestord stands back from a VM whose LVs are being renamed; once the lock has
sat a grace with no block job in the VM's QEMU, a threshold event extends the
drive again, and the lock is said at warning once.

The pass runs whole through :class:`~pvestord.engine.extender.Extender`
(the bed is tests/harness/extenderbed.py):
QEMU is a fake on a real Unix socket, ``lvm`` a script put in the way through
``PVESTORD_LVM`` (as in test_vg_report_sharing.py), the storage lock a real
lock directory. Two narrow hooks stand in for what this machine has not: the
device-mapper table's size (no ``/dev/VG/LV`` here) and QEMU's open file
descriptors (no QEMU process: the drive is taken by its LV name).
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import pytest

from pvestord.adapters.config import parse_storage_config
from pvestord.adapters.qmp import VmBusyError
from pvestord.adapters.vmconfig import config_path
from pvestord.adapters.vms import LocalVm
from pvestord.engine import migration
from pvestord.engine.extender import Extender
from pvestord.policy import Reason
from pvestord.policy.vmconfig import RENAMING_LOCK_GRACE
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


async def test_a_left_over_snapshot_delete_lock_stops_refusing_extensions(
        bed: Path, caplog: pytest.LogCaptureFixture) -> None:
    settings = bed_settings(bed)
    config = config_path(bed / "nodes", "pve1", VMID)
    config.parent.mkdir(parents=True)
    config.write_text("lock: snapshot-delete\nscsi0: san1:vm-101-disk-0.qcow2,size=32G\n")
    # Written by the delete that failed, long ago.
    written = time.time() - RENAMING_LOCK_GRACE - 3600
    os.utime(config, (written, written))
    now = [5000.0]
    quiet = migration.QuietRenamingLocks(clock=lambda: now[0])
    storage = parse_storage_config(STORAGE_CFG, "storage.cfg")
    extender = Extender(settings, lambda: storage, quiet_locks=quiet)
    qemu = FakeQemu(bed)
    vm = LocalVm(VMID, os.getpid(), bed / f"{VMID}.qmp")
    threshold_event = {"e0": Reason.THRESHOLD}
    caplog.set_level(logging.DEBUG, logger="pvestord")
    try:
        async with running(qemu, vm.qmp_socket):
            # The daemon has just met the lock: it stands back, as from a
            # snapshot task at work.
            qemu.fill()
            with pytest.raises(VmBusyError, match="snapshot operation"):
                await extender.handle(vm, threshold_event)
            assert extensions(bed) == []
            # qemu-server's commit runs (and is grown through): the task is at
            # work after all, and the count starts again when the job ends.
            now[0] += RENAMING_LOCK_GRACE
            qemu.jobs = [{"device": "commit-drive-scsi0", "type": "commit",
                          "status": "running", "io-status": "ok", "paused": False,
                          "busy": True, "ready": False, "len": GiB, "offset": 0,
                          "speed": 0}]
            await extender.handle(vm, threshold_event)
            assert extensions(bed) == [grown_to(GiB + 256 * MiB)]
            qemu.jobs = []
            qemu.fill()
            with pytest.raises(VmBusyError):
                await extender.handle(vm, threshold_event)
            now[0] += RENAMING_LOCK_GRACE - 1
            with pytest.raises(VmBusyError):
                await extender.handle(vm, threshold_event)
            assert len(extensions(bed)) == 1
            # A grace with no job: left over. Extended as usual, said once.
            now[0] += 1
            outcome = await extender.handle(vm, threshold_event)
            assert outcome.errors == {}
            assert extensions(bed)[1:] == [grown_to(GiB + 512 * MiB)]
            assert qemu.threshold > GiB + 256 * MiB  # armed again on the grown LV
            qemu.fill()
            await extender.handle(vm, threshold_event)
            assert extensions(bed)[2:] == [grown_to(GiB + 768 * MiB)]
    finally:
        await extender.close()
    warnings = [r.getMessage() for r in caplog.records
                if r.levelno == logging.WARNING and "lock: snapshot-delete" in r.getMessage()]
    assert warnings == [
        f"VM {VMID}: its config has had 'lock: snapshot-delete' for over "
        f"{RENAMING_LOCK_GRACE:.0f} s with no block job in its QEMU: taken as left over "
        f"from a failed task, its drives are extended as usual ('qm unlock {VMID}' "
        "clears it)"]
