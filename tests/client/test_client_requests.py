"""Pure tests: request building, validation, status and error mapping, targets, retry decisions."""

from __future__ import annotations

import base64
import json
import math
import pickle
import random
import zlib
from pathlib import Path
from typing import Any

import grpc
import pytest
from sandboxd_client import (
    CodeDetail,
    FunctionCase,
    InvalidRequest,
    Limit,
    MessageTooLarge,
    Result,
    RetryPolicy,
    SandboxClient,
    Status,
    StdioCase,
    code_job,
    execute_job,
    math_job,
    reward_model_job,
)
from sandboxd_client._core import ChunkState, plan_chunks, resolve_target
from sandboxd_client._proto.sandboxd.v1 import sandboxd_pb2 as pb
from sandboxd_client._requests import failure_result, job_deadline, to_result, validate_batch, validate_job
from sandboxd_client.errors import (
    DeadlineExceeded,
    Overloaded,
    PermissionDenied,
    SandboxdError,
    SessionNotFound,
    Unavailable,
    from_status,
    retry_after_from_metadata,
)

# -- statuses -------------------------------------------------------------


def test_status_mirrors_proto_without_prefix() -> None:
    for name, value in pb.Status.items():
        assert Status[name.removeprefix("STATUS_")] == value
    for name, value in pb.Limit.items():
        assert Limit[name.removeprefix("LIMIT_")] == value


@pytest.mark.parametrize(
    ("status", "infra"),
    [
        (Status.OK, False),
        (Status.WRONG_ANSWER, False),
        (Status.NO_ANSWER, False),
        (Status.SANDBOX_LOST, True),
        (Status.OVERLOADED, True),
        (Status.INTERNAL, True),
        (Status.UNAVAILABLE, True),
        (Status.UNSPECIFIED, True),
    ],
)
def test_infrastructure_split(status: Status, infra: bool) -> None:
    assert status.is_infrastructure_failure is infra


def test_unknown_wire_status_keeps_its_side() -> None:
    assert Status.from_proto(57) == Status.WRONG_ANSWER
    assert Status.from_proto(150) == Status.INTERNAL


def test_to_result_mirrors_job_result() -> None:
    msg = pb.JobResult(
        index=7,
        reward=0.5,
        status=pb.STATUS_WRONG_ANSWER,
        limit_hit=pb.LIMIT_WALL_TIME,
        message="2/4",
        attempts=2,
        code=pb.CodeDetail(language="python", tests_passed=2, tests_total=4),
        tests=[pb.TestResult(index=0, status=pb.STATUS_OK), pb.TestResult(index=1, status=pb.STATUS_TIMEOUT)],
    )
    result = to_result(msg)
    assert result.index == 7 and result.reward == 0.5 and result.status is Status.WRONG_ANSWER
    assert result.limit_hit is Limit.WALL_TIME and result.attempts == 2
    assert isinstance(result.details, CodeDetail) and result.pass_rate == 0.5
    assert [t.status for t in result.tests] == [Status.OK, Status.TIMEOUT]
    assert not result.is_infrastructure_failure
    assert result.raise_for_status() is result


def test_nan_reward_from_a_buggy_daemon_never_leaks() -> None:
    assert to_result(pb.JobResult(reward=float("nan"), status=pb.STATUS_OK)).reward == -1.0
    # The job's own failure value, not the contract's default (a reward model's raw score of +inf).
    assert to_result(pb.JobResult(reward=math.inf, status=pb.STATUS_OK), failure_value=0.0).reward == 0.0


def test_failure_result_statuses() -> None:
    assert failure_result(1, Unavailable("x"), failure_value=0.0, client_attempts=4).status is Status.UNAVAILABLE
    assert (
        failure_result(1, DeadlineExceeded("x"), failure_value=0.0, client_attempts=1).status
        is Status.DEADLINE_EXCEEDED
    )
    over = failure_result(1, Overloaded("x", retry_after=2.0), failure_value=-1.0, client_attempts=4)
    assert over.status is Status.OVERLOADED and over.retry_after_seconds == 2.0 and over.reward == -1.0
    with pytest.raises(Overloaded):
        over.raise_for_status()


