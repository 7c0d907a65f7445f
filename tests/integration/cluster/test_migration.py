"""Live migration of a VM with a thin drive between the two nodes, without corruption.

The corruption this guards against (reproduced in docs/design.md, "Live migration"): an LV grown
on the source while it is active on the destination leaves the destination's
device-mapper table short; the destination QEMU takes that size at the
switchover and reads the data past it as zeros, with no error.

QEMU here plays qemu-server's part: the target is started with ``-incoming``
on B, ``migrate`` is sent to A, and A's QEMU quits once B runs the VM. The
migration hint is ``pvestord migration begin|end``, called as a storage hook
would; every test runs with and without it in the full set (``make cluster
CLUSTER=full``), and ``make check`` runs one of the two of each: the
extension before the migration without the hint (the path that must hold
on its own), the one at the switchover with it.
"""

from __future__ import annotations

import time

import pytest

from tests.harness.daemonlog import extensions, parse, records
from tests.harness.migrationguest import (
    CHUNK,
    EXTEND_TIMEOUT,
    INITIAL,
    MIGRATE_TIMEOUT,
    Guest,
    threshold,
    vmids,
    write,
)
from tests.harness.polling import wait_until
from tests.harness.twonode import (
    Cluster,
    MiB,
    create_thin_volume,
    deferred_twice,
    device_size,
    file_node,
    fmt_node,
    lv_size,
    migration_status,
    pvestord_cli,
    run_status,
    vm_lv,
)


