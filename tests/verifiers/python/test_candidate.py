"""Tests of the candidate's side (sandboxd.verifiers.python.candidate): loading the program, the implicit imports,
the callable a test names, a candidate in a fresh interpreter."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from sandboxd.verifiers.code import FunctionCase
from sandboxd.verifiers.python.harness import run_tests
from tests.verifiers.python.test_harness import ADD_CASES, REPO, harness

pytestmark = pytest.mark.timeout(60)


# A LeetCode-style solution that uses what LeetCode's environment imports for it (LiveCodeBench's grader too).
LEETCODE_IMPLICIT = """
class Solution:
    def topKFrequent(self, nums: List[int], k: int) -> List[int]:
        counts = defaultdict(int)
        for x in nums:
            counts[x] += 1
        heap = []
        for x, c in counts.items():
            heappush(heap, (-c, x))
        return sorted(heappop(heap)[1] for _ in range(k))

    @cache
    def smallest(self, n: int) -> float:
        return min(inf, n)
"""


def test_function_calls_get_the_names_leetcode_imports_for_a_solution(tmp_path: Path) -> None:
    """It failed with NameError: name 'defaultdict' is not defined (review)."""
    cases = [FunctionCase(([1, 1, 1, 2, 2, 3], 2), [1, 2])]
    assert harness(LEETCODE_IMPLICIT, tmp_path, fn_name="topKFrequent", cases=cases)["passed"]
    assert harness(LEETCODE_IMPLICIT, tmp_path, fn_name="Solution.smallest",
                   cases=[FunctionCase((5,), 5)])["passed"]


@pytest.mark.parametrize("fn_name", ["gcd", "sqrt", "Counter", "Counter.most_common", "sorted"])
def test_a_name_only_the_implicit_imports_bind_is_not_the_programs(tmp_path: Path, fn_name: str) -> None:
    """A program that never wrote gcd must not pass gcd's tests with math's."""
    result = harness("x = 1\n", tmp_path, fn_name=fn_name, cases=[FunctionCase((4, 6), 2)])
    assert not result["passed"] and result["tests"][0]["status"] == "runtime_error", result
    # Its own gcd, shadowing math's, is the one called.
    own = "def gcd(a, b):\n    return 2\n"
    assert harness(own, tmp_path, fn_name="gcd", cases=[FunctionCase((4, 6), 2)])["passed"]


def test_assert_tests_get_no_implicit_imports(tmp_path: Path) -> None:
    """HumanEval's and MBPP's graders import nothing for the program: a Counter it never imported stays a
    NameError."""
    code = "def f(xs):\n    return Counter(xs)[1]\n"
    assert not harness(code, tmp_path, kind="assert", entry_point="f",
                       assert_code="assert f([1, 1]) == 2\n")["passed"]


def test_main_guard_and_stdin_do_not_break_loading(tmp_path: Path) -> None:
    code = (
        "import sys, unittest\ndata = sys.stdin.read()\ndef add(a, b):\n    return a + b\n"
        "if __name__ == '__main__':\n    input()\n    unittest.main()\n"
    )
    assert harness(code, tmp_path, fn_name="add", cases=ADD_CASES)["passed"]


def test_dataclasses_and_module_state_work_in_the_candidate(tmp_path: Path) -> None:
    code = (
        "from __future__ import annotations\nfrom dataclasses import dataclass\n"
        "@dataclass\nclass P:\n    x: int\nCOUNT = [0]\n"
        "def f(x):\n    COUNT[0] += 1\n    return (P(x).x, COUNT[0])\n"
    )
    cases = [FunctionCase((5,), [5, 1]), FunctionCase((6,), [6, 2])]
    assert harness(code, tmp_path, fn_name="f", cases=cases)["passed"]


def test_candidate_in_a_fresh_interpreter(tmp_path: Path) -> None:
    """The same protocol with the candidate exec'd as its own process (not forked)."""
    parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    source = tmp_path / "solution.py"
    source.write_text("def add(a, b):\n    return a + b\n")
    boot = (
        "import socket, sys\nfrom sandboxd.verifiers.python.harness import serve_candidate\n"
        "serve_candidate(open(sys.argv[2]).read(), socket.socket(fileno=int(sys.argv[1])))\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", boot, str(child.fileno()), str(source)],
        pass_fds=[child.fileno()],
        stdin=subprocess.DEVNULL,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    child.close()
    try:
        result = run_tests("function", parent, fn_name="add", cases=ADD_CASES, call_timeout=30)
    finally:
        parent.close()
        assert proc.wait(timeout=30) == 0
    assert result["passed"]
