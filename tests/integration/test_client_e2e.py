"""``sandboxd_client`` against real daemons: both twins, batches, deadlines, retries, balancing.

Every docker-marked test talks to a real ``sandboxd serve`` subprocess
(``tests/conftest.py``): the session ``daemon`` fixture, or daemons of its own
where the test kills, restarts or balances over them. The sync and the async
client run the same test bodies through :class:`Twin`. The bad-input tests at
the end need no daemon: they point at a socket that does not exist, so an
exception that arrives at once proves the client refused before any RPC.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
import time
from collections.abc import AsyncIterator, Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sandboxd_client import (
    AsyncSandboxClient,
    DeadlineExceeded,
    ExecuteOutput,
    InvalidRequest,
    Result,
    RetryPolicy,
    SandboxClient,
    Status,
    execute_job,
    math_job,
)
from sandboxd_client._proto.sandboxd.v1 import sandboxd_pb2 as pb
from sandboxd_client.trl import make_async_reward_func, make_reward_func

from tests.conftest import DaemonProcess, docker_available

docker = pytest.mark.docker

ADD = "```python\nprint(sum(map(int, input().split())))\n```"
ADD_TESTS = [("1 2\n", "3\n"), ("2 2\n", "4\n")]
# Patient retries for the tests that restart daemons: a fresh daemon takes
# about 9 s to serve here (interpreter, Docker, pool warm-up from snapshots).
PATIENT = RetryPolicy(max_retries=10)


def sleeper(seconds: float, out: str = "done", *, limit: float = 30.0) -> pb.Job:
    return execute_job(f"import time\ntime.sleep({seconds})\nprint({out!r})", timeout=limit)


def stdout_of(result: Result) -> bytes:
    """An execute job's output."""
    assert isinstance(result.details, ExecuteOutput), result
    return result.details.stdout


class Twin:
    """The sync or the async client behind one awaitable interface.

    The sync client's calls run in a worker thread (as a trainer's thread would
    call it), so both twins run the very same test bodies.
    """

    def __init__(self, kind: str, address: Any, **options: Any) -> None:
        self.kind = kind
        cls = SandboxClient if kind == "sync" else AsyncSandboxClient
        self.client: Any = cls(address, **options)

    async def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        fn = getattr(self.client, method)
        if self.kind == "sync":
            return await asyncio.to_thread(fn, *args, **kwargs)
        return await fn(*args, **kwargs)

    async def stream(self, jobs: list[pb.Job], **kwargs: Any) -> list[tuple[float, Result]]:
        """``run_batch``: (seconds since the call, result) in arrival order."""
        start = time.monotonic()
        if self.kind == "sync":

            def consume() -> list[tuple[float, Result]]:
                return [(time.monotonic() - start, r) for r in self.client.run_batch(jobs, **kwargs)]

            return await asyncio.to_thread(consume)
        return [(time.monotonic() - start, r) async for r in self.client.run_batch(jobs, **kwargs)]

    async def close(self) -> None:
        if self.kind == "sync":
            self.client.close()
        else:
            await self.client.close()


@pytest.fixture(params=["sync", "async"])
async def twin(request: pytest.FixtureRequest, daemon: DaemonProcess) -> AsyncIterator[Twin]:
    client = Twin(request.param, daemon.address)
    try:
        yield client
    finally:
        await client.close()


# ---------------------------------------------------------------------------
# The three job kinds.
# ---------------------------------------------------------------------------


@docker
async def test_score_math(twin: Twin) -> None:
    right = await twin.call("score_math", "The total is \\boxed{72}.", "72")
    assert (right.status, right.reward, right.ok, right.error) == (Status.OK, 1.0, True, None)
    assert right.details.extracted_answer == "72"
    assert right.attempts >= 1

    wrong = await twin.call("score_math", "\\boxed{71}", "72", failure_value=0.0)
    assert (wrong.status, wrong.reward) == (Status.WRONG_ANSWER, 0.0)
    assert not wrong.is_infrastructure_failure
    wrong.raise_for_status()  # a verdict on the model is not an error

    missing = await twin.call("score_math", "I am not sure.", "72")
    assert (missing.status, missing.reward) == (Status.NO_ANSWER, -1.0)

    numeric = await twin.call("score_math", "so the answer is \\boxed{\\frac{1}{2}}", 0.5)
    assert numeric.status == Status.OK


