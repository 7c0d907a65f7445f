"""Templates and linked clones on a ``pvestord`` storage, through the real PVE::Storage
(issue 37 item 5).

qemu-server's ``template_create`` calls ``vdisk_create_base`` for each disk
whose storage offers the ``template`` feature, and a linked ``qm clone``
calls ``vdisk_clone`` from ``clone_disk`` (among the copy flows, yet a
linked clone must be thin). ``vdisk_free`` refuses a base while
``list_images`` names a clone of it (``volume_is_base_and_used``); the
plugin's ``free_image`` checks the clones' parent tags under the same lock.

LVM and qemu-img are the recording stand-ins of :mod:`tests.proxmox.recorded`
(the VG is a JSON file: renames, tags, activation of named LVs and their
permission are kept). Runs on any machine with the Proxmox sources and the
Perl modules.
"""

from __future__ import annotations

import json
from typing import Any

from pvestord.policy.capacity import COPY_TAG, maximum_from_tags, maximum_tag
from pvestord.policy.templates import parent_tag
from tests.proxmox.recorded import (
    SHARED_INITIAL_SIZE,
    SHARED_VG,
    THIN_AND_THICK_CFG,
    Bed,
    empty_vg_fixture,
    lvcreates,
    storage_cfg_fixture,
)

VG = SHARED_VG
INITIAL = SHARED_INITIAL_SIZE
DISK_KIB = 4 * 1024 * 1024
BASE = "base-100-disk-0.qcow2"
CLONE = f"{BASE}/vm-101-disk-0.qcow2"
#: qemu-server's subs, so that the plugin sees the callers it sees in a real
#: clone: vdisk_clone and vdisk_alloc from clone_disk, vdisk_create_base from
#: template_create.
QEMU_SERVER = """
package PVE::QemuServer;
sub clone_disk { my ($f, @a) = @_; return $f->(@a) }
sub template_create { my ($cfg, $volid) = @_; return PVE::Storage::vdisk_create_base($cfg, $volid) }
package main;
"""


proxmox = storage_cfg_fixture(THIN_AND_THICK_CFG)
bed = empty_vg_fixture()


def run(bed: Bed, code: str, **extra: str) -> Any:
    """``code`` with qemu-server's subs and the bases' lock in the bed; prints JSON.
    ``extra``: more environment (a fault to inject)."""
    lock_dir = bed.state.parent
    return bed.run(f"{QEMU_SERVER} $PVE::Storage::Custom::PvestordPlugin::BASES_LOCK_DIR ="
                   f" '{lock_dir}'; {code}", **extra)


def attempt(bed: Bed, expression: str, **extra: str) -> dict[str, Any]:
    """``expression``'s value, or its error."""
    return run(bed, f"my $r = eval {{ {expression} }};"  # type: ignore[no-any-return]
                    ' print encode_json({result => $r, error => "$@"});', **extra)


def template(bed: Bed) -> None:
    """A 4 GiB disk of VM 100, made a template as ``qm template`` does."""
    assert attempt(bed, "PVE::Storage::vdisk_alloc($cfg, 'thin1', 100, 'qcow2', '',"
                        f" {DISK_KIB})") == {"result": "thin1:vm-100-disk-0.qcow2", "error": ""}
    made = attempt(bed, "PVE::QemuServer::template_create($cfg, 'thin1:vm-100-disk-0.qcow2')")
    assert made == {"result": f"thin1:{BASE}", "error": ""}


def linked_clone(bed: Bed, vmid: int, base: str = BASE) -> str:
    """A linked clone of ``base`` for ``vmid``, as ``qm clone`` makes it."""
    made = attempt(bed, "PVE::QemuServer::clone_disk(\\&PVE::Storage::vdisk_clone, $cfg,"
                        f" 'thin1:{base}', {vmid})")
    assert made["error"] == ""
    return str(made["result"])


