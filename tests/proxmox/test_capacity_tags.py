"""Each thin LV records its maximum in an LV tag, and the guards read it
there, through the real PVE::Storage, so that every node counts the same.

A node can measure only the images it has active; the others are other
nodes' VMs. The maximum is written with the LV (``pvestord-max-<bytes>``,
VG metadata every node reads), updated under the storage lock when a resize
grows the image, and ``max-overcommit`` counts every LV at it, active here
or not: the same judgement on every node.

LVM is the recording stand-in of :mod:`tests.proxmox.recorded`; LVs marked
``"active": false`` are reported inactive to pvestord, as another node's.
Runs on any machine with the Proxmox sources, the Perl modules and qemu-img.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
from pathlib import Path

from pvestord import policy
from pvestord.adapters import qemu_img
from pvestord.policy.capacity import maximum_from_tags, maximum_tag
from pvestord.policy.sizes import GiB, MiB
from tests.proxmox.recorded import (
    SHARED_VG,
    THIN1_SECTION,
    Bed,
    empty_vg_fixture,
    pvestord_section,
    storage_cfg_fixture,
)

VG = SHARED_VG
EXTENT = 4 * MiB
VG_SIZE = 20 * GiB
DISK = 4 * GiB
VOLNAME = "vm-100-disk-0.qcow2"
#: Another node's VM: active there only, so not readable here.
ELSEWHERE = "vm-200-disk-0.qcow2"
STORAGE_CFG = THIN1_SECTION + "\n" + pvestord_section("capped1", "pvestord-max-overcommit 2")


proxmox = storage_cfg_fixture(STORAGE_CFG)
bed = empty_vg_fixture(vg=VG, vg_size=VG_SIZE, extent=EXTENT)


def maximum_of(virtual_size: int) -> int:
    """pvestord's maximum of a new qcow2 of ``virtual_size`` (real qemu-img)."""
    measured = asyncio.run(qemu_img.measure(virtual_size))
    return policy.maximum_size(measured.fully_allocated, EXTENT)


def test_an_alloc_records_the_maximum_with_the_lv(bed: Bed) -> None:
    made = bed.try_alloc("thin1", 100, "qcow2", VOLNAME, DISK // 1024)
    assert made == {"volid": f"thin1:{VOLNAME}", "error": ""}
    assert bed.lvs()[VOLNAME]["tags"] == ["pve-vm-100", f"@pve-{VOLNAME}",
                                         maximum_tag(maximum_of(DISK))]


def another_nodes_lv(bed: Bed, *, recorded: int | None) -> None:
    """A 1 GiB LV of another node's VM (inactive here), its maximum recorded or not."""
    tags = ["pve-vm-200", f"@pve-{ELSEWHERE}"]
    if recorded is not None:
        tags.append(maximum_tag(recorded))
    bed.set_lvs({ELSEWHERE: {"size": 1 * GiB, "tags": tags, "virtual-size": recorded or GiB,
                             "active": False}})


def test_max_overcommit_counts_an_lv_inactive_here_at_its_recorded_maximum(bed: Bed) -> None:
    """20 GiB VG, cap 2 (40 GiB): another node's disk records 36 GiB; a new
    4 GiB disk brings the commitment past 40 GiB on whichever node asks.
    Before the tag, that LV counted at its 1 GiB here: 5 GiB, allowed."""
    another_nodes_lv(bed, recorded=36 * GiB)
    refused = bed.try_alloc("capped1", 100, "qcow2", VOLNAME, DISK // 1024)
    assert refused["volid"] == ""
    assert "pvestord-max-overcommit" in refused["error"], refused["error"]
    assert set(bed.lvs()) == {ELSEWHERE}
    assert not [c for c in bed.commands() if c[0] == "/sbin/lvcreate"]


def test_an_untagged_lv_counts_at_its_lv_size(bed: Bed) -> None:
    """Made before the tag or by Proxmox's lvm type: its LV size, a floor."""
    another_nodes_lv(bed, recorded=None)
    made = bed.try_alloc("capped1", 100, "qcow2", VOLNAME, DISK // 1024)
    assert made == {"volid": f"capped1:{VOLNAME}", "error": ""}


def qemu_img_on(tmp_path: Path, image: Path) -> Path:
    """A qemu-img that reads ``image`` wherever pvestord names an LV of the VG
    (the stand-in VG has no devices); everything else is the real qemu-img."""
    real = shutil.which("qemu-img")
    assert real is not None
    wrapper = tmp_path / "qemu-img"
    wrapper.write_text(
        f"#!{sys.executable}\nimport os, sys\n"
        f"args = [{str(image)!r} if a.startswith('/dev/{VG}/') else a for a in sys.argv[1:]]\n"
        f"os.execv({real!r}, [{real!r}, *args])\n")
    wrapper.chmod(0o755)
    return wrapper


def test_a_resize_records_the_new_maximum_under_the_storage_lock(bed: Bed,
                                                                 tmp_path: Path) -> None:
    made = bed.try_alloc("thin1", 100, "qcow2", VOLNAME, DISK // 1024)
    assert made["error"] == ""
    image = tmp_path / "image.qcow2"
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(image), str(DISK)],  # noqa: S603
                   check=True, timeout=60)
    bed.clear_log()
    bed.run(f'PVE::Storage::volume_resize($cfg, "thin1:{VOLNAME}", {12 * GiB}, 1);'
            'print "{}";', PVESTORD_QEMU_IMG=str(qemu_img_on(tmp_path, image)))
    old, new = maximum_tag(maximum_of(DISK)), maximum_tag(maximum_of(12 * GiB))
    assert maximum_from_tags(bed.lvs()[VOLNAME]["tags"]) == maximum_of(12 * GiB)
    assert bed.lvs()[VOLNAME]["tags"] == ["pve-vm-100", f"@pve-{VOLNAME}", new]
    retags = [(c, locks) for c, locks in bed.commands_and_locks() if c[0] == "/sbin/lvchange"
              and "--addtag" in c]
    assert [c for c, _ in retags] == [["/sbin/lvchange", "--deltag", old, "--addtag", new,
                                       f"/dev/{VG}/{VOLNAME}"]]
    assert all(locks for _, locks in retags), retags
