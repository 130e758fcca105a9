"""Tests of the Math-Verify integration (sandboxd.verifiers.math.mathverify): the private grader and parser, and
the bounds on sympy's evaluation, solve and set algebra."""

from __future__ import annotations

import time
from math import inf

import pytest

pytest.importorskip("math_verify")

from sandboxd.verifiers.math import mathverify
from tests.verifiers.math.helpers import (  # noqa: F401 (_warm: an autouse fixture)
    OK,
    WRONG,
    _warm,
    boxed,
    check,
    nest,
    powers,
    symbolic_intervals,
)


def test_only_huge_binomials_and_gammas_are_left_unevaluated() -> None:
    """The guard patches sympy's evaluation in the math process: ordinary calls evaluate as before."""
    from sympy import Integer, Rational, binomial, gamma, pi, sqrt

    mathverify._load()
    assert binomial(Integer(10), Integer(3)) == 120
    assert binomial(Rational(1, 2), Integer(2)) == Rational(-1, 8)
    assert gamma(Rational(1, 2)) == sqrt(pi)
    assert gamma(Integer(5)) == 24
    assert isinstance(binomial(Integer(10**6), Integer(500000)), binomial)
    assert isinstance(gamma(Integer(10**6)), gamma)


@pytest.mark.parametrize(
    ("text", "depth"),
    [("x^2", 0), ("\\sin(\\log x)", 2), ("\\ln(\\ln(\\ln(x)))", 3), (nest("\\log({}+1)", 7, "2"), 7)],
)
def test_function_depth(text: str, depth: int) -> None:
    (parsed,) = mathverify._mv_parse(text)
    assert mathverify._function_depth(parsed) == depth


def test_constants_are_only_refused_past_the_cap() -> None:
    from mpmath.libmp import libelefun
    from sympy import E, cos, exp, pi

    mathverify._load()
    assert libelefun.ln2_fixed(1 << 12) > 0
    assert abs(float(cos(pi * 10**40 + 1).evalf(30)) - 0.5403023058681398) < 1e-12
    assert exp(10**6).evalf(30) > 0
    for fixed in (libelefun.ln2_fixed, libelefun.pi_fixed, libelefun.e_fixed):
        with pytest.raises(ValueError):
            fixed(mathverify._MAX_CONSTANT_BITS + 1)
    assert E.evalf(50) > 2


def test_simplify_only_decides_what_evaluation_cannot(monkeypatch: pytest.MonkeyPatch) -> None:
    """simplify(a - b) of numbers whose values differ was where nested sines spent 10 s (exptrigsimp)."""
    grader = mathverify._load()
    asked: list[object] = []
    simplify = grader.simplify

    def recording(expr: object, *args: object, **kwargs: object) -> object:
        asked.append(expr)
        return simplify(expr, *args, **kwargs)

    monkeypatch.setattr(grader, "simplify", recording)
    check(boxed(nest("\\sin({})", 6, "2")), "1", WRONG)
    check(boxed("2^{\\frac{1}{2}}"), "\\sqrt{3}", WRONG)
    assert asked == []
    # A zero written the long way cancels past evaluation's precision: evaluated again at fixed precisions, it is
    # 0 to each of them (_vanishes).
    check(boxed("\\sin^2(1)+\\cos^2(1)-1"), "0", OK)
    assert asked == []
    # One with numbers past _ZERO_MAX_BITS still goes to simplify.
    check(boxed("\\sin^2(10^{200})+\\cos^2(10^{200})-1"), "0", OK)
    assert len(asked) == 1
    # So does a float, which is only as exact as its bits: 0.3 is 3/10 to 53 of them.
    check(boxed("\\frac{3}{10}"), "0.3", OK, float_tolerance=0.0)
    assert len(asked) == 2


_ZERO = "(\\sin^2(1)+\\cos^2(1)-1)"


@pytest.mark.timeout(20)
@pytest.mark.parametrize(
    "zero",
    [
        # sympy's adaptive evalf, asked for 1000 digits, took 130 s on this one 7 deep.
        nest("({})\\cdot(" + _ZERO + "+1)+" + _ZERO, 14, _ZERO),
        nest("({}+" + _ZERO + ")^3", 2, _ZERO),
        nest("\\frac{{{}+" + _ZERO + "}}{{3}}", 14, _ZERO),
        nest("\\sin({}+" + _ZERO + ")", 5, _ZERO),
        nest("\\log(1+{}+" + _ZERO + ")", 5, _ZERO),
    ],
)
def test_exact_zeros_are_checked_in_bounded_time(zero: str) -> None:
    """Each operation is evaluated once per precision, however the sums that cancel nest (about 3 ms each here)."""
    (parsed,) = mathverify._mv_parse(zero)
    (nought,) = mathverify._mv_parse("0")
    start = time.perf_counter()
    assert mathverify._vanishes(parsed, nought)
    assert time.perf_counter() - start < 2


def _full_context_predictions(monkeypatch: pytest.MonkeyPatch, latex: str) -> tuple[str, int]:
    """What our converter makes of `latex`, and how many of its predictions fell back to ANTLR's full LL context."""
    from antlr4.atn.ParserATNSimulator import ParserATNSimulator

    calls = 0
    full_context = ParserATNSimulator.execATNWithFullContext

    def counted(*args: object) -> object:
        nonlocal calls
        calls += 1
        return full_context(*args)

    monkeypatch.setattr(ParserATNSimulator, "execATNWithFullContext", counted)
    mathverify._load()
    assert mathverify._parser is not None
    return str(mathverify._parser.latex2sympy(latex)), calls