@pytest.mark.parametrize("hint", [True, False], ids=["hint", "nohint"])
@pytest.mark.cluster_full  # make check runs the no-hint case with qemu-server's lock instead
def test_extension_before_migration_verifies_on_b(guest: Guest, hint: bool) -> None:
    cluster, a, b = guest.cluster, guest.cluster.a, guest.cluster.b
    if hint:
        # The case of docs/design.md, "Live migration": the LV is active on B while A grows it.
        guest.activate_on_b()
    write(a, guest.vmid, 0, 56 * MiB, 0x3C)                  # crosses 48 MiB
    wait_until(lambda: threshold(a, guest.vmid) == 96 * MiB - CHUNK // 2, EXTEND_TIMEOUT,
               "extended on A and re-armed")
    write(a, guest.vmid, 56 * MiB, 76 * MiB, 0x3C)           # past the old end (64 MiB)
    if hint:
        assert device_size(b, cluster.vg, guest.lv) == INITIAL  # B's table is stale
        guest.hint("begin")
    else:
        guest.activate_on_b()  # as qemu-server does when it starts the target
    started = time.monotonic()
    guest.start_migration()
    guest.finish_migration()
    print(f"\nmigration {'with' if hint else 'without'} hint: {time.monotonic() - started:.2f} s"
          " from target start to B running")
    if hint:
        guest.hint("end")
    assert device_size(b, cluster.vg, guest.lv) == lv_size(b, cluster.vg, guest.lv)
    assert b.vm(guest.vmid, "read_verify", fmt_node(guest.vmid), 0, 76 * MiB, 0x3C, timeout=300)
    # B arms the threshold once the VM runs there, and extends on B, without a pause.
    size = lv_size(b, cluster.vg, guest.lv)
    wait_until(lambda: threshold(b, guest.vmid) == size - CHUNK // 2, 60, "armed on B")
    write(b, guest.vmid, 76 * MiB, size - CHUNK // 2 + 4 * MiB, 0x4D)
    wait_until(lambda: lv_size(b, cluster.vg, guest.lv) == size + CHUNK, EXTEND_TIMEOUT,
               "extended on B")
    assert run_status(b, guest.vmid) == "running"
    assert extensions(b.log_text("pvestord"), VMID=str(guest.vmid),
                      BLOCK_NODE=file_node(guest.vmid))
    assert b.vm(guest.vmid, "read_verify", fmt_node(guest.vmid), 76 * MiB,
                size - CHUNK // 2 + 4 * MiB - 76 * MiB, 0x4D, timeout=300)


@pytest.mark.parametrize("hint", [True, pytest.param(False, marks=pytest.mark.cluster_full)],
                         ids=["hint", "nohint"])
def test_threshold_crossed_at_switchover_is_extended_on_b(guest: Guest, hint: bool) -> None:
    """The write crosses the threshold while the source waits at the switchover
    (``pause-before-switchover``): A defers, B extends once it runs the VM."""
    cluster, a, b = guest.cluster, guest.cluster.a, guest.cluster.b
    guest.activate_on_b()
    if hint:
        guest.hint("begin")
        grown = guest.size()
        assert grown == INITIAL + CHUNK  # pre-extended by one chunk
        assert device_size(b, cluster.vg, guest.lv) == grown
    else:
        grown = INITIAL
    guest.start_migration(pause_before_switchover=True)
    wait_until(lambda: migration_status(a, guest.vmid) == "pre-switchover", MIGRATE_TIMEOUT,
               "source paused before the switchover")
    crossing = grown - CHUNK // 2 + 4 * MiB
    seen = len(a.log_text("pvestord"))
    write(a, guest.vmid, 0, crossing, 0x5E)
    deferred_twice(a, guest.vmid, seen)  # A's daemon saw the crossing, and held it back
    assert guest.size() == grown
    a.vm(guest.vmid, "qmp", "migrate-continue", {"state": "pre-switchover"})
    guest.finish_migration()
    if hint:
        guest.hint("end")
    # B's QEMU starts with no allocation figure (``wr_highest_offset`` is not
    # migrated), so B arms below the real allocation; the guest's next
    # allocating write fires it at once.
    wait_until(lambda: threshold(b, guest.vmid) == grown - CHUNK // 2, 60, "armed on B")
    write(b, guest.vmid, crossing, crossing + 4 * MiB, 0x5F)
    wait_until(lambda: lv_size(b, cluster.vg, guest.lv) == grown + CHUNK, EXTEND_TIMEOUT,
               "extended on B after the switchover")
    wait_until(lambda: threshold(b, guest.vmid) == grown + CHUNK - CHUNK // 2, 60,
               "re-armed on B")
    assert b.vm(guest.vmid, "read_verify", fmt_node(guest.vmid), 0, crossing, 0x5E, timeout=300)
    assert any("DEFERRED" in line.fields
               for line in records(a.log_text("pvestord"), VMID=str(guest.vmid)))


def test_qemu_servers_lock_defers_from_target_start_to_switchover(guest: Guest) -> None:
    """Without the hint, as Proxmox migrates: an extension before the migration,
    a threshold crossed after qemu-server wrote ``lock: migrate`` and the target
    activated the LV (the window the hint was for: B's table is taken now, and
    an extension on A would leave it short), and one after the switchover on B.
    Every byte reads back on B."""
    cluster, a, b = guest.cluster, guest.cluster.a, guest.cluster.b
    write(a, guest.vmid, 0, 56 * MiB, 0x61)                  # crosses 48 MiB: before
    grown = INITIAL + CHUNK
    wait_until(lambda: threshold(a, guest.vmid) == grown - CHUNK // 2, EXTEND_TIMEOUT,
               "extended on A before the migration and re-armed")
    guest.config_lock("migrate")  # QemuMigrate::phase1, before the target starts
    guest.activate_on_b()         # the target's start activates (and refreshes) the LV
    assert device_size(b, cluster.vg, guest.lv) == grown
    crossing = grown - CHUNK // 2 + 4 * MiB
    write(a, guest.vmid, 56 * MiB, crossing, 0x62)           # crosses the threshold: at
    wait_until(lambda: any(line.fields.get("VMID") == str(guest.vmid)
                           and line.fields.get("DEFERRED") == "migrating"
                           for line in parse(a.log_text("pvestord"))),
               EXTEND_TIMEOUT, "A deferred the extension for qemu-server's lock")
    assert guest.size() == grown and device_size(b, cluster.vg, guest.lv) == grown
    guest.start_migration()
    guest.finish_migration()
    guest.config_lock(None)       # qemu-server moves the config to B and unlocks it
    assert device_size(b, cluster.vg, guest.lv) == lv_size(b, cluster.vg, guest.lv) == grown
    assert b.vm(guest.vmid, "read_verify", fmt_node(guest.vmid), 0, 56 * MiB, 0x61, timeout=300)
    assert b.vm(guest.vmid, "read_verify", fmt_node(guest.vmid), 56 * MiB,
                crossing - 56 * MiB, 0x62, timeout=300)
    # B starts with no allocation figure: it arms below the real allocation,
    # and the next allocating write extends on B: after.
    wait_until(lambda: threshold(b, guest.vmid) == grown - CHUNK // 2, 60, "armed on B")
    write(b, guest.vmid, crossing, crossing + 4 * MiB, 0x63)
    wait_until(lambda: lv_size(b, cluster.vg, guest.lv) == grown + CHUNK, EXTEND_TIMEOUT,
               "extended on B after the switchover")
    assert run_status(b, guest.vmid) == "running"
    assert b.vm(guest.vmid, "read_verify", fmt_node(guest.vmid), crossing, 4 * MiB, 0x63,
                timeout=300)


def test_pre_extension_stops_at_what_the_qcow2_can_use(daemons: Cluster) -> None:
    """``begin --role outgoing`` near the image's maximum adds nothing."""
    cluster, a = daemons, daemons.a
    vmid = next(vmids)
    lv = vm_lv(vmid)
    # 32 MiB of virtual disk: fully allocated it needs well under the 64 MiB LV.
    create_thin_volume(a, cluster.vg, vmid, size=INITIAL, virtual=32 * MiB)
    try:
        out = pvestord_cli(cluster, a, "migration", "begin", str(vmid), "--role", "outgoing")
        assert f"{cluster.vg}/{lv}: at maximum 64 MiB -> 64 MiB" in out, out
        assert lv_size(a, cluster.vg, lv) == INITIAL
        pvestord_cli(cluster, a, "migration", "end", str(vmid), "--role", "outgoing")
    finally:
        a.run(["lvremove", "-q", "-f", f"{cluster.vg}/{lv}"], check=False)
