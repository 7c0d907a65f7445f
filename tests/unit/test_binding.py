"""A drive bound to the device QEMU has open (pvestord.policy.binding), and the
device numbers read from /dev and /proc (pvestord.adapters.devices)."""

from __future__ import annotations

import os
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from pvestord.adapters.devices import device_number, lv_with_device, open_block_devices
from pvestord.policy.binding import Binding, bind

devices = st.none() | st.integers(0, 2**20)


def test_the_cases() -> None:
    assert bind(7, None, {7, 9}).binding is Binding.BY_NAME
    # Renamed under QEMU: the name is a new LV's; QEMU still has 7 open.
    renamed = bind(8, 7, {7, 9})
    assert (renamed.binding, renamed.device) == (Binding.RENAMED, 7)
    assert bind(8, None, {7}).binding is Binding.UNKNOWN  # never bound: stand back
    assert bind(None, 3, {7}).binding is Binding.UNKNOWN
    # QEMU's descriptors unreadable: the name, as before.
    assert bind(8, 7, None).binding is Binding.BY_NAME


@given(devices, devices, st.none() | st.frozensets(st.integers(0, 2**20), max_size=5))
def test_never_a_device_qemu_does_not_have_open(
        name: int | None, remembered: int | None, open_now: frozenset[int] | None) -> None:
    verdict = bind(name, remembered, open_now)
    if open_now is None:
        assert verdict.binding is Binding.BY_NAME and verdict.device == name
    elif verdict.binding is Binding.UNKNOWN:
        assert verdict.device is None
    else:
        assert verdict.device in open_now
        assert verdict.binding is (Binding.BY_NAME if verdict.device == name
                                   else Binding.RENAMED)


def test_device_numbers_from_dev_and_proc(tmp_path: Path) -> None:
    """/dev/null is a character device, not a block device; this process's
    descriptors read; a missing folder or process gives None."""
    assert device_number("/dev/null") is None
    assert device_number(tmp_path / "missing") is None
    mine = open_block_devices(os.getpid())
    assert mine is not None
    assert open_block_devices(2**22 + 12345) is None
    (tmp_path / "vg").mkdir()
    os.symlink("/dev/null", tmp_path / "vg" / "vm-1-disk-0.qcow2")
    assert lv_with_device("vg", 1, dev=tmp_path) is None
    assert lv_with_device("nosuch", 1, dev=tmp_path) is None
