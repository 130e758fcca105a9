"""Checkers: a program's stdout (:func:`compare_stdout`) and a function's return value
(:func:`compare_values`) against the expected ones; run in a trusted process, never in the candidate's.
"""

from __future__ import annotations

import cmath
import json
import math
import re
import string
from decimal import Decimal
from typing import Any

# One way to match each number: with an optional dot between two runs of digits, a run of n digits that is not
# a number (a program's "1111...1x") is split n ways, quadratic (32,000 digits: seconds in the agent's loop,
# which freezes its sandbox until the daemon calls it lost). ASCII digits only, as a judge's checker reads them.
_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?", re.ASCII)
_INTEGER = re.compile(r"[+-]?\d+", re.ASCII)


def _check_tolerance(tolerance: float) -> None:
    if not (tolerance >= 0 and math.isfinite(tolerance)):
        raise ValueError(f"tolerance must be a finite number >= 0, got {tolerance!r}")


def _close(a: float, b: float, tolerance: float) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return math.isclose(a, b, rel_tol=tolerance, abs_tol=tolerance)


def _token_close(actual: str, expected: str, tolerance: float) -> bool:
    if actual == expected:
        return True
    if not (_NUMBER.fullmatch(actual) and _NUMBER.fullmatch(expected)):
        return False
    # Integers compare exactly when both are integers (a relative tolerance
    # would take 12502499 for 12502500); a float checker still accepts "3"
    # for "3.0000001", and "2.9999999" or "1000000001.0" for "1000000000",
    # as judges' float checkers do: a reference printed by C++ shows an
    # integral double as an integer. (So the float checker is for float
    # answers: on integer answers it takes a wrong one printed as a float.)
    # Decimal, not int(): int() refuses strings past 4,300 digits.
    if _INTEGER.fullmatch(actual) and _INTEGER.fullmatch(expected):
        return Decimal(actual) == Decimal(expected)
    got, want = float(actual), float(expected)
    # Tokens past the float range (1e999) parse as inf: unequal strings, unequal numbers.
    return math.isfinite(got) and math.isfinite(want) and _close(got, want, tolerance)


# CodeContests' tester (google-deepmind/code_contests, execution/tester_sandboxer.cc: OutputsMatch, SplitAndLowercase,
# ValuesMatch) splits at these five characters only (absl::ByAnyChar(" \n\t\r\v")) and lower-cases ASCII letters only
# (absl::AsciiStrToLower): a form feed or a no-break space stays inside a token, and "É" is not "é".
_CODE_CONTESTS_TOKEN = re.compile(r"[^ \n\t\r\v]+")
_ASCII_LOWER = str.maketrans(string.ascii_uppercase, string.ascii_lowercase)
# What absl::SimpleAtod reads besides a decimal number (lower-cased here): infinities and NaNs, a NaN with a payload.
# They are numbers there, and their difference with anything is never below the tolerance: they never match per token.
_NON_FINITE = re.compile(r"[+-]?(?:inf(?:inity)?|nan(?:\(\w*\))?)", re.ASCII)
# ValuesMatch's kDoublePrecision: absolute, and strictly below.
_CODE_CONTESTS_TOLERANCE = 1e-5


def _code_contests_value(token: str) -> float | None:
    """A lower-cased token as a number the way CodeContests' tester reads one; None for a word."""
    if _NUMBER.fullmatch(token):
        return float(token)  # past the double range: inf, as absl's
    return math.nan if _NON_FINITE.fullmatch(token) else None


def _code_contests_token(actual: str, expected: str) -> bool:
    got, want = _code_contests_value(actual), _code_contests_value(expected)
    if got is None or want is None:
        return actual == expected
    # Two integers compare exactly. The tester compares every number as a double (absl::SimpleAtod reads
    # integers too), so 10^18 + 1 for 10^18 passed there; an off-by-one 64-bit answer written as an integer is
    # not paid here. Written as a double (1e18, 1000000000000000000.0) it is compared as one, as there.
    if _INTEGER.fullmatch(actual) and _INTEGER.fullmatch(expected):
        return Decimal(actual) == Decimal(expected)
    # A NaN, or inf - inf, is never below: as in the tester, a non-finite token matches no token here.
    return abs(got - want) < _CODE_CONTESTS_TOLERANCE


