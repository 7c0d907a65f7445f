"""A QEMU's QMP monitor faked on a real Unix socket, for the unit tests of
pvestord's QMP client (a hung or racing QEMU cannot be made to order on the host).

:func:`fake_qemu` serves one handler per connection at a socket path;
:func:`read_message` reads one request as QEMU does, without waiting for a
newline; :data:`GREETING` is QEMU 7.2's.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

GREETING = {"QMP": {"version": {"qemu": {"major": 7, "minor": 2, "micro": 0},
                                "package": ""}, "capabilities": []}}

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@asynccontextmanager
async def fake_qemu(path: Path, handler: Handler) -> AsyncIterator[None]:
    server = await asyncio.start_unix_server(handler, path=str(path))
    try:
        yield
    finally:
        server.close()
        # Python 3.12.1+ wait_closed() waits for the handlers too; ours sleep.
        for task in [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]:
            task.cancel()


async def read_message(reader: asyncio.StreamReader) -> dict[str, object]:
    """One JSON object; qemu.qmp, like QEMU, sends no newline after it."""
    buffer = b""
    while True:
        chunk = await reader.read(4096)
        if not chunk:
            raise EOFError("client hung up")
        buffer += chunk
        try:
            message, _ = json.JSONDecoder().raw_decode(buffer.decode())
        except ValueError:
            continue
        assert isinstance(message, dict)
        return message
