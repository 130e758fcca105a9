"""Tests of the math verifier's judge (sandboxd.verifiers.math.judge): ``verify`` end to end.

The equivalence cases follow the categories of Math-Verify's own test-suite (numbers, fractions,
sets, intervals, matrices, equations, units, percentages, text, multiple choice), written in our
own words, plus the Math-Verify false positives this verifier deliberately rejects and hostile
inputs that must end in a clean status.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
from collections.abc import Callable
from typing import Any

import pytest

pytest.importorskip("math_verify")

from sandboxd.verifiers import math as mathv
from sandboxd.verifiers.math import judge
from tests.verifiers.math.helpers import (  # noqa: F401 (_warm: an autouse fixture)
    NONE,
    OK,
    WRONG,
    _warm,
    boxed,
    check,
    nest,
    powers,
    symbolic_intervals,
)

# --------------------------------------------------------------------------------------------
# Result shape
# --------------------------------------------------------------------------------------------


def test_result_is_json_able_with_all_keys() -> None:
    result = mathv.verify(boxed("\\frac{1}{2}"), "0.5")
    assert set(result) == {
        "status",
        "extracted_answer",
        "extraction",
        "parsed_answer",
        "parsed_ground_truth",
        "message",
    }
    assert json.loads(json.dumps(result)) == result
    assert result["status"] == OK
    assert result["extraction"] == "boxed"
    assert result["extracted_answer"] == "\\frac{1}{2}"


def test_long_fields_are_truncated() -> None:
    result = mathv.verify(boxed("x" * 50_000), "3")
    assert result["status"] == WRONG
    assert all(len(v) <= mathv.MAX_FIELD_CHARS for v in result.values())


def test_unknown_extraction_mode_is_a_caller_error() -> None:
    with pytest.raises(ValueError):
        mathv.verify("\\boxed{1}", "1", extraction="first_box")


def test_no_answer_status() -> None:
    result = check("I am not sure how to solve this.", "3", NONE)
    assert result["extraction"] == ""


def test_boxed_only_mode_ignores_other_forms() -> None:
    check("The answer is 3.", "3", NONE, extraction="boxed")
    check("The answer is 3.", "3", OK, extraction="phrase")


# --------------------------------------------------------------------------------------------
# Equivalence by category (gold, answer, expected)
# --------------------------------------------------------------------------------------------

NUMBERS = [
    ("42", "42", OK),
    ("42", "43", WRONG),
    ("1234", "1,234", OK),
    ("1234567", "1,234,567", OK),
    ("1234.5", "1,234.5", OK),
    ("3.5", "3,5", OK),  # decimal comma
    ("1234.5", "1.234,5", OK),  # European thousands separator
    ("0.5", "\\frac{1}{2}", OK),
    ("1500", "1.5e3", OK),
    ("0.00025", "2.5 \\times 10^{-4}", OK),
    ("-7", "-7", OK),
    ("-7", "7", WRONG),
    ("007", "7", OK),
    ("3.14159", "3.14159", OK),
    ("\\pi", "3.1415926", OK),  # within the relative float tolerance
    ("\\pi", "3.14", WRONG),
    ("\\frac{1}{3}", "0.333333", OK),
    ("\\frac{1}{3}", "0.33", WRONG),
    ("1234567.891", "1234567.8915", OK),  # relative, not absolute, tolerance
    ("1000", "1\\,000", OK),  # SI thin-space thousands separator
    ("1000", "1 000", OK),
    ("1000", "1{,}000", OK),
    ("1000", "\\$1,000.00", OK),
    ("100", "1\\,000", WRONG),
    ("1000", "1 000 000", WRONG),
    ("\\frac{2}{3}", "0.\\overline{6}", OK),  # repeating decimals are exact
    ("\\frac{1}{6}", "0.1\\overline{6}", OK),
    ("1", "0.\\overline{9}", OK),
    ("0", "0.\\overline{3}", WRONG),  # was read as 0
    ("1500", "1.5 \\times 10^3", OK),
    ("1500", "1.5E3", OK),
    ("6.02 \\times 10^{23}", "6.02e23", OK),
    ("6.02 \\times 10^{23}", "6.02 \\times 10^{22}", WRONG),
    ("-5", "\u22125", OK),  # Unicode minus
    ("-5", "(-5)", OK),
    ("5", "+5", OK),
    ("5", "-5", WRONG),
    ("\\frac{1}{2}", "\u00bd", OK),
    ("\\infty", "\u221e", OK),
]

FRACTIONS_AND_SYMBOLIC = [
    ("\\frac{7}{2}", "3\\frac{1}{2}", OK),  # mixed number in LaTeX
    ("\\frac{7}{2}", "3 1/2", OK),  # mixed number in plain text
    ("\\frac{7}{2}", "7/2", OK),
    ("\\frac{6}{8}", "\\frac34", OK),
    ("\\dfrac{2}{3}", "\\tfrac{2}{3}", OK),
    ("\\frac{\\sqrt{3}}{2}", "\\frac{1}{2}\\sqrt{3}", OK),
    ("2\\sqrt{2}", "\\sqrt{8}", OK),
    ("\\frac{1}{\\sqrt{2}}", "\\frac{\\sqrt{2}}{2}", OK),
    ("(x+1)^2", "x^2 + 2x + 1", OK),
    ("(x+1)^2", "x^2 + 1", WRONG),
    ("e^{0} + \\ln e", "2", OK),
    ("\\log_2 8", "3", OK),
    ("\\binom{5}{2}", "10", OK),
    ("2^{10}", "1024", OK),
    ("\\frac{1}{2^{99}}", "2^{-99}", OK),
    # Expansion / factorisation, both directions, and near misses.
    ("x^2+8x+16", "(x+4)^2", OK),
    ("(x+4)^2", "x^2+8x+16", OK),
    ("x^2+8x+15", "(x+4)^2", WRONG),
    ("(x+4)^2", "x^2+8x+15", WRONG),
    ("x^2+8x+15", "(x+5)(x+3)", OK),
    ("x^2-1", "(x-1)(x-1)", WRONG),
    ("(a+b)^3", "a^3+3a^2b+3ab^2+b^3", OK),
    ("(a+b)^3", "a^3+3a^2b+3ab^2+b^2", WRONG),
    ("\\frac{x^2-1}{x-1}", "x+1", OK),
    ("\\frac{x+1}{2}", "x+1/2", WRONG),
    ("-\\frac{3}{4}", "\\frac{3}{-4}", OK),
    ("\\frac{22}{7}", "3 \\frac{1}{7}", OK),
    ("\\dfrac{1}{2}", "\\frac12", OK),
    # sqrt and pi in LaTeX, plain and Unicode spellings.
    ("2\\sqrt{3}", "2 \\sqrt 3", OK),
    ("2\\sqrt{3}", "2*sqrt(3)", OK),
    ("2\\sqrt{3}", "2 sqrt(3)", OK),
    ("2\\sqrt{3}", "2\u221a3", OK),
    ("\\sqrt{2}", "\u221a2", OK),
    ("2", "2 sqrt(3)", WRONG),  # Math-Verify's text extractor would take the "2"
    ("2", "2\u221a3", WRONG),
    ("15", "x^2 + 8x + 15 \\oops{", WRONG),  # nor pick "15" out of unparsable LaTeX
    ("\\sqrt[3]{8}", "2", OK),
    ("3+2\\sqrt{2}", "(1+\\sqrt{2})^2", OK),
    ("2\\pi", "2pi", OK),
    ("2\\pi", "2\u03c0", OK),
    ("\\pi", "2pi", WRONG),
    ("\\frac{\\pi}{3}", "\\frac{1}{3}\\pi", OK),
    ("36\\pi", "36\\pi \\text{ square units}", OK),
]

SETS_TUPLES_INTERVALS = [
    ("\\{1, 2, 3\\}", "\\{3, 1, 2\\}", OK),  # sets are unordered
    ("\\{1, 2, 3\\}", "\\{1, 2\\}", WRONG),
    ("1, 2, 3", "3, 2, 1", OK),
    ("\\{3, 5\\}", "3,5", OK),  # a comma list is a set when the gold is one
    ("(1, 2, 3)", "(1, 2, 3)", OK),
    ("(1, 2, 3)", "(3, 2, 1)", WRONG),  # tuples are ordered
    ("(1, 2)", "(2, 1)", WRONG),
    ("\\{\\frac{1}{3}, 2\\}", "\\{2, 0.333333\\}", OK),
    ("[1, 2)", "[1, 2)", OK),
    ("[1, 2)", "[1, 2]", WRONG),
    ("(-\\infty, 3]", "(-\\infty, 3]", OK),
    # Like Math-Verify: a relation is compared to a set only when the *answer* is the set.
    ("(-\\infty, 3]", "x \\le 3", WRONG),
    ("(0, \\infty)", "(0, +\\infty)", OK),
    ("(1,2) \\cup (3,4)", "(3,4) \\cup (1,2)", OK),
    ("\\pm 2", "\\{-2, 2\\}", OK),
    ("\\pm 2021", "2021", WRONG),
    ("2, 3", "2 \\text{ and } 3", OK),
    ("2, 3", "2 and 3", OK),
    ("2, 3", "x = 2 \\text{ or } x = 3", OK),
    ("2, 3", "x = 2 or x = 3", OK),
    ("2, 3", "2 and 4", WRONG),
    ("2, 3", "2 or 3 or 4", WRONG),
    ("2, -3", "-3, 2", OK),
    ("2, -3", "3, -2", WRONG),
    ("\\emptyset", "\\varnothing", OK),
    ("\\emptyset", "\\{0\\}", WRONG),
    ("(2,5]", "\\left(2,5\\right]", OK),
    ("(3,-1)", "\\left(-1, 3\\right)", WRONG),
    ("(-\\infty,0)\\cup(1,\\infty)", "(-\\infty,0)\\cup[1,\\infty)", WRONG),
]

MATRICES = [
    ("\\begin{pmatrix}1&2\\\\3&4\\end{pmatrix}", "\\begin{pmatrix}1 & 2 \\\\ 3 & 4\\end{pmatrix}", OK),
    ("\\begin{pmatrix}1&2\\\\3&4\\end{pmatrix}", "\\begin{bmatrix}1&2\\\\3&4\\end{bmatrix}", OK),
    ("\\begin{pmatrix}1&2\\\\3&4\\end{pmatrix}", "\\begin{pmatrix}1&2\\\\4&3\\end{pmatrix}", WRONG),
    ("\\begin{pmatrix}\\frac12\\\\1\\end{pmatrix}", "\\begin{pmatrix}0.5\\\\1\\end{pmatrix}", OK),
    ("\\begin{pmatrix}1\\\\2\\end{pmatrix}", "\\begin{pmatrix}1&2\\end{pmatrix}", WRONG),
]

EQUATIONS_INEQUALITIES = [
    ("x = 3", "3", OK),
    ("3", "x = 3", OK),
    ("x = 3", "x = 3", OK),
    ("x = 3", "x = 4", WRONG),
    ("y = 2x + 1", "y = 1 + 2x", OK),
    ("y = 2x + 1", "y = 2x - 1", WRONG),
    ("2x + 4y - 3 = 0", "y = -\\frac{1}{2}x + \\frac{3}{4}", OK),
    ("3x - y + 13 = 0", "6x - 2y + 26 = 0", OK),  # the same line, scaled
    ("x < 3", "x < 3", OK),
    ("x < 3", "3 > x", OK),  # flipped
    ("x < 3", "x \\le 3", WRONG),
    ("1 < x \\le 2", "(1, 2]", OK),
    ("x \\ge 5", "[5, \\infty)", OK),
]

UNITS_PERCENT_CURRENCY = [
    ("5", "5 \\text{ cm}", OK),
    ("5", "5\\,\\mathrm{cm}", OK),
    ("12", "12 \\text{ meters}", OK),
    ("90", "90^\\circ", OK),
    ("18", "\\$18", OK),
    ("18.50", "\\$18.50", OK),
    ("50\\%", "50", OK),
    ("50\\%", "0.5", OK),
    ("50\\%", "50\\%", OK),
    ("50\\%", "40\\%", WRONG),
    ("12.5\\%", "12.5", OK),
    ("25\\%", "25 \\text{ percent}", OK),
    ("28\\%", "27 percent", WRONG),
    ("5", "\\text{5 cm}", OK),  # a number inside \text{} with its unit
    ("\\text{5 cm}", "5", OK),
    ("5", "\\text{6 cm}", WRONG),
    ("90", "90\u00b0", OK),
    ("90", "90 \\text{ degrees}", OK),
    ("45", "46^\\circ", WRONG),
    ("\\$32.50", "32.5", OK),
    # A unit in symbols, or a residue's modulus, after the number a number alone asks for (Math-Verify scores these).
    ("10", "10 m/s", OK),
    ("9.8", "9.8 \\, m/s^2", OK),
    ("3", "3 kN \\cdot m", OK),
    ("11", "10 m/s", WRONG),
    ("2", "x \\equiv 2 \\pmod{5}", OK),
    ("2", "2 \\pmod 5", OK),
    ("2", "x \\equiv 2 \\ (\\bmod 5)", WRONG),  # a spacing command: not the forms read
    ("2", "x \\equiv 3 \\pmod{5}", WRONG),
    ("2", "2 x", WRONG),  # not a unit
    ("2", "2 \\pmod x", WRONG),
]

TEXT_AND_CHOICES = [
    ("\\text{Paris}", "Paris", OK),
    ("Paris", "\\text{paris}", OK),
    ("Paris", "sirap", WRONG),  # not a commutative product of letters
    ("\\text{no solution}", "No solution.", OK),
    ("\\text{even}", "\\text{odd}", WRONG),
    ("yes", "Yes", OK),
    ("B", "B", OK),
    ("B", "(B)", OK),
    ("B", "b", OK),
    ("B", "\\text{(B)}", OK),
    ("B", "B) 42", OK),
    ("(C)", "C", OK),
    ("B", "C", WRONG),
    ("B", "42", WRONG),
]


# The letter i alone is the imaginary unit (latex2sympy and Math-Verify read it as a symbol: all of these were refused).
COMPLEX_NUMBERS = [
    ("\\sqrt{-1}", "i", OK),
    ("i", "\\sqrt{-1}", OK),
    ("\\sqrt{-1}", "-i", WRONG),
    ("\\frac{2}{1-i}", "1+i", OK),
    ("1+i", "\\frac{2}{1-i}", OK),
    ("\\frac{2}{1-i}", "1-i", WRONG),
    ("e^{i\\pi}", "-1", OK),
    ("-1", "e^{i\\pi}", OK),
    ("e^{i\\pi}", "1", WRONG),
    ("2i", "(1+i)^2", OK),
    ("1+i", "\\sqrt{2}e^{i\\pi/4}", OK),
    ("1+i", "\\sqrt{2}e^{-i\\pi/4}", WRONG),
    ("\\pm\\sqrt{-1}", "\\{i, -i\\}", OK),
    ("\\frac{2}{1-i}", "z = 1+i", OK),  # an assignment to another letter is compared by its value
    ("\\frac{2}{1-i}", "z = 1-i", WRONG),
    # Math-Verify made the symbol complex only where the text shows an i alone: "4 i" and "4i" were two symbols.
    ("3+4i", "3+4 i", OK),
    ("3+4i", "3+4\\cdot i", OK),
    ("3+4i", "4+3i", WRONG),
    ("1+2i", "1+2\\mathrm{i}", OK),  # the upright i was dropped with everything after it, as text
    ("i", "\\imath", OK),
    # Beside another letter, or as the unknown of a relation, i stays a symbol.
    ("j+1", "i+1", WRONG),
    ("3", "i = 3", OK),
    ("\\sqrt{-1}", "i = 3", WRONG),
]

# A degree sign inside a trig function's argument is pi/180 (it was dropped as a unit: sin 15 degrees was sin 15).
ANGLES = [
    ("\\frac{\\sqrt{6}-\\sqrt{2}}{4}", "\\sin(15^\\circ)", OK),
    ("\\sin(15^\\circ)", "\\frac{\\sqrt{6}-\\sqrt{2}}{4}", OK),
    ("\\frac{\\sqrt{6}-\\sqrt{2}}{4}", "\\sin 15^\\circ", OK),
    ("\\sin(15^\\circ)", "\\frac{\\sqrt6+\\sqrt2}{4}", WRONG),
    ("\\frac{\\sqrt6-\\sqrt2}{4}", "\\sin 15", WRONG),  # fifteen radians
    ("\\sin 15^\\circ", "\\sin 15", WRONG),  # was equal: both sin(15)
    ("\\frac{1}{2}", "\\sin 30\u00b0", OK),
    ("\\sqrt{2}-1", "\\tan 22.5^{\\circ}", OK),
    ("\\frac{1}{8}", "\\cos 20^\\circ \\cos 40^\\circ \\cos 80^\\circ", OK),
    ("\\frac{\\sqrt{6}+\\sqrt{2}}{4}", "\\cos(45^\\circ - 30^\\circ)", OK),
    # Elsewhere the degree sign is still a unit, as in Math-Verify.
    ("30", "30^\\circ", OK),
    ("\\frac{\\pi}{6}", "30^\\circ", WRONG),
]

# Exact zeros written the long way: the relative comparison cannot call them 0 and simplify cannot prove them.
EXACT_ZEROS = [
    ("0", "\\cos\\frac{\\pi}{7}+\\cos\\frac{3\\pi}{7}+\\cos\\frac{5\\pi}{7}-\\frac{1}{2}", OK),
    ("\\cos\\frac{\\pi}{7}+\\cos\\frac{3\\pi}{7}+\\cos\\frac{5\\pi}{7}-\\frac{1}{2}", "0", OK),
    ("0", "\\cos\\frac{2\\pi}{9}+\\cos\\frac{4\\pi}{9}+\\cos\\frac{8\\pi}{9}", OK),
    ("0", "\\tan\\frac{\\pi}{7}\\tan\\frac{2\\pi}{7}\\tan\\frac{3\\pi}{7} - \\sqrt{7}", OK),
    ("0", "\\sin 20^\\circ + \\sin 40^\\circ - \\sin 80^\\circ", OK),
    ("0", "\\cos\\frac{\\pi}{7}+\\cos\\frac{3\\pi}{7}+\\cos\\frac{5\\pi}{7}-\\frac{1}{2}+10^{-100}", WRONG),
    ("0", "\\cos\\frac{\\pi}{7}+\\cos\\frac{3\\pi}{7}+\\cos\\frac{5\\pi}{7}", WRONG),
]


@pytest.mark.parametrize(
    ("gold", "answer", "expected"),
    NUMBERS
    + FRACTIONS_AND_SYMBOLIC
    + SETS_TUPLES_INTERVALS
    + MATRICES
    + EQUATIONS_INEQUALITIES
    + UNITS_PERCENT_CURRENCY
    + TEXT_AND_CHOICES
    + COMPLEX_NUMBERS
    + ANGLES
    + EXACT_ZEROS,
)
def test_equivalence(gold: str, answer: str, expected: str) -> None:
    check(boxed(answer), gold, expected)


@pytest.mark.parametrize(
    ("gold", "completion", "expected"),
    [
        ("$\\frac{1}{2}$", "\\boxed{0.5}", OK),  # gold with delimiters
        ("\\boxed{12}", "The answer is 12", OK),  # gold with a box
        ("\\(x^2\\)", "<answer>x^2</answer>", OK),
        ("B", "The correct option is (B).", NONE),  # no answer phrase, no math, no number
        ("B", "The answer is (B).", OK),
        ("B", "Answer: B", OK),
        ("17", "Answer: 17 apples", OK),
        ("1,234", "The total is 1234 dollars.", OK),
        # Undelimited answers (no box, no $): the whole expression is compared.
        ("x^2+8x+16", "(x+4)^2", OK),
        ("x^2+8x+15", "(x+4)^2", WRONG),
        ("x^2+8x+16", "We factor and get (x+4)^2.", OK),
        ("2", "\\sqrt{2}", WRONG),  # used to be cut to its last number, "2"
        ("2", "\\frac{1}{2}", WRONG),
        ("3", "2x+3", WRONG),
        ("10", "2^{10}", WRONG),
        ("1024", "2^{10}", OK),
        ("10", "10!", WRONG),
        ("\\frac{1}{2}", "The probability is \\frac{1}{2}.", OK),
        ("2x+3", "so f(x) = 2x+3", OK),
        ("\\frac{7}{2}", "3 1/2", OK),
        ("2, 3", "The roots are 2 and 3.", OK),
        ("3", "The roots are 2 and 3.", WRONG),
        ("\\pi", "pi", OK),
        ("7", "The answer is 7 a day", OK),
        ("7", "The answer is 17 a day", WRONG),
        ("5", "The answer is x = 5 because it works", OK),
        ("5", "The answer is x = 6 because 5 works", WRONG),
        ("72", "Natalia sold 48/2 = 24 clips in May.\n#### 72", OK),  # GSM8K style
        ("72", "She sold 48+24 = 72 clips.", OK),
        ("1000.99", "not it's not 10 it's 1,000.99m\u00b2", OK),
        ("1000", "not it's not 10 it's 1 000", OK),
        ("-5", "x = -5", OK),
        ("5", "x = -5", WRONG),
        ("10", "The answer is 10 m/s", OK),
        ("12", "The answer is 12 m\u00b2.", OK),
        ("100", "The final answer is 100 N.", OK),
        ("1000", "The answer is 1,000 km/h", OK),
        ("10", "The answer is 10 m/x", WRONG),  # x is no unit
        ("10", "The answer is 10 m/s or 11 m/s", WRONG),
        ("5m/s", "The answer is 5 m/s", OK),  # a gold with symbols is compared whole, as before
    ],
)
def test_ground_truth_forms_and_non_boxed_answers(gold: str, completion: str, expected: str) -> None:
    check(completion, gold, expected)


def test_float_tolerance_is_relative_and_configurable() -> None:
    check(boxed("100.5"), "100.0", WRONG)
    check(boxed("100.5"), "100.0", OK, float_tolerance=1e-2)
    check(boxed("1.0000001"), "1", OK)
    check(boxed("1.00001"), "1", WRONG)
    check(boxed("1234567.8915"), "1234567.891", OK)


def test_a_zero_float_tolerance_is_exact() -> None:
    """float_tolerance=0 (an explicit 0 in the API) compares floats exactly, without dividing by it."""
    check(boxed("0.30000000000000004"), "0.3", OK)
    check(boxed("0.30000000000000004"), "0.3", WRONG, float_tolerance=0.0)
    check(boxed("1234567.8915"), "1234567.891", WRONG, float_tolerance=0.0)  # relative 4e-10: not exact
    check(boxed("100.0000001"), "100", WRONG, float_tolerance=0.0)  # absolute against an integer: not exact
    check(boxed("\\frac{1}{3}"), "0.333333333333333", WRONG, float_tolerance=0.0)
    # Equal values still match, whatever their spelling.
    for answer, gold in [("0.3", "0.3"), ("0.30", "0.3"), ("1.5e3", "1500"), ("3.0", "3"), ("\\frac{3}{10}", "0.3"),
                         ("0", "0.0"), ("-2.5", "-2.5")]:
        check(boxed(answer), gold, OK, float_tolerance=0.0)


@pytest.mark.parametrize(
    ("answer", "gold"),
    [
        ("1000001.0", "1000000"),
        ("999999.5", "1000000"),
        ("123456.1", "123456"),
        ("1.844674 \\times 10^{19}", "18446744073709551617"),
        ("1.844674e19", "18446744073709551617"),
    ],
)
def test_a_decimal_near_an_integer_is_not_it(answer: str, gold: str) -> None:
    """Against an integer the tolerance is absolute: a relative one passed these off-by-ones (reward hacking)."""
    check(boxed(answer), gold, WRONG)
    check(boxed(answer), gold, WRONG, float_tolerance=1e-12)


def test_against_an_integer_the_tolerance_is_absolute() -> None:
    check(boxed("100.5"), "100", WRONG, float_tolerance=1e-2)
    check(boxed("100.004"), "100", OK, float_tolerance=1e-2)
    check(boxed("3.0"), "3", OK)
    check(boxed("1.5e3"), "1500", OK)
    check(boxed("1500"), "1.5e3", OK)


# --------------------------------------------------------------------------------------------
# Math-Verify false positives that are rejected here
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("gold", "answer"),
    [
        ("\\frac{1}{2004!}", "\\frac{1}{2006!}"),  # Math-Verify #14: tiny values chopped to 0
        ("\\frac{1}{2^{99}}", "\\frac{1}{2^{98}}"),  # #14
        ("10^{-20}", "2 \\cdot 10^{-20}"),
        ("1e-20", "3e-20"),
        ("0.0000001", "0.0000002"),  # absolute round(6) would call these equal
        ("\\frac{2^{2005}+1}{3 \\cdot 2^{2006}}", "\\frac{1}{3 \\cdot 2^{2006}}"),  # #14
        ("2^{1000}", "2^{1000} + 1"),
        ("4", "4\\sqrt(2)"),  # #41: \sqrt(2) was normalised to a LaTeX line break
        ("3*x-1*y+13=0", "3x + 4y + 14=0"),  # #60: both plain-text lines parsed as "0"
        ("x + y = 1", "x - y = 1"),
        ("n=2, 3, 4", "n=1, 2, 3"),  # #14: set right-hand sides
        ("D = (0, 1)", "D = (0, 1.5)"),  # #14
        ("1 - \\frac{1}{e}", "1 + \\frac{1}{e}"),  # #14
        ("Paris", "sirap"),
    ],
)
def test_math_verify_false_positives_are_rejected(gold: str, answer: str) -> None:
    check(boxed(answer), gold, WRONG)


@pytest.mark.parametrize(
    ("gold", "answer"),
    [
        ("\\frac{1}{2004!}", "\\frac{1}{2004!}"),
        ("\\frac{1}{2^{99}}", "\\frac{1}{2^{99}}"),
        ("4\\sqrt{2}", "4\\sqrt(2)"),
        ("3*x-1*y+13=0", "3x - y + 13 = 0"),
        ("n=2, 3, 4", "n=4, 3, 2"),
        ("10^{-20}", "1e-20"),
    ],
)
def test_fixed_cases_still_accept_the_right_answer(gold: str, answer: str) -> None:
    check(boxed(answer), gold, OK)


# --------------------------------------------------------------------------------------------
# Hostile inputs: clean status, quickly (the pytest-timeout marker is the time bound)
# --------------------------------------------------------------------------------------------


@pytest.mark.timeout(20)
@pytest.mark.parametrize(
    "completion",
    [
        boxed("__import__('os').system('touch /tmp/sandboxd_math_pwned')"),
        "The answer is __import__('os').system('touch /tmp/sandboxd_math_pwned')",
        boxed("9^{9^{9^{9}}}"),
        boxed("10^{10^{10}}"),
        boxed("(10^{9})!"),
        boxed("1e999999999"),
        boxed("1" * 100_000),
        "The answer is " + "9" * 100_000,
        "9" * 100_000,
        boxed("{" * 60 + "1" + "}" * 60),
        boxed("(" * 200 + "1" + ")" * 200),
        boxed("\\frac{" * 50 + "1" + "}{2}" * 50),
        boxed("\\{" * 30 + "1" + "\\}" * 30),
        boxed("1+" * 5_000 + "1"),
        "\\boxed{" * 10_000,
        "$" * 50_000,
        "<answer>" * 10_000,
        "<answer>" * 10_000 + "</answer>" * 10_000,
        "\\(" * 30_000,
        "The answer is " + "\\(" * 30_000,
        "The answer is " + "\\[" * 30_000 + "\n" * 10,
        "Answer: " * 20_000,
        boxed("\\begin{pmatrix}" * 20),
        boxed("\x00\x01\ud800"),
        # Towers of exponents: the grammar's prediction is exponential in the height.
        boxed("x^" * 20 + "x"),
        "x^" * 20 + "x",
        "The answer is " + "x^" * 20 + "x",
        boxed("x^{" * 30 + "x" + "}" * 30),
        boxed("(x^" * 12 + "x" + ")" * 12),
        boxed("2^" * 3000 + "2"),
        # Long inputs that look like math (the parser is ~linear but slow per char).
        boxed("x^{2}+" * 3000 + "1"),
        "x^{2}+" * 3000 + "1",
        boxed("1" + " " * 19_000 + "and"),
        "The answer is \\text{5" + " " * 19_000 + "x",
        "(" * 30_000,
        "1 " * 20_000,
        "2 and " * 3_000,
        "pi " * 5_000,
        # Spaces in spans of a list: a regex over each span backtracked cubically (review: ~15 s a span).
        "The answer is $5$, $x =" + " " * 1_900 + "= 5$, $y =" + " " * 1_900 + "= 5$.",
        # The imaginary unit and degrees: refused by the size bounds before the i or the degree sign is evaluated.
        boxed("(2i)^{10^{9}}"),
        boxed("i^{10^{100}}"),
        boxed("2^{i \\cdot 10^{100000}}"),
        boxed("\\sin(i \\cdot 10^{5000})"),
        boxed("\\cos(2^{900000}^\\circ)"),  # multiplied out, its sign took 3.4 s to ask
        boxed("\\sin(9^{9^{9}}^\\circ)"),
    ],
)
def test_hostile_inputs_end_in_a_clean_status(completion: str) -> None:
    result = mathv.verify(completion, "3")
    assert result["status"] in (WRONG, NONE)
    assert json.dumps(result)
    assert not os.path.exists("/tmp/sandboxd_math_pwned")


@pytest.mark.timeout(20)
def test_hostile_ground_truth_is_refused_cleanly() -> None:
    result = mathv.verify(boxed("3"), "9^{9^{9^{9}}}")
    assert result["status"] == WRONG


@pytest.mark.timeout(20)
def test_identical_huge_towers_match_structurally() -> None:
    check(boxed("9^{9^{9^{9}}}"), "9^{9^{9^{9}}}", OK)


@pytest.mark.timeout(20)
def test_exponent_towers_are_refused_cheaply() -> None:
    result = check(boxed("x^" * 6 + "x"), "3", WRONG)
    assert "exponents nested too deeply" in result["message"]
    check(boxed("2^{2^{2^{2}}}"), "2^{16}", OK)  # realistic towers still parse


@pytest.mark.timeout(20)
@pytest.mark.parametrize(
    "answer",
    [
        # sympy worked these out as latex2sympy built them (binom(10^6, 5*10^5): over 20 s in its own loops);
        # now they stay unevaluated and the size bound refuses them.
        "\\binom{10^{6}}{500000}",
        "\\dbinom{1000000}{5 \\cdot 10^{5}}",
        "{1000000 \\choose 500000}",
        "\\Gamma(10^{7})",
        "\\Gamma\\left(1000000\\right)",
        # ... however the arguments are written (a check of the text missed each of these: 15 s or more).
        "\\binom{(1000000)}{500000}",
        "\\binom{1000000}{500000\\,}",
        "\\binom{\\left(1000000\\right)}{500000}",
        "\\binom{10^{100}}{20000}",
        "\\binom{-1}{200000}",
        "\\binom{\\frac{1}{2}}{10^{6}}",
        "\\binom{0.5}{10^{6}}",
        "\\Gamma\\left(\\frac{2000001}{2}\\right)",
        "\\binom{10^{10^{10}}}{3}",
        # Left unevaluated by the parse, then bounded by how the function grows.
        "\\binom{10^{9}}{5 \\cdot 10^{8}}",
        "\\Gamma(10^{12})",
        "\\exp(\\exp(\\exp(10)))",
        "\\cosh(\\cosh(100))",
        "(10^{7})!!",
    ],
)
def test_fast_growing_functions_of_huge_numbers_are_refused_cheaply(answer: str) -> None:
    result = check(boxed(answer), "5", WRONG)
    assert "number too large to evaluate" in result["message"]


@pytest.mark.parametrize(
    ("answer", "truth"),
    [
        ("\\binom{10}{3}", "120"),
        ("\\binom{1000000}{2}", "499999500000"),  # a huge n with a small k is cheap, and kept
        ("\\binom{1000000}{999999}", "1000000"),  # and so is a small n - k
        ("\\binom{30000}{15000}", "\\binom{30000}{15000}"),  # 30,000 bits: evaluated
        ("{6 \\choose 2}", "15"),
        ("\\binom{-1}{3}", "-1"),
        ("\\binom{\\frac{1}{2}}{2}", "-\\frac{1}{8}"),
        ("\\Gamma(5)", "24"),
        ("\\Gamma(\\frac{1}{2})", "\\sqrt{\\pi}"),
        ("\\binom{2n}{n}", "\\binom{2n}{n}"),
        ("\\binom{n}{2}", "\\frac{n(n-1)}{2}"),
        ("e^{2}", "\\exp(2)"),
    ],
)
def test_binomials_gammas_and_exponentials_of_sensible_size_still_compare(answer: str, truth: str) -> None:
    check(boxed(answer), truth, OK)


@pytest.mark.timeout(20)
def test_a_tower_of_fractions_is_compared_by_its_value() -> None:
    """Sorting the unevaluated sum's terms to print it, and asking it is_integer, evaluated every level
    twice over: 37 s for 17 levels. Its value decides; the printout keeps the order written."""
    tower = nest("\\frac{{1}}{{1+{}}}", 17, "1")
    check(boxed(tower), "1", WRONG)
    fib = [1, 1]
    while len(fib) < 20:
        fib.append(fib[-1] + fib[-2])
    result = check(boxed(tower), f"\\frac{{{fib[17]}}}{{{fib[18]}}}", OK)  # 1/(1+1/(1+...)) = F(n+1)/F(n+2)
    assert result["parsed_answer"].startswith("1/(1 + 1/(1 + ")


@pytest.mark.timeout(20)
@pytest.mark.parametrize(
    "answer",
    [
        nest("\\log({}+1)", 12, "2"),  # sympy's evalf re-evaluates a log's argument near 1: 32 s
        nest("\\sin({}+1)", 10, "2"),
        nest("\\tan(\\cos({}))", 4, "2"),
    ],
)
def test_functions_nested_past_the_limit_only_match_the_same_tree(answer: str) -> None:
    result = check(boxed(answer), "1", WRONG)
    assert "functions nested too deeply to evaluate" in result["message"]
    check(boxed(answer), answer, OK)


@pytest.mark.parametrize(
    ("answer", "truth"),
    [
        ("\\ln(\\ln(\\ln(e^{e^{e}})))", "1"),
        (nest("\\sqrt{{1+{}}}", 6, "x"), nest("\\sqrt{{1+{}}}", 6, "x")),  # roots are powers, not functions
        (nest("\\cos({})", 6, "0"), nest("\\cos({})", 5, "1")),  # six deep is still evaluated
    ],
)
def test_functions_nested_as_answers_are_still_compared(answer: str, truth: str) -> None:
    check(boxed(answer), truth, OK)


@pytest.mark.timeout(20)
@pytest.mark.parametrize(
    "answer",
    [
        # exp's sign, asked as sympy builds e^{x + 1}, needed ln 2 to 7e23 bits inside the parse: it never ended.
        nest("e^{{({}+1)}}", 5, "2"),
        nest("e^{{{}+1}}", 5, "3"),
        "\\cos(e^{e^{e^{e^{3}+1}+1}+1})",
    ],
)
def test_exponentials_past_any_evaluable_size_end_in_a_clean_status(answer: str) -> None:
    check(boxed(answer), "1", WRONG)


def test_no_alarm_signal_is_installed() -> None:
    import signal

    # pytest-timeout may have its own alarm armed: observe it, never cancel it.
    handler_before = signal.getsignal(signal.SIGALRM)
    armed_before = signal.getitimer(signal.ITIMER_REAL)[0] > 0
    mathv.verify(boxed("\\frac{1}{2}"), "0.5")
    mathv.verify(boxed("\\{1, 2\\}"), "\\{2, 1\\}")
    assert signal.getsignal(signal.SIGALRM) is handler_before
    assert (signal.getitimer(signal.ITIMER_REAL)[0] > 0) == armed_before


# --------------------------------------------------------------------------------------------
# Threads and event loops (Math-Verify's default SIGALRM timeouts fail outside the main thread)
# --------------------------------------------------------------------------------------------

THREAD_CASES = [
    (boxed("\\frac{1}{2}"), "0.5", OK),
    (boxed("\\{1,2\\}"), "\\{2,1\\}", OK),
    (boxed("x = 4"), "3", WRONG),
]


def test_works_in_a_non_main_thread() -> None:
    results: dict[int, list[str]] = {}
    errors: list[BaseException] = []

    def run(idx: int) -> None:
        try:
            results[idx] = [mathv.verify(c, g)["status"] for c, g, _ in THREAD_CASES]
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors
    expected = [e for _, _, e in THREAD_CASES]
    assert results == {i: expected for i in range(3)}


async def test_works_via_asyncio_to_thread() -> None:
    results = await asyncio.gather(*(asyncio.to_thread(mathv.verify, c, g) for c, g, _ in THREAD_CASES))
    assert [r["status"] for r in results] == [e for _, _, e in THREAD_CASES]


async def test_works_directly_inside_a_running_loop() -> None:
    asyncio.get_running_loop()
    for completion, gold, expected in THREAD_CASES:
        assert mathv.verify(completion, gold)["status"] == expected


def test_float_tolerance_does_not_leak_between_threads() -> None:
    out: dict[str, str] = {}

    def loose() -> None:
        out["loose"] = mathv.verify(boxed("100.5"), "100.0", float_tolerance=1e-2)["status"]

    t = threading.Thread(target=loose)
    t.start()
    t.join(timeout=60)
    out["strict"] = mathv.verify(boxed("100.5"), "100.0")["status"]
    assert out == {"loose": OK, "strict": WRONG}


def test_a_memory_error_reaches_the_caller_as_the_memory_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any other exception in the comparison costs the answer the point; running out of memory is
    the caller's limit (a math server answers it as STATUS_MEMORY_LIMIT and is replaced)."""
    def hungry(*_: object) -> dict[str, str]:
        raise MemoryError

    def broken(*_: object) -> dict[str, str]:
        raise ValueError("a parser bug")

    monkeypatch.setattr(judge, "_judge", hungry)
    with pytest.raises(MemoryError):
        mathv.verify("\\boxed{2}", "2")
    monkeypatch.setattr(judge, "_judge", broken)
    result = mathv.verify("\\boxed{2}", "2")
    assert result["status"] == "wrong_answer" and "ValueError" in result["message"]


