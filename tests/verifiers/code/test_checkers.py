"""Tests of sandboxd.verifiers.code.checkers: stdout and return values against the expected ones."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from sandboxd.verifiers.code import (
    compare_stdout,
    compare_values,
)

pytestmark = pytest.mark.timeout(60)


def test_compare_stdout_whitespace() -> None:
    assert compare_stdout("1 2\n3\n", "1 2\n3")
    assert compare_stdout("1 2  \r\n3\n\n\n", "1 2\n3\n")
    assert compare_stdout(b"yes\n", "yes")
    assert not compare_stdout("1 2 3", "1 2")
    assert not compare_stdout("YES", "yes")
    assert compare_stdout("", "\n")


def test_compare_stdout_exact_and_float() -> None:
    assert compare_stdout("a\n", "a\n", "exact")
    assert not compare_stdout("a", "a\n", "CHECKER_EXACT")
    assert compare_stdout("0.3333333 x\n", "0.33333333333 x", "float", 1e-6)
    assert compare_stdout("1000000.5", "1000000.0", "float", 1e-6)  # relative
    assert compare_stdout("3", "3.0000000001", "float")
    # Two integers compare exactly, however big (no relative tolerance).
    assert not compare_stdout("12502499 0.5", "12502500 0.5", "float", 1e-6)
    assert compare_stdout("+12502500", "12502500", "float")
    # A float checker compares an integer answer within tolerance unless both are integers,
    # as judges' float checkers do (a C++ reference prints an integral double as an integer).
    assert compare_stdout("12502500.0000001", "12502500", "float", 1e-6)
    assert compare_stdout("1.25025e7", "12502500", "float", 1e-6)
    # Past int()'s 4,300 digits: an answer, not an error in the agent (red team).
    assert compare_stdout("1" * 5000, "1" * 5000, "float")
    assert not compare_stdout("1" * 5000, "1" * 4999 + "2", "float")
    assert not compare_stdout("0.34", "0.33", "float", 1e-6)
    assert not compare_stdout("1 2", "1", "float")
    assert not compare_stdout("nan", "NaN", "float")
    assert not compare_stdout("1e999", "1e998", "float")
    with pytest.raises(ValueError):
        compare_stdout("1", "1", "float", float("nan"))
    with pytest.raises(ValueError):
        compare_stdout("1", "1", "fuzzy")


@pytest.mark.timeout(20)  # the time bound: these took minutes to hours before
def test_the_float_checker_reads_any_output_in_linear_time() -> None:
    """A run of digits that is not a number ("1111...1x") was split every way the number pattern allowed: 32,000
    digits took 19.5 s on the agent's loop, which froze the sandbox until the daemon called it lost, and the job
    came back SANDBOX_LOST, not WRONG_ANSWER (red team). A million digits now."""
    assert not compare_stdout("1" * 1_000_000 + "x", "3", "float")
    assert not compare_stdout("1." + "1" * 1_000_000 + "e", "3", "float")
    assert compare_stdout("0." + "3" * 1_000_000, "0.3333333", "float")


def test_the_float_checker_reads_ascii_numbers_only() -> None:
    # As a judge's checker: a full-width digit is not the digit (float() took it).
    assert not compare_stdout("\uff13", "3", "float") and not compare_stdout("\u0663", "3", "float")
    assert compare_stdout("1. .5 +2e0", "1 0.5 2", "float")


def test_a_zero_float_tolerance_is_exact() -> None:
    """float_tolerance=0 (an explicit 0 in the API) compares floats exactly, without dividing by it."""
    assert compare_stdout("0.30000000000000004\n", "0.3\n", "float")
    assert not compare_stdout("0.30000000000000004\n", "0.3\n", "float", 0.0)
    assert not compare_stdout("1000000000.0000001", "1000000000.0000002", "float", 0.0)  # not relative either
    assert compare_stdout("0.30 1e3 -0.0\n", "0.3 1000.0 0", "float", 0.0)  # equal numbers, other spellings
    assert compare_stdout("0.3 abc", "0.3 abc", "float", 0.0)
    assert compare_stdout("1e999", "1e999", "float", 0.0)  # equal tokens, even past the float range
    assert compare_values(0.1 + 0.2, 0.3)
    assert not compare_values(0.1 + 0.2, 0.3, 0.0)
    assert not compare_values([1.0, 0.1 + 0.2], [1.0, 0.3], 0.0)
    assert not compare_values(complex(0.1 + 0.2, 1), complex(0.3, 1), 0.0)
    assert compare_values(0.5, 0.5, 0.0) and compare_values(0.0, -0.0, 0.0)
    assert compare_values(float("inf"), float("inf"), 0.0) and compare_values(float("nan"), float("nan"), 0.0)
    assert compare_values({"x": [0.25]}, {"x": (0.25,)}, 0.0)
    with pytest.raises(ValueError):
        compare_values(1.0, 1.0, -1e-9)


# CodeContests' tester: google-deepmind/code_contests, execution/tester_sandboxer.cc (OutputsMatch).
@pytest.mark.parametrize(("actual", "expected", "passes"), [
    pytest.param("Yes\n", "YES\n", True, id="case-of-a-word"),
    pytest.param("possible\n1 2\n", "POSSIBLE\n1 2", True, id="case-among-numbers"),
    pytest.param("1  2\r\n\n3\t\v", "1 2\n3\n", True, id="ascii-blanks"),
    pytest.param("0.333333", "0.3333333333", True, id="within-1e-5"),
    pytest.param("3.000009", "3", True, id="an-integer-within-1e-5"),
    pytest.param("1e3", "1000", True, id="a-number-spelt-otherwise"),
    pytest.param("1.00002", "1", False, id="past-1e-5"),
    pytest.param("1000000.00002", "1000000", False, id="absolute-not-relative"),
    pytest.param("1.2 x", "1.2 y", False, id="another-word"),
    pytest.param("1\f2", "1 2", False, id="form-feed-is-no-separator"),
    pytest.param("1\u00a02", "1 2", False, id="no-break-space-is-no-separator"),
    pytest.param("\u00c9T\u00c9", "\u00e9t\u00e9", False, id="ascii-case-only"),
    pytest.param("0x10", "16", False, id="hex-is-a-word"),
])
def test_the_tokens_ignore_case_checker_is_code_contests_tester(actual: str, expected: str, passes: bool) -> None:
    """`Yes` against `YES` failed the default checker, where CodeContests' own tester passes it (review)."""
    assert compare_stdout(actual, expected, "tokens_ignore_case") is passes
    assert compare_stdout(actual, expected, "CHECKER_TOKENS_IGNORE_CASE") is passes


