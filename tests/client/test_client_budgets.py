"""The job's time limit and the RPC deadline are two budgets; the daemon's and the client's tries two counts.

``timeout`` (builders and ``score_*`` / ``execute`` alike) goes to the sandbox as
``Job.limits.timeout_seconds``; ``deadline`` (client or call) only bounds how long
the client waits for an RPC. ``Result.attempts`` is the daemon's count,
``Result.client_attempts`` the client's. Both twins are checked with the same
calls, and their public signatures are compared.
"""

from __future__ import annotations

import inspect
import time
from typing import Any

import grpc
import pytest
from conftest import FAST, StartFake, Twin
from fake_daemon import Abort, Delay
from sandboxd_client import (
    AsyncSandboxClient,
    AsyncSession,
    DeadlineExceeded,
    SandboxClient,
    Session,
    Status,
    math_job,
)
from sandboxd_client._proto.sandboxd.v1 import sandboxd_pb2 as pb


def recording(limits: list[float], action: Any = None) -> Any:
    def script(fake: Any, job: pb.Job, attempt: int) -> Any:
        limits.append(job.limits.timeout_seconds)
        return action

    return script


SCORE_CALLS = [
    ("score_math", ("4", "4")),
    ("score_code", ("correct", [("1\n", "1\n")])),
    ("execute", ("print(1)",)),
]


@pytest.mark.parametrize(("method", "args"), SCORE_CALLS)
def test_timeout_on_score_calls_is_the_jobs_limit(start_fake: StartFake, twin: Twin, method: str, args: Any) -> None:
    limits: list[float] = []
    # The fake answers after 0.5 s: were timeout=0.2 an RPC deadline, this would be DEADLINE_EXCEEDED.
    server = start_fake("a", recording(limits, Delay(0.5)))
    result = twin.call(server.address, method, *args, timeout=0.2)
    assert result.status is Status.OK, result
    assert limits == [pytest.approx(0.2)], "the sandbox got the limit"


@pytest.mark.parametrize(("method", "args"), [*SCORE_CALLS, ("run", (math_job("4", "4", timeout=5.0),))])
def test_deadline_bounds_the_rpc_only(start_fake: StartFake, twin: Twin, method: str, args: Any) -> None:
    limits: list[float] = []
    server = start_fake("a", recording(limits, Delay(3.0)))
    start = time.monotonic()
    result = twin.call(server.address, method, *args, deadline=0.3)
    assert time.monotonic() - start < 2.0
    assert result.status is Status.DEADLINE_EXCEEDED and isinstance(result.error, DeadlineExceeded)
    assert (result.attempts, result.client_attempts) == (0, 1), "made up by the client; not retried"
    assert limits == [5.0 if method == "run" else 0.0], "the job's own limit is untouched by deadline="


def test_client_deadline_is_the_default_for_every_call(start_fake: StartFake, twin: Twin) -> None:
    server = start_fake("a", lambda fake, job, attempt: Delay(3.0))
    jobs = [math_job("4", "4"), math_job("5", "5")]
    results = twin.call(server.address, "score_batch", jobs, client={"deadline": 0.3})
    assert [r.status for r in results] == [Status.DEADLINE_EXCEEDED] * 2


@pytest.mark.parametrize("method", ["run", "score_batch"])
def test_attempts_counts_the_daemons_tries_client_attempts_the_clients(
    start_fake: StartFake, twin: Twin, method: str
) -> None:
    lost = pb.JobResult(status=pb.STATUS_SANDBOX_LOST, reward=-1.0, attempts=3)

    def script(fake: Any, job: pb.Job, attempt: int) -> Any:
        if job.index == 0:  # the daemon lost 3 sandboxes under it, then the client retried
            return lost if attempt == 1 else pb.JobResult(status=pb.STATUS_OK, reward=1.0, attempts=2)
        if job.index == 1:  # the daemon was full once (an RPC abort would hit the whole stream)
            return pb.JobResult(status=pb.STATUS_OVERLOADED, retry_after_seconds=0.01) if attempt == 1 else None
        return None  # answered at once

    server = start_fake("a", script)
    jobs = [math_job("4", "4"), math_job("4", "4"), math_job("4", "4")]
    if method == "run":
        results = [twin.call(server.address, "run", job) for job in jobs[:1]]
        results += [twin.call(server.address, "run", pb.Job(index=1, math=jobs[1].math))]
        results += [twin.call(server.address, "run", pb.Job(index=2, math=jobs[2].math))]
    else:
        results = twin.call(server.address, "score_batch", jobs)
    assert all(r.ok for r in results), results
    assert [(r.attempts, r.client_attempts) for r in results] == [(2, 2), (1, 2), (1, 1)]
    assert results[0].to_dict()["client_attempts"] == 2


def test_client_attempts_count_failed_rpcs(start_fake: StartFake, twin: Twin) -> None:
    server = start_fake("a", lambda fake, job, attempt: Abort(grpc.StatusCode.UNAVAILABLE) if attempt < 3 else None)
    result = twin.call(server.address, "score_math", "4", "4")
    assert result.ok and (result.attempts, result.client_attempts) == (1, 3)


def test_retries_exhausted_keep_the_daemons_answer_and_both_counts(start_fake: StartFake, twin: Twin) -> None:
    server = start_fake("a", lambda fake, job, attempt: pb.JobResult(status=pb.STATUS_SANDBOX_LOST, attempts=3))
    result = twin.call(server.address, "score_math", "4", "4", failure_value=0.0)
    assert result.status is Status.SANDBOX_LOST and result.error is None
    assert (result.attempts, result.client_attempts) == (3, FAST.max_retries + 1)


def _public(cls: type) -> dict[str, inspect.Signature]:
    return {
        name: inspect.signature(member)
        for name, member in inspect.getmembers(cls)
        if not name.startswith("_") and callable(member)
    }


@pytest.mark.parametrize(("sync", "async_"), [(SandboxClient, AsyncSandboxClient), (Session, AsyncSession)])
def test_twins_have_the_same_methods_and_arguments(sync: type, async_: type) -> None:
    blocking, awaited = _public(sync), _public(async_)
    assert set(blocking) == set(awaited)
    for name, signature in blocking.items():
        # Same parameters, names, kinds and defaults; return types differ (awaitable, async iterator).
        assert list(signature.parameters.values()) == list(awaited[name].parameters.values()), name
