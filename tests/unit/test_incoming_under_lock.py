"""Live migration, the destination's side: a VM in ``inmigrate`` has its tables
compared with LVM under the storage lock on every look, so an extension the
source commits under that lock while the look reads LVM is refreshed here now,
not a backoff later (perhaps after the switchover).

Stand-ins: the storage lock (:class:`StandInGates`, which plays the source's
``lvextend`` committing while this node waits for the lock), LVM's metadata
and this node's device-mapper tables (``lvm.list_lvs``, ``device_size``,
``refresh`` patched over dicts).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import cast

import pytest

from pvestord.adapters import devices, lvm
from pvestord.adapters.config import parse_storage_config
from pvestord.adapters.lockheld import LockTimeout
from pvestord.adapters.qmp import ThinDriveView, VmBusyError
from pvestord.adapters.settings import DaemonSettings
from pvestord.adapters.vms import LocalVm
from pvestord.engine.drive import Drive
from pvestord.engine.extender import Extender
from pvestord.engine.lvfigures import LvFigures
from pvestord.engine.lvmchanges import LvmChanges, VgGates
from pvestord.engine.migration import catch_up_incoming
from pvestord.engine.status import Activity
from tests.harness.extenderbed import FAKE_LVM, LV, FakeQemu, running

MiB = 1024 * 1024
GiB = 1024 * MiB
VMID = 101
STORAGE = parse_storage_config("pvestord: thin1\n\tvgname san\n\tpvestord-chunksize 256M\n",
                               "storage.cfg").thin_storages["thin1"]


def drive(n: int, lv_size: int) -> Drive:
    """Drive ``n`` as the look found it: ``lv_size`` is LVM's word at the look."""
    lv = f"vm-{VMID}-disk-{n}.qcow2"
    view = ThinDriveView(f"file{n}", f"fmt{n}", f"/dev/san/{lv}", virtual_size=32 * GiB,
                         allocation=0, threshold=0)
    return Drive(view, "san", lv, STORAGE, maximum=33 * GiB, extent_size=4 * MiB,
                 lv_size=lv_size)


class StandInHeld:
    def require(self, seconds: float) -> None:
        assert seconds > 0


class StandInGates:
    """The storage lock: ``on_acquire`` runs as the lock is taken (what its
    last holder committed); ``busy`` makes every wait time out."""

    def __init__(self, on_acquire: Callable[[], None] = lambda: None) -> None:
        self.on_acquire = on_acquire
        self.holding = False
        self.acquired: list[str] = []
        self.busy = False

    @contextlib.asynccontextmanager
    async def locked(self, vg: str, storage: object,
                     budget: float = 10.0) -> AsyncIterator[StandInHeld]:
        if self.busy:
            raise LockTimeout("storage-thin1", budget, 65.0)
        self.on_acquire()
        self.acquired.append(vg)
        self.holding = True
        try:
            yield StandInHeld()
        finally:
            self.holding = False


class StandInFigures:
    def __init__(self) -> None:
        self.changed_vgs: list[str] = []

    def changed(self, vg: str) -> None:
        self.changed_vgs.append(vg)


@pytest.fixture
def lvm_state(monkeypatch: pytest.MonkeyPatch) -> tuple[dict[str, int], dict[str, int],
                                                       list[StandInGates]]:
    """(metadata, table) by LV name; the gates in use are appended to the list
    so the patched reads can check the lock is held."""
    metadata: dict[str, int] = {}
    table: dict[str, int] = {}
    gates: list[StandInGates] = []

    async def list_lvs(vg: str, **_: object) -> list[lvm.LvRow]:
        assert all(g.holding for g in gates), "LVM compared without the storage lock"
        return [lvm.LvRow(vg, lv, size, (), True, True, "-") for lv, size in metadata.items()]

    async def refresh(vg: str, lv: str, **_: object) -> None:
        assert all(g.holding for g in gates)
        table[lv] = metadata[lv]

    monkeypatch.setattr(lvm, "list_lvs", list_lvs)
    monkeypatch.setattr(lvm, "refresh", refresh)
    monkeypatch.setattr(lvm, "device_size", lambda vg, lv: table[lv])
    return metadata, table, gates


async def run(gates: StandInGates, drives: list[Drive],
              figures: StandInFigures | None = None) -> None:
    await catch_up_incoming(
        LocalVm(VMID, 1, Path("/nonexistent.qmp")), drives,
        gates=cast(VgGates, gates), figures=cast(LvFigures, figures or StandInFigures()),
        activity=Activity(), changes=LvmChanges())


