"""Retries, deadlines, streaming, balancing and sessions against FakeSandboxd on real sockets.

Every behaviour is checked on both twins: ``twin`` runs the same scenario with
SandboxClient and with AsyncSandboxClient (on a fresh event loop).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import grpc
import pytest
from conftest import FAST, StartFake, Twin
from fake_daemon import Abort, Delay, FakeServer
from sandboxd_client import (
    AsyncSandboxClient,
    CellResult,
    DeadlineExceeded,
    InvalidRequest,
    MessageTooLarge,
    RetryPolicy,
    SandboxClient,
    SandboxdError,
    SessionNotFound,
    Status,
    Unavailable,
    Unimplemented,
    math_job,
    reward_model_health_service,
    reward_model_job,
)
from sandboxd_client._proto.sandboxd.v1 import sandboxd_pb2 as pb


def first_attempt(action: Any) -> Callable[..., Any]:
    return lambda fake, job, attempt: action if attempt == 1 else None


# -- retries --------------------------------------------------------------


@pytest.mark.parametrize("method", ["run", "score_batch"])
def test_retry_on_unavailable_then_success(twin: Twin, start_fake: StartFake, method: str) -> None:
    server = start_fake("a", first_attempt(Abort(grpc.StatusCode.UNAVAILABLE)))
    job = math_job("4", "4")
    answer = twin.call(server.address, method, job if method == "run" else [job])
    result = answer if method == "run" else answer[0]
    assert result.status is Status.OK and result.reward == 1.0
    assert server.fake.attempts[0] == 2


@pytest.mark.parametrize("method", ["run", "score_batch"])
def test_no_retry_on_model_failure(twin: Twin, fake: FakeServer, method: str) -> None:
    job = math_job("5", "4")
    answer = twin.call(fake.address, method, job if method == "run" else [job])
    result = answer if method == "run" else answer[0]
    assert (
        result.status is Status.WRONG_ANSWER
        and result.reward == -1.0
        and not result.is_infrastructure_failure
    )
    assert fake.fake.attempts[0] == 1


@pytest.mark.parametrize("method", ["run", "score_batch"])
def test_resource_exhausted_honours_retry_hint(twin: Twin, start_fake: StartFake, method: str) -> None:
    server = start_fake("a", first_attempt(Abort(grpc.StatusCode.RESOURCE_EXHAUSTED, retry_after=0.4)))
    job = math_job("4", "4")
    start = time.monotonic()
    answer = twin.call(server.address, method, job if method == "run" else [job])
    elapsed = time.monotonic() - start
    assert (answer if method == "run" else answer[0]).ok
    assert elapsed >= 0.4, "the trailing-metadata hint is a floor on the wait"
    assert server.fake.attempts[0] == 2


def test_overloaded_result_hint_is_honoured(twin: Twin, start_fake: StartFake) -> None:
    overloaded = pb.JobResult(status=pb.STATUS_OVERLOADED, reward=-1.0, retry_after_seconds=0.3)
    server = start_fake("a", first_attempt(overloaded))
    start = time.monotonic()
    (result,) = twin.call(server.address, "score_batch", [math_job("4", "4")])
    assert result.ok and time.monotonic() - start >= 0.3


def test_batch_retries_only_failed_items(twin: Twin, start_fake: StartFake) -> None:
    lost = pb.JobResult(status=pb.STATUS_SANDBOX_LOST, reward=-1.0)
    server = start_fake("a", lambda fake, job, attempt: lost if job.index % 2 and attempt == 1 else None)
    results = twin.call(server.address, "score_batch", [math_job("1", "1") for _ in range(10)])
    assert [r.index for r in results] == list(range(10)) and all(r.ok for r in results)
    assert server.fake.batches == [list(range(10)), [1, 3, 5, 7, 9]]
    assert all(server.fake.attempts[i] == (2 if i % 2 else 1) for i in range(10))


def test_retries_exhausted_give_an_infrastructure_result(twin: Twin, start_fake: StartFake) -> None:
    server = start_fake("a", lambda fake, job, attempt: Abort(grpc.StatusCode.UNAVAILABLE))
    policy = RetryPolicy(max_retries=2, initial_backoff=0.01)
    result = twin.call(server.address, "run", math_job("4", "4", failure_value=0.0), client={"retry_policy": policy})
    assert result.status is Status.UNAVAILABLE and result.is_infrastructure_failure and result.reward == 0.0
    assert server.fake.attempts[0] == 3
    with pytest.raises(Unavailable):
        result.raise_for_status()


def test_invalid_argument_from_daemon_raises(twin: Twin, start_fake: StartFake) -> None:
    server = start_fake(
        "a", lambda fake, job, attempt: Abort(grpc.StatusCode.INVALID_ARGUMENT, "timeout too big")
    )
    with pytest.raises(InvalidRequest, match="timeout too big"):
        twin.call(server.address, "score_batch", [math_job("4", "4")])
    assert server.fake.attempts[0] == 1


def test_a_refused_batch_job_is_named_by_its_input_position(twin: Twin, start_fake: StartFake) -> None:
    """The daemon names a RunBatch's bad job by its place in the request; a list goes out in chunks, so
    the 7th job was "jobs[2]" of the second chunk of 4 (`sandboxd score` sent its user to the wrong row)."""
    def refuse_six(fake: Any, job: pb.Job, attempt: int) -> Abort | None:
        # As the daemon words it: the position in this chunk (chunks of 4 go out in input order).
        return Abort(grpc.StatusCode.INVALID_ARGUMENT, f"jobs[{job.index % 4}].math: refused") \
            if job.index == 6 else None

    server = start_fake("a", refuse_six)
    jobs = [math_job(str(i), str(i)) for i in range(10)]
    with pytest.raises(InvalidRequest, match=r"^INVALID_ARGUMENT: jobs\[6\]\.math: refused$"):
        twin.call(server.address, "score_batch", jobs, client={"batch_size": 4, "max_concurrent_batches": 1})


@pytest.mark.parametrize("method", ["run", "score_batch"])
def test_a_request_over_the_message_limit_raises_at_once(twin: Twin, fake: FakeServer, method: str) -> None:
    """gRPC's size limit says RESOURCE_EXHAUSTED, as an overloaded daemon does: the client retried the same
    oversized request for its whole backoff (23 s for a session opened with a 200 MB file)."""
    job = math_job("\\boxed{4}" + " " * 4096, "4")
    small = {"options": [("grpc.max_send_message_length", 1024)], "retry_policy": RetryPolicy()}
    start = time.monotonic()
    with pytest.raises(MessageTooLarge, match="larger than max"):
        twin.call(fake.address, method, job if method == "run" else [job], client=small)
    assert time.monotonic() - start < 5, "retried"  # the default policy's retries take 11 s or more
    assert fake.fake.attempts == {}


def test_a_session_opened_with_files_over_the_message_limit_raises_at_once(fake: FakeServer) -> None:
    with SandboxClient(fake.address, options=[("grpc.max_send_message_length", 1024)]) as client, \
            pytest.raises(MessageTooLarge):
        client.open_session(files={"data.bin": b"x" * 4096})
    assert fake.fake.sessions == {}


def test_unreachable_daemon_is_an_infrastructure_result(twin: Twin, socket_dir: Any) -> None:
    policy = RetryPolicy(max_retries=1, initial_backoff=0.01)
    (result,) = twin.call(
        f"unix://{socket_dir}/nobody.sock",
        "score_batch",
        [math_job("1", "1")],
        client={"retry_policy": policy, "deadline": 5},
    )
    assert result.status is Status.UNAVAILABLE and result.reward == -1.0


# -- deadlines ------------------------------------------------------------


@pytest.mark.parametrize("method", ["run", "score_batch"])
def test_deadline_exceeded(twin: Twin, start_fake: StartFake, method: str) -> None:
    server = start_fake("a", lambda fake, job, attempt: Delay(3.0))
    job = math_job("4", "4")
    start = time.monotonic()
    answer = twin.call(server.address, method, job if method == "run" else [job], client={"deadline": 0.3})
    result = answer if method == "run" else answer[0]
    assert time.monotonic() - start < 2.0
    assert result.status is Status.DEADLINE_EXCEEDED and result.is_infrastructure_failure
    assert isinstance(result.error, DeadlineExceeded)
    assert server.fake.attempts[0] == 1, "a deadline is the caller's budget: not retried"


def test_default_deadline_comes_from_job_limits(start_fake: StartFake) -> None:
    server = start_fake("a", lambda fake, job, attempt: Delay(3.0))
    with SandboxClient(server.address, deadline_margin=0.2) as client:
        start = time.monotonic()
        result = client.run(math_job("4", "4", timeout=0.1))
    assert result.status is Status.DEADLINE_EXCEEDED and time.monotonic() - start < 1.5


# -- streaming ------------------------------------------------------------


def test_results_stream_as_they_finish(twin: Twin, start_fake: StartFake) -> None:
    server = start_fake("a", lambda fake, job, attempt: Delay(0.05 * (6 - job.index)))
    jobs = [math_job("1", "1") for _ in range(6)]
    streamed = twin.stream(server.address, jobs, client={"batch_size": 1})
    assert [r.index for r in streamed] != list(range(6)), "later jobs finished first and came first"
    assert sorted(r.index for r in streamed) == list(range(6))
    ordered = twin.call(server.address, "score_batch", jobs, client={"batch_size": 1})
    assert [r.index for r in ordered] == list(range(6))


# -- balancing over several daemons ---------------------------------------


def test_round_robin_spreads_and_survives_a_stopped_daemon(twin: Twin, start_fake: StartFake) -> None:
    slow = Delay(0.01)
    a = start_fake("a", lambda fake, job, attempt: slow)
    b = start_fake("b", lambda fake, job, attempt: slow)
    jobs = [math_job("1", "1") for _ in range(300)]

    def stop_b(count: int) -> None:
        if count == 30:
            b.stop()  # grace None: b's in-flight streams end with UNAVAILABLE

    results = twin.stream([a.address, b.address], jobs, stop_b, client={"batch_size": 5, "max_concurrent_batches": 4})
    assert sorted(r.index for r in results) == list(range(300))
    assert all(r.ok for r in results)
    assert a.fake.jobs_seen > 0 and b.fake.jobs_seen > 0
    assert {r.message for r in results} == {"a", "b"}


def test_health_checking_skips_a_draining_daemon(start_fake: StartFake) -> None:
    a, b = start_fake("a"), start_fake("b")
    with SandboxClient([a.address, b.address], batch_size=1) as client:
        # Until b's first health answer, round_robin has only a (run alone, the first batch all went there).
        for _ in range(50):
            client.score_batch([math_job("1", "1") for _ in range(10)])
            if b.fake.jobs_seen:
                break
            time.sleep(0.05)
        assert b.fake.jobs_seen > 0
        b.set_serving(False)
        time.sleep(0.5)
        before = b.fake.jobs_seen
        results = client.score_batch([math_job("1", "1") for _ in range(20)])
    assert all(r.ok for r in results) and b.fake.jobs_seen == before


def test_a_reward_model_client_skips_daemons_where_its_model_is_not_loaded(start_fake: StartFake) -> None:
    """A daemon serves while a reward model loads there (its job pools are warm): a client of that model sends its
    jobs only to daemons that say, by the model's own health service, that it is loaded."""
    a, b = start_fake("a"), start_fake("b")
    a.set_serving(True, reward_model_health_service("rm"))
    b.set_serving(False, reward_model_health_service("rm"))
    with SandboxClient([a.address, b.address], batch_size=1, reward_model="rm") as client:
        results = client.score_batch([reward_model_job("p", "c", model="rm") for _ in range(20)])
        assert all(r.ok for r in results) and a.fake.jobs_seen == 20 and b.fake.jobs_seen == 0
        b.set_serving(True, reward_model_health_service("rm"))
        for _ in range(50):
            client.score_batch([reward_model_job("p", "c", model="rm") for _ in range(10)])
            if b.fake.jobs_seen:
                break
            time.sleep(0.05)
    assert b.fake.jobs_seen > 0


