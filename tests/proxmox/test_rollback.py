"""A rollback through the real PVE::Storage completes or leaves the volume as it was.

``volume_snapshot_rollback`` replaces the volume's top with a new overlay on
the snapshot. Whatever refuses (pvestord's capacity guards, pvestord itself
failing, LVM or qemu-img failing while the new top is made) must leave the
chain as it was, the current LV in place, so that the rollback can simply be
tried again; and with ``saferemove`` the old top, which may have grown to
hundreds of GiB, is zeroed outside the storage lock (cfs_lock's alarm aborts
a holder after 60 s), as Proxmox's own ``lvm`` type does it.

LVM and qemu-img are the recording stand-ins of :mod:`tests.proxmox.recorded`.
Runs on any machine with the Proxmox sources and the Perl modules.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from pvestord.policy.capacity import CRITICAL_FREE
from pvestord.policy.sizes import GiB, MiB
from tests.proxmox.recorded import (
    SHARED_VG,
    THIN1_SECTION,
    Bed,
    empty_vg_fixture,
    pvestord_section,
    storage_cfg_fixture,
)

VG = SHARED_VG
EXTENT = 4 * MiB
VG_SIZE = 20 * GiB
INITIAL_SIZE = 1 * GiB
DISK = 4 * GiB
VOLNAME = "vm-100-disk-0.qcow2"
SNAP = "snap_vm-100-disk-0_snap1.qcow2"
#: The name the old top has while it is replaced (the plugin's replaced_top_name).
REPLACED = f"{VOLNAME}-rollback"
#: thin-critical-free is left at its default, 5 %: 1 GiB of this VG.
STORAGE_CFG = THIN1_SECTION + "\n" + pvestord_section("safe1", "saferemove 1")
#: What the rollbacks here change in the VG, in order: the commands that write.
CHANGES = ("/sbin/lvcreate", "/sbin/lvremove", "/sbin/lvrename")


proxmox = storage_cfg_fixture(STORAGE_CFG)
bed = empty_vg_fixture(vg=VG, vg_size=VG_SIZE, extent=EXTENT)


def snapshotted_disk(bed: Bed, storeid: str) -> dict[str, Any]:
    """A disk with one snapshot, its top marked as written by the guest (a
    mark a new top would not have); returns the VG's LVs."""
    made = bed.try_alloc(storeid, 100, "qcow2", VOLNAME, DISK // 1024)
    assert made == {"volid": f"{storeid}:{VOLNAME}", "error": ""}
    bed.run(f'PVE::Storage::volume_snapshot($cfg, "{storeid}:{VOLNAME}", "snap1");'
            'print "{}";')
    lvs = bed.lvs()
    assert set(lvs) == {SNAP, VOLNAME}
    assert lvs[VOLNAME]["backing"] == SNAP
    lvs[VOLNAME]["written"] = True
    bed.set_lvs(lvs)
    bed.clear_log()
    return lvs


def rollback(bed: Bed, storeid: str, **extra: str) -> str:
    """Proxmox's rollback to snap1 (qm rollback's storage call); its error or ''."""
    found = bed.run(f'eval {{ PVE::Storage::volume_snapshot_rollback($cfg, "{storeid}:{VOLNAME}",'
                    ' "snap1") }; print encode_json({error => "$@"});', **extra)
    error: str = found["error"]
    return error


def changes(bed: Bed) -> list[list[str]]:
    return [c for c in bed.commands() if c[0] in CHANGES or c[:2] == ["/usr/bin/qemu-img",
                                                                       "create"]]


def assert_rolled_back(bed: Bed, before: dict[str, Any], also: set[str] | None = None) -> None:
    """The snapshot as it was, a new top on it of initial-size, nothing else
    but the LVs ``also``."""
    lvs = bed.lvs()
    assert set(lvs) == {SNAP, VOLNAME} | (also or set())
    assert lvs[SNAP] == before[SNAP]
    top = lvs[VOLNAME]
    assert "written" not in top
    assert (top["backing"], top["virtual-size"], top["size"]) == (SNAP, DISK, INITIAL_SIZE)
    assert top["tags"] == before[VOLNAME]["tags"]


def test_capacity_refusal_leaves_the_volume_as_it_was(bed: Bed) -> None:
    """A rollback refused for room: the VG had 1.6 GiB free once the top was
    removed, below thin-critical-free with a new 1 GiB top, and the volume
    was left without a current LV."""
    before = snapshotted_disk(bed, "thin1")
    used = sum(lv["size"] for lv in before.values())
    free = 600 * MiB  # + the 1 GiB top: 1.6 GiB, still refused for a 1 GiB top
    before["thick-other"] = {"size": VG_SIZE - used - free, "tags": []}
    bed.set_lvs(before)

    error = rollback(bed, "thin1")
    assert "refusing a new thin volume" in error and CRITICAL_FREE in error
    assert bed.lvs() == before
    assert changes(bed) == []

    # Room is freed; the same rollback is tried again and succeeds.
    del before["thick-other"]
    bed.set_lvs(before)
    bed.clear_log()
    assert rollback(bed, "thin1") == ""
    assert_rolled_back(bed, before)
    assert [c[0] for c in changes(bed)] == [
        "/sbin/lvrename", "/sbin/lvcreate", "/usr/bin/qemu-img", "/sbin/lvremove"]
    assert changes(bed)[0] == ["/sbin/lvrename", VG, VOLNAME, REPLACED]
    assert changes(bed)[-1] == ["/sbin/lvremove", "-f", f"{VG}/{REPLACED}"]


def grown_top(before: dict[str, Any], free: int) -> dict[str, Any]:
    """The VG of ``before`` with its top grown to 3 GiB (the daemon grew it as
    the guest wrote) and another storage's LV leaving ``free``."""
    lvs = {**before, VOLNAME: {**before[VOLNAME], "size": 3 * GiB}}
    used = sum(lv["size"] for lv in lvs.values())
    lvs["thick-other"] = {"size": VG_SIZE - used - free, "tags": []}
    return lvs


def test_a_rollback_discarding_a_grown_top_is_judged_without_it(bed: Bed) -> None:
    """1.5 GiB free, below thin-critical-free (1 GiB) with a new 1 GiB top;
    but the rollback gives the 3 GiB top back: the guards judge the VG as the
    rollback leaves it, as when the old top was removed first."""
    before = grown_top(snapshotted_disk(bed, "thin1"), 1536 * MiB)
    bed.set_lvs(before)
    assert rollback(bed, "thin1") == ""
    assert_rolled_back(bed, {k: v for k, v in before.items() if k != "thick-other"},
                       also={"thick-other"})


def test_a_vg_that_cannot_hold_both_tops_refuses_the_rollback_unchanged(bed: Bed) -> None:
    """The guards allow it (3.5 GiB once the top is gone), but for a moment
    both tops exist: LVM refuses the new one, and the old one is put back."""
    before = grown_top(snapshotted_disk(bed, "thin1"), 512 * MiB)
    bed.set_lvs(before)
    error = rollback(bed, "thin1")
    assert "insufficient free space" in error
    assert bed.lvs() == before


@pytest.mark.parametrize("fault", [
    # LVM refuses the new top (another node took the room meanwhile).
    {"PVESTORD_TEST_LVM_FAIL": json.dumps(["/sbin/lvcreate"])},
    # The image cannot be written onto it.
    {"PVESTORD_TEST_LVM_FAIL": json.dumps(["/usr/bin/qemu-img", "create"])},
    # pvestord itself fails.
    {"PVESTORD_TEST_COMMAND": "/bin/false"},
], ids=["lvcreate", "qemu-img-create", "pvestord"])
def test_failure_in_the_middle_leaves_the_volume_as_it_was(bed: Bed,
                                                           fault: dict[str, str]) -> None:
    before = snapshotted_disk(bed, "thin1")
    error = rollback(bed, "thin1", **fault)
    assert error != ""
    assert bed.lvs() == before

    bed.clear_log()
    assert rollback(bed, "thin1") == ""
    assert_rolled_back(bed, before)


def test_saferemove_zeroes_the_old_top_outside_the_storage_lock(bed: Bed) -> None:
    """Proxmox's ``lvm`` type renames a removed LV to ``del-...`` under the
    lock and zeroes it in a worker; so must a rollback's old top be."""
    before = snapshotted_disk(bed, "safe1")
    found = bed.run(
        'my $handed = 0;'
        'no warnings "redefine";'
        # The worker runs at once, here (fork_worker writes task logs below /var/log/pve);
        # what it prints goes to stderr, stdout is this test's answer.
        'local *PVE::RPCEnvironment::fork_worker = sub {'
        '  my ($self, $type, $id, $user, $worker) = @_;'
        '  $handed++; my $out = select(STDERR); $worker->(); select($out); return "UPID:t"; };'
        f'eval {{ PVE::Storage::volume_snapshot_rollback($cfg, "safe1:{VOLNAME}", "snap1") }};'
        'print encode_json({error => "$@", handed => $handed});')
    ran = bed.commands_and_locks()
    deleted = f"del-{REPLACED}"
    zeroing = [(c, locks) for c, locks in ran if c[0].endswith("blkdiscard")]
    zeroed = [(next(a for a in c if a.startswith("/dev/")), locks) for c, locks in zeroing]
    assert zeroed == [(f"/dev/{VG}/{deleted}", [])]
    assert found == {"error": "", "handed": 1}
    assert_rolled_back(bed, before)
    # Every change of the VG under the storage lock: the old top set aside,
    # the new one made, the old renamed for the worker, and the worker's removal.
    # thin1 is on the same VG: its lock is held too (tests/proxmox/test_vg_locks.py).
    both = ["storage-safe1", "storage-thin1"]
    assert [(c, locks) for c, locks in ran if c[0] in CHANGES] == [
        (["/sbin/lvrename", VG, VOLNAME, REPLACED], both),
        (["/sbin/lvcreate", *next(c for c, _ in ran if c[0] == "/sbin/lvcreate")[1:]], both),
        (["/sbin/lvrename", VG, REPLACED, deleted], both),
        (["/sbin/lvremove", "-f", f"{VG}/{deleted}"], both),
    ]