def test_the_tokens_ignore_case_checker_has_its_testers_tolerance_only() -> None:
    # ValuesMatch's kDoublePrecision, 1e-5 absolute, whatever float_tolerance the request gives.
    assert compare_stdout("1.000009", "1", "tokens_ignore_case", 0.0)
    assert not compare_stdout("1.00002", "1", "tokens_ignore_case", 1e-3)


@pytest.mark.parametrize(("actual", "expected"), [
    pytest.param("", "YES\n", id="empty-output"),
    pytest.param("YES\nYes\nyes\n", "YES\n", id="every-case-variant"),
    pytest.param("YES NO", "YES", id="both-answers"),
    pytest.param("nan", "5", id="nan-for-a-number"),
    pytest.param("nan(123)", "5", id="nan-with-a-payload"),
    pytest.param("NaN 2", "NaN 2.000001", id="nan-against-nan-beside-another-number"),
    pytest.param("inf", "1e308", id="inf-for-a-finite-number"),
    pytest.param("-infinity", "-1e308", id="minus-infinity"),
    pytest.param("1e999 1", "1e999 1.000001", id="equal-infinities-beside-another-number"),
    pytest.param("1e999", "inf", id="an-overflow-is-no-match"),
    # The tester reads 64-bit integers as doubles, where 10^18 + 1 is 10^18: an off-by-one is not paid here.
    pytest.param("1000000000000000001", "1000000000000000000", id="big-integers-exact"),
    pytest.param("1" * 5000, "1" * 4999 + "2", id="past-int-digits"),
])
def test_the_tokens_ignore_case_checker_pays_no_attack(actual: str, expected: str) -> None:
    assert not compare_stdout(actual, expected, "tokens_ignore_case")


