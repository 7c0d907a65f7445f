"""The volumes Proxmox allocates by a fixed name, through the real PVE::Storage.

qemu-server saves a snapshot's RAM (and a hibernation's) into
``vm-<vmid>-state-<snapshot>``, raw, on the VM's storage; vzdump puts a
backup's fleecing images ``vm-<vmid>-fleece-<n>`` on the fleecing storage, in
the format ``resolve_format_hint`` gives (qcow2 here), without an extension
on a storage without a path. Both must be allocated, listed, activated and
freed on a ``pvestord`` storage.

LVM and qemu-img are recording stand-ins (``PvestordTest/LvmRecorder.pm`` for
Proxmox's Perl, ``fake_lvm.py`` for pvestord's reports): what is checked is
the commands run, against those Proxmox's own ``lvm`` type runs for the same
request. Runs on any machine with the Proxmox sources and the Perl modules.
"""

from __future__ import annotations

import pytest

from pvestord.policy.capacity import maximum_from_tags, maximum_tag
from pvestord.policy.sizes import GiB, KiB, align_up
from tests.proxmox.recorded import (
    SHARED_EXTENT,
    SHARED_INITIAL_SIZE,
    SHARED_VG,
    THIN_AND_THICK_CFG,
    Bed,
    empty_vg_fixture,
    lvcreates,
    storage_cfg_fixture,
)

VG = SHARED_VG
EXTENT = SHARED_EXTENT
INITIAL_SIZE = SHARED_INITIAL_SIZE
#: What qemu-server asks for a VM with 4 GiB of RAM: twice the RAM plus
#: 500 MiB, in KiB (QemuConfig.pm __snapshot_save_vmstate).
VMSTATE_KIB = (4096 * 2 + 500) * 1024
#: A disk's size as QEMU reports it (block-node-size), not a whole KiB:
#: vzdump passes it to vdisk_alloc divided by 1024 for a qcow2 image.
FLEECE_BYTES = 10 * GiB + 512


proxmox = storage_cfg_fixture(THIN_AND_THICK_CFG)
bed = empty_vg_fixture()


def without_size(command: list[str]) -> list[str]:
    at = command.index("--size")
    return command[:at] + command[at + 2:]


def test_vmstate_is_a_raw_lv_as_proxmox_makes_it(bed: Bed) -> None:
    # Proxmox's own lvm type, for the same request: the reference.
    thick = bed.try_alloc("thick1", 100, "raw", "vm-100-state-snap1", VMSTATE_KIB)
    assert thick == {"volid": "thick1:vm-100-state-snap1", "error": ""}
    reference = bed.lvs()["vm-100-state-snap1"]
    [reference_command] = lvcreates(bed.commands())
    bed.reset()

    made = bed.try_alloc("thin1", 100, "raw", "vm-100-state-snap1", VMSTATE_KIB)
    assert made == {"volid": "thin1:vm-100-state-snap1", "error": ""}
    [command] = lvcreates(bed.commands())
    # The same lvcreate (name, tags, activation flags), the same size in extents,
    # and the maximum every node's capacity figures read: the LV's size.
    recorded = ["--addtag", maximum_tag(reference["size"])]
    assert without_size(command) == [*without_size(reference_command)[:-1], *recorded,
                                     reference_command[-1]]
    assert bed.lvs()["vm-100-state-snap1"] == {
        **reference, "tags": [*reference["tags"], maximum_tag(reference["size"])]}
    assert reference["size"] == align_up(VMSTATE_KIB * KiB, EXTENT)
    assert reference["tags"] == ["pve-vm-100"]
    # A raw stream: no image is written onto it.
    assert not [c for c in bed.commands() if c[0] == "/usr/bin/qemu-img"]

    # qemu-server lists it, activates it and asks its path (savevm-start, rollback's start).
    found = bed.run(
        'my $volid = "thin1:vm-100-state-snap1";'
        'PVE::Storage::activate_volumes($cfg, [$volid]);'
        'my $list = PVE::Storage::vdisk_list($cfg, "thin1", 100);'
        'print encode_json({path => scalar(PVE::Storage::path($cfg, $volid)),'
        ' list => $list->{thin1}});')
    assert found["path"] == f"/dev/{VG}/vm-100-state-snap1"
    [listed] = [v for v in found["list"] if v["volid"] == "thin1:vm-100-state-snap1"]
    assert (listed["format"], listed["size"]) == ("raw", reference["size"])
    assert ["/sbin/lvchange", "-aey", f"/dev/{VG}/vm-100-state-snap1"] in bed.commands()

    # Snapshot delete (and a hibernated VM's resume) frees it.
    freed = bed.run('PVE::Storage::vdisk_free($cfg, "thin1:vm-100-state-snap1");'
                    'print encode_json({});')
    assert freed == {}
    assert bed.lvs() == {}
    assert bed.commands()[-1] == ["/sbin/lvremove", "-f", f"{VG}/vm-100-state-snap1"]


