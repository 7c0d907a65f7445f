"""The node guest really has LVM: the bed itself works as the other tests assume."""

from __future__ import annotations

from tests.harness.lvmbed import VG, MiB


def test_lv_grows_and_device_mapper_follows(vg: VG) -> None:
    vg.create_lv("bed", 64 * MiB)
    assert vg.lv_size("bed") == 64 * MiB
    assert vg.device_size("bed") == 64 * MiB
    from tests.harness.lvmbed import sh

    sh("lvextend", "-q", "-L", "+32m", f"{vg.name}/bed")
    assert vg.lv_size("bed") == 96 * MiB
    assert vg.device_size("bed") == 96 * MiB