async def test_an_extension_committed_during_the_look_is_refreshed_now(
        lvm_state: tuple[dict[str, int], dict[str, int], list[StandInGates]]) -> None:
    """The look read LVM (1 GiB, as this node's table) while the source's
    lvextend held the lock; it commits 1.25 GiB as the lock passes to us.
    Failed on the old code: compared without the lock, it saw nothing behind
    and did not take the lock, so the table stayed 1 GiB."""
    metadata, table, used = lvm_state
    lv = f"vm-{VMID}-disk-0.qcow2"
    metadata[lv] = table[lv] = GiB

    def source_commits() -> None:
        metadata[lv] = GiB + 256 * MiB

    gates = StandInGates(source_commits)
    used.append(gates)
    figures = StandInFigures()
    await run(gates, [drive(0, GiB)], figures)
    assert table[lv] == GiB + 256 * MiB
    assert gates.acquired == ["san"]
    assert figures.changed_vgs == ["san"]


async def test_one_lock_round_trip_per_vg_and_look(
        lvm_state: tuple[dict[str, int], dict[str, int], list[StandInGates]]) -> None:
    """Every look takes the lock (nothing behind or not), once for all the
    VM's drives on the VG: never one per drive, which the lock's other users
    would wait for."""
    metadata, table, used = lvm_state
    drives = [drive(n, GiB) for n in range(3)]
    for d in drives:
        metadata[d.lv] = table[d.lv] = GiB
    gates = StandInGates()
    used.append(gates)
    await run(gates, drives)
    await run(gates, drives)
    assert gates.acquired == ["san", "san"]


async def test_a_busy_lock_skips_the_look_without_failing_the_pass(
        lvm_state: tuple[dict[str, int], dict[str, int], list[StandInGates]]) -> None:
    """A failed pass would back off up to a minute, spacing the looks out
    when the switchover may come; the busy backoff's next look tries again."""
    metadata, table, used = lvm_state
    lv = f"vm-{VMID}-disk-0.qcow2"
    metadata[lv] = GiB + 256 * MiB
    table[lv] = GiB
    gates = StandInGates()
    gates.busy = True
    used.append(gates)
    await run(gates, [drive(0, GiB + 256 * MiB)])
    assert table[lv] == GiB  # the next look refreshes it


async def test_the_pass_over_an_inmigrate_vm_refreshes_under_the_lock(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The wiring: a whole :class:`~pvestord.engine.extender.Extender` pass
    over an ``inmigrate`` VM (the fake QEMU and ``lvm`` of
    tests/harness/extenderbed.py, a real lock directory) refreshes the
    table another node left behind, holding the storage lock, and leaves
    the VM for later."""
    class IncomingQemu(FakeQemu):
        def reply(self, command: str, arguments: dict[str, object]) -> object:
            if command == "query-status":
                return {"running": False, "status": "inmigrate"}
            return super().reply(command, arguments)

    script = tmp_path / "fake_lvm"
    script.write_text(FAKE_LVM)
    script.chmod(0o755)
    (tmp_path / "sizes.json").write_text(f'{{"{LV}": {GiB + 256 * MiB}}}')
    monkeypatch.setenv("PVESTORD_LVM", str(script))
    table = {LV: GiB}  # the source grew the LV; this node's table is as activated
    locks = tmp_path / "locks"
    locks.mkdir()

    async def refresh(vg: str, lv: str, **_: object) -> None:
        assert any(locks.iterdir()), "refreshed without the storage lock"
        table[lv] = GiB + 256 * MiB

    monkeypatch.setattr(lvm, "device_size", lambda vg, lv: table[lv])
    monkeypatch.setattr(lvm, "refresh", refresh)
    monkeypatch.setattr(devices, "open_block_devices", lambda pid, proc=None: None)
    settings = DaemonSettings(node="pve2", queue=tmp_path / "extend-queue",
                              nodes_dir=tmp_path / "nodes", run_dir=tmp_path, lock_dir=locks,
                              vg_health_dir=tmp_path / "marks", lvm_shell=False)
    storage = parse_storage_config(
        "lvm: san1\n\tvgname san\n\tshared 1\n\tpvestord-chunksize 256M\n", "storage.cfg")
    extender = Extender(settings, lambda: storage)
    vm = LocalVm(VMID, os.getpid(), tmp_path / f"{VMID}.qmp")
    try:
        async with running(IncomingQemu(tmp_path), vm.qmp_socket):
            with pytest.raises(VmBusyError, match="inmigrate"):
                await extender.handle(vm)
    finally:
        await extender.close()
    assert table[LV] == GiB + 256 * MiB
