"""Blocking work (a tree's removal, a scan of a folder) off the controller's event loop."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable
from typing import Any, TypeVar

_T = TypeVar("_T")


async def off_loop(call: Callable[..., _T], *args: Any) -> _T:
    """`call(*args)`, once, in a thread, off the event loop; on the loop where no thread can start.

    A thread counts against the sandbox's pids limit, which concurrent runs
    can fill, and a removal that fails for that retires the whole sandbox. The
    executor queues the call before it starts a thread, so when the start
    fails the call is still queued: whichever of the loop and a worker comes
    first runs it, and the other only waits for its result (run twice, a
    removal could hit a folder that is by then another job's).
    """
    outcome: concurrent.futures.Future[_T] = concurrent.futures.Future()
    claim = threading.Lock()

    def once() -> None:
        if not claim.acquire(blocking=False):
            return
        try:
            outcome.set_result(call(*args))
        except BaseException as exc:
            outcome.set_exception(exc)

    try:
        asyncio.get_running_loop().run_in_executor(None, once)
    except RuntimeError:  # "can't start new thread"
        once()
    return await asyncio.wrap_future(outcome)
