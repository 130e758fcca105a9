"""Tests of the pytest emulation (sandboxd.verifiers.python.pytest_emulation): test functions and classes,
marks, parametrize, fixtures, unittest cases, run as pytest would."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.verifiers.python.test_harness import harness
from tests.verifiers.python.test_judge import CALCULATOR, VALUE_ATTACKS

pytestmark = pytest.mark.timeout(60)


def test_unittest_style_tests(tmp_path: Path) -> None:
    tests = (
        "import unittest\nclass T(unittest.TestCase):\n    def test_add(self):\n"
        "        self.assertEqual(add(1, 2), 3)\n"
        "    def test_neg(self):\n        self.assertEqual(add(-1, 1), 0)\n"
    )
    assert harness("def add(a, b):\n    return a + b\n", tmp_path, "assert", assert_code=tests)["passed"]
    result = harness(VALUE_ATTACKS["patched_unittest"], tmp_path, "assert", assert_code=tests)
    assert result["status"] == "wrong_answer" and "1 of 2 unittest tests failed" in result["message"]


ADD_WRONG = "def add(a, b):\n    return 0\n"


@pytest.mark.parametrize(
    "tests",
    [
        "def test_add():\n    assert add(1, 2) == 3\n    assert add(3, 4) == 7\n",
        "def test():\n    assert add(1, 2) == 3\n\nif __name__ == '__main__':\n    test()\n",
        "def test_add(a=1, b=2):\n    assert add(a, b) == 3\n",
    ],
)
def test_pytest_style_test_functions_are_run(tests: str, tmp_path: Path) -> None:
    """Test functions that nothing calls are called: before, any program that loaded passed them."""
    assert harness("def add(a, b):\n    return a + b\n", tmp_path, "assert", assert_code=tests)["passed"]
    result = harness(ADD_WRONG, tmp_path, "assert", assert_code=tests)
    assert result["status"] == "wrong_answer", result


def test_tests_that_never_call_the_candidate_check_nothing(tmp_path: Path) -> None:
    tests = "import math\nassert math.pi > 3\ndef helper(x):\n    assert add(1, 2) == 3\n"
    result = harness(ADD_WRONG, tmp_path, "assert", assert_code=tests)
    assert not result["passed"] and result["status"] == "no_calls", result
    # A test function that needs a fixture is not called: that says so, rather than "checks nothing".
    tests = "import math\nassert math.pi > 3\ndef test_add(fixture):\n    assert add(1, 2) == 3\n"
    result = harness(ADD_WRONG, tmp_path, "assert", assert_code=tests)
    assert not result["passed"] and result["status"] == "unsupported", result
    assert "test_add: needs the fixture fixture" in result["message"]


ADD_WRONG_AT_100 = "def add(a, b):\n    return 0 if a == 100 else a + b\n"
ADD_RIGHT = "def add(a, b):\n    return a + b\n"
PYTEST_HEAD = "import pytest\nfrom solution import add\ndef test_small():\n    assert add(1, 2) == 3\n"


@pytest.mark.parametrize(
    "tests",
    [
        "def test_big(some_fixture):\n    assert add(100, 1) == 101\n",
        "def test_big(capsys, other_fixture):\n    assert add(100, 1) == 101\n",
        "@pytest.fixture\ndef a(request):\n    return request.param\n"
        "@pytest.mark.parametrize('a', [100], indirect=True)\ndef test_big(a):\n    assert add(a, 1) == 101\n",
        "async def test_big():\n    assert add(100, 1) == 101\n",
        "def test_big():\n    assert add(100, 1) == 101\n    yield\n",
        "@pytest.fixture(autouse=True)\ndef state(nobody_defines_it):\n    pass\n"
        "def test_big():\n    assert add(100, 1) == 101\n",
    ],
    ids=["unknown-fixture", "unknown-beside-builtin", "indirect", "async", "yield", "autouse-needing-unknown"],
)
def test_pytest_tests_the_harness_cannot_run_never_pass_unchecked(tests: str, tmp_path: Path) -> None:
    """Red team: a test the harness could not run (it needs a fixture, an event loop...) was
    left out silently, so a program wrong in just that test passed the ones that ran."""
    result = harness(ADD_WRONG_AT_100, tmp_path, "assert", assert_code=PYTEST_HEAD + tests)
    assert not result["passed"] and result["status"] == "unsupported", result
    assert "test_big" in result["message"] or "test_small" in result["message"], result
    # The tests that can run still run: a program that fails one of them is a wrong answer.
    # Not with an autouse fixture the harness cannot make, which would have changed every test: none runs.
    result = harness(ADD_WRONG, tmp_path, "assert", assert_code=PYTEST_HEAD + tests)
    assert result["status"] == ("unsupported" if "autouse" in tests else "wrong_answer"), result


@pytest.mark.parametrize(
    "tests",
    [
        "@pytest.mark.parametrize('a,b,expected', [(100, 1, 101), (1, 1, 2)])\nclass TestAdd:\n"
        "    def test_it(self, a, b, expected):\n        assert add(a, b) == expected\n",
        "pytestmark = pytest.mark.parametrize('a', [100])\ndef test_it(a):\n    assert add(a, 1) == 101\n",
        "from unittest import mock\n@mock.patch('os.getcwd', return_value='/')\n"
        "def test_it(getcwd):\n    assert add(100, 1) == 101\n",
        "import contextlib\n@contextlib.contextmanager\ndef nothing():\n    yield\n"
        "@nothing()\ndef test_it():\n    assert add(100, 1) == 101\n",
    ],
    ids=["class-parametrize", "module-pytestmark", "mock-patch", "context-decorator"],
)
def test_pytest_class_and_module_marks_and_wrapped_tests_run(tests: str, tmp_path: Path) -> None:
    """Red team: parametrize on a class or in the module's pytestmark, and tests under
    decorators that keep __wrapped__ (mock.patch, a ContextDecorator), were never run."""
    assert harness(ADD_RIGHT, tmp_path, "assert", assert_code=PYTEST_HEAD + tests)["passed"]
    result = harness(ADD_WRONG_AT_100, tmp_path, "assert", assert_code=PYTEST_HEAD + tests)
    assert result["status"] == "wrong_answer", result


@pytest.mark.parametrize("header", ["from solution import Counter\n\n", ""], ids=["import", "no-import"])
def test_test_functions_run_after_module_level_calls(header: str, tmp_path: Path) -> None:
    """A module-level call (an instance the tests share) no longer stops the test functions from running:
    before, any program whose Counter() constructed passed these tests unchecked."""
    tests = header + "counter = Counter()\n\ndef test_inc():\n    assert counter.inc() == 1\n"
    tests += "    assert counter.inc() == 2\n"
    assert harness(CALCULATOR, tmp_path, "assert", assert_code=tests)["passed"]
    wrong = CALCULATOR.replace("self.n += 1", "self.n += 2")
    result = harness(wrong, tmp_path, "assert", assert_code=tests)
    assert result["status"] == "wrong_answer" and "assert counter.inc() == 1" in result["message"], result
    # Test functions the code calls itself are not called again (a second run would see the state of the first).
    for calls in ("test_inc()\n", "for test in [test_inc]:\n    test()\n", "def main():\n    test_inc()\nmain()\n"):
        assert harness(CALCULATOR, tmp_path, "assert", assert_code=tests + calls)["passed"], calls
        result = harness(wrong, tmp_path, "assert", assert_code=tests + calls)
        assert result["status"] == "wrong_answer", (calls, result)
    # A call under a __main__ guard never runs here, so the function is called by the harness.
    guarded = tests + "if __name__ == '__main__':\n    test_inc()\n"
    assert harness(wrong, tmp_path, "assert", assert_code=guarded)["status"] == "wrong_answer"


KODCODE_DIVIDE = "def divide(a, b):\n    if b == 0:\n        raise ValueError('b is 0')\n    return a // b\n"
WRONG_ABOVE_7 = KODCODE_DIVIDE.replace("a // b", "a // b + (a > 7)")
WRONG_NO_RAISE = KODCODE_DIVIDE.replace("raise ValueError('b is 0')", "return 0")
# id: (tests, a wrong program they must catch)
PYTEST_STYLE_TESTS = {
    "parametrize": ("import pytest\nfrom solution import divide\n\n"
                    "@pytest.mark.parametrize('a, b, expected', [(6, 3, 2), (7, 2, 3), pytest.param(9, 3, 3)])\n"
                    "def test_divide(a, b, expected):\n    assert divide(a, b) == expected\n", WRONG_ABOVE_7),
    "stacked-parametrize": ("import pytest\nfrom solution import divide\n\n"
                            "@pytest.mark.parametrize('b', [1, 2])\n@pytest.mark.parametrize('a', [4, 8])\n"
                            "def test_divide(a, b):\n    assert divide(a, b) == a // b\n", WRONG_ABOVE_7),
    "raises": ("import pytest\nfrom solution import divide\n\n"
               "def test_zero():\n    with pytest.raises(ValueError):\n        divide(1, 0)\n", WRONG_NO_RAISE),
    "test-class": ("import pytest\nfrom solution import divide\n\nclass TestDivide:\n"
                   "    def setup_method(self, method):\n        self.pairs = [(6, 3), (9, 3)]\n"
                   "    def test_exact(self):\n        assert [divide(a, b) for a, b in self.pairs] == [2, 3]\n",
                   WRONG_ABOVE_7),
    "parametrized-method": ("import pytest\nfrom solution import divide\n\nclass TestDivide:\n"
                            "    @pytest.mark.parametrize('a', [10, 11])\n"
                            "    def test_floor(self, a):\n        assert divide(a, 5) == 2\n", WRONG_ABOVE_7),
    "approx": ("import pytest\nfrom solution import divide\n\n"
               "def test_approx():\n    assert divide(10, 5) == pytest.approx(2.0)\n", WRONG_ABOVE_7),
}


@pytest.mark.parametrize(("tests", "wrong"), PYTEST_STYLE_TESTS.values(), ids=PYTEST_STYLE_TESTS.keys())
def test_pytest_style_tests_run_as_pytest_would(tests: str, wrong: str, tmp_path: Path) -> None:
    """KodCode's tests use pytest: parametrize (stacked, pytest.param), pytest.raises, approx, Test* classes.
    Before, parametrized tests and Test* classes were never called, and nothing checked the program."""
    assert harness(KODCODE_DIVIDE, tmp_path, "assert", assert_code=tests)["passed"]
    result = harness(wrong, tmp_path, "assert", assert_code=tests)
    assert result["status"] == "wrong_answer" and not result["passed"], result


def test_skipped_xfail_and_fixture_tests_are_not_called(tmp_path: Path) -> None:
    tests = ("import pytest\nfrom solution import divide\n\n"
             "def test_runs():\n    assert divide(4, 2) == 2\n\n"
             "@pytest.mark.skip(reason='later')\ndef test_skip():\n    assert False\n\n"
             "@pytest.mark.skipif(True, reason='not here')\ndef test_skipif():\n    assert False\n\n"
             "@pytest.mark.xfail\ndef test_xfail():\n    assert False\n\n"
             "@pytest.mark.parametrize('x', [1, pytest.param(2, marks=pytest.mark.xfail)])\n"
             "def test_param_xfail(x):\n    assert x == 1\n\n"
             "@pytest.mark.skip(reason='later')\ndef test_skipped_fixture(tmp_path):\n    assert False\n")
    assert harness(KODCODE_DIVIDE, tmp_path, "assert", assert_code=tests)["passed"]
    # Tests that need fixtures are not called either, and the job is not a pass: see
    # test_pytest_tests_the_harness_cannot_run_never_pass_unchecked.
    fixtures = tests + ("def test_fixture(nobody_defines_it):\n    assert False\n\n"
                        "@pytest.mark.parametrize('n', [1], indirect=True)\ndef test_indirect(n):\n    assert False\n")
    result = harness(KODCODE_DIVIDE, tmp_path, "assert", assert_code=fixtures)
    assert result["status"] == "unsupported" and "(and 1 more)" in result["message"], result
