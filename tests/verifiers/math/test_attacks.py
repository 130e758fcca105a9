"""Red-team tests for the math verifier: answers an RL policy could learn that score 1.0 without being right.

Each case is a completion a policy could emit; the verdict must be what a careful grader gives. Cases
marked "fixed" failed before the fix next to them in sandboxd/verifiers/math/; the others are attacks
that were already defended and are pinned here so that they stay so.
"""

from __future__ import annotations

import pytest

pytest.importorskip("math_verify")

from sandboxd.verifiers import math as mathv
from sandboxd.verifiers.math import mathverify
from tests.verifiers.math.helpers import NONE, OK, WRONG, _warm, check  # noqa: F401 (_warm: an autouse fixture)


def boxed(s: str) -> str:
    return f"Let me think step by step... so the result is $\\boxed{{{s}}}$."


# --------------------------------------------------------------------------------------------
# Fixed: two percentages were compared crosswise (1% "equalled" 100%, since 100% is 1)
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("answer", "gold"),
    [
        ("1\\%", "100\\%"),
        ("100\\%", "1\\%"),
        ("0.5\\%", "50\\%"),
        ("50\\%", "5000\\%"),
        ("20\\%", "0.2\\%"),
        ("\\{1\\%, 2\\}", "\\{100\\%, 2\\}"),  # the same comparison inside a set
    ],
)
def test_a_percentage_is_not_a_hundred_times_another(answer: str, gold: str) -> None:
    check(boxed(answer), gold, WRONG)


@pytest.mark.parametrize(
    ("answer", "gold"),
    [
        ("50\\%", "50\\%"),
        ("50.0\\%", "50\\%"),
        ("\\frac{1}{2}\\%", "0.5\\%"),
        # One side a percentage: its value; a number against a percentage also as its count of percent (#51).
        ("50\\%", "0.5"),
        ("0.5", "50\\%"),
        ("50", "50\\%"),
        ("12.5", "12.5\\%"),
    ],
)
def test_percentages_still_match_their_value(answer: str, gold: str) -> None:
    check(boxed(answer), gold, OK)


# --------------------------------------------------------------------------------------------
# Fixed: a hedged list "2 or 5" became the decimal 2.5 (decimal comma after the list rewrite)
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("completion", "gold"),
    [
        (boxed("2 or 5"), "2.5"),
        (boxed("2 and 5"), "2.5"),
        (boxed("2, 5"), "2.5"),
        (boxed("2 \\text{ or } 5"), "2.5"),  # (already wrong before: Math-Verify's own list)
        ("The answer is 2 or 5", "2.5"),
        ("so x could be 2 or 5", "2.5"),
        (boxed("1.234 or 5"), "1234.5"),  # nor European thousands
        (boxed("1.234, 5"), "1234.5"),
    ],
)
def test_a_list_of_two_numbers_is_not_a_decimal(completion: str, gold: str) -> None:
    check(completion, gold, WRONG)


@pytest.mark.parametrize(
    ("answer", "gold"),
    [("2,5", "2.5"), ("1.234,5", "1234.5"), ("1 234,5", "1234.5"), ("2.5", "2.5"), ("1,234", "1234")],
)
def test_decimal_commas_still_read_as_decimals(answer: str, gold: str) -> None:
    check(boxed(answer), gold, OK)


def test_a_list_still_matches_a_list_gold() -> None:
    check(boxed("2 or 5"), "2, 5", OK)
    check(boxed("5, 2"), "\\{2, 5\\}", OK)


# --------------------------------------------------------------------------------------------
# Fixed: a float matched a large integer it does not equal, through the symbolic fallback
# (simplify(a - b) runs at the float's 53 bits, where 10^20 + 1 is 10^20)
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("answer", "gold"),
    [
        ("1.0 \\times 10^{20}", "100000000000000000001"),
        ("1.0e20", "100000000000000000001"),
        ("1.0 \\times 10^{20}", "10^{20}+1"),
        ("1.0 \\cdot 10^{20}", "10^{20}+1"),
        ("1.8446744073709552e19", "2^{64}+1"),  # (already wrong before: 17 digits are 57 bits)
        ("\\{1.0 \\times 10^{20}, 2\\}", "\\{10^{20}+1, 2\\}"),
    ],
)
def test_a_float_is_not_an_integer_it_rounds_to(answer: str, gold: str) -> None:
    check(boxed(answer), gold, WRONG)
    check(boxed(answer), gold, WRONG, float_tolerance=1e-3)  # absolute against an integer, whatever the tolerance


@pytest.mark.parametrize(
    ("answer", "gold", "tolerance"),
    [
        ("1.0 \\times 10^{20}", "10^{20}", 1e-6),  # the float holds this integer exactly
        ("10^{20}", "1.0 \\times 10^{20}", 1e-6),
        ("1e20", "100000000000000000000", 1e-6),
        ("0.1 \\times 10^{1}", "1", 0.0),  # equal at the float's precision: still Math-Verify's call
        ("\\frac{3}{10}", "0.3", 0.0),
        ("1.4142136", "\\sqrt{2}", 1e-6),
    ],
)
def test_floats_still_match_exact_values(answer: str, gold: str, tolerance: float) -> None:
    check(boxed(answer), gold, OK, float_tolerance=tolerance)


# --------------------------------------------------------------------------------------------
# Fixed: against an integer the absolute tolerance was looser than the relative one near 0, and
# applied to exact irrationals too (Math-Verify compares those exactly)
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("answer", "gold"),
    [
        ("0", "0.0000005"),  # the "0.0000001 vs 0.0000002" fix, for an answer of 0
        ("0", "0.000001"),
        ("0.0000005", "0"),
        ("\\frac{\\pi}{10^{7}}", "0"),
        ("2 + \\frac{\\pi}{10^{7}}", "2"),
        ("\\frac{\\sqrt{4000001}}{1000}", "2"),
        ("\\sqrt{10^{12}+1}", "1000000"),
    ],
)
def test_near_an_integer_is_not_the_integer(answer: str, gold: str) -> None:
    check(boxed(answer), gold, WRONG)


@pytest.mark.parametrize(
    ("answer", "gold"),
    [
        ("3.0000001", "3"),  # a decimal within the (absolute) tolerance of a count
        ("2.9999999", "3"),
        ("0.0", "0"),
        ("-0", "0"),
        ("0", "0.0"),
        ("\\log_{2} 8", "3"),  # exact values that equal the integer
        ("\\sqrt{2}\\sqrt{8}", "4"),
        ("\\sin(\\pi)", "0"),
        ("\\ln 1", "0"),
        ("\\frac{0.0000005}{0.0000005}", "1"),
        ("10^{20}\\sin^{2}(1) + 10^{20}\\cos^{2}(1)", "10^{20}"),
    ],
)
def test_values_at_an_integer_still_match_it(answer: str, gold: str) -> None:
    check(boxed(answer), gold, OK)


def test_huge_integers_compare_exactly() -> None:
    check(boxed("10^{20}+1"), "10^{20}", WRONG)
    check(boxed("10^{20}"), "10^{20}+1", WRONG)
    check(boxed("100000000000000000001"), "100000000000000000000", WRONG)
    check(boxed("99999999999999999999.9"), "100000000000000000000", WRONG)


# --------------------------------------------------------------------------------------------
# Fixed: a ground truth with several boxes was cut to its last box (a partial answer scored)
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "gold",
    [
        "\\boxed{2} and \\boxed{3}",
        "$\\boxed{2}$ and $\\boxed{3}$",
        "The solutions are $x = \\boxed{2}$ and $x = \\boxed{3}$.",
        "(a) \\boxed{2} (b) \\boxed{3}",
    ],
)
def test_every_box_of_a_ground_truth_is_in_the_answer(gold: str) -> None:
    check(boxed("3"), gold, WRONG)
    check(boxed("2"), gold, WRONG)
    check(boxed("2, 3"), gold, OK)
    check(boxed("\\{3, 2\\}"), gold, OK)
    check("The roots are 2 and 3.", gold, OK)


@pytest.mark.parametrize(
    "gold",
    ["\\boxed{5}", "So \\boxed{5}. Thus the answer is $\\boxed{5}$.", "\\boxed{\\boxed{5}}", "\\boxed{} \\boxed{5}"],
)
def test_a_repeated_nested_or_empty_box_of_a_ground_truth_is_one_answer(gold: str) -> None:
    check(boxed("5"), gold, OK)
    check(boxed("6"), gold, WRONG)


@pytest.mark.parametrize(
    "completion",
    [
        boxed("\\boxed{2} = 3"),  # fixed: the inner box was the answer (the chain's last side, 3, is)
        boxed("\\{1, \\boxed{2}\\}"),  # fixed
        boxed("\\boxed{2}\\boxed{3}"),
        boxed("3 \\text{ or } \\fbox{2}"),  # fixed
        "\\boxed{2} then \\boxed{3 \\text{ or } \\boxed{2}}",  # fixed
    ],
)
def test_a_box_inside_the_answer_box_is_not_the_answer(completion: str) -> None:
    check(completion, "2", WRONG)


@pytest.mark.parametrize(
    "completion",
    [
        boxed("\\boxed{2}"),
        boxed(" \\fbox{2} "),
        boxed("\\boxed 2"),
        boxed("x = \\boxed{2}"),
        boxed("3 = \\boxed{2}"),  # a chain's last side is its answer (#51)
    ],
)
def test_a_box_inside_the_answer_box_still_scores_as_its_content(completion: str) -> None:
    check(completion, "2", OK)


