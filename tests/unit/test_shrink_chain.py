"""``volume shrink`` of a disk with snapshots: every LV of the chain, all or none.

LVM and qemu-img are a small in-memory world (the functions
:mod:`pvestord.features.volumes.shrinking` calls, replaced); the storage
config, the storage locks (pmxcfs-style directories) and the cluster files
are real files. The chain is what the images' headers say, as Proxmox lays
it out: the top ``vm-202-disk-0.qcow2`` backed by ``snap_..._s2``, backed by
``snap_..._s1``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path

import pytest

from pvestord.adapters import lvm, qemu_img
from pvestord.errors import PvestordError
from pvestord.features.volumes import VolumeSettings, shrink, shrinking, storage
from pvestord.policy.capacity import COPY_TAG
from pvestord.policy.sizes import GiB, MiB
from pvestord.policy.volumes import ShrinkRefused, shrink_target

VG = "vgthin"
EXTENT = 4 * MiB
CHUNK = 256 * MiB
INITIAL = 512 * MiB
TOP = "vm-202-disk-0.qcow2"
S2 = "snap_vm-202-disk-0_s2.qcow2"
S1 = "snap_vm-202-disk-0_s1.qcow2"
VOLID = f"thin1:{TOP}"
CONFIG = f"""\
lvm: thin1
\tvgname {VG}
\tshared 1
\tpvestord-chunksize 256M
\tpvestord-initial-size 512M
"""
HERE = "nodea"


@dataclasses.dataclass
class FakeLv:
    size: int
    #: Where the image ends (qemu-img check) and what its header names as backing file.
    end: int
    backing: str | None
    active: bool = False
    open: bool = False
    tags: tuple[str, ...] = ()
    status: qemu_img.CheckStatus = qemu_img.CheckStatus.CLEAN


class World:
    """The VG's LVs and their images; every change and image read recorded."""

    def __init__(self, lvs: dict[str, FakeLv]) -> None:
        self.lvs = lvs
        self.calls: list[tuple[str, str]] = []

    async def lv_info(self, vg: str, lv: str, **_: object) -> lvm.LvInfo:
        assert vg == VG
        if lv not in self.lvs:
            raise lvm.LvMissingError(f"no LV {lv}")
        fake = self.lvs[lv]
        return lvm.LvInfo(vg, lv, fake.size, EXTENT, 100 * GiB, fake.active, fake.open,
                          fake.tags)

    async def activate(self, vg: str, lv: str) -> None:
        self.calls.append(("activate", lv))
        self.lvs[lv].active = True

    async def deactivate(self, vg: str, lv: str) -> None:
        self.calls.append(("deactivate", lv))
        self.lvs[lv].active = False

    async def reduce(self, vg: str, lv: str, size: int) -> None:
        self.calls.append(("lvreduce", lv))
        assert size < self.lvs[lv].size
        self.lvs[lv].size = size

    async def remove_tags(self, vg: str, lv: str, tags: list[str]) -> None:
        self.calls.append(("deltag", lv))
        self.lvs[lv].tags = tuple(t for t in self.lvs[lv].tags if t not in tags)

    def _lv(self, path: str | Path) -> FakeLv:
        vg, lv = str(path).split("/")[2:]
        assert vg == VG
        fake = self.lvs[lv]
        if not fake.active:
            raise PvestordError(f"qemu-img: Could not open '{path}': No such file")
        return fake

    async def info(self, path: str | Path, **_: object) -> qemu_img.ImageInfo:
        fake = self._lv(path)
        return qemu_img.ImageInfo(str(path), "qcow2", 8 * GiB, None, 65536, False, 16, (),
                                  fake.backing, "qcow2" if fake.backing else None, False,
                                  False)

    async def check(self, path: str | Path, **_: object) -> qemu_img.CheckResult:
        fake = self._lv(path)
        # qemu-img check opens the backing chain: every backing LV must be active.
        backing = fake.backing
        while backing is not None:
            behind = self._lv(f"/dev/{VG}/{backing}")
            backing = behind.backing
        self.calls.append(("check", str(path).rsplit("/", 1)[1]))
        leaks = 3 if fake.status is qemu_img.CheckStatus.LEAKS else 0
        return qemu_img.CheckResult(fake.status, fake.end, None, 100, None, leaks, 0, 0, "")

    def changes(self) -> list[tuple[str, str]]:
        return [c for c in self.calls if c[0] in ("lvreduce", "deltag")]


