"""A QEMU that accepts and never answers must cost one budget, not a hang.

The peers here are fakes on a real Unix socket (a hung QEMU cannot be made to
order on the host; the node tier stops a real one with SIGSTOP): one never
greets, one greets and answers ``qmp_capabilities`` and then goes silent.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from pvestord.adapters.qmp import QmpTimeout, VmMonitor
from tests.harness.fakeqmp import GREETING, fake_qemu, read_message


async def never_greets(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await asyncio.sleep(3600)




async def silent_after_capabilities(reader: asyncio.StreamReader,
                                    writer: asyncio.StreamWriter) -> None:
    writer.write(json.dumps(GREETING).encode() + b"\r\n")
    await writer.drain()
    request = await read_message(reader)
    assert request["execute"] == "qmp_capabilities"
    reply: dict[str, object] = {"return": {}}
    if "id" in request:
        reply["id"] = request["id"]
    writer.write(json.dumps(reply).encode() + b"\r\n")
    await writer.drain()
    await asyncio.sleep(3600)


async def test_a_socket_that_never_greets_times_out(tmp_path: Path) -> None:
    sock = tmp_path / "100.qmp"
    async with fake_qemu(sock, never_greets):
        with pytest.raises(QmpTimeout, match=r"VM 100: QMP socket .* did not greet within 0.3 s"):
            async with VmMonitor(sock, "VM 100", timeout=0.3):
                pass


async def test_a_command_that_never_answers_times_out(tmp_path: Path) -> None:
    sock = tmp_path / "101.qmp"
    async with fake_qemu(sock, silent_after_capabilities), \
            VmMonitor(sock, "VM 101", timeout=0.3) as monitor:
        with pytest.raises(QmpTimeout, match=r"VM 101: query-status got no answer within 0\.3 s"):
            await monitor.execute("query-status")