def test_status_info_and_hint_reach_a_daemon_that_is_not_serving(twin: Twin, start_fake: StartFake) -> None:
    """A daemon that is starting, or whose pools cannot start sandboxes, says NOT_SERVING, and its
    status is what says why: `sandboxd status` failed with "backend unhealthy" exactly then."""
    a = start_fake("a")
    a.set_serving(False)
    time.sleep(0.5)
    assert [p.name for p in twin.call(a.address, "pool_status").pools] == ["a"]
    assert twin.call(a.address, "info").version == "fake-a"
    twin.call(a.address, "set_batch_hint", 8)
    assert [h.batch_size for h in a.fake.hints] == [8]
    # Jobs still wait for a serving daemon.
    result = twin.call(a.address, "run", math_job("1", "1"), client={"retry_policy": RetryPolicy(max_retries=0)})
    assert result.status == Status.UNAVAILABLE and a.fake.jobs_seen == 0


def test_info_comes_from_the_first_daemon_that_answers(twin: Twin, start_fake: StartFake,
                                                        socket_dir: Any) -> None:
    b = start_fake("b")
    gone = f"unix://{socket_dir}/nobody.sock"
    info = twin.call([gone, b.address], "info", client={"retry_policy": RetryPolicy(max_retries=0)})
    assert info.version == "fake-b"


