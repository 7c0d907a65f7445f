"""The QEMU test fixture itself, against a real QEMU: the other tiers trust it."""

from __future__ import annotations

import asyncio
import os
import signal
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.harness.polling import wait_until
from tests.harness.qemu import (
    Disk,
    Pve9Disk,
    QemuError,
    QemuIoError,
    QemuLaunchError,
    QemuVM,
    QmpCommandError,
    create_qcow2,
    image_io,
    parse_qemu_io,
)

MiB = 1024 * 1024


def _disk(run_dir: Path, size: int = 64 * MiB) -> Disk:
    path = create_qcow2(run_dir / "disk0.qcow2", size)
    return Disk(path, block_node="drive-scsi0", file_block_node="file-scsi0")


def test_layout_and_pattern_round_trip(run_dir: Path) -> None:
    with QemuVM(4242, run_dir, disks=[_disk(run_dir)]) as vm:
        assert int((run_dir / "4242.pid").read_text()) == vm.pid
        assert vm.named_node("file-scsi0")["drv"] == "file"
        assert vm.named_node("drive-scsi0")["drv"] == "qcow2"
        vm.write_pattern("drive-scsi0", 1 * MiB, 256 * 1024, 0xAB)
        assert vm.read_verify("drive-scsi0", 1 * MiB, 256 * 1024, 0xAB)
        assert not vm.read_verify("drive-scsi0", 1 * MiB, 256 * 1024, 0xCD)
        # Unwritten clusters read as zeros.
        assert vm.read_verify("drive-scsi0", 8 * MiB, 64 * 1024, 0x00)
        # Each command's export is gone with it: none is left to keep a
        # migration from inactivating the node.
        assert vm.qmp("query-block-exports") == []
    assert not vm.is_running()
    assert not (run_dir / "4242.qmp").exists()
    assert not (run_dir / "4242.nbd").exists()


def test_qemu_io_reports_the_errno_of_a_failed_write(run_dir: Path) -> None:
    with QemuVM(4242, run_dir, disks=[_disk(run_dir, 16 * MiB)]) as vm:
        # Past the end of the virtual disk: QEMU refuses the request (EIO).
        result = vm.qemu_io("drive-scsi0", f"write -P 0x11 {32 * MiB} 4096")
        assert not result.ok
        assert result.error == "Input/output error"
        # The next command's output is not mixed with this one's.
        ok = vm.qemu_io("drive-scsi0", "write -P 0x11 0 4096")
        assert ok.ok, ok.lines
        assert all("failed" not in line for line in ok.lines)
        with pytest.raises(QemuError, match="nosuch"):
            vm.qemu_io("nosuch", "read 0 512")
        assert vm.qmp("query-block-exports") == []


def test_an_io_session_keeps_one_tool_and_one_export_for_its_commands(run_dir: Path) -> None:
    with QemuVM(4248, run_dir, disks=[_disk(run_dir, 16 * MiB)]) as vm:
        with vm.io_session() as io:
            for n in range(4):
                io.write_pattern("drive-scsi0", n * MiB, MiB, 0x10 + n)
            [export] = vm.qmp("query-block-exports")
            failed = io.qemu_io("drive-scsi0", f"write -P 0x11 {32 * MiB} 4096")
            assert (failed.ok, failed.error) == (False, "Input/output error")
            # The failure was the command's, not the session's.
            assert all(io.read_verify("drive-scsi0", n * MiB, MiB, 0x10 + n) for n in range(4))
            assert not io.read_verify("drive-scsi0", 0, MiB, 0x11)
            assert vm.qmp("query-block-exports") == [export]
        assert vm.qmp("query-block-exports") == []
        assert vm.read_verify("drive-scsi0", 3 * MiB, MiB, 0x13)


