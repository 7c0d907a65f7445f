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

import pytest

from pvestord.adapters.lvm import LvInfo
from pvestord.adapters.settings import DaemonSettings
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
