"""A pass abandoned at its deadline in the middle of an LVM change marks
every thin VG that holds an active LV of its VM, snapshot LVs included."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

from pvestord.adapters.config import parse_storage_config
from pvestord.adapters.settings import DaemonSettings
from pvestord.engine.passes import Passes

STORAGES = ("pvestord: disks\n\tvgname vg_disks\n\n"
            "pvestord: snaps\n\tvgname vg_snaps\n\n"
            "pvestord: others\n\tvgname vg_others\n")


def active_lvs(dev: Path, vg: str, *lvs: str) -> None:
    (dev / vg).mkdir(parents=True)
    for lv in lvs:
        (dev / vg / lv).touch()


async def test_an_abandoned_pass_marks_the_vgs_of_its_chain_snapshots_included(
        tmp_path: Path) -> None:
    dev = tmp_path / "dev"
    active_lvs(dev, "vg_disks", "vm-100-disk-0.qcow2")
    # Only a snapshot of VM 100's chain here: the running QEMU has it open,
    # and a commit may be writing into it.
    active_lvs(dev, "vg_snaps", "snap_vm-100-disk-1_before-upgrade.qcow2")
    active_lvs(dev, "vg_others", "vm-1000-disk-0.qcow2", "snap_vm-1001-disk-0_s.qcow2")
    config = parse_storage_config(STORAGES, "storage.cfg")
    settings = DaemonSettings(node="n1", pass_deadline=0.01,
                              vg_health_dir=tmp_path / "vg-unhealthy")
    abandoned: list[int] = []
    passes = Passes(settings, config=lambda: config, changing=lambda vmid: True,
                    abandon=abandoned.append, dev=dev)
    never = asyncio.Event()

    async def in_the_middle_of_a_change() -> None:
        await never.wait()

    passes.start(100, in_the_middle_of_a_change(), 0.0)
    task = passes.running[100]
    with contextlib.suppress(asyncio.CancelledError):
        await task  # ends when its deadline cancels it
    assert abandoned == [100]
    assert sorted(passes.vg_health.marked()) == ["vg_disks", "vg_snaps"]