# -- errors ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "cls"),
    [
        (grpc.StatusCode.INVALID_ARGUMENT, InvalidRequest),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, Overloaded),
        (grpc.StatusCode.UNAVAILABLE, Unavailable),
        (grpc.StatusCode.DEADLINE_EXCEEDED, DeadlineExceeded),
        (grpc.StatusCode.NOT_FOUND, SessionNotFound),
        (grpc.StatusCode.UNAUTHENTICATED, PermissionDenied),
    ],
)
def test_error_mapping(code: grpc.StatusCode, cls: type[SandboxdError]) -> None:
    error = from_status(code, "details")
    assert isinstance(error, cls) and error.code == code and "details" in str(error)


@pytest.mark.parametrize("details", ["Sent message larger than max (209715229 vs. 67108864)",
                                     "Received message larger than max (300000000 vs. 268435456)",
                                     "grpc: received message larger than max (9 vs. 4)"])
def test_grpc_size_limit_is_a_caller_error_not_an_overload(details: str) -> None:
    error = from_status(grpc.StatusCode.RESOURCE_EXHAUSTED, details)
    assert isinstance(error, MessageTooLarge) and isinstance(error, InvalidRequest) and not error.retryable
    assert error.code == grpc.StatusCode.RESOURCE_EXHAUSTED and details in str(error)


def test_caller_options_replace_the_message_limits_but_not_the_service_config() -> None:
    from sandboxd_client._core import MAX_MESSAGE_BYTES, channel_options

    options = channel_options({"loadBalancingConfig": [{"pick_first": {}}]},
                              [("grpc.max_send_message_length", 1 << 30), ("grpc.service_config", "{}")])
    assert options[0] == ("grpc.service_config", '{"loadBalancingConfig": [{"pick_first": {}}]}')
    assert [value for name, value in options if name == "grpc.max_send_message_length"] == [1 << 30]
    assert ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES) in options


def test_retry_hint_from_trailing_metadata() -> None:
    error = from_status(grpc.StatusCode.RESOURCE_EXHAUSTED, "full", (("retry-after-seconds", "1.5"),))
    assert isinstance(error, Overloaded) and error.retry_after == 1.5 and error.retryable
    assert retry_after_from_metadata((("retry-after-seconds", b"2"),)) == 2.0
    assert retry_after_from_metadata((("retry-after-seconds", "soon"),)) is None
    assert retry_after_from_metadata((("retry-after-seconds", "-1"),)) is None
    assert retry_after_from_metadata(None) is None


# -- code jobs: the dataset shapes in the wild ----------------------------


def test_verl_dict_and_json_string() -> None:
    tests = {"inputs": ["1\n", "2\n"], "outputs": ["2\n", "4\n"], "fn_name": None}
    job = code_job("```python\nprint(2*int(input()))\n```", tests)
    assert json.loads(job.code.tests.dataset_json) == tests
    raw = json.dumps(tests)
    assert code_job("x", raw).code.tests.dataset_json == raw  # verbatim


def test_humaneval_mbpp_codecontests_primeintellect_livecodebench() -> None:
    he = code_job("x", {"test": "def check(candidate): assert candidate(1) == 2", "entry_point": "f"})
    assert json.loads(he.code.tests.dataset_json)["entry_point"] == "f"
    mbpp = code_job("x", {"test_list": ["assert f(1) == 2"]})
    assert json.loads(mbpp.code.tests.dataset_json) == {"test_list": ["assert f(1) == 2"]}
    assert json.loads(code_job("x", ["assert f(1) == 2"]).code.tests.dataset_json) == {
        "test_list": ["assert f(1) == 2"]
    }
    cc = {"public_tests": {"input": ["1\n"], "output": ["1\n"]}, "private_tests": {"input": [], "output": []}}
    assert json.loads(code_job("x", cc, language="cpp").code.tests.dataset_json) == cc
    prime = json.dumps(
        {"language": "python", "test_cases": [{"input": "1", "output": "1", "type": "stdin_stdout"}]}
    )
    assert code_job("x", prime).code.tests.dataset_json == prime
    lcb = json.dumps([{"input": "1\n", "output": "1\n", "testtype": "stdin"}])
    assert code_job("x", lcb).code.tests.dataset_json == lcb


def compress(value: Any) -> str:
    """Test cases as verl's r1 recipe and LiveCodeBench store them: base64(zlib(pickle(value)))."""
    return base64.b64encode(zlib.compress(pickle.dumps(value))).decode()