@docker
async def test_score_code(twin: Twin) -> None:
    passed = await twin.call("score_code", ADD, ADD_TESTS)
    assert (passed.status, passed.reward, passed.pass_rate) == (Status.OK, 1.0, 1.0)
    assert (passed.details.tests_passed, passed.details.tests_total) == (2, 2)

    half = await twin.call("score_code", "```python\nprint(3)\n```", ADD_TESTS)
    assert half.status == Status.WRONG_ANSWER and half.pass_rate == 0.5
    assert not half.is_infrastructure_failure

    # A dataset shape sent verbatim (verl / APPS style JSON string).
    apps = await twin.call("score_code", ADD, '{"inputs": ["5 6\\n"], "outputs": ["11\\n"]}')
    assert apps.status == Status.OK

    # MBPP asserts against a function.
    mbpp = await twin.call(
        "score_code", "```python\ndef add(a, b):\n    return a + b\n```", {"test_list": ["assert add(1, 2) == 3"]}
    )
    assert mbpp.status == Status.OK, mbpp.message


@docker
async def test_execute(twin: Twin) -> None:
    echo = await twin.call("execute", "import sys\nprint(sys.stdin.read().upper())", stdin="hi")
    assert echo.status == Status.OK
    assert (echo.details.exit_code, echo.details.stdout) == (0, b"HI\n")

    failing = await twin.call("execute", "import sys\nprint('x', file=sys.stderr)\nsys.exit(3)")
    assert failing.details.exit_code == 3 and failing.details.stderr == b"x\n"
    assert not failing.is_infrastructure_failure

    # The job's own limit is a verdict on the program, not an infrastructure failure.
    # timeout= is the job's limit, on the builders and on score_*/execute alike.
    slow = await twin.call("execute", "import time\ntime.sleep(30)", timeout=1.0)
    assert slow.status == Status.TIMEOUT and not slow.is_infrastructure_failure


# ---------------------------------------------------------------------------
# Batches.
# ---------------------------------------------------------------------------


@docker
async def test_run_batch_yields_as_they_finish(twin: Twin) -> None:
    jobs = [sleeper(2.5, "slow"), *(execute_job(f"print({i})") for i in range(1, 8))]
    arrivals = await twin.stream(jobs)

    indices = [r.index for _, r in arrivals]
    assert sorted(indices) == list(range(len(jobs)))  # every index exactly once
    assert all(r.status == Status.OK for _, r in arrivals)
    assert indices[-1] == 0, "the slow job came first in the input and must arrive last"
    first_quick = arrivals[0][0]
    slow_at = arrivals[-1][0]
    assert slow_at >= 2.5
    assert first_quick < slow_at - 1.5, f"quick results waited for the slow one: {arrivals}"
    for _, r in arrivals:
        expected = b"slow\n" if r.index == 0 else f"{r.index}\n".encode()
        assert stdout_of(r) == expected


@docker
async def test_score_batch_in_input_order(twin: Twin, daemon: DaemonProcess) -> None:
    # Several RunBatch streams (batch_size=3), later jobs finishing first.
    client = Twin(twin.kind, daemon.address, batch_size=3)
    try:
        n = 10
        jobs = [
            execute_job(f"import time\ntime.sleep({(n - i) * 0.1:.1f})\nprint({i})", timeout=10) for i in range(n)
        ]
        jobs += [math_job(f"\\boxed{{{i}}}", str(i if i % 2 else i + 1), failure_value=0.0) for i in range(n)]
        results = await client.call("score_batch", jobs)
    finally:
        await client.close()
    assert [r.index for r in results] == list(range(2 * n))
    assert [r.details.stdout for r in results[:n]] == [f"{i}\n".encode() for i in range(n)]
    assert [r.reward for r in results[n:]] == [float(i % 2) for i in range(n)]


# ---------------------------------------------------------------------------
# Deadlines.
# ---------------------------------------------------------------------------


@docker
async def test_deadline_single_job(twin: Twin) -> None:
    start = time.monotonic()
    result = await twin.call("run", sleeper(20, limit=25), deadline=1.5)
    elapsed = time.monotonic() - start
    assert result.status == Status.DEADLINE_EXCEEDED
    assert result.is_infrastructure_failure
    assert isinstance(result.error, DeadlineExceeded) and isinstance(result.error, TimeoutError)
    assert result.client_attempts == 1, "a deadline is the caller's budget: never retried"
    assert result.attempts == 0, "no daemon answer: the client made this result"
    assert elapsed < 5, elapsed
    with pytest.raises(DeadlineExceeded):
        result.raise_for_status()


