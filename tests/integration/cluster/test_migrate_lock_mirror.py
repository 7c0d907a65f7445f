"""``lock: migrate`` keeps deferring on the source while a
``--with-local-disks`` migration mirrors a local disk into the target, however
old the lock; the destination, ``inmigrate`` meanwhile, keeps its table level
with LVM under the storage lock.

qemu-server's order, played with QEMU as in test_migration.py: phase1 writes
``lock: migrate`` (here 11 minutes ago, past the 10-minute grace that once
took the lock as left over); the target QEMU starts on B with ``-incoming``
(its start activates the shared LV) and exports its local disk over NBD
(``nbd-server-start``, ``block-export-add``); the source mirrors its local
disk into that export (a ``null-co`` node stands in for the disk on both
sides: only the job and its NBD target matter to pvestord), and only when
the mirror is ``ready`` does ``migrate`` start. Meanwhile ``query-migrate``
shows nothing and the config is not rewritten.

* A: the guest crosses its threshold during the mirror; the source defers
  (twice, so not by chance) and its LV stays as it was. On the code before
  this fix it was grown, the lock being past its grace.
* B: an extension committed on the SAN during the mirror (an ``lvextend``
  by hand on A) is refreshed into B's table while the VM waits in
  ``inmigrate`` (B's comparison runs under the storage lock on every look).
* After the switchover every byte reads back on B, and B extends on its own.
"""

from __future__ import annotations

import os
import time

from tests.harness.daemonlog import extensions
from tests.harness.migrationguest import (
    CHUNK,
    EXTEND_TIMEOUT,
    INITIAL,
    MIGRATE_TIMEOUT,
    Guest,
    threshold,
    write,
)
from tests.harness.polling import wait_until
from tests.harness.twonode import (
    MiB,
    deferred_twice,
    device_size,
    file_node,
    fmt_node,
    launch_vm,
    lv_size,
    lvm,
    migration_status,
    run_status,
)

MIGRATE_PORT = 4446
NBD_PORT = 4447
#: What QemuMigrate::phase1 wrote 11 minutes ago: past MIGRATE_LOCK_GRACE (600 s).
LOCK_AGE = 11 * 60
LOCAL_DISK = {"driver": "null-co", "node-name": "local-scsi1", "size": 64 * MiB,
              "read-zeroes": True}
JOB = "drive-scsi1"  # qemu-server names the mirror job after the drive


def test_lock_migrate_defers_through_a_local_disk_mirror(guest: Guest) -> None:
    cluster, a, b = guest.cluster, guest.cluster.a, guest.cluster.b
    vmid, vg, lv = guest.vmid, cluster.vg, guest.lv
    guest.config_lock("migrate")
    config = cluster.pve / "nodes" / a.name / "qemu-server" / f"{vmid}.conf"
    written = time.time() - LOCK_AGE
    os.utime(config, (written, written))

    guest.activate_on_b()  # the target's start activates (and refreshes) the LV
    launch_vm(b, vmid, guest.path, incoming=f"tcp:0:{MIGRATE_PORT}")
    assert run_status(b, vmid) == "inmigrate"
    b.vm(vmid, "qmp", "blockdev-add", LOCAL_DISK)
    b.vm(vmid, "qmp", "nbd-server-start", {"addr": {"type": "inet", "data": {
        "host": "0.0.0.0", "port": str(NBD_PORT)}}})
    b.vm(vmid, "qmp", "block-export-add", {"type": "nbd", "id": JOB, "name": JOB,
                                            "node-name": LOCAL_DISK["node-name"],
                                            "writable": True})
    a.vm(vmid, "qmp", "blockdev-add", LOCAL_DISK)
    a.vm(vmid, "qmp", "blockdev-add", {"driver": "nbd", "node-name": "nbd-scsi1",
                                       "server": {"type": "inet", "host": b.addr,
                                                  "port": str(NBD_PORT)},
                                       "export": JOB})
    a.vm(vmid, "qmp", "blockdev-mirror", {"job-id": JOB, "device": LOCAL_DISK["node-name"],
                                          "target": "nbd-scsi1", "sync": "full"})
    assert a.vm(vmid, "wait_job", JOB, timeout=MIGRATE_TIMEOUT) == "ready"
    assert migration_status(a, vmid) == "none"  # qemu-server has not sent migrate yet
    assert device_size(b, vg, lv) == INITIAL

    # An extension that commits on the SAN during the mirror (one already
    # past its checks, or another node's pvestord of old): B, in inmigrate,
    # compares under the storage lock on every look and refreshes its table.
    # Made after the mirror is ready, so A's deferral keeps the threshold
    # where it was armed (INITIAL - CHUNK / 2) instead of re-arming it.
    lvm(a, "lvextend", "-q", "-L", f"+{CHUNK // MiB}m", f"{vg}/{lv}")
    grown = INITIAL + CHUNK
    assert guest.size() == grown
    wait_until(lambda: device_size(b, vg, lv) == grown, EXTEND_TIMEOUT,
               "B refreshed its table while inmigrate")
    assert run_status(b, vmid) == "inmigrate"

    # The guest crosses its threshold during the mirror: A holds it back,
    # twice (the second pass began after the first had seen the crossing).
    seen = len(a.log_text("pvestord"))
    crossing = INITIAL - CHUNK // 2 + 8 * MiB
    write(a, vmid, 0, crossing, 0x71)
    deferred_twice(a, vmid, seen)
    assert guest.size() == grown
    assert not extensions(a.log_text("pvestord")[seen:], VMID=str(vmid))
    assert threshold(a, vmid) in (0, INITIAL - CHUNK // 2)  # fired (0) or never re-armed
    assert run_status(b, vmid) == "inmigrate"
    assert device_size(b, vg, lv) == lv_size(b, vg, lv) == grown

    # qemu-server's migrate with the mirror ready, the mirror cancelled
    # after the switchover (A's QEMU quits with it here).
    a.vm(vmid, "qmp", "migrate", {"uri": f"tcp:{b.addr}:{MIGRATE_PORT}"})
    guest.finish_migration()
    # qemu-server stops the target's NBD server once the disks are across
    # (and the harness's own reads export through one of their own).
    b.vm(vmid, "qmp", "nbd-server-stop")
    guest.config_lock(None)  # qemu-server moves the config to B and unlocks it
    assert device_size(b, vg, lv) == lv_size(b, vg, lv) == grown
    assert b.vm(vmid, "read_verify", fmt_node(vmid), 0, crossing, 0x71, timeout=300)
    # B arms on the LV as it is, and extends on its own after the switchover.
    wait_until(lambda: threshold(b, vmid) == grown - CHUNK // 2, 60, "armed on B")
    write(b, vmid, crossing, grown - CHUNK // 2 + 4 * MiB, 0x72)
    wait_until(lambda: lv_size(b, vg, lv) == grown + CHUNK, EXTEND_TIMEOUT,
               "extended on B after the switchover")
    assert extensions(b.log_text("pvestord"), VMID=str(vmid), BLOCK_NODE=file_node(vmid))
    assert b.vm(vmid, "read_verify", fmt_node(vmid), crossing,
                grown - CHUNK // 2 + 4 * MiB - crossing, 0x72, timeout=300)
