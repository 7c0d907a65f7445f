"""One thin drive's pass through pvestord's Extender on the host, for unit tests:
QEMU a fake on a real Unix socket (:class:`FakeQemu`, served by :func:`running`),
``lvm`` a script (:data:`FAKE_LVM`) put in the way through ``PVESTORD_LVM``
that keeps the LVs' sizes in ``sizes.json`` and logs each ``lvextend``
(:func:`extensions`), the storage lock a real lock directory.

:func:`fake_lvm_bed` sets a test's folder up; two narrow hooks stand in for
what the host has not: the device-mapper table's size (no ``/dev/VG/LV``)
and QEMU's open file descriptors (no QEMU process).
"""

from __future__ import annotations

import asyncio
import json
import stat
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from pvestord.adapters import devices, lvm
from pvestord.adapters.settings import DaemonSettings
from tests.harness.fakeqmp import GREETING

MiB = 1024 * 1024
GiB = 1024 * MiB
VMID = 101
LV = "vm-101-disk-0.qcow2"
PATH = f"/dev/san/{LV}"

STORAGE_CFG = """\
lvm: san1
\tvgname san
\tshared 1
\tpvestord-chunksize 256M
"""

FAKE_LVM = """#!/usr/bin/env python3
import json, pathlib, sys
here = pathlib.Path(__file__).parent
sizes = json.loads((here / "sizes.json").read_text())
command = sys.argv[1]
if command == "lvextend":
    size = int(sys.argv[sys.argv.index("--size") + 1].removesuffix("b"))
    with open(here / "extensions", "a") as extensions:
        extensions.write(f"{sys.argv[-1]} {size}\\n")
    sizes[sys.argv[-1].split("/")[1]] = size
    (here / "sizes.json").write_text(json.dumps(sizes))
    sys.exit(0)
if command != "lvs":
    sys.exit("fake lvm: no " + command)
rows = [{"vg_name": "san", "lv_name": lv, "lv_size": str(size), "lv_tags": "",
         "vg_extent_size": str(4 << 20), "vg_free": str(64 << 30),
         "lv_active": "active", "lv_device_open": "open", "lv_attr": "-wi-ao----"}
        for lv, size in sizes.items()]
print(json.dumps({"report": [{"lv": rows}]}))
"""

class FakeQemu:
    """A running guest with one thin drive; how far it has written is
    :attr:`written`, its block jobs :attr:`jobs`."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.jobs: list[dict[str, Any]] = []
        self.threshold = 0
        self.written = 0

    def lv_size(self) -> int:
        sizes: dict[str, int] = json.loads((self.folder / "sizes.json").read_text())
        return sizes[LV]

    def fill(self) -> None:
        """The guest writes up to its LV's last MiB, past any threshold."""
        self.written = self.lv_size() - MiB

    def reply(self, command: str, arguments: dict[str, Any]) -> object:
        image = {"virtual-size": 32 * GiB, "filename": PATH, "format": "qcow2",
                 "cluster-size": 65536,
                 "format-specific": {"type": "qcow2", "data": {"refcount-bits": 16}}}
        size = self.lv_size()
        replies: dict[str, object] = {
            "qmp_capabilities": {},
            "query-status": {"running": True, "status": "running"},
            "query-block": [{"device": "drive-scsi0", "io-status": "ok",
                             "inserted": {"file": PATH, "node-name": "d0"}}],
            "query-block-jobs": self.jobs,
            "query-migrate": {},
            "query-named-block-nodes": [
                {"node-name": "d0", "drv": "qcow2", "file": PATH, "ro": False,
                 "image": image},
                {"node-name": "e0", "drv": "host_device", "file": PATH, "ro": False,
                 "write_threshold": self.threshold,
                 "image": {"virtual-size": size, "filename": PATH, "format": "host_device"}}],
            "query-blockstats": [{"node-name": "e0",
                                  "stats": {"wr_highest_offset": self.written}}],
            "qom-get": "enospc",
        }
        if command == "block-set-write-threshold":
            self.threshold = arguments["write-threshold"]
            return {}
        return replies.get(command)

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(json.dumps(GREETING).encode() + b"\r\n")
        await writer.drain()
        buffer = ""
        decoder = json.JSONDecoder()
        while chunk := await reader.read(65536):
            buffer += chunk.decode()
            while buffer.strip():
                try:
                    request, end = decoder.raw_decode(buffer.lstrip())
                except ValueError:
                    break
                buffer = buffer.lstrip()[end:]
                answer = self.reply(request["execute"], request.get("arguments", {}))
                message: dict[str, object] = (
                    {"return": answer} if answer is not None else
                    {"error": {"class": "CommandNotFound", "desc": request["execute"]}})
                if "id" in request:
                    message["id"] = request["id"]
                writer.write(json.dumps(message).encode() + b"\r\n")
                await writer.drain()
        writer.close()


@asynccontextmanager
async def running(qemu: FakeQemu, socket: Path) -> AsyncIterator[None]:
    server = await asyncio.start_unix_server(qemu.serve, path=str(socket))
    try:
        yield
    finally:
        server.close()
        await server.wait_closed()


def bed_settings(bed: Path) -> DaemonSettings:
    """The daemon's settings on the bed made by :func:`fake_lvm_bed`: node
    ``pve1``, its queue, VM configs, lock directories and VG marks in ``bed``."""
    (bed / "locks").mkdir(exist_ok=True)
    return DaemonSettings(node="pve1", queue=bed / "extend-queue", nodes_dir=bed / "nodes",
                          run_dir=bed, lock_dir=bed / "locks",
                          vg_health_dir=bed / "marks", lvm_shell=False)


def fake_lvm_bed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``tmp_path`` made the bed: the fake ``lvm`` in the way through
    ``PVESTORD_LVM``, :data:`LV` at 1 GiB, this node's device-mapper table
    following the metadata, and no QEMU file descriptors to look at."""
    script = tmp_path / "fake_lvm"
    script.write_text(FAKE_LVM)
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    (tmp_path / "sizes.json").write_text(json.dumps({LV: GiB}))
    monkeypatch.setenv("PVESTORD_LVM", str(script))

    def table_size(vg: str, lv: str) -> int:
        # This node's table follows the metadata: no other node grows here.
        sizes: dict[str, int] = json.loads((tmp_path / "sizes.json").read_text())
        return sizes[lv]

    monkeypatch.setattr(lvm, "device_size", table_size)
    monkeypatch.setattr(devices, "open_block_devices", lambda pid, proc=None: None)
    return tmp_path


def grown_to(size: int) -> str:
    return f"san/{LV} {size}"


def extensions(folder: Path) -> list[str]:
    """Each ``lvextend`` the fake ran: ``VG/LV size``."""
    done = folder / "extensions"
    return done.read_text().splitlines() if done.exists() else []
