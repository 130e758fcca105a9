"""Math-Verify integration: private copies of its grader and parser whose comparisons are replaced (exact and
relative-tolerance numbers, bounded solve and set algebra, degrees in trig arguments), guards on sympy's eager
evaluation, and the parse and compare steps the judge calls."""

from __future__ import annotations

import contextvars
import importlib.util
import logging
import math as _pymath
import re
from types import ModuleType
from typing import Any

from .extraction import _assignment

#: Strings in the result dict are truncated to this many characters.
MAX_FIELD_CHARS = 1_000
# Two symbol-free values whose 30-digit evaluations differ by more than this (relative to the
# larger, or absolute below 1) are different; see _numerically_apart.
_APART_MARGIN = 1e-20
_APART_MIN_BITS = 80  # and each evaluated to at least this many bits (a 30-digit value has 103)
# Where sides with unknowns are compared (_numerically_apart): the i-th unknown, by name, takes the
# (i mod 5)-th value plus i // 5. Positive, and far from small rationals, so that no simple expression
# is 0 or a pole there by chance.
_SAMPLE_POINTS = ("0.6180339887498948482045868343656", "0.7071067811865475244008443621048",
                  "0.5772156649015328606065120900824", "0.8414709848078965066525023216303",
                  "0.4142135623730950488016887242097")
# An exact difference that evaluation cannot tell from 0 is evaluated again at these two fixed working
# precisions (bits): 0 to both, shrinking from one to the other, below half the higher one, is 0. See _vanishes.
_ZERO_WORKING_BITS = (1_000, 4_000)
# ... for sides of at most this many bits (_log2_bound: those of their numbers, added). A nonzero difference
# below 2^-2000 (10^-600) needs five times as many to be written: (1+\sqrt2)^k - N_k, N_k the nearest integer,
# is 2^(-1.3 k) from about 5 k bits, and a tiny term added to a zero (+ 10^{-2000}) has its own bits. It also
# bounds the work: at most a few hundred operations at 4000 bits, about a millisecond each.
_ZERO_MAX_BITS = 400
# The most bits of ln 2, pi or e that evaluation may compute (0.08 s for ln 2; 2^20 bits
# take 16 s). Only an argument past 2^65000 needs more; see _guard_constant_precision.
_MAX_CONSTANT_BITS = 1 << 16
# Upper bound (in bits) on the magnitude of any numeric sub-expression we let sympy evaluate.
_MAX_NUMBER_BITS = 1_000_000
# Nor the root (a power with a fractional exponent) of a number larger than this: see _log2_bound.
_MAX_ROOT_BITS = 2_000
# sympy works out a binomial or a Gamma of concrete numbers as soon as latex2sympy builds it,
# in pure-Python loops whose time grows with the square of the result's size (binom(10^5,
# 5*10^4), 10^5 bits: 0.56 s; binom(10^6, 5*10^5): over 20 s), where only the math
# server's kill reaches. Above these sizes the call is left unevaluated (see
# _guard_eager_evaluation), and _log2_bound then refuses it as too large.
_MAX_EAGER_RESULT_BITS = 50_000
_MAX_EAGER_TERMS = 20_000
_MAX_EAGER_GAMMA_ARG = 70_000  # Gamma(70000) has 1.06 million bits: over _MAX_NUMBER_BITS anyway
# The grader solves two relations that it could not match term by term and compares the solutions (2x + 2y = 6
# against x + y = 3). sympy's solve takes time that grows with the degree: x^{10}+x=3 0.18 s, x^{20}+x=3 1.1 s,
# x^{50}+x=3 more than 20 s; in two unknowns, x^{30}y^{30}+x^{29}y^{29}+xy=3 6.9 s. A relation is solved only in
# several unknowns, as a rational function of them of at most this degree in one of them (_bounded_solve).
_MAX_SOLVE_DEGREE = 10
# Sets cost sympy's set algebra about the square of their elements' count, unless they are rational numbers, and
# more for each interval: {x, x^2, ..., x^{30}} against {1, 2} takes 1.8 s and 79 elements 16 s; 60 sums of
# roots 10.5 s; 6 intervals with symbolic ends 0.12 s, 8 0.9 s, 10 4.5 s and 12 more than 20 s; 6 intervals with
# irrational ends that differ in one end each 0.59 s, 8 1.5 s; 10 with integer ends 0.93 s, 30 more than 25 s.
# Past these counts a set only matches the same set (_bounded_compare_sets).
_MAX_SET_ELEMENTS = 10
_MAX_SET_INTERVALS = 6

_float_tolerance: contextvars.ContextVar[float] = contextvars.ContextVar(
    "sandboxd_math_float_tolerance", default=1e-6
)
# Whether the ground truth being compared is written as a percentage: only then is a number in the answer read as a
# count of percent ("28" for 28%); otherwise X% is X/100 alone (see _numeric_eq).
_gold_is_percentage: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "sandboxd_math_gold_is_percentage", default=False
)

# Math-Verify logs a warning when its timeouts are disabled; that is deliberate here.
_PRIVATE_GRADER_NAME = "_sandboxd_math_verify_grader"
_PRIVATE_PARSER_NAME = "_sandboxd_math_verify_parser"
for _name in ("math_verify.parser", "math_verify.grader", _PRIVATE_GRADER_NAME, _PRIVATE_PARSER_NAME):
    logging.getLogger(_name).setLevel(logging.ERROR)


_grader: ModuleType | None = None
_parser: ModuleType | None = None
_latex_cfg: Any = None
_expr_cfg: Any = None
# The functions whose argument is an angle: a degree sign inside it is pi/180 (see _trig_degree_latex2sympy).
_TRIG_FUNCTIONS = frozenset(["sin", "cos", "tan", "cot", "sec", "csc"])