def test_compressed_test_cases_of_verls_r1_recipe_and_livecodebench() -> None:
    """verl's r1 recipe writes LiveCodeBench rows' ground_truth as base64(zlib(pickle(JSON))); as a string that is
    not JSON it was taken for assert code (an INVALID_REQUEST, or a NameError that scored the model's failure)."""
    functional = json.dumps({"inputs": ["1\n2"], "outputs": ["3"], "fn_name": "add"})
    assert code_job("x", compress(functional)).code.tests.dataset_json == functional
    stdin = json.dumps({"inputs": ["1 2\n"], "outputs": ["3\n"], "fn_name": None})
    assert code_job("x", compress(stdin.encode())).code.tests.dataset_json == stdin
    # LiveCodeBench's own rows keep their private cases so: sent as the JSON they hold.
    private = [{"input": "2\n", "output": "4\n", "testtype": "stdin"}]
    row = {"public_test_cases": json.dumps(private), "private_test_cases": compress(json.dumps(private)),
           "metadata": "{}"}
    for shape in (row, json.dumps(row)):
        sent = json.loads(code_job("x", shape).code.tests.dataset_json)
        assert json.loads(sent["private_test_cases"]) == private
        assert sent["public_test_cases"] == row["public_test_cases"]
    # Strings that only look like base64 are still assert code; a base64 string that is not zlib is too.
    for code in ("assertSomethingLong", base64.b64encode(b"not zlib at all, just bytes").decode()):
        assert code_job("x", code).code.tests.assert_code == code


def test_a_rows_compressed_private_cases_are_decompressed_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """A LiveCodeBench row's private cases run to megabytes: a JSON row's were inflated and unpickled twice."""
    from sandboxd_client import _requests

    calls: list[str] = []
    decompress = _requests.compressed_tests

    def counted(text: str) -> str | None:
        calls.append(text)
        return decompress(text)

    monkeypatch.setattr(_requests, "compressed_tests", counted)
    private = json.dumps([{"input": "2\n", "output": "4\n", "testtype": "stdin"}])
    row = json.dumps({"public_test_cases": private, "private_test_cases": compress(private), "metadata": "{}"})
    assert json.loads(code_job("x", row).code.tests.dataset_json)["private_test_cases"] == private
    assert len(calls) == 1


class Alarm:
    def __reduce__(self) -> tuple[Any, ...]:
        return (print, ("unpickled: code ran",))