def test_an_io_session_on_a_killed_vm_fails_its_command(run_dir: Path) -> None:
    with QemuVM(4249, run_dir, disks=[_disk(run_dir, 16 * MiB)]) as vm, \
            vm.io_session() as io:
        io.write_pattern("drive-scsi0", 0, MiB)
        vm.send_signal(signal.SIGKILL)
        vm.wait(10)
        assert not io.qemu_io("drive-scsi0", "write 0 4096").ok


def test_qemu_io_leaves_the_monitor_free_during_a_write(run_dir: Path) -> None:
    """A guest's write does not hold QEMU's main loop, so neither does the
    harness's: pvestord's QMP session is served while a write is under way.

    The drive is throttled to 1 MiB/s. QEMU's throttle lets a request through
    while its bucket is below the burst, so a first 8 MiB write passes at once
    and fills the bucket; the write under test then waits about 8 s in the
    throttle for it to drain, in QEMU's block layer, its export listed."""
    disk = Pve9Disk.for_volume(create_qcow2(run_dir / "vm-4247-disk-0.qcow2", 64 * MiB),
                               "shared:vm-4247-disk-0.qcow2")
    with QemuVM(4247, run_dir, disks=[disk]) as vm, ThreadPoolExecutor(1) as pool:
        vm.qmp("qom-set", path=disk.throttle_group, property="limits",
               value={"bps-write": MiB})
        assert vm.write_pattern(disk.top_node, 8 * MiB, 8 * MiB, 0x41).ok
        write = pool.submit(vm.write_pattern, disk.top_node, 0, MiB, 0x42, timeout=60)
        wait_until(lambda: vm.qmp("query-block-exports") or write.done(), 30,
                   "the write's export")
        assert vm.qmp("query-status")["status"] == "running"
        assert [e["node-name"] for e in vm.qmp("query-block-exports")] == [disk.top_node]
        assert not write.done()
        assert write.result().ok
        assert vm.read_verify(disk.top_node, 0, MiB, 0x42)
        assert vm.read_verify(disk.top_node, 8 * MiB, 8 * MiB, 0x41)


def test_write_threshold_is_one_shot_and_fires_on_the_file_node(run_dir: Path) -> None:
    with QemuVM(4242, run_dir, disks=[_disk(run_dir)]) as vm:
        vm.set_write_threshold("file-scsi0", 4 * MiB)
        assert vm.named_node("file-scsi0")["write_threshold"] == 4 * MiB
        # Below the threshold (in physical offsets of the file node): no event.
        vm.write_pattern("drive-scsi0", 0, 64 * 1024)
        assert not [e for e in vm.events() if e["event"] == "BLOCK_WRITE_THRESHOLD"]
        # Enough guest data that the qcow2 file grows past 4 MiB.
        vm.write_pattern("drive-scsi0", 0, 8 * MiB)
        event = vm.wait_event("BLOCK_WRITE_THRESHOLD", timeout=10)
        assert event["data"]["node-name"] == "file-scsi0"
        assert event["data"]["write-threshold"] == 4 * MiB
        assert vm.named_node("file-scsi0")["write_threshold"] == 0
        vm.write_pattern("drive-scsi0", 16 * MiB, 8 * MiB)
        with pytest.raises(TimeoutError):
            vm.wait_event("BLOCK_WRITE_THRESHOLD", timeout=0.5)


def test_qmp_error_is_raised_with_its_class(run_dir: Path) -> None:
    with QemuVM(4242, run_dir) as vm, pytest.raises(QmpCommandError) as err:
        vm.qmp("block-set-write-threshold", node_name="nosuch", write_threshold=1)
    assert err.value.error_class == "GenericError"


def test_launch_failure_carries_command_and_output(run_dir: Path) -> None:
    vm = QemuVM(4242, run_dir, daemonize=False, extra_args=["-no-such-option"])
    with pytest.raises(QemuLaunchError) as err:
        vm.launch()
    assert err.value.returncode == 1
    assert "-no-such-option" in err.value.argv
    assert any("no-such-option" in line for line in err.value.output)
    assert "-no-such-option" in str(err.value)