def _private_copy(shared: ModuleType, name: str, replaced: tuple[str, ...]) -> ModuleType:
    """A fresh instance of ``shared`` under ``name``, checked to still define the globals we replace."""
    spec = importlib.util.spec_from_file_location(name, shared.__file__)
    if spec is None or spec.loader is None:  # pragma: no cover - only on a broken install
        raise ImportError(f"cannot load {shared.__name__}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for attr in replaced:
        if not hasattr(module, attr):  # pragma: no cover - future Math-Verify
            raise ImportError(f"{shared.__name__}.{attr} not found; update sandboxd")
    return module


def _load() -> ModuleType:
    """Import Math-Verify and build our private copies of its grader and parser (once per process)."""
    global _grader, _parser, _latex_cfg, _expr_cfg
    if _grader is not None:
        return _grader
    import math_verify.grader as mv_grader
    import math_verify.parser as mv_parser

    # A private instance of math_verify.grader whose module-level numeric comparison is ours, and whose
    # solve and set comparison are bounded. The grader's recursive helpers (sets, tuples, intervals,
    # relations, matrices) look these functions up as module globals, so substituting them in *our* copy
    # fixes every structural case at once without monkeypatching the shared math_verify module for other users.
    module = _private_copy(mv_grader, _PRIVATE_GRADER_NAME,
                           ("sympy_numeric_eq", "sympy_symbolic_eq", "solve", "sympy_compare_sets"))
    module.sympy_numeric_eq = _numeric_eq  # type: ignore[attr-defined]
    module.sympy_symbolic_eq = _symbolic_eq_for(module.sympy_symbolic_eq)  # type: ignore[attr-defined]
    module.solve = _bounded_solve(module.solve)  # type: ignore[attr-defined]
    module.sympy_compare_sets = _bounded_compare_sets(module.sympy_compare_sets)  # type: ignore[attr-defined]
    # Likewise a private parser, whose LaTeX conversion reads degrees inside trig functions.
    parser = _private_copy(mv_parser, _PRIVATE_PARSER_NAME, ("latex2sympy", "parse"))
    parser.latex2sympy = _trig_degree_latex2sympy()  # type: ignore[attr-defined]
    # The parser tells its configurations apart by class: they must be its own classes.
    _latex_cfg = parser.LatexExtractionConfig(boxed_match_priority=0)
    _expr_cfg = parser.ExprExtractionConfig()
    _guard_eager_evaluation()
    _guard_constant_precision()
    _parser = parser
    _grader = module
    return module


def _trig_degree_latex2sympy() -> Any:
    """``latex2sympy``, but a degree sign inside the argument of a trig function is ``pi/180``.

    Math-Verify converts with ``convert_degrees=False``, so the degree sign is dropped as a unit
    wherever it stands: ``30^\\circ`` is 30 (kept: "the angle is 30" is answered by 30 degrees),
    and so would ``\\sin(15^\\circ)`` be ``sin(15)``, fifteen radians, which pays ``\\sin 15`` and refuses
    ``\\frac{\\sqrt6-\\sqrt2}{4}``. latex2sympy's own conversion (``convert_degrees``) is switched
    on while a trig function's argument is converted, so the grammar decides what the sign applies to.
    """
    from antlr4.atn.PredictionMode import PredictionMode
    from antlr4.error.Errors import ParseCancellationException
    from antlr4.error.ErrorStrategy import BailErrorStrategy
    from latex2sympy2_extended.latex2sympy2 import ConversionConfig, NormalizationConfig, _Latex2Sympy, normalize_latex
    from sympy import evaluate

    for method in ("convert_func", "convert_postfix", "create_parser", "parse"):
        if not callable(getattr(_Latex2Sympy, method, None)):  # pragma: no cover - future latex2sympy
            raise ImportError(f"latex2sympy2_extended's _Latex2Sympy.{method} not found; update sandboxd")

    class TrigDegrees(_Latex2Sympy):
        convert_degrees: bool
        # ANTLR's two-stage parsing: SLL prediction first, then full LL only where it fails. SLL ignores the
        # calling rule's context, and gives the tree LL would or fails (ANTLR's PredictionMode.SLL); the grammar's
        # ambiguous bars make LL's full-context prediction most of a parse: 20 nested |x| take 0.24 s in SLL
        # against 2.5 s, and real answers parse in about half the time, every tree the same (about 7% of them,
        # x^2 among them, need the fallback).
        full_context = False

        def create_parser(self, latex_str: str) -> Any:
            parser = super().create_parser(latex_str)
            if not self.full_context:
                parser._interp.predictionMode = PredictionMode.SLL
                # A failed prediction must reach the fallback: the listener's own exception would end the parse.
                parser.removeErrorListeners()
                parser._errHandler = BailErrorStrategy()
            return parser

        def parse(self, latex_str: str) -> Any:
            try:
                return super().parse(latex_str)
            except ParseCancellationException:
                self.full_context = True
                return super().parse(latex_str)

        def convert_func(self, func: Any) -> Any:
            single = func.func_normal_single_arg()
            if self.convert_degrees or single is None or single.start.text.lstrip("\\") not in _TRIG_FUNCTIONS:
                return super().convert_func(func)
            self.convert_degrees = True
            try:
                return super().convert_func(func)
            finally:
                self.convert_degrees = False

        def convert_postfix(self, postfix: Any) -> Any:
            if not (self.convert_degrees and any(op.degree() for op in postfix.postfix_op())):
                return super().convert_postfix(postfix)
            # Unevaluated, as latex2sympy builds the rest: multiplied out, 2^{900000} degrees became a
            # 900,000-bit fraction of pi, whose sign sympy asks (3.4 s) before the size bounds can see it.
            with evaluate(False):
                return super().convert_postfix(postfix)

    normalization_default, conversion_default = NormalizationConfig(), ConversionConfig()

    def latex2sympy(latex_str: str, variable_values: dict[Any, Any] | None = None, is_real: bool | None = None,
                    convert_degrees: bool = False, normalization_config: Any = normalization_default,
                    conversion_config: Any = conversion_default) -> Any:
        # latex2sympy2_extended.latex2sympy's body (its signature too), with the converter above.
        converter = TrigDegrees(variable_values, is_real, convert_degrees, config=conversion_config)
        if normalization_config is not None:
            latex_str = normalize_latex(latex_str, normalization_config)
        return converter.parse(latex_str)

    return latex2sympy


def _binomial_work_bits(n: Any, k: Any) -> float:
    """Upper bound of the bits sympy's binomial(n, k) loop builds (n and k numbers, k integral)."""
    k_bits = _safe_log2_bound(k)
    if k_bits > 40:
        return _pymath.inf  # int(k) alone could be 10^(10^10)
    k_int = int(k)
    if n.is_Integer and n >= 0:
        terms = min(k_int, int(n) - k_int)
        if terms <= 0:
            return 0.0
        # log2 binom(n, m) <= m log2(e n / m); n's bit length stands in for log2 n (n may be huge).
        return terms * max(1.0, int(n).bit_length() - _pymath.log2(terms) + 1.45)
    # Any other n (negative, a fraction, a float, an unevaluated power): |k| terms of n's size.
    terms = abs(k_int)
    if terms > _MAX_EAGER_TERMS:
        return _pymath.inf
    return terms * (max(1.0, _safe_log2_bound(n)) + _pymath.log2(terms + 1))


def _guard_eager_evaluation() -> None:
    """Leave huge binomials and Gammas of numbers unevaluated (see _MAX_EAGER_RESULT_BITS).

    Patches sympy's own evaluation, in this process, for those calls only: a check of the text
    before the parse missed `\\binom{(1000000)}{500000}`, `\\binom{-1}{200000}`,
    `\\binom{0.5}{10^6}` and `\\Gamma(\\frac{2000001}{2})`, each over 15 s, and refused the cheap
    `\\binom{10^6}{999999}`. Every other call evaluates as sympy would.
    """
    from sympy import binomial, gamma

    if getattr(binomial, "_sandboxd_guarded", False):
        return
    try:
        binomial_eval = binomial._eval.__func__
        gamma_eval = gamma.eval.__func__
    except AttributeError:  # pragma: no cover - a sympy other than the images' 1.14
        logging.getLogger("sandboxd.verifiers.math").warning(
            "sympy's binomial._eval or gamma.eval is not there: huge binomials and Gammas are evaluated as "
            "they are parsed (only the job's deadline stops them)")
        return

    def guarded_binomial_eval(cls: Any, n: Any, k: Any) -> Any:
        if _binomial_work_bits(n, k) > _MAX_EAGER_RESULT_BITS:
            return None  # sympy's "no value": the call stays binomial(n, k)
        return binomial_eval(cls, n, k)

    def guarded_gamma_eval(cls: Any, arg: Any) -> Any:
        if getattr(arg, "is_Rational", False) and abs(arg) > _MAX_EAGER_GAMMA_ARG:
            return None
        return gamma_eval(cls, arg)

    binomial._eval = classmethod(guarded_binomial_eval)
    gamma.eval = classmethod(guarded_gamma_eval)
    binomial._sandboxd_guarded = True


def _guard_constant_precision() -> None:
    """Refuse ln 2, pi and e past _MAX_CONSTANT_BITS, as mpmath's own "cannot evaluate" (ValueError).

    Reducing an argument for exp, sin or cos takes the constant to as many bits as the argument
    has before its point. sympy asks the sign of a number as it builds it, so
    ``e^{(e^{(e^{(e^{(e^{(2+1)}+1)}+1)}+1)}+1)}`` asks for ln 2 to 7e23 bits inside the parse,
    where no check of ours runs (killed by the deadline; ln 2 to 2^20 bits alone takes 16 s
    here). sympy reads the ValueError as "sign unknown" and builds the expression; evaluating it
    later fails the same way, and the comparison says no. The argument reductions of exp, log,
    cosh/sinh and cos/sin look these up as globals of ``libelefun`` at each call, which is what is
    patched, for this process; a constant asked for at a precision (``mpf_pi``, ``pi.evalf(n)``)
    and the Gamma and hypergeometric code keep the originals, bound at import.
    """
    from mpmath.libmp import libelefun

    if getattr(libelefun, "_sandboxd_guarded", False):
        return

    def capped(fixed: Any) -> Any:
        def guarded(prec: int, **kwargs: Any) -> Any:
            if prec > _MAX_CONSTANT_BITS:
                raise ValueError(f"{fixed.__name__} to {prec} bits: past {_MAX_CONSTANT_BITS}")
            return fixed(prec, **kwargs)

        guarded.__name__ = fixed.__name__
        return guarded

    for name in ("ln2_fixed", "pi_fixed", "e_fixed"):
        setattr(libelefun, name, capped(getattr(libelefun, name)))
    libelefun._sandboxd_guarded = True


def _pct_value(expr: Any) -> Any:
    """``x`` for latex2sympy's percentage form ``x * UnevaluatedExpr(1/100)``, else ``None``."""
    from sympy import Mul, Rational, UnevaluatedExpr

    if isinstance(expr, Mul) and len(expr.args) == 2 and expr.args[1] == UnevaluatedExpr(Rational(1, 100)):
        return expr.args[0]
    return None


def _doit(expr: Any) -> Any:
    try:
        return expr.doit()
    except Exception:
        return expr


def _close(x: Any, y: Any, numeric_precision: int) -> bool:
    """Numeric equality of two symbol-free scalars: exact, or within a *relative* tolerance."""
    from sympy import Float

    if x.free_symbols or y.free_symbols:
        return False  # left to Math-Verify's symbolic comparison
    inexact = x.has(Float) or y.has(Float)
    if not inexact and x.is_Rational and y.is_Rational:
        # Exact rationals compare exactly: this is the fix for 1/2004! == 1/2006! (#14).
        return bool(x == y)
    digits = max(numeric_precision, 15) + 15
    xv = x.evalf(digits)
    yv = y.evalf(digits)
    if not (xv.is_number and yv.is_number) or not (xv.is_finite and yv.is_finite):
        return False
    diff = abs(xv - yv)
    if diff == 0:
        return True
    scale = max(abs(xv), abs(yv))
    # Floats get the caller's tolerance; exact irrationals only need to agree to the precision.
    tol = _float_tolerance.get() if inexact else 10.0 ** (-numeric_precision)
    if inexact and (x.is_Integer or y.is_Integer):
        # Against an integer (a count, whichever side it is on) a decimal gets
        # the tolerance as an absolute one, as Math-Verify's round(6): a
        # relative one takes 1000001.0 for 1000000 and 1.844674e19 for a
        # 20-digit count. Never looser than the relative one, though: near 0
        # an absolute 1e-6 takes 0 for 0.0000005. (Exact irrationals keep the
        # precision: with the float tolerance, 2 + pi/10^7 would be 2.)
        scale = min(scale, 1)
    try:
        return bool(diff <= scale * tol * (1 + 1e-9))
    except TypeError:  # complex comparisons
        return False


def _numeric_eq(a: Any, b: Any, float_rounding: int, numeric_precision: int) -> bool:
    """Replacement for ``math_verify.grader.sympy_numeric_eq``.

    Math-Verify compares via ``(a - b).evalf(chop=True) == 0`` (chop turns every value below
    ~1e-15 into zero) and ``round(float_rounding)`` (an absolute tolerance). Here exact values are
    compared exactly and floats with a relative tolerance. A percentage ``X%`` is ``X/100``; only
    against a ground truth written as a percentage may a plain number also be its count of percent
    (``50`` and ``0.5`` both answer ``50%``; ``50%`` answers ``0.5``, not ``50``).
    """
    from sympy import MatrixBase, MatrixExpr

    del float_rounding  # superseded by the relative float tolerance
    if isinstance(a, (MatrixBase, MatrixExpr)) or isinstance(b, (MatrixBase, MatrixExpr)):
        a, b = _doit(a), _doit(b)
        if isinstance(a, MatrixBase) and isinstance(b, MatrixBase) and a.shape == b.shape:
            return all(
                _numeric_eq(x, y, 0, numeric_precision) for x, y in zip(a.flat(), b.flat(), strict=True)
            )
        return False
    try:
        pct_a, pct_b = _pct_value(a), _pct_value(b)
        if (pct_a is not None and pct_b is not None) or not _gold_is_percentage.get():
            # Two percentages compare by value only: the cross terms below would take 1% for
            # 100% (1 against 100% = 1) and 0.5% for 50%. Against a ground truth that is not a
            # percentage, X% is its value X/100 alone: read as X too, one answer covered two
            # ("5\\%" would be paid for 5 and for 0.05).
            return _close(_doit(a), _doit(b), numeric_precision)
        xs = [_doit(a)] + ([pct_a] if pct_a is not None else [])
        ys = [_doit(b)] + ([pct_b] if pct_b is not None else [])
        return any(_close(x, y, numeric_precision) for x in xs for y in ys)
    except Exception:
        return False


def _symbolic_eq_for(symbolic_eq: Any) -> Any:
    """Math-Verify's ``sympy_symbolic_eq``, but not for an integer that a float's precision rounds.

    The grader falls back to ``simplify(a - b) == 0`` when the numeric comparison says no, and
    that subtraction runs at the float's precision: ``1.0 \\times 10^{20}`` minus the integer
    ``10^{20}+1`` is 0 at 53 bits. Against an integer the tolerance is absolute (:func:`_close`);
    a zero that only comes from rounding the integer must not overrule it.
    """

    def eq(a: Any, b: Any) -> bool:
        if _numerically_apart(a, b):
            return False
        if _rounded_away(a, b) or _rounded_away(b, a):
            return False
        if _vanishes(a, b):
            return True
        return bool(symbolic_eq(a, b))

    return eq


def _bounded_solve(solve: Any) -> Any:
    """sympy's ``solve`` as the grader calls it, for rational functions of the unknowns only, and only where one
    unknown's degree is at most _MAX_SOLVE_DEGREE (solve takes the lowest: ``x^{50} + y = 4`` is
    ``y = 4 - x^{50}``, 0.09 s).

    Exponentials, trig functions, roots and absolute values of an unknown come down to polynomials of a degree
    that the written tree hides: solving ``e^{8x}+e^{x}=3``, ``\\cos(3x)=\\cos(x)+1``,
    ``x^{1/3}+x^{1/5}+x^{1/7}=3`` or six ``|x-k|`` summed runs past 25 s (against ``x=3``). The grader
    catches the refusal, as any failure to solve, and takes the relations for different.

    Nor is a relation in one unknown solved: sympy gives its solutions as a list of values, which the grader takes
    for a list of dicts, and fails on (an inequality's, a relational, it tries to iterate). So the solving would only
    ever match two relations without a real solution, equal or not: ``x^2=-4`` against ``x^2=-1`` would be paid.
    """

    def bounded(relation: Any, *args: Any, **kwargs: Any) -> Any:
        sides: tuple[Any, ...] = getattr(relation, "args", ())
        unknowns: set[Any] = getattr(relation, "free_symbols", set())
        if len(unknowns) == 1:
            raise ValueError("relation in one unknown not solved: the grader cannot compare its solutions")
        if unknowns and len(sides) == 2:
            degrees = [_rational_degrees(sides[0] - sides[1], x)[0] for x in unknowns]
            if min(degrees) > _MAX_SOLVE_DEGREE or _pymath.inf in degrees:
                raise ValueError("relation not solved: of too high a degree, or not a rational function")
        return solve(relation, *args, **kwargs)

    return bounded


def _rational_degrees(expr: Any, unknown: Any, depth: int = 0) -> tuple[float, float]:
    """Upper bounds of the degrees in ``unknown`` of the numerator and the denominator that ``expr``, a rational
    function of it, comes to over a common denominator, from the unexpanded tree; ``inf`` for anything else.

    ``(x+1)^{1000}`` is 1000 without multiplying it out, and the sum of twelve ``\\frac{1}{x-k}`` is 12 over 12
    (solving it set to 1 takes 0.84 s). Where the unknown sits in a function, an exponent or a root: ``inf``.
    """
    from sympy import Add, Integer, Mul, Pow

    if depth > 200:
        return _pymath.inf, _pymath.inf
    if not getattr(expr, "has", None) or not expr.has(unknown):
        return 0.0, 0.0
    args = expr.args
    if not args:
        return 1.0, 0.0  # the unknown itself
    if isinstance(expr, (Add, Mul)):
        parts = [_rational_degrees(arg, unknown, depth + 1) for arg in args]
        denominator = sum(d for _, d in parts)
        if isinstance(expr, Mul):
            return sum(n for n, _ in parts), denominator
        return max(n for n, _ in parts) + denominator, denominator  # each term times the others' denominators
    if isinstance(expr, Pow) and isinstance(expr.args[1], Integer):
        numerator, denominator = _rational_degrees(expr.args[0], unknown, depth + 1)
        power = int(expr.args[1])
        if power < 0:
            numerator, denominator = denominator, numerator
        return numerator * abs(power), denominator * abs(power)
    return _pymath.inf, _pymath.inf


def _bounded_compare_sets(compare_sets: Any) -> Any:
    """The grader's ``sympy_compare_sets``, but a set of more than _MAX_SET_ELEMENTS elements other than plain
    numbers, or of more than _MAX_SET_INTERVALS intervals, only matches the same set: sympy orders and merges such
    items by comparing them pairwise as it reduces the two sets' symmetric difference."""

    def compare(gold: Any, pred: Any, *args: Any, **kwargs: Any) -> bool:
        for elements, intervals in (_set_size(gold), _set_size(pred)):
            if elements > _MAX_SET_ELEMENTS or intervals > _MAX_SET_INTERVALS:
                return bool(gold == pred)
        return bool(compare_sets(gold, pred, *args, **kwargs))

    return compare


def _set_size(obj: Any) -> tuple[int, int]:
    """How many elements other than plain numbers (rationals, decimals), and how many intervals, a set holds."""
    from sympy import FiniteSet, Float, Interval, Rational, Set

    if not isinstance(obj, Set):
        return 0, 0
    if isinstance(obj, FiniteSet):
        return sum(not isinstance(e, (Rational, Float)) for e in obj.args), 0
    if isinstance(obj, Interval):
        return 0, 1
    sizes = [_set_size(arg) for arg in obj.args]  # a union, intersection, complement...
    return sum(e for e, _ in sizes), sum(i for _, i in sizes)


def _numerically_apart(a: Any, b: Any) -> bool:
    """Whether two scalars evaluate, to 30 digits, further apart than evaluation can err.

    The grader asks ``simplify(a - b)`` only after the numeric comparison said no. For numbers
    whose 30-digit values differ by more than 1e-20 of their size that cannot be a zero that
    evaluation missed, and simplify on them is where untrusted answers spend their time:
    ``\\sin`` of ``\\sin`` ... of 2, 8 deep, takes 10 s in ``exptrigsimp``. A difference within
    the margin (an exact zero written the long way, a float that rounds an integer) still goes on.

    Sides with symbols are evaluated at one fixed point (_SAMPLE_POINTS): an identity that
    simplify can prove holds wherever both sides are defined, so sides apart there are different.
    simplify spends 20 s and more on ``(x+1)^{5000}``, ``\\binom{x}{200}`` or ``(x+100)!`` against
    ``x+1``. The point is positive, where roots and logarithms take their real branches, so an
    identity that needs a positive unknown (``\\sqrt{x^2} = x``) is not refused here either.

    The real and imaginary parts are judged apart: one that evaluation resolves decides, whatever
    the other. ``(1+i)^{10000}`` is 2^5000, whose imaginary part comes back from evalf with no
    precision; left to simplify, sympy takes 3 minus it for zero and pays it against any number.
    """
    from sympy import Basic, Float, MatrixBase, im, re

    if not (isinstance(a, Basic) and isinstance(b, Basic)) or isinstance(a, MatrixBase) or isinstance(b, MatrixBase):
        return False
    try:
        x, y = _doit(a), _doit(b)
        symbols = sorted(x.free_symbols | y.free_symbols, key=str)
        # Substituted by evalf, which tracks the precision a sum that cancels there loses (replacing
        # the symbols by floats first would compute in plain 30-digit arithmetic and not know it).
        point = {symbol: Float(_SAMPLE_POINTS[i % len(_SAMPLE_POINTS)], 30) + i // len(_SAMPLE_POINTS)
                 for i, symbol in enumerate(symbols)}
        xv, yv = x.evalf(30, subs=point), y.evalf(30, subs=point)
        if not (xv.is_number and yv.is_number and xv.is_finite and yv.is_finite):
            return False
        # A float written in the answer is only as exact as its bits: 0.3 is 3/10 to 53 of them, and
        # the grader's simplify, which works at that precision, takes it for 3/10.
        written = [f._prec for f in x.atoms(Float) | y.atoms(Float)]
        margin = max(_APART_MARGIN, 2.0 ** (4 - min(written))) if written else _APART_MARGIN
        size = max(1, abs(xv), abs(yv))
        for part in (re, im):
            px, py = part(xv), part(yv)
            # evalf gives a value the precision it could vouch for: a sum that cancels past its
            # working precision comes back with fewer bits (0.e-165 with 1 bit), and decides nothing.
            if any(f._prec < _APART_MIN_BITS for f in px.atoms(Float) | py.atoms(Float)):
                continue
            if abs(px - py) > margin * size:
                return True
            if not written and (px == 0) != (py == 0):
                # An exact value that evalf resolves (all its bits) is not 0, however small:
                # (1-\\sqrt{2})^{30000} against 0 takes simplify 8.6 s (an unresolved 0 has no bits).
                return True
        return False
    except Exception:  # a comparison sympy cannot decide: leave it to the grader
        return False


def _vanishes(a: Any, b: Any) -> bool:
    """Whether two exact symbol-free scalars are equal to every working precision tried.

    An exact zero written the long way (``\\cos\\frac{\\pi}{7}+\\cos\\frac{3\\pi}{7}+\\cos\\frac{5\\pi}{7}
    -\\frac12``) evaluates to its rounding error (sympy's evalf(30): 0.e-165), too small for the
    relative comparison, and simplify cannot prove it. At a fixed working precision W the difference of
    two equal values is that error, about 2^-W of their size, so it keeps shrinking as W grows (that
    one: 3e-301 at 1000 bits, 9e-1205 at 4000); a difference that is not 0 stops at its value once W
    resolves it: ``(1+\\sqrt2)^{400} - N``, N the nearest integer, is -1.0e-146 at 1000 bits (the
    error of its 509-bit terms) and -7.76e-154, its value, at 4000. The sides are equal when the
    difference at 4000 bits is below 2^-2000 of their size and has shrunk by at least half the
    precision gained since 1000 bits. Only sides of at most _ZERO_MAX_BITS are tried (see there), and
    each operation is evaluated once per precision: sympy's adaptive evalf raises the precision of
    every sum that cancels, and again inside it, and takes 130 s to 1000 digits on a product of sums of
    zeros nested 7 deep (0.003 s this way).
    """
    import mpmath
    from sympy import Basic, Float, MatrixBase

    if not (isinstance(a, Basic) and isinstance(b, Basic)) or isinstance(a, MatrixBase) or isinstance(b, MatrixBase):
        return False
    try:
        # The sides as parsed, not doit(): rebuilding them asks sympy their signs, by the adaptive evalf
        # this check avoids (0.5 s on sines of sums of zeros nested 6 deep, 0.004 s without).
        if a.free_symbols or b.free_symbols or a.has(Float) or b.has(Float):
            return False  # a float is only as exact as its bits: the tolerance decides
        if _safe_log2_bound(a) + _safe_log2_bound(b) > _ZERO_MAX_BITS:
            return False
        ctx = mpmath.MPContext()  # a context of our own: mpmath.mp's precision is shared by the process
        values = []
        for bits in _ZERO_WORKING_BITS:
            ctx.prec = bits
            memo: dict[Any, Any] = {}
            vx, vy = _fixed_precision_value(a, ctx, memo), _fixed_precision_value(b, ctx, memo)
            if vx is None or vy is None:
                return False
            values.append((vx, vy, vx - vy))
        (low_x, low_y, low), (high_x, high_y, high) = values
        low_bits, high_bits = _ZERO_WORKING_BITS
        # The size the difference is measured against: a side that evaluation resolves (its two values agree).
        scale = 0.0
        for lo, hi in ((low_x, high_x), (low_y, high_y)):
            if hi and abs(hi - lo) <= abs(hi) * 2.0 ** (-low_bits // 2):
                scale = max(scale, float(ctx.log(abs(hi), 2)))

        if not high:
            return True  # equal to the last of 4000 bits
        # log2 of the difference; one that cancelled exactly at the lower precision was at most its error there.
        low_size = float(ctx.log(abs(low), 2)) if low else scale - low_bits
        high_size = float(ctx.log(abs(high), 2))
        return high_size <= low_size - (high_bits - low_bits) / 2 and high_size <= scale - high_bits / 2
    except Exception:  # 1/0, a domain error, an input mpmath refuses: not decided here
        return False


# sympy's functions that mpmath evaluates with the same principal branches, by class name.
_MPMATH_FUNCTIONS = frozenset(
    ["exp", "sin", "cos", "tan", "cot", "sec", "csc", "asin", "acos", "atan", "sinh", "cosh", "tanh", "asinh",
     "acosh", "atanh"]
)
_MPMATH_CONSTANTS = {"Pi": "pi", "Exp1": "e", "EulerGamma": "euler", "GoldenRatio": "phi", "Catalan": "catalan"}


def _fixed_precision_value(expr: Any, ctx: Any, memo: dict[Any, Any]) -> Any:
    """The value of an exact expression in ``ctx`` at its precision, each operation rounded once; ``None``
    for what it does not know (an unevaluated sum, a special function)."""
    from sympy import Abs, Add, Mul, Pow, Rational, UnevaluatedExpr, log

    if expr in memo:
        return memo[expr]
    name = type(expr).__name__
    args = [] if isinstance(expr, Rational) else [_fixed_precision_value(arg, ctx, memo) for arg in expr.args]
    value: Any = None
    if any(arg is None for arg in args):
        pass
    elif isinstance(expr, Rational):
        value = ctx.mpf(int(expr.p)) / int(expr.q)
    elif name in _MPMATH_CONSTANTS:
        value = +getattr(ctx, _MPMATH_CONSTANTS[name])
    elif name == "ImaginaryUnit":
        value = ctx.mpc(0, 1)
    elif isinstance(expr, Add):
        value = ctx.fsum(args)
    elif isinstance(expr, Mul):
        value = ctx.fprod(args)
    elif isinstance(expr, Pow):
        exponent = expr.exp
        value = ctx.power(args[0], int(exponent) if exponent.is_Integer else args[1])
    elif isinstance(expr, log):
        value = ctx.log(*args)
    elif isinstance(expr, Abs):
        value = abs(args[0])
    elif isinstance(expr, UnevaluatedExpr):
        value = args[0]
    elif name in _MPMATH_FUNCTIONS and len(args) == 1:
        value = getattr(ctx, name)(args[0])
    memo[expr] = value
    return value


def _rounded_away(exact: Any, inexact: Any) -> bool:
    """Whether ``exact`` is an integer that the precision of the floats in ``inexact`` cannot hold."""
    from sympy import Basic, Float

    if not (isinstance(exact, Basic) and isinstance(inexact, Basic)):
        return False
    floats = inexact.atoms(Float)
    if not floats or exact.free_symbols or inexact.free_symbols or exact.has(Float):
        return False
    # Evaluated first: asking an unevaluated tower of fractions is_integer takes 4 s at depth 13.
    n = _doit(exact)
    return bool(n.is_Integer and Float(n, precision=min(f._prec for f in floats)) != n)


def _log2_bound(expr: Any, depth: int = 0) -> float:
    """Cheap upper bound of log2|value| for the numeric parts of ``expr``; ``inf`` if huge.

    Walks the unevaluated tree so that ``9^{9^{9^9}}`` or ``(10^6)!`` is refused before any
    sympy routine tries to evaluate it. Functions that grow like a factorial (``\\Gamma``,
    ``n!!``) or exponentially in their first argument (``\\binom``, ``\\exp``, ``\\cosh``) are
    bounded from that argument: sympy would work ``\\binom{10^9}{5 \\cdot 10^8}`` or
    ``\\Gamma(10^{12})`` out as exact integers, in loops no deadline short of a kill reaches.
    """
    from sympy import Float, Pow, Rational, binomial

    if depth > 200:
        return _pymath.inf
    if isinstance(expr, Rational):
        # log2 of numerator / denominator, not their bit lengths: a one-bit overestimate per
        # level compounds through a tower (2^{2^{2^2}} = 65536 would be refused as too large).
        p, q = abs(int(expr.p)), int(expr.q)
        return max(_pymath.log2(p) if p > 1 else 0.0, _pymath.log2(q) if q > 1 else 0.0)
    if isinstance(expr, Float):
        mpf = expr._mpf_
        return float(abs(mpf[2] + mpf[3])) if mpf[1] else 1.0
    args = getattr(expr, "args", ())
    if not isinstance(args, tuple):
        return 1.0
    if isinstance(expr, Pow):
        base_bits = _log2_bound(expr.args[0], depth + 1)
        exp = expr.args[1]
        exp_bits = _log2_bound(exp, depth + 1)
        if exp.free_symbols and not expr.args[0].free_symbols:
            # 2^x has no value to blow up, but simplify takes numbers out of its exponent:
            # powsimp made 2^{10^{100000} x} (2^{10^{100000}})^x and worked that power out
            # (2.9 s in a sandbox, until the memory limit's MemoryError).
            split_bits = _exponent_split_bits(exp, depth + 1)
            if split_bits > 64:
                return _pymath.inf
            return max(base_bits * (2.0**split_bits) + 1.0, exp_bits)
        if exp_bits > 64:
            return _pymath.inf
        if base_bits > _MAX_ROOT_BITS and isinstance(exp, Rational) and not exp.is_integer:
            # A root of a number is small, but sympy factors the number to take perfect powers out
            # of it: \sqrt{10^{6000}+1} ran its primality tests for more than 20 s.
            return _pymath.inf
        return base_bits * (2.0**exp_bits) + 1.0  # |b^e| <= 2^(log2|b| * |e|); +1 for rounding
    growth = _GROWTH.get(type(expr).__name__) if args else None
    if growth == "factorial":
        n_bits = _log2_bound(expr.args[0], depth + 1)
        if n_bits > 40:
            return _pymath.inf
        n = 2.0**n_bits
        return n * n_bits
    if growth == "exponential":
        n_bits = _log2_bound(expr.args[0], depth + 1)
        if n_bits > 40:
            return _pymath.inf
        bound = 2.0 * 2.0**n_bits + 1.0  # binomial(n, k) <= 2^n, catalan(n) <= 4^n, e^x < 2^(1.45 x)
        if isinstance(expr, binomial):
            # One left unevaluated (_guard_eager_evaluation) may have a negative or fractional n,
            # whose exact value's numerator and denominator grow with k: binom(1/2, 10^6).
            k_bits = _log2_bound(expr.args[1], depth + 1)
            if k_bits > 40:
                return _pymath.inf
            bound = max(bound, 2.0**k_bits * (n_bits + k_bits + 2.0))
        return bound
    total = 1.0
    for arg in args:
        if hasattr(arg, "args"):
            total += _log2_bound(arg, depth + 1)
            if total > _MAX_NUMBER_BITS:
                return _pymath.inf
    return total


def _exponent_split_bits(exp: Any, depth: int) -> float:
    """Bound of log2 of the number that simplification can take out of a symbolic exponent.

    A factor of a product (``10^{6} x``, which powsimp takes out: ``(b^{10^6})^x``) or a term of
    a sum (``x + 10^6``, which expand takes out: ``b^x b^{10^6}``); products of sums multiply
    out. Symbols and what functions or powers of symbols hold stay in the exponent.
    """
    from sympy import Add, Mul

    if depth > 200:
        return _pymath.inf
    if not exp.free_symbols:
        return _log2_bound(exp, depth + 1)
    if isinstance(exp, Add):
        return max(_exponent_split_bits(term, depth + 1) for term in exp.args)
    if isinstance(exp, Mul):
        return sum(_exponent_split_bits(factor, depth + 1) for factor in exp.args)
    return 0.0


# sympy functions by how their value grows with their first argument n: like n! (log2 about
# n log2 n) or like c^n with c <= 4 (log2 at most 2n). Rising and falling factorials grow with
# their second argument too, and are bounded as factorials of the first, which undercounts
# only when the second is larger than it is.
_GROWTH = {
    **dict.fromkeys(("factorial", "factorial2", "subfactorial", "gamma", "bell", "RisingFactorial",
                     "FallingFactorial", "multigamma", "primorial"), "factorial"),
    **dict.fromkeys(("binomial", "catalan", "fibonacci", "lucas", "tribonacci", "exp", "sinh", "cosh",
                     "partition", "motzkin"), "exponential"),
}


def _safe_log2_bound(obj: Any) -> float:
    try:
        return _log2_bound(obj)
    except RecursionError:
        return _pymath.inf


def _too_big(obj: Any) -> bool:
    return _safe_log2_bound(obj) > _MAX_NUMBER_BITS


def _function_depth(obj: Any) -> int:
    """How deeply function applications nest in a parsed answer: 2 for ``\\sin(\\log x)``, 0 for ``x^2``."""
    from sympy import Basic, Function

    if not isinstance(obj, Basic):
        return 0
    deepest = 0
    stack: list[tuple[Any, int]] = [(obj, 0)]
    while stack:
        node, depth = stack.pop()
        depth += isinstance(node, Function)
        deepest = max(deepest, depth)
        stack.extend((arg, depth) for arg in node.args if isinstance(arg, Basic))
    return deepest


# Digits, operators and currency only: text that Math-Verify's plain-expression extractor reads
# whole rather than picking a fragment of.
_PLAIN_ARITHMETIC_RE = re.compile(r"[\d\s.,+\-*/^()%$\u20ac\u00a3\u00a5\u00d7\u00f7]+")


def _mv_parse(s: str) -> list[Any]:
    """Parse with Math-Verify: LaTeX first (as a box, the way final answers are written), then
    plain-text expressions. Returns only successfully parsed sympy objects."""
    _load()
    assert _parser is not None
    parse = _parser.parse
    try:
        parsed = parse(
            "\\boxed{" + s + "}",
            [_latex_cfg],
            fallback_mode="no_fallback",
            parsing_timeout=None,  # the agent kills the worker at the deadline; no SIGALRM
        )
    except Exception:
        parsed = []
    if not parsed and _PLAIN_ARITHMETIC_RE.fullmatch(s) and any(c.isdigit() for c in s):
        # Math-Verify's plain-expression extractor searches the text for a number or a
        # digits-and-operators run; on anything else ("2 sqrt(3)", "x^2+15 \\oops{", "2√3") it
        # would pick a fragment ("2", "15") and turn an unparsable answer into a false match.
        try:
            parsed = parse(s, [_expr_cfg], fallback_mode="no_fallback", parsing_timeout=None)
        except Exception:
            parsed = []
    return [p for p in parsed if not isinstance(p, str)]


def _with_imaginary_unit(gold_objs: list[Any], pred_objs: list[Any]) -> tuple[list[Any], list[Any]]:
    """Both sides with the letter ``i`` as the imaginary unit when it is the only letter either uses.

    latex2sympy reads ``i`` as a symbol (only ``I`` is the unit) and Math-Verify leaves it so, only
    marking its symbols complex when the text shows an ``i`` on its own (``3+4 i``, not ``3+4i``). So
    ``i`` is not ``\\sqrt{-1}`` there, ``1+i`` not ``\\frac{2}{1-i}``, ``e^{i\\pi}`` not ``-1``, and ``3+4 i``
    not even ``3+4i``. An answer whose only letter is ``i`` is a complex number; beside another letter
    (``a_i + i``, ``i + j``) it may be an index, and it stays a symbol, as it does in a relation
    (``i = 3`` names an unknown; complex numbers have no order). The one relation read through is an
    assignment to another letter, ``z = 1+i``, which Math-Verify compares by its value. Sides too large
    to evaluate are left as they are, for the size bound to refuse, before the substitution evaluates them.
    """
    import sympy

    objs = gold_objs + pred_objs
    if not all(isinstance(o, (sympy.Basic, sympy.MatrixBase)) for o in objs):
        return gold_objs, pred_objs
    values = [o.rhs if isinstance(o, sympy.Eq) and isinstance(o.lhs, sympy.Symbol) and o.lhs.name != "i" else o
              for o in objs]
    symbols = set().union(*(v.free_symbols for v in values))
    if not symbols or {s.name for s in symbols} != {"i"}:
        return gold_objs, pred_objs
    if any(v.has(sympy.Rel, sympy.Interval) or _too_big(v) for v in values):
        return gold_objs, pred_objs
    unit = {s: sympy.I for s in symbols}

    def replaced(o: Any) -> Any:
        if isinstance(o, sympy.Eq) and isinstance(o.lhs, sympy.Symbol) and o.lhs.name != "i":
            # The value only: the parse of "z = 3+4i" made z real, and Eq(z, 3+4I) evaluated to False.
            return sympy.Eq(o.lhs, o.rhs.xreplace(unit), evaluate=False)
        return o.xreplace(unit)

    try:
        return [replaced(o) for o in gold_objs], [replaced(o) for o in pred_objs]
    except Exception:  # a structure sympy refuses with a complex entry
        return gold_objs, pred_objs


def _safe_str(obj: Any) -> str:
    from sympy import sstr

    try:
        # In the order written: sorting an unevaluated sum's terms evaluates each one, 14 s for
        # a 17-deep tower of \frac{1}{1+...} (and latex2sympy keeps the order it parsed anyway).
        text = obj if isinstance(obj, str) else sstr(obj, order="none")
    except Exception:  # e.g. int -> str digit limit, or sympy printer recursion
        text = "<unprintable>"
    return _clip(text)


def _clip(text: str) -> str:
    return text if len(text) <= MAX_FIELD_CHARS else text[: MAX_FIELD_CHARS - 3] + "..."


def _unknowns_in_order(gold: str) -> list[str]:
    """The unknowns a ground truth of assignments names, in its order: "x=3, y=4" gives ["x", "y"], in
    sympy's spelling ("\\theta" is "theta", "a_{1}" "a_1"); [] for any other ground truth."""
    names = []
    for part in re.split(r",|;|\\text\s*\{\s*and\s*\}|\band\b", gold):
        if (assigned := _assignment(part)) is None:
            return []
        names.append(assigned[0].lstrip("\\").replace("{", "").replace("}", ""))
    return names


def _as_ordered(gold: Any, pred: Any, unknowns: list[str]) -> tuple[Any, Any]:
    """An ordered answer against a ground truth that names each unknown's value: both as tuples.

    "x=3, y=4" parses as a set of equations, and Math-Verify compared an answer "(4, 3)" with it as
    a set of values: equal (it paid the reversed pair). A pair, a triple... now takes the unknowns in
    the order the ground truth names them (`unknowns`); "(3, 4)" parses as an open interval, which
    is also a pair. A list without brackets ("3, 4") stays a set of values, and equations are
    matched by name.
    """
    import sympy

    if not (isinstance(gold, sympy.FiniteSet) and isinstance(pred, (sympy.Tuple, sympy.Interval))):
        return gold, pred
    equations = list(gold.args)
    if not all(isinstance(e, sympy.Eq) and isinstance(e.lhs, sympy.Symbol) for e in equations):
        return gold, pred
    if sorted(e.lhs.name for e in equations) != sorted(set(unknowns)) or len(unknowns) != len(equations):
        return gold, pred
    if isinstance(pred, sympy.Interval):
        if not (pred.left_open and pred.right_open and len(equations) == 2):
            return gold, pred
        pred = sympy.Tuple(pred.start, pred.end)
    if len(pred) != len(equations):
        return gold, pred
    return sympy.Tuple(*(e.rhs for e in sorted(equations, key=lambda e: unknowns.index(e.lhs.name)))), pred


def _compare(gold_objs: list[Any], pred_objs: list[Any], unknowns: list[str]) -> bool:
    """Whether an answer's parse matches a ground truth's; `unknowns`: see _unknowns_in_order."""
    grader = _load()
    for gold in gold_objs:
        token = _gold_is_percentage.set(_has_percentage(gold))
        try:
            for pred in pred_objs:
                g, p = _as_ordered(gold, pred, unknowns)
                try:
                    if grader.verify(g, p, float_rounding=6, numeric_precision=15, timeout_seconds=None,
                                     raise_on_error=False):
                        return True
                except Exception:
                    continue
        finally:
            _gold_is_percentage.reset(token)
    return False


def _has_percentage(obj: Any) -> bool:
    """Whether a parsed ground truth holds a percentage (latex2sympy's ``x * UnevaluatedExpr(1/100)``)."""
    from sympy import Basic, preorder_traversal

    return isinstance(obj, Basic) and any(_pct_value(node) is not None for node in preorder_traversal(obj))