@docker
async def test_deadline_batch_keeps_answers(twin: Twin) -> None:
    results = await twin.call("score_batch", [sleeper(20, limit=25), execute_job("print('fast')")], deadline=2.0)
    assert results[0].status == Status.DEADLINE_EXCEEDED
    assert isinstance(results[0].error, DeadlineExceeded)
    assert results[1].status == Status.OK and results[1].details.stdout == b"fast\n"


# ---------------------------------------------------------------------------
# A daemon killed and restarted on the same socket.
# ---------------------------------------------------------------------------

# The daemons below run Python programs and math only: no langs or sessions pool to start.
PYTHON_AND_MATH = {"SANDBOXD_POOL_IMAGES": "python", "SANDBOXD_SESSIONS_ENABLED": "false"}


@docker
@pytest.mark.slow
@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_retry_across_daemon_restart(tmp_path: Path, kind: str) -> None:
    if not docker_available():
        pytest.skip("no Docker engine")
    first = DaemonProcess(tmp_path, "r", extra_env=PYTHON_AND_MATH)
    second: list[DaemonProcess] = []
    try:
        first.wait_serving()
        client = Twin(kind, first.address, retry_policy=PATIENT)
        try:
            warm = await client.call("score_math", "\\boxed{1}", "1")
            assert warm.status == Status.OK

            def restart() -> None:
                time.sleep(1.0)
                first.process.send_signal(signal.SIGKILL)  # no drain, no socket cleanup
                first.process.wait()
                time.sleep(2.0)
                second.append(DaemonProcess(tmp_path, "r", extra_env=PYTHON_AND_MATH))  # same socket path

            restarter = threading.Thread(target=restart)
            restarter.start()
            # In flight when the daemon dies: the stream breaks, then every
            # retry finds nothing until the new daemon serves.
            start = time.monotonic()
            result = await client.call("run", sleeper(3, "after restart", limit=10))
            elapsed = time.monotonic() - start
            restarter.join()
            assert result.status == Status.OK, (result, elapsed)
            assert result.details.stdout == b"after restart\n"
            # attempts is the daemon's count (the new daemon ran it once); the
            # client's retries show in client_attempts and in the time taken.
            assert result.attempts == 1 and result.client_attempts > 1, result
            assert elapsed > 3.5, elapsed
            # The answer came from the new daemon.
            assert second and second[0].process.poll() is None
            status = await client.call("pool_status")
            assert status.jobs_total >= 1
        finally:
            await client.close()
    finally:
        for process in (first, *second):
            process.stop()


# ---------------------------------------------------------------------------
# Two daemons behind round_robin.
# ---------------------------------------------------------------------------