def test_a_template_renames_the_disk_to_a_read_only_base(bed: Bed) -> None:
    assert attempt(bed, "PVE::Storage::vdisk_alloc($cfg, 'thin1', 100, 'qcow2', '',"
                        f" {DISK_KIB})")["error"] == ""
    assert run(bed, "print encode_json([PVE::Storage::volume_has_feature($cfg, 'template',"
                    " 'thin1:vm-100-disk-0.qcow2')]);") == [1]
    disk = bed.lvs()["vm-100-disk-0.qcow2"]
    bed.clear_log()
    made = attempt(bed, "PVE::QemuServer::template_create($cfg, 'thin1:vm-100-disk-0.qcow2')")
    assert made == {"result": f"thin1:{BASE}", "error": ""}
    lvs = bed.lvs()
    assert "vm-100-disk-0.qcow2" not in lvs
    base = lvs[BASE]
    assert base["permission"] == "r"
    assert base["size"] == disk["size"] == INITIAL
    # Its maximum is what it holds: it never grows again.
    assert maximum_from_tags(base["tags"]) == INITIAL
    assert sorted(base["tags"]) == sorted(["pve-vm-100", f"pve-{BASE}", maximum_tag(INITIAL)])
    changes = [c for c in bed.commands() if c[0] in ("/sbin/lvrename", "/sbin/lvchange")]
    assert changes[0] == ["/sbin/lvrename", VG, "vm-100-disk-0.qcow2", BASE]
    assert changes[-1] == ["/sbin/lvchange", "--permission", "r", f"{VG}/{BASE}"]
    # A base is no disk: no template of it again, no snapshot, no rename.
    features = run(bed, "print encode_json([map { PVE::Storage::volume_has_feature($cfg, $_,"
                        f" 'thin1:{BASE}') }} qw(template snapshot rename clone copy)]);")
    assert features == [None, None, None, 1, 1]


def test_a_template_that_fails_half_way_leaves_the_disk_as_it_was(bed: Bed) -> None:
    assert attempt(bed, "PVE::Storage::vdisk_alloc($cfg, 'thin1', 100, 'qcow2', '',"
                        f" {DISK_KIB})")["error"] == ""
    before = bed.lvs()
    failed = attempt(bed, "PVE::QemuServer::template_create($cfg, 'thin1:vm-100-disk-0.qcow2')",
                     PVESTORD_TEST_LVM_FAIL=json.dumps(["/sbin/lvchange", "--permission", "r"]))
    assert "read-only" in failed["error"]
    after = bed.lvs()
    assert list(after) == ["vm-100-disk-0.qcow2"]
    # The tags are put back (LVM stores '@pve-<name>' without its '@').
    assert sorted(t.lstrip("@") for t in after["vm-100-disk-0.qcow2"]["tags"]) == sorted(
        t.lstrip("@") for t in before["vm-100-disk-0.qcow2"]["tags"])
    assert "permission" not in after["vm-100-disk-0.qcow2"]


def test_a_disk_with_snapshots_stays_a_disk(bed: Bed) -> None:
    assert attempt(bed, "PVE::Storage::vdisk_alloc($cfg, 'thin1', 100, 'qcow2', '',"
                        f" {DISK_KIB})")["error"] == ""
    assert attempt(bed, "PVE::Storage::volume_snapshot($cfg, 'thin1:vm-100-disk-0.qcow2',"
                        " 's1')")["error"] == ""
    before = bed.lvs()
    made = attempt(bed, "PVE::Storage::vdisk_create_base($cfg, 'thin1:vm-100-disk-0.qcow2')")
    assert "snap_vm-100-disk-0_s1.qcow2" in made["error"]
    assert bed.lvs() == before


def test_a_linked_clone_is_a_thin_overlay_on_the_base(bed: Bed) -> None:
    template(bed)
    bed.clear_log()
    assert linked_clone(bed, 101) == f"thin1:{CLONE}"
    [create] = lvcreates(bed.commands())
    assert create[create.index("--name") + 1] == "vm-101-disk-0.qcow2"
    clone = bed.lvs()["vm-101-disk-0.qcow2"]
    # Thin although clone_disk (a copy flow) asked: the storage's initial size.
    assert clone["size"] == INITIAL
    assert COPY_TAG not in clone["tags"]
    assert parent_tag(BASE) in clone["tags"]
    # Proxmox's tags (lvcreate is given the volume's as '@pve-<name>').
    assert {"pve-vm-101", "@pve-vm-101-disk-0.qcow2"} <= set(clone["tags"])
    assert clone["backing"] == BASE
    [image] = [c for c in bed.commands() if c[:2] == ["/usr/bin/qemu-img", "create"]]
    assert image[image.index("-b") + 1] == f"/dev/{VG}/{BASE}"
    assert "extended_l2=on,cluster_size=128k,preallocation=off" in image
    # The base was activated shared (read-only, as it is) to be the backing file.
    assert ["/sbin/lvchange", "-asy", f"{VG}/{BASE}"] in bed.commands()
    assert bed.lvs()[BASE]["size"] == INITIAL


