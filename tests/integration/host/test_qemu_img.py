"""qemu-img info, measure, check and map: the real binary on real images in tmp_path."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import struct
import subprocess
from pathlib import Path

import pytest

from pvestord.adapters import command, qemu_img
from pvestord.adapters.qemu_img import Bitmap, CheckStatus, QemuImgError
from pvestord.adapters.qmp import VmMonitor
from pvestord.adapters.vms import LocalVm
from pvestord.engine.jobroom import room_for_chain_copies
from pvestord.engine.memory import OncePerChange
from pvestord.errors import CommandError
from pvestord.policy import EVERY_LAYER, BlockJob, ChainCopy, chain_copy, maximum_size
from pvestord.policy.sizes import GiB, MiB
from tests.harness.qemu import Disk, Pve9Disk, QemuVM

#: Every qemu-img/qemu-io call the test makes itself.
TOOL_TIMEOUT = 120.0


def tool(*argv: str) -> str:
    return command.run(argv, timeout=TOOL_TIMEOUT).stdout


def create(path: Path, size: str, *options: str, backing: Path | None = None) -> Path:
    argv = ["qemu-img", "create", "-q", "-f", "qcow2"]
    if options:
        argv += ["-o", ",".join(options)]
    if backing is not None:
        argv += ["-b", str(backing), "-F", "qcow2"]
    tool(*argv, str(path), size)
    return path


def l2_table(path: Path) -> int:
    """Offset of the first L2 table (qcow2 header: l1_table_offset at byte 40)."""
    with path.open("rb") as f:
        header = f.read(48)
        f.seek(struct.unpack(">Q", header[40:48])[0])
        return int(struct.unpack(">Q", f.read(8))[0] & 0x00FFFFFFFFFFFE00)


async def test_measure_8g_default_and_proxmox_overlay_layout() -> None:
    plain = await qemu_img.measure(8 * GiB)
    overlay = await qemu_img.measure(8 * GiB, cluster_size=128 * 1024, extended_l2=True)
    # qcow2_calc_prealloc_size on QEMU 7.2: data plus L1/L2/refcount metadata.
    assert plain.fully_allocated == 8591507456
    assert overlay.fully_allocated == 8591638528
    assert plain.bitmaps is None and overlay.bitmaps is None
    # The maximum LV is that in whole 4 MiB extents: one extent above 8 GiB.
    assert maximum_size(plain.fully_allocated, 4 * MiB) == 8 * GiB + 4 * MiB


async def test_info_of_an_overlay_with_bitmaps(tmp_path: Path) -> None:
    base = create(tmp_path / "base.qcow2", "1G")
    top = create(tmp_path / "top.qcow2", "1G", "cluster_size=128k", "extended_l2=on",
                 backing=base)
    tool("qemu-img", "bitmap", "--add", "-g", "1M", str(top), "backup-1")
    info = await qemu_img.info(top)
    assert info.format == "qcow2" and info.virtual_size == GiB
    assert info.cluster_size == 128 * 1024 and info.extended_l2
    assert info.refcount_bits == 16
    assert info.bitmaps == (Bitmap("backup-1", MiB, ("auto",)),)
    assert info.backing_filename == str(base) and info.backing_format == "qcow2"
    assert not info.dirty and not info.corrupt
    plain = await qemu_img.info(base)
    assert (plain.cluster_size, plain.extended_l2, plain.bitmaps) == (65536, False, ())


async def test_bitmaps_size_matches_qemu_measure_of_the_image(tmp_path: Path) -> None:
    # measure --size cannot see bitmaps; our arithmetic must equal what
    # measure reports for the image itself.
    image = create(tmp_path / "b.qcow2", "3G", "cluster_size=128k", "extended_l2=on")
    for name, granularity in (("a", "64K"), ("a-much-longer-bitmap-name-" + "x" * 40, "4K"),
                              ("c", "2M")):
        tool("qemu-img", "bitmap", "--add", "-g", granularity, str(image), name)
    info = await qemu_img.info(image)
    measured = await qemu_img.measure(info.virtual_size, cluster_size=info.cluster_size,
                                      extended_l2=info.extended_l2)
    by_image = json.loads(tool("qemu-img", "measure", "--output=json", "-O", "qcow2", "-o",
                               "cluster_size=128k,extended_l2=on", str(image)))
    assert by_image["bitmaps"] > 0
    assert qemu_img.bitmaps_size(info.virtual_size, 128 * 1024, info.bitmaps) == \
        by_image["bitmaps"]
    assert measured.fully_allocated == by_image["fully-allocated"]
    assert await qemu_img.maximum_required(info) == \
        by_image["fully-allocated"] + by_image["bitmaps"]


@pytest.mark.parametrize("options", [(), ("cluster_size=128k", "extended_l2=on")])
async def test_a_fully_written_image_fits_its_maximum_exactly(
        tmp_path: Path, options: tuple[str, ...]) -> None:
    # The point of the maximum: an image whose every cluster is written never
    # needs more than measure's fully allocated size.
    image = create(tmp_path / "full.qcow2", "64M", *options)
    tool("qemu-io", "-f", "qcow2", "-c", "write -P 0x5a 0 64M", str(image))
    info = await qemu_img.info(image)
    maximum = await qemu_img.maximum_required(info)
    result = await qemu_img.check(image)
    assert result.status is CheckStatus.CLEAN
    assert result.image_end_offset == maximum == image.stat().st_size


@pytest.mark.parametrize("options", [(), ("cluster_size=128k", "extended_l2=on")])
async def test_stored_bitmaps_can_outgrow_the_measured_maximum(
        tmp_path: Path, options: tuple[str, ...]) -> None:
    # QEMU stores a bitmap copy-then-free: the new table and directory are
    # written before the old ones are freed, and the holes left behind are
    # too small for later data runs. So a fully written image with a bitmap
    # ends past "fully allocated + bitmaps" (and more so with every session):
    # the maximum is not a hard bound, which is why the policy gives a drive
    # that still hits ENOSPC at its maximum one more chunk (Proxmox bug 6543).
    image = create(tmp_path / "full.qcow2", "64M", *options)
    tool("qemu-img", "bitmap", "--add", "-g", "4K", str(image), "dirty")
    tool("qemu-io", "-f", "qcow2", "-c", "write -P 0x5a 0 64M", str(image))
    info = await qemu_img.info(image)
    assert info.cluster_size is not None
    maximum = await qemu_img.maximum_required(info)
    result = await qemu_img.check(image)
    assert result.status is CheckStatus.CLEAN and result.image_end_offset is not None
    overshoot = result.image_end_offset - maximum
    # Measured on QEMU 7.2: the old table and directory, two clusters.
    assert 0 < overshoot <= 2 * info.cluster_size


async def test_check_clean_leaks_and_corruption(tmp_path: Path) -> None:
    image = create(tmp_path / "c.qcow2", "64M")
    tool("qemu-io", "-f", "qcow2", "-c", "write -P 0xab 0 192k", str(image))
    clean = await qemu_img.check(image)
    assert clean.status is CheckStatus.CLEAN
    assert (clean.leaks, clean.corruptions, clean.check_errors) == (0, 0, 0)
    assert clean.allocated_clusters == 3 and clean.total_clusters == 1024

    table = l2_table(image)
    with image.open("r+b") as f:  # unreference guest cluster 1: its data cluster leaks
        f.seek(table + 8)
        f.write(bytes(8))
    leaks = await qemu_img.check(image)
    assert leaks.status is CheckStatus.LEAKS
    assert (leaks.leaks, leaks.corruptions) == (1, 0)
    assert "Leaked cluster" in leaks.messages

    with image.open("r+b") as f:  # guest cluster 2 now shares cluster 0's data
        f.seek(table)
        first = f.read(8)
        f.seek(table + 16)
        f.write(first)
    corrupt = await qemu_img.check(image)
    assert corrupt.status is CheckStatus.CORRUPT
    assert corrupt.corruptions >= 1
    assert "ERROR" in corrupt.messages


async def test_failures_are_command_errors_with_the_reason(tmp_path: Path) -> None:
    with pytest.raises(CommandError, match="No such file") as caught:
        await qemu_img.info(tmp_path / "missing.qcow2")
    assert caught.value.returncode == 1
    raw = tmp_path / "disk.raw"
    raw.write_bytes(bytes(MiB))
    with pytest.raises(CommandError) as unsupported:
        await qemu_img.check(raw, image_format="raw")
    assert unsupported.value.returncode == 63  # the format cannot be checked
    with pytest.raises(CommandError, match="Cluster size must be a power of two"):
        await qemu_img.measure(GiB, cluster_size=1000)


async def test_image_in_use_needs_force_share(tmp_path: Path) -> None:
    image = create(tmp_path / "busy.qcow2", "64M")
    # qemu-io holding the image open stands in for a running VM: it keeps
    # QEMU's image locks until its stdin closes.
    holder = await asyncio.create_subprocess_exec(
        "qemu-io", "-f", "qcow2", str(image), stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert holder.stdout is not None
        prompt = await asyncio.wait_for(holder.stdout.readexactly(len("qemu-io> ")),
                                        TOOL_TIMEOUT)
        assert prompt == b"qemu-io> "  # the image is open
        with pytest.raises(CommandError, match="another process using the image"):
            await qemu_img.info(image)
        info = await qemu_img.info(image, force_share=True)
        assert info.virtual_size == 64 * MiB
    finally:
        await asyncio.wait_for(holder.communicate(b"quit\n"), TOOL_TIMEOUT)


def fake_qemu_img(tmp_path: Path, body: str) -> str:
    """A test double standing in for a misbehaving qemu-img."""
    script = tmp_path / "fake-qemu-img"
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(0o755)
    return str(script)


async def test_overrun_is_killed_and_reported(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PVESTORD_QEMU_IMG", fake_qemu_img(tmp_path, "exec sleep 60"))
    with pytest.raises(CommandError) as caught:
        await qemu_img.measure(GiB, timeout=0.5)
    assert caught.value.timed_out and "timed out after 0.5 s" in str(caught.value)


async def test_unreadable_output_is_a_qemu_img_error(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PVESTORD_QEMU_IMG", fake_qemu_img(tmp_path, "echo 'not json'"))
    with pytest.raises(QemuImgError, match="not JSON"):
        await qemu_img.measure(GiB)
    monkeypatch.setenv("PVESTORD_QEMU_IMG", fake_qemu_img(tmp_path, "echo '{\"required\": 1}'"))
    with pytest.raises(QemuImgError, match="fully-allocated"):
        await qemu_img.measure(GiB)
    assert os.environ["PVESTORD_QEMU_IMG"].endswith("fake-qemu-img")


async def test_the_room_a_stream_and_a_backing_commit_still_need(
        tmp_path: Path, run_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    """``qemu-img map`` of a chain a running QEMU holds, with a commit of two
    layers that locks them against readers, read into the data each block
    job still copies (pvestord.engine.jobroom)."""
    base = create(tmp_path / "base.qcow2", "1G")
    tool("qemu-io", "-f", "qcow2", "-c", f"write -P 1 0 {8 * MiB}", str(base))
    mid1 = create(tmp_path / "mid1.qcow2", "1G", backing=base)
    tool("qemu-io", "-f", "qcow2", "-c", f"write -P 2 {16 * MiB} {4 * MiB}",
         "-c", f"write -z {64 * MiB} {4 * MiB}", str(mid1))  # zeroes cost the target nothing
    mid2 = create(tmp_path / "mid2.qcow2", "1G", backing=mid1)
    tool("qemu-io", "-f", "qcow2", "-c", f"write -P 3 {32 * MiB} {2 * MiB}", str(mid2))
    top = create(tmp_path / "top.qcow2", "1G", backing=mid2)
    tool("qemu-io", "-f", "qcow2", "-c", f"write -P 4 {16 * MiB} {MiB}", str(top))

    def job(kind: str, offset: int = 0) -> BlockJob:
        return BlockJob("j", kind, "running", False, "ok", length=GiB, offset=offset)

    async def room(copy: ChainCopy, image: Path) -> dict[str, int]:
        return await room_for_chain_copies(vm, [(copy, str(image))], {"other": 5},
                                           map_timeout=TOOL_TIMEOUT, said=OncePerChange())

    disk = Disk(top, block_node="ftop", file_block_node="etop")
    with QemuVM(100, run_dir, disks=[disk]) as qemu:
        vm = LocalVm(100, qemu.pid, qemu.qmp_path)
        # mid2 and mid1 into base, at a byte a second: it runs all along.
        qemu.qmp("block-commit", {"job-id": "j", "device": "ftop", "speed": 1,
                                  "top-node": qemu.format_node_on(str(mid2)),
                                  "base-node": qemu.format_node_on(str(base))})
        with pytest.raises(CommandError):  # the commit holds its layers against -U
            tool("qemu-img", "map", "-U", "--output=json", str(mid2))

        # mid2 and mid1 committed: their data, not its zeroes, from mid2's own map.
        commit = ChainCopy(job("commit"), "fbase", "fmid2", range(2), unlocked_backings=1)
        assert await room(commit, mid2) == {"other": 5, "fbase": 6 * MiB}
        assert await room(ChainCopy(job("commit", 32 * MiB), "fbase", "fmid2", range(2),
                                    unlocked_backings=1), mid2) == {"other": 5, "fbase": 2 * MiB}
        # Streamed into the top over base: its layers' data but the MiB the
        # top has; without a base, the base's too.
        stream = ChainCopy(job("stream"), "ftop", "ftop", range(1, 3), unlocked_backings=2)
        assert await room(stream, top) == {"other": 5, "ftop": 5 * MiB}
        assert await room(ChainCopy(job("stream"), "ftop", "ftop", range(1, 4),
                                    unlocked_backings=3), top) == {"other": 5, "ftop": 13 * MiB}
        # Read as a mirror's source, the layers the commit holds are locked to -U.
        with caplog.at_level(logging.WARNING, logger="pvestord"):
            assert await room(ChainCopy(job("stream"), "ftop", "ftop", range(1, 3)), top) == \
                {"other": 5}
        caplog.clear()

        with caplog.at_level(logging.WARNING, logger="pvestord"):
            assert await room(commit, tmp_path / "gone.qcow2") == {"other": 5}
        [warned] = [r for r in caplog.records if getattr(r, "JOB", None) == "j"]
        assert (warned.levelno, getattr(warned, "BLOCK_NODE", None)) == (logging.WARNING, "fbase")


async def test_the_room_a_mirror_still_needs(tmp_path: Path, run_dir: Path) -> None:
    """qemu-server's move disk of a running VM, a ``blockdev-mirror`` with
    ``sync=full`` of the drive's throttle node into a new image: its edges
    from QEMU's job graph, its source's image from the node's filename, and
    the data its whole chain still has past the job's offset from ``qemu-img
    map`` of a chain QEMU has open (pvestord.engine.extender's path)."""
    base = create(tmp_path / "base.qcow2", "1G")
    tool("qemu-io", "-f", "qcow2", "-c", f"write -P 1 0 {8 * MiB}", str(base))
    top = create(tmp_path / "top.qcow2", "1G", backing=base)
    tool("qemu-io", "-f", "qcow2", "-c", f"write -P 2 {512 * MiB} {4 * MiB}", str(top))
    target = create(tmp_path / "target.qcow2", "1G")
    disk = Pve9Disk(top, "ftop", "etop")
    with QemuVM(100, run_dir, disks=[disk]) as qemu:
        qemu.qmp("blockdev-add", {**Pve9Disk(target, "ftgt", "etgt").format_blockdev()})
        # At a byte a second after QEMU's first burst: it runs all along.
        qemu.qmp("blockdev-mirror", {"job-id": "mirror-scsi0", "device": disk.top_node,
                                     "target": "ftgt", "sync": "full", "replaces": "ftop",
                                     "speed": 1, "auto-dismiss": False})
        async with VmMonitor(qemu.qmp_path, "VM 100") as monitor:
            [mirror] = await monitor.block_jobs()
            graph = await monitor.job_graph()
            images = (await monitor.block_nodes()).filenames
        copy = chain_copy(mirror, graph[mirror.id])
        assert copy == ChainCopy(mirror, "ftgt", disk.top_node, EVERY_LAYER)
        assert images[copy.mapped] == str(top)  # the throttle node names its child's image
        room = await room_for_chain_copies(LocalVm(100, qemu.pid, qemu.qmp_path),
                                           [(copy, images[copy.mapped])], {},
                                           map_timeout=TOOL_TIMEOUT, said=OncePerChange())
        # Both layers' data past the job's offset, which runs with the zeroes too.
        data_left = max(0, 8 * MiB - mirror.offset) + 4 * MiB
        assert room == {"ftgt": min(mirror.remaining, data_left)}
        assert mirror.length == GiB  # the whole disk, zeroes and all: no bound on data
