"""A peer's first message, read by hand: it says whether a QEMU or vzdump calls.

The same socket serves QEMU's monitor and vzdump. QEMU greets in QMP,
vzdump sends ``{"vzdump": {"vmid": "N"}}`` without a newline; qemu.qmp's
client would reject the latter before we could tell who is calling, so the
first message is read here, from the raw socket.
"""

from __future__ import annotations

import asyncio
import json
import socket

from qmeventd_py.peer import PeerError

#: The first message is a QMP greeting or vzdump's hello: a few hundred bytes.
HELLO_LIMIT = 64 * 1024


async def read_hello(conn: socket.socket) -> tuple[object, str]:
    """The peer's first JSON message, and whatever text followed it.

    vzdump sends its hello without a newline, so we parse as bytes arrive
    rather than reading a line.

    :raise PeerError: garbage, an over-long message, or EOF before a message.
    """
    loop = asyncio.get_running_loop()
    decoder = json.JSONDecoder()
    buf = b""
    while True:
        chunk = await loop.sock_recv(conn, HELLO_LIMIT - len(buf))
        if not chunk:
            raise PeerError(f"closed the connection after {len(buf)} bytes, before a"
                            " complete first message", why="closed")
        buf += chunk
        text = buf.decode(errors="replace").lstrip()
        if text and not text.startswith("{"):
            raise PeerError(f"sent garbage: {buf[:60]!r}", why="garbage")
        try:
            message, end = decoder.raw_decode(text)
        except (ValueError, RecursionError):
            # RecursionError: nesting deeper than the decoder's stack (found by
            # fuzzing); as invalid as any other JSON we cannot read.
            if b"\n" in buf:
                raise PeerError(f"sent invalid JSON: {buf[:60]!r}", why="garbage") from None
            if len(buf) >= HELLO_LIMIT:
                raise PeerError(f"first message is longer than {HELLO_LIMIT} bytes",
                                why="too-long") from None
            continue
        return message, text[end:]


def short(message: object) -> str:
    """``message`` for a log line: its repr, cut to 120 characters."""
    text = repr(message)
    return text if len(text) <= 120 else text[:117] + "..."