def test_parse_volname_gives_the_base_of_a_clone(bed: Bed) -> None:
    parsed = run(bed, "print encode_json([map { [PVE::Storage::parse_volname($cfg, $_)] }"
                      f" 'thin1:{CLONE}', 'thin1:{BASE}', 'thin1:{BASE}/base-101-disk-0.qcow2',"
                      " 'thin1:vm-101-disk-0.qcow2']);")
    assert parsed == [
        ["images", "vm-101-disk-0.qcow2", "101", BASE, "100", None, "qcow2"],
        ["images", BASE, "100", None, None, 1, "qcow2"],
        ["images", "base-101-disk-0.qcow2", "101", BASE, "100", 1, "qcow2"],
        ["images", "vm-101-disk-0.qcow2", "101", None, None, None, "qcow2"]]
    paths = run(bed, "print encode_json([map { scalar(PVE::Storage::path($cfg, $_)) }"
                     f" 'thin1:{CLONE}', 'thin1:{BASE}']);")
    assert paths == [f"/dev/{VG}/vm-101-disk-0.qcow2", f"/dev/{VG}/{BASE}"]
    bad = attempt(bed, "[PVE::Storage::parse_volname($cfg, 'thin1:vm-100-disk-0.qcow2/"
                       "vm-101-disk-0.qcow2')]")
    assert bad["error"] != ""


def test_list_images_names_clones_by_their_base_and_reports_the_parent(bed: Bed) -> None:
    template(bed)
    linked_clone(bed, 101)
    listed = run(bed, "print encode_json(PVE::Storage::vdisk_list($cfg, 'thin1')->{thin1});")
    by_volid = {entry["volid"]: entry for entry in listed}
    assert set(by_volid) == {f"thin1:{BASE}", f"thin1:{CLONE}"}
    assert by_volid[f"thin1:{CLONE}"]["parent"] == f"thin1:{BASE}"
    assert by_volid[f"thin1:{CLONE}"]["vmid"] == "101"
    assert "parent" not in by_volid[f"thin1:{BASE}"]
    assert by_volid[f"thin1:{BASE}"]["vmid"] == "100"
    only = run(bed, "print encode_json(PVE::Storage::vdisk_list($cfg, 'thin1', 101)->{thin1});")
    assert [entry["volid"] for entry in only] == [f"thin1:{CLONE}"]
    asked = run(bed, f"print encode_json(PVE::Storage::vdisk_list($cfg, undef, undef,"
                     f" ['thin1:{CLONE}'])->{{thin1}});")
    assert [entry["volid"] for entry in asked] == [f"thin1:{CLONE}"]


def test_a_clones_chain_ends_above_its_base(bed: Bed) -> None:
    """qemu-server builds a drive's backing chain from volume_snapshot_info:
    'current' alone, without a parent, so QEMU opens the base from the
    image's header."""
    template(bed)
    linked_clone(bed, 101)
    info = run(bed, "print encode_json(PVE::Storage::volume_snapshot_info($cfg,"
                    f" 'thin1:{CLONE}'));")
    assert set(info) == {"current"}
    assert "parent" not in info["current"]
    assert info["current"]["file"] == f"/dev/{VG}/vm-101-disk-0.qcow2"


def test_a_used_base_is_not_freed(bed: Bed) -> None:
    template(bed)
    linked_clone(bed, 101)
    before = bed.lvs()
    refused = attempt(bed, f"PVE::Storage::vdisk_free($cfg, 'thin1:{BASE}')")
    assert "still in use by linked clones" in refused["error"]
    assert bed.lvs() == before
    # The plugin's own check reads the tags: a clone Proxmox does not list
    # under the base's name (made elsewhere, listed by another node's version).
    own = attempt(bed, "my $scfg = $cfg->{ids}->{thin1}; PVE::Storage::Custom::PvestordPlugin"
                       f"->free_image('thin1', $scfg, '{BASE}', 1, 'qcow2')")
    assert own["error"] == (f"base volume '{BASE}' is still in use by linked clones"
                            " (vm-101-disk-0.qcow2)\n")
    assert bed.lvs() == before


def test_a_base_is_freed_once_its_clones_are_gone(bed: Bed) -> None:
    template(bed)
    linked_clone(bed, 101)
    linked_clone(bed, 102)
    assert attempt(bed, f"PVE::Storage::vdisk_free($cfg, 'thin1:{CLONE}')")["error"] == ""
    assert "vm-101-disk-0.qcow2" not in bed.lvs()
    assert "still in use" in attempt(bed, f"PVE::Storage::vdisk_free($cfg, 'thin1:{BASE}')")[
        "error"]
    assert attempt(bed, f"PVE::Storage::vdisk_free($cfg, 'thin1:{BASE}/vm-102-disk-0.qcow2')"
                   )["error"] == ""
    assert attempt(bed, f"PVE::Storage::vdisk_free($cfg, 'thin1:{BASE}')")["error"] == ""
    assert bed.lvs() == {}


