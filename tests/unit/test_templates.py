"""Templates and linked clones: the names and the parent tag (pure). The
plugin's answers for ``qm template`` (op ``base``) and a linked clone
(``alloc`` with a ``parent``) are tested with its other ops (test_plugin.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pvestord.policy import templates
from pvestord.policy.lvnames import chain_vmid
from pvestord.policy.proxmox import is_lvm_name

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