@docker
@pytest.mark.slow
async def test_round_robin_two_daemons(tmp_path: Path) -> None:
    if not docker_available():
        pytest.skip("no Docker engine")
    a, b = (DaemonProcess(tmp_path, name, extra_env=PYTHON_AND_MATH) for name in ("a", "b"))
    try:
        a.wait_serving()
        b.wait_serving()
        with (
            SandboxClient([a.address, b.address], batch_size=2, retry_policy=PATIENT) as both,
            SandboxClient(a.address) as only_a,
            SandboxClient(b.address) as only_b,
        ):
            # round_robin picks among READY connections only: a fresh channel's first
            # RPCs all go to whichever daemon connected first. Warm up, then measure.
            await asyncio.to_thread(both.score_batch, [math_job("\\boxed{1}", "1")] * 4)
            await asyncio.sleep(1.0)
            before = [only_a.pool_status().jobs_total, only_b.pool_status().jobs_total]
            jobs = [math_job(f"\\boxed{{{i}}}", str(i)) for i in range(24)]
            results = await asyncio.to_thread(both.score_batch, jobs)
            assert [r.status for r in results] == [Status.OK] * len(jobs)
            totals = [only_a.pool_status().jobs_total, only_b.pool_status().jobs_total]
            spread = [t - b for t, b in zip(totals, before, strict=True)]
            assert all(n > 0 for n in spread), f"round_robin left a daemon idle: {spread}"
            assert sum(spread) >= len(jobs)
            merged = both.pool_status()
            assert merged.jobs_total == sum(totals)

            # Stop one daemon while a batch is running on both: every job still answered.
            jobs = [sleeper(1.0, str(i), limit=10) for i in range(24)]
            arrivals: list[Result] = []

            def consume() -> None:
                for r in both.run_batch(jobs):
                    arrivals.append(r)

            consumer = threading.Thread(target=consume)
            consumer.start()
            deadline = time.monotonic() + 30
            while not arrivals and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            assert arrivals, "no result within 30 s"
            # Finished or still running: with 1 s jobs, the first answer may come
            # from a while b's first jobs are still in flight.
            b_status = only_b.pool_status()
            before_b = b_status.jobs_total + b_status.in_flight
            await asyncio.to_thread(b.stop)
            await asyncio.to_thread(consumer.join, 120)
            assert not consumer.is_alive()
            assert sorted(r.index for r in arrivals) == list(range(len(jobs)))
            bad = [r for r in arrivals if r.status != Status.OK]
            assert not bad, bad
            assert all(stdout_of(r) == f"{r.index}\n".encode() for r in arrivals)
            assert before_b > totals[1], "b took no part in the second batch before it stopped"
    finally:
        a.stop()
        b.stop()


# ---------------------------------------------------------------------------
# Bad input: refused by the client before any RPC (no daemon needed).
# ---------------------------------------------------------------------------

NOWHERE = "unix:///nonexistent/sandboxd-e2e.sock"


def _refused_fast(start: float) -> None:
    # An RPC to a missing socket would come back as an UNAVAILABLE result after
    # seconds of retries, not as an exception within a fraction of a second.
    assert time.monotonic() - start < 0.5


@pytest.mark.parametrize(
    ("call", "fragment"),
    [
        (lambda c: c.score_math(42, "1"), "completion must be a str"),
        (lambda c: c.score_math("x", ["1"]), "ground_truth must be a str or number"),
        (lambda c: c.score_math("x", float("nan")), "finite"),
        (lambda c: c.score_math("x", "  "), "must not be empty"),
        (lambda c: c.score_code("x", 42), "not supported"),
        (lambda c: c.score_code("x", []), "must not be empty"),
        (lambda c: c.score_code("x", {"inputs": ["1"]}), "no 'outputs'"),
        (lambda c: c.execute(b"print(1)"), "must be a str"),
        (lambda c: c.execute("print(1)", stdin=3), "stdin"),
        (lambda c: c.run("print(1)"), "expected a sandboxd.v1.Job"),
        (lambda c: c.run(pb.Job()), "no kind"),
        (lambda c: c.run(math_job("x", "1"), deadline=-1), "deadline"),
        (lambda c: c.score_math("x", "1", timeout=-1), "timeout"),
        (lambda c: c.score_batch([]), "empty batch"),
        (lambda c: c.score_batch(math_job("x", "1")), "single Job"),
        (lambda c: c.score_batch([math_job("x", "1"), "nope"]), "expected a sandboxd.v1.Job"),
        (lambda c: c.run_batch([]), "empty batch"),
    ],
)
def test_bad_input_sync(call: Any, fragment: str) -> None:
    with SandboxClient(NOWHERE) as client:
        start = time.monotonic()
        with pytest.raises(InvalidRequest, match=fragment):
            call(client)
        _refused_fast(start)


@pytest.mark.parametrize(
    ("call", "fragment"),
    [
        (lambda c: c.score_math(42, "1"), "completion must be a str"),
        (lambda c: c.score_code("x", 42), "not supported"),
        (lambda c: c.run("print(1)"), "expected a sandboxd.v1.Job"),
        (lambda c: c.score_batch([]), "empty batch"),
        (lambda c: c.score_batch([math_job("x", "1"), None]), "expected a sandboxd.v1.Job"),
    ],
)
async def test_bad_input_async(call: Any, fragment: str) -> None:
    async with AsyncSandboxClient(NOWHERE) as client:
        start = time.monotonic()
        with pytest.raises(InvalidRequest, match=fragment):
            await call(client)
        _refused_fast(start)
        # run_batch refuses when called, before anyone iterates.
        with pytest.raises(InvalidRequest, match="empty batch"):
            client.run_batch([])


