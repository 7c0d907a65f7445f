"""What an admin does by hand on a ``pvestord`` storage, through the real PVE::Storage.

``pvesm alloc STORAGE VMID NAME SIZE`` runs the API's ``Content->create``,
which takes the format from the name's suffix and otherwise asks for the
storage's default (qcow2): a name typed without ``.qcow2`` must be refused
saying which name to give.

The bed (LVM and qemu-img recording stand-ins, the storage.cfg with ``thin1``
and the same VG as Proxmox's ``lvm`` type ``thick1``) is
``test_state_and_fleece_volumes``'s, shared rather than copied.
"""

from __future__ import annotations

from tests.proxmox import test_state_and_fleece_volumes as beds
from tests.proxmox.test_state_and_fleece_volumes import Bed, lvcreates

# That module's fixtures, taken into this module (pytest finds a test's
# fixtures in its own module, its conftest files and plugins).
proxmox = beds.proxmox
bed = beds.bed


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
