"""Device numbers from /dev, /proc and /sys (pvestord.adapters.devices), on the host.

A real process holds a real block device open, reached through a symlink as
QEMU reaches ``/dev/VG/LV``; device-mapper itself (an LV's name from its
device) needs the node guest (tests/integration/node/test_lv_identity.py).
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from pvestord.adapters import devices
from tests.harness.polling import wait_until

pytestmark = pytest.mark.root

HOLD_TIMEOUT = 30.0
NOBODY = 65534


def a_block_device() -> Path:
    for path in sorted(Path("/dev").iterdir()):
        if path.name.startswith("loop") and stat.S_ISBLK(path.lstat().st_mode):
            return path
    pytest.skip("no /dev/loop* block device on this machine")


def as_nobody(call: Callable[[], object]) -> str:
    """``repr`` of what ``call`` returns in a child that dropped root for nobody."""
    reader, writer = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child
        try:
            os.setgroups([])
            os.setresgid(NOBODY, NOBODY, NOBODY)
            os.setresuid(NOBODY, NOBODY, NOBODY)
            os.write(writer, repr(call()).encode())
        finally:
            os._exit(0)
    os.close(writer)
    with os.fdopen(reader, "rb") as answer:
        text = answer.read().decode()
    os.waitpid(child, 0)
    return text


def test_a_device_held_open_through_a_symlink_is_seen_by_its_number(tmp_path: Path) -> None:
    device = a_block_device()
    link = tmp_path / "lv"
    link.symlink_to(device)
    number = devices.block_device(link)
    assert number == device.stat().st_rdev
    opened = tmp_path / "opened"
    holder = subprocess.Popen(  # noqa: S603 - argument list
        [sys.executable, "-c",
         "import os, sys, time; fd = os.open(sys.argv[1], os.O_RDONLY);"
         " open(sys.argv[2], 'w').close(); time.sleep(600)", str(link), str(opened)])
    try:
        wait_until(opened.exists, HOLD_TIMEOUT, "the holder's open")
        held = devices.open_block_devices(holder.pid)
        assert held is not None and number in held
        mine = devices.open_block_devices(os.getpid())
        assert mine is not None and number not in mine
        # Another user may not look into root's fds: "unknown", not "none".
        assert as_nobody(lambda: devices.open_block_devices(holder.pid)) == "None"
    finally:
        holder.kill()
        holder.wait(HOLD_TIMEOUT)
    assert devices.open_block_devices(holder.pid) == frozenset()
    assert devices.lv_of_device(number) is None  # a loop device is no LV


def test_a_name_that_is_gone_or_no_device_has_no_number(tmp_path: Path) -> None:
    assert devices.block_device(tmp_path / "renamed-away") is None
    (tmp_path / "file").write_bytes(b"")
    assert devices.block_device(tmp_path / "file") is None