# --------------------------------------------------------------------------------------------
# Already defended: hedging with several answers at once
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("completion", "gold"),
    [
        # Several boxes: only the last one is the answer, so an earlier box earns nothing.
        ("\\boxed{1} \\boxed{2}", "1"),
        ("\\boxed{1}\n\nor maybe \\boxed{2}", "1"),
        # Lists, sets, ranges, intervals and relations that contain the true value.
        (boxed("1 \\text{ or } 2"), "2"),
        (boxed("1 or 2"), "1"),
        (boxed("x = 2 \\text{ or } x = 3"), "2"),
        (boxed("x = 2 or x = 3"), "3"),
        (boxed("1, 2, 3, \\ldots, 100"), "2"),
        (boxed("1, 2, 3, ..., 100"), "2"),
        (boxed("1,2,3,4,5,6,7,8,9,10"), "2"),
        (boxed("\\{1, 2, 3\\}"), "2"),
        (boxed("[0, 10]"), "2"),
        (boxed("(0, 10)"), "2"),
        (boxed("(-\\infty, \\infty)"), "2"),
        (boxed("\\mathbb{R}"), "2"),
        (boxed("x \\in \\mathbb{R}"), "2"),
        (boxed("\\pm 2"), "2"),
        (boxed("\\pm 2"), "-2"),
        (boxed("x \\le 10^9"), "2"),
        (boxed("x \\ge 0"), "2"),
        (boxed("0 < x < 10"), "2"),
        (boxed("x \\neq 3"), "2"),
        (boxed("x = 5, y = 6"), "5"),
        (boxed("2 ; 3"), "2"),
        (boxed("2 \\quad 3"), "2"),
        (boxed("2 \\\\ 3"), "2"),
        (boxed("2 & 3"), "2"),
        (boxed("\\{x : x > 0\\}"), "2"),
        (boxed("(2, 2)"), "2"),
        (boxed("\\text{2 or 3}"), "2"),
        (boxed("\\text{between 1 and 3}"), "2"),
        (boxed("\\text{anything but 2}"), "2"),
        (boxed("\\{1, 2\\}"), "\\{1, 2, 3\\}"),
        (boxed("\\{1, 2, 3, 4\\}"), "\\{1, 2, 3\\}"),
        (boxed("(0, \\infty)"), "x > 1"),
        (boxed("x > 1 \\text{ or } x < 5"), "x > 1"),
        (boxed("[1, 2]"), "(1, 2)"),
        (boxed("2 \\text{ or } 3"), "2"),
        ("The answer is 2 or 3.", "3"),
        ("The answer is 2. The answer is 3.", "2"),
        ("<answer>1</answer> <answer>2</answer>", "1"),
    ],
)
def test_hedged_answers_get_no_credit(completion: str, gold: str) -> None:
    check(completion, gold, WRONG)


@pytest.mark.parametrize(
    ("completion", "gold"),
    [
        ("\\boxed{A} or \\boxed{B}", "A"),  # last box only
        (boxed("\\text{A, B}"), "A"),
        (boxed("ABCD"), "A"),
        (boxed("A/B"), "A"),
        (boxed("\\text{(B) or (C)}"), "C"),  # the first letter is the choice, not any of them
    ],
)
def test_hedged_choice_letters_get_no_credit(completion: str, gold: str) -> None:
    check(completion, gold, WRONG)


# --------------------------------------------------------------------------------------------
# Already defended: hidden, invisible or look-alike answers
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("answer", "gold"),
    [
        ("\\phantom{2} 3", "2"),
        ("\\hphantom{2} 3", "2"),
        ("\\vphantom{2}3", "2"),
        ("\\color{white}{2} 3", "2"),
        ("{\\color{white}2} 3", "2"),
        ("\\textcolor{white}{2} 3", "2"),
        ("3\\label{2}", "2"),
        ("\\cancel{3} 2", "2"),
        ("\\overset{2}{3}", "2"),
        ("\\underbrace{3}_{2}", "2"),
        ("3_{2}", "2"),
        ("3 % 2", "2"),
        ("\\text{not } 2", "2"),
        ("\\text{not 2}", "2"),
        ("\\not 2", "2"),
        ("\\text{two}", "2"),
        # Unicode look-alikes that are not decimal digits: unparsable, not the value they mimic. (Decimal digits
        # of other scripts are digits, #51: test_decimal_digits_of_any_script_and_zero_width_spaces_are_read.)
        ("\u00b2", "2"),  # superscript 2
        ("\u2161", "2"),  # Roman numeral two
        ("1\u202e2", "21"),  # right-to-left override
        ("\u0445", "x"),  # Cyrillic x
        ("2\ufe0f\u20e3", "2"),  # keycap 2
    ],
)
def test_invisible_and_look_alike_answers_get_no_credit(answer: str, gold: str) -> None:
    check(boxed(answer), gold, WRONG)


def test_a_comment_does_not_hide_the_answer() -> None:
    # "%" is a percent sign to the parser, not a LaTeX comment that would hide the rest.
    check(boxed("3 % 2"), "3", WRONG)


# --------------------------------------------------------------------------------------------
# Already defended: tolerance tricks and special values
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("answer", "gold"),
    [
        ("0.99999", "1"),
        ("0.999...", "1"),
        ("0.999\\ldots", "1"),
        ("0.3333", "\\frac{1}{3}"),
        ("3.1416", "\\pi"),
        ("\\frac{22}{7}", "\\pi"),
        ("2.718", "e"),
        ("1.41421", "\\sqrt{2}"),
        ("1\\%", "100"),
        ("100", "1\\%"),
        ("50", "0.5"),
        ("0.5", "50"),
        ("20", "0.2\\%"),
        ("5\\times10^{6}", "5"),
        ("5 \\text{ m}", "500 \\text{ cm}"),
        ("500", "5 \\text{ m}"),
        ("5 \\cdot 10^{-7}", "0"),
        ("10^{-100}", "0"),
        ("\\frac{1}{10^{30}}", "0"),
        ("0.0000011", "0"),
        ("1e-7", "0"),
        ("1.0 \\times 10^{20}", "10^{20}+12345"),
    ],
)
def test_near_misses_are_wrong(answer: str, gold: str) -> None:
    check(boxed(answer), gold, WRONG)


@pytest.mark.parametrize(
    "answer",
    [
        "\\infty",
        "-\\infty",
        "inf",
        "nan",
        "NaN",
        "\\text{nan}",
        "zoo",
        "\\tilde{\\infty}",
        "\\frac{1}{0}",
        "\\frac{0}{0}",
        "\\infty - \\infty",
        "0 \\cdot \\infty",
        "\\frac{\\infty}{\\infty}",
        "\\log 0",
        "\\tan(\\pi/2)",
        "x",
        "n",
        "\\alpha",
        "f(x)",
        "\\emptyset",
        "\\{\\}",
        "\\text{undefined}",
        "\\text{any}",
        "\\text{all real numbers}",
        "\\mathbb{Z}",
        "\\sum_{k=1}^{n} 1",
    ],
)
def test_special_values_and_free_symbols_match_nothing_else(answer: str) -> None:
    check(boxed(answer), "2", WRONG)
    check(boxed(answer), "-7", WRONG)


def test_nan_does_not_match_nan() -> None:
    check(boxed("\\frac{0}{0}"), "\\frac{0}{0}", WRONG)


def test_symbols_must_be_the_same_symbols() -> None:
    check(boxed("x"), "x", OK)
    check(boxed("y"), "x", WRONG)
    check(boxed("x_1"), "x_2", WRONG)
    check(boxed("5x"), "5", WRONG)
    check(boxed("5"), "5x", WRONG)
    check(boxed("y = 5"), "x = 5", WRONG)
    check(boxed("x = y"), "5", WRONG)
    check(boxed("x = x"), "5", WRONG)


def test_matrices_are_not_scalars() -> None:
    check(boxed("\\begin{pmatrix} 2 \\end{pmatrix}"), "2", WRONG)
    check(boxed("\\begin{pmatrix} 1 & 0 \\\\ 0 & 1 \\end{pmatrix}"), "1", WRONG)
    check(boxed("I"), "\\begin{pmatrix} 1 & 0 \\\\ 0 & 1 \\end{pmatrix}", WRONG)


# --------------------------------------------------------------------------------------------
# Already defended: the ground-truth side
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("completion", "gold"),
    [
        (boxed("2"), "\\text{}"),
        (boxed("anything"), "\\text{}"),
        (boxed("2"), "\u2161"),  # Roman numeral two: unparsable
        (boxed("0"), "\\text{none}"),
        (boxed("1"), "1 \\text{ or } 2"),  # a list gold needs the whole list
        (boxed("\\text{no solution}"), "\\emptyset"),
        ("I don't know.", "\\boxed{}"),
    ],
)
def test_odd_ground_truths_do_not_reward_garbage(completion: str, gold: str) -> None:
    assert mathv.verify(completion, gold)["status"] in (WRONG, NONE)


def test_an_unparsable_ground_truth_needs_the_same_string() -> None:
    # Math-Verify's own fallback: an unparsable gold is compared as a string, exactly.
    check(boxed("\u2161"), "\u2161", OK)
    check(boxed("2"), "\u2161", WRONG)