@pytest.mark.parametrize(
    ("completion", "gold", "expected"),
    [
        # An escaped dollar sign in a math span (GSM8K-style money answers) was taken for the span's end: "\".
        ("The answer is $\\$120$.", "120", OK),
        ("Answer: $\\$120$", "120", OK),
        ("Final answer: $\\$18.90$", "\\$18.90", OK),
        ("The answer is $\\$120$.", "121", WRONG),
        ("It costs \\$5 and \\$6, so $11$ in all.", "11", OK),
        # "z = 3+4i": the parse made z real, so with i as the unit Eq(z, 3+4I) evaluated to False.
        (boxed("z = 3+4i"), "3+4i", OK),
        (boxed("3+4i"), "z=3+4i", OK),
        (boxed("z = 3+4i"), "3-4i", WRONG),
        (boxed("z = 3+4i"), "4+3i", WRONG),
        # An <answer> tag holding a sentence was read whole, as a product of letters.
        ("<answer>The answer is 42.</answer>", "42", OK),
        ("<answer>The total is 120 dollars</answer>", "120", OK),
        ("<answer>The total is 120 dollars</answer>", "12", WRONG),
        ("<answer>So x = 7</answer>", "7", OK),
        ("<answer>The answer is 2 or 3</answer>", "2", WRONG),
        ("<answer>Monday</answer>", "Monday", OK),
        ("<answer>Monday</answer>", "Tuesday", WRONG),
        # Style commands with no value, which latex2sympy could not parse; other spellings of symbols.
        (boxed("\\bf 42"), "42", OK),
        (boxed("\\large 42"), "42", OK),
        (boxed("\\bf 43"), "42", WRONG),
        (boxed("\\color{red}42"), "42", OK),
        (boxed("\\textcolor{red}{42}"), "42", OK),
        (boxed("\\underline{42}"), "42", OK),
        (boxed("\\boldsymbol{42}"), "42", OK),
        (boxed("\\boldsymbol{i} + 2\\boldsymbol{j}"), "\\mathbf{i} + 2\\mathbf{j}", OK),
        (boxed("\\textdollar 1000"), "1000", OK),
        (boxed("30\\degree"), "30^\\circ", OK),
        (boxed("\\mathrm{e}^2"), "e^2", OK),
        (boxed("\\mathrm{e}^2"), "e^3", WRONG),
        (boxed("0.\\bar{3}"), "\\frac13", OK),
        (boxed("0.1\\dot{6}"), "\\frac16", OK),
        (boxed("0.\\bar{3}"), "0.3", WRONG),
    ],
)
def test_dataset_formats_found_by_a_sweep(completion: str, gold: str, expected: str) -> None:
    """Fixed: correct answers scored wrong, from a sweep of 858 pairs in the formats of GSM8K, MATH, AIME, AMC and
    the R1-style <answer> tag."""
    check(completion, gold, expected)


