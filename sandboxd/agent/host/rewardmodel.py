"""The reward-model side of the agent: one scorer process per sandbox, fed in batches.

The controller never imports torch. It starts the scorer (``python -m
sandboxd.agent.forked.scorer``) once per sandbox, before
the sandbox reports ready: the scorer loads the model from the read-only
mount, scores one warm-up pair, says ``ready`` (or why it failed), and then
serves batches over a socket pair, dropping to an unprivileged uid before the
first one. A CPU-loaded
model is therefore part of the memory a snapshot captures, and a restored
clone starts with it loaded.

Jobs arrive one pair each, concurrently, from the daemon. The Batcher
collects them for up to ``batch_wait_ms`` after the oldest arrived, or until
``max_batch`` are waiting, and sends them as one batch; while the scorer works
on a batch the next one fills. Every job gets one answer: a score, a status
for its pair (rejected, memory_limit), ``internal`` when the model failed to
load, ``timeout`` past its deadline. A scorer that dies or hangs damages the
sandbox; the daemon replaces it and retries the job elsewhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from sandboxd.agent.host.errors import SandboxDamaged
from sandboxd.agent.messages import JobResult
from sandboxd.agent.protocol import ProtocolError, encode_frame, read_frame

# A quarter of the frame limit (protocol.MAX_FRAME_BYTES) per frame to the scorer.
FRAME_BUDGET_BYTES = 16 << 20
Item = TypeVar("Item")
Outcome = TypeVar("Outcome")


@dataclass
class _Waiting(Generic[Item, Outcome]):
    item: Item
    future: asyncio.Future[Outcome]
    arrived: float = field(default_factory=time.monotonic)


class Batcher(Generic[Item, Outcome]):
    """Dynamic batching: concurrent submit() calls become batches of up to ``max_batch`` items.

    A batch leaves when ``max_batch`` items wait or ``wait_seconds`` after its oldest item
    arrived, whichever comes first; one batch is in flight at a time (the scorer is one
    process), and the next fills meanwhile. ``score_batch`` returns one outcome per item, in
    order; if it raises, every item of that batch gets the exception.
    """

    def __init__(self, score_batch: Callable[[list[Item]], Awaitable[list[Outcome]]], max_batch: int,
                 wait_seconds: float) -> None:
        self.score_batch = score_batch
        self.max_batch = max_batch
        self.wait_seconds = wait_seconds
        self.batches = 0
        self.items = 0
        self.largest = 0
        self._queue: deque[_Waiting[Item, Outcome]] = deque()
        self._arrived = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._loop())

    async def close(self) -> None:
        """Stop; every item still waiting or in the batch being scored fails with SandboxDamaged."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        while self._queue:
            waiting = self._queue.popleft()
            if not waiting.future.done():
                waiting.future.set_exception(SandboxDamaged("the reward model was closed"))

    async def submit(self, item: Item) -> Outcome:
        waiting: _Waiting[Item, Outcome] = _Waiting(item, asyncio.get_running_loop().create_future())
        self._queue.append(waiting)
        self._arrived.set()
        # A caller that gives up (its deadline) cancels the future, and the batch skips it.
        return await waiting.future

    async def _loop(self) -> None:
        while True:
            while not self._queue:
                self._arrived.clear()
                await self._arrived.wait()
            deadline = self._queue[0].arrived + self.wait_seconds
            while len(self._queue) < self.max_batch and (left := deadline - time.monotonic()) > 0:
                self._arrived.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._arrived.wait(), left)
            batch = [self._queue.popleft() for _ in range(min(self.max_batch, len(self._queue)))]
            # A job whose caller gave up (deadline) is not worth a forward pass.
            batch = [waiting for waiting in batch if not waiting.future.done()]
            if not batch:
                continue
            self.batches += 1
            self.items += len(batch)
            self.largest = max(self.largest, len(batch))
            try:
                outcomes = await self.score_batch([waiting.item for waiting in batch])
                if len(outcomes) != len(batch):
                    raise RuntimeError(f"{len(outcomes)} outcomes for {len(batch)} items")
            except (Exception, asyncio.CancelledError) as exc:
                failure = SandboxDamaged("the reward model was closed") if isinstance(
                    exc, asyncio.CancelledError) else exc
                for waiting in batch:
                    if not waiting.future.done():
                        waiting.future.set_exception(failure)
                if isinstance(exc, asyncio.CancelledError):
                    raise
                continue
            for waiting, outcome in zip(batch, outcomes, strict=True):
                if not waiting.future.done():
                    waiting.future.set_result(outcome)