def test_latex_is_parsed_with_sll_prediction_first(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nested bars are ambiguous for the grammar: full-context prediction was most of their parse (20 nested |x|: 2.5 s
    against 0.24 s). A parse that SLL prediction decides makes none."""
    parsed, full = _full_context_predictions(monkeypatch, "|x" * 10 + "|" * 10)
    assert parsed == "Abs(x*" * 9 + "Abs(x" + ")" * 10
    assert full == 0


@pytest.mark.parametrize(("latex", "parsed"), [("3x^2", "3*x**2"), ("(x^2)^3", "(x**2)**3"), ("2+b^2", "b**2 + 2")])
def test_latex_that_sll_cannot_decide_falls_back_to_full_context(
    monkeypatch: pytest.MonkeyPatch, latex: str, parsed: str
) -> None:
    got, full = _full_context_predictions(monkeypatch, latex)
    assert got == parsed
    assert full > 0


def test_a_syntax_error_still_fails_the_parse(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(Exception, match=r"expected|understand"):
        _full_context_predictions(monkeypatch, "3 + * )(")


@pytest.mark.parametrize(
    ("relation", "solved"),
    [
        ("2x+2y=6", True),
        ("x^{12}+y=4", True),  # of degree 1 in y
        ("\\frac{1}{x}+\\frac{1}{y}=1", True),
        ("x^{30}y^{30}+x^{29}y^{29}+xy=3", False),  # 6.9 s in sympy's solve
        ("e^{x}+y=3", False),  # not a rational function of x
        ("x^2=-4", False),  # one unknown
    ],
)
def test_only_relations_within_the_bounds_reach_solve(relation: str, solved: bool) -> None:
    reached: list[object] = []

    def solve(*args: object) -> list[object]:
        reached.append(args)
        return []

    (parsed,) = mathverify._mv_parse(relation)
    bounded = mathverify._bounded_solve(solve)
    if solved:
        bounded(parsed, parsed.free_symbols)
    else:
        with pytest.raises(ValueError, match="not solved"):
            bounded(parsed, parsed.free_symbols)
    assert bool(reached) is solved


@pytest.mark.parametrize(
    ("latex", "degrees"),
    [
        ("x", (1, 0)),
        ("3", (0, 0)),
        ("x^2 + y^7", (2, 0)),  # in x
        ("x^3 y^5 + x", (3, 0)),
        ("(x+1)^{1000}", (1000, 0)),
        ("(x^2+1)^{40}", (80, 0)),
        ("x^{-50}", (0, 50)),
        ("\\frac{1}{x-1}+\\frac{1}{x-2}+\\frac{1}{x-3}", (3, 3)),  # over a common denominator
        ("\\frac{x^2}{x+1}", (2, 1)),
        ("\\frac{y}{x}", (0, 1)),
        ("\\sqrt[3]{x}", (inf, inf)),
        ("2^{x}", (inf, inf)),
        ("\\sin(x^{2})", (inf, inf)),
        ("|x|", (inf, inf)),
        ("x^{y}", (inf, inf)),
        ("y^{1/2} + x", (1, 0)),  # a root of another unknown: a constant
    ],
)
def test_rational_degrees(latex: str, degrees: tuple[float, float]) -> None:
    from sympy import Symbol

    (parsed,) = mathverify._mv_parse(latex)
    assert mathverify._rational_degrees(parsed, Symbol("x", real=True)) == degrees


@pytest.mark.parametrize(
    ("gold", "pred", "algebra"),
    [
        (powers(11), "\\{1, 2\\}", False),
        ("\\{1, 2\\}", powers(11), False),
        (symbolic_intervals(7), "(0, 1)", False),
        (powers(10), "\\{1, 2\\}", True),
        (symbolic_intervals(6), "(0, 1)", True),
        ("\\{" + ",".join(map(str, range(100))) + "\\}", "\\{1, 2\\}", True),  # rational numbers: no bound
        ("\\{" + ",".join(f"\\sqrt{{{k}}}" for k in range(2, 13)) + "\\}", "\\{1, 2\\}", False),
        ("\\cup".join(f"({2 * k},{2 * k + 1}]" for k in range(7)), "(0, 1)", False),
        ("\\cup".join(f"({2 * k},{2 * k + 1}]" for k in range(6)), "(0, 1)", True),
    ],
)
def test_only_sets_within_the_bounds_reach_the_set_algebra(gold: str, pred: str, algebra: bool) -> None:
    reached: list[tuple[object, ...]] = []

    def set_algebra(*args: object) -> bool:
        reached.append(args)
        return False

    compare = mathverify._bounded_compare_sets(set_algebra)
    (g,), (p,) = mathverify._mv_parse(gold), mathverify._mv_parse(pred)
    assert compare(g, p, 6, 15) is False
    assert bool(reached) is algebra


@pytest.mark.parametrize(
    ("latex", "size"),
    [
        ("\\{1, 2, 3\\}", (0, 0)),
        ("\\{1, 0.5, \\frac{2}{3}\\}", (0, 0)),  # rational numbers: not counted
        ("\\{a, 2, 3\\}", (1, 0)),
        ("\\{\\sqrt{2}, -\\sqrt{2}, 1\\}", (2, 0)),
        ("(0, a)", (0, 1)),
        ("(-\\infty, a) \\cup (b, \\infty)", (0, 2)),
        ("(-\\infty, a) \\cup \\{b, c\\}", (2, 1)),
        ("(1, 2) \\cup (3, 4)", (0, 2)),
        ("a + b", (0, 0)),
    ],
)
def test_set_size(latex: str, size: tuple[int, int]) -> None:
    (parsed,) = mathverify._mv_parse(latex)
    assert mathverify._set_size(parsed) == size