def test_activating_a_clone_activates_its_base_and_the_last_one_releases_it(bed: Bed) -> None:
    template(bed)
    linked_clone(bed, 101)
    linked_clone(bed, 102)
    lvs = bed.lvs()
    for lv in lvs.values():
        lv["active"] = False
    bed.set_lvs(lvs)
    other = f"thin1:{BASE}/vm-102-disk-0.qcow2"
    for volid in (f"thin1:{CLONE}", other):
        run(bed, f"PVE::Storage::activate_volumes($cfg, ['{volid}']); print 1;")
        # The clone's own chain is activated by LVMPlugin's selection: marked here.
        lvs = bed.lvs()
        lvs[volid.split("/")[-1]]["active"] = True
        bed.set_lvs(lvs)
    assert bed.lvs()[BASE]["active"] is True
    bed.clear_log()

    def deactivate(volid: str) -> None:
        # LVMPlugin deactivates the clone's own chain by a selection (and only
        # with its device there): marked here.
        lvs = bed.lvs()
        lvs[volid.split("/")[-1]]["active"] = False
        bed.set_lvs(lvs)
        run(bed, f"PVE::Storage::deactivate_volumes($cfg, ['{volid}']); print 1;")

    deactivate(f"thin1:{CLONE}")
    # The other clone is active here: the base stays.
    assert bed.lvs()[BASE]["active"] is True
    assert ["/sbin/lvchange", "-aln", f"{VG}/{BASE}"] not in bed.commands()
    deactivate(other)
    assert ["/sbin/lvchange", "-aln", f"{VG}/{BASE}"] in bed.commands()
    assert bed.lvs()[BASE]["active"] is False


def test_a_full_clone_of_a_template_is_a_copy_target(bed: Bed) -> None:
    """qemu-server's full clone: vdisk_alloc from clone_disk at the base's
    size, then the base activated as the copy's source."""
    template(bed)
    assert run(bed, "print encode_json([PVE::Storage::volume_has_feature($cfg, 'copy',"
                    f" 'thin1:{BASE}')]);") == [1]
    size = run(bed, "print encode_json([scalar(PVE::Storage::volume_size_info($cfg,"
                    f" 'thin1:{BASE}'))]);")
    assert size == [DISK_KIB * 1024]
    made = attempt(bed, "PVE::QemuServer::clone_disk(\\&PVE::Storage::vdisk_alloc, $cfg,"
                        f" 'thin1', 101, 'qcow2', undef, {DISK_KIB})")
    assert made == {"result": "thin1:vm-101-disk-0.qcow2", "error": ""}
    copy = bed.lvs()["vm-101-disk-0.qcow2"]
    assert COPY_TAG in copy["tags"]
    assert copy["size"] > INITIAL
    assert not any(t.startswith("pvestord-parent-") for t in copy["tags"])
    bed.clear_log()
    run(bed, f"PVE::Storage::activate_volumes($cfg, ['thin1:{BASE}']); print 1;")
    assert ["/sbin/lvchange", "-asy", f"{VG}/{BASE}"] in bed.commands()


def test_a_template_of_a_linked_clone_keeps_its_base(bed: Bed) -> None:
    template(bed)
    linked_clone(bed, 101)
    made = attempt(bed, f"PVE::Storage::vdisk_create_base($cfg, 'thin1:{CLONE}')")
    assert made == {"result": f"thin1:{BASE}/base-101-disk-0.qcow2", "error": ""}
    assert parent_tag(BASE) in bed.lvs()["base-101-disk-0.qcow2"]["tags"]
    assert "still in use" in attempt(bed, f"PVE::Storage::vdisk_free($cfg, 'thin1:{BASE}')")[
        "error"]
    chained = linked_clone(bed, 102, f"{BASE}/base-101-disk-0.qcow2")
    assert chained == "thin1:base-101-disk-0.qcow2/vm-102-disk-0.qcow2"
    # Both bases below the new clone are activated for it.
    bed.clear_log()
    run(bed, f"PVE::Storage::activate_volumes($cfg, ['{chained}']); print 1;")
    assert ["/sbin/lvchange", "-asy", f"{VG}/base-101-disk-0.qcow2", f"{VG}/{BASE}"] \
        in bed.commands()

