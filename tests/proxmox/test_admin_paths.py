"""What an admin does by hand on a ``pvestord`` storage, through the real PVE::Storage.

``pvesm alloc STORAGE VMID NAME SIZE`` runs the API's ``Content->create``,
which takes the format from the name's suffix and otherwise asks for the
storage's default (qcow2): a name typed without ``.qcow2`` must be refused
saying which name to give. A storage converted from ``lvm:`` keeps the raw
disks it held, which must still be resized as Proxmox's ``lvm`` type resizes
them. ``pvesm add`` without ``snapshot-as-volume-chain`` (the API cannot
require it) gets the only value the type has.

The bed (LVM and qemu-img recording stand-ins, the storage.cfg with ``thin1``
and the same VG as Proxmox's ``lvm`` type ``thick1``) is ``recorded``'s
``empty_vg_fixture``.
"""

from __future__ import annotations

import json

import pytest

from pvestord.policy.sizes import GiB
from tests.proxmox.recorded import (
    SHARED_VG as VG,
)
from tests.proxmox.recorded import (
    THIN_AND_THICK_CFG,
    Bed,
    empty_vg_fixture,
    lvcreates,
    storage_cfg_fixture,
)

proxmox = storage_cfg_fixture(THIN_AND_THICK_CFG)
bed = empty_vg_fixture()


def pvesm_alloc(bed: Bed, storeid: str, vmid: int, name: str, size: str) -> dict[str, str]:
    """``pvesm alloc`` as the CLI runs it: the API method with its own parameter check."""
    return bed.run(  # type: ignore[no-any-return]
        'require PVE::API2::Storage::Content;'
        'my $volid = eval { PVE::API2::Storage::Content->create({node => "localhost",'
        f' storage => "{storeid}", vmid => {vmid}, filename => "{name}", size => "{size}"}}) }};'
        'print encode_json({volid => $volid // "", error => "$@"});')


def test_pvesm_alloc_without_the_suffix_says_which_name_to_give(bed: Bed) -> None:
    refused = pvesm_alloc(bed, "thin1", 100, "vm-100-disk-1", "32G")
    assert refused["volid"] == ""
    assert ("not 'vm-100-disk-1' (did you mean 'vm-100-disk-1.qcow2'?"
            " An empty name ('') lets Proxmox choose one)") in refused["error"]
    assert bed.lvs() == {}

    # Either advice, followed, allocates the disk.
    assert pvesm_alloc(bed, "thin1", 100, "vm-100-disk-1.qcow2", "32G") == {
        "volid": "thin1:vm-100-disk-1.qcow2", "error": ""}
    assert pvesm_alloc(bed, "thin1", 100, "", "32G") == {
        "volid": "thin1:vm-100-disk-0.qcow2", "error": ""}
    assert sorted(bed.lvs()) == ["vm-100-disk-0.qcow2", "vm-100-disk-1.qcow2"]


def test_pvesm_alloc_of_another_name_offers_the_empty_name(bed: Bed) -> None:
    refused = pvesm_alloc(bed, "thin1", 100, "mydisk", "32G")
    assert "not 'mydisk' (an empty name ('') lets Proxmox choose one)" in refused["error"]
    assert lvcreates(bed.commands()) == []


def add_raw_disk(bed: Bed, name: str, size: int) -> None:
    """A raw LV as Proxmox's ``lvm`` type left it, before the storage was converted."""
    state = json.loads(bed.state.read_text())
    state["lvs"][name] = {"size": size, "tags": ["pve-vm-100"]}
    bed.state.write_text(json.dumps(state))


@pytest.mark.parametrize("running", [0, 1])
def test_raw_disk_of_a_converted_storage_is_resized_as_lvm_resizes_it(
        bed: Bed, running: int) -> None:
    # Proxmox's own lvm type, for the same request on the same VG: the reference.
    add_raw_disk(bed, "vm-100-disk-0", 10 * GiB)
    bed.run(f'PVE::Storage::volume_resize($cfg, "thick1:vm-100-disk-0", {12 * GiB}, {running});'
            'print "{}";')
    reference_lv, reference_commands = bed.lvs()["vm-100-disk-0"], bed.commands()
    bed.reset()

    add_raw_disk(bed, "vm-100-disk-0", 10 * GiB)
    found = bed.run(
        'my $done = eval { PVE::Storage::volume_resize($cfg, "thin1:vm-100-disk-0",'
        f' {12 * GiB}, {running}) }};'
        'print encode_json({done => $done, error => "$@"});')
    assert found == {"done": 1, "error": ""}
    # Thick, as before the conversion: the LV is extended to the new size, by the
    # same command, and no image is touched (a running VM's QEMU grows its view).
    assert bed.lvs()["vm-100-disk-0"] == reference_lv == {"size": 12 * GiB,
                                                          "tags": ["pve-vm-100"]}
    assert bed.commands() == reference_commands == [
        ["/sbin/lvextend", "-L", f"{12 * GiB // 1024}k", f"/dev/{VG}/vm-100-disk-0"]]


def pvesm_add(bed: Bed, storeid: str, options: str) -> dict[str, str]:
    """``pvesm add pvestord STOREID ...`` as the CLI runs it; storage.cfg as written."""
    return bed.run(  # type: ignore[no-any-return]
        'require PVE::API2::Storage::Config; my $written = "";'
        # The write goes to pmxcfs's /etc/pve: kept here instead.
        'no warnings "redefine"; *PVE::Storage::cfs_write_file = sub {'
        ' $written = PVE::Storage::Plugin->write_config($_[0], $_[1]) };'
        'eval { PVE::API2::Storage::Config->create({type => "pvestord",'
        f' storage => "{storeid}", {options}}}) }};'
        'print encode_json({written => $written, error => "$@"});')


def test_pvesm_add_without_volume_chain_adds_it_with_one(bed: Bed) -> None:
    added = pvesm_add(bed, "new1", f'vgname => "{VG}", content => "images", shared => 1')
    assert added["error"] == ""
    section = added["written"].partition("pvestord: new1\n")[2].partition("\n\n")[0]
    assert "\tsnapshot-as-volume-chain 1" in section.splitlines()

    refused = pvesm_add(bed, "new2", f'vgname => "{VG}", "snapshot-as-volume-chain" => 0')
    assert refused == {"written": "", "error": (
        "create storage failed: storage 'new2': type 'pvestord' needs"
        " 'snapshot-as-volume-chain 1' (its disks are qcow2 volume chains)\n")}