def test_bad_client_options() -> None:
    bad: tuple[dict[str, Any], ...] = ({"deadline": 0}, {"job_timeout": -1}, {"batch_size": 0}, {"max_retries": -1})
    for options in bad:
        with pytest.raises(InvalidRequest):
            SandboxClient(NOWHERE, **options)
    with pytest.raises(InvalidRequest, match="cannot mix"):
        SandboxClient(["unix:///a.sock", "127.0.0.1:1"])
    with pytest.raises(InvalidRequest, match="non-empty strings"):
        SandboxClient(["unix:///a.sock", ""])


def _trl_columns(n: int, **columns: Iterable[Any]) -> dict[str, Any]:
    return {"prompts": ["p"] * n, "completions": ["\\boxed{1}"] * n, **{k: list(v) for k, v in columns.items()}}


@pytest.mark.parametrize("make", [make_reward_func, make_async_reward_func])
async def test_reward_func_missing_column(make: Any) -> None:
    reward = make("math", address=NOWHERE)
    start = time.monotonic()
    with pytest.raises(ValueError, match=r"ground-truth column.*available columns: \['question'\]"):
        out = reward(**_trl_columns(2, question=["a", "b"]))
        if asyncio.iscoroutine(out):
            await out
    _refused_fast(start)
    code = make("code", address=NOWHERE)
    with pytest.raises(ValueError, match="tests column"):
        out = code(**_trl_columns(1, answer=["1"]))
        if asyncio.iscoroutine(out):
            await out
    mapped = make("math", address=NOWHERE, column_map={"ground_truth": "gold"})
    with pytest.raises(ValueError, match="'gold'"):
        out = mapped(**_trl_columns(1, answer=["1"]))
        if asyncio.iscoroutine(out):
            await out
    with pytest.raises(ValueError, match="2 values for 3 completions"):
        out = reward(**_trl_columns(3, answer=["1", "2"]))
        if asyncio.iscoroutine(out):
            await out


def test_reward_func_bad_configuration() -> None:
    with pytest.raises(ValueError, match="kind"):
        make_reward_func("maths")
    with pytest.raises(ValueError, match="failure_value"):
        make_reward_func("math", failure_value=float("nan"))
    with pytest.raises(ValueError, match="column_map"):
        make_reward_func("math", column_map={"gold": "answer"})


@docker
async def test_reward_func_malformed_row_scores_infra_value(daemon: DaemonProcess) -> None:
    """A bad row costs that row (infra value), not the batch; good rows still score."""
    reward = make_reward_func("math", address=daemon.address, failure_value=0.0, infra_failure_value=None)
    out = await asyncio.to_thread(
        reward, prompts=["p"] * 3, completions=["\\boxed{1}", "\\boxed{2}", "\\boxed{3}"], answer=["1", None, "4"]
    )
    assert out == [1.0, None, 0.0]


# ---------------------------------------------------------------------------
# Hostile input (issue #52): a number for every completion, the daemon unharmed.
# ---------------------------------------------------------------------------

# Each prints or boxes a lone surrogate, which reaches the daemon as U+FFFD: a wrong answer.
SURROGATE_CODE = "```python\nprint('\ud800')\n```"
SURROGATE_MATH = "The answer is \\boxed{1\udc00}."
DEEP = "[" * 100_000 + "]" * 100_000


def nested_list(depth: int) -> Any:
    value: Any = []
    for _ in range(depth):
        value = [value]
    return value


@contextlib.contextmanager
def unharmed(daemon: DaemonProcess) -> Iterator[None]:
    """Asserts, after the block, that the daemon still serves and that none of its handlers raised meanwhile."""
    logged = daemon.log_path.stat().st_size
    yield
    assert daemon.process.poll() is None
    with open(daemon.log_path, errors="replace") as log:
        log.seek(logged)
        assert "Traceback" not in log.read(), daemon.log_tail()
    with SandboxClient(daemon.address) as client:
        assert client.score_code(ADD, ADD_TESTS).status == Status.OK