def test_loopback_tcp_address_list(twin: Twin, start_fake: StartFake) -> None:
    a, b = start_fake("a", tcp=True), start_fake("b", tcp=True)
    # round_robin sends only to the connected daemons: 20 one-job batches could all be answered
    # by the first before the second connected (seen once, async twin, full suite).
    results = twin.call(
        [a.address, b.address], "score_batch", [math_job("1", "1") for _ in range(200)], client={"batch_size": 1}
    )
    assert all(r.ok for r in results) and {r.message for r in results} == {"a", "b"}


def test_batch_hint_is_shared_between_daemons(twin: Twin, start_fake: StartFake) -> None:
    a, b = start_fake("a"), start_fake("b")
    merged = twin.call([a.address, b.address], "set_batch_hint", 101, 8)
    assert [h.batch_size for h in a.fake.hints] == [51] and [h.sessions for h in b.fake.hints] == [4]
    assert sorted(p.name for p in merged.pools) == ["a", "b"]
    assert [list(h.pools) for h in a.fake.hints] == [[]]
    twin.call([a.address, b.address], "set_batch_hint", 64, pools=["math"])
    assert [list(h.pools) for h in b.fake.hints] == [[], ["math"]] and b.fake.hints[-1].batch_size == 32
    with pytest.raises(InvalidRequest, match="list of pool names"):
        twin.call(a.address, "set_batch_hint", 8, pools="math")
    twin.call([a.address, b.address], "score_batch", [math_job("1", "1") for _ in range(6)], client={"batch_size": 1})
    assert twin.call([a.address, b.address], "pool_status").jobs_total == 6
    assert twin.call(a.address, "info").version == "fake-a"