@pytest.mark.parametrize(
    ("completion", "gold", "expected"),
    [
        (boxed("(4,3)"), "x=3, y=4", WRONG),  # was OK: compared as the set {3, 4}
        (boxed("(3,4)"), "x=3, y=4", OK),
        (boxed("(3,2,1)"), "x=1,y=2,z=3", WRONG),
        (boxed("(1,2,3)"), "x=1,y=2,z=3", OK),
        (boxed("(-1,2)"), "x=2, y=-1", WRONG),
        (boxed("(2,1)"), "k=2, b=1", OK),  # the order written, not the alphabet's (y = kx + b)
        (boxed("(1,2)"), "k=2, b=1", WRONG),
        (boxed("(2, 1)"), "\\alpha = 1, \\beta = 2", WRONG),
        (boxed("(1, 2)"), "x_{1} = 1, x_{2} = 2", OK),
        (boxed("(4,3)"), "x=3 \\text{ and } y=4", WRONG),
        (boxed("y=4, x=3"), "x=3, y=4", OK),  # equations are matched by name
        (boxed("x=4, y=3"), "x=3, y=4", WRONG),
        (boxed("4, 3"), "x=3, y=4", OK),  # a list without brackets is a set of values
    ],
)
def test_a_pair_against_named_unknowns_is_ordered(completion: str, gold: str, expected: str) -> None:
    """Fixed: "(4, 3)" against "x=3, y=4" was paid (Math-Verify compares the values as a set); a pair, triple...
    takes the unknowns in the order the ground truth names them."""
    check(completion, gold, expected)