def chain_world() -> World:
    """A stopped disk with two snapshots, each LV grown past its data."""
    return World({
        TOP: FakeLv(2 * GiB, 40 * MiB, S2),
        S2: FakeLv(1536 * MiB, 300 * MiB, S1, tags=(COPY_TAG,)),
        S1: FakeLv(3 * GiB, 1 * GiB, None),
        "vm-203-disk-0.qcow2": FakeLv(3 * GiB, 1 * GiB, None),
    })


@pytest.fixture
def settings(tmp_path: Path) -> VolumeSettings:
    cfg = tmp_path / "storage.cfg"
    cfg.write_text(CONFIG)
    cluster = tmp_path / "pve"
    cluster.mkdir()
    (cluster / ".members").write_text(json.dumps({"nodename": HERE, "version": 1}))
    (cluster / ".vmlist").write_text(json.dumps(
        {"version": 1, "ids": {"202": {"node": HERE, "type": "qemu", "version": 1}}}))
    (cluster / ".rrd").write_text("")
    (tmp_path / "locks").mkdir()
    return VolumeSettings(storage_config=cfg, run_dir=tmp_path / "run", cluster_dir=cluster,
                          lock_dir=tmp_path / "locks", vg_health_dir=tmp_path / "marks")


def install(world: World, monkeypatch: pytest.MonkeyPatch) -> World:
    for name in ("lv_info", "activate", "deactivate", "reduce", "remove_tags"):
        monkeypatch.setattr(lvm, name, getattr(world, name))
    for name in ("info", "check"):
        monkeypatch.setattr(qemu_img, name, getattr(world, name))
    return world


@pytest.fixture
def world(monkeypatch: pytest.MonkeyPatch) -> World:
    return install(chain_world(), monkeypatch)


def run_shrink(settings: VolumeSettings, *, dry_run: bool = False) -> shrinking.Shrunk:
    return asyncio.run(asyncio.wait_for(shrink(settings, VOLID, dry_run=dry_run), 60))


def target(lv: FakeLv) -> int:
    return shrink_target(lv.size, lv.end, CHUNK, INITIAL, EXTENT)


def test_every_lv_of_the_chain_is_reduced_and_left_inactive(
        settings: VolumeSettings, world: World) -> None:
    expected = {name: target(world.lvs[name]) for name in (TOP, S2, S1)}
    result = run_shrink(settings)
    assert [row.lv for row in result.chain] == [TOP, S2, S1]
    assert {row.lv: row.lv_size_after for row in result.chain} == expected
    assert {name: world.lvs[name].size for name in expected} == expected
    assert expected[TOP] == INITIAL and expected[S1] == GiB + CHUNK
    assert result.reclaimed == sum(
        row.lv_size_before - row.lv_size_after for row in result.chain) > 0
    assert (result.lv_size_before, result.lv_size_after) == (2 * GiB, INITIAL)
    assert COPY_TAG not in world.lvs[S2].tags
    assert not any(lv.active for lv in world.lvs.values())
    # Another disk's LV is never touched.
    assert all(lv != "vm-203-disk-0.qcow2" for _, lv in world.calls)


def test_every_image_is_checked_before_any_lv_is_reduced(
        settings: VolumeSettings, world: World) -> None:
    run_shrink(settings)
    first_reduce = [kind for kind, _ in world.calls].index("lvreduce")
    assert {lv for kind, lv in world.calls[:first_reduce] if kind == "check"} == {TOP, S2, S1}


