"""Set up and tear down benchmark fixtures side by side instead of one after another.

Setting up a bed in the node guest is mostly waiting on single-threaded work
(LVM start-up, Python start-up of the daemons, QEMU creating its QMP
sockets); the guest has two CPUs, so fixtures set up in parallel threads cost
about half. Only set-up and tear-down run in parallel: what a scenario
measures still runs alone.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from types import TracebackType
from typing import Any, TypeVar

T = TypeVar("T")

#: ``losetup --find`` picks a free loop device and then claims it: two at once
#: may pick the same one. Loop VGs are created one at a time.
_LOOP_SETUP = threading.Lock()


@contextlib.contextmanager
def one_at_a_time(manager: AbstractContextManager[T]) -> Iterator[T]:
    """Enter ``manager`` under the loop set-up lock; its exit runs freely."""
    with _LOOP_SETUP:
        value = manager.__enter__()
    try:
        yield value
    except BaseException as err:
        if not manager.__exit__(type(err), err, err.__traceback__):
            raise
    else:
        manager.__exit__(None, None, None)


def enter_together(stack: contextlib.ExitStack, managers: Sequence[AbstractContextManager[Any]],
                   *, parallel: int | None = None) -> list[Any]:
    """Enter every manager, ``parallel`` at a time; they exit together when ``stack`` closes.

    Every manager that entered is registered for exit before a failure of
    another is raised, so nothing is left running.
    """
    workers = max(1, min(parallel or len(managers), len(managers)))
    with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
        futures = [pool.submit(manager.__enter__) for manager in managers]
        concurrent.futures.wait(futures)
    entered = [m for m, f in zip(managers, futures, strict=True) if f.exception() is None]

    def exit_entered(exc_type: type[BaseException] | None, exc: BaseException | None,
                     tb: TracebackType | None) -> bool:
        exit_together(entered, exc_type, exc, tb)
        return False

    stack.push(exit_entered)
    return [f.result() for f in futures]


def exit_together(managers: Sequence[AbstractContextManager[object]],
                  exc_type: type[BaseException] | None = None, exc: BaseException | None = None,
                  tb: TracebackType | None = None) -> None:
    """Exit every manager in parallel (each told of ``exc``); raise the first failure."""
    if not managers:
        return
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(managers)) as pool:
        futures = [pool.submit(m.__exit__, exc_type, exc, tb) for m in managers]
    for future in futures:
        future.result()


def map_together(function: Callable[[T], object], items: Sequence[T],
                 parallel: int | None = None) -> None:
    """``function(item)`` for every item, ``parallel`` at a time; the first failure raised."""
    if not items:
        return
    workers = max(1, min(parallel or len(items), len(items)))
    with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
        futures = [pool.submit(function, item) for item in items]
    for future in futures:
        future.result()
