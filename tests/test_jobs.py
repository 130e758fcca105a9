"""Preparing jobs in the daemon: the test-plan cache that completions of one prompt share."""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Mapping
from typing import Any, cast

import pytest
from sandboxd_client._proto.sandboxd.v1 import sandboxd_pb2 as pb

from sandboxd import jobs
from sandboxd.agent.messages import JobResult
from sandboxd.config import Config
from sandboxd.errors import InvalidRequest

TESTS = {"test": "def check(candidate):\n    assert candidate(2) == 4\n", "entry_point": "double",
         "prompt": "def double(x):\n"}


def agent_job(prepared: jobs.PreparedJob) -> dict[str, Any]:
    """The job a sandbox is sent: there is one for every job prepared here (as a plain dict, whatever its kind)."""
    assert prepared.agent_job is not None
    return cast("dict[str, Any]", prepared.agent_job)


def code_job(index: int, completion: str, tests: Mapping[str, object] | str) -> pb.Job:
    dataset = tests if isinstance(tests, str) else json.dumps(tests)
    return pb.Job(index=index, code=pb.CodeJob(completion=completion, tests=pb.CodeTests(dataset_json=dataset)))


def test_completions_of_one_prompt_share_one_plan() -> None:
    first = code_job(0, "```python\n    return 2 * x\n```", TESTS)
    second = code_job(1, "```python\ndef double(x):\n    return x + x\n```", TESTS)
    assert jobs._test_plan(first.code.tests) is jobs._test_plan(second.code.tests)
    prepared = [jobs.prepare(job, Config()) for job in (first, second)]
    # Shared tests, each completion's own program.
    programs = [agent_job(p)["program"]["code"] for p in prepared]
    assert "return 2 * x" in programs[0] and "return x + x" not in programs[0]
    assert "return x + x" in programs[1] and "return 2 * x" not in programs[1]
    other = code_job(2, "```python\n    return 2 * x\n```", {**TESTS, "entry_point": "twice"})
    assert jobs._test_plan(other.code.tests) is not jobs._test_plan(first.code.tests)


def test_large_tests_are_not_kept() -> None:
    padding = "# " + "x" * jobs.PLAN_CACHE_KEY_CHARS + "\n"
    big = {**TESTS, "test": padding + TESTS["test"]}
    job = code_job(0, "```python\n    return 2 * x\n```", big)
    one, two = jobs._test_plan(job.code.tests), jobs._test_plan(job.code.tests)
    assert one == two and one is not two
    # Every field counts towards the size, the entry point's name too.
    name = "f" * jobs.PLAN_CACHE_KEY_CHARS
    tests = pb.CodeTests(assert_code=f"assert {name}(1) == 1\n", entry_point=name)
    assert jobs._test_plan(tests) is not jobs._test_plan(tests)


def test_the_judge_gets_the_datasets_names_as_it_would_parse_them() -> None:
    """harness_arguments gives a judge the names the dataset's own code binds, and those before a completion, parsed
    once per plan here; they are what the judge parses itself without them. Large tests leave them to the judge."""
    from sandboxd.verifiers.python import judge

    prompt = 'import math\nLIMIT = 3\ndef double(x):\n    """Twice x."""\n'
    tests = {**TESTS, "prompt": prompt, "test": TESTS["test"] + "pytestmark = []\n"}
    harness = agent_job(jobs.prepare(code_job(0, "```python\n    return 2 * x\n```", tests), Config()))["harness"]
    assert set(harness["own_names"]) == judge._own_names(tests["prompt"], tests["test"])
    assert set(harness["own_names"]) == {"check", "pytestmark", "LIMIT", "double"}
    plan = jobs._test_plan(code_job(0, "", tests).code.tests)
    assert tuple(harness["head_names"]) == judge._source_names(plan.prelude_head + plan.prompt_head + "\n")
    padding = "# " + "x" * jobs.DATASET_NAMES_MAX_CHARS + "\n"
    large = agent_job(jobs.prepare(code_job(0, "```python\n    return 2 * x\n```",
                                            {**tests, "test": padding + tests["test"]}), Config()))["harness"]
    assert "own_names" not in large and "head_names" not in large


