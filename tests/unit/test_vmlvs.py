"""A VM's LVs on every thin VG (pvestord.adapters.vmlvs): what rank-nodes and
the migration hint both read."""

from __future__ import annotations

import pytest

from pvestord.adapters import lvm, vmlvs
from pvestord.adapters.config import parse_storage_config
from pvestord.adapters.lvm import LvRow

CFG = """lvm: thin
\tvgname san
\tpvestord-chunksize 1G

lvm: thin-too
\tvgname san
\tpvestord-chunksize 1G

lvm: thick
\tvgname other

lvm: thin2
\tvgname san2
\tpvestord-chunksize 256M
"""
ROWS = {
    "san": [LvRow("san", "vm-10-disk-0.qcow2", 1 << 30, (), True, False, "-"),
            LvRow("san", "vm-11-disk-0.qcow2", 1 << 30, (), True, False, "-")],
    "other": [LvRow("other", "vm-10-disk-0.qcow2", 1 << 30, (), True, False, "-")],
    "san2": [LvRow("san2", "vm-10-disk-1.qcow2", 1 << 30, (), False, False, "-")],
}


@pytest.fixture
def listed(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    calls: list[str] = []

    async def list_lvs(vg: str, **_: object) -> list[LvRow]:
        calls.append(vg)
        if vg not in ROWS:
            raise lvm.LvMissingError(f"no VG {vg}")
        return ROWS[vg]

    monkeypatch.setattr(lvm, "list_lvs", list_lvs)
    return calls


async def test_each_thin_vg_is_listed_once_and_every_storage_on_it_counts(
        listed: list[str]) -> None:
    config = parse_storage_config(CFG, "storage.cfg")
    found = await vmlvs.find_vm_lvs(config, 10, active_only=False)
    assert listed == ["san", "san2"]
    assert sorted((s.storeid, r.lv) for s, r in found) == [
        ("thin", "vm-10-disk-0.qcow2"), ("thin-too", "vm-10-disk-0.qcow2"),
        ("thin2", "vm-10-disk-1.qcow2")]
    active = await vmlvs.find_vm_lvs(config, 10)
    assert {s.storeid for s, _ in active} == {"thin", "thin-too"}


async def test_a_vg_that_cannot_be_listed_is_said_as_the_caller_wants(
        listed: list[str]) -> None:
    config = parse_storage_config(CFG.replace("vgname san2", "vgname gone"), "storage.cfg")
    with pytest.raises(lvm.LvMissingError):
        await vmlvs.find_vm_lvs(config, 10)

    def failed(storeid: str, vgname: str, err: lvm.LvmError) -> Exception:
        return RuntimeError(f"{storeid} {vgname}: {err}")

    with pytest.raises(RuntimeError, match="thin2 gone: no VG gone"):
        await vmlvs.find_vm_lvs(config, 10, failed=failed)