def test_the_tokens_ignore_case_checker_takes_equal_outputs_of_any_token() -> None:
    """Token lists equal once lower-cased pass first, as in the tester: an expected NaN or infinity too."""
    assert compare_stdout("NaN Inf", "nan inf\n", "tokens_ignore_case")
    assert compare_stdout("1" * 5000, "1" * 5000, "tokens_ignore_case")
    assert compare_stdout("", "\n", "tokens_ignore_case")


@pytest.mark.timeout(20)
def test_the_tokens_ignore_case_checker_reads_any_output_in_linear_time() -> None:
    assert not compare_stdout("1" * 1_000_000 + "x", "3", "tokens_ignore_case")
    assert not compare_stdout("1." + "1" * 1_000_000 + "e", "3", "tokens_ignore_case")
    assert compare_stdout("0." + "3" * 1_000_000, "0.3333333", "tokens_ignore_case")
    assert not compare_stdout("9" * 1_000_000, "1e999", "tokens_ignore_case")


# LiveCodeBench's grader: lcb_runner/evaluation/testing_util.py (grade_stdio, get_stripped_lines,
# convert_line_to_decimals).
@pytest.mark.parametrize(("actual", "expected", "passes"), [
    pytest.param("2.0\n", "2.00\n", True, id="equal-decimals"),
    pytest.param("1e3 -0\n", "1000 0\n", True, id="other-spellings"),
    pytest.param("1  2\n", "1 2\n", True, id="blanks-between-numbers"),
    pytest.param("\n\n  abc \r\n3\n\n", "abc\n3", True, id="stripped-lines"),
    pytest.param("0.30000000000000004", "0.3", False, id="no-tolerance"),
    pytest.param("1 2\n", "1\n2\n", False, id="a-line-break-counts"),
    pytest.param("1\n\n2\n", "1\n2\n", False, id="a-blank-line-inside-counts"),
    pytest.param("a  b\n", "a b\n", False, id="blanks-inside-a-text-line"),
    pytest.param("YES\n", "yes\n", False, id="case-counts"),
])
def test_the_lines_decimal_checker_is_livecodebench_grader(actual: str, expected: str, passes: bool) -> None:
    """LiveCodeBench's grader takes 2.0 for 2.00, which the default checker failed (review)."""
    assert compare_stdout(actual, expected, "lines_decimal") is passes
    assert compare_stdout(actual, expected, "CHECKER_LINES_DECIMAL") is passes


@pytest.mark.parametrize(("actual", "expected"), [
    pytest.param("", "5\n", id="empty-output"),
    pytest.param("5\n", "", id="output-where-none-is-expected"),
    pytest.param("YES\nyes\n", "yes\n", id="every-case-variant"),
    pytest.param("NaN\n", "5\n", id="nan-for-a-number"),
    pytest.param("NaN 1\n", "NaN 1.0\n", id="nan-against-nan"),
    pytest.param("sNaN\n", "5\n", id="a-signaling-nan"),
    pytest.param("Infinity\n", "1e999999999\n", id="infinity-for-a-finite-number"),
    pytest.param("-inf\n", "-1e999999999\n", id="minus-infinity"),
    pytest.param("1e999999999\n", "1\n", id="a-huge-exponent"),
    pytest.param("1e99999999999999999999\n", "1\n", id="an-exponent-past-the-context"),
])
def test_the_lines_decimal_checker_pays_no_attack(actual: str, expected: str) -> None:
    assert not compare_stdout(actual, expected, "lines_decimal")


