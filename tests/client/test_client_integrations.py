"""TRL reward functions and verl compute_score, pure column mapping and against FakeSandboxd."""

from __future__ import annotations

import asyncio
import json
import math
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
import pytest
from conftest import StartFake
from fake_daemon import Abort, Delay, FakeServer
from sandboxd_client import InvalidRequest, RetryPolicy
from sandboxd_client._proto.sandboxd.v1 import sandboxd_pb2 as pb
from sandboxd_client.trl import completion_text, make_async_reward_func, make_reward_func
from sandboxd_client.verl import compute_score, compute_score_async, compute_score_batch, kind_for

FAST = {"retry_policy": RetryPolicy(max_retries=1, initial_backoff=0.01)}


def conversation(text: str) -> list[dict[str, str]]:
    return [{"role": "assistant", "content": text}]


def trl_kwargs(**columns: Any) -> dict[str, Any]:
    """What GRPOTrainer passes besides prompts/completions."""
    return {"completion_ids": [[1, 2]], "trainer_state": object(), "log_extra": lambda *a: None, **columns}


# -- pure -----------------------------------------------------------------


def test_client_imports_with_grpc_and_protobuf_only() -> None:
    code = (
        "import sys, sandboxd_client, sandboxd_client.trl, sandboxd_client.verl\n"
        "heavy = {'torch', 'trl', 'verl', 'docker', 'sandboxd', 'transformers'} & set(sys.modules)\n"
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_completion_text_shapes() -> None:
    assert completion_text("plain") == "plain"
    assert completion_text(conversation("answer")) == "answer"
    tool_turns = [
        {"role": "assistant", "content": "call"},
        {"role": "tool", "content": "out"},
        {"role": "assistant", "content": [{"type": "text", "text": "final"}, {"type": "image"}]},
    ]
    assert completion_text(tool_turns) == "final"
    with pytest.raises(InvalidRequest):
        completion_text(42)


def test_missing_column_is_a_clear_error_before_any_rpc(fake: FakeServer) -> None:
    reward = make_reward_func("math", address=fake.address)
    with pytest.raises(ValueError, match=r"ground-truth column.*available columns: \['problem'\]"):
        reward(prompts=["p"], completions=["4"], problem=["what is 2+2"], **trl_kwargs())
    code = make_reward_func("code", address=fake.address)
    with pytest.raises(ValueError, match="tests column"):
        code(prompts=["p"], completions=["x"], answer=["4"])
    mapped = make_reward_func("math", address=fake.address, column_map={"ground_truth": "gold"})
    with pytest.raises(ValueError, match="'gold'"):
        mapped(prompts=["p"], completions=["4"], answer=["4"])
    assert fake.fake.jobs_seen == 0


def test_factory_validates_its_arguments() -> None:
    with pytest.raises(ValueError):
        make_reward_func("chess")
    with pytest.raises(ValueError):
        make_reward_func(failure_value=math.nan)
    with pytest.raises(ValueError, match=r"below 1\.0"):
        make_reward_func("math", failure_value=1.0)
    with pytest.raises(ValueError):
        make_reward_func(column_map={"answer_col": "x"})
    assert make_reward_func("code").__name__ == "sandboxd_code"
    assert make_async_reward_func(name="my_reward").__name__ == "my_reward"


def test_verl_dispatch() -> None:
    for source in [
        "openai/gsm8k",
        "lighteval/MATH",
        "DigitalLearningGmbH/MATH-lighteval",
        "math_dapo",
        "aime_2024",
    ]:
        assert kind_for(source) == "math", source
    for source in [
        "codecontests",
        "deepmind/code_contests",
        "apps",
        "taco",
        "codeforces",
        "livecodebench/code_generation_lite",
        "openai_humaneval",
        "mbpp",
        "PrimeIntellect/verifiable-coding-problems",
    ]:
        assert kind_for(source) == "code", source
    assert kind_for("mine", {"mine": "code"}) == "code"
    with pytest.raises(ValueError, match="register_data_source"):
        kind_for("chess_puzzles")


# -- TRL against the fake daemon ------------------------------------------


def test_trl_math_with_conversational_completions(fake: FakeServer) -> None:
    logged: dict[str, float] = {}
    reward = make_reward_func("math", address=fake.address)
    rewards = reward(
        prompts=[[{"role": "user", "content": "2+2?"}]] * 3,
        completions=[conversation("4"), conversation("5"), conversation("4")],
        answer=["4", "4", "4"],
        log_metric=logged.__setitem__,
        **trl_kwargs(),
    )
    assert rewards == [1.0, -1.0, 1.0]
    assert logged["sandboxd_math/ok_rate"] == pytest.approx(2 / 3)
    assert logged["sandboxd_math/infra_failure_rate"] == 0.0


def test_trl_code_columns_and_auto(fake: FakeServer) -> None:
    reward = make_reward_func("auto", address=fake.address, failure_value=0.0)
    verl_tests = json.dumps({"inputs": ["1\n"], "outputs": ["1\n"]})
    rewards = reward(
        prompts=["p"] * 3,
        completions=["correct code", "wrong code", "4"],
        input_output=[verl_tests, verl_tests, None],
        answer=[None, None, "4"],
    )
    assert rewards == [1.0, 0.0, 1.0]
    humaneval = make_reward_func("code", address=fake.address)
    assert humaneval(
        prompts=["p"], completions=["correct"], test=["def check(c): pass"], entry_point=["f"]
    ) == [1.0]


def test_trl_bad_row_and_infra_failure_use_infra_value(start_fake: StartFake) -> None:
    def script(fake: Any, job: Any, attempt: int) -> Abort | None:
        return Abort(grpc.StatusCode.UNAVAILABLE) if job.math.completion == "boom" else None

    server = start_fake("a", script)
    reward = make_reward_func("math", address=server.address, infra_failure_value=None, client_options=FAST)
    rewards = reward(prompts=["p"] * 3, completions=["4", "boom", "4"], answer=["4", "4", float("nan")])
    assert rewards == [1.0, None, None]
    strict = make_reward_func("math", address=server.address, raise_on_error=True, client_options=FAST)
    with pytest.raises(Exception, match="could not be scored"):
        strict(prompts=["p"], completions=["boom"], answer=["4"])


def test_trl_masks_infra_failures_by_default(start_fake: StartFake) -> None:
    """None (TRL leaves the completion out of its group's baseline, advantage 0) unless a number is given: a
    default of -1.0 taught the policy that an outage was a wrong answer."""
    def script(fake: Any, job: Any, attempt: int) -> Abort | None:
        return Abort(grpc.StatusCode.UNAVAILABLE) if job.math.completion == "boom" else None

    server = start_fake("a", script)
    columns = {"prompts": ["p"] * 3, "completions": ["4", "5", "boom"], "answer": ["4", "4", "4"]}
    assert make_reward_func("math", address=server.address, client_options=FAST)(**columns) == [1.0, -1.0, None]
    async_reward = make_async_reward_func("math", address=server.address, client_options=FAST)
    assert asyncio.run(async_reward(**columns)) == [1.0, -1.0, None]
    scored = make_reward_func("math", address=server.address, infra_failure_value=-1.0, client_options=FAST)
    assert scored(**columns) == [1.0, -1.0, -1.0]


def _refuses_bad(fake: Any, job: Any, attempt: int) -> Abort | None:
    """The daemon's answer to a job it cannot take: INVALID_ARGUMENT for the whole RunBatch."""
    return Abort(grpc.StatusCode.INVALID_ARGUMENT, "jobs[1].math: refused") if job.math.completion == "BAD" else None


def test_a_row_the_daemon_refuses_costs_only_its_own_reward(start_fake: StartFake) -> None:
    """The daemon refuses a whole batch for one job; the other rows must still be scored (they all got the
    infrastructure value, or None, before)."""
    server = start_fake("a", _refuses_bad)
    completions = ["1", "BAD", "1", "2", "1", "BAD", "1"]
    reward = make_reward_func("math", address=server.address, infra_failure_value=None, client_options=FAST)
    assert reward(prompts=["p"] * 7, completions=completions, answer=["1"] * 7) == \
        [1.0, None, 1.0, -1.0, 1.0, None, 1.0]
    async_reward = make_async_reward_func("math", address=server.address, infra_failure_value=0.5,
                                          client_options=FAST)
    assert asyncio.run(async_reward(prompts=["p"] * 7, completions=completions, answer=["1"] * 7)) == \
        [1.0, 0.5, 1.0, -1.0, 1.0, 0.5, 1.0]
    scores = compute_score_batch(["openai/gsm8k"] * 7, completions, ["1"] * 7, address=server.address,
                                 infra_failure_value=0.0, client_options=FAST)
    assert [s["score"] for s in scores] == [1.0, 0.0, 1.0, -1.0, 1.0, 0.0, 1.0]
    assert [s["status"] for s in scores][:2] == ["OK", "INVALID_REQUEST"]
    strict = make_reward_func("math", address=server.address, raise_on_error=True, client_options=FAST)
    with pytest.raises(InvalidRequest, match="refused"):
        strict(prompts=["p"] * 2, completions=["1", "BAD"], answer=["1"] * 2)


def test_trl_deadline_scores_infra_value(start_fake: StartFake) -> None:
    server = start_fake("a", lambda fake, job, attempt: Delay(3.0))
    reward = make_reward_func(
        "math", address=server.address, infra_failure_value=0.0, client_options={"deadline": 0.2}
    )
    assert reward(prompts=["p"], completions=["4"], answer=["4"]) == [0.0]


def test_trl_async_func_on_trainer_style_loop_threads(fake: FakeServer) -> None:
    reward = make_async_reward_func("math", address=fake.address)
    results: list[list[float | None]] = []

    def loop_thread() -> None:
        # TRL awaits async reward funcs on a loop of its own in a thread with this name.
        loop = asyncio.new_event_loop()
        try:
            results.append(
                loop.run_until_complete(
                    reward(prompts=["p"], completions=[conversation("4")], answer=["4"], **trl_kwargs())
                )
            )
        finally:
            loop.close()

    for _ in range(2):  # a second loop must get a client of its own
        thread = threading.Thread(target=loop_thread, name="GRPOTrainer-AsyncLoop")
        thread.start()
        thread.join(timeout=30)
    assert results == [[1.0], [1.0]]


async def test_trl_async_gathered(fake: FakeServer) -> None:
    reward = make_async_reward_func("math", address=fake.address)
    outs = await asyncio.gather(
        *(reward(prompts=["p"], completions=[str(i)], answer=["1"]) for i in range(3))
    )
    assert outs == [[-1.0], [1.0], [-1.0]]


# -- verl -----------------------------------------------------------------


def test_verl_compute_score_from_many_threads(fake: FakeServer) -> None:
    def score(i: int) -> dict[str, Any]:
        if i % 2:
            return compute_score("openai/gsm8k", str(i % 4), "1", {"index": i}, address=fake.address)
        tests = {"inputs": ["1"], "outputs": ["1"]}
        return compute_score("codecontests", "correct", json.dumps(tests), None, address=fake.address)

    with ThreadPoolExecutor(8) as pool:
        scores = list(pool.map(score, range(64)))
    keys = {"score", "acc", "pass_rate", "status", "infra_failure"}
    assert all(set(s) == keys for s in scores), "verl stacks every key: all dicts need the same keys"
    assert [s["score"] for s in scores[:4]] == [1.0, 1.0, 1.0, -1.0]
    assert scores[0]["pass_rate"] == 1.0 and scores[3]["status"] == "WRONG_ANSWER"


def test_verl_batch_and_bad_rows(fake: FakeServer) -> None:
    scores = compute_score_batch(
        ["openai/gsm8k", "apps", "apps"],
        ["7", "wrong", "correct"],
        ["7", {"inputs": ["1"], "outputs": ["2", "3"]}, {"inputs": ["1"], "outputs": ["1"]}],
        [None, None, {"language": "python"}],
        address=fake.address,
        infra_failure_value=0.0,
    )
    assert [s["score"] for s in scores] == [1.0, 0.0, 1.0]
    assert scores[1]["status"] == "INVALID_REQUEST" and scores[1]["infra_failure"]


def test_the_adapters_leave_the_checker_to_the_daemon(start_fake: StartFake) -> None:
    """TRL and verl rows of CodeContests and LiveCodeBench reach the daemon without a checker, which then
    checks them as their own graders do (they were sent CHECKER_WHITESPACE)."""
    checkers: list[int] = []

    def record(fake: Any, job: Any, attempt: int) -> None:
        checkers.append(job.code.checker)

    server = start_fake("a", record)
    code_contests = {"public_tests": {"input": ["1"], "output": ["YES"]}}
    livecodebench = json.dumps([{"input": "1", "output": "2.0", "testtype": "stdin"}])
    compute_score("codecontests", "correct", code_contests, address=server.address)
    compute_score("livecodebench", "correct", livecodebench, address=server.address)
    reward = make_reward_func("code", address=server.address)
    reward(prompts=["p"], completions=["correct"], input_output=[livecodebench])
    assert checkers == [pb.CHECKER_UNSPECIFIED] * 3
    explicit = make_reward_func("code", address=server.address, code_options={"checker": "exact"})
    explicit(prompts=["p"], completions=["correct"], input_output=[livecodebench])
    assert checkers[-1] == pb.CHECKER_EXACT


def test_verl_numpy_ground_truths(fake: FakeServer) -> None:
    """verl hands parquet columns over as numpy; an array of any size was .item()'d and raised ValueError."""
    np = pytest.importorskip("numpy")
    scores = [compute_score("openai/gsm8k", "1", truth, address=fake.address)
              for truth in (np.array(["1"]), np.str_("1"), np.int64(1), np.array(["1", "2"]), np.array([]))]
    assert [s["score"] for s in scores] == [1.0, 1.0, 1.0, -1.0, -1.0]
    assert [s["status"] for s in scores][3:] == ["INVALID_REQUEST", "INVALID_REQUEST"]


def test_reward_settings_no_row_can_fix_are_errors_not_rewards(fake: FakeServer) -> None:
    """Before, each such setting made every row unscorable and every completion scored -1.0 for the whole run."""
    for settings in ({"failure_value": 1.0}, {"math_options": {"extraction": "bogus"}},
                     {"code_options": {"checker": "fuzzy"}}, {"code_options": {"langauge": "cpp"}}):
        with pytest.raises(ValueError):
            compute_score("openai/gsm8k", "1", "1", address=fake.address, **settings)
        with pytest.raises(ValueError):
            compute_score_batch(["apps"], ["x"], [{"inputs": ["1"], "outputs": ["1"]}], address=fake.address,
                                **settings)
        with pytest.raises(ValueError):
            make_reward_func("auto", **settings)
    with pytest.raises(ValueError):
        make_async_reward_func("math", math_options={"failure_value": 3.0})
    assert compute_score("openai/gsm8k", "1", "1", address=fake.address,
                         math_options={"extraction": "boxed"})["status"] in {"OK", "NO_ANSWER"}


def test_verl_infra_failure(start_fake: StartFake) -> None:
    server = start_fake("a", lambda fake, job, attempt: Delay(3.0))
    score = compute_score("math_dapo", "1", "1", address=server.address, client_options={"deadline": 0.2})
    assert score["score"] == -1.0 and score["status"] == "DEADLINE_EXCEEDED" and score["infra_failure"]


async def test_verl_async(fake: FakeServer) -> None:
    scores = await asyncio.gather(
        *(compute_score_async("aime24", str(i), "1", address=fake.address) for i in range(3))
    )
    assert [s["score"] for s in scores] == [-1.0, 1.0, -1.0]


def test_verl_loads_the_module_by_file_path_as_verl_does(fake: FakeServer) -> None:
    """reward.custom_reward_function.path=<site-packages>/sandboxd_client/verl.py (the docs give pkg://, but a
    file path works too): verl imports the file outside its package, where relative imports failed."""
    import importlib.util

    import sandboxd_client.verl

    spec = importlib.util.spec_from_file_location("custom_module", sandboxd_client.verl.__file__)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    score = module.compute_score("openai/gsm8k", "7", "7", {"index": 0}, address=fake.address)
    assert score["score"] == 1.0 and score["status"] == "OK"


def test_unscored_completions_are_logged_with_why(start_fake: StartFake, caplog: pytest.LogCaptureFixture,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A daemon that cannot be reached scored every completion the infrastructure value without a word."""
    import logging

    import sandboxd_client.verl as verl_module

    server = start_fake("a", lambda fake, job, attempt: Abort(grpc.StatusCode.UNAVAILABLE, "daemon away"))
    caplog.set_level(logging.WARNING)
    reward = make_reward_func("math", address=server.address, infra_failure_value=None, client_options=FAST)
    assert reward(prompts=["p"] * 2, completions=["4", "4"], answer=["4", "4"]) == [None, None]
    assert "2 of 2 completions could not be scored" in caplog.text and "daemon away" in caplog.text
    caplog.clear()
    monkeypatch.setattr(verl_module, "_infra_warned_at", None)
    monkeypatch.setattr(verl_module, "_infra_unwarned", 0)
    for _ in range(3):
        assert compute_score("openai/gsm8k", "4", "4", address=server.address, client_options=FAST)["infra_failure"]
    warnings = [r for r in caplog.records if r.name == "sandboxd_client.verl"]
    # One line at once for the first, then at most one a minute: not a line per completion.
    assert len(warnings) == 1 and "daemon away" in warnings[0].getMessage(), caplog.text