@pytest.mark.timeout(20)
@pytest.mark.parametrize("answer", ["x^{50}+x=3", "x=(x+1)^{1000}", "(x^{2}+1)^{40} = x", "x^{25} - x = 1"])
def test_relations_of_too_high_a_degree_are_not_solved(answer: str) -> None:
    """The grader solved each (more than 20 s in sympy's solve) before it found their solutions differ."""
    check(boxed(answer), "x=3", WRONG)


@pytest.mark.parametrize(
    ("answer", "gold"),
    [
        ("2x+2y=6", "x+y=3"),
        ("x^2 y=4", "2x^2 y = 8"),
        ("x^{12}+y=4", "2x^{12}+2y = 8"),  # solved for y: the degree in x does not matter
    ],
)
def test_relations_matched_by_their_solutions_still_are(answer: str, gold: str) -> None:
    check(boxed(answer), gold, OK)


@pytest.mark.parametrize(
    ("answer", "gold"),
    [
        ("x^2=-4", "x^2=-1"),  # was paid: neither has a real solution, and two empty lists of them matched
        ("x^2+4 > 0", "x^2+1 < 0"),
        ("2x=6", "x=3"),  # nothing solved (refused before too: the grader fails on one unknown's solutions)
    ],
)
def test_relations_in_one_unknown_are_not_matched_by_solving(answer: str, gold: str) -> None:
    check(boxed(answer), gold, WRONG)