def test_dry_run_lists_each_lv_and_changes_nothing(settings: VolumeSettings,
                                                   world: World) -> None:
    sizes = {name: lv.size for name, lv in world.lvs.items()}
    result = run_shrink(settings, dry_run=True)
    assert [(row.lv, row.lv_size_before, row.target) for row in result.chain] == [
        (name, sizes[name], target(world.lvs[name])) for name in (TOP, S2, S1)]
    assert all(row.lv_size_after == row.lv_size_before for row in result.chain)
    assert world.changes() == []
    assert {name: lv.size for name, lv in world.lvs.items()} == sizes
    assert not any(lv.active for lv in world.lvs.values())


@pytest.mark.parametrize(("lv", "change", "message"), [
    (S2, {"active": True}, rf"thin1:{S2}: the LV {VG}/{S2} is active on this node"),
    (S1, {"open": True}, rf"thin1:{S1}: the LV {VG}/{S1} is open on this node"),
    (S1, {"status": qemu_img.CheckStatus.LEAKS}, rf"thin1:{S1}: the image has 3 leaked"),
    (S1, {"backing": "base-200-disk-0.qcow2"},
     rf"thin1:{S1}: its backing file 'base-200-disk-0.qcow2' is not a snapshot LV"),
    (S1, {"backing": "../mapper/x"}, rf"thin1:{S1}: its backing file '../mapper/x'"),
    (S1, {"backing": "snap_vm-202-disk-0_gone.qcow2"}, r"does not exist"),
    (S1, {"backing": TOP}, r"is not a snapshot LV"),
])
def test_a_refusal_on_any_lv_leaves_every_lv_as_it_was(
        settings: VolumeSettings, world: World, lv: str, change: dict[str, object],
        message: str) -> None:
    world.lvs[lv] = dataclasses.replace(world.lvs[lv], **change)  # type: ignore[arg-type]
    was_active = {name for name, fake in world.lvs.items() if fake.active}
    sizes = {name: fake.size for name, fake in world.lvs.items()}
    with pytest.raises(ShrinkRefused, match=message):
        run_shrink(settings)
    assert world.changes() == []
    assert {name: fake.size for name, fake in world.lvs.items()} == sizes
    # What shrink activated is inactive again; what it found active, it left.
    assert {name for name, fake in world.lvs.items() if fake.active} == was_active


def test_a_loop_in_the_chain_is_refused(settings: VolumeSettings, world: World) -> None:
    world.lvs[S1].backing = S2
    with pytest.raises(ShrinkRefused, match=r"loops back to"):
        run_shrink(settings)
    assert world.changes() == []
    assert not any(lv.active for lv in world.lvs.values())


def test_an_lv_changed_under_the_lock_refuses_them_all(
        settings: VolumeSettings, monkeypatch: pytest.MonkeyPatch, world: World) -> None:
    """Another node's lvextend of the last LV between the check and the lock:
    the first LVs are not reduced either."""
    real_locked = storage.locked

    def locked(*args: object, **kw: object):  # type: ignore[no-untyped-def]
        world.lvs[S1].size += EXTENT
        return real_locked(*args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(shrinking, "locked", locked)
    with pytest.raises(ShrinkRefused, match=rf"thin1:{S1}: the LV changed size meanwhile"):
        run_shrink(settings)
    assert world.changes() == []
    assert not any(lv.active for lv in world.lvs.values())


def test_a_disk_without_snapshots_is_one_lv(settings: VolumeSettings,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    world = install(World({TOP: FakeLv(2 * GiB, 40 * MiB, None)}), monkeypatch)
    result = run_shrink(settings)
    assert [(row.lv, row.lv_size_after) for row in result.chain] == [(TOP, INITIAL)]
    assert result.reclaimed == 2 * GiB - INITIAL
    assert world.calls == [("activate", TOP), ("check", TOP), ("lvreduce", TOP),
                           ("check", TOP), ("deactivate", TOP)]
