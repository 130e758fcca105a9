"""A judge's process for the two-process Python harness: verdict after verdict (host/judgeservers.py starts it).

Each request carries the socket to its job's candidate; the tests run in a
fresh namespace per job, under sandboxd.verifiers.python.harness.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from typing import Any, NoReturn, cast

from sandboxd.agent.forked.serving import serve_requests
from sandboxd.agent.messages import JudgeRequest
from sandboxd.agent.protocol import CPU_CREDIT, DEADLINE_STRETCH

# logcapture: imported as the judge starts, not by a test's caplog in the middle of a job, whose working directory
# is the candidate's folder; a judge never forks, so logging's fork hooks cost it nothing (the zygote has none).
from sandboxd.verifiers.python import harness, logcapture  # noqa: F401

# What a judge may map, on top of what it maps between jobs, while it judges one job. A judge reads
# what the candidate sends it: the syntax tree of its program (assert tests, to find the names they
# may call; about 500 bytes per byte of `[1,1,1,...]`, 430 MiB for a 900 KB program) and its replies
# (15 MiB of two-letter strings decode into 3.2 million objects, 274 MiB). Without a bound, a judge
# built all of it in the sandbox's memory (2 GiB by default), beside the sandbox's other jobs; with
# one, it gets a MemoryError, which python.harness answers as the candidate's failure (TooLargeForJudge).
# A reply of 2 million ints (a 15 MiB frame) takes 122 MiB to decode, one of 900,000 pairs of ints
# (13 MiB) 236 MiB. The dataset's own test code runs under it too.
JOB_MEMORY_BYTES = 256 << 20
SERVER_NAME = b"sandboxd-judge"


def serve(channel: socket.socket, results: socket.socket,
          receive: Callable[[socket.socket], tuple[dict[str, Any], list[int]]]) -> NoReturn:
    """Worker side: one verdict per request until the channel closes.

    Each request carries the socket to its candidate, then the file where
    the agent keeps the candidate's CPU credit (runner.RunSpec.cpu_credit_fd).
    """
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

        # From the host's jobs.Jobs._python_harness, in our own process: so typed, mypy checks the arguments.
        request = cast("JudgeRequest", job)
        try:
            with socket.socket(fileno=fds[0]) as peer:
                verdict = harness.run_tests(request["plan_kind"], peer, cpu_credit=cpu_credit,
                                            deadline_stretch=DEADLINE_STRETCH, **request["harness"])
        finally:
            os.close(credit_fd)
        # A judge that reached its budget is replaced, not handed the next job: the heap that a MemoryError
        # leaves may be fragmented, and hold on to much of what it held whether it stays resident or not.
        tests = cast("list[dict[str, object]]", verdict["tests"])
        worn = any(test["status"] == "memory" for test in tests)
        return {"result": verdict, "worn": True} if worn else {"result": verdict}

    serve_requests(SERVER_NAME, lambda: receive(channel), judge, results, memory_per_request=JOB_MEMORY_BYTES)
