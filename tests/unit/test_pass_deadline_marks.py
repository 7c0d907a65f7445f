"""What the pass deadline counts as "in the middle of an LVM change".

A pass abandoned at its deadline marks its VM's VGs unhealthy only while an
``lvm`` command that changes a VG runs for it: a pass that waited for the
storage lock (another node, Proxmox, a custodian holding it) left the VGs as
they were, and marking them would refuse every later extension on them from
this node until an operator looks.

The daemon is the real one, run in this process; the storage lock is held by
a real second process (``tests/harness/lockholder.py``) as another node would
hold it; QEMU is a stand-in on a real unix socket (:class:`StayingQemu`).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from pvestord import policy
from pvestord.adapters.config import parse_storage_config
from pvestord.adapters.qmp import ThinDriveView
from pvestord.adapters.settings import DaemonSettings
from pvestord.adapters.vms import LocalVm
from pvestord.engine.daemon import Daemon
from pvestord.engine.drive import Drive, RoundTimings
from pvestord.policy import Reason
from tests.harness.polling import wait_until_async

ROOT = Path(__file__).resolve().parents[2]
#: Bound of every wait for a real condition.
PATIENCE = 30.0
GiB = 1 << 30
MiB = 1 << 20
VMID = 4343
NODE = "f-scsi0"

STORAGE_CFG = "pvestord: thin1\n\tvgname san\n\tshared 1\n\tpvestord-chunksize 1G\n"


class StayingQemu:
    """Stands in for a VM's QEMU on its QMP socket: greets, and answers
    ``query-migrate`` with no migration (a VM that runs here and stays).
    Records the commands it was sent."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.commands: list[str] = []
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> StayingQemu:
        self._server = await asyncio.start_unix_server(self._serve, path=str(self.path))
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        greeting = {"QMP": {"version": {"qemu": {"major": 7, "minor": 2, "micro": 0},
                                        "package": ""}, "capabilities": []}}
        writer.write(json.dumps(greeting).encode() + b"\n")
        await writer.drain()
        # QMP clients need not end a command with a newline: one JSON value
        # after the other.
        decoder, pending = json.JSONDecoder(), ""
        while chunk := await reader.read(4096):
            pending += chunk.decode()
            while pending.strip():
                try:
                    message, end = decoder.raw_decode(pending.lstrip())
                except json.JSONDecodeError:
                    break  # the rest of a command still to come
                pending = pending.lstrip()[end:]
                self.commands.append(message["execute"])
                reply: dict[str, Any] = {"return": {}, "id": message.get("id")}
                writer.write(json.dumps(reply).encode() + b"\n")
                await writer.drain()
        writer.close()


async def another_node_holds(locks: Path, lock_id: str,
                             release: Path) -> asyncio.subprocess.Process:
    """A second process that takes ``lock_id`` and holds it until ``release`` exists."""
    holder = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.harness.lockholder", "--lock-dir", str(locks),
        "--id", lock_id, "--timeout", str(PATIENCE), "--hold-until", str(release),
        cwd=ROOT, stdout=subprocess.PIPE)
    assert holder.stdout is not None
    event = json.loads(await asyncio.wait_for(holder.stdout.readline(), PATIENCE))
    assert event["event"] == "acquired"
    return holder


def thin_drive(config_text: str) -> Drive:
    storage = parse_storage_config(config_text, "storage.cfg").get("thin1")
    assert storage is not None
    view = ThinDriveView(NODE, "fmt-scsi0", f"/dev/san/vm-{VMID}-disk-0.qcow2",
                         virtual_size=32 * GiB, allocation=GiB - MiB, threshold=GiB // 2)
    return Drive(view, "san", f"vm-{VMID}-disk-0.qcow2", storage, maximum=33 * GiB,
                 extent_size=4 * MiB, lv_size=GiB)


async def test_a_pass_that_waits_for_the_storage_lock_is_in_no_lvm_change(
        tmp_path: Path) -> None:
    locks, run = tmp_path / "locks", tmp_path / "run"
    locks.mkdir()
    run.mkdir()
    (tmp_path / "storage.cfg").write_text(STORAGE_CFG)
    settings = DaemonSettings(
        node="n1", queue=tmp_path / "extend-queue", storage_config=tmp_path / "storage.cfg",
        run_dir=run, nodes_dir=tmp_path / "nodes", inotify=False, lvm_shell=False,
        lock_dir=locks, vg_health_dir=tmp_path / "vg-unhealthy")
    engine = Daemon(settings)
    drive = thin_drive(STORAGE_CFG)
    state = drive.state(paused_nospace=True, reason=Reason.NOSPACE)
    decision = policy.decide(state)
    assert isinstance(decision, policy.Extend)
    release = tmp_path / "release"
    holder = await another_node_holds(locks, "storage-thin1", release)
    async with StayingQemu(run / f"{VMID}.qmp") as qemu:
        vm = LocalVm(VMID, 1, run / f"{VMID}.qmp")
        growth = asyncio.create_task(engine.extender.growth.extend(
            vm, drive, decision, state, RoundTimings()))
        try:
            await wait_until_async(lambda: "query-migrate" in qemu.commands, PATIENCE,
                                   "the migration check before the lock")
            # Past the QMP check, the extension waits for the lock the other node holds.
            assert not growth.done()
            assert engine.extender.activity.is_extending(VMID, NODE), \
                "status no longer shows the drive being extended"
            assert not engine.extender.lvm_changes.of_vm(VMID), \
                "a pass waiting for the storage lock counted as in the middle of an LVM change"
        finally:
            growth.cancel()
            await asyncio.gather(growth, return_exceptions=True)
            release.touch()
            await asyncio.wait_for(holder.wait(), PATIENCE)
    assert not (tmp_path / "vg-unhealthy").exists()