@docker
async def test_a_lone_surrogate_scores_the_failure_value_through_every_call(twin: Twin, daemon: DaemonProcess) -> None:
    with unharmed(daemon):
        code = await twin.call("score_code", SURROGATE_CODE, [("", "1\n")])
        math = await twin.call("score_math", SURROGATE_MATH, "1")
        ran = await twin.call("run", math_job(SURROGATE_MATH, "2\ud800"))
        batch = await twin.call("score_batch", [execute_job("import sys\nprint(sys.stdin.read() + '\udfff')",
                                                            stdin="\ud800"),
                                                math_job(SURROGATE_MATH, "1"), math_job("\\boxed{1}", "1")])
    assert (code.status, code.reward) == (Status.WRONG_ANSWER, -1.0)
    assert (math.status, math.reward) == (Status.WRONG_ANSWER, -1.0)
    assert (ran.status, ran.reward) == (Status.WRONG_ANSWER, -1.0)
    assert stdout_of(batch[0]) == "\ufffd\ufffd\n".encode()
    assert [r.reward for r in batch[1:]] == [-1.0, 1.0]


@docker
@pytest.mark.parametrize("flavour", ["sync", "async"])
async def test_trl_reward_functions_score_hostile_rows(daemon: DaemonProcess, flavour: str) -> None:
    """A lone surrogate in a completion or a ground truth, an escaped one in raw tests JSON: the failure value;
    tests nested too deeply: the infrastructure value; the good row: its reward."""
    completions = [SURROGATE_MATH, "\\boxed{2}", SURROGATE_CODE, "```python\nprint(input())\n```",
                   "```python\nprint(input())\n```", "\\boxed{3}"]
    columns = {
        "answer": ["1", "2\ud800", None, None, None, "3"],
        "tests": [None, None, [("", "1\n")], '{"inputs": ["\\ud800\\n"], "outputs": ["1\\n"]}', DEEP, None],
    }
    options: dict[str, Any] = {"address": daemon.address, "infra_failure_value": None}
    with unharmed(daemon):
        if flavour == "sync":
            rewards = await asyncio.to_thread(make_reward_func(**options), prompts=["p"] * 6,
                                              completions=completions, **columns)
        else:
            rewards = await make_async_reward_func(**options)(prompts=["p"] * 6, completions=completions, **columns)
    assert rewards == [-1.0, -1.0, -1.0, -1.0, None, 1.0]


@docker
async def test_tests_json_with_a_lone_surrogate_escape(twin: Twin, daemon: DaemonProcess) -> None:
    """Sent by this client: as U+FFFD, scored. Sent verbatim by another client: INVALID_ARGUMENT, where the daemon
    had sent it on to a sandbox that could not write it to the program (INTERNAL)."""
    echo = "```python\nprint(input())\n```"
    raw = '{"inputs": ["\\ud800\\n"], "outputs": ["\\ufffd\\n"]}'
    with unharmed(daemon):
        passed = await twin.call("score_code", echo, raw)
        listed = await twin.call("score_code", echo, '[{"input": "x\\udc00", "output": "y", "testtype": "stdin"}]')
        verbatim = pb.Job(code=pb.CodeJob(completion=echo, tests=pb.CodeTests(dataset_json=raw)))
        with pytest.raises(InvalidRequest, match="case 0's stdin holds a lone surrogate"):
            await twin.call("score_batch", [verbatim])
    assert passed.status == Status.OK, passed.message
    assert (listed.status, listed.reward) == (Status.WRONG_ANSWER, -1.0)


@docker
async def test_tests_nested_too_deeply_are_invalid(twin: Twin, daemon: DaemonProcess) -> None:
    deep_tests: list[Any] = [DEEP, '{"inputs": ' + DEEP + ', "outputs": []}', [{"args": [nested_list(100_000)],
                                                                               "expected": 1}]]
    with unharmed(daemon):
        for tests in deep_tests:
            with pytest.raises(InvalidRequest, match="nested too deeply"):
                await twin.call("score_code", "```python\nprint(1)\n```", tests)
        # Another client's, verbatim: the daemon's parse refuses them.
        for message in (pb.CodeTests(dataset_json=DEEP),
                        pb.CodeTests(fn_name="f", function=[pb.FunctionCase(args_json=DEEP, expected_json="1")])):
            job = pb.Job(code=pb.CodeJob(completion="```python\ndef f(x):\n    return 1\n```", tests=message))
            with pytest.raises(InvalidRequest, match="not valid JSON"):
                await twin.call("score_batch", [job])