# --------------------------------------------------------------------------------------------
# Fixed: the question restated as the answer. Math-Verify evaluates integrals, sums, products,
# limits, derivatives, max/min and gcd/lcm, so a box holding the computation that was asked for
# was paid as its result.
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("answer", "gold"),
    [
        ("\\int_0^1 x^2 \\, dx", "\\frac{1}{3}"),
        ("\\int_0^1 2\\,dx", "2"),
        ("\\iint_D 1 \\, dA", "2"),
        ("\\displaystyle\\sum\\limits_{k=1}^{4} k", "10"),
        ("\\sum_{k=1}^{n} k", "\\frac{n(n+1)}{2}"),
        ("\\prod_{k=1}^{4} k", "24"),
        ("\\lim_{x \\to 0} \\frac{\\sin x}{x}", "1"),
        ("\\frac{d}{dx}(x^2)", "2x"),
        ("\\frac{\\mathrm{d}}{\\mathrm{d}x} x^3", "3x^2"),
        ("\\max(3, 5)", "5"),
        ("\\gcd(12, 18)", "6"),
        ("\\operatorname{lcm}(4, 6)", "12"),
        ("\u2211_{k=1}^4 k", "10"),
        # Red team: spellings that slipped past (each scored 1.0 before).
        ("\\intx^{2}dx", "\\frac{x^3}{3}"),
        ("\\lcm(4,6)", "12"),
        ("\\tfrac{d}{dx}(x^2)", "2x"),
        ("\\cfrac{d}{dx}x^3", "3x^2"),
        ("\\frac{\\,d}{dx}x^3", "3x^2"),
        ("\\frac{d}{d\\theta}(\\theta^2)", "2\\theta"),
        ("\\frac{d(x^2)}{dx}", "2x"),
        ("\\frac{d x^{3}}{dx}", "3x^2"),
        ("2^{100} \\mod 7", "2"),
        ("\\det\\begin{pmatrix}1&2\\\\3&4\\end{pmatrix}", "-2"),
        ("\\begin{vmatrix}1&2\\\\3&4\\end{vmatrix}", "-2"),
        ("\\left\\lfloor\\sqrt{1000}\\right\\rfloor", "31"),
        ("\\ceil{\\log_2 1000}", "10"),
        ("\\operatorname{tr}\\begin{pmatrix}1&2\\\\3&4\\end{pmatrix}", "5"),
        ("\\operatorname{norm}\\begin{pmatrix}3\\\\4\\end{pmatrix}", "5"),
        ("\\sqrt{x^2}|_{x=3}", "3"),
    ],
)
def test_the_question_restated_is_not_its_answer(answer: str, gold: str) -> None:
    result = check(boxed(answer), gold, WRONG)
    assert "left to evaluate" in result["message"]


@pytest.mark.parametrize(
    ("answer", "gold"),
    [
        ("\\sum_{k=1}^{n} k", "\\sum_{k=1}^{n} k"),  # the ground truth is itself a sum
        ("\\min(a, b)", "\\min(a,b)"),
        ("\\binom{10}{3}", "120"),  # closed forms stay answers
        ("10!", "3628800"),
        ("\\frac{d}{d+1}", "\\frac{d}{d+1}"),  # a variable named d is no derivative
        ("\\frac{d-1}{d+1}", "\\frac{d-1}{d+1}"),
        ("\\lfloor n/2 \\rfloor", "\\lfloor n/2 \\rfloor"),  # the ground truth is itself a floor
        ("\\infty", "\\infty"),  # \\in..., not \\int
        ("x \\in [0, \\infty)", "[0,\\infty)"),
        ("5 \\text{ mins}", "5"),
    ],
)
def test_answers_near_the_restatement_rule_still_score(answer: str, gold: str) -> None:
    check(boxed(answer), gold, OK)


@pytest.mark.parametrize(
    ("answer", "gold"),
    [
        # Red team: each was read as one of its alternatives and scored 1.0.
        ("2 \\text{ or 3}", "2"),
        ("2 \\text{(or 3)}", "2"),
        ("B or C", "B"),
        ("B \\text{ or } C", "B"),
        ("x = 2 \\vee x = 3", "3"),
        ("x = 2 \\lor x = 3", "2"),
        ("2 \\text{ or more}", "2"),
    ],
)
def test_an_answer_offering_alternatives_to_one_value_is_wrong(answer: str, gold: str) -> None:
    result = check(boxed(answer), gold, WRONG)
    assert "offers alternatives" in result["message"]


@pytest.mark.parametrize(
    ("answer", "gold", "expected"),
    [
        # #51: a chain's last side is its answer, and its false links are working (Math-Verify's suite: "x = 5+5+1 =
        # 7 = 11" answers x = 11). They were refused; they are no hedge: no other side is ever compared.
        ("3 = 2", "2", OK),
        ("2 = 3", "3", OK),
        ("x = 2 = 3", "3", OK),
        ("x = 2 = 3", "x = 3", OK),
        ("x = 5+5+1 = 7 = 11", "x = 11", OK),
        ("z = 3+3 = 2", "z = 1 + 1 = 2", OK),
        ("\\frac{1}{2} = \\frac{10}{9}", "\\frac{10}{9}", OK),
        ("2 = 3", "2", WRONG),
        ("x = 2 = 3", "2", WRONG),
        ("x = 2 = 3", "x = 2", WRONG),
        ("x = 5+5+1 = 7 = 11", "7", WRONG),
        ("x = 5+5+1 = 7 = 11", "x = 7", WRONG),
        ("z = 3+3 = 2", "z = 6", WRONG),
    ],
)
def test_a_chain_of_equalities_answers_its_last_side_alone(answer: str, gold: str, expected: str) -> None:
    check(boxed(answer), gold, expected)


@pytest.mark.parametrize(
    ("answer", "gold"),
    [
        ("x = 2 \\text{ or } x = 3", "2, 3"),  # a list for a list
        ("2 \\text{ or } 3", "2 \\text{ or } 3"),
        ("x = -1 \\text{ or } x = 1", "\\pm 1"),
        ("2 + 3 = 5", "5"),  # a true equality shown as work
        ("x = 2", "2"),
        ("\\text{four}", "\\text{four}"),  # "or" inside a word
        ("\\text{color}", "\\text{color}"),
    ],
)
def test_answers_near_the_alternatives_rules_still_score(answer: str, gold: str) -> None:
    check(boxed(answer), gold, OK)


# --------------------------------------------------------------------------------------------
# Fixed: a false approximation, a denied expression and a questioned answer were paid
# --------------------------------------------------------------------------------------------


# #51: an approximation answers the side Math-Verify keeps (the left, or the right after a variable: "x = \frac13
# \approx 0.33" answers 1/3), whatever the other side says ("x = 1/3 \approx 1.3" in its suite). The other side is
# never the answer, so "2 \approx 3" is no hedge between 2 and 3; a false approximation was refused before.
APPROXIMATIONS = [
    ("2 \\approx 3", "2", "3"), ("x = 2 \\approx 3", "2", "3"), ("14 \\approx 15", "14", "15"),
    ("2.9 \\approx 3.1", "2.9", "3.1"), ("2 \\approx 3 \\approx 2", "2", "3"), ("\\pi \\approx 4", "\\pi", "4"),
    ("2 \u2248 3", "2", "3"), ("\\frac{2}{3} \\approx 0.5", "\\frac{2}{3}", "0.5"), ("2 \\approxeq 3", "2", "3"),
    ("2 \u2243 3", "2", "3"), ("2 \\;\\approx\\; 3", "2", "3"), ("(2) \\approx (3)", "2", "3"),
    ("x=1/3\\approx1.3", "1/3", "1.3"), ("x = 5+5+1 = 1/3 \\approx 11", "x = 1/3", "11"),
]


@pytest.mark.parametrize(("answer", "kept", "other"), APPROXIMATIONS)
def test_an_approximation_answers_one_side_alone(answer: str, kept: str, other: str) -> None:
    check(boxed(answer), kept, OK)
    check(boxed(answer), other, WRONG)


@pytest.mark.parametrize(
    ("answer", "gold"),
    [("\\pi \\approx 3.14", "\\pi"), ("\\frac{2}{3} \\approx 0.667", "\\frac{2}{3}"),
     ("\\frac{2}{3} \\approx 0.666", "\\frac{2}{3}"), ("-\\frac{2}{3} \\approx -0.66", "-\\frac{2}{3}"),
     ("1000\\pi \\approx 3100", "1000\\pi"), ("\\sqrt{2} \\approx 1.41", "\\sqrt{2}"), ("x \\approx 3", "3"),
     ("\\frac{22}{7} \\approx \\pi", "\\frac{22}{7}"), ("e^{2} \\approx 7.39", "e^2"), ("2.5 \\approx 3", "2.5"),
     ("2.5 \\approx 2", "2.5"), ("0 \\approx 0.4", "0"), ("\\frac{1}{3} \\approx 0.333", "\\frac{1}{3}"),
     # A unit, currency or thousands spacing on the number written out (red team: were wrong).
     ("12.25 \\approx 12.3 \\text{ m}", "12.25"), ("1111.111 \\approx 1\\,111", "1111.111"),
     ("12.499 \\approx \\$12.50", "12.499")],
)
def test_an_approximation_within_its_last_digit_still_scores(answer: str, gold: str) -> None:
    check(boxed(answer), gold, OK)