def test_bad_tests_fail_every_job_that_sends_them() -> None:
    for index in (3, 4):
        with pytest.raises(InvalidRequest, match=rf"jobs\[{index}\].code.tests: dataset_json.test does not parse"):
            jobs.prepare(code_job(index, "```python\nx = 1\n```", {**TESTS, "test": "def check(:\n"}), Config())


# -- a lone surrogate, which only a JSON escape gets past protobuf's UTF-8 check ----------------------


@pytest.mark.parametrize("dataset", [
    '{"inputs": ["\\ud800\\n"], "outputs": ["1\\n"]}',
    '{"inputs": ["1\\n"], "outputs": ["x\\uDFFF"]}',
    '[{"input": "\\udc00\\ud800", "output": "1", "testtype": "stdin"}]',
    '{"public_tests": {"input": ["\\ud800"], "output": ["1"]}}',
])
def test_a_stdio_case_with_a_lone_surrogate_is_invalid(dataset: str) -> None:
    """Red team: it was sent on, and the agent could not write it to the program (UnicodeEncodeError: INTERNAL)."""
    with pytest.raises(InvalidRequest, match=r"code.tests: dataset_json: case 0's \w+ holds a lone surrogate"):
        jobs.prepare(code_job(0, "```python\nprint(input())\n```", dataset), Config())


def test_surrogate_pairs_and_function_arguments_with_a_lone_surrogate_are_valid() -> None:
    pair = jobs.prepare(code_job(0, "```python\nprint(input())\n```",
                                 '{"inputs": ["\\ud83d\\ude00\\n"], "outputs": ["\\uD83D\\uDE00\\n"]}'), Config())
    assert agent_job(pair)["plan"]["stdio"] == [{"stdin": "\U0001f600\n", "expected_stdout": "\U0001f600\n"}]
    # A Python str may hold one: the function gets it, and its answer is judged as any other.
    call = jobs.prepare(code_job(0, "```python\ndef f(x):\n    return len(x)\n```",
                                 '{"fn_name": "f", "inputs": [["\\ud800"]], "outputs": [1]}'), Config())
    assert agent_job(call)["harness"]["cases"][0]["args"] == ["\ud800"]


# -- checker: unset takes LiveCodeBench's grader's for its rows, whitespace for others -----------------

CODE_CONTESTS = {"public_tests": {"input": ["1\n"], "output": ["YES\n"]}}
LIVECODEBENCH = [{"input": "1\n", "output": "2.0\n", "testtype": "stdin"}]


@pytest.mark.parametrize(("tests", "checker", "sent"), [
    pytest.param(CODE_CONTESTS, pb.CHECKER_UNSPECIFIED, "whitespace", id="code-contests"),
    pytest.param(LIVECODEBENCH, pb.CHECKER_UNSPECIFIED, "lines_decimal", id="livecodebench"),
    pytest.param({"inputs": ["1\n"], "outputs": ["2\n"]}, pb.CHECKER_UNSPECIFIED, "whitespace", id="verl-apps"),
    pytest.param(CODE_CONTESTS, pb.CHECKER_WHITESPACE, "whitespace", id="explicit-wins"),
    pytest.param(LIVECODEBENCH, pb.CHECKER_EXACT, "exact", id="explicit-exact-wins"),
    pytest.param(LIVECODEBENCH, pb.CHECKER_TOKENS_IGNORE_CASE, "tokens_ignore_case", id="by-name"),
    pytest.param(CODE_CONTESTS, pb.CHECKER_LINES_DECIMAL, "lines_decimal", id="the-other-by-name"),
])
def test_the_checker_reaching_the_agent(tests: Any, checker: pb.Checker, sent: str) -> None:
    job = pb.Job(code=pb.CodeJob(completion="```python\nprint(1)\n```", checker=checker,
                                 tests=pb.CodeTests(dataset_json=json.dumps(tests))))
    assert agent_job(jobs.prepare(job, Config()))["checker"] == sent


