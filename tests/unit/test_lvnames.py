"""The LVs of a VM's qcow2 chains, by Proxmox's names (pvestord.policy.lvnames)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from pvestord.policy.lvnames import chain_vmid, is_snapshot


def test_disks_and_their_snapshots() -> None:
    assert chain_vmid("vm-101-disk-0.qcow2") == 101
    assert chain_vmid("snap_vm-101-disk-0_before_upgrade.qcow2") == 101
    assert is_snapshot("snap_vm-101-disk-0_s1.qcow2")
    assert not is_snapshot("vm-101-disk-0.qcow2")


def test_other_names() -> None:
    for name in ("vm-101-disk-0", "base-101-disk-0.qcow2", "snap_vm-101-disk-0.qcow2",
                 "del-vm-101-disk-0.qcow2", "xsnap_vm-101-disk-0_a.qcow2", "root", ""):
        assert chain_vmid(name) is None, name


@given(st.integers(0, 10**9), st.from_regex(r"disk-[0-9]{1,3}", fullmatch=True),
       st.from_regex(r"[A-Za-z][A-Za-z0-9_\-]{0,39}", fullmatch=True))
def test_every_snapshot_of_a_disk_is_in_its_chain(vmid: int, disk: str, snap: str) -> None:
    volume = f"vm-{vmid}-{disk}.qcow2"
    snapshot = f"snap_vm-{vmid}-{disk}_{snap}.qcow2"
    assert chain_vmid(volume) == chain_vmid(snapshot) == vmid
    assert is_snapshot(snapshot) and not is_snapshot(volume)