@pytest.mark.parametrize("payload", [
    pytest.param(Alarm(), id="a-callable"),
    pytest.param({"inputs": ["1"], "outputs": ["1"]}, id="not-text"),
    pytest.param(b"\x80\x05\x95garbage", id="text-of-no-pickle"),
])
def test_compressed_test_cases_are_read_as_plain_values_only(payload: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """A pickle that names a callable (print here; os.system as easily) is refused without calling it."""
    text = base64.b64encode(zlib.compress(payload)).decode() if isinstance(payload, bytes) else compress(payload)
    with pytest.raises(InvalidRequest, match="compressed test cases"):
        code_job("x", text)
    assert "code ran" not in capsys.readouterr().out


def test_compressed_test_cases_inflate_within_a_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    from sandboxd_client import _requests

    monkeypatch.setattr(_requests, "_COMPRESSED_TESTS_LIMIT", 1 << 10)
    small = json.dumps({"inputs": ["1"], "outputs": ["1"]})
    assert code_job("x", compress(small)).code.tests.dataset_json == small
    with pytest.raises(InvalidRequest, match="inflate past"):
        code_job("x", compress(json.dumps(["x" * 2000])))


def test_explicit_cases() -> None:
    stdio = code_job("x", [StdioCase("1\n", "2\n"), StdioCase("2\n", "4\n")]).code.tests
    assert [c.expected_stdout for c in stdio.stdio] == ["2\n", "4\n"]
    pairs = code_job("x", [("1\n", "2\n")]).code.tests
    assert pairs.stdio[0].stdin == "1\n"
    dicts = code_job("x", [{"stdin": "a", "expected_stdout": "b"}]).code.tests
    assert dicts.stdio[0].expected_stdout == "b"
    fn = code_job("x", [FunctionCase([1, 2], 3)], fn_name="add").code.tests
    assert fn.fn_name == "add" and json.loads(fn.function[0].args_json) == [1, 2]
    assert json.loads(fn.function[0].expected_json) == 3
    asserts = code_job("x", "assert candidate(1) == 2", entry_point="f").code.tests
    assert asserts.assert_code.startswith("assert") and asserts.entry_point == "f"


def test_numpy_like_values_from_parquet() -> None:
    class FakeArray(list):  # what verl hands over: arrays with tolist()
        def tolist(self) -> list:
            return list(self)

    job = code_job("x", {"inputs": FakeArray(["1"]), "outputs": FakeArray(["1"]), "fn_name": None})
    assert json.loads(job.code.tests.dataset_json)["inputs"] == ["1"]


def test_code_job_options() -> None:
    job = code_job(
        "x",
        [("1", "1")],
        language="cpp",
        extraction="whole",
        checker="float",
        float_tolerance=1e-3,
        reward_mode="fraction",
        timeout=2.0,
        total_timeout=30.0,
        memory_bytes=1 << 28,
        failure_value=0.0,
    )
    assert job.code.extraction == pb.CODE_EXTRACTION_WHOLE and job.code.checker == pb.CHECKER_FLOAT
    assert job.code.reward_mode == pb.REWARD_MODE_FRACTION and job.limits.timeout_seconds == 2.0
    assert job.limits.total_timeout_seconds == 30.0 and code_job("x", [("1", "1")]).limits.total_timeout_seconds == 0
    assert job.HasField("failure_value") and job.failure_value == 0.0
    assert not code_job("x", [("1", "1")]).HasField("failure_value")


def test_the_checker_is_left_to_the_daemon_unless_given() -> None:
    """code_job sent CHECKER_WHITESPACE by default, so the daemon's checker for a dataset's shape
    (CodeContests' case-insensitive tokens, LiveCodeBench's Decimal lines) never applied."""
    code_contests = {"public_tests": {"input": ["1"], "output": ["YES"]}}
    assert code_job("x", code_contests).code.checker == pb.CHECKER_UNSPECIFIED
    assert code_job("x", [("1", "1")]).code.checker == pb.CHECKER_UNSPECIFIED
    assert code_job("x", code_contests, checker="whitespace").code.checker == pb.CHECKER_WHITESPACE
    assert code_job("x", code_contests, checker="TOKENS_IGNORE_CASE").code.checker == pb.CHECKER_TOKENS_IGNORE_CASE
    assert code_job("x", code_contests, checker="lines_decimal").code.checker == pb.CHECKER_LINES_DECIMAL
    with pytest.raises(InvalidRequest, match="checker must be one of"):
        code_job("x", code_contests, checker="codecontests")


@pytest.mark.parametrize("kind", ["code", "math"])
def test_float_tolerance_is_sent_only_when_given(kind: str) -> None:
    """0.0 (exact comparison) goes on the wire with presence; None leaves the field unset (daemon default)."""
    from sandboxd_client.requests import job_from_row

    def build(**kwargs: Any) -> pb.CodeJob | pb.MathJob:
        job = code_job("x", [("1", "1")], **kwargs) if kind == "code" else math_job("x", "1", **kwargs)
        return getattr(job, kind)

    for given in ({}, {"float_tolerance": None}):
        unset = build(**given)
        assert not unset.HasField("float_tolerance")
        assert not type(unset).FromString(unset.SerializeToString()).HasField("float_tolerance")
    for value in (0.0, 0, 1e-9):
        sent = type(build()).FromString(build(float_tolerance=value).SerializeToString())
        assert sent.HasField("float_tolerance") and sent.float_tolerance == value
    row = {"kind": "code", "tests": [["1", "1"]]} if kind == "code" else {"ground_truth": "1"}
    assert getattr(job_from_row({**row, "completion": "x", "float_tolerance": 0.0}), kind).HasField("float_tolerance")
    assert not getattr(job_from_row({**row, "completion": "x"}), kind).HasField("float_tolerance")
    with pytest.raises(InvalidRequest, match="float_tolerance must be finite"):
        build(float_tolerance=math.nan)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"tests": []}, "empty"),
        ({"tests": ""}, "empty"),
        ({"tests": {"foo": 1}}, "dataset shapes"),
        ({"tests": {"inputs": ["1"], "outputs": []}}, "outputs"),
        ({"tests": [FunctionCase([1], 1)]}, "fn_name"),
        ({"tests": [("1", "1")], "failure_value": float("nan")}, "finite"),
        ({"tests": [("1", "1")], "timeout": -1}, "> 0"),
        ({"tests": [("1", "1")], "total_timeout": 0}, "total_timeout must be > 0, got 0"),
        ({"tests": [("1", "1")], "total_timeout": math.inf}, "total_timeout must be finite, got inf"),
        ({"tests": [("1", "1")], "extraction": "magic"}, "extraction"),
        ({"tests": [("1", "1")], "extraction": "tag"}, "tag"),
        ({"tests": [("1", "1")], "language": ""}, "language"),
        ({"tests": 42}, "not supported"),
    ],
)
def test_code_job_validation(kwargs: dict, match: str) -> None:
    with pytest.raises(InvalidRequest, match=match):
        code_job("x", **kwargs)