def test_explicit_stdio_cases_keep_the_whitespace_default() -> None:
    job = pb.Job(code=pb.CodeJob(completion="```python\nprint(1)\n```", tests=STDIO_TESTS))
    assert agent_job(jobs.prepare(job, Config()))["checker"] == "whitespace"


# -- float_tolerance: optional, so an explicit 0 (exact comparison) is not "unset" ----------------

STDIO_TESTS = pb.CodeTests(stdio=[pb.StdioCase(stdin="", expected_stdout="0.3\n")])
FUNCTION_TESTS = pb.CodeTests(fn_name="f", function=[pb.FunctionCase(args_json="[]", expected_json="0.3")])


def tolerance_job(kind: str, tests: pb.CodeTests = STDIO_TESTS, **fields: Any) -> pb.Job:
    if kind == "code":
        return pb.Job(code=pb.CodeJob(completion="```python\nprint(0.1 + 0.2)\n```", tests=tests,
                                      checker=pb.CHECKER_FLOAT, **fields))
    return pb.Job(math=pb.MathJob(completion="\\boxed{0.30000000000000004}", ground_truth="0.3", **fields))


@pytest.mark.parametrize("kind", ["code", "math"])
@pytest.mark.parametrize(("fields", "tolerance"), [
    pytest.param({}, 1e-6, id="unset-is-default"),
    pytest.param({"float_tolerance": 0.0}, 0.0, id="explicit-zero-is-exact"),
    pytest.param({"float_tolerance": -0.0}, 0.0, id="negative-zero-is-zero"),
    pytest.param({"float_tolerance": 1e-3}, 1e-3, id="explicit-value"),
])
def test_float_tolerance_reaches_the_agent_job(kind: str, fields: dict[str, Any], tolerance: float) -> None:
    job = tolerance_job(kind, **fields)
    assert getattr(job, kind).HasField("float_tolerance") is bool(fields)
    prepared = jobs.prepare(job, Config())
    assert agent_job(prepared)["tolerance"] == tolerance
    assert math.copysign(1.0, agent_job(prepared)["tolerance"]) == 1.0


@pytest.mark.parametrize(("fields", "tolerance"), [({}, 1e-6), ({"float_tolerance": 0.0}, 0.0)])
def test_float_tolerance_reaches_the_function_harness(fields: dict[str, Any], tolerance: float) -> None:
    prepared = jobs.prepare(tolerance_job("code", FUNCTION_TESTS, **fields), Config())
    assert agent_job(prepared)["tolerance"] == tolerance
    assert agent_job(prepared)["harness"]["tolerance"] == tolerance


def test_a_job_from_an_old_client_keeps_its_tolerance() -> None:
    """proto3 optional is wire-compatible: a plain double's bytes decode with presence, 0 omitted as unset."""
    old_wire = b"\x39" + struct.pack("<d", 1e-3)  # field 7, fixed64: what a client without `optional` sent
    assert pb.CodeJob.FromString(old_wire).float_tolerance == 1e-3
    assert not pb.CodeJob.FromString(b"").HasField("float_tolerance")


@pytest.mark.parametrize("kind", ["code", "math"])
@pytest.mark.parametrize("value", [-1e-6, -math.inf, math.inf, math.nan])
def test_a_bad_float_tolerance_is_invalid(kind: str, value: float) -> None:
    job = tolerance_job(kind, float_tolerance=value)
    with pytest.raises(InvalidRequest, match=rf"^jobs\[0\]\.{kind}\.float_tolerance must be a finite number >= 0"):
        jobs.prepare(job, Config())


@pytest.mark.parametrize("kind", ["code", "math", "execute"])
@pytest.mark.parametrize("value", [1.0, 5.0])
def test_a_failure_value_a_pass_cannot_beat_is_invalid(kind: str, value: float) -> None:
    """A failure paid 1.0 or more (a pass's reward) was accepted: a caller's slip that turns the reward around."""
    job = _execute() if kind == "execute" else tolerance_job(kind)
    job.failure_value = value
    with pytest.raises(InvalidRequest, match=r"^jobs\[0\]\.failure_value must be below 1\.0, the reward of a pass"):
        jobs.prepare(job, Config())
    job.failure_value = 0.5
    assert jobs.prepare(job, Config()).failure_value == 0.5


