"""A guest that fills its LV while it live-migrates pauses on A, at most once more on B,
and ends running on B.

The guest is the writer boot sector (``tests/harness/writerguest.py``): it
writes through virtio-blk with ``werror=enospc``, so running out of LV pauses
the VM as a real guest would be paused. It runs from the start, reading a
gate sector until the harness opens it, so the migration iterates as for any
running guest (QEMU 10 completes the migration of a VM stopped in ``-S`` at
once, without pre-copy). The migration is held in pre-copy by B's QEMU,
stopped (SIGSTOP) until the test lets it go: A's stream waits once the
sockets' buffers are full, because the guest's RAM is random and far larger
than them. (``max-bandwidth`` held QEMU 7.2 back; QEMU 10 finished its
pre-copy within the fill all the same, zeroed RAM or random, and its
switchover then failed on the harness's writes still exported over NBD.)
Meanwhile the harness fills the image to 2 MiB short of the LV's end, opens
the gate, and the guest then writes 3 MiB past it. A must defer (an
extension on the source that B has not refreshed before the switchover is
the corruption of docs/design.md, "Live migration"), so the VM pauses on A;
once B's QEMU runs again the migration completes with the VM paused, and B, which receives the
run state ``io-error`` but not the device's io-status (QEMU does not migrate
it), must resume the guest. B's QEMU never saw the failed write, so its
figures do not say which drive ran out: B grows no drive that has a chunk of
room by its own figures, and resumes; the retried write fails once more, on a
device that now says ``nospace``, and B extends that LV and resumes again.
The write then lands.

Without the hint A defers because ``query-migrate`` says a migration is in
flight: nothing warned pvestord beforehand. With the hint (the full set
only: it takes 3.5 minutes), A defers from ``begin`` on, after a
pre-extension by a chunk, and the fill goes to the new end.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from pathlib import Path

import pytest

from tests.harness.daemonlog import records
from tests.harness.polling import wait_until
from tests.harness.twonode import (
    AgentError,
    Cluster,
    MiB,
    create_thin_volume,
    deferred_twice,
    file_node,
    fmt_node,
    launch_vm,
    lv_size,
    lvm,
    migration_status,
    pvestord_cli,
    run_status,
    vm_disk,
    vm_lv,
)
from tests.harness.writerguest import build_writer

INITIAL, CHUNK = 64 * MiB, 32 * MiB
VIRTUAL = 1024 * MiB
GUEST_WRITE = 3 * MiB
FILL_PATTERN, GUEST_PATTERN = 0x11, 0x5A
#: The guest writes once the first sector reads as GATE_PATTERN: rewritten
#: after the fill, in a cluster the fill allocated, so opening it takes no room.
GATE_PATTERN = 0x77
GATE = (0, GATE_PATTERN)
SECTOR = 512
PORT = 4445
#: The guest's RAM: random, so A's stream cannot fit in the sockets' buffers.
GUEST_RAM = 64 * MiB
IO_TIMEOUT = 300.0


def random_ram(path: Path) -> list[str]:
    """QEMU options for guest RAM that starts as random bytes (a private
    mapping of a file: the guest's writes stay in memory), on either node."""
    path.write_bytes(os.urandom(GUEST_RAM))
    return ["-object", f"memory-backend-file,id=ram0,size={GUEST_RAM},mem-path={path},share=off",
            "-machine", "memory-backend=ram0"]


@pytest.mark.parametrize("hint", [pytest.param(True, marks=pytest.mark.cluster_full), False],
                         ids=["hint", "nohint"])
def test_guest_filling_its_lv_while_migrating_ends_running_on_b(
        daemons: Cluster, hint: bool) -> None:
    cluster, a, b = daemons, daemons.a, daemons.b
    vmid = 361 if hint else 362
    lv = vm_lv(vmid)
    path = create_thin_volume(a, cluster.vg, vmid, size=INITIAL, virtual=VIRTUAL)
    guests = cluster.work / "guests"
    guests.mkdir(exist_ok=True)
    # The LV's end when the migration starts: where the fill and the guest go.
    end = INITIAL + CHUNK if hint else INITIAL
    on_a = build_writer(guests, a.logs, f"writer-{vmid}", start=end - 2 * MiB,
                        length=GUEST_WRITE, pattern=GUEST_PATTERN, gate=GATE)
    on_b = dataclasses.replace(on_a, debugcon=b.logs / f"writer-{vmid}.debugcon",
                               bios_log=b.logs / f"writer-{vmid}.seabios.log")
    ram = random_ram(guests / f"ram-{vmid}.img")
    incoming: str | None = None
    launch_vm(a, vmid, path, machine="pc", extra=[*on_a.args(vm_disk(vmid).top_node), *ram])
    try:
        wait_until(lambda: int(a.vm(vmid, "named_node", file_node(vmid))["write_threshold"])
                   == INITIAL - CHUNK // 2, 120, "threshold armed on A")
        lvm(b, "lvchange", "-ay", f"{cluster.vg}/{lv}")   # as qemu-server, for the target
        if hint:
            pvestord_cli(cluster, a, "migration", "begin", str(vmid), "--role", "outgoing")
            pvestord_cli(cluster, b, "migration", "begin", str(vmid), "--role", "incoming")
        assert lv_size(a, cluster.vg, lv) == end
        launch_vm(b, vmid, path, machine="pc", incoming=f"tcp:0:{PORT}",
                  extra=[*on_b.args(vm_disk(vmid).top_node), *ram])
        incoming = b.sh("cat", f"{b.run_dir}/{vmid}.pid").strip()
        b.run(["kill", "-STOP", incoming])  # holds A's stream once the buffers are full
        a.vm(vmid, "qmp", "migrate", {"uri": f"tcp:{b.addr}:{PORT}"})
        wait_until(lambda: migration_status(a, vmid) == "active", 60, "migration active")

        # Fill to 2 MiB short of the LV's end while it migrates: A must not extend.
        for offset in range(0, end - 2 * MiB, 16 * MiB):
            r = a.vm(vmid, "write_pattern", fmt_node(vmid), offset,
                     min(16 * MiB, end - 2 * MiB - offset), FILL_PATTERN, check=False,
                     timeout=IO_TIMEOUT)
            assert r["ok"], r
        migrating = a.vm(vmid, "qmp", "query-migrate")
        assert migrating.get("status") == "active", f"the migration outran the fill: {migrating}"
        r = a.vm(vmid, "write_pattern", fmt_node(vmid), GATE[0], SECTOR, GATE_PATTERN,
                 check=False, timeout=IO_TIMEOUT)
        assert r["ok"], r
        error = a.vm(vmid, "wait_event", "BLOCK_IO_ERROR", timeout=IO_TIMEOUT)
        assert error["data"]["nospace"] is True and error["data"]["action"] == "stop", error
        seen = len(a.log_text("pvestord"))
        a.vm(vmid, "wait_event", "STOP", timeout=60)
        migrating = a.vm(vmid, "qmp", "query-migrate")
        assert migrating.get("status") == "active", (
            f"the migration ended before the pause: {migrating}")
        deferred_twice(a, vmid, seen)  # A's daemon saw the pause, and still defers
        assert lv_size(a, cluster.vg, lv) == end

        b.run(["kill", "-CONT", incoming])
        wait_until(lambda: migration_status(a, vmid) in ("completed", "failed"), 300,
                   "migration finished")
        migrated = a.vm(vmid, "qmp", "query-migrate")
        assert migrated.get("status") == "completed", migrated
        a.call("vm_shutdown", vmid=vmid)
        lvm(a, "lvchange", "-an", f"{cluster.vg}/{lv}")

        # B resumes; the retried write may pause it once more, on its own
        # device's nospace, which B answers; then the guest's write lands.
        b.vm(vmid, "wait_event", "RESUME", timeout=300)
        wait_until(lambda: (on_a.output() + on_b.output()).endswith("S")
                   or "F" in on_b.output(), 300, "the guest finished its write on B")
        assert on_a.output() + on_b.output() == on_a.success
        assert run_status(b, vmid) == "running"
        # The failed write counts in the allocation: one chunk past it, in extents.
        assert end + CHUNK <= lv_size(b, cluster.vg, lv) <= end + GUEST_WRITE + CHUNK + 4 * MiB
        assert records(b.log_text("pvestord"), VMID=str(vmid), RESUMED="io-error")
        with contextlib.suppress(AgentError):  # the retried write's pause, if any
            again = b.vm(vmid, "wait_event", "BLOCK_IO_ERROR", timeout=1)
            assert again["data"]["nospace"] is True, again
        with pytest.raises(AgentError):
            b.vm(vmid, "wait_event", "BLOCK_IO_ERROR", timeout=1)
        assert b.vm(vmid, "read_verify", fmt_node(vmid), 0, SECTOR, GATE_PATTERN)
        assert b.vm(vmid, "read_verify", fmt_node(vmid), SECTOR, end - 2 * MiB - SECTOR,
                    FILL_PATTERN, timeout=IO_TIMEOUT)
        assert b.vm(vmid, "read_verify", fmt_node(vmid), end - 2 * MiB, GUEST_WRITE, GUEST_PATTERN,
                    timeout=IO_TIMEOUT)
        if hint:
            pvestord_cli(cluster, a, "migration", "end", str(vmid), "--role", "outgoing")
            pvestord_cli(cluster, b, "migration", "end", str(vmid), "--role", "incoming")
    finally:
        if incoming is not None:
            b.run(["kill", "-CONT", incoming], check=False)
        for node in cluster.nodes:
            node.call("vm_shutdown", vmid=vmid)
    check = b.run(["qemu-img", "check", f"/dev/{cluster.vg}/{lv}"], check=False)
    for node in cluster.nodes:
        node.run(["lvchange", "-an", f"{cluster.vg}/{lv}"], check=False)
    b.run(["lvremove", "-q", "-f", f"{cluster.vg}/{lv}"], check=False)
    assert check.rc == 0, check.stdout + check.stderr