@pytest.mark.parametrize("value", [1.0, 2.5])
def test_a_failure_value_a_pass_cannot_beat_is_invalid_except_for_reward_models(value: float) -> None:
    refused = r"failure_value must be below 1\.0, the reward of a pass"
    builders = [lambda: code_job("x", [("1", "1")], failure_value=value),
                lambda: math_job("x", "1", failure_value=value), lambda: execute_job("x", failure_value=value)]
    for build in builders:
        with pytest.raises(InvalidRequest, match=refused):
            build()
    for kind in ("code", "math", "execute"):  # a job built by hand
        job = pb.Job(failure_value=value, **{kind: getattr(pb, f"{kind.capitalize()}Job")()})
        with pytest.raises(InvalidRequest, match=refused):
            validate_job(job)
    assert validate_job(reward_model_job("p", "c", model="rm", failure_value=value)).failure_value == value
    assert validate_job(code_job("x", [("1", "1")], failure_value=0.999)).failure_value == 0.999


def test_non_string_completion_is_invalid() -> None:
    with pytest.raises(InvalidRequest, match="completion"):
        code_job(None, [("1", "1")])  # type: ignore[arg-type]
    with pytest.raises(InvalidRequest, match="completion"):
        math_job(["4"], "4")  # type: ignore[arg-type]


def test_math_execute_reward_model_jobs() -> None:
    job = math_job("\\boxed{4}", 4, extraction="boxed")
    assert job.math.ground_truth == "4" and job.math.extraction == pb.MATH_EXTRACTION_BOXED
    with pytest.raises(InvalidRequest):
        math_job("x", float("inf"))
    with pytest.raises(InvalidRequest):
        math_job("x", "  ")
    ex = execute_job("print(1)", "python", "in", args=["-v"], files={"a.txt": "hi"}, collect_files=["out"])
    assert ex.execute.stdin == b"in" and ex.execute.files[0].content == b"hi"
    with pytest.raises(InvalidRequest):
        execute_job("x", args="-v")
    rm = reward_model_job("p", "c", model="rm")
    assert rm.reward_model.model == "rm"


def test_batch_validation() -> None:
    with pytest.raises(InvalidRequest, match="empty"):
        validate_batch([])
    with pytest.raises(InvalidRequest, match="no kind"):
        validate_job(pb.Job())
    with pytest.raises(InvalidRequest, match="Job"):
        validate_batch([{"completion": "x"}])
    with pytest.raises(InvalidRequest, match="single Job"):
        validate_batch(math_job("1", "1"))
    bad = math_job("1", "1")
    bad.failure_value = math.nan
    with pytest.raises(InvalidRequest, match="finite"):
        validate_job(bad)
    by_hand = pb.Job(math=pb.MathJob(completion="1", ground_truth="1"), limits=pb.Limits(total_timeout_seconds=-1))
    with pytest.raises(InvalidRequest, match=r"limits\.total_timeout_seconds must be finite and >= 0, got -1"):
        validate_job(by_hand)