def _execute(**fields: Any) -> pb.Job:
    return pb.Job(execute=pb.ExecuteJob(**{"language": "python", "code": "print(1)", **fields}))


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        # Each of these reached the agent, failed there (EEXIST, ENAMETOOLONG, a reply past the frame
        # limit) and lost three sandboxes with the job answered SANDBOX_LOST (red-team finding).
        ({"files": [pb.File(path="a", content=b"1"), pb.File(path="a/b", content=b"2")]}, "both a file and a folder"),
        ({"files": [pb.File(path="a", content=b"1"), pb.File(path="a", content=b"2")]}, "appears twice"),
        ({"files": [pb.File(path="x" * 300, content=b"1")]}, "part longer than 255"),
        ({"collect_files": ["a/" * 150_000 + "b"]}, "longer than 4095 bytes"),
        ({"files": [pb.File(path="a/" * 2047 + "bc", content=b"1")]}, "longer than 4095 bytes"),  # PATH_MAX's NUL
        # More entries with their folders than /tmp holds (65,536): the agent answered INTERNAL (red team).
        ({"files": [pb.File(path=f"d{i}/" + "a/" * 2040 + "f", content=b"") for i in range(33)]},
         "the files and their folders are 67386 entries, more than the 65536"),
        # The source file's name, or a folder of that name: FileExistsError in the agent, INTERNAL (red team).
        ({"language": "c", "files": [pb.File(path="main.c", content=b"1")]}, "'main.c' is where the program's c"),
        ({"language": "java", "files": [pb.File(path="Main.java/x", content=b"1")]}, "'Main.java' is where"),
        # A folder's own files need not sort right after it ("-" < "/"), nor be given in order.
        ({"files": [pb.File(path=p, content=b"1") for p in ("a-b", "a/c", "a", "a.d")]},
         "'a' is both a file and a folder"),
        ({"files": [pb.File(path=p, content=b"1") for p in ("x/b/c/d", "x/b-c", "x/b")]},
         "'x/b' is both a file and a folder"),
        ({"collect_files": [f"f{i}" for i in range(65)]}, "at most 64"),
        ({"files": [pb.File(path=f"f{i}", content=b"x" * (9 << 20)) for i in range(4)]}, "more than 33554432 bytes"),
        # execve refuses these whatever the program: a NUL ended the run with exit status 1 and no word of why,
        # a list too long with 127, each scored as the model's runtime error (red team).
        ({"args": ["ok", "a\0b"]}, r"execute\.args\[1\] holds a NUL character"),
        ({"language": "bash", "args": ["a" * 131_072]}, r"args\[0\] is 131072 bytes; execve takes at most 131071"),
        ({"args": ["a"] * 200_000}, "200000 arguments take 2000000 bytes with their pointers; at most 1048576"),
    ],
)
def test_execute_files_that_cannot_be_written_or_sent_back_are_invalid(fields: dict[str, Any],
                                                                       message: str) -> None:
    with pytest.raises(InvalidRequest, match=message):
        jobs.prepare(_execute(**fields), Config())


def test_arguments_execve_takes_are_valid() -> None:
    args = ["a" * 131_071, "\u00e9" * 20_000, *["x"] * 1_000]
    prepared = jobs.prepare(_execute(language="bash", args=args), Config())
    assert agent_job(prepared)["args"] == args


def test_execute_files_as_deep_and_many_as_allowed_are_valid() -> None:
    """1,024 paths of 4,095 bytes: listing each path's folders took 5 s per 100 of them (quadratic)."""
    folder = "a/" * 2045
    paths = [folder + f"{i:03x}" for i in range(1022)] + ["a-b/c", "ab"]
    assert max(len(p) for p in paths) == 4093
    prepared = jobs.prepare(_execute(files=[pb.File(path=p, content=b"") for p in paths]), Config())
    assert len(agent_job(prepared)["files"]) == len(paths)