@pytest.mark.parametrize(
    ("completion", "gold", "expected"),
    [
        ("So it is not 2", "2", NONE),  # was OK: the last expression, denied
        ("The result isn't equal to 4", "4", NONE),
        ("x cannot be 7", "7", NONE),
        ("It is 3, not 2", "2", WRONG),  # the answer is 3
        ("It is 3, not 2", "3", OK),
        ("It is $3$, not $2$", "3", OK),
        ("It is $3$, not $2$", "2", WRONG),
        ("Not 4 but 5", "5", OK),
        ("We get 12 and nothing else", "12", OK),
        # Red team: other spellings of a denial were paid.
        ("It isn\u2019t 2", "2", NONE),
        ("It is 3, isn\u2019t 2", "2", WRONG),
        ("It is not **2**", "2", NONE),
        ("It is not `2`", "2", NONE),
        ('It is not "2"', "2", NONE),
        ("It is not\u20142", "2", NONE),
        ("It is not exactly 2", "2", NONE),
        ("It is 3, rather than 2", "2", WRONG),
        # A denied span no longer hides the answer written before it (it gave no answer).
        ("So x = 3, not $x = 2$.", "3", OK),
        ("The result is 3 (not $-3$).", "3", OK),
        ("So the area is 12, not $\\frac{25}{2}$.", "12", OK),
    ],
)
def test_a_denied_expression_is_not_the_last_expression(completion: str, gold: str, expected: str) -> None:
    check(completion, gold, expected)


@pytest.mark.parametrize(
    ("completion", "gold", "expected"),
    [
        ("The answer is 2? No wait, 3", "2", WRONG),  # was OK: the phrase's question, not its answer
        ("The answer is 2? No wait, 3", "3", OK),
        ("Answer: 2? No, 3.", "3", OK),
        ("Is the answer 5? Yes. The answer is 5.", "5", OK),
        # Red team: lower case after it, or another question mark.
        ("The answer is 2? no wait, 3", "2", WRONG),
        ("The answer is 2\uff1f No wait, 3", "2", WRONG),
        ("The answer is 2\u2753 No wait, 3", "2", WRONG),
        ("The final answer is 42 (why? Because 6 * 7 = 42)", "42", OK),  # a question later in the sentence
    ],
)
def test_an_answer_phrase_ending_in_a_question_is_not_the_answer(completion: str, gold: str, expected: str) -> None:
    check(completion, gold, expected)


def test_a_long_answer_is_refused_before_it_is_unwrapped() -> None:
    """20,000 nested \\text{} took 30 s of the math server before the length check refused them."""
    nested = "\\text{" * 20_000 + "2" + "}" * 20_000
    for completion in (boxed(nested), "The answer is " + nested):
        result = check(completion, "2", WRONG)
        assert "too long to parse" in result["message"], result


def test_a_chain_of_approximations_is_refused_before_it_is_evaluated() -> None:
    """Each side was evaluated to 30 digits: cos(3^600000) takes 1.5 s, and 12 of them took 44 s (red team)."""
    chain = " \\approx 0 \\approx ".join(f"\\cos(3^{{{600000 + i}}})" for i in range(12))
    result = check(boxed(chain), "0", WRONG)
    assert "too large to evaluate" in result["message"], result  # each side, now (below)
    # Its sides are no longer evaluated one by one (#51): a chain answers the side Math-Verify keeps, cheaply.
    chain = " \\approx ".join(f"\\cos({i})" for i in range(12))
    check(boxed(chain), "\\cos(11)", WRONG)


@pytest.mark.parametrize(
    ("answer", "gold"),
    [
        ("\\cos(3^{300000})", "0"),  # 2.5 s: pi to a million bits to reduce the argument (red team)
        ("\\cos(\\cos(3^{300000}))", "0"),
        ("\\sin(2^{500000})", "0"),  # 7.1 s
        ("\\sin(\\sin(\\sin(2^{900000})))", "0"),  # 46 s
        ("\\log(2^{990000})", "1"),  # 16 s
        ("\\sin(2^{900000}) = 0", "0"),
        ("\\cos(3^{600000}) \\approx 0", "0"),
    ],
)
def test_a_function_of_a_huge_number_is_not_evaluated(answer: str, gold: str) -> None:
    result = check(boxed(answer), gold, WRONG)
    assert "function of a number too large to evaluate" in result["message"], result


def test_a_function_of_a_huge_number_still_matches_itself() -> None:
    check(boxed("\\cos(3^{600000})"), "\\cos(3^{600000})", OK)
    check(boxed("\\sin(\\pi/6)"), "\\frac{1}{2}", OK)


@pytest.mark.timeout(20)  # the bound: without the fix each took 2.9 s in a sandbox (its memory limit), forever here
@pytest.mark.parametrize(
    "answer",
    [
        "2^{x\\cdot 10^{100000}}",  # powsimp: (2^{10^{100000}})^x
        "2^{x+10^{100000}}",  # expand: 2^x 2^{10^{100000}}
        "2^{(x+1)\\cdot 10^{100000}}",
        "\\frac{1}{2^{x\\cdot 10^{100000}}}",
        "2^{x\\cdot 10^{7}}",
    ],
)
def test_a_huge_number_in_a_symbolic_exponent_is_not_worked_out(answer: str) -> None:
    """Fixed. A power with a symbolic exponent counted as small, but simplify takes numbers out of the exponent
    and works out the power they make: the math server spent 2.9 s on the first and lost it to the memory limit."""
    result = check(boxed(answer), "3", WRONG)
    assert "number too large to evaluate" in result["message"], result


@pytest.mark.parametrize("gold", ["3", "\\frac{1}{2}", "7", "x+1"])
@pytest.mark.parametrize("answer", ["(1+i)^{10000}", "(1-i)^{10000}"])
def test_a_power_whose_imaginary_part_cancels_is_not_any_number(answer: str, gold: str) -> None:
    """Fixed (red team). (1+i)^{10000} is 2^{5000}; its 30-digit evaluation has an imaginary part with no
    precision, which left the decision to simplify, and sympy took 3 minus it for zero: it was paid against any
    number. The real part, which evaluation resolves, decides now."""
    check(boxed(answer), gold, WRONG)
    check(boxed("2^{5000}"), answer, OK)


@pytest.mark.timeout(20)  # the bound: each took simplify 7 s to more than 20 s before
@pytest.mark.parametrize(
    ("answer", "gold"),
    [
        ("(x+1)^{5000}", "x+1"),  # 18.9 s
        ("\\binom{x}{200}", "x+1"),  # > 20 s
        ("(a+b+c+d+e+f)^{20}", "x+1"),  # > 20 s
        ("(x+100)!", "x+1"),  # 7.7 s
        ("\\Gamma(x+200)", "x+1"),  # > 20 s
        ("\\sin((x+1)^{1000}^\\circ)", "3"),  # > 20 s
        ("\\frac{(x+1)^{300}}{(x-1)^{300}}", "x+1"),  # 9.8 s
        ("(1-\\sqrt{2})^{30000}", "0"),  # 8.7 s
        ("-(1-\\sqrt{2})^{100000}", "0"),  # > 20 s
    ],
)
def test_sides_apart_at_a_point_are_not_simplified(answer: str, gold: str) -> None:
    """Fixed (red team). Sides with unknowns are evaluated at one positive point before simplify (an identity holds
    wherever both sides are defined), and an exact value evaluation resolves is not 0, however small."""
    check(boxed(answer), gold, WRONG)


def test_an_identity_that_cancels_31_digits_at_the_point_still_holds() -> None:
    """The point is substituted by evalf, which raises its precision where a sum cancels: replaced by 30-digit
    floats first, (x+10)^{30} minus its expansion less 1 came out apart from 1, and the answer was refused."""
    import sympy

    x = sympy.Symbol("x")
    answer = "(x+10)^{30} - (" + sympy.latex(sympy.expand((x + 10) ** 30 - 1)) + ")"
    check(boxed(answer), "1", OK)
    check(boxed(answer), "2", WRONG)


@pytest.mark.timeout(20)
@pytest.mark.parametrize("answer", ["\\sqrt{10^{6000}+1}", "\\sqrt{20000!}", "\\sqrt[3]{3^{200000}+1}",
                                    "\\sqrt{10^{2500}+1}\\cdot\\sqrt{10^{2500}+3}"])
def test_a_root_of_a_huge_number_is_refused(answer: str) -> None:
    """Fixed (red team): sympy factors a root's radicand to take perfect powers out (> 20 s for 10^{6000}+1)."""
    result = check(boxed(answer), "3", WRONG)
    assert "number too large to evaluate" in result["message"], result


@pytest.mark.parametrize(
    ("answer", "gold"),
    [
        ("(x+1)^2", "x^2+2x+1"),
        ("\\frac{x^2-1}{x-1}", "x+1"),
        ("\\sin^2 x + \\cos^2 x", "1"),
        ("\\sqrt{12}", "2\\sqrt{3}"),
        ("\\sqrt{10^{500}}", "10^{250}"),
        ("\\cos\\frac{\\pi}{7}+\\cos\\frac{3\\pi}{7}+\\cos\\frac{5\\pi}{7}-\\frac12", "0"),
        ("e^{i\\pi}+1", "0"),
    ],
)
def test_identities_still_hold_after_the_point_and_root_checks(answer: str, gold: str) -> None:
    check(boxed(answer), gold, OK)


