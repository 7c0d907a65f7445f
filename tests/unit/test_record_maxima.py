"""``pvestord volume record-maxima``: the tag added to the LVs made without it
(pvestord.features.volumes.recording), with LVM, qemu-img and the lock faked."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from pvestord.adapters import lvm, qemu_img
from pvestord.errors import CommandError
from pvestord.features.volumes import VolumeSettings, record_maxima, recording
from pvestord.policy.capacity import maximum_tag
from pvestord.policy.sizes import GiB, MiB

VG = "vg0"
EXTENT = 4 * MiB
MEASURED = 9 * GiB


class World:
    """The VG as LVM reports it; what was done to it and under which lock."""

    def __init__(self) -> None:
        self.rows = {
            # Made by this version: recorded already.
            "vm-100-disk-0.qcow2": ([maximum_tag(5 * GiB)], True),
            # Made before: measured here (active), or named (another node's).
            "vm-101-disk-0.qcow2": ([], True),
            "vm-102-disk-0.qcow2": ([], False),
            # A converted lvm: storage's raw disk, and a RAM state: their LV size.
            "vm-103-disk-0": ([], False),
            # A snapshot LV and an admin's LV: not thin volumes.
            "snap_vm-101-disk-0_s1.qcow2": ([], True),
            "backup": ([], True),
        }
        self.locked = False
        self.tagged: list[tuple[str, tuple[str, ...], bool]] = []
        self.read: list[str] = []
        #: Tags another node adds while this one measures (a resize there).
        self.meanwhile: dict[str, str] = {}

    async def vg_info(self, vg: str, **_: object) -> lvm.VgInfo:
        return lvm.VgInfo(vg, EXTENT, 10 * GiB)

    async def list_lvs(self, vg: str, **_: object) -> list[lvm.LvRow]:
        return [lvm.LvRow(vg, lv, 2 * GiB, tuple(tags), active, False, "-")
                for lv, (tags, active) in sorted(self.rows.items())]

    async def add_tags(self, vg: str, lv: str, tags: tuple[str, ...]) -> None:
        self.tagged.append((lv, tags, self.locked))
        self.rows[lv][0].extend(tags)

    async def info(self, path: str, **_: object) -> qemu_img.ImageInfo:
        lv = path.rsplit("/", 1)[1]
        self.read.append(lv)
        if lv in self.meanwhile:
            self.rows[lv][0].append(self.meanwhile[lv])
        return qemu_img.ImageInfo(path, "qcow2", 8 * GiB, None, 65536, False, 16, (),
                                  None, None, False, False)

    async def maximum_required(self, image: qemu_img.ImageInfo, **_: object) -> int:
        assert not self.locked, "qemu-img under the storage lock"
        return MEASURED - 1


class Held:
    def require(self, seconds: float) -> None:
        pass


@pytest.fixture
def world(monkeypatch: pytest.MonkeyPatch) -> World:
    fake = World()
    for name in ("vg_info", "list_lvs", "add_tags"):
        monkeypatch.setattr(lvm, name, getattr(fake, name))
    for name in ("info", "maximum_required"):
        monkeypatch.setattr(qemu_img, name, getattr(fake, name))

    @contextlib.asynccontextmanager
    async def locked(*_: object, **__: object) -> AsyncIterator[Held]:
        fake.locked = True
        try:
            yield Held()
        finally:
            fake.locked = False

    monkeypatch.setattr(recording, "locked", locked)
    return fake


def settings(tmp_path: Path) -> VolumeSettings:
    cfg = tmp_path / "storage.cfg"
    cfg.write_text(f"pvestord: thin1\n\tvgname {VG}\n\tshared 1\n")
    return VolumeSettings(storage_config=cfg, vg_health_dir=tmp_path / "health")


def test_missing_maxima_are_recorded_under_the_lock_and_measured_outside_it(
        world: World, tmp_path: Path) -> None:
    result = asyncio.run(record_maxima(settings(tmp_path), "thin1"))
    assert result.recorded == {"vm-101-disk-0.qcow2": MEASURED, "vm-103-disk-0": 2 * GiB}
    assert result.inactive == ["vm-102-disk-0.qcow2"]
    assert result.failed == {}
    assert world.read == ["vm-101-disk-0.qcow2"]
    assert world.tagged == [("vm-101-disk-0.qcow2", (maximum_tag(MEASURED),), True),
                            ("vm-103-disk-0", (maximum_tag(2 * GiB),), True)]
    # Once recorded, nothing is left to do.
    world.tagged.clear()
    again = asyncio.run(record_maxima(settings(tmp_path), "thin1"))
    assert (again.recorded, world.tagged) == ({}, [])


def test_an_lv_recorded_meanwhile_by_another_node_is_left_as_it_is(
        world: World, tmp_path: Path) -> None:
    world.meanwhile = {"vm-101-disk-0.qcow2": maximum_tag(20 * GiB)}
    result = asyncio.run(record_maxima(settings(tmp_path), "thin1"))
    assert "vm-101-disk-0.qcow2" not in result.recorded
    assert world.rows["vm-101-disk-0.qcow2"][0] == [maximum_tag(20 * GiB)]


def test_an_unreadable_image_is_named_and_the_rest_recorded(
        world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async def broken(path: str, **_: object) -> qemu_img.ImageInfo:
        raise CommandError(["qemu-img", "info", path], 1, "not a qcow2 image")

    monkeypatch.setattr(qemu_img, "info", broken)
    result = asyncio.run(record_maxima(settings(tmp_path), "thin1"))
    assert list(result.failed) == ["vm-101-disk-0.qcow2"]
    assert result.recorded == {"vm-103-disk-0": 2 * GiB}