class RewardModelHost:
    """The controller's handle on the scorer process: start, batch, answer jobs."""

    def __init__(self, settings: dict[str, Any]) -> None:
        self.settings = settings
        self.name = str(settings["name"])
        self.state: dict[str, Any] = {"name": self.name, "state": "loading"}
        self.error = ""
        self._process: subprocess.Popen[bytes] | None = None
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._batcher: Batcher[tuple[str, str], dict[str, Any]] = Batcher(
            self._score_batch, max(1, int(settings.get("max_batch", 32))),
            max(0.0, float(settings.get("batch_wait_ms", 5.0))) / 1000)
        self._batch_timeout = float(settings.get("batch_timeout_seconds", 120.0))
        self._damaged = ""
        # Time the scorer spent formatting and scoring batches, by its own clock: the rest of a
        # job's time is the batch window, queueing behind other batches and the socket.
        self.scoring_seconds = 0.0

    async def start(self) -> None:
        """Start the scorer and wait until it loaded the model or failed to (either is a state)."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        scorer_settings = {key: self.settings[key] for key in
                           ("name", "path", "device", "max_length", "dtype", "label", "threads", "memory_fraction",
                            "max_batch_tokens")
                           if key in self.settings}
        command = [sys.executable, "-m", "sandboxd.agent.forked.scorer", "--fd", str(theirs.fileno()),
                   "--settings", json.dumps(scorer_settings)]
        # Its exit status is not needed (the socket says when it is gone), and PID 1's
        # reaper collects it; stdout and stderr go to the container's log.
        self._process = subprocess.Popen(command, pass_fds=[theirs.fileno()], close_fds=True)
        theirs.close()
        self._reader, self._writer = await asyncio.open_unix_connection(sock=ours)
        timeout = float(self.settings.get("load_timeout_seconds", 600.0))
        try:
            async with asyncio.timeout(timeout):
                hello = await read_frame(self._reader)
        except (EOFError, ProtocolError, TimeoutError, ConnectionError) as exc:
            hello = {"failed": f"the scorer process ended before it loaded the model ({type(exc).__name__})"}
            self._kill()
        if "failed" in hello:
            self.error = str(hello["failed"])
            self.state = {"name": self.name, "state": "failed", "error": self.error}
            print(f"sandboxd-agent: reward model {self.name!r} failed to load: {self.error}", file=sys.stderr,
                  flush=True)
            return
        self.state = {"state": "ready", **hello["ready"]}
        self._batcher.start()

    async def close(self) -> None:
        """Stop batching and end the scorer. In a sandbox the container's end does this; the
        agent's tests and the GPU benchmark run a host outside one."""
        await self._batcher.close()
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        self._kill()
        if self._process is not None:
            await asyncio.to_thread(self._process.wait)

    def _kill(self) -> None:
        # returncode is set once this process has waited for the scorer: its pid may be another's.
        if self._process is not None and self._process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self._process.pid, signal.SIGKILL)

    async def _score_batch(self, pairs: list[tuple[str, str]]) -> list[dict[str, Any]]:
        scores: list[dict[str, Any]] = []
        for chunk in _frame_sized(pairs):
            scores.extend(await self._score_chunk(chunk))
        return scores

    async def _score_chunk(self, pairs: list[tuple[str, str]]) -> list[dict[str, Any]]:
        if self._damaged:
            raise SandboxDamaged(self._damaged)
        assert self._reader is not None and self._writer is not None
        try:
            self._writer.write(encode_frame({"pairs": pairs}))
            await self._writer.drain()
            async with asyncio.timeout(self._batch_timeout):
                reply = await read_frame(self._reader)
        except TimeoutError:
            self._damaged = f"the reward model did not answer a batch of {len(pairs)} in {self._batch_timeout:g} s"
        except (EOFError, ProtocolError, ConnectionError) as exc:
            self._damaged = f"the reward model's scorer process died ({type(exc).__name__}: {exc})"
        if self._damaged:
            self._kill()
            raise SandboxDamaged(self._damaged)
        self.scoring_seconds += float(reply.get("seconds", 0.0))
        return list(reply["scores"])

    def status(self) -> dict[str, Any]:
        """The model's state (loading, ready or failed, and what the scorer said of it) and its batches so far."""
        batcher = self._batcher
        return {**self.state, "batches": batcher.batches, "pairs": batcher.items, "largest_batch": batcher.largest,
                "scoring_seconds": round(self.scoring_seconds, 6)}

    async def run(self, job: Mapping[str, Any]) -> JobResult:
        """One reward_model job (messages.RewardModelJob), or ``{"op": "status"}``: the model's state."""
        if job.get("op") == "status":
            return {"status": "ok", "reward_model": self.status()}
        if self.error:
            return {"status": "internal", "message": f"reward model {self.name!r} failed to load: {self.error}"}
        timeout = float(job["limits"]["timeout"])
        try:
            outcome = await asyncio.wait_for(self._batcher.submit((job["prompt"], job["completion"])), timeout)
        except TimeoutError:
            return {"status": "timeout", "limit": "wall_time",
                    "message": f"not scored within {timeout:g} s (queued behind other batches or a slow model)"}
        detail = {"model": self.name, "device": self.state.get("device", "")}
        if outcome.get("status", "ok") != "ok":
            limit = "memory" if outcome["status"] == "memory_limit" else ""
            return {"status": outcome["status"], "limit": limit, "message": outcome.get("message", ""),
                    "reward_model": detail}
        message = ""
        if outcome.get("truncated"):
            message = f"truncated from {outcome['tokens']} to {self.settings.get('max_length')} tokens"
        return {"status": "ok", "message": message, "reward_model": {**detail, "raw_score": outcome["raw"]}}


def _frame_sized(pairs: list[tuple[str, str]]) -> list[list[tuple[str, str]]]:
    """Split a batch so that no frame to the scorer nears the frame limit (long, non-ASCII pairs)."""
    chunks: list[list[tuple[str, str]]] = [[]]
    size = 0
    for pair in pairs:
        cost = len(json.dumps(pair))
        if chunks[-1] and size + cost > FRAME_BUDGET_BYTES:
            chunks.append([])
            size = 0
        chunks[-1].append(pair)
        size += cost
    return chunks
