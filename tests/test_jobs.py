"""Preparing jobs in the daemon: the test-plan cache that completions of one prompt share."""

from __future__ import annotations

import json

import pytest
from sandboxd_client._proto.sandboxd.v1 import sandboxd_pb2 as pb

from sandboxd import jobs
from sandboxd.config import Config
from sandboxd.errors import InvalidRequest

TESTS = {"test": "def check(candidate):\n    assert candidate(2) == 4\n", "entry_point": "double",
         "prompt": "def double(x):\n"}


def code_job(index: int, completion: str, tests: dict[str, object] | str) -> pb.Job:
    dataset = tests if isinstance(tests, str) else json.dumps(tests)
    return pb.Job(index=index, code=pb.CodeJob(completion=completion, tests=pb.CodeTests(dataset_json=dataset)))


def test_completions_of_one_prompt_share_one_plan() -> None:
    first = code_job(0, "```python\n    return 2 * x\n```", TESTS)
    second = code_job(1, "```python\ndef double(x):\n    return x + x\n```", TESTS)
    assert jobs._test_plan(first.code.tests) is jobs._test_plan(second.code.tests)
    prepared = [jobs.prepare(job, Config()) for job in (first, second)]
    # Shared tests, each completion's own program.
    programs = [p.agent_job["program"]["code"] for p in prepared]
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


def test_bad_tests_fail_every_job_that_sends_them() -> None:
    for index in (3, 4):
        with pytest.raises(InvalidRequest, match=rf"jobs\[{index}\].code.tests: dataset_json.test does not parse"):
            jobs.prepare(code_job(index, "```python\nx = 1\n```", {**TESTS, "test": "def check(:\n"}), Config())