def test_deadline_follows_limits_and_cases_as_far_as_the_daemon_stretches_them() -> None:
    job = code_job("x", {"inputs": ["1"] * 5, "outputs": ["1"] * 5}, timeout=2.0)
    assert job_deadline(job, default_timeout=10.0, margin=3.0) == 2.0 * 5 * 3 + 3.0
    capped = code_job("x", {"inputs": ["1"] * 5, "outputs": ["1"] * 5}, timeout=2.0, total_timeout=4.0)
    assert job_deadline(capped, default_timeout=10.0, margin=3.0) == 4.0 * 3 + 3.0
    assert job_deadline(math_job("1", "1"), default_timeout=10.0, margin=3.0) == 10.0 * 3 + 3.0
    # Every shape's cases count, LiveCodeBench's and PrimeIntellect's JSON strings too: a job that timed
    # out on all 20 cases was cut off by a deadline made for 1 and counted as an infrastructure failure.
    cases = [{"input": "1", "output": "1", "testtype": "stdin"}] * 20
    for tests in ({"public_test_cases": json.dumps(cases[:8]), "private_test_cases": cases[8:]},
                  {"test_cases": json.dumps([{"type": "stdin_stdout", "input": "1", "output": "1"}] * 20)},
                  {"public_test_cases": cases, "private_test_cases": "eJzLSM3JyQcABiwCFQ=="}):
        assert job_deadline(code_job("x", tests, timeout=2.0), default_timeout=10.0, margin=3.0) == 2.0 * 20 * 3 + 3.0


def test_the_clients_stretch_is_the_daemons() -> None:
    from sandboxd_client._requests import DEADLINE_STRETCH as CLIENTS

    from sandboxd.agent.protocol import DEADLINE_STRETCH as DAEMONS

    assert CLIENTS == DAEMONS


# -- targets --------------------------------------------------------------