@pytest.mark.parametrize(
    ("answer", "gold"),
    [
        ("2^{3x}", "8^x"),
        ("4^{x+1}", "2^{2x+2}"),
        ("e^{-x^2/2}", "e^{-\\frac{x^2}{2}}"),
        ("e^{100000x}", "e^{100000x}"),
        ("2^{x+y+z+w+a+b+c+d+f+g+h+k+m+n+p+q+r+s+t+u+v}", "2^{x+y+z+w+a+b+c+d+f+g+h+k+m+n+p+q+r+s+t+u+v}"),
    ],
)
def test_symbolic_exponents_of_ordinary_size_still_compare(answer: str, gold: str) -> None:
    check(boxed(answer), gold, OK)


# --------------------------------------------------------------------------------------------
# Fixed (red team of b7d425f): an answer phrase's math span, text blocks and choice letters
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("completion", "gold", "expected"),
    [
        ("The final answer is not $2$; it is $3$.", "2", WRONG),  # the denied span was the answer
        ("The final answer is not $2$; it is $3$.", "3", OK),
        ("The answer is not $2$.", "2", NONE),
        ("The answer is $2$ or $3$.", "2", WRONG),  # the first span of a hedge was the answer
        ("Answer: $x = 2$ or $x = 3$", "2", WRONG),
        ("The answer is 2 (or possibly 3).", "2", WRONG),
        ("The answer is $2$ or $3$.", "2, 3", OK),  # a list where the gold is one
        ("The answer is $x = 5$ because $y = 3$.", "5", OK),
        ("The answer is $12$ apples.", "12", OK),
    ],
)
def test_an_answer_phrase_reads_a_denial_before_and_alternatives_after_its_math(
    completion: str, gold: str, expected: str
) -> None:
    check(completion, gold, expected)


@pytest.mark.parametrize(
    ("answer", "gold"),
    [
        ("2 \\text{ and 3}", "2"),  # Math-Verify drops everything from the text on: it read 2
        ("2 \\text{ (maybe 3)}", "2"),
        ("2, 3 \\text{ (or 4)}", "2, 3"),
        ("\\pm 2 \\text{ or 3}", "\\pm 2"),
        ("(1,2) \\text{ or (3,4)}", "(1,2)"),  # a point is one value: "or" offers two
        ("(1,2) or (3,4)", "(1,2)"),
        ("3 \\text{ m} = 2 \\text{ m}", "3"),  # a false equality, once its units are set aside
        ("10\\text{ cm} - 3\\text{ cm} = 7\\text{ cm}", "10"),  # the given, not the result
    ],
)
def test_text_does_not_hide_the_rest_of_an_answer(answer: str, gold: str) -> None:
    check(boxed(answer), gold, WRONG)


@pytest.mark.parametrize(
    ("answer", "gold"),
    [
        ("10\\text{ cm} - 3\\text{ cm} = 7\\text{ cm}", "7"),
        ("5 \\text{ m} \\times 4 \\text{ m} = 20 \\text{ m}^2", "20"),
        ("\\text{5 cm}", "5"),
        ("20 \\text{ cm}^2", "20"),
        ("x = 5 \\text{ m}", "5"),
        ("\\$40 \\text{ per week}", "40"),
        ("2 \\text{ or } 3", "2 \\text{ or } 3"),
        ("2 or 5", "2, 5"),
        ("[1, 3]", "[1,3]"),
    ],
)
def test_units_and_lists_in_text_still_score(answer: str, gold: str) -> None:
    check(boxed(answer), gold, OK)


@pytest.mark.parametrize(
    "answer",
    [
        "A \\text{ and } B",
        "A B",
        "(A)(B)",
        "A. B.",
        "A \\& B",
        "\\text{A and B are both correct}",
        "A \\text{ (also B)}",
    ],
)
def test_several_choice_letters_are_not_the_first_one(answer: str) -> None:
    check(boxed(answer), "A", WRONG)


@pytest.mark.parametrize(
    "answer", ["(B) 42", "\\text{(B)}", "B) the area is 42", "\\textbf{(B)}", "(B) F = ma", "(B) x = 2"]
)
def test_one_choice_letter_with_its_content_still_scores(answer: str) -> None:
    check(boxed(answer), "B", OK)


@pytest.mark.parametrize(("answer", "gold"), [("30 \\text{ min}", "30"), ("45\\,\\mathrm{min}", "45")])
def test_minutes_are_not_a_minimum_left_to_evaluate(answer: str, gold: str) -> None:
    check(boxed(answer), gold, OK)  # fixed: "\text{ min} is left to evaluate" (red team)


@pytest.mark.parametrize("answer", ["\\text{min}(3, 5)", "\\operatorname{min}\\{3, 5\\}", "\\mathrm{min}_{x} f"])
def test_a_minimum_in_text_with_its_arguments_is_still_left_to_evaluate(answer: str) -> None:
    result = check(boxed(answer), "3", WRONG)
    assert "left to evaluate" in result["message"], result


@pytest.mark.parametrize(
    ("answer", "gold"),
    [
        ("\\frac{dy}{dx} = 2x", "2x"),  # fixed: refused as a derivative left to evaluate (red team)
        ("\\frac{\\partial f}{\\partial x} = 2x", "2x"),  # fixed
        ("\\int_0^1 x^2 dx = \\frac{1}{3}", "\\frac13"),  # fixed
        ("\\sum_{k=1}^4 k = 10", "10"),  # fixed
    ],
)
def test_an_operator_left_of_the_answers_last_equals_sign_names_what_it_evaluates(answer: str, gold: str) -> None:
    check(boxed(answer), gold, OK)


@pytest.mark.parametrize(
    ("answer", "gold"),
    [
        ("\\sum_{k=1}^4 k", "10"),  # the "=" of its subscript is not the answer's
        ("x = \\int_0^1 x^2 dx", "\\frac13"),
        # The chain's last side is the answer (#51), not the operator's value.
        ("\\int_0^1 x^2 dx = \\frac{1}{2}", "\\frac13"),
        ("\\sum_{k=1}^{4} k = 11", "10"),
    ],
)
def test_an_operator_right_of_the_last_equals_sign_or_a_false_value_is_still_wrong(answer: str, gold: str) -> None:
    check(boxed(answer), gold, WRONG)


# --------------------------------------------------------------------------------------------
# Fixed (red team): other text macros, units, scale words, bases, spacing and percentages hid part of an answer
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("answer", "gold"),
    [
        # Math-Verify rewrites these macros to \text and drops everything from the first text on: each was paid as 2.
        ("2 \\mathrm{ (maybe 3)}", "2"),
        ("2 \\textbf{ (maybe 3)}", "2"),
        ("2 \\textnormal{ maybe 3}", "2"),
        ("2 \\mathbf{ maybe 3}", "2"),
        ("2 \\mathit{ maybe 3}", "2"),
        ("2 \\text{ maybe } 3 \\text{ m}", "2"),  # the number after the text, not in it
        ("2 \\text{(maybe} 3\\text{)}", "2"),
        ("2\\mathbf{i} + 3\\mathbf{j}", "2"),  # a vector read as its first coefficient
    ],
)
def test_text_in_any_macro_does_not_hide_the_rest_of_an_answer(answer: str, gold: str) -> None:
    check(boxed(answer), gold, WRONG)


@pytest.mark.parametrize(
    ("answer", "gold", "expected"),
    [
        ("\\textbf{5}", "5", OK),
        ("\\mathbf{5}", "5", OK),
        ("10 \\mathrm{~cm}", "10", OK),
        ("10 \\mathrm{cm^3}", "10", OK),  # a unit's power is not a number hidden in text
        ("10 \\textbf{ cm}", "10", OK),
        ("25 \\text{ cm}^2 \\text{ (approximately)}", "25", OK),
        ("\\text{Area} = 25", "25", OK),  # a label first: Math-Verify keeps it all
        ("2\\mathbf{i} + 3\\mathbf{j}", "2\\mathbf{i}+3\\mathbf{j}", OK),
        ("2\\mathbf{i} + 3\\mathbf{j}", "2\\mathbf{i}+5\\mathbf{j}", WRONG),  # fixed: both were read as 2
    ],
)
def test_text_macros_around_a_value_still_score(answer: str, gold: str, expected: str) -> None:
    check(boxed(answer), gold, expected)


@pytest.mark.parametrize(
    ("answer", "gold"),
    [
        ("2\\text{ cm}, 3\\text{ cm}", "2"),  # the first unit swallowed the rest: each was paid as 2
        ("2\\text{ m} - 7\\text{ m}", "2"),
        ("2\\text{ m} + 7\\text{ m}", "2"),
        ("2\\mathrm{~cm}, 3\\mathrm{~cm}", "2"),
        ("3 \\text{ hours } 20 \\text{ minutes}", "3"),
        ("2 \\text{ apples and } 3 \\text{ pears}", "2"),
        ("2 \\text{ m} 3 \\text{ m}", "2"),
    ],
)
def test_a_unit_does_not_hide_the_numbers_after_it(answer: str, gold: str) -> None:
    check(boxed(answer), gold, WRONG)


@pytest.mark.parametrize(
    ("answer", "gold"),
    [
        ("2\\text{ cm}, 3\\text{ cm}", "2, 3"),  # fixed: read as 2
        ("2\\text{ cm} \\times 3\\text{ cm}", "6"),  # fixed
        ("\\frac{10\\text{ m}}{2\\text{ s}}", "5"),  # fixed: unparsable
        ("1\\,000 \\text{ m}", "1000"),  # fixed: 1 + 000
        ("x = 1\\,000", "1000"),  # fixed
        ("10 \\, \\text{cm} - 3 \\, \\text{cm} = 7 \\, \\text{cm}", "7"),
        ("5 \\text{ m} \\times 4 \\text{ m} = 20 \\text{ m}^2", "20"),
        ("10\\;\\mathrm{m/s}", "10"),
        ("9.8 \\mathrm{~m/s^2}", "9.8"),
    ],
)
def test_several_numbers_with_units_still_score(answer: str, gold: str) -> None:
    check(boxed(answer), gold, OK)


