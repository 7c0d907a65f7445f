"""A reconcile sweep reads each VG with one ``lvs``, not one per drive.

The ``lvm`` here is a fake (``fake_lvm`` below, put in the way through
``PVESTORD_LVM`` as the fault suite does with its wrapper): this machine has
no device-mapper, and what is checked is how many times pvestord runs LVM and
which answer it believes, not what LVM does.
"""

from __future__ import annotations

import asyncio
import json
import stat
from pathlib import Path
from typing import cast

import pytest

from pvestord.adapters import vgspace
from pvestord.adapters.command import Completed
from pvestord.adapters.lvm import LvInfo
from pvestord.adapters.lvmshell import LvmShells
from pvestord.adapters.settings import DaemonSettings
from pvestord.engine import nodereport
from pvestord.engine.lvfigures import LvFigures

MiB = 1024 * 1024

FAKE_LVM = """#!/usr/bin/env python3
import json, pathlib, sys, time
here = pathlib.Path(__file__).parent
with open(here / "calls", "a") as calls:
    calls.write(" ".join(sys.argv[1:2]) + "\\n")
time.sleep(0.2)  # long enough for concurrent callers to overlap
sizes = json.loads((here / "sizes.json").read_text())
rows = [{"vg_name": "vg1", "lv_name": lv, "lv_size": str(size), "lv_tags": "",
         "vg_extent_size": str(4 << 20), "vg_free": "0",
         "lv_active": "active", "lv_device_open": "open", "lv_attr": "-wi-ao----"}
        for lv, size in sizes.items()]
print(json.dumps({"report": [{"lv": rows}]}))
"""


@pytest.fixture
def fake_lvm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    script = tmp_path / "fake_lvm"
    script.write_text(FAKE_LVM)
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    (tmp_path / "sizes.json").write_text(json.dumps({"vm-1-disk-0": 64 * MiB,
                                                     "vm-2-disk-0": 96 * MiB}))
    monkeypatch.setenv("PVESTORD_LVM", str(script))
    return tmp_path


def calls(folder: Path) -> list[str]:
    path = folder / "calls"
    return path.read_text().split() if path.exists() else []


def lv_figures() -> LvFigures:
    """Figures that know vg1's extent size (as after any earlier read of it)."""
    figures = LvFigures(DaemonSettings(node="n1"), shells=None)
    figures.remember(LvInfo("vg1", "earlier", 4 * MiB, 4 * MiB, 0, active=True, open=False))
    return figures


async def test_concurrent_reconciles_share_one_vg_report(fake_lvm: Path) -> None:
    figures = lv_figures()
    sizes = await asyncio.gather(
        figures.sizes_of("vg1", "vm-1-disk-0", fresh=True, shared=True),
        figures.sizes_of("vg1", "vm-2-disk-0", fresh=True, shared=True))
    assert list(sizes) == [(64 * MiB, 4 * MiB), (96 * MiB, 4 * MiB)]
    assert calls(fake_lvm) == ["lvs"]


async def test_our_own_change_is_never_answered_from_an_older_report(fake_lvm: Path) -> None:
    figures = lv_figures()
    await figures.sizes_of("vg1", "vm-1-disk-0", fresh=True, shared=True)
    (fake_lvm / "sizes.json").write_text(json.dumps({"vm-1-disk-0": 128 * MiB}))
    figures.changed("vg1")  # what an extension does after its lvextend
    assert await figures.sizes_of("vg1", "vm-1-disk-0", fresh=True, shared=True) == (
        128 * MiB, 4 * MiB)
    assert calls(fake_lvm) == ["lvs", "lvs"]


class FakeShells:
    """Stands in for :class:`~pvestord.adapters.lvmshell.LvmShells` (a fake:
    no lvm shell runs on this machine): records each command and answers
    like LVM's JSON report."""

    def __init__(self) -> None:
        self.commands: list[tuple[str, str]] = []

    async def run(self, vg: str, argv: list[str], *, timeout: float,  # noqa: ASYNC109 - LvmShells.run
                  check: bool = True) -> Completed:
        self.commands.append((vg, argv[1]))
        if argv[1] == "vgs":
            row = {"vg_name": vg, "vg_size": str(1024 * MiB), "vg_free": str(512 * MiB),
                   "vg_extent_size": str(4 * MiB), "pv_count": "1",
                   "vg_missing_pv_count": "0", "vg_mda_free": "500000",
                   "vg_mda_size": "1000000"}
            return Completed(argv, json.dumps({"report": [{"vg": [row]}]}), "", 0)
        row = {"vg_name": vg, "lv_name": "vm-1-disk-0.qcow2", "lv_size": str(64 * MiB),
               "lv_tags": "", "lv_active": "active", "lv_device_open": "open",
               "lv_attr": "-wi-ao----"}
        return Completed(argv, json.dumps({"report": [{"lv": [row]}]}), "", 0)


async def test_periodic_reports_run_in_the_vgs_lvm_shell(fake_lvm: Path) -> None:
    """At idle the daemon starts no LVM process. The node report's
    ``vgs``, the capacity account's ``vgs`` and ``lvs`` and a sweep's shared
    ``lvs`` all go to the VG's shell when there is one."""
    shells = FakeShells()
    typed = cast(LvmShells, shells)
    view = await nodereport.probe("vg1", timeout=10, shells=typed)
    account = await vgspace.read_account("vg1", shells=typed)
    figures = LvFigures(DaemonSettings(node="n1"), shells=typed)
    figures.remember(LvInfo("vg1", "earlier", 4 * MiB, 4 * MiB, 0, active=True, open=False))
    size, _ = await figures.sizes_of("vg1", "vm-1-disk-0.qcow2", fresh=True, shared=True)
    assert (view.visible, view.lvm_ok, view.free) == (True, True, 512 * MiB)
    assert (account.size, account.free) == (1024 * MiB, 512 * MiB)
    assert size == 64 * MiB
    assert shells.commands == [("vg1", "vgs"), ("vg1", "vgs"), ("vg1", "lvs"), ("vg1", "lvs")]
    assert calls(fake_lvm) == []  # not one process


async def test_a_name_that_now_names_another_device_is_read_again(fake_lvm: Path) -> None:
    """A live snapshot renames the disk's LV away and gives its name to a new,
    smaller LV: the size remembered under the name was the old LV's."""
    figures = lv_figures()
    old_device, new_device = 0xFD01, 0xFD02
    assert await figures.sizes_of("vg1", "vm-1-disk-0", fresh=True,
                                  device=old_device) == (64 * MiB, 4 * MiB)
    (fake_lvm / "sizes.json").write_text(json.dumps({"vm-1-disk-0": 32 * MiB}))
    # The event path reads no LVM for the device it knows ...
    assert await figures.sizes_of("vg1", "vm-1-disk-0", fresh=False,
                                  device=old_device) == (64 * MiB, 4 * MiB)
    assert calls(fake_lvm) == ["lvs"]
    # ... but the name's new device is another LV: read, not remembered.
    assert await figures.sizes_of("vg1", "vm-1-disk-0", fresh=False,
                                  device=new_device) == (32 * MiB, 4 * MiB)
    assert calls(fake_lvm) == ["lvs", "lvs"]
