"""An event before QEMU's greeting costs one more connection, not a failed pass.

QEMU's QMP monitor goes back to capabilities negotiation only when its I/O
thread handles a new connection; an event emitted by the main loop just
before (a RESUME after another client's ``cont``) reaches the new client ahead
of the greeting. That race cannot be made to order with a real QEMU, so the
peer here is a stand-in on a real Unix socket that sends exactly what QEMU
sends in it.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from pvestord.adapters.qmp import QmpError, VmMonitor
from tests.harness.fakeqmp import GREETING, fake_qemu, read_message

RESUME = {"timestamp": {"seconds": 1, "microseconds": 2}, "event": "RESUME"}


class RacingQemuStandIn:
    """Sends an event before the greeting on the first ``racy`` connections."""

    def __init__(self, racy: int) -> None:
        self.racy = racy
        self.connections = 0

    async def __call__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        if self.connections <= self.racy:
            writer.write(json.dumps(RESUME).encode() + b"\r\n")
        writer.write(json.dumps(GREETING).encode() + b"\r\n")
        await writer.drain()
        while True:
            try:
                request = await read_message(reader)
            except EOFError:
                return
            reply: dict[str, object] = {"return": {"status": "running", "running": True}
                                        if request["execute"] == "query-status" else {}}
            if "id" in request:
                reply["id"] = request["id"]
            writer.write(json.dumps(reply).encode() + b"\r\n")
            await writer.drain()


async def test_an_event_before_the_greeting_is_answered_by_one_more_connection(
        tmp_path: Path) -> None:
    sock = tmp_path / "100.qmp"
    peer = RacingQemuStandIn(racy=1)
    async with fake_qemu(sock, peer), VmMonitor(sock, "VM 100", timeout=5) as monitor:
        status = await monitor.execute("query-status")
    assert status == {"status": "running", "running": True}
    assert peer.connections == 2


async def test_a_peer_that_never_greets_first_is_refused_after_two_connections(
        tmp_path: Path) -> None:
    sock = tmp_path / "101.qmp"
    peer = RacingQemuStandIn(racy=1000)
    async with fake_qemu(sock, peer):
        with pytest.raises(QmpError, match="cannot connect"):
            async with VmMonitor(sock, "VM 101", timeout=5):
                pass
    assert peer.connections == 2
