"""Long-lived math workers, the controller's side: the verifier stays warm between jobs instead of a fork per job.

A math job runs our own code (the verifier) on untrusted strings; no model
code runs. Forking a fresh worker per job from the sympy-sized zygote cost
most of a math job's CPU (copy-on-write faults and a garbage collector
walking the inherited heap), so the controller keeps a few math servers: a
worker forked once, under a uid of its own, that verifies job after job.

What a hostile answer can still do is what it could do before: make the
parser slow or hungry. A server past its job's deadline is killed (SIGKILL
to every process of its uid, as for any run) and replaced; one that dies,
answers with an error, holds far more memory than it started with
(forked.serving.RECYCLE_GROWTH_BYTES), or has verified RECYCLE_AFTER_JOBS answers
is replaced too, so no state that one answer leaves in sympy's caches
lives long. Jobs see the same limits as before: the deadline per job, the
address space per server (servers are kept per memory limit). A server's
own process is forked.mathserver.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from typing import TYPE_CHECKING, cast

from sandboxd.agent.host.runner import CURRENT_JOB
from sandboxd.agent.host.servers import ResidentServer

if TYPE_CHECKING:
    from sandboxd.agent.host.jobhost import JobHost
    from sandboxd.agent.messages import MathJob, MathRequest, MathResult

RECYCLE_AFTER_JOBS = 500
# A new server runs slower until it has copied the pages of sympy's heap it
# writes (500 jobs on 4 fresh servers take about 8.7 ms of CPU each, the
# next 500 about 6.2 ms), so jobs wait for a busy server
# rather than start one; only when every server has been busy this long (a
# slow, hostile answer) is another started.
SPILL_SECONDS = 0.5
WARM_SECONDS = 60.0
RESULT_FRAME_BYTES = 1 << 20


class MathServer(ResidentServer):
    """Controller side of one math server."""

    def __init__(self, host: JobHost, memory: int) -> None:
        super().__init__(host, "math_server", recycle_after=RECYCLE_AFTER_JOBS,
                         max_reply_bytes=RESULT_FRAME_BYTES, memory=memory)

    async def verify(self, job: MathJob, timeout: float) -> tuple[str, MathResult | None, str]:
        """(outcome, verdict, message); outcome is ok, timeout, memory, died or error.

        Anything but ok leaves the server closed.
        """
        request: MathRequest = {"completion": job["completion"], "ground_truth": job["ground_truth"],
                   "extraction": job.get("extraction", "auto"), "tolerance": job.get("tolerance", 1e-6)}
        outcome, verdict, message = await self.ask(request, timeout)
        if outcome == "died":
            message = f"the math worker {message} on this answer"
        # The server's answer is math.verify's (forked/mathserver.py), from our own process.
        return outcome, cast("MathResult | None", verdict), message


class MathServers:
    """Warm servers by memory limit; a job borrows an idle one and gives it back if it is still good.

    At most `servers` run at once, the sandbox's CPU share (more would only
    interleave on the same CPU), plus any started when all of them stayed
    busy for SPILL_SECONDS. Jobs mostly share one memory limit; a job with
    another one closes the idle servers of the others before it starts its own.
    """

    def __init__(self, host: JobHost, servers: int = 1) -> None:
        self.host = host
        self.servers = max(1, servers)
        self._idle: dict[int, list[MathServer]] = {}
        self._live: dict[int, int] = {}
        self._waiting: dict[int, int] = {}
        self._returned = asyncio.Condition()

    async def prestart(self, memory: int) -> None:
        """Start and warm the servers for `memory` before the sandbox takes jobs.

        Never before a snapshot: CRIU, as Docker runs it here, cannot dump a
        process that runs under another uid (it may not read its rlimits).
        """
        idle = self._idle.setdefault(memory, [])
        while self._live.get(memory, 0) < self.servers:
            server = await self._start(memory)
            reply = await server.worker.request({"op": "warm"}, timeout=WARM_SECONDS)
            if not (reply and reply.get("ok")):
                # Jobs start servers of their own, cold; a failed warm-up is not one to keep.
                self._closed(server)
                return
            idle.append(server)

    async def _start(self, memory: int) -> MathServer:
        for other, idle in self._idle.items():
            if other != memory:
                while idle:
                    self._closed(idle.pop())
        server = MathServer(self.host, memory)
        self._live[memory] = self._live.get(memory, 0) + 1
        try:
            await server.start()
        except BaseException:
            self._closed(server)
            raise
        return server

    def _closed(self, server: MathServer) -> None:
        server.close()
        self._live[server.memory] -= 1

    async def _borrow(self, memory: int, timeout: float) -> MathServer:
        idle = self._idle.setdefault(memory, [])
        loop = asyncio.get_running_loop()
        spill_at = loop.time() + SPILL_SECONDS
        async with self._returned:
            self._waiting[memory] = self._waiting.get(memory, 0) + 1
            try:
                while True:
                    while idle:
                        server = idle.pop()
                        if server.usable and server.has_cpu_for(timeout):
                            return server
                        self._closed(server)
                    if self._live.get(memory, 0) < self.servers or loop.time() >= spill_at:
                        break
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._returned.wait(), spill_at - loop.time())
            finally:
                self._waiting[memory] -= 1
        return await self._start(memory)

    async def verify(self, job: MathJob) -> tuple[str, MathResult | None, str]:
        limits = job["limits"]
        memory = int(limits.get("memory") or 0)
        server = await self._borrow(memory, float(limits["timeout"]))

        def kill() -> None:
            # Withdrawn (its caller gave up): the server dies as at a deadline, and is replaced.
            if server.worker.alive:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(server.worker.pid, signal.SIGKILL)

        withdrawal = CURRENT_JOB.get()
        if withdrawal is not None:
            withdrawal.watch(kill)
        try:
            outcome, verdict, message = await server.verify(job, float(limits["timeout"]))
        except BaseException:
            self._closed(server)
            raise
        finally:
            if withdrawal is not None:
                withdrawal.unwatch(kill)
        idle = self._idle.setdefault(memory, [])
        if outcome != "ok" or not server.usable:
            self._closed(server)
        else:
            idle.append(server)
            # Past the bound with nobody waiting (a spill is over): close the
            # coldest idle server, not the warm one that just came back.
            if self._live[memory] > self.servers and not self._waiting.get(memory):
                coldest = min(idle, key=lambda candidate: candidate.jobs_done)
                idle.remove(coldest)
                self._closed(coldest)
        async with self._returned:
            self._returned.notify_all()
        return outcome, verdict, message