@pytest.mark.parametrize(
    ("answer", "gold"),
    [
        ("3\\mathrm{~m} = 2\\mathrm{~m}", "3"),  # units in \mathrm hid the false equality
        ("3 \\textbf{ m} = 2 \\textbf{ m}", "3"),
        # Math-Verify reads "~=" as \approx and keeps its left side: the other side is not the answer (#51).
        ("2 ~= 3", "3"),
        ("x ~= 2 ~= 3", "3"),
    ],
)
def test_a_relation_between_units_or_spelled_oddly_is_judged(answer: str, gold: str) -> None:
    check(boxed(answer), gold, WRONG)


@pytest.mark.parametrize(("answer", "gold"), [("3\\mathrm{~m} = 3\\mathrm{~m}", "3"), ("x ~= 3", "3"),
                                              ("2 ~= 3", "2")])
def test_a_true_relation_between_units_or_spelled_oddly_still_scores(answer: str, gold: str) -> None:
    check(boxed(answer), gold, OK)


@pytest.mark.parametrize(
    ("completion", "gold", "expected"),
    [
        ("The answer is $2$ and $3$.", "2", WRONG),  # the phrase took the first span: paid as 2
        ("The answer is $2$, $3$.", "2", WRONG),
        ("The answer is $2$, and $3$.", "2", WRONG),
        ("The answer is $2$ $3$", "2", WRONG),
        ("The answer is $x = 2$ and $y = 3$.", "2", WRONG),
        ("The answer is $2$ and $3$.", "2, 3", OK),  # was wrong: read as 2
        ("The answer is $2$ and $3$.", "\\{2, 3\\}", OK),
        ("The answer is $12$ apples.", "12", OK),
        ("The answer is $x = 5$ because $y = 3$.", "5", OK),  # prose between: the first span
        ("The answer is $\\frac{1}{2}$, which is $0.5$.", "0.5", OK),
        # A span that only says the first again is not a second answer (they were read as the list "5, x = 5").
        ("The answer is $5$, $x = 5$.", "5", OK),
        ("The answer is $5$ and $5$.", "5", OK),
        ("The answer is $\\theta = \\frac{\\pi}{2}$, $\\frac{\\pi}{2}$.", "\\frac{\\pi}{2}", OK),
        ("The answer is $5$, $x = 6$.", "5", WRONG),
        ("The answer is $x = 5$, $y = 5$.", "5", WRONG),  # two unknowns: two answers
        ("The answer is $x = 5$, $y = 5$.", "x = 5, y = 5", OK),
        ("The answer is $a_1 = 5$, $5$.", "5", OK),
    ],
)
def test_an_answer_phrase_reads_every_span_of_a_list(completion: str, gold: str, expected: str) -> None:
    check(completion, gold, expected)


@pytest.mark.parametrize(
    ("answer", "gold", "expected"),
    [
        # A condition after the value is a domain, not more of the answer (refused: "math after text").
        ("x^2 \\text{ for } x>0", "x^2", OK),
        ("\\frac{1}{x} \\text{ where } x \\neq 0", "\\frac{1}{x}", OK),
        ("x^2 \\text{ for all } x \\in \\mathbb{R}", "x^2", OK),
        ("3 \\text{ when } n \\geq 2, n \\le 5", "3", OK),
        ("x^2", "x^2 \\text{ for } x > 0", OK),
        ("x^2 \\text{ for } x > 0", "x^2 + 1", WRONG),
        # Anything else after the text still hides a second answer, or says where to evaluate.
        ("5 \\text{ if } x < 0, 7", "5", WRONG),
        ("3 \\text{ when } n \\geq 2, 4", "3", WRONG),
        ("5 \\text{ for } x = 3", "5", WRONG),
        ("5 \\text{ if } x<0 \\text{ and } 7 \\text{ if } x \\ge 0", "5", WRONG),
        ("\\text{if } x > 2", "2", WRONG),
        ("7 \\text{ for } n > 2 \\quad 5", "7", WRONG),  # a value beside the bound (review)
        ("7 \\text{ for } n > 2; 5", "7", WRONG),
        ("7 \\text{ for } n > 2 \\\\ 5", "7", WRONG),
        ("7 \\text{ for } n > 2 5", "7", WRONG),
        # Two conditions are not both dropped unread (review: each was paid).
        ("x^2 \\text{ for } x < 0", "x^2 \\text{ for } x > 0", WRONG),
        ("5 \\text{ where } n > 2", "5 \\text{ where } n > 100", WRONG),
        ("x^2 \\text{ for } x > 0", "x^2 \\text{ for } x > 0", OK),
        ("\\ln(x) \\text{ for } 0 < x < 1", "\\ln x", OK),
        ("x \\text{ for } x > -\\frac{1}{2}", "x", OK),
    ],
)
def test_a_condition_after_the_value_is_not_part_of_it(answer: str, gold: str, expected: str) -> None:
    check(boxed(answer), gold, expected)


@pytest.mark.parametrize(
    ("completion", "gold", "expected"),
    [
        # Math-Verify dropped the word as a unit: each was paid as the bare number. It is read as its value.
        (boxed("2 \\text{ thousand}"), "2", WRONG),
        (boxed("2 \\text{ thousand}"), "2000", OK),
        (boxed("1.5 \\text{ million}"), "1.5", WRONG),
        (boxed("1.5 \\text{ million}"), "1500000", OK),
        (boxed("3 \\text{ billion}"), "3", WRONG),
        (boxed("3 \\text{ hundred}"), "3", WRONG),
        (boxed("3 \\text{ dozen}"), "3", WRONG),
        (boxed("3 \\text{ dozen}"), "36", OK),
        (boxed("3 \\text{ thousand dollars}"), "3", WRONG),
        (boxed("3 \\text{ thousand dollars}"), "3000", OK),
        (boxed("\\text{3 million}"), "3", WRONG),
        (boxed("3 \\mathrm{ million}"), "3", WRONG),
        (boxed("2 \\,\\text{thousand}"), "2", WRONG),
        (boxed("2 \\text{ hundred thousand}"), "200000", OK),
        (boxed("7 \\text{ squared}"), "7", WRONG),
        (boxed("7 \\text{ squared}"), "49", OK),
        (boxed("12 \\text{ cm squared}"), "12", OK),  # after a unit, its power
        (boxed("2\\text{ (in thousands)}"), "2", WRONG),  # a scale word later in the text: refused
        ("The answer is 3 million dollars.", "3", WRONG),
        ("The answer is 3 million dollars.", "3000000", OK),
        ("So the population is 3 million", "3", WRONG),
    ],
)
def test_a_word_that_scales_a_number_is_read_as_its_value(completion: str, gold: str, expected: str) -> None:
    check(completion, gold, expected)


@pytest.mark.parametrize(
    ("answer", "gold", "expected"),
    [
        ("1011_3", "1011_2", WRONG),  # Math-Verify drops the subscript: paid
        ("1011_{3}", "1011_{2}", WRONG),
        ("1011_{three}", "1011_2", WRONG),
        # A ground truth without a base (a dataset that left it out of a base-2 answer) takes the digits with any:
        # writing the base buys nothing over writing the digits alone, which are paid.
        ("11_2", "11", OK),
        ("1011_{2}", "1011", OK),
        ("1011_2", "1011_2", OK),
        ("1011_{2}", "1011_2", OK),
        ("1011", "1011_2", OK),  # the digits asked for, base left implicit
        ("11_{10}", "11", OK),
        ("\\log_2 8", "3", OK),  # a subscript that is not a numeral's base
    ],
)
def test_a_numeral_in_another_base_is_not_the_answer(answer: str, gold: str, expected: str) -> None:
    check(boxed(answer), gold, expected)


@pytest.mark.parametrize(
    ("answer", "gold"),
    [
        # latex2sympy adds numbers that stand side by side: each was paid as 5 (or 23).
        ("2 \\quad 3", "5"),
        ("2 \\qquad 3", "5"),
        ("2 3", "5"),
        ("2\\,3", "5"),
        ("2\\ 3", "5"),
        ("2\\;3", "5"),
        ("2\\thinspace 3", "5"),
        ("{2} {3}", "5"),
        ("2\\phantom{3}", "5"),  # invisible: it shows 2
        ("2\\text{ }3", "23"),
    ],
)
def test_numbers_side_by_side_are_not_a_sum(answer: str, gold: str) -> None:
    check(boxed(answer), gold, WRONG)


@pytest.mark.parametrize(
    ("answer", "gold"),
    [
        ("2\\phantom{3}", "2"),  # fixed: read as 5
        ("2\\hphantom{3}", "2"),  # fixed: unparsable
        ("\\phantom{2} 3", "3"),  # fixed: read as 5
        ("1\\,000", "1000"),
        ("1\\,234\\,567", "1234567"),
        ("3 \\frac{1}{2}", "3.5"),
        ("2 \\sqrt{3}", "2\\sqrt{3}"),
    ],
)
def test_invisible_and_spacing_around_one_number_still_score(answer: str, gold: str) -> None:
    check(boxed(answer), gold, OK)