# -- sessions -------------------------------------------------------------


def test_session_keeps_state_sync(fake: FakeServer) -> None:
    with SandboxClient(fake.address) as client:
        with client.open_session(timeout=5) as session:
            assert session.run("x = 41").ok
            cell = session.run("x")
            assert cell.ok and cell.value == "41"
            assert session.run("y").status is Status.RUNTIME_ERROR
        with pytest.raises(SessionNotFound):
            session.run("x")
    assert fake.fake.sessions == {}


async def test_session_keeps_state_async(fake: FakeServer) -> None:
    async with AsyncSandboxClient(fake.address) as client:
        async with await client.open_session() as session:
            await session.run("x = 1")
            assert (await session.run("x")).value == "1"
        with pytest.raises(SessionNotFound):
            await session.run("x")


def test_a_final_cell_is_asked_for_and_trusted_only_when_the_daemon_ran_it_as_one(twin: Twin, fake: FakeServer) -> None:
    """A daemon that predates RunCellRequest.final drops the field and runs the cell in the session's own
    interpreter, where the session's code could have made its result: that answer must not pass for a final one."""

    def run() -> CellResult:
        if twin.kind == "sync":
            with SandboxClient(fake.address, retry_policy=FAST) as client, client.open_session() as session:
                session.run("answer = 41")  # the interpreter's, which a final cell does not see
                session.run("file answer = 42")
                return session.run("answer", final=True)

        async def go() -> CellResult:
            async with AsyncSandboxClient(fake.address, retry_policy=FAST) as client, \
                    await client.open_session() as session:
                await session.run("answer = 41")
                await session.run("file answer = 42")
                return await session.run("answer", final=True)

        return asyncio.run(go())

    answer = run()
    assert (answer.value, answer.session_alive) == ("42", False)
    assert [request.final for request in fake.fake.cell_requests] == [False, False, True]
    fake.fake.knows_final = False
    with pytest.raises(Unimplemented, match="does not run final cells"):
        run()
    assert fake.fake.sessions == {}