@pytest.mark.timeout(20)
@pytest.mark.parametrize(
    "answer",
    [
        # A red team's: the written tree hides the degree of the polynomial solve comes to. Each ran past 25 s.
        "e^{8x}+e^{x}=3",
        "2^{30x}+2^{x}=3",
        "\\cos(3x)=\\cos(x)+1",
        "x^{1/3}+x^{1/5}+x^{1/7}=3",
        "\\sqrt[3]{x}+\\sqrt[5]{x}+\\sqrt[7]{x}=3",
        "|x-1|+|x-2|+|x-3|+|x-4|+|x-5|+|x-6|=10",
    ],
)
def test_relations_that_are_not_rational_functions_are_not_solved(answer: str) -> None:
    check(boxed(answer), "x=3", WRONG)


@pytest.mark.timeout(20)
@pytest.mark.parametrize(
    ("answer", "gold"),
    [
        (powers(79), "\\{1,2\\}"),  # 16 s in sympy's set algebra
        (symbolic_intervals(12), "(0,1)"),  # more than 20 s
        # A red team's: 30 intervals with integer ends, each differing in one end (more than 25 s), 60 sums of roots.
        ("\\cup".join(f"({2 * k},{2 * k + 1}]" for k in reversed(range(1, 31))),
         "\\cup".join(f"[{2 * k},{2 * k + 1}]" for k in range(1, 31))),
        ("\\{" + ",".join(f"\\sqrt{{{k + 1}}}+\\sqrt{{{k}}}" for k in reversed(range(2, 62))) + "\\}",
         "\\{" + ",".join(f"\\sqrt{{{k}}}+\\sqrt{{{k + 1}}}" for k in range(1, 61)) + "\\}"),
        ("x_{" * 38 + "1" + "}" * 38, "3"),  # 7.9 s in the parser
    ],
)
def test_sets_with_many_unknown_items_and_deep_subscripts_are_refused_cheaply(answer: str, gold: str) -> None:
    check(boxed(answer), gold, WRONG)


