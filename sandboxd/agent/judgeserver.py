"""Long-lived judges for the two-process Python harness: one fork per job instead of two.

A function-call or assert job runs the candidate's program in one process
and the tests (the judge, our code plus the dataset's trusted test code) in
another, under another uid, so that expected values never enter the
candidate's process (see sandboxd.verifiers.python.harness). The candidate needs
a fresh process per job; the judge does not. Forking, setting up and
reaping a judge per job cost about 3.5 ms of a HumanEval job's 12 ms of
sandbox CPU here, so the controller keeps judges the way it keeps math
servers: a worker forked once, under a uid of its own, that judges job
after job. Each job hands it the socket to that job's candidate.

What a judge keeps between jobs is what the trusted test code leaves in
modules it imported; every job's tests run in a fresh namespace. A judge
past its job's deadline is killed (SIGKILL to every process of its uid) and
replaced; one that dies, answers with an error, holds far more memory than
it started with (servers.RECYCLE_GROWTH_BYTES), or has judged
RECYCLE_AFTER_JOBS jobs is replaced too. The candidate can only send plain
data to a judge (python.harness caps its size and depth), and cannot signal,
trace or read the judge's memory: it runs under another uid. What the judge
may map to judge one job is bounded (JOB_MEMORY_BYTES); a program or reply
too large for that is the candidate's failure at the memory limit, after
which the judge is replaced.
"""

from __future__ import annotations

import os
import socket
from typing import TYPE_CHECKING, Any, NoReturn, cast

from sandboxd.agent.protocol import CPU_CREDIT, DEADLINE_STRETCH
from sandboxd.agent.servers import ResidentServer, serve_requests

if TYPE_CHECKING:
    from collections.abc import Callable

    from sandboxd.agent.controller import Controller

RECYCLE_AFTER_JOBS = 200
# What a judge may map, on top of what it maps between jobs, while it judges one job. A judge reads
# what the candidate sends it: the syntax tree of its program (assert tests, to find the names they
# may call; about 500 bytes per byte of `[1,1,1,...]`, 430 MiB for a 900 KB program) and its replies
# (15 MiB of two-letter strings decode into 3.2 million objects, 274 MiB). Without a bound, a judge
# built all of it in the sandbox's memory (2 GiB by default), beside the sandbox's other jobs; with
# one, it gets a MemoryError, which python.harness answers as the candidate's failure (TooLargeForJudge).
# A reply of 2 million ints (a 15 MiB frame) takes 122 MiB to decode, one of 900,000 pairs of ints
# (13 MiB) 236 MiB. The dataset's own test code runs under it too.
JOB_MEMORY_BYTES = 256 << 20
# As python.harness.MAX_FRAME_BYTES: thousands of failing cases, each with its message.
RESULT_FRAME_BYTES = 16 << 20
SERVER_NAME = b"sandboxd-judge"


def serve(channel: socket.socket, results: socket.socket,
          receive: Callable[[socket.socket], tuple[dict[str, Any], list[int]]]) -> NoReturn:
    """Worker side: one verdict per request until the channel closes.

    Each request carries the socket to its candidate, then the file where
    the agent keeps the candidate's CPU credit (runner.RunSpec.cpu_credit_fd).
    """
    from sandboxd.verifiers.python import harness

    def judge(job: dict[str, Any], fds: list[int]) -> dict[str, Any]:
        for fd in fds[2:]:
            os.close(fd)
        if len(fds) < 2:
            for fd in fds:
                os.close(fd)
            raise ValueError("a judge request carries its candidate's socket and CPU credit")
        credit_fd = fds[1]

        def cpu_credit() -> float:
            kept = os.pread(credit_fd, CPU_CREDIT.size, 0)
            return CPU_CREDIT.unpack(kept)[0] if len(kept) == CPU_CREDIT.size else 0.0

        try:
            with socket.socket(fileno=fds[0]) as peer:
                verdict = harness.run_tests(job["plan_kind"], peer, cpu_credit=cpu_credit,
                                            deadline_stretch=DEADLINE_STRETCH, **job["harness"])
        finally:
            os.close(credit_fd)
        # A judge that reached its budget is replaced, not handed the next job: the heap that a MemoryError
        # leaves may be fragmented, and hold on to much of what it held whether it stays resident or not.
        tests = cast("list[dict[str, object]]", verdict["tests"])
        worn = any(test["status"] == "memory" for test in tests)
        return {"result": verdict, "worn": True} if worn else {"result": verdict}

    serve_requests(SERVER_NAME, lambda: receive(channel), judge, results, memory_per_request=JOB_MEMORY_BYTES)


class JudgeServer(ResidentServer):
    """Controller side of one judge."""

    def __init__(self, controller: Controller) -> None:
        super().__init__(controller, "py_judge", recycle_after=RECYCLE_AFTER_JOBS, max_reply_bytes=RESULT_FRAME_BYTES)

    async def judge(self, request: dict[str, Any], peer: socket.socket, cpu_credit_fd: int,
                    timeout: float) -> tuple[str, dict[str, Any] | None, str]:
        """(outcome, verdict, message) as `ResidentServer.ask`. Anything but ok leaves the judge closed."""
        return await self.ask(request, timeout, fds=(os.dup(peer.fileno()), os.dup(cpu_credit_fd)))


class JudgeServers:
    """Idle judges; a job borrows one (or starts one) and gives it back if it is still good.

    No more run than the jobs running at once in the sandbox, which the
    daemon bounds (pool.jobs_per_sandbox), so no cap of its own.
    """

    def __init__(self, controller: Controller) -> None:
        self.controller = controller
        self._idle: list[JudgeServer] = []

    async def judge(self, request: dict[str, Any], peer: socket.socket, cpu_credit_fd: int,
                    timeout: float, share: Callable[[int], None] | None = None,
                    ) -> tuple[str, dict[str, Any] | None, str]:
        """The verdict of an idle judge (or a new one); ``share`` is called with its uid before it is asked."""
        server = None
        while self._idle:
            candidate = self._idle.pop()
            if candidate.usable and candidate.has_cpu_for(timeout):
                server = candidate
                break
            candidate.close()
        if server is None:
            server = JudgeServer(self.controller)
            await server.start()
        try:
            if share is not None:
                share(server.uid)
            outcome, verdict, message = await server.judge(request, peer, cpu_credit_fd, timeout)
        except BaseException:
            server.close()
            raise
        if outcome == "ok" and server.usable:
            self._idle.append(server)
        else:
            server.close()
        return outcome, verdict, message