def test_default_and_env_target(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SANDBOXD_ADDRESS", raising=False)
    assert resolve_target(None).grpc_target == "unix:///run/sandboxd/sandboxd.sock"
    monkeypatch.setenv("SANDBOXD_ADDRESS", "10.0.0.1:5000,10.0.0.2:5000")
    target = resolve_target(None)
    assert target.grpc_target == "ipv4:10.0.0.1:5000,10.0.0.2:5000"
    assert target.addresses == ("ipv4:10.0.0.1:5000", "ipv4:10.0.0.2:5000")


def test_list_targets_become_one_multi_address_target() -> None:
    assert resolve_target(["unix:///a.sock", "/b.sock"]).grpc_target == "unix:///a.sock,/b.sock"
    assert resolve_target(["[::1]:1", "ipv6:[::2]:2"]).grpc_target == "ipv6:[::1]:1,[::2]:2"
    assert resolve_target(["localhost:1", "127.0.0.2:2"]).grpc_target == "ipv4:127.0.0.1:1,127.0.0.2:2"
    assert resolve_target(["host:1"]).grpc_target == "host:1"
    dns = resolve_target("dns:///sandboxd.svc:50051")
    assert dns.grpc_target == "dns:///sandboxd.svc:50051" and dns.addresses == ("dns:///sandboxd.svc:50051",)
    with pytest.raises(InvalidRequest, match="mix"):
        resolve_target(["/a.sock", "127.0.0.1:1"])
    with pytest.raises(InvalidRequest, match="dns"):
        resolve_target(["dns:///a:1", "dns:///b:1"])
    with pytest.raises(InvalidRequest):
        resolve_target(["nonsense", "127.0.0.1:1"])


# -- retries --------------------------------------------------------------


def test_backoff_grows_with_jitter_and_honours_hint() -> None:
    policy = RetryPolicy(initial_backoff=0.1, max_backoff=1.0, multiplier=2.0, max_retry_after=5.0)
    rng = random.Random(0)
    for attempt, cap in [(1, 0.1), (2, 0.2), (3, 0.4), (6, 1.0)]:
        delays = [policy.delay(attempt, rng=rng) for _ in range(50)]
        assert all(cap / 2 <= d <= cap for d in delays)
        assert len(set(delays)) > 1
    assert 2.0 <= policy.delay(1, retry_after=2.0, rng=rng) <= 2.2
    assert policy.delay(1, retry_after=60.0, rng=rng) == 5.0


def _results(state: ChunkState, statuses: dict[int, pb.Status]) -> list[Result]:
    state.request()
    out = [state.on_message(pb.JobResult(index=i, status=s, reward=-1.0)) for i, s in statuses.items()]
    return [r for r in out if r is not None]


def test_chunk_retries_only_infrastructure_failures() -> None:
    jobs = {i: math_job("1", "1") for i in range(4)}
    state = ChunkState(jobs, RetryPolicy(max_retries=2))
    finals = _results(state, {0: pb.STATUS_OK, 1: pb.STATUS_WRONG_ANSWER, 2: pb.STATUS_SANDBOX_LOST})
    finals += state.on_end(Unavailable("gone"))  # index 3 unanswered: retried too
    assert sorted(r.index for r in finals) == [0, 1] and state.pending == [2, 3]
    retried = _results(state, {2: pb.STATUS_OK, 3: pb.STATUS_INTERNAL})[0]
    assert (retried.attempts, retried.client_attempts) == (0, 2)  # the daemon's count, the client's
    assert state.on_end(None) == [] and state.pending == [3]
    last = _results(state, {3: pb.STATUS_INTERNAL})  # retries exhausted: the infra result is final
    assert last[0].status is Status.INTERNAL and state.on_end(None) == [] and state.pending == []


def test_chunk_returns_a_do_not_retry_failure_at_once() -> None:
    """A pool that cannot start sandboxes: retrying held each answer back for the whole backoff (about 15 s)."""
    state = ChunkState({0: math_job("1", "1"), 1: math_job("1", "1")}, RetryPolicy())
    state.request()
    final = state.on_message(pb.JobResult(index=0, status=pb.STATUS_SANDBOX_LOST, reward=-1.0, do_not_retry=True))
    assert final is not None and (final.status, final.reward, final.client_attempts) == (Status.SANDBOX_LOST, -1.0, 1)
    assert state.on_message(pb.JobResult(index=1, status=pb.STATUS_SANDBOX_LOST, reward=-1.0)) is None
    assert state.on_end(None) == [] and state.pending == [1]  # an engine outage's loss is still retried


def test_chunk_gives_up_with_made_up_results_and_raises_caller_errors() -> None:
    state = ChunkState({0: math_job("1", "1", failure_value=0.0)}, RetryPolicy(max_retries=0))
    state.request()
    (result,) = state.on_end(Unavailable("gone"))
    assert (
        result.status is Status.UNAVAILABLE and result.reward == 0.0 and isinstance(result.error, Unavailable)
    )
    state = ChunkState({0: math_job("1", "1")}, RetryPolicy())
    state.request()
    with pytest.raises(InvalidRequest):
        state.on_end(InvalidRequest("bad"))


def test_overloaded_result_hint_sets_delay() -> None:
    state = ChunkState({0: math_job("1", "1")}, RetryPolicy(initial_backoff=0.01))
    state.request()
    assert (
        state.on_message(pb.JobResult(index=0, status=pb.STATUS_OVERLOADED, retry_after_seconds=1.0)) is None
    )
    state.on_end(None)
    assert 1.0 <= state.next_delay() <= 1.1


def test_chunks_split_by_count_and_bytes() -> None:
    jobs = [math_job("x" * 100, "1") for _ in range(10)]
    assert [len(c) for c in plan_chunks(jobs, max_jobs=4, max_bytes=1 << 20)] == [4, 4, 2]
    assert all(len(c) == 1 for c in plan_chunks(jobs, max_jobs=64, max_bytes=50))


def test_job_from_row() -> None:
    from sandboxd_client.requests import job_from_row

    code = job_from_row({"kind": "code", "completion": "x", "tests": [["1", "1"]], "language": "cpp"}, 3)
    assert code.index == 3 and code.code.language == "cpp" and code.code.tests.stdio[0].stdin == "1"
    math_row = job_from_row({"completion": "4", "ground_truth": 4, "failure_value": 0.0})
    assert math_row.math.ground_truth == "4" and math_row.failure_value == 0.0
    with pytest.raises(ValueError, match="row 2: a math row needs 'ground_truth'"):
        job_from_row({"kind": "math", "completion": "4"}, 2)
    with pytest.raises(ValueError, match="row 0: tests must not be empty"):
        job_from_row({"completion": "x", "tests": []})


@pytest.mark.parametrize(
    ("row", "expected"),
    [
        ({"completion": "x", "ground_truth": "1", "timeout_seconds": 30}, [("timeout_seconds", "timeout")]),
        ({"completion": "x", "ground_truth": "1", "tolerance": 1e-3}, [("tolerance", "float_tolerance")]),
        ({"completion": "x", "ground_truth": "1", "language": "cpp"}, [("language", "language")]),
        ({"completion": "x", "tests": [["1", "1"]], "stop_on_first_fail": True, "fnname": "f"},
         [("stop_on_first_fail", "stop_on_first_failure"), ("fnname", "fn_name")]),
        # The caller's own data, and the options and fields of the row's kind: nothing to say.
        ({"id": 7, "prompt": "p", "data_source": "apps", "task_id": "t/1", "completion": "x",
          "tests": [["1", "1"]], "language": "cpp", "timeout": 2, "kind": "code"}, []),
        ({"completion": "x", "ground_truth": "1", "tests": {}, "kind": "math"}, []),
        # A row job_from_row refuses has its own error.
        ({"completion": "x", "timeout_seconds": 3}, []),
        (["not", "a", "row"], []),
    ],
)  # fmt: skip
def test_ignored_row_options_names_what_looks_like_an_option(row: Any, expected: list[tuple[str, str]]) -> None:
    from sandboxd_client.requests import ignored_row_options

    assert ignored_row_options(row) == expected


def test_result_to_dict_is_json_ready() -> None:
    msg = pb.JobResult(index=1, reward=1.0, status=pb.STATUS_OK, execute=pb.ExecuteOutput(stdout=b"\xffok"))
    data = to_result(msg).to_dict()
    assert json.loads(json.dumps(data))["status"] == "OK"
    assert data["details"]["stdout"] == "\ufffdok" and data["error"] is None
    made = failure_result(0, Unavailable("gone"), failure_value=-1.0, client_attempts=2).to_dict()
    assert made["status"] == "UNAVAILABLE" and "gone" in made["error"] and made["is_infrastructure_failure"]


def test_reconnect_options_by_default_and_replaceable() -> None:
    from sandboxd_client._core import RECONNECT_OPTIONS, channel_options

    assert set(RECONNECT_OPTIONS) <= set(channel_options({}))
    assert dict(RECONNECT_OPTIONS)["grpc.max_reconnect_backoff_ms"] <= 1000
    options = channel_options({}, [("grpc.max_reconnect_backoff_ms", 5000)])
    assert [value for name, value in options if name == "grpc.max_reconnect_backoff_ms"] == [5000]


def test_token_and_tls_settings_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from sandboxd_client._core import TlsFiles, bearer_token, tls_files

    for name in ("SANDBOXD_TOKEN", "SANDBOXD_TLS_CA", "SANDBOXD_TLS_CERT", "SANDBOXD_TLS_KEY"):
        monkeypatch.delenv(name, raising=False)
    assert bearer_token(None) is None and tls_files(None, None, None, None) is None
    assert tls_files(True, None, None, None) == TlsFiles()  # the system's CAs
    monkeypatch.setenv("SANDBOXD_TOKEN", "from-env")
    assert bearer_token(None) == "from-env" and bearer_token("given") == "given"
    for bad in ("", "two words", "new\nline", "ü" * 20):
        with pytest.raises(InvalidRequest, match="token must be"):
            bearer_token(bad)
    (tmp_path / "ca.pem").write_bytes(b"CA")
    (tmp_path / "c.pem").write_bytes(b"CERT")
    (tmp_path / "c.key").write_bytes(b"KEY")
    monkeypatch.setenv("SANDBOXD_TLS_CA", str(tmp_path / "ca.pem"))
    assert tls_files(None, None, None, None) == TlsFiles(ca=b"CA")
    assert tls_files(False, None, None, None) is None
    assert tls_files(None, None, str(tmp_path / "c.pem"), str(tmp_path / "c.key")) == TlsFiles(b"CA", b"CERT", b"KEY")
    with pytest.raises(InvalidRequest, match="tls_cert and tls_key"):
        tls_files(None, None, str(tmp_path / "c.pem"), None)
    with pytest.raises(InvalidRequest, match=r"cannot read tls_ca .*none\.pem"):
        tls_files(None, str(tmp_path / "none.pem"), None, None)


def test_unix_socket_stays_plaintext_with_tls_settings(tmp_path: Path) -> None:
    (tmp_path / "ca.pem").write_bytes(b"CA")
    client = SandboxClient("unix:///tmp/none.sock", tls_ca=str(tmp_path / "ca.pem"))
    try:
        assert client._channel_credentials("unix:///tmp/none.sock") is None
        assert client._channel_credentials("127.0.0.1:1") is not None
    finally:
        client.close()
    with pytest.raises(InvalidRequest, match="credentials or the tls settings"):
        SandboxClient("127.0.0.1:1", tls=True, credentials=grpc.local_channel_credentials())