def test_a_dataset_error_is_not_retried_but_a_model_verdict_never_carries_the_flag() -> None:
    """The agent's dataset errors (setup code fails, tests check nothing or need fixtures) are
    INTERNAL: the same tests would say the same on any sandbox, so clients must not retry them."""
    prepared = jobs.prepare(pb.Job(code=pb.CodeJob(completion="```python\ndef add(a, b):\n    return a + b\n```",
                                                   tests=pb.CodeTests(assert_code="assert add(1, 2) == 3"))),
                            Config())
    outcome: JobResult = {"status": "internal", "do_not_retry": True, "message": "the dataset's tests need ...",
               "code": {"tests_total": 1}}
    result = jobs.to_result(prepared, outcome, 1)
    assert result.status == pb.STATUS_INTERNAL and result.do_not_retry
    result = jobs.to_result(prepared, {**outcome, "status": "wrong_answer"}, 1)
    assert result.status == pb.STATUS_WRONG_ANSWER and not result.do_not_retry


CODE_BLOCK = "```python\nx = 1\n```"
# Enum numbers no .proto lists, typed Any: protoc's stubs type an enum field by its values' names, and a type: ignore
# would go unused where the stubs are not generated (a fresh checkout) and the messages are Any.
UNKNOWN: Any = 99
NEGATIVE: Any = -5
ASSERTS = pb.CodeTests(assert_code="assert 1")


@pytest.mark.parametrize(
    ("job", "field"),
    [
        (pb.Job(code=pb.CodeJob(completion=CODE_BLOCK, tests=ASSERTS, checker=UNKNOWN)), "code.checker"),
        (pb.Job(code=pb.CodeJob(completion=CODE_BLOCK, tests=ASSERTS, reward_mode=UNKNOWN)), "code.reward_mode"),
        (pb.Job(code=pb.CodeJob(completion=CODE_BLOCK, tests=ASSERTS, extraction=NEGATIVE)), "code.extraction"),
        (pb.Job(math=pb.MathJob(completion="\\boxed{1}", ground_truth="1", extraction=UNKNOWN)), "math.extraction"),
    ],
)
def test_an_enum_value_the_daemon_does_not_know_is_refused(job: pb.Job, field: str) -> None:
    """Red team: unknown values (a client built against a newer .proto) were taken as the
    default, so the request was scored another way than its caller asked."""
    with pytest.raises(InvalidRequest, match=f"{field}: unknown value"):
        jobs.prepare(job, Config())


# -- total_timeout_seconds: all of a code job's test runs together ------------------------------------

def many_cases_job(cases: int, **limits: Any) -> pb.Job:
    tests = pb.CodeTests(stdio=[pb.StdioCase(stdin=str(i), expected_stdout=str(i)) for i in range(cases)])
    return pb.Job(limits=pb.Limits(**limits), code=pb.CodeJob(completion=CODE_BLOCK, tests=tests))


def test_the_total_timeout_bounds_the_budget_of_a_job_of_many_cases() -> None:
    config = Config()
    compile_timeout = jobs.prepare(many_cases_job(1), config).budget_seconds - config.limits.default_timeout_seconds
    # 100 cases of 10 s each would be 1,000 s; the default job timeout is 300 s.
    prepared = jobs.prepare(many_cases_job(100), config)
    assert agent_job(prepared)["limits"]["total_timeout"] == config.limits.default_total_timeout_seconds == 300.0
    assert prepared.budget_seconds == pytest.approx(300.0 + compile_timeout)
    asked = jobs.prepare(many_cases_job(100, timeout_seconds=2, total_timeout_seconds=7.5), config)
    assert agent_job(asked)["limits"]["total_timeout"] == 7.5
    assert asked.budget_seconds == pytest.approx(7.5 + compile_timeout)
    # Fewer cases than the job timeout covers: their own timeouts are the budget.
    few = jobs.prepare(many_cases_job(3, timeout_seconds=2), config)
    assert few.budget_seconds == pytest.approx(6.0 + compile_timeout)


