"""off_loop: a blocking call in a thread, or on the loop when no thread can start (the pids limit)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from typing import Any

import pytest

from sandboxd.agent.host.offloop import off_loop


def test_a_removal_runs_on_the_loop_when_no_thread_can_start(monkeypatch: pytest.MonkeyPatch) -> None:
    """Threads count against the sandbox's pids limit, which concurrent runs can fill; a release that failed for
    that would retire the sandbox with every job and session in it."""
    removed: list[str] = []

    async def scenario() -> None:
        loop = asyncio.get_running_loop()

        def no_thread(*args: Any) -> None:
            raise RuntimeError("can't start new thread")

        monkeypatch.setattr(loop, "run_in_executor", no_thread)
        await off_loop(removed.append, "/tmp/sandboxd/100500")

    asyncio.run(scenario())
    assert removed == ["/tmp/sandboxd/100500"]


def test_a_call_off_the_loop_runs_once_when_no_thread_can_start(monkeypatch: pytest.MonkeyPatch) -> None:
    """The executor queues a call before it starts a thread: when the start failed, the loop ran the call and a
    worker that came free later ran it again (a removal then hit a folder that was another job's by then)."""
    calls: list[int] = []

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        executor = concurrent.futures.ThreadPoolExecutor(max_workers=2)
        loop.set_default_executor(executor)
        busy = threading.Event()
        holding = loop.run_in_executor(None, busy.wait)  # the one worker there is, busy

        def no_thread(self: threading.Thread) -> None:
            raise RuntimeError("can't start new thread")

        monkeypatch.setattr(threading.Thread, "start", no_thread)
        assert await off_loop(calls.append, 1) is None  # type: ignore[func-returns-value]
        monkeypatch.undo()
        busy.set()
        await holding
        executor.shutdown(wait=True)  # the worker has taken the queued call by now

    asyncio.run(scenario())
    assert calls == [1]