def _tokens_ignore_case(actual: str, expected: str) -> bool:
    got = _CODE_CONTESTS_TOKEN.findall(actual.translate(_ASCII_LOWER))
    want = _CODE_CONTESTS_TOKEN.findall(expected.translate(_ASCII_LOWER))
    if got == want:
        return True
    return len(got) == len(want) and all(_code_contests_token(g, w) for g, w in zip(got, want, strict=True))


def _decimals(tokens: list[str]) -> list[Decimal] | None:
    """A line's tokens as LiveCodeBench's convert_line_to_decimals reads them; None when one is not a number.

    Decimal() keeps the exponent apart from the digits, so 1e999999999 is a short object, and
    comparing two costs their digits, not their magnitude.
    """
    try:
        return [Decimal(token) for token in tokens]
    except (ArithmeticError, ValueError):  # decimal.InvalidOperation is an ArithmeticError
        return None


def _lines_decimal(actual: str, expected: str) -> bool:
    # LiveCodeBench's grade_stdio (lcb_runner/evaluation/testing_util.py): get_stripped_lines, then each pair of
    # lines equal as text, else equal as lists of Decimals (2.0 = 2.00, 1e3 = 1000).
    got = [line.strip() for line in actual.strip().split("\n")]
    want = [line.strip() for line in expected.strip().split("\n")]
    if len(got) != len(want):
        return False
    for got_line, want_line in zip(got, want, strict=True):
        if got_line == want_line:
            continue
        got_tokens, want_tokens = got_line.split(), want_line.split()
        # Counted before any Decimal is made: lists of different lengths are unequal anyway, and the
        # Decimals of a 16 MiB line of output take about 1 s of the agent's event loop per case, which
        # every job of the sandbox waits on. A line's Decimals are made only when it holds as many tokens
        # as the expected line.
        if len(got_tokens) != len(want_tokens):
            return False
        got_values, want_values = _decimals(got_tokens), _decimals(want_tokens)
        try:
            # NaN equals nothing, Infinity only Infinity, as Decimal's ==.
            if got_values is None or got_values != want_values:
                return False
        except ArithmeticError:  # a signaling NaN refuses ==; the grader fails the case on its exception
            return False
    return True


def compare_stdout(
    actual: str | bytes, expected: str | bytes, checker: str = "whitespace", tolerance: float = 1e-6
) -> bool:
    """Whether a program's stdout matches the expected output.

    Checkers (``Checker`` in the API, lower-cased without the prefix):

    - ``"whitespace"`` (default, also ``""``/``"unspecified"``): the
      whitespace-separated tokens are equal, so trailing spaces, blank lines,
      ``\\r\\n`` and the final newline do not matter (Codeforces' ``wcmp``).
    - ``"exact"``: byte-for-byte equal.
    - ``"float"``: same tokens, except that two numbers are equal when within
      ``tolerance``, absolute or relative.
    - ``"tokens_ignore_case"`` (CodeContests' tester): tokens split at ASCII
      blanks, equal once ASCII letters are lower-cased, or both numbers less
      than 1e-5 apart (absolute; ``tolerance`` is not used); two integers
      compare exactly, and an infinity or NaN matches only in an output equal
      token for token.
    - ``"lines_decimal"`` (LiveCodeBench's grader): as many lines once the
      output is stripped, each line equal once stripped, or its tokens equal
      as ``Decimal`` numbers (``2.0`` = ``2.00``; NaN equals nothing).

    Bytes are decoded as UTF-8 with replacement.
    """
    if isinstance(actual, bytes):
        actual = actual.decode("utf-8", "replace")
    if isinstance(expected, bytes):
        expected = expected.decode("utf-8", "replace")
    name = (checker or "whitespace").strip().lower().removeprefix("checker_")
    if name in ("whitespace", "unspecified", ""):
        return actual.split() == expected.split()
    if name == "exact":
        return actual == expected
    if name == "float":
        _check_tolerance(tolerance)
        got, want = actual.split(), expected.split()
        return len(got) == len(want) and all(
            _token_close(g, w, tolerance) for g, w in zip(got, want, strict=True)
        )
    if name == "tokens_ignore_case":
        return _tokens_ignore_case(actual, expected)
    if name == "lines_decimal":
        return _lines_decimal(actual, expected)
    raise ValueError(f"unknown checker {checker!r}")