def test_signal_sent_by_the_test_gives_no_warning(run_dir: Path,
                                                  recwarn: pytest.WarningsRecorder) -> None:
    with QemuVM(4242, run_dir, daemonize=False) as vm:
        vm.send_signal(signal.SIGKILL)
        vm.wait(10)
    assert vm.returncode == -signal.SIGKILL
    assert not [w for w in recwarn if "did not send" in str(w.message)]


def test_unexpected_death_warns(run_dir: Path) -> None:
    with pytest.warns(UserWarning, match="did not send"), \
            QemuVM(4242, run_dir, daemonize=False) as vm:
        os.kill(vm.pid, signal.SIGKILL)
        vm.wait(10)


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()[1])


def test_a_daemonized_vm_is_watched_through_its_pidfile(run_dir: Path) -> None:
    """As qemu-server starts it: the launcher returns once QEMU is ready, and
    the QEMU left running is no child of the test. The data the test writes
    through the VM is in the image after the quit."""
    disk = _disk(run_dir, 16 * MiB)
    image_io(disk.path, "write -P 0x3c 0 1M")
    with QemuVM(4244, run_dir, disks=[disk]) as vm:
        assert int((run_dir / "4244.pid").read_text()) == vm.pid
        assert _parent(vm.pid) != os.getpid()
        assert vm.is_running() and vm.returncode is None
        assert vm.qmp("query-status")["status"] == "running"
        vm.write_pattern("drive-scsi0", 1 * MiB, 1 * MiB, 0x3d)
    assert not vm.is_running()
    image_io(disk.path, "read -P 0x3c 0 1M")
    image_io(disk.path, "read -P 0x3d 1M 1M")
    with pytest.raises(QemuIoError, match="pattern mismatch"):
        image_io(disk.path, "read -P 0x3c 1M 4k")


def test_a_daemonized_vm_that_dies_is_seen_gone(run_dir: Path) -> None:
    with QemuVM(4245, run_dir) as vm:
        vm.send_signal(signal.SIGKILL)
        assert vm.wait(10) is None        # its exit status is init's
        assert not vm.is_running()


@pytest.mark.parametrize(("extra_args", "said"), [
    (["-no-such-option"], "no-such-option"),                      # before it forks
    (["-blockdev", "driver=file,filename=/nonexistent,node-name=x"], "/nonexistent"),  # after
], ids=["option", "blockdev"])
def test_a_daemonized_launch_failure_carries_its_output(
        run_dir: Path, extra_args: list[str], said: str) -> None:
    vm = QemuVM(4246, run_dir, extra_args=extra_args)
    with pytest.raises(QemuLaunchError) as err:
        vm.launch()
    assert err.value.returncode == 1
    assert any(said in line for line in err.value.output)


async def test_usable_from_async_tests(run_dir: Path) -> None:
    vm = QemuVM(4243, run_dir, disks=[_disk(run_dir)])
    await asyncio.to_thread(vm.launch)
    try:
        result = await asyncio.to_thread(vm.write_pattern, "drive-scsi0", 0, 4096, 0x5A)
        assert result.ok
    finally:
        await asyncio.to_thread(vm.shutdown)


def test_parse_qemu_io() -> None:
    ok = parse_qemu_io("n", "write 0 1", ["wrote 1/1 bytes at offset 0", "1 bytes, 1 ops; ..."])
    assert ok.ok and ok.error is None
    nospc = parse_qemu_io("n", "write 0 1", ["write failed: No space left on device"])
    assert not nospc.ok and nospc.error == "No space left on device"
    mismatch = parse_qemu_io("n", "read -P 1 0 1", [
        "Pattern verification failed at offset 0, 1 bytes", "read 1/1 bytes at offset 0"])
    assert mismatch.error == "pattern mismatch"
    unknown = parse_qemu_io("n", "bogus", ['command "bogus" not found'])
    assert not unknown.ok and unknown.error == 'command "bogus" not found'
    assert parse_qemu_io("n", "x", []).error == "no output"
