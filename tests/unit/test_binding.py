"""Which LV a drive writes: the pure rules of pvestord.policy.binding."""

from __future__ import annotations

from hypothesis import assume, given
from hypothesis import strategies as st

from pvestord.policy.binding import BindingKind, bind, dm_name, split_dm_name

#: LVM's names: letters, digits and ``+_.-``, never starting with ``-``.
lvm_names = st.from_regex(r"[A-Za-z0-9+_.][A-Za-z0-9+_.-]{0,40}", fullmatch=True)
devices = st.integers(min_value=1, max_value=2**20)
device_sets = st.frozensets(devices, max_size=6)


@given(lvm_names, lvm_names)
def test_a_dm_name_splits_back_into_its_vg_and_lv(vg: str, lv: str) -> None:
    assert split_dm_name(dm_name(vg, lv)) == (vg, lv)


def test_proxmox_names_split_at_the_single_hyphen() -> None:
    assert split_dm_name("pve--san-snap_vm--100--disk--0_s1.qcow2") == (
        "pve-san", "snap_vm-100-disk-0_s1.qcow2")


def test_a_layered_mapping_or_a_plain_device_is_no_lv() -> None:
    assert split_dm_name("vg-thinpool-tpool") is None
    assert split_dm_name("vg-lv-real") is None
    assert split_dm_name("cryptroot") is None
    assert split_dm_name("vg-") is None


@given(devices, device_sets, st.none() | devices)
def test_a_name_whose_device_qemu_has_open_is_right(path: int, other: frozenset[int],
                                                     remembered: int | None) -> None:
    binding = bind(path, other | {path}, remembered)
    assert (binding.kind, binding.device) == (BindingKind.NAME, path)


@given(st.none() | devices, device_sets, devices)
def test_a_name_moved_away_leaves_the_remembered_device_while_it_is_open(
        path: int | None, other: frozenset[int], remembered: int) -> None:
    assume(path != remembered)
    open_devices = (other | {remembered}) - {path}
    binding = bind(path, open_devices, remembered)
    assert (binding.kind, binding.device) == (BindingKind.DEVICE, remembered)


@given(devices, device_sets, st.none() | devices)
def test_a_name_on_a_device_qemu_does_not_have_open_is_never_used(
        path: int, open_devices: frozenset[int], remembered: int | None) -> None:
    """The new LV of a snapshot, before QEMU opens it: never grown."""
    still_open = open_devices - {path}
    binding = bind(path, still_open, remembered)
    assert binding.device != path
    assert binding.kind in (BindingKind.DEVICE, BindingKind.LOST)
    assert (binding.kind is BindingKind.LOST) == (remembered is None
                                                  or remembered not in still_open)


@given(device_sets)
def test_a_name_that_is_no_device_with_nothing_remembered_is_taken_unverified(
        open_devices: frozenset[int]) -> None:
    assert bind(None, open_devices, None) == bind(None, frozenset(), None)
    assert bind(None, open_devices, None).kind is BindingKind.NAME
    assert bind(None, open_devices, None).device is None