@pytest.mark.parametrize(("value", "error"), [
    (-1.0, "limits.total_timeout_seconds must be positive"),
    (math.nan, "limits.total_timeout_seconds must be positive"),
    (math.inf, "limits.total_timeout_seconds must be positive"),
    (3601.0, "limits.total_timeout_seconds=3601 exceeds the daemon's maximum 3600"),
])
def test_a_bad_total_timeout_is_invalid(value: float, error: str) -> None:
    with pytest.raises(InvalidRequest, match=rf"jobs\[0\]\.{error}"):
        jobs.prepare(many_cases_job(2, total_timeout_seconds=value), Config())


def test_a_bug_hit_while_preparing_one_job_answers_that_job_internal_and_spares_the_batch(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Raised, it failed the whole call as UNKNOWN: one completion that reached a
    # parser's RecursionError (pyharness.top_level_definitions before 7799ea1) took
    # its batch's other results with it.
    real_extract = jobs.code_verifier.extract_code

    def extract(completion: str, *args: Any, **kwargs: Any) -> str | None:
        if "deep" in completion:
            raise RecursionError("maximum recursion depth exceeded")
        return real_extract(completion, *args, **kwargs)

    monkeypatch.setattr(jobs.code_verifier, "extract_code", extract)
    sound = jobs.prepare(code_job(0, "```python\ndef double(x):\n    return 2 * x\n```", TESTS), Config(), "jobs[0]")
    assert sound.early_result is None
    job = code_job(7, "```python\n# deep\n```", TESTS)
    job.failure_value = -0.5
    broken = jobs.prepare(job, Config(), "jobs[1]")
    assert broken.pool == jobs.NO_POOL and broken.agent_job is None
    assert broken.early_result is not None
    result = jobs.to_result(broken, broken.early_result, 0)
    assert (result.index, result.status, result.reward) == (7, pb.STATUS_INTERNAL, -0.5)
    assert result.message == ("internal error preparing jobs[1]: RecursionError: maximum recursion depth exceeded")
    # What the caller got wrong is still its error, for the whole request.
    with pytest.raises(InvalidRequest, match="failure_value must be a finite number"):
        jobs.prepare(pb.Job(failure_value=math.nan, math=pb.MathJob(completion="2", ground_truth="2")), Config())


def test_enum_tables_follow_the_proto_by_name() -> None:
    """Each table names every value of its proto enum by the value's own name, so a value added to the proto (or
    renumbered) cannot be read as another: the tables were written by number."""
    assert jobs.MODEL_STATUSES["unsupported_test"] == pb.STATUS_UNSUPPORTED_TEST
    assert set(jobs.MODEL_STATUSES.values()) == set(pb.Status.values()) - {pb.STATUS_UNSPECIFIED}
    assert jobs.LIMITS[""] == pb.LIMIT_NONE and jobs.LIMITS["total_time"] == pb.LIMIT_TOTAL_TIME
    assert set(jobs.LIMITS.values()) == set(pb.Limit.values())
    for table, proto_enum in ((jobs.CODE_EXTRACTION, pb.CodeExtraction), (jobs.CHECKERS, pb.Checker),
                              (jobs.MATH_EXTRACTION, pb.MathExtraction), (jobs.REWARD_MODES, pb.RewardMode)):
        assert set(table) == set(proto_enum.values())
    assert jobs.CODE_EXTRACTION[pb.CODE_EXTRACTION_UNSPECIFIED] == jobs.CODE_EXTRACTION[pb.CODE_EXTRACTION_LAST_BLOCK]
    assert jobs.CHECKERS[pb.CHECKER_LINES_DECIMAL] == "lines_decimal"
    assert jobs.MATH_EXTRACTION[pb.MATH_EXTRACTION_UNSPECIFIED] == "auto"
    assert jobs.MATH_EXTRACTION[pb.MATH_EXTRACTION_ANSWER_TAG] == "answer_tag"
    assert jobs.REWARD_MODES[pb.REWARD_MODE_UNSPECIFIED] == "binary"
    assert jobs.REWARD_MODES[pb.REWARD_MODE_FRACTION] == "fraction"
