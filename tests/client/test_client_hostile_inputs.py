"""Every input a trainer can pass ends in a Result or an InvalidRequest, and the adapters in a number (issue #52).

A lone surrogate in a completion raised UnicodeEncodeError out of ``run``,
``score_batch``, ``score_math`` and the TRL reward function (one completion
ended the training step); a deeply nested tests JSON raised RecursionError.
These tests feed generated hostile values into every argument of every entry
point a trainer calls, sync and async, against FakeSandboxd.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import pytest
from conftest import FAST, StartFake, Twin
from fake_daemon import FakeSandboxd
from sandboxd_client import (
    AsyncSandboxClient,
    InvalidRequest,
    Result,
    SandboxClient,
    code_job,
    execute_job,
    math_job,
)
from sandboxd_client._proto.sandboxd.v1 import sandboxd_pb2 as pb
from sandboxd_client._requests import valid_json_escapes, valid_text
from sandboxd_client.trl import make_async_reward_func, make_reward_func
from sandboxd_client.verl import compute_score, compute_score_batch

DEPTH = 100_000  # past any recursion limit


def _nested_list() -> Any:
    value: Any = []
    for _ in range(DEPTH):
        value = [value]
    return value


def _nested_dict() -> Any:
    value: Any = {}
    for _ in range(DEPTH):
        value = {"a": value}
    return value


def _cyclic_list() -> Any:
    value: list[Any] = [1]
    value.append(value)
    return value


def _cyclic_dict() -> Any:
    value: dict[str, Any] = {"inputs": ["1"], "outputs": ["1"]}
    value["self"] = value
    return value


def _surrogate_texts(rng: random.Random, count: int) -> Iterator[str]:
    """Text with lone surrogates (high, low, a low before a high, at either end) and pairs split apart."""
    pieces = ["print(1)", "\\boxed{2}", "```python\nprint(input())\n```", "é", "😀", " ", "\n"]
    for _ in range(count):
        parts = [rng.choice(pieces) for _ in range(rng.randint(0, 6))]
        for _ in range(rng.randint(1, 3)):
            surrogate = chr(rng.randint(0xD800, 0xDFFF))
            parts.insert(rng.randint(0, len(parts)), surrogate)
        yield "".join(parts)


def hostile_values() -> list[Any]:
    rng = random.Random(52)
    return [
        *_surrogate_texts(rng, 12),
        '{"inputs": ["1\ud800"], "outputs": ["1"]}',
        '{"inputs": ["\\ud800"], "outputs": ["1"]}',
        "[" * DEPTH + "]" * DEPTH,
        '{"inputs": ' + "[" * DEPTH + "]" * DEPTH + ', "outputs": []}',
        _nested_list(), _nested_dict(), _cyclic_list(), _cyclic_dict(),
        10**5000, -(10**5000), float("nan"), float("inf"), -float("inf"), 1e308 * 10,
        b"print(1)", bytearray(b"\xff\xfe"), b"\xed\xa0\x80", None, object(), {1, 2}, (), [], {}, "",
        {"inputs": 3, "outputs": 3}, {"outputs": ["1"]}, {"inputs": ["1"], "outputs": ["1"], 3: "x"},
        [{"args": 3, "expected": 1}], [(1, 2)], [{"stdin": 1, "expected_stdout": 2}],
        {"test_list": ["assert f(\ud800) == 1"]}, True, -1, 0, 2**70,
    ]


HOSTILE = hostile_values()
BAD_TIMEOUTS: list[Any] = [float("nan"), -1, 10**5000, "5", b"", float("inf")]
BAD_FILES: list[Any] = [{"f": 10**5000}, {3: "x"}, {"f": _nested_list()}, {"f": None}]


def _ends_well(call: Callable[[], Any]) -> Any:
    """`call()`'s Result, or the InvalidRequest it raised; any other exception fails the test."""
    try:
        out = call()
    except InvalidRequest as e:
        assert str(e), "an InvalidRequest says what is wrong"
        return e
    assert isinstance(out, Result), out
    return out


def test_valid_text_replaces_lone_surrogates_and_joins_split_pairs() -> None:
    assert valid_text("plain é 😀") == "plain é 😀"
    assert valid_text("a\ud800b\udc80") == "a\ufffdb\ufffd"
    assert valid_text("\ud83d\ude00") == "😀"  # a pair written as two code points is its character
    assert valid_text("\ude00\ud83d") == "\ufffd\ufffd"  # the wrong order is no pair
    for text in _surrogate_texts(random.Random(1), 200):
        valid_text(text).encode("utf-8")  # never raises


