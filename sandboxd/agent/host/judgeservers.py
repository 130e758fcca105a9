"""Long-lived judges for the two-process Python harness, the controller's side: one fork per job instead of two.

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
it started with (forked.serving.RECYCLE_GROWTH_BYTES), or has judged
RECYCLE_AFTER_JOBS jobs is replaced too. The candidate can only send plain
data to a judge (python.harness caps its size and depth), and cannot signal,
trace or read the judge's memory: it runs under another uid. What the judge
may map to judge one job is bounded (forked.judgeserver.JOB_MEMORY_BYTES); a
program or reply too large for that is the candidate's failure at the memory
limit, after which the judge is replaced. The judge's own process is
forked.judgeserver.
"""

from __future__ import annotations

import os
import socket
from typing import TYPE_CHECKING, Any

from sandboxd.agent.host.servers import ResidentServer

if TYPE_CHECKING:
    from collections.abc import Callable

    from sandboxd.agent.host.jobhost import JobHost
    from sandboxd.agent.messages import JudgeRequest

RECYCLE_AFTER_JOBS = 200
# As python.harness.MAX_FRAME_BYTES: thousands of failing cases, each with its message.
RESULT_FRAME_BYTES = 16 << 20


class JudgeServer(ResidentServer):
    """Controller side of one judge."""

    def __init__(self, host: JobHost) -> None:
        super().__init__(host, "py_judge", recycle_after=RECYCLE_AFTER_JOBS, max_reply_bytes=RESULT_FRAME_BYTES)

    async def judge(self, request: JudgeRequest, peer: socket.socket, cpu_credit_fd: int,
                    timeout: float) -> tuple[str, dict[str, Any] | None, str]:
        """(outcome, verdict, message) as `ResidentServer.ask`. Anything but ok leaves the judge closed."""
        return await self.ask(request, timeout, fds=(os.dup(peer.fileno()), os.dup(cpu_credit_fd)))


class JudgeServers:
    """Idle judges; a job borrows one (or starts one) and gives it back if it is still good.

    No more run than the jobs running at once in the sandbox, which the
    daemon bounds (pool.jobs_per_sandbox), so no cap of its own.
    """

    def __init__(self, host: JobHost) -> None:
        self.host = host
        self._idle: list[JudgeServer] = []

    async def judge(self, request: JudgeRequest, peer: socket.socket, cpu_credit_fd: int,
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
            server = JudgeServer(self.host)
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
