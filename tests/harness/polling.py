"""The one way tests wait: poll a real condition until a deadline.

A test waits for what it means (a file, a size, a log field), never for a
fixed sleep; on timeout the error names what it waited for and how long.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable


# Callable[..., object]: callers capture loop variables as lambda defaults
# (``lambda vm=vm: ...``), which mypy cannot match to a no-argument callable.
def wait_until(condition: Callable[..., object], timeout: float, what: str,
               interval: float = 0.1) -> None:
    """Poll ``condition()`` until it is true.

    :raises TimeoutError: ``timed out after <timeout> s waiting for <what>``.
    """
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)


async def wait_until_async(
        condition: Callable[..., object],
        timeout: float,  # noqa: ASYNC109 - the same signature as wait_until's
        what: str, interval: float = 0.05) -> None:
    """:func:`wait_until` for async tests: the event loop runs meanwhile."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:g} s waiting for {what}")
        await asyncio.sleep(interval)