@pytest.mark.parametrize(("answer", "gold"), [("300\\% = 2", "3"), ("50\\% = 2", "0.5"), ("2 = 300\\%", "2")])
def test_a_percentage_on_the_left_of_a_chain_is_not_its_answer(answer: str, gold: str) -> None:
    """The chain's last side is the answer (#51); a percentage before it is working."""
    check(boxed(answer), gold, WRONG)


@pytest.mark.parametrize(("answer", "gold"), [("300\\% = 3", "3"), ("50\\% = 0.5", "0.5"), ("3 = 300\\%", "3")])
def test_a_true_equality_with_a_percentage_still_scores(answer: str, gold: str) -> None:
    check(boxed(answer), gold, OK)


@pytest.mark.parametrize(
    ("completion", "gold", "expected"),
    [
        ("So the area is 12 cm^2", "12", OK),  # fixed: the last expression was "2"
        ("So the area is 12 cm^2.", "12", OK),
        ("So the area is 12 cm^2", "2", WRONG),  # fixed: paid
        ("So the speed is 10 m/s.", "10", OK),  # fixed: the last expression was "m/s"
        ("So the speed is 10 m/s^2", "10", OK),
        ("So the mass is 5 kg", "5", OK),
    ],
)
def test_a_unit_after_the_last_number_is_not_the_last_expression(completion: str, gold: str, expected: str) -> None:
    check(completion, gold, expected)


# --------------------------------------------------------------------------------------------
# Fixed: complex numbers, angles in degrees and exact zeros written the long way were refused; the answers near
# them stay wrong, and an upright i or a degree in radians was paid
# --------------------------------------------------------------------------------------------

_ZERO_7 = "\\cos\\frac{\\pi}{7}+\\cos\\frac{3\\pi}{7}+\\cos\\frac{5\\pi}{7}-\\frac{1}{2}"


def _pell_trace(k: int) -> int:
    """(1+\\sqrt2)^k + (1-\\sqrt2)^k, an integer: (1+\\sqrt2)^k minus it is -(\\sqrt2-1)^k, tiny but not 0."""
    previous, current = 2, 2
    for _ in range(k - 1):
        previous, current = current, 2 * current + previous
    return current


@pytest.mark.parametrize(
    ("answer", "gold"),
    [
        ("1+2\\mathrm{i}", "3"),  # fixed: the normaliser dropped the upright i as text, and with it the 2: paid
        ("2\\mathrm{i}", "2"),  # fixed: paid, the i read as a unit
        ("\\sin 15", "\\sin 15^\\circ"),  # fixed: paid, both were sin(15)
        ("\\sin 30", "\\frac{1}{2}"),
        ("1-i", "\\frac{2}{1-i}"),
        ("-i", "\\sqrt{-1}"),
        ("i", "-\\sqrt{-1}"),
        ("1", "e^{i\\pi}"),
        ("i^2", "1"),
        ("(1+i)^2", "2"),
        ("\\frac{\\sqrt6+\\sqrt2}{4}", "\\sin(15^\\circ)"),
        ("\\sin 15", "\\frac{\\sqrt6-\\sqrt2}{4}"),
        ("\\cos 15^\\circ", "\\sin(15^\\circ)"),
        ("\\frac{\\pi}{12}", "15^\\circ"),  # outside a trig function the degree sign is a unit
        ("i+1", "j+1"),  # beside another letter i is a symbol
        ("i = 3", "\\sqrt{-1}"),  # as is the unknown of a relation
        (_ZERO_7 + "+10^{-100}", "0"),
        (f"(1+\\sqrt{{2}})^{{40}} - {_pell_trace(40)}", "0"),
        (f"(1+\\sqrt{{2}})^{{400}} - {_pell_trace(400)}", "0"),
    ],
)
def test_near_misses_of_complex_numbers_angles_and_exact_zeros_are_wrong(answer: str, gold: str) -> None:
    check(boxed(answer), gold, WRONG)


@pytest.mark.parametrize(
    ("answer", "gold"),
    [
        ("1+2\\mathrm{i}", "1+2i"),
        ("\\sin 15^\\circ", "\\sin 15^\\circ"),
        ("\\cos 75^\\circ", "\\sin 15^\\circ"),
        (f"(1+\\sqrt{{2}})^{{40}} - {_pell_trace(40)}", "-(\\sqrt{2}-1)^{40}"),
        (_ZERO_7, "0"),
    ],
)
def test_complex_numbers_angles_and_exact_zeros_still_score(answer: str, gold: str) -> None:
    check(boxed(answer), gold, OK)