def test_subscripts_past_four_deep_are_not_parsed() -> None:
    assert "nested too deeply" in check(boxed("x_{" * 5 + "1" + "}" * 5), "3", WRONG)["message"]
    check(boxed("x_{" * 4 + "1" + "}" * 4), "x_{" * 4 + "1" + "}" * 4, OK)


@pytest.mark.parametrize(
    ("answer", "gold"),
    [
        (powers(11), powers(11)),  # past the bound: the same set still matches
        ("\\{c, a, b\\}", "\\{a, b, c\\}"),
        ("(b, \\infty) \\cup (-\\infty, a)", "(-\\infty, a) \\cup (b, \\infty)"),
        ("a_{n_{k}} + 1", "1 + a_{n_{k}}"),
        ("x_{i_{j_{k_{1}}}}", "x_{i_{j_{k_{1}}}}"),  # four subscripts deep: the most parsed
    ],
)
def test_sets_and_subscripts_within_the_bounds_still_compare(answer: str, gold: str) -> None:
    check(boxed(answer), gold, OK)


@pytest.mark.timeout(20)
@pytest.mark.parametrize(
    "answer",
    [
        # A red team's: bars side by side fail SLL prediction, and full context then took 3.6-12 s.
        "|x|" * 22,
        "|x|" * 52,
        "|x|" * 20 + "+" + "+".join(["|x|"] * 50),
        "+".join(["|x|"] * 400),  # 6.9 s
    ],
)
def test_answers_of_many_bars_are_refused_before_parsing(answer: str) -> None:
    assert "absolute-value bars" in check(boxed(answer), "x", WRONG)["message"]