def test_hibernation_state_is_allocated_too(bed: Bed) -> None:
    made = bed.try_alloc("thin1", 100, "raw", "vm-100-state-suspend-2026-12-06", 1024)
    assert made == {"volid": "thin1:vm-100-state-suspend-2026-12-06", "error": ""}


def test_fleecing_image_is_a_thin_qcow2_named_with_its_suffix(bed: Bed) -> None:
    made = bed.try_alloc("thin1", 100, "qcow2", "vm-100-fleece-0", FLEECE_BYTES / 1024)
    assert made == {"volid": "thin1:vm-100-fleece-0.qcow2", "error": ""}
    lv = bed.lvs()["vm-100-fleece-0.qcow2"]
    assert lv["size"] == INITIAL_SIZE
    assert lv["tags"][:2] == ["pve-vm-100", "@pve-vm-100-fleece-0.qcow2"]
    assert maximum_from_tags(lv["tags"]) is not None and len(lv["tags"]) == 3
    [create] = [c for c in bed.commands() if c[:2] == ["/usr/bin/qemu-img", "create"]]
    assert create[-2] == f"/dev/{VG}/vm-100-fleece-0.qcow2"
    assert "preallocation=off" in create and "qcow2" in create
    # The exact size QEMU gave (vzdump attaches a qcow2 without a size).
    assert lv["virtual-size"] == FLEECE_BYTES

    found = bed.run(
        'my $volid = "thin1:vm-100-fleece-0.qcow2";'
        'PVE::Storage::activate_volumes($cfg, [$volid]);'
        'my $list = PVE::Storage::vdisk_list($cfg, "thin1", 100);'
        'print encode_json({list => $list->{thin1}});')
    [listed] = [v for v in found["list"] if v["volid"] == "thin1:vm-100-fleece-0.qcow2"]
    assert listed["format"] == "qcow2"

    # vzdump's cleanup frees it.
    bed.run('PVE::Storage::vdisk_free($cfg, "thin1:vm-100-fleece-0.qcow2"); print "{}";')
    assert bed.lvs() == {}
    assert bed.commands()[-1] == ["/sbin/lvremove", "-f", f"{VG}/vm-100-fleece-0.qcow2"]


@pytest.mark.parametrize(("vmid", "fmt", "name"), [
    (100, "raw", "vm-100-disk-0"),          # a raw disk: not offered
    (100, "raw", ""),                       # the next free name would be a raw disk
    (100, "raw", "vm-101-state-snap1"),     # another VM's
    (100, "raw", "vm-100-state-x"),         # not a snapshot name Proxmox makes
    (100, "raw", "vm-100-state-../../x"),
    (100, "raw", "vm-100-state-snap1 --addtag evil"),
    (100, "qcow2", "vm-100-state-snap1"),   # a state is raw
    (100, "qcow2", "vm-100-disk-1"),        # a disk without its suffix
    (100, "qcow2", "vm-100-fleece-0;x"),
    (100, "vmdk", "vm-100-disk-0.vmdk"),
])
def test_other_names_and_formats_are_refused(bed: Bed, vmid: int, fmt: str, name: str) -> None:
    found = bed.try_alloc("thin1", vmid, fmt, name, 1024)
    assert found["volid"] == ""
    assert "pvestord plugin alloc: " in found["error"]
    assert lvcreates(bed.commands()) == []
    assert bed.lvs() == {}