def _json_key(key: Any) -> str | None:
    """The string JSON turns a dict key into, or None when JSON cannot."""
    if isinstance(key, str):
        return key
    if isinstance(key, bool):
        return "true" if key else "false"
    if key is None:
        return "null"
    if isinstance(key, (int, float)):
        return json.dumps(key)
    return None


def _compare(actual: Any, expected: Any, tolerance: float, depth: int) -> bool:
    if depth > 1000:
        return False
    ta, te = type(actual), type(expected)
    # bool first: True must not equal 1, although Python says it does.
    if ta is bool or te is bool:
        return ta is te and actual == expected
    if actual is None or expected is None:
        return actual is None and expected is None
    if te is int and ta in (int, float, complex):
        # An integer answer is exact, as in the datasets' own `==` checks: a
        # tolerance would take float(n * (n + 1) // 2 - 1) for n * (n + 1) // 2.
        # An integral float that equals it exactly (3.0 for 3) still passes.
        return actual == expected
    if ta in (int, float) and te in (int, float):
        try:
            return _close(float(actual), float(expected), tolerance)
        except OverflowError:
            return False
    if ta is complex or te is complex:
        if ta not in (int, float, complex) or te not in (int, float, complex):
            return False
        a, e = complex(actual), complex(expected)
        if cmath.isnan(a) or cmath.isnan(e):
            return cmath.isnan(a) and cmath.isnan(e)
        return cmath.isclose(a, e, rel_tol=tolerance, abs_tol=tolerance)
    if ta in (list, tuple) and te in (list, tuple):
        return len(actual) == len(expected) and all(
            _compare(a, e, tolerance, depth + 1) for a, e in zip(actual, expected, strict=True)
        )
    if ta is dict and te is dict:
        if len(actual) != len(expected):
            return False
        if actual.keys() == expected.keys():
            return all(_compare(actual[k], expected[k], tolerance, depth + 1) for k in expected)
        # Expected values often went through JSON, which turned {1: x} into {"1": x}.
        got = {_json_key(k): k for k in actual}
        want = {_json_key(k): k for k in expected}
        if None in got or None in want or len(got) != len(actual) or got.keys() != want.keys():
            return False
        return all(_compare(actual[got[k]], expected[want[k]], tolerance, depth + 1) for k in want)
    if ta in (set, frozenset) and te in (set, frozenset):
        # Python's own == would take {True} for {1}, as it would True for 1.
        return len(actual) == len(expected) and _set_items(actual) == _set_items(expected)
    if ta in (str, bytes) and ta is te:
        return actual == expected
    return False


def _set_item(item: Any) -> Any:
    """`item` as a set member that equals another only when `_compare` would: bools apart from numbers."""
    kind = type(item)
    if kind is bool:
        return (bool, item)
    if kind is tuple:
        return (tuple, tuple(_set_item(part) for part in item))
    if kind is frozenset:
        return (frozenset, _set_items(item))
    return item


def _set_items(items: set[Any] | frozenset[Any]) -> frozenset[Any]:
    return frozenset(_set_item(item) for item in items)


def compare_values(actual: Any, expected: Any, tolerance: float = 1e-6) -> bool:
    """Whether a decoded return value equals the expected value, on plain data only.

    Rules: a list equals a tuple with equal items (JSON has no tuples); an
    expected ``int`` is matched exactly (``3`` or ``3.0``, never ``2.9999999``);
    an expected ``float`` matches a number within ``tolerance`` (absolute or
    relative); NaN equals NaN; ``bool`` never equals a
    number (``True != 1`` here); dicts compare key by key, and when the key
    sets differ they are compared as JSON would write them (``{1: x}`` equals
    ``{"1": x}``); sets compare exactly; ``str`` and ``bytes`` never equal each
    other. Any other type (anything that is not plain data) is never equal, so
    objects with a lying ``__eq__`` cannot pass.
    """
    _check_tolerance(tolerance)
    return _compare(actual, expected, tolerance, 0)