def test_absolute_values_within_the_bound_still_compare() -> None:
    check(boxed("|x-1|+|x-2|+|x-3|+|x-4|"), "|x-4|+|x-3|+|x-2|+|x-1|", OK)
    check(boxed("||x|-1|"), "||x|-1|", OK)


# --------------------------------------------------------------------------------------------
# The judge's rules
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("completion", "gold", "rule"),
    [
        (boxed("x" * 5_001), "3", "_too_long"),
        ("$1:00$", "$12:00$", "_clock_times"),
        ("The answer is 10 m/s or 11 m/s", "10", "_alternatives"),
        (boxed("2 \\text{ and 3}"), "2", "_number_inside_text"),
        (boxed("\\text{(C)}"), "C", "_choice_letters"),
        ("$odd$", "$\\text{odd}$", "_text_answers"),
        (boxed("{" * 8 + "1" + "}" * 8), "1", "_structure"),
        ("x \\equiv 2 \\ (\\bmod 5)", "2", "_left_to_evaluate"),
        (boxed("2 \\text{ m} 3 \\text{ m}"), "2", "_math_after_text"),
        (boxed("not it's not 10 it's 1 000"), "1000", "_numbers_side_by_side"),
        (boxed("1011_3"), "1011_2", "_other_base"),
        (boxed("2 \\text{ (in thousands)}"), "2", "_scale_word_in_text"),
        (boxed("2^+"), "2", "_dropped_mark"),
        ("$-[0,1)$", "$1$", "_parsed"),
        (boxed("\\cos(3^{300000})"), "0", "_unevaluable"),
        (boxed("\\frac{1}{2}"), "0.5", "_equivalent"),
    ],
)
def test_the_first_rule_with_a_verdict_decides(monkeypatch: pytest.MonkeyPatch, completion: str, gold: str,
                                               rule: str) -> None:
    """Each rule that can end the judging ends it for a case of its own: the order of judge.RULES is the behaviour."""
    decided: list[str] = []

    def recorded(judge_rule: Callable[[Any], dict[str, str] | None]) -> Callable[[Any], dict[str, str] | None]:
        def run(case: Any) -> dict[str, str] | None:
            verdict = judge_rule(case)
            if verdict is not None:
                decided.append(judge_rule.__name__)
            return verdict
        return run

    monkeypatch.setattr(judge, "RULES", tuple(recorded(judge_rule) for judge_rule in judge.RULES))
    mathv.verify(completion, gold)
    assert decided[-1] == rule  # last: the alternatives of an answer are judged first, each by the rules