@pytest.mark.parametrize(("text", "sent"), [
    ('["\\ud800"]', '["\\ufffd"]'),
    ('["a\\uDBFFb", "\\udc00\\ud800"]', '["a\\ufffdb", "\\ufffd\\ufffd"]'),
    ('["\\ud83d\\ude00", "\\uD83D\\uDE00"]', '["\\ud83d\\ude00", "\\uD83D\\uDE00"]'),  # pairs are kept
    ('["\\\\ud800", "\\\\\\ud800"]', '["\\\\ud800", "\\\\\\ufffd"]'),  # an escaped backslash, then "ud800"
    ('{"inputs": ["1.10"], "outputs": [1.10], "x": "\\udfff"}',
     '{"inputs": ["1.10"], "outputs": [1.10], "x": "\\ufffd"}'),
])
def test_json_escapes_of_lone_surrogates_become_u_fffd_and_the_rest_is_kept(text: str, sent: str) -> None:
    assert valid_json_escapes(text) == sent
    json.dumps(json.loads(sent), ensure_ascii=False).encode("utf-8")  # no lone surrogate is left to decode


def test_a_tests_json_string_with_a_lone_surrogate_escape_is_sent_as_u_fffd() -> None:
    """Before: sent verbatim, so the daemon decoded a stdin it could not write to the program (INTERNAL)."""
    job = code_job("x", '{"inputs": ["\\ud800\\n"], "outputs": ["1.0\\n"]}')
    assert json.loads(job.code.tests.dataset_json) == {"inputs": ["\ufffd\n"], "outputs": ["1.0\n"]}
    listed = code_job("x", '[{"input": "\\udc00", "output": "1", "testtype": "stdin"}]')
    assert json.loads(listed.code.tests.dataset_json)[0]["input"] == "\ufffd"
    assert json.loads(code_job("x", {"inputs": ["\ud800"], "outputs": ["1"]}).code.tests.dataset_json)["inputs"] == [
        "\ufffd"]


@pytest.mark.parametrize("position", ["completion", "tests", "ground_truth", "option"])
def test_every_hostile_value_in_every_argument_ends_in_a_result_or_invalid_request(
        twin: Twin, fake: Any, position: str) -> None:
    for value in HOSTILE:
        if position == "completion":
            _ends_well(partial(twin.call, fake.address, "score_code", value, [("1\n", "1\n")]))
            _ends_well(partial(twin.call, fake.address, "score_math", value, "1"))
            _ends_well(partial(twin.call, fake.address, "execute", value))
            _ends_well(partial(twin.call, fake.address, "score_reward_model", "p", value, model="m"))
        elif position == "tests":
            _ends_well(partial(twin.call, fake.address, "score_code", "print(1)", value))
        elif position == "ground_truth":
            _ends_well(partial(twin.call, fake.address, "score_math", "\\boxed{1}", value))
        else:
            for option in ("timeout", "memory_bytes", "failure_value", "language", "fn_name", "extraction", "tag",
                           "checker", "float_tolerance", "total_timeout", "no_such_option"):
                _ends_well(partial(twin.call, fake.address, "score_code", "print(1)", [("1\n", "1\n")],
                                   **{option: value}))
            _ends_well(partial(twin.call, fake.address, "execute", "print(1)", stdin=value))
            _ends_well(partial(twin.call, fake.address, "execute", "print(1)", files={"f": value}))
            _ends_well(partial(twin.call, fake.address, "run", value))
            _ends_well(partial(twin.call, fake.address, "score_math", "1", "1", deadline=value))


def test_a_lone_surrogate_is_sent_as_u_fffd(start_fake: StartFake) -> None:
    seen: list[pb.Job] = []

    def record(fake: FakeSandboxd, job: pb.Job, attempt: int) -> None:
        seen.append(job)

    server = start_fake("recording", record)
    with SandboxClient(server.address, retry_policy=FAST) as client:
        assert client.score_code("print('a\ud800')  # correct", [("\udc80", "b\ud83d\ude00")]).ok
        assert isinstance(client.score_math("\\boxed{\udfff}", "x\ud800"), Result)
        results = client.score_batch([code_job("correct\ud800", [("", "")]), math_job("\ud800", "1")])
    assert [r.index for r in results] == [0, 1]
    assert seen[0].code.completion == "print('a\ufffd')  # correct"
    assert (seen[0].code.tests.stdio[0].stdin, seen[0].code.tests.stdio[0].expected_stdout) == ("\ufffd", "b😀")
    assert (seen[1].math.completion, seen[1].math.ground_truth) == ("\\boxed{\ufffd}", "x\ufffd")
    assert json.loads(code_job("x", {"inputs": ["\ud800"], "outputs": ["1"]}).code.tests.dataset_json) == {
        "inputs": ["\ufffd"], "outputs": ["1"]}