def test_a_retried_open_sends_its_request_id_again_and_each_open_its_own(twin: Twin, fake: FakeServer) -> None:
    """An UNAVAILABLE can come after the daemon opened the session: the retry carried nothing to tell it from a
    new open, and the daemon opened a second session, never closed. Each open_session call has a key of its own,
    sent again on each retry, for the daemon to answer with the session the first attempt opened."""
    fake.fake.open_failures = [Abort(grpc.StatusCode.UNAVAILABLE, "the connection dropped after the open")]

    def open_two_sync() -> None:
        with SandboxClient(fake.address, retry_policy=FAST) as client:
            for _ in range(2):
                client.open_session().close()

    async def open_two_async() -> None:
        async with AsyncSandboxClient(fake.address, retry_policy=FAST) as client:
            for _ in range(2):
                await (await client.open_session()).close()

    if twin.kind == "sync":
        open_two_sync()
    else:
        asyncio.run(open_two_async())
    keys = [request.request_id for request in fake.fake.open_requests]
    assert len(keys) == 3 and keys[0] == keys[1] != keys[2], keys
    assert all(len(key) == 32 and int(key, 16) >= 0 for key in keys)  # a uuid4's hex


def test_sessions_stick_to_one_daemon_and_spread(start_fake: StartFake) -> None:
    a, b = start_fake("a"), start_fake("b")
    with SandboxClient([a.address, b.address]) as client:
        sessions = [client.open_session() for _ in range(16)]
        for session in sessions:
            session.run("x = 1")
            homes = {session.run("x").stdout for _ in range(5)}
            assert len(homes) == 1, "every cell must reach the daemon holding the session"
        assert a.fake.sessions and b.fake.sessions
        for session in sessions:
            session.close()


# -- async specifics ------------------------------------------------------


async def test_async_batch_validates_before_iteration(fake: FakeServer) -> None:
    async with AsyncSandboxClient(fake.address) as client:
        with pytest.raises(InvalidRequest, match="empty"):
            client.run_batch([])
        results = [r async for r in client.run_batch([math_job("1", "1"), math_job("2", "1")])]
    assert sorted(r.reward for r in results) == [-1.0, 1.0]


async def test_async_breaking_out_of_a_batch_cancels_the_rest(start_fake: StartFake) -> None:
    server = start_fake("a", lambda fake, job, attempt: Delay(0.2))
    async with AsyncSandboxClient(server.address, batch_size=1) as client:
        async for _ in client.run_batch([math_job("1", "1") for _ in range(4)]):
            break
        assert (await client.run(math_job("1", "1"))).ok


# -- closing mid-batch ------------------------------------------------------


def test_closing_a_sync_client_mid_batch_ends_the_batch_with_its_error(start_fake: StartFake) -> None:
    """close() cancelled the chunks still queued, whose jobs were then never answered: the batch waited for them
    for ever. The chunk in flight raised grpc's ValueError, which no `except SandboxdError` catches."""
    import threading

    server = start_fake("a", lambda fake, job, attempt: Delay(1.0))
    client = SandboxClient(server.address, batch_size=1, max_concurrent_batches=1, deadline=10)
    outcome: list[BaseException | list[Any]] = []

    def score() -> None:
        try:
            outcome.append(client.score_batch([math_job("1", "1")] * 3))
        except BaseException as error:
            outcome.append(error)

    thread = threading.Thread(target=score, daemon=True)
    thread.start()
    time.sleep(0.3)
    client.close()
    thread.join(10)
    assert not thread.is_alive(), "score_batch hung after close()"
    assert len(outcome) == 1 and type(outcome[0]) is SandboxdError and "closed" in str(outcome[0])


async def test_closing_an_async_client_mid_batch_ends_the_batch_with_its_error(start_fake: StartFake) -> None:
    server = start_fake("a", lambda fake, job, attempt: Delay(1.0))
    client = AsyncSandboxClient(server.address, batch_size=1, max_concurrent_batches=1, deadline=10)
    task = asyncio.ensure_future(client.score_batch([math_job("1", "1")] * 3))
    await asyncio.sleep(0.3)
    await client.close()
    with pytest.raises(SandboxdError, match="closed"):
        await asyncio.wait_for(task, 10)
