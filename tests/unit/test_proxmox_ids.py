"""Proxmox's identifiers (pvestord.policy.proxmox): the one rule each replaced
several copies of, so every name the copies accepted and LVM or Proxmox allows
is still accepted, and hostile names are refused."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pvestord.policy import proxmox

# The three VG-name rules before they were one (adapters/config.py,
# adapters/lvm.py with its length and dot checks, adapters/vghealth.py).


def old_config_rule(n: str) -> bool:
    return re.fullmatch(r"[a-zA-Z0-9.+_][a-zA-Z0-9.+_\-]*", n) is not None


def old_lvm_rule(n: str) -> bool:
    return (re.match(r"^[A-Za-z0-9+_.][A-Za-z0-9+_.-]*$", n) is not None
            and n not in (".", "..") and len(n) <= 127)


def old_vghealth_rule(n: str) -> bool:
    return re.fullmatch(r"(?!\.\.?$)[a-zA-Z0-9.+_][a-zA-Z0-9.+_-]{0,127}", n) is not None


OLD_VG_NAMES = (old_config_rule, old_lvm_rule, old_vghealth_rule)
LVM_ALPHABET = "abcxyzABCXYZ0189+_.-"
HOSTILE = ["", ".", "..", "/", "a/b", "../etc", "-vg", "vg\n", "\nvg", "vg name", "vg\0",
           "x" * 128, "vé"]


def lvm_allows(name: str) -> bool:
    """lvm(8) VALID NAMES, spelled out."""
    return (0 < len(name) <= 127 and not name.startswith("-") and name not in (".", "..")
            and all(c.isascii() and (c.isalnum() or c in "+_.-") for c in name))


@given(st.text(alphabet=LVM_ALPHABET + "/\n é", max_size=140))
def test_a_vg_name_is_what_lvm_allows(name: str) -> None:
    assert proxmox.is_vg_name(name) == lvm_allows(name)


@given(st.text(alphabet=LVM_ALPHABET + "/\n", max_size=140))
def test_every_valid_name_an_old_rule_accepted_is_still_accepted(name: str) -> None:
    if any(old(name) for old in OLD_VG_NAMES) and lvm_allows(name):
        assert proxmox.is_vg_name(name)


@pytest.mark.parametrize("name", HOSTILE)
def test_hostile_vg_names_are_refused(name: str) -> None:
    assert not proxmox.is_vg_name(name)
    assert not proxmox.is_lvm_name(name)


@pytest.mark.parametrize("name", ["pve", "vg0", "a", "_", "+x", "vg.thin", "a-b", "x" * 127,
                                  "...", ".a", "a.."])
def test_valid_vg_names_are_accepted(name: str) -> None:
    assert proxmox.is_vg_name(name)


@given(st.from_regex(r"[a-z][a-z0-9\-_.]*[a-z0-9]", fullmatch=True))
def test_storage_ids_as_proxmox_parses_them(storeid: str) -> None:
    assert proxmox.is_storage_id(storeid)
    assert proxmox.is_storage_id(storeid.upper())


@pytest.mark.parametrize("storeid", ["", "a", "1a", "-a", "a-", "a.", "a/b", "..", "a\n",
                                     "a b", ".a"])
def test_hostile_storage_ids_are_refused(storeid: str) -> None:
    assert not proxmox.is_storage_id(storeid)


@given(st.integers(min_value=proxmox.VMID_MIN, max_value=proxmox.VMID_MAX))
def test_vmids_in_range(vmid: int) -> None:
    assert proxmox.is_vmid(vmid)
    assert proxmox.vmid_from_text(str(vmid)) == vmid
    assert proxmox.pidfile_vmid(proxmox.pidfile_name(vmid)) == vmid


@pytest.mark.parametrize("vmid", [99, 0, -1, 1_000_000_000, True, "100", 100.0, None])
def test_what_is_not_a_vmid(vmid: object) -> None:
    assert not proxmox.is_vmid(vmid)


@pytest.mark.parametrize("text", ["", "0", "0100", "-1", "+1", "1 ", "1\n", "12345678901",
                                  "١٢٣", "1e3"])
def test_what_text_is_not_an_id(text: str) -> None:
    assert proxmox.vmid_from_text(text) is None
    assert proxmox.pidfile_vmid(f"{text}.pid") is None


@pytest.mark.parametrize("name", ["100.pid\n", "100.pid.tmp", "100.qmp", "x100.pid", "100"])
def test_what_is_not_a_pidfile(name: str) -> None:
    assert proxmox.pidfile_vmid(name) is None


@pytest.mark.parametrize(("lv", "vmid"), [
    ("vm-100-disk-0.qcow2", 100), ("vm-101-cloudinit.qcow2", 101), ("vm-7-x_y.z.qcow2", 7),
    ("vm-100-disk-0", None), ("snap_vm-100-disk-0_s1.qcow2", None), ("base-100-disk-0.qcow2", None),
    ("vm-100-a/b.qcow2", None), ("vm-100-disk-0.qcow2\n", None),
])
def test_qcow2_disk_names(lv: str, vmid: int | None) -> None:
    assert proxmox.qcow2_disk_vmid(lv) == vmid


@pytest.mark.parametrize(("hostname", "node"), [
    ("pve1", "pve1"), ("pve1.example.com", "pve1"), ("a.b", "a"), ("", ""),
])
def test_node_name_is_the_short_host_name(hostname: str, node: str) -> None:
    assert proxmox.node_name(hostname) == node


@pytest.mark.parametrize("name", ["pve1", "a", "PVE-node-2", "x" * 63])
def test_node_names_are_dns_labels(name: str) -> None:
    assert proxmox.is_node_name(name)


@pytest.mark.parametrize("name", ["", "-a", "a-", "a.b", "a_b", "x" * 64, "a\n", "../a", "a/b"])
def test_what_is_not_a_node_name(name: str) -> None:
    assert not proxmox.is_node_name(name)