def test_batches_of_hostile_jobs_and_execute_jobs_end_in_results(twin: Twin, fake: Any) -> None:
    jobs = []
    for value in HOSTILE:
        for make in (lambda v: code_job(v, [("", "")]), lambda v: math_job(v, "1"),
                     lambda v: execute_job("print(1)", stdin=v)):
            try:
                jobs.append(make(value))
            except InvalidRequest:
                continue
    results = twin.call(fake.address, "score_batch", jobs)
    assert len(results) == len(jobs) and all(isinstance(r, Result) for r in results)


def test_session_cells_take_any_code_and_refuse_bad_timeouts(fake: Any) -> None:
    async def run_async() -> list[Any]:
        async with AsyncSandboxClient(fake.address, retry_policy=FAST) as client:
            session = await client.open_session()
            out: list[Any] = []
            for value in HOSTILE:
                try:
                    out.append(await session.run(value))
                except InvalidRequest as e:
                    out.append(e)
            return out

    with SandboxClient(fake.address, retry_policy=FAST) as client, client.open_session() as session:
        for value in HOSTILE:
            with contextlib.suppress(InvalidRequest):
                session.run(value)
            for timeout in BAD_TIMEOUTS:
                with pytest.raises(InvalidRequest):
                    session.run("x = 1", timeout=timeout)
        for files in BAD_FILES:
            with pytest.raises(InvalidRequest):
                client.open_session(files=files)
        assert client.open_session(files={"a\ud800": "b\udc80"}).run("x = 1").ok
    assert len(asyncio.run(run_async())) == len(HOSTILE)


def _columns_rows() -> Iterator[tuple[list[Any], dict[str, list[Any]]]]:
    for value in HOSTILE:
        yield [value, "\\boxed{1}"], {"ground_truth": ["1", value]}
        yield [[{"role": "assistant", "content": value}], [{"role": "assistant", "content": [
            {"type": "text", "text": value}]}]], {"tests": [value, [("", "")]]}
        yield ["\\boxed{1}", "x"], {"ground_truth": [value, "1"], "tests": [None, value], "fn_name": [value, None],
                                    "language": [value, None]}


@pytest.mark.parametrize("flavour", ["sync", "async"])
@pytest.mark.parametrize("infra_failure_value", [-1.0, None])
def test_trl_reward_functions_return_a_number_for_every_completion(fake: Any, flavour: str,
                                                                   infra_failure_value: float | None) -> None:
    options = {"address": fake.address, "client_options": {"retry_policy": FAST},
               "infra_failure_value": infra_failure_value}
    sync_reward, async_reward = make_reward_func(**options), make_async_reward_func(**options)
    for completions, columns in _columns_rows():
        if flavour == "sync":
            rewards = sync_reward(prompts=["p"] * 2, completions=completions, **columns)
        else:
            rewards = asyncio.run(async_reward(prompts=["p"] * 2, completions=completions, **columns))
        assert len(rewards) == 2
        for value in rewards:
            assert value is infra_failure_value or (isinstance(value, float) and value == value), rewards


def test_verl_compute_score_returns_a_number_for_every_completion(fake: Any) -> None:
    options = {"address": fake.address, "client_options": {"retry_policy": FAST}}
    for value in HOSTILE:
        for source, solution, truth, extra in (("gsm8k", value, "1", None), ("gsm8k", "\\boxed{1}", value, None),
                                               ("apps", value, [("", "")], None), ("apps", "x", value, None),
                                               ("apps", "x", [("", "")], {"fn_name": value, "language": value})):
            score = compute_score(source, solution, truth, extra, **options)
            assert isinstance(score["score"], float) and score["score"] == score["score"], score
    scores = compute_score_batch(["gsm8k"] * len(HOSTILE), HOSTILE, ["1"] * len(HOSTILE), **options)
    assert all(isinstance(s["score"], float) for s in scores)