@pytest.mark.parametrize("k", [40, 400, 1000, 2000, 3000])
def test_a_tiny_difference_is_not_zero_at_any_precision_tried(k: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The precision rule alone, without the size bound: (1+\\sqrt2)^k - N_k is about 2^(-1.3 k), and its terms
    2^(1.3 k). Either 4000 bits resolve it (it stops shrinking at its value) or its error there is the size of
    terms past 2^2000, and not below 2^-2000."""
    monkeypatch.setattr(mathverify, "_ZERO_MAX_BITS", float("inf"))
    (tiny,) = mathverify._mv_parse(f"(1+\\sqrt{{2}})^{{{k}}} - {_pell_trace(k)}")
    (zero,) = mathverify._mv_parse("0")
    assert not mathverify._vanishes(tiny, zero)
    (exact,) = mathverify._mv_parse(_ZERO_7)
    assert mathverify._vanishes(exact, zero)


def test_a_tiny_term_added_to_a_zero_is_refused_by_its_size(monkeypatch: pytest.MonkeyPatch) -> None:
    """10^-2000 is below what 4000 bits resolve: only the size bound (its 6,600 bits) keeps it from being 0."""
    (hidden,) = mathverify._mv_parse(_ZERO_7 + "+10^{-2000}")
    (zero,) = mathverify._mv_parse("0")
    assert not mathverify._vanishes(hidden, zero)
    monkeypatch.setattr(mathverify, "_ZERO_MAX_BITS", float("inf"))
    assert mathverify._vanishes(hidden, zero)


# --------------------------------------------------------------------------------------------
# #51: real model outputs of Math-Verify's suite (several boxes, long reasoning, numbers), and answers paid or
# refused wrongly (a red team's second look). Each failed before the fix next to it in sandboxd/verifiers/math/.
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("completion", "gold", "expected"),
    [
        # A ground truth of k parts takes the boxes of the final answer (only the last box was read).
        ("$$\\boxed{(2, 2)} \\quad \\text{and} \\quad \\boxed{(6, 2)}$$", "(2, 2), (6, 2)", OK),
        ("\\boxed{1},\\boxed{2},\\boxed{3}", "\\{1,2,3\\}", OK),
        ("\\boxed{1} and \\boxed{2} and \\boxed{3}", "{1,2,3}", OK),
        ("$$\\boxed{k = 45} \\quad \\text{and} \\quad \\boxed{n = 2}$$", "k = 45, n = 2", OK),
        ("\\( y_1 = \\boxed{2x+1} \\) and \\( y_2 = \\boxed{3x} \\)", "y_1 = 2x + 1, y_2 = 3x", OK),
        ("The roots are $\\boxed{-2} \\quad \\text{and} \\quad \\boxed{1}$.", "1, -2", OK),
        ("(a) The first is \\boxed{2}. (b) Then the second is \\boxed{3}.", "2, 3", OK),  # a box per part, apart
        ("$\\boxed{3} \\text{ for part (a) and } \\boxed{1}$", "(3), (1)", OK),
        ("\\boxed{1} papers and \\boxed{2} bins", "1, 2", OK),
        # ... and read whole: a value more or one missing is wrong.
        ("\\boxed{1}, \\boxed{2}, \\boxed{3}", "2, 3", WRONG),
        ("\\boxed{1}, \\boxed{2}", "1, 2, 3", WRONG),
        ("\\boxed{(2, 2)} \\quad \\text{and} \\quad \\boxed{(6, 3)}", "(2, 2), (6, 2)", WRONG),
        # One value: the last group, so a model that corrects itself is read at its correction.
        ("First \\boxed{2}, but fixing the error, \\boxed{5}", "5", OK),
        ("First \\boxed{2}, but fixing the error, \\boxed{5}", "2", WRONG),
        ("\\boxed{1, 2}. Rechecking: \\boxed{1, 3}", "1, 3", OK),
        ("\\boxed{1, 2}. Rechecking: \\boxed{1, 3}", "1, 2", WRONG),
        # Boxes a list joins are one answer, not a choice of their last (it paid 2).
        ("\\boxed{3} and \\boxed{2}", "2", WRONG),
        ("\\boxed{3}, \\boxed{2}", "2", WRONG),
        ("\\boxed{3} or \\boxed{2}", "2", WRONG),
        ("\\boxed{3} \\boxed{2}", "2", WRONG),
        ("\\boxed{3} oder \\boxed{2}", "2", WRONG),
        ("\\boxed{3}, maybe \\boxed{2}", "2", WRONG),
    ],
)
def test_several_boxes_are_read_as_the_ground_truth_has_parts(completion: str, gold: str, expected: str) -> None:
    check(completion, gold, expected)


@pytest.mark.parametrize(
    ("gold", "answer", "expected"),
    [
        ("\\boxed{1} no no no \\boxed{2}", "2", OK),  # two answers, the later final: Math-Verify reads 2
        ("\\boxed{1} no no no \\boxed{2}", "1, 2", WRONG),  # it was "1, 2"
        ("$\\boxed{1}\\boxed{2}$", "1, 2", OK),
        ("\\boxed{2} and \\boxed{3}", "2, 3", OK),
        ("(a) \\boxed{2} (b) \\boxed{3}", "3", WRONG),
        ("So \\boxed{5}. Thus the answer is $\\boxed{5}$.", "5", OK),
    ],
)
def test_a_ground_truth_of_several_boxes_is_read_as_a_completion(gold: str, answer: str, expected: str) -> None:
    check(boxed(answer), gold, expected)


@pytest.mark.parametrize(
    ("completion", "gold", "expected"),
    [
        ("Final Answer: The largest $n$ is 34.", "34", OK),  # it read $n$
        ("Final Answer: The volume of $ABCDEFGH$ is 120. I hope it is correct.", "120", OK),
        ("Final Answer: The number of points in the domain of $f(x)$ is 19.", "19", OK),
        ("Final Answer: Jane started growing Sphere 3 hours ago. I hope it is correct.", "3", OK),
        ("Final Answer: The largest $n$ is 34.", "n", WRONG),
        ("The answer: the value of $x$ is not 2 but 3.", "3", OK),
        ("The answer: the value of $x$ is not 2 but 3.", "2", WRONG),
        # A final-answer phrase after the last box: the box was a step (it paid 255).
        ("So the interest is $\\boxed{255}$. In all $10,455. Final Answer: The final answer is $10,455$. I hope "
         "it is correct.", "10455", OK),
        ("So the interest is $\\boxed{255}$. In all $10,455. Final Answer: The final answer is $10,455$.", "255",
         WRONG),
        ("The final answer is 7, so \\boxed{8}", "8", OK),  # a box after the phrase still wins
    ],
)
def test_an_answer_sentence_gives_the_value_it_names(completion: str, gold: str, expected: str) -> None:
    check(completion, gold, expected)


@pytest.mark.parametrize(
    ("completion", "gold", "expected"),
    [
        ("1.22", "1,22", OK),  # a decimal comma in the gold
        ("0.111", "0,111", OK),
        ("1.22", "1,234", WRONG),
        ("1234", "1,234", OK),  # a thousands comma stays one
        ("AZYUK2A", "2", NONE),  # a code is not a number (it read 2)
        ("The part is COVID19 and H2O", "19", NONE),
        ("so 2x", "2x", OK),
        ("Answer $ \n 9 \n $", "9", NONE),  # inline math on one line only (it read 9)
        ("Answer \\( \n 9 \n \\)", "9", NONE),
        ("Answer $ \\frac{1}{2} \\$ = \\frac{10}{9} $", "10/9", OK),
        ("So it is $$\n9\n$$", "9", OK),  # display math may span lines
        ("The time is $12:00$", "12:00", OK),  # a time, not 12/0 (zoo, unequal to itself)
        ("The time is $1:00$", "12:00", WRONG),
    ],
)
def test_numbers_codes_times_and_delimiters_across_lines(completion: str, gold: str, expected: str) -> None:
    check(completion, gold, expected)


@pytest.mark.parametrize(
    ("answer", "gold", "expected"),
    [
        # A ground truth that is not a percentage: X% is X/100 alone (5% and 500% were both paid for 5).
        ("5\\%", "5", WRONG),
        ("500\\%", "5", OK),
        ("200\\%", "2", OK),
        ("2 \\text{ percent}", "2", WRONG),
        ("2 percent", "2", WRONG),
        ("50\\%", "50", WRONG),
        ("50\\%", "0.5", OK),
        ("50\\%", "\\frac{1}{2}", OK),
        ("50 \\text{ percent}", "0.5", OK),  # it was refused: the text was set aside as a unit
        ("0.5\\%", "0.5", WRONG),
        # A ground truth written as a percentage: a number may be its count of percent or its value.
        ("50", "50\\%", OK),
        ("0.5", "50\\%", OK),
        ("50 \\text{ percent}", "50\\%", OK),
        ("5", "50\\%", WRONG),
        ("0.05", "50\\%", WRONG),
    ],
)
def test_a_percentage_has_one_reading_chosen_by_the_ground_truth(answer: str, gold: str, expected: str) -> None:
    check(boxed(answer), gold, expected)


@pytest.mark.parametrize(
    "answer", ["2+", "2 +", "2-", "2^+", "2^{+}", "2^-", "2'", "2''", "2^\\prime", "2^{\\prime}", "2 \\cdot",
               "2 \\text{?}", "2?", "2\uff1f"],
)
def test_a_mark_the_parser_drops_is_not_paid(answer: str) -> None:
    result = check(boxed(answer), "2", WRONG)
    assert "a mark the parser would drop" in result["message"], result


@pytest.mark.parametrize(
    ("answer", "gold"),
    [("x \\to 0^+", "x \\to 0^+"), ("2^{-1}", "\\frac{1}{2}"), ("f'(x) = 2x", "2x"), ("-2", "-2"), ("3!", "6"),
     ("2", "2")],
)
def test_marks_the_ground_truth_has_or_that_carry_a_value_still_score(answer: str, gold: str) -> None:
    check(boxed(answer), gold, OK)


@pytest.mark.parametrize(
    ("answer", "gold"),
    [
        ("\uff13", "3"),  # fullwidth
        ("\u0663", "3"),  # Arabic-Indic
        ("\u0969", "3"),  # Devanagari
        ("\U0001d7d1", "3"),  # mathematical bold
        ("\uff11\uff12", "12"),
        ("1\u200b2", "12"),  # zero-width space inside a number
        ("1\u200b234", "1234"),
        ("\ufeff3", "3"),
        ("3", "\uff13"),  # in the ground truth too
    ],
)
def test_decimal_digits_of_any_script_and_zero_width_spaces_are_read(answer: str, gold: str) -> None:
    check(boxed(answer), gold, OK)
    check(f"The answer is {answer}.", gold, OK)


@pytest.mark.parametrize(
    ("answer", "gold"),
    [
        ("2 \\text{ or } 2", "2"),
        ("\\text{2 or 2}", "2"),
        ("x = 2 \\text{ or } x = 2", "2"),
        ("\\frac{4}{2} \\text{ or } 2", "2"),
        ("2 \\lor 2", "2"),
    ],
)
def test_alternatives_that_all_say_the_ground_truth_are_one_answer(answer: str, gold: str) -> None:
    check(boxed(answer), gold, OK)  # it was refused as offering alternatives


HEDGES_2_OR_3 = [
    # LaTeX
    "\\boxed{2 \\text{ or } 3}", "\\boxed{2 \\text{ or 3}}", "\\boxed{2 \\textrm{ or } 3}",
    "\\boxed{2 \\mathrm{~or~} 3}",
    "\\boxed{2 \\quad\\text{or}\\quad 3}", "\\boxed{2 \\vee 3}", "\\boxed{x = 2 \\lor x = 3}", "\\boxed{2 \u2228 3}",
    "\\boxed{2 \\text{ (or possibly 3)}}", "\\boxed{2 \\text{ and/or } 3}", "$\\boxed{2}$ or $\\boxed{3}$",
    # text
    "The answer is 2 or 3.", "The answer is either 2 or 3.", "The answer is 2, or maybe 3.", "Answer: 2 or 3",
    "so it is 2 or 3", "The answer is $2$ or $3$.", "<answer>2 or 3</answer>",
    # other languages
    "Die Antwort ist 2 oder 3.", "La réponse est 2 ou 3.", "La respuesta es 2 o 3.", "La risposta è 2 oppure 3.",
    "Ответ: 2 или 3", "答案是2或3", "答案是 2 或者 3", "答えは2または3", "정답은 2 또는 3", "Cevap 2 veya 3",
    "Jawabannya 2 atau 3", "Svaret er 2 eller 3", "Odpowiedź: 2 lub 3", "Đáp án là 2 hoặc 3",
    "\\boxed{2 \\text{ oder } 3}",
    "\\boxed{2 \\text{ или } 3}", "\\boxed{2 \\text{ 或 } 3}",
]


@pytest.mark.parametrize("completion", HEDGES_2_OR_3)
@pytest.mark.parametrize("gold", ["2", "3"])
def test_2_or_3_in_latex_text_and_other_languages_gets_no_credit(completion: str, gold: str) -> None:
    assert mathv.verify(completion, gold)["status"] in (WRONG, NONE)


@pytest.mark.parametrize("completion", ["Die Antwort ist 2 oder 3.", "答案是2或3", "\\boxed{2 \\text{ или } 3}",
                                        "The answer is 2 or 3."])
def test_2_or_3_in_any_language_still_answers_a_list(completion: str) -> None:
    check(completion, "2, 3", OK)


@pytest.mark.parametrize(("answer", "expected"), [("20\\%", OK), ("20", OK), ("0.2", OK), ("2\\%", WRONG)])
def test_a_percent_sign_after_the_ground_truths_box_makes_it_a_percentage(answer: str, expected: str) -> None:
    check(boxed(answer), "So $x = 1/5$, or $\\boxed{20}$ percent.", expected)  # "20\\%" was 0.2, not 20


@pytest.mark.parametrize(
    ("answer", "gold", "expected"),
    [("\\text{Tai Chi}", "Tai Chi", OK), ("Tai Chi", "Tai Chi", OK), ("\\text{Tai Chi}", "Judo", WRONG)],
)
def test_a_text_ground_truth_with_a_word_for_or_is_not_a_hedge(answer: str, gold: str, expected: str) -> None:
    check(boxed(answer), gold, expected)  # "tai" is Finnish for "or"