@pytest.mark.timeout(20)
def test_the_lines_decimal_checker_reads_any_output_in_linear_time() -> None:
    assert not compare_stdout("1" * 4_000_000 + "x", "3", "lines_decimal")
    assert not compare_stdout("1" * 4_000_000, "1" * 3_999_999 + "2", "lines_decimal")
    assert compare_stdout("1" * 4_000_000 + "e-3999999", "1." + "1" * 3_999_999, "lines_decimal")
    assert not compare_stdout("1 " * 1_000_000, "1 " * 999_999 + "2", "lines_decimal")


def test_the_lines_decimal_checker_makes_no_decimal_of_a_line_with_too_many_tokens(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A line of 16 MiB of tokens against a short expected line: each token became a Decimal before the lists
    were compared, 1.1 s of the agent's event loop per case (red team). Counted in Decimals made, not seconds."""
    from sandboxd.verifiers.code import checkers

    made: list[str] = []

    def counting_decimal(token: str) -> Decimal:
        made.append(token)
        return Decimal(token)

    monkeypatch.setattr(checkers, "Decimal", counting_decimal)
    assert not compare_stdout("1 " * 100_000, "1.0 2\n", "lines_decimal")
    assert made == []
    assert compare_stdout("1 2.0\n", "1.0 2\n", "lines_decimal")  # as many tokens: read as numbers
    assert made == ["1", "2.0", "1.0", "2"]


@pytest.mark.parametrize(
    ("actual", "expected", "equal"),
    [
        ([1, 2], [1, 2], True),
        ((1, 2), [1, 2], True),
        ([[1, (2, 3)]], [[1, [2, 3]]], True),
        (1, 1.0000000001, True),
        (3.0, 3, True),
        # An expected int is exact: a tolerance would take an off-by-one
        # answer returned as a float (reward hacking by `/` instead of `//`).
        (2000999.0, 2001000, False),
        (1e-7, 0, False),
        (2.9999999999, 3, False),
        (complex(6, 1e-7), 6, False),
        (complex(6, 0), 6, True),
        (0.1 + 0.2, 0.3, True),
        (1.0, 1.1, False),
        (10**30, 10**30 + 1, False),
        (True, 1, False),
        (1, True, False),
        (False, 0.0, False),
        (True, True, True),
        (None, None, True),
        (None, 0, False),
        (float("nan"), float("nan"), True),
        (float("inf"), float("inf"), True),
        (float("inf"), 1e308, False),
        ("a", "a", True),
        ("a", b"a", False),
        ({"a": [1, 2]}, {"a": (1, 2)}, True),
        ({1: "x"}, {"1": "x"}, True),
        ({1: "x", "1": "y"}, {"1": "x", "2": "y"}, False),
        ({"a": 1}, {"a": 1, "b": 2}, False),
        ({1, 2}, {2, 1}, True),
        ({1, 2}, frozenset({1, 2}), True),
        ({1, 2}, [1, 2], False),
        ({True}, {1}, False),
        ({1, 0}, {True, False}, False),
        ({(1, True)}, {(1, 1)}, False),
        ({frozenset({False})}, {frozenset({0})}, False),
        ({(1, frozenset({True}))}, {(1, frozenset({True}))}, True),
        ({1.0, 2}, {1, 2}, True),
        (1 + 2j, complex(1, 2.0000000001), True),
        ([1], 1, False),
        (object(), object(), False),
    ],
)
def test_compare_values(actual: Any, expected: Any, equal: bool) -> None:
    assert compare_values(actual, expected) is equal


def test_compare_values_ignores_lying_eq() -> None:
    class Liar:
        def __eq__(self, other: object) -> bool:
            return True

        __hash__ = object.__hash__

    class LyingInt(int):
        def __eq__(self, other: object) -> bool:
            return True

        __hash__ = int.__hash__

    assert not compare_values(Liar(), 5)
    assert not compare_values(LyingInt(1), 5)
    assert not compare_values([Liar()], [5])
