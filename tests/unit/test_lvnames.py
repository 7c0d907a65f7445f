"""The LVs of a VM's qcow2 chains, by Proxmox's names (pvestord.policy.lvnames)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from pvestord.policy.lvnames import backing_lv, chain_vmid, is_snapshot, is_snapshot_of


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


# --- a chain's LVs, read from its images (volume shrink) --------------------------------------

_DISK = st.builds(lambda vmid, n: f"vm-{vmid}-disk-{n}.qcow2", st.integers(100, 10**6),
                  st.integers(0, 99))
_SNAP = st.from_regex(r"[A-Za-z][A-Za-z0-9_\-]{0,39}", fullmatch=True)


@given(_DISK, _SNAP)
def test_a_disks_snapshot_lvs_are_its_own(disk: str, snap: str) -> None:
    stem = disk.removesuffix(".qcow2")
    assert is_snapshot_of(disk, f"snap_{stem}_{snap}.qcow2")
    assert not is_snapshot_of(disk, disk)


@given(_DISK, _DISK, _SNAP)
def test_another_disks_snapshot_or_a_base_image_is_not(disk: str, other: str,
                                                       snap: str) -> None:
    """A base image linked clones share, another disk's snapshot: never part of
    the chain shrink may change as a whole."""
    stem, other_stem = disk.removesuffix(".qcow2"), other.removesuffix(".qcow2")
    base = "base-" + stem.removeprefix("vm-") + ".qcow2"
    assert not is_snapshot_of(disk, base)
    if not other_stem.startswith(f"{stem}_") and other_stem != stem:
        assert not is_snapshot_of(disk, f"snap_{other_stem}_{snap}.qcow2")


@given(st.from_regex(r"vg[a-z0-9_]{0,10}", fullmatch=True), _DISK, _SNAP)
def test_a_backing_file_is_an_lv_of_the_vg_named_bare_or_in_full(vg: str, disk: str,
                                                                 snap: str) -> None:
    top = f"/dev/{vg}/{disk}"
    lv = f"snap_{disk.removesuffix('.qcow2')}_{snap}.qcow2"
    assert backing_lv(top, lv, vg) == lv                  # as Proxmox writes it
    assert backing_lv(top, f"/dev/{vg}/{lv}", vg) == lv   # as qemu-img may resolve it


@given(st.from_regex(r"vg[a-z0-9_]{0,10}", fullmatch=True), _DISK,
       st.sampled_from(["../x", "./x", "/dev/other/x", "/dev/mapper/x", "", "..", ".",
                        "a/b", "/etc/passwd", "nbd:localhost:10809", "json:{}"]))
def test_anything_else_is_no_lv_of_the_vg(vg: str, disk: str, backing: str) -> None:
    assert backing_lv(f"/dev/{vg}/{disk}", backing, vg) is None


def test_an_image_outside_the_vg_has_no_backing_lv() -> None:
    assert backing_lv("/var/lib/vz/images/100/x.qcow2", "y.qcow2", "vg0") is None
