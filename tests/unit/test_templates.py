"""Templates and linked clones: the names and the parent tag (pure), and the
plugin's answers for ``qm template`` (op ``base``) and a linked clone (``alloc``
with a ``parent``) over the fake LVM and qemu-img of :mod:`tests.unit.test_plugin`."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pvestord.adapters import lvm
from pvestord.features import plugin
from pvestord.policy import templates
from pvestord.policy.capacity import COPY_TAG, maximum_tag
from pvestord.policy.lvnames import chain_vmid
from pvestord.policy.proxmox import is_lvm_name
from pvestord.policy.sizes import GiB
from tests.unit.test_plugin import SOURCE, FakeWorld, _answer, _request, world

__all__ = ["world"]  # the fixture, shared with test_plugin

#: What Proxmox's LVM names allow after ``vm-<vmid>-`` (parse_lvm_name).
_REST = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789_.-", min_size=0, max_size=30)
_VMIDS = st.integers(min_value=100, max_value=999_999_999)


@given(_VMIDS, _REST)
def test_a_disk_as_a_base_keeps_its_vmid_and_its_name(vmid: int, rest: str) -> None:
    lv = f"vm-{vmid}-{rest}.qcow2"
    base = templates.base_name(lv)
    assert base == f"base-{vmid}-{rest}.qcow2"
    assert templates.is_base(base) and not templates.is_base(lv)
    # The daemon never takes a base for a disk of its VM (a chain LV it grows).
    assert chain_vmid(base) is None
    assert templates.parent_tag(base) == f"pvestord-parent-{base}"


@given(st.text(max_size=40))
def test_only_qcow2_disks_become_bases(name: str) -> None:
    try:
        base = templates.base_name(name)
    except templates.TemplateError:
        return
    assert name.startswith("vm-") and name.endswith(".qcow2")
    assert templates.is_base(base) and is_lvm_name(base)


@pytest.mark.parametrize("name", [
    "vm-100-disk-0", "base-100-disk-0.qcow2", "snap_vm-100-disk-0_s1.qcow2",
    "vm-100-state-s1", f"vm-100-{'x' * 120}.qcow2"])
def test_what_does_not_become_a_base(name: str) -> None:
    with pytest.raises(templates.TemplateError):
        templates.base_name(name)


@pytest.mark.parametrize("name", ["vm-100-disk-0.qcow2", "base-100-disk-0", "base-x-1.qcow2",
                                  "base-100-disk/0.qcow2", ""])
def test_a_parent_tag_names_a_base_only(name: str) -> None:
    with pytest.raises(templates.TemplateError):
        templates.parent_tag(name)


def test_the_plugin_reads_the_parent_tag_by_its_one_prefix() -> None:
    perl = (Path(__file__).resolve().parents[2] / "packaging" / "perl" / "PVE" / "Storage"
            / "Custom" / "PvestordPlugin.pm").read_text()
    assert f"my $PARENT_TAG = '{templates.PARENT_TAG_PREFIX}';" in perl


BASE = "base-100-disk-0.qcow2"
CLONE = {"vmid": 101, "format": "qcow2", "name": "vm-101-disk-1.qcow2"}
CLONE_DISK = ["PVE::Storage::Plugin::clone_image", "PVE::Storage::vdisk_clone",
              "PVE::QemuServer::clone_disk"]


def test_a_linked_clone_is_thin_and_tagged_with_its_base(world: FakeWorld) -> None:
    answer = _answer(_request(op="alloc", virtual_size=4 * GiB, backing=True, parent=BASE,
                              callers=CLONE_DISK, lock_seconds_left=60, **CLONE))
    # clone_disk is a copy flow, yet nothing is copied into a linked clone.
    assert answer["kind"] == "thin"
    assert answer["lv_size"] == 1 * GiB
    assert answer["tags"] == ["pve-vm-101", "@pve-vm-101-disk-1.qcow2", maximum_tag(5 * GiB),
                              templates.parent_tag(BASE)]
    assert COPY_TAG not in answer["tags"]


@pytest.mark.parametrize(("body", "error"), [
    ({"backing": False, "parent": BASE}, plugin.PluginRequestError),
    ({"backing": True, "parent": "vm-100-disk-0.qcow2"}, templates.TemplateError),
    ({"backing": True, "parent": "base-100-disk-0.qcow2/x"}, lvm.LvmError),
])
def test_a_linked_clone_is_an_overlay_on_a_base(world: FakeWorld, body: dict[str, object],
                                                  error: type[Exception]) -> None:
    with pytest.raises(error):
        _answer(_request(op="alloc", virtual_size=4 * GiB, lock_seconds_left=60,
                         **body, **CLONE))


def test_a_base_is_renamed_and_records_its_size_as_its_maximum(world: FakeWorld) -> None:
    lv = "vm-101-disk-0.qcow2"
    world.tags = {lv: ("pve-vm-101", "@pve-vm-101-disk-0.qcow2", maximum_tag(5 * GiB),
                       COPY_TAG)}
    answer = _answer(_request(op="base", lv=lv, lock_seconds_left=60))
    assert answer == {
        "name": "base-101-disk-0.qcow2",
        "deltags": sorted(["@pve-vm-101-disk-0.qcow2", maximum_tag(5 * GiB), COPY_TAG]),
        "addtags": [maximum_tag(2 * GiB), "pve-base-101-disk-0.qcow2"]}


def test_a_disk_with_snapshot_lvs_is_no_base(world: FakeWorld) -> None:
    # The world holds snap_vm-100-disk-0_s1.qcow2, a snapshot of SOURCE.
    with pytest.raises(templates.TemplateError, match=r"snap_vm-100-disk-0_s1\.qcow2"):
        _answer(_request(op="base", lv=SOURCE, lock_seconds_left=60))
    with pytest.raises(templates.TemplateError):
        _answer(_request(op="base", lv="vm-100-state-s1", lock_seconds_left=60))
