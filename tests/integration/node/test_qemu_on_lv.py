"""QEMU on a real LV behaves as the design assumes (the facts the engine relies on)."""

from __future__ import annotations

from pathlib import Path

from tests.harness.lvmbed import VG, MiB, qcow2_check, qcow2_create, sh
from tests.harness.qemu import Disk, QemuVM

VMID = 4242


def _vm(vg: VG, tmp_path: Path, lv_size: int, virtual: int = 1024 * MiB) -> QemuVM:
    path = vg.create_lv("vm-4242-disk-0.qcow2", lv_size)
    qcow2_create(path, virtual)
    return QemuVM(VMID, tmp_path, disks=[Disk(path, "fmt0", "file0")])


def test_threshold_fires_once_on_the_file_node(vg: VG, tmp_path: Path) -> None:
    with _vm(vg, tmp_path, 64 * MiB) as vm:
        vm.set_write_threshold("file0", 8 * MiB)
        vm.write_pattern("fmt0", 0, 16 * MiB)
        event = vm.wait_event("BLOCK_WRITE_THRESHOLD")
        assert event["data"]["node-name"] == "file0"
        assert event["data"]["write-threshold"] == 8 * MiB
        assert vm.named_node("file0")["write_threshold"] == 0  # one-shot
        vm.write_pattern("fmt0", 16 * MiB, 16 * MiB)
        assert not [e for e in vm.events() if e.get("event") == "BLOCK_WRITE_THRESHOLD"]


def test_writes_past_the_old_end_succeed_after_lvextend(vg: VG, tmp_path: Path) -> None:
    with _vm(vg, tmp_path, 32 * MiB) as vm:
        vm.write_pattern("fmt0", 0, 16 * MiB, 0x11)
        sh("lvextend", "-q", "-L", "96m", f"{vg.name}/vm-4242-disk-0.qcow2")
        # The qcow2 data now lands past the LV's old 32 MiB end.
        vm.write_pattern("fmt0", 16 * MiB, 48 * MiB, 0x22)
        assert vm.read_verify("fmt0", 0, 16 * MiB, 0x11)
        assert vm.read_verify("fmt0", 16 * MiB, 48 * MiB, 0x22)
    assert qcow2_check(vg.lv_path("vm-4242-disk-0.qcow2"))["exit"] == 0


def test_writes_past_the_lv_end_fail_with_enospc_and_corrupt_nothing(
        vg: VG, tmp_path: Path) -> None:
    with _vm(vg, tmp_path, 16 * MiB) as vm:
        vm.write_pattern("fmt0", 0, 8 * MiB, 0x33)
        result = vm.write_pattern("fmt0", 8 * MiB, 32 * MiB, 0x44, check=False)
        assert not result.ok
        assert "No space left on device" in (result.error or "") + "\n".join(result.lines)
        assert vm.read_verify("fmt0", 0, 8 * MiB, 0x33)
    check = qcow2_check(vg.lv_path("vm-4242-disk-0.qcow2"))
    assert check.get("corruptions", 0) == 0
    assert check["exit"] in (0, 3)  # leaked clusters at most (docs/testing.md, "The node guest")
