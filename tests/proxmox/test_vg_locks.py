"""The plugin holds the lock of every storage on its VG, and refuses a marked VG.

Proxmox locks ``storage-<storeid>``, never the VG: with ``thin1``
(``pvestord:``) and ``thick1`` (``lvm:``) on one VG, Proxmox's thick
``lvcreate`` on ``thick1`` runs under ``storage-thick1`` only. The plugin's
changes on ``thin1`` must therefore hold ``storage-thick1`` as well, taken in
the daemon's order (sorted by storage id), and must not run at all while the
VG is marked unhealthy on this node (an ``lvm`` of the daemon's that SIGKILL
did not end may still write its metadata).

Through the real PVE::Storage, with the recording LVM stand-ins of
:mod:`tests.proxmox.recorded` and the stand-in locks of
``PvestordTest/StandIns.pm`` (flock, keeping cfs_lock's contract). Runs on
any machine with the Proxmox sources and the Perl modules.
"""

from __future__ import annotations

import contextlib
import fcntl
from collections.abc import Iterator
from pathlib import Path

from pvestord.policy.sizes import GiB
from tests.proxmox import upstream
from tests.proxmox.recorded import SHARED_VG as VG
from tests.proxmox.recorded import (
    THIN_AND_THICK_CFG,
    Bed,
    empty_vg_fixture,
    storage_cfg_fixture,
)

DISK = "vm-100-disk-0.qcow2"
DISK_KIB = 4 * GiB // 1024
#: Every storage on the VG, in the order every holder takes them.
BOTH = ["storage-thick1", "storage-thin1"]
CHANGES = ("/sbin/lvcreate", "/sbin/lvremove", "/sbin/lvrename", "/sbin/lvextend")


proxmox = storage_cfg_fixture(THIN_AND_THICK_CFG)
bed = empty_vg_fixture()


def changes_and_locks(bed: Bed) -> list[tuple[str, list[str]]]:
    return [(c[0], locks) for c, locks in bed.commands_and_locks() if c[0] in CHANGES]


def test_a_thin_alloc_holds_the_thick_storages_lock_when_lvcreate_runs(bed: Bed) -> None:
    assert bed.try_alloc("thin1", 100, "qcow2", DISK, DISK_KIB) == {
        "volid": f"thin1:{DISK}", "error": ""}
    assert changes_and_locks(bed) == [("/sbin/lvcreate", BOTH)]
    # In the daemon's order: thick1 first, though the alloc is on thin1.
    assert bed.locks_taken() == BOTH


def test_a_thin_free_and_snapshot_hold_every_lock_of_the_vg(bed: Bed) -> None:
    bed.try_alloc("thin1", 100, "qcow2", DISK, DISK_KIB)
    bed.clear_log()
    found = bed.run(
        f'PVE::Storage::volume_snapshot($cfg, "thin1:{DISK}", "snap1");'
        f'PVE::Storage::vdisk_free($cfg, "thin1:{DISK}");'
        'print encode_json({});')
    assert found == {}
    ran = changes_and_locks(bed)
    assert [command for command, _ in ran] == [
        "/sbin/lvrename", "/sbin/lvcreate", "/sbin/lvremove", "/sbin/lvremove"]
    assert all(locks == BOTH for _, locks in ran), ran


@contextlib.contextmanager
def held_by_proxmox(proxmox: upstream.Upstream, storeid: str) -> Iterator[None]:
    """The stand-in lock of ``storeid`` held as Proxmox's own storage code
    holds it around a thick ``lvcreate`` (another process, here this one)."""
    with (proxmox.lock_dir / f"storage-{storeid}").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def test_a_thin_alloc_waits_for_proxmoxs_thick_operation_on_the_vg(
        proxmox: upstream.Upstream, bed: Bed) -> None:
    with held_by_proxmox(proxmox, "thick1"):
        found = bed.try_alloc("thin1", 100, "qcow2", DISK, DISK_KIB)
    assert found["volid"] == ""
    assert "cfs-lock 'storage-thick1' error: got lock request timeout" in found["error"]
    assert changes_and_locks(bed) == []
    assert bed.lvs() == {}


def mark(bed: Bed, reason: str = "lvextend (pid 4242) did not end after SIGKILL") -> Path:
    """The VG marked unhealthy on this node, as the daemon marks it."""
    bed.health_dir.mkdir(exist_ok=True)
    path = bed.health_dir / VG
    path.write_text(reason + "\n")
    return path


def test_a_marked_vg_refuses_the_alloc_naming_the_mark_before_any_lock(bed: Bed) -> None:
    path = mark(bed)
    found = bed.try_alloc("thin1", 100, "qcow2", DISK, DISK_KIB)
    assert found["volid"] == ""
    assert f"removed {path}" in found["error"]
    assert "pid 4242" in found["error"]
    assert "operations.md" in found["error"]
    # Only Proxmox's activation of the storage read the VG (vgs); nothing changed it.
    assert [c[0] for c in bed.commands()] == ["/sbin/vgs"]
    assert bed.locks_taken() == []
    # The thick storage on the same VG is Proxmox's own: not ours to hold back.
    assert bed.try_alloc("thick1", 101, "raw", "vm-101-disk-0", DISK_KIB)["error"] == ""
    path.unlink()
    assert bed.try_alloc("thin1", 100, "qcow2", DISK, DISK_KIB)["error"] == ""


def test_a_mark_set_while_the_locks_were_awaited_refuses_under_them(bed: Bed,
                                                                  tmp_path: Path) -> None:
    # pvestord answers which locks to take; the VG is marked right after (as
    # the daemon would mark it while holding the locks the plugin waits for).
    path = bed.health_dir / VG
    marking = tmp_path / "marking-pvestord"
    marking.write_text(
        "#!/bin/sh\n"
        f"{bed.env['PVESTORD_TEST_COMMAND']} \"$@\"\nstatus=$?\n"
        f"mkdir -p {bed.health_dir}\n"
        f"[ -e {path} ] || echo 'lvextend (pid 4343) did not end after SIGKILL' > {path}\n"
        "exit $status\n")
    marking.chmod(0o755)
    found = bed.run(
        f'my $volid = eval {{ PVE::Storage::vdisk_alloc($cfg, "thin1", 100, "qcow2", "{DISK}",'
        f' {DISK_KIB}) }};'
        'print encode_json({volid => $volid // "", error => "$@"});',
        PVESTORD_TEST_COMMAND=str(marking))
    assert found["volid"] == ""
    assert "pid 4343" in found["error"]
    assert f"removed {path}" in found["error"]
    assert bed.locks_taken() == BOTH
    assert changes_and_locks(bed) == []
