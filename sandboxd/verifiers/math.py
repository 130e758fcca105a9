"""Math answer verifier: extract a final answer from a completion and compare it to a ground truth.

This module runs inside the sandbox agent's forked, unprivileged worker. Parsing untrusted LaTeX
with sympy is code execution in all but name and can hang, so the agent enforces a hard deadline
from *outside* by killing the worker. Consequently nothing here installs a timeout of its own:
Math-Verify's ``parse``/``verify`` timeouts are ``signal.alarm`` based, which only works in the
main thread and would fight the agent's own supervision, so they are always disabled
(``parsing_timeout=None`` / ``timeout_seconds=None``). What this module does do is refuse work
that is cheap to recognise as pathological (huge or deeply nested inputs, towers of powers)
before sympy gets to evaluate it.

Pipeline: :func:`verify` extracts the final answer (``\\boxed{}`` / ``<answer>`` / "the answer
is" / last math expression), normalises a few notations that Math-Verify misreads, parses both
sides with ``math_verify.parse`` and compares them with Math-Verify's grader, in which the
numeric comparison has been replaced by an exact/relative-tolerance one (see below).

Deliberate differences from Math-Verify (0.9.0), each fixing a wrong verdict:

===============================  ==========================  =================================
Input (gold vs answer)           Math-Verify                 Here
===============================  ==========================  =================================
``1/2004!`` vs ``1/2006!``       equal (#14: ``evalf``       different: exact rationals are
                                 with ``chop`` rounds tiny   compared exactly
                                 values to 0)
``1/2^99`` vs ``1/2^98``         equal (#14, same cause)     different
``0.0000001`` vs ``0.0000002``   equal (``round(6)`` is an   different: relative tolerance
                                 absolute tolerance)         ``float_tolerance`` (1e-6)
``1234567.891`` vs               different (absolute         equal (relative 4e-10)
``1234567.8915``                 ``round(6)``)
``1000000`` vs ``1000001.0``     different                   different: against an integer the
                                                             tolerance is absolute
``0.0000005`` vs ``0``           equal (``round(6)``)        different: never looser than the
                                                             relative tolerance
``10^{20}+1`` vs                 equal (``simplify`` of the  different: no symbolic fallback
``1.0 \\times 10^{20}``           difference at 53 bits)      for an integer the float rounds
``4`` vs ``4\\sqrt(2)``           equal (#41: ``\\sqrt(2)``    ``\\sqrt(...)`` rewritten to
                                 normalised to ``4\\\\sqrt``)  ``\\sqrt{...}``; different
``3*x-1*y+13=0`` vs              equal (#60: plain text      whole extracted answer parsed as
``3x + 4y + 14=0``               extraction takes the ``0``) LaTeX first; different lines
``1/3`` vs ``\\int_0^1 x^2 dx``  equal (evaluated)           different: an integral, sum,
                                                             product, limit, derivative,
                                                             max/min or gcd/lcm the ground
                                                             truth lacks is the question
                                                             restated, not its answer
``Paris`` vs ``sirap``           equal (letters parsed as a  text answers compared as
                                 commutative product)        normalised text
``B`` vs ``(B)`` / ``B) 42``     parsed as symbols           choice letters compared
                                                             (case-insensitive)
``1.5e3`` vs ``1500``            ``1.5*E*3``                 scientific notation understood
``3 1/2`` vs ``7/2``             ``3*1/2``                   mixed number
``3,5`` vs ``3.5``               set ``{3, 5}``              decimal comma when the gold is a
                                                             single number
``15`` vs ``x^2+15 \\oops{``      equal (its plain-text       different: the plain-text
                                 extractor picks a number    extractor only reads answers made
                                 out of unparsable LaTeX)    of digits and operators
``x^2+8x+16`` vs completion      no answer (``2x+3``: ``2``) the whole undelimited expression
``(x+4)^2`` (no ``$``/box)                                   (ours used to take the last number)
``2/3`` vs ``0.\\overline{6}``    different (read as ``0``)   repeating decimal, exact
``\\sqrt{-1}`` vs ``i``,          different (``i`` is a       equal: ``i`` as the only letter
``\\frac{2}{1-i}`` vs ``1+i``     symbol)                     is the imaginary unit
``3`` vs ``1+2\\mathrm{i}``       equal (text dropped)        different: ``\\mathrm{i}`` is ``i``
``\\frac12`` vs                   different (degree dropped)  equal: degrees in trig arguments
``\\sin 30^\\circ``
``x=3, y=4`` vs ``(4, 3)``       equal (values as a set)     different: a pair takes the
                                                             unknowns in the order named
``e^2`` vs ``\\mathrm{e}^2``     different (upright e read   equal: an upright e is Euler's
                                 as a symbol)                number, as an upright i is the unit
``5`` vs ``5\\%``                 equal (``50% = 50 = 0.5``:  different: X% is X/100 unless the
                                 one answer, two readings)   gold is written as a percentage
``2`` vs ``2+``, ``2^+``, ``2'``  equal (the mark dropped)    different: a mark the parser drops
``3`` vs a fullwidth 3           different (unparsable)      equal: decimal digits of any script
``2`` vs ``2 oder 3``            equal (its first number)    different: "or" in other languages
``0`` vs                         different (``simplify``     equal: 0 at 1000 and 4000 bits,
``\\cos\\frac{\\pi}{7}+             cannot prove it)            shrinking (_vanishes)
\\cos\\frac{3\\pi}{7}+
\\cos\\frac{5\\pi}{7}-\\frac12``
===============================  ==========================  =================================
"""

from __future__ import annotations

import contextvars
import importlib.util
import logging
import math as _pymath
import re
import sys
import unicodedata
from types import ModuleType
from typing import Any

__all__ = ["EXTRACTION_MODES", "MAX_ANSWER_CHARS", "verify", "warm"]

#: Extraction modes accepted by :func:`verify`; "auto" tries the others in this order.
EXTRACTION_MODES: tuple[str, ...] = ("auto", "boxed", "answer_tag", "phrase", "last_expression")
#: Extracted answers (and ground truths) longer than this are rejected before parsing: no real
#: final answer is that long, and the LaTeX parser needs ~1.5 s per 1000 chars of a polynomial
#: (a 20 000-char sum of ``x^{2}`` terms took ~30 s; at this limit it is ~6 s).
MAX_ANSWER_CHARS = 5_000
#: Strings in the result dict are truncated to this many characters.
MAX_FIELD_CHARS = 1_000

# Nesting limits, found by measurement: the ANTLR LaTeX grammar backtracks exponentially on bare
# nested braces ({{{{1}}}} at depth 15 takes ~2 s, depth 20 ~100 s) and slowly on parentheses.
# Command arguments (\frac{..}{..}, \sqrt{..}) are cheap and only fall under the total limit.
_MAX_BARE_BRACE_DEPTH = 5
_MAX_PAREN_DEPTH = 16
_MAX_TOTAL_DEPTH = 40
# Subscripts in subscripts cost the grammar's prediction about the square of their depth: x_{x_{...}} 10 deep took
# 0.46 s here, 30 deep 4.2 s. Indices of indices (a_{n_{k}}) are as deep as answers go.
_MAX_SUBSCRIPT_DEPTH = 4
# Absolute-value bars are ambiguous for the grammar (an opening bar looks like a closing one), and each costs its
# prediction more the more there are: |x| written 10 times side by side took 0.53 s here, 22 times 3.6 s, 52 times
# 5 s; summed, 400 took 6.9 s. \left| and \right| are not ambiguous and not counted.
_MAX_BARS = 16
_BAR_RE = re.compile(r"(\\left|\\right)?\s*(?:\||\\[lr]?vert(?![a-zA-Z]))")
# Towers of exponents: the grammar's prediction is exponential in the tower height (x^x^...^x
# with 12 carets ~1 s, with 20 carets ~20 s) and sympy evaluates them eagerly. 9^{9^{9^9}} is 3.
_MAX_POWER_DEPTH = 5
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
# The most bits of ln 2, pi or e that evaluation may compute (0.08 s for ln 2 here; 2^20 bits
# take 16 s). Only an argument past 2^65000 needs more; see _guard_constant_precision.
_MAX_CONSTANT_BITS = 1 << 16
# Function applications nested deeper than this (\\log(\\log(... + 1) + 1)) only match the same
# tree: sympy's evalf re-evaluates a log's argument near 1, so the cost grows about 2.5 times a
# level (12 deep: 32 s here; 6 deep: 0.5 s, all of it parsing). No final answer nests 7 deep.
_MAX_FUNCTION_DEPTH = 6
# Upper bound (in bits) on the magnitude of any numeric sub-expression we let sympy evaluate.
_MAX_NUMBER_BITS = 1_000_000
# Nor the root (a power with a fractional exponent) of a number larger than this: see _log2_bound.
_MAX_ROOT_BITS = 2_000
# sympy works out a binomial or a Gamma of concrete numbers as soon as latex2sympy builds it,
# in pure-Python loops whose time grows with the square of the result's size (binom(10^5,
# 5*10^4), 10^5 bits: 0.56 s here; binom(10^6, 5*10^5): over 20 s), where only the math
# server's kill reaches. Above these sizes the call is left unevaluated (see
# _guard_eager_evaluation), and _log2_bound then refuses it as too large.
_MAX_EAGER_RESULT_BITS = 50_000
_MAX_EAGER_TERMS = 20_000
_MAX_EAGER_GAMMA_ARG = 70_000  # Gamma(70000) has 1.06 million bits: over _MAX_NUMBER_BITS anyway
# The grader solves two relations that it could not match term by term and compares the solutions (2x + 2y = 6
# against x + y = 3). sympy's solve takes time that grows with the degree: x^{10}+x=3 0.18 s here, x^{20}+x=3 1.1 s,
# x^{50}+x=3 more than 20 s; in two unknowns, x^{30}y^{30}+x^{29}y^{29}+xy=3 6.9 s. A relation is solved only in
# several unknowns, as a rational function of them of at most this degree in one of them (_bounded_solve).
_MAX_SOLVE_DEGREE = 10
# Sets cost sympy's set algebra about the square of their elements' count, unless they are rational numbers, and
# more for each interval: {x, x^2, ..., x^{30}} against {1, 2} took 1.8 s here and 79 elements 16 s; 60 sums of
# roots 10.5 s; 6 intervals with symbolic ends 0.12 s, 8 0.9 s, 10 4.5 s and 12 more than 20 s; 6 intervals with
# irrational ends that differ in one end each 0.59 s, 8 1.5 s; 10 with integer ends 0.93 s, 30 more than 25 s.
# Past these counts a set only matches the same set (_bounded_compare_sets).
_MAX_SET_ELEMENTS = 10
_MAX_SET_INTERVALS = 6
# Only the tail of a long completion is searched for a "last expression": the final answer is at
# the end, and regex scans over megabytes of text are wasted work.
_LAST_EXPR_TAIL_CHARS = 10_000
# How many \boxed occurrences (from the end) we try before giving up on malformed ones.
_MAX_BOX_TRIES = 20

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

# --------------------------------------------------------------------------------------------
# Extraction
# --------------------------------------------------------------------------------------------

_BOX_RE = re.compile(r"\\(?:boxed|fbox)\b")
_BOX_TOKEN_RE = re.compile(r"[^\s$]+")  # the argument of "\boxed 5"
# "or" in the languages models answer in: a word that offers an alternative ("2 oder 3", "2 или 3", "2或3"). Alphabetic
# words stand apart from letters of any script (not "four", "color"); the one-letter ones ("o", "ή") only between
# spaces; the CJK and Thai ones are written without spaces.
_OR_WORDS_ALPHA = ("or", "oder", "bzw", "ou", "oppure", "ovvero", "eller", "lub", "albo", "nebo", "vagy", "sau", "tai",
                   "veya", "yahut", "atau", "hoặc", "или", "либо", "або", "أو", "או", "या", "अथवा", "یا")  # noqa: RUF001
_OR_WORDS_SPACED = ("o", "ó", "ή")
_OR_WORDS_CJK = ("或者", "或", "還是", "还是", "または", "もしくは", "또는", "혹은", "หรือ")
_OR_WORD = (rf"(?<![^\W\d_\\])(?:{'|'.join(_OR_WORDS_ALPHA)})(?![^\W\d_])|(?<=\s)(?:{'|'.join(_OR_WORDS_SPACED)})(?=\s)"
            rf"|{'|'.join(_OR_WORDS_CJK)}")
_OR_WORD_RE = re.compile(_OR_WORD, re.IGNORECASE)
# What may stand between two boxes of one answer: spacing, symbols and punctuation, math delimiters, "and"/"or" (and
# "maybe", "either": a hedge joins its boxes, to be refused as one), a text wrapper, a part's label ("(b)", "part
# (ii)"), an unknown's name ("$x = \boxed{2}$ and $x = \boxed{3}$"). Other words make the boxes different answers
# ("first \boxed{2}, but fixing the error, \boxed{5}"; "\boxed{1} no no no \boxed{2}" is 2, as Math-Verify reads it).
_JOINER_TOKEN = (
    r"\s|[^\w\s\\]|\\[\[\]()]|\\\\|\\(?![\s\S])|\\q?quad(?![A-Za-z])|\\[,;:! ]|\\hline|\\(?:left|right)(?![A-Za-z])"
    r"|\\(?:text(?:bf|rm|normal|it)?|math(?:rm|bf)|mbox)\s*\{"
    rf"|(?<![^\W\d_])(?:and|for|part|maybe|perhaps|possibly|either)(?![^\W\d_])|{_OR_WORD}|\\(?:vee|lor)(?![A-Za-z])"
    r"|\(?(?:[a-hA-H]|i{1,3}|iv|vi{0,3}|ix|x|\d{1,2})\)"
    r"|(?:\\[A-Za-z]+|[A-Za-z])(?:\s*[_^]\s*(?:\{[\w\\ ]{1,10}\}|\w))*\s*(?:\([^()$]{0,10}\))?\s*="
)
_BOX_JOINER_RE = re.compile(rf"(?:{_JOINER_TOKEN})*+", re.IGNORECASE)
# One or two words right after a box are its unit when a list goes on ("\boxed{1} papers and \boxed{2} bins"); not
# a word that corrects, denies or concludes.
_UNIT_AFTER_BOX_RE = re.compile(
    rf"(?:\s*+(?!{_OR_WORD})(?!(?:no|not|nor|but|wait|or|and|actually|instead|rather|hmm|oops|sorry|so|then|thus|hence|therefore"
    r"|finally|correction|answer|is|are|was|maybe|perhaps|possibly)(?![^\W\d_]))[^\W\d_]++){1,2}",
    re.IGNORECASE,
)
_LIST_JOINER_WORD_RE = re.compile(r"[,;&]|(?<![^\W\d_])and(?![^\W\d_])", re.IGNORECASE)
# Alternatives offered for one answer. "2 \\text{ or } 3" reads as the list {2, 3}, which a single ground truth does
# not equal; but "2 \\text{ or 3}", "2 \\text{(or 3)}", "B or C" and "x = 2 \\vee x = 3" were read as one of their
# alternatives and paid (red team), and so were "2 oder 3", "2 или 3" and "2或3" in plain text.
_HEDGE_RE = re.compile(rf"{_OR_WORD}|\\(?:vee|lor)(?![A-Za-z])|\u2228", re.IGNORECASE)
# Text between two boxes longer than this does not join them (and bounds the joiner's scan).
_MAX_JOINER_CHARS = 200
_PHRASE_RE = re.compile(r"(?:final\s+answer\s*(?:is\b|:)|the\s+answer\s+is\b|\banswer\s*:)", re.IGNORECASE)
_HOPE_RE = re.compile(r"\.?\s*I\s+hope\s+it\s+is\s+correct.*$", re.IGNORECASE | re.DOTALL)
# Span lengths are bounded so that text full of unclosed "\(" cannot make the scan quadratic.
# "\$" is a dollar sign, not a delimiter: "The answer is $\$120$" was read as the span "\".
_MATH_SPAN_RE = re.compile(
    r"(?<!\\)\$\$(?P<dd>(?:[^$\\]|\\.){1,2000}?)\$\$|\\\[(?P<sb>.{1,2000}?)\\\]|\\\((?P<rb>.{1,2000}?)\\\)"
    r"|(?<!\\)\$(?P<d>(?:[^$\\]|\\.){1,2000}?)\$",
    re.DOTALL,
)
# What joins the math spans of a list after an answer phrase: "$2$ and $3$", "$2$, $3$", "$2$; $3$".
_LIST_JOINER_RE = re.compile(r"\s*(?:[,;&]\s*)?(?:and\s+)?", re.IGNORECASE)
# The unknown a span names on its left: "x = 5", "a_1 = 5", "\\theta=5".
_UNKNOWN_NAME_RE = re.compile(r"(?:\\[A-Za-z]+|[A-Za-z])(?:_\{?\w+\}?)?")
# Where math starts in an answer sentence, and the words that state what the answer is ("The largest $n$ is 34").
_FIRST_MATH_RE = re.compile(r"(?<!\\)\$|\\[(\[]|\\(?:boxed|fbox)\b|\d")
_COPULA_RE = re.compile(r"(?<![^\W\d_])(?:is|are|was|were|equals|becomes)(?![^\W\d_])|\bequal\s+to\b",
                        re.IGNORECASE)
# The phrase of a final answer, which a box before it does not override (MATH's Minerva format: "Final Answer: The
# final answer is $X$. I hope it is correct."), as Math-Verify reads it.
_FINAL_PHRASE_RE = re.compile(r"final\s+answer\s*(?:is\b|:)", re.IGNORECASE)
# How much of the line after an answer phrase is searched for a box or a math span.
_PHRASE_SCAN_CHARS = 4_000
_SENTENCE_END_RE = re.compile(r"(?<=[.?])\s+(?=[A-Z])")
_QUESTION_RE = re.compile("[?\uff1f\u2753]")
# A word that denies the expression right after it: "it is not 2", "which can't be 5".
_NEGATION_RE = re.compile(
    r"(?:\b(?:not|never|nor|cannot|rather\s+than|instead\s+of)|n['\u2019]t)"
    r"(?:\s+(?:exactly|quite|just|really|simply|necessarily))?(?:\s+(?:be|equal(?:s|\s+to)?))?"
    r"[\s:,*_`\"'\u201c\u201d\u2018\u2019\u2014\u2013-]*$",
    re.IGNORECASE,
)
# Tokens of a plain-text (undelimited) math expression, for the last-expression fallback. A
# number is one token: a mixed number "3 1/2", thousands "1,234.5", a decimal or an integer.
_PLAIN_TOKEN_RE = re.compile(
    rf"(?P<alt>(?i:{_OR_WORD}))|"  # "or", "oder", "или", "或": joins a list (or offers alternatives)
    # A code or a word with digits in it ("AZYUK2A", "COVID19", "H2O"): not a number (it read "AZYUK2A" as 2).
    r"(?P<ident>(?<![A-Za-z\d])(?!(?:sqrt|log|ln|pi)\d)(?:[A-Za-z]{2,}\d|[A-Za-z]+\d+[A-Za-z])[A-Za-z\d]*)"
    r"|(?P<num>\d+[ \t]+\d+[ \t]*/[ \t]*\d+(?![\d.])|\d{1,3}(?:(?:,|[ \t]|\\,|\{,\})\d{3})+(?:\.\d+)?(?![\d.])"
    r"|\d+(?:\.\d+)?|\.\d+)"
    r"|(?P<cmd>\\(?:[A-Za-z]+|[{}$%,;:! ]))"
    r"|(?P<unit>(?<=\d)[A-Za-z]{1,3}[²³])"  # "1,000.99m²": a unit, which ends the expression
    r"|(?P<word>[A-Za-z]+)"
    r"|(?P<op>[-+*/^_=<>!|(){}\[\],%\u00d7\u00f7\u00b7\u2264\u2265\u2260\u00b1\u221a\u03c0\u221e\u2212])"
    r"|(?P<space>[ \t]+)"
)
# LaTeX commands that carry no value: a plain run made only of these plus letters is not math.
_NON_MATH_CMDS = frozenset(
    [
        *("\\text", "\\textbf", "\\textit", "\\textrm", "\\mathrm", "\\mathbf", "\\mbox", "\\quad", "\\qquad"),
        *("\\left", "\\right", "\\,", "\\;", "\\:", "\\!", "\\ "),
    ]
)
# Multi-letter words that make a plain run an expression on their own ("pi", "sqrt(2)").
_PLAIN_MATH_WORDS = frozenset(["pi", "sqrt", "infty"])
# A run may not end with these (a dangling operator, an opening bracket, a \text{ ...).
# (Unicode: times, divide, middle dot, <=, >=, !=, +-, minus.)
_TRAILING_JUNK_OPS = frozenset("+-*/^_=<>,({[|\u00d7\u00f7\u00b7\u2264\u2265\u2260\u00b1\u2212")
_LEADING_JUNK_OPS = frozenset("+*/^_=<>,)]}|\u00d7\u00f7\u00b7\u2264\u2265\u2260")


def _match_brace(text: str, open_idx: int) -> int | None:
    """Index of the ``}`` closing the ``{`` at ``open_idx``; escaped ``\\{`` ``\\}`` are skipped."""
    depth = 0
    i = open_idx
    n = len(text)
    while i < n:
        c = text[i]
        if c == "\\":
            i += 2  # skip the escaped character: \{ and \} are literal set braces
            continue
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return None


def _box_content(text: str, end: int) -> tuple[str, int] | None:
    """Content of the box whose command ends at ``end`` (``\\boxed{..}`` or ``\\boxed 5``), and
    the index just past the box."""
    i = end
    while i < len(text) and text[i] in " \t":
        i += 1
    if i < len(text) and text[i] == "{":
        close = _match_brace(text, i)
        if close is None:
            return None
        return text[i + 1 : close], close + 1
    if end < len(text) and text[end] == " ":
        # "\boxed 5": the argument is the next token, up to whitespace or a math delimiter.
        m = _BOX_TOKEN_RE.match(text, i)
        return (m.group(0), m.end()) if m else None
    return None


def _boxes(text: str) -> list[tuple[str, int, int]]:
    """The outermost well-formed, non-empty boxes among the last _MAX_BOX_TRIES box commands, in order: (content
    with any box inside it read as its content, start, end)."""
    found: list[tuple[str, int, int]] = []
    for m in list(_BOX_RE.finditer(text))[-_MAX_BOX_TRIES:]:
        if found and m.start() < found[-1][2]:
            continue  # a box inside the previous one: "\boxed{3 = \boxed{2}}" answers "3 = 2", not 2
        box = _box_content(text, m.end())
        if box is None:
            continue
        # A box inside the answer counts as its content alone: Math-Verify would read the box.
        content = _BOX_RE.sub("", box[0]).strip()
        if content:
            found.append((content, m.start(), box[1]))
    return found


def _box_groups(text: str) -> list[tuple[list[str], bool]]:
    """The boxes of ``text`` in groups that one answer lists ("\\boxed{1}, \\boxed{2} and \\boxed{3}"), in order:
    each group's contents (once each) and whether an "or" joins them. Boxes apart (words between them, or only
    spacing: "first \\boxed{2}, but fixing the error, \\boxed{5}") are different answers, the later one final."""
    groups: list[tuple[list[str], bool]] = []
    end = -1
    for content, start, stop in _boxes(text):
        if not (groups and _boxes_joined(text, end, start)):
            groups.append(([content], False))
        else:
            contents, alternatives = groups[-1]
            if content not in contents:
                contents.append(content)
            groups[-1] = (contents, alternatives or bool(_HEDGE_RE.search(text, end, start)))
        end = stop
    return groups


def _boxes_joined(text: str, end: int, start: int) -> bool:
    """Whether ``text[end:start]``, between two boxes, makes them one answer's list (see _JOINER_TOKEN)."""
    if start - end > _MAX_JOINER_CHARS:
        return False
    if unit := _UNIT_AFTER_BOX_RE.match(text, end, start):
        if not _LIST_JOINER_WORD_RE.search(text, unit.end(), start):
            return False
        end = unit.end()
    return _BOX_JOINER_RE.fullmatch(text, end, start) is not None


def _extract_boxed(text: str, parts: int = 1) -> str | None:
    """The final answer's boxes: the last group of boxes that one answer lists, and as many groups before it as
    it takes to give ``parts`` values (the parts of the ground truth).

    A ground truth of one value takes the last group ("\\boxed{2}. Fixing the error: \\boxed{5}" answers 5); one
    of k parts the boxes of its final answer, also where each part has its own box ("(a) ... \\boxed{2}. (b) ...
    \\boxed{3}"). A group is read whole: more values than the ground truth has are a wrong answer, not a choice.
    """
    groups = _box_groups(text)
    if not groups:
        return None
    taken: list[str] = []
    alternatives = False
    for contents, joined_by_or in reversed(groups):
        taken[:0] = contents
        alternatives = alternatives or joined_by_or
        if sum(_count_parts(c) for c in taken) >= parts:
            break
    return (" \\text{ or } " if alternatives else ", ").join(taken)


# One number, its commas thousands or a decimal comma ("1,234", "1,22", "0,111"): one part, not a list.
_ONE_NUMBER_RE = re.compile(r"-?\d+(?:[.,]\d+)*")
# What separates the parts of an answer: a comma (not in "1,234"), a semicolon, "and"/"or" (also in text), \quad.
_PART_SEPARATOR_RE = re.compile(
    rf",(?!\d{{3}}(?!\d))|;|\\(?:text|mathrm|textrm|mbox)\s*\{{\s*,?\s*(?:and|{_OR_WORD})\s*\}}"
    rf"|(?<![^\W\d_])and(?![^\W\d_])|{_OR_WORD}|\\q?quad(?![A-Za-z])",
    re.IGNORECASE,
)


def _outside_brackets(s: str) -> str:
    """``s`` with each bracketed group ((), [], {}, \\{\\}: a point, an interval, an argument) as one "0"."""
    out, depth, i = [], 0, 0
    while i < len(s):
        c = s[i]
        if c == "\\" and s[i + 1 : i + 2] in ("{", "}"):
            c = s[i + 1]
            i += 1
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth = max(0, depth - 1)
            if not depth:
                out.append("0")  # the group stands for one value
        elif not depth:
            out.append(c)
        i += 1
    return "".join(out)


def _count_parts(answer: str) -> int:
    """How many values ``answer`` lists: 1 for "5", "(1, 2)", "[0, 1)" or "1,234"; 3 for "1, 2, 3" and "\\{1,2,3\\}"."""
    s = re.sub(r"\\(?:left|right)(?![A-Za-z])", "", _strip_delims(answer)).strip()
    if _ONE_NUMBER_RE.fullmatch(s):
        return 1
    if s.startswith(("{", "\\{")) and _outside_brackets(s).strip() == "0":
        s = s[1:-1] if s.startswith("{") else s[2:-2]  # a set: its elements
    marked = _PART_SEPARATOR_RE.sub("\x00", _outside_brackets(_PART_SEPARATOR_RE.sub(",", s)))
    return max(1, sum(1 for run in marked.split("\x00") if run.strip()))


def _span_text(m: re.Match[str]) -> str:
    """The content of a :data:`_MATH_SPAN_RE` match, whichever delimiters it had."""
    return next(g for g in m.groups() if g is not None).strip()


def _extract_answer_tag(text: str) -> str | None:
    """Content of the last non-empty ``<answer>...</answer>`` (found with ``rfind``: linear)."""
    lower = text.lower()
    end = len(lower)
    for _ in range(_MAX_BOX_TRIES):
        close = lower.rfind("</answer>", 0, end)
        if close < 0:
            return None
        open_ = lower.rfind("<answer>", 0, close)
        if open_ < 0:
            return None
        content = text[open_ + len("<answer>") : close].strip()
        end = open_
        if not content:
            continue
        # A tag that wraps a box or a math span: the inner answer is what was meant.
        boxed = _extract_boxed(content)
        if boxed:
            return boxed
        if _has_prose(content) and (found := extract_answer(content)):
            # "<answer>The answer is 42.</answer>": the answer the sentence gives (the rules that
            # follow this one), not the sentence, which latex2sympy read as a product of letters.
            # Words alone stay a text answer.
            return found[0]
        return content
    return None


def _extract_phrase(text: str) -> str | None:
    """Answer after the last "final answer is" / "the answer is" / "Answer:" phrase."""
    last = None
    for last in _PHRASE_RE.finditer(text):  # noqa: B007 - we want the last match
        pass
    if last is None:
        return None
    rest = text[last.end() :]
    lines = rest.split("\n")
    # "The answer is:\n\n$$42$$": the answer may sit on the next non-empty line.
    line = next((ln for ln in lines[:4] if ln.strip(" \t*:")), "")
    # A display block that starts on this line may continue on the following ones.
    if line.strip().startswith(("$$", "\\[")):
        line = "\n".join(lines[lines.index(line) :])
    head = _HOPE_RE.sub("", line[:_PHRASE_SCAN_CHARS])
    # Only the sentence that holds the phrase: "The answer is 8. Later we ..." stops at "8.".
    head = _SENTENCE_END_RE.split(head, maxsplit=1)[0]
    if (asked := _QUESTION_RE.search(head)) and not _has_prose(head[: asked.start()]):
        # "The answer is 2? No wait, 3": the answer asked about, not given (it paid 2); the next rule
        # reads on. A question later in the sentence ("42 (why? ...)") leaves the answer given.
        return None
    head = _named_answer(head)
    boxed = _extract_boxed(head)
    if boxed:
        return boxed
    if span := _MATH_SPAN_RE.search(head):
        if _negated(head[: span.start()]):
            return None  # "The answer is not $2$; it is $3$": it paid 2; the next rule reads on
        if _HEDGE_RE.search(_MATH_SPAN_RE.sub(" ", head[span.end() :])):
            # "The answer is $2$ or $3$": all of it, for the judge's alternatives check (it paid 2).
            return _MATH_SPAN_RE.sub(lambda m: _span_text(m), head[span.start() :]).strip().rstrip(".").strip()
        # "The answer is $2$ and $3$": all the spans of a list, not its first (it paid 2).
        listed, end = [_span_text(span)], span.end()
        for more in _MATH_SPAN_RE.finditer(head, span.end()):
            if not _LIST_JOINER_RE.fullmatch(head[end : more.start()]):
                break
            listed.append(_span_text(more))
            end = more.end()
        return _one_if_restated(listed) or ", ".join(listed)
    # An over-long line is returned whole so that the length limit rejects it explicitly.
    answer = head if len(line) <= _PHRASE_SCAN_CHARS else line
    answer = answer.strip().strip("*").strip().lstrip(":").strip()
    # Sentence-final period, but not a decimal point ("is 3." vs "is 3.5").
    answer = re.sub(r"\.\s*$", "", answer).strip().strip("*").strip()
    if _has_prose(answer):
        # "The answer is 7 a day" / "is x = 5 because ...": the expression the phrase introduces,
        # not the words after it (which latex2sympy would read as a product of symbols).
        runs = _plain_runs(answer)
        if runs and _negated(answer[: runs[0][0]]):
            return None  # "not 2 but 3": the next rule reads on
        if runs and not re.search(r"[A-Za-z0-9]", answer[: runs[0][0]]):
            if _HEDGE_RE.search(answer[runs[0][0] + len(runs[0][1]) :]):
                return answer  # "is 2 (or possibly 3)": all of it, for the alternatives check (it paid 2)
            return runs[0][1]
    return answer or None


def _named_answer(head: str) -> str:
    """The part of an answer sentence that holds its answer, when words come before any math in it.

    "The largest $n$ is 34", "The volume of $ABCDEFGH$ is 120": what follows the last "is" (outside math; it took
    the first span, $n$). "Jane started growing Sphere 3 hours ago": its only expression. Else all of it.
    """
    first = _FIRST_MATH_RE.search(head)
    if first is None or not _has_prose(head[: first.start()]):
        return head
    masked = _MATH_SPAN_RE.sub(lambda m: " " * len(m.group(0)), head)  # "is" inside math is not a copula
    copulas = list(_COPULA_RE.finditer(masked))
    if copulas:
        return head[copulas[-1].end() :]
    spans = list(_MATH_SPAN_RE.finditer(head))
    runs = _plain_runs(masked)
    if len(spans) + len(runs) == 1 and not _negated(head[: (start := spans[0].start() if spans else runs[0][0])]):
        return head[start:]
    return head


def _one_if_restated(listed: list[str]) -> str | None:
    """The first span when the others only say it again ("$5$, $x = 5$"); else ``None`` (a list).

    A span may name one unknown on its left ("x = 5"); two names ("$x = 5$, $y = 5$") are two answers.
    """
    if len(listed) < 2:
        return None
    values, names = set(), set()
    for item in listed:
        name, value = _assignment(item) or ("", item)
        values.add(re.sub(r"\s+", "", value))
        names.add(name)
    names.discard("")
    return listed[0] if len(values) == 1 and len(names) <= 1 else None


def _assignment(s: str) -> tuple[str, str] | None:
    """``(name, value)`` of "x = 5" (one unknown named on the left, as _UNKNOWN_NAME_RE spells it); else None."""
    sides = s.split("=")
    if len(sides) != 2 or not _UNKNOWN_NAME_RE.fullmatch(name := sides[0].strip()):
        return None
    return name, sides[1]


def _has_prose(s: str) -> bool:
    """Whether ``s`` holds an English word outside ``\\text{}`` (units) and LaTeX commands."""
    for w in re.findall(r"(?<![\\A-Za-z])[A-Za-z]{2,}", _TEXT_CMD_RE.sub(" ", s)):
        if w.lower() not in _MATH_WORDS and w.lower() != "and" and not _OR_WORD_RE.fullmatch(w):
            return True
    return False


def _plain_runs(text: str) -> list[tuple[int, str]]:
    """Maximal runs of math tokens in undelimited text, as ``(start offset, run)``, in order.

    A run is broken by prose (a word of two or more letters that is not a math word such as
    ``sqrt``/``pi``), by a newline or sentence punctuation, and by whitespace between an operand
    and a one-letter word or another number ("makes 7 a day" gives ``7``); "and"/"or" join a
    list ("2 and 3"). Dangling operators and unmatched brackets at either end are trimmed. Only
    runs that hold a number, an operator or a LaTeX command count: "I" or "(B)" in prose is not
    an expression. Linear in the length of ``text``.
    """
    runs: list[tuple[int, str]] = []
    current: list[tuple[str, str, int, int]] = []  # (kind, token, start, end)

    def junk(tok: tuple[str, str, int, int], ops: frozenset[str]) -> bool:
        return tok[0] in ("space", "sep") or tok[1] in ops or tok[1] in _NON_MATH_CMDS

    def flush() -> None:
        toks = list(current)
        current.clear()
        while toks and junk(toks[-1], _TRAILING_JUNK_OPS):
            toks.pop()
        first = 0
        while first < len(toks) and junk(toks[first], _LEADING_JUNK_OPS):
            first += 1
        toks = toks[first:]
        if not toks:
            return
        has_number = any(t[0] == "num" for t in toks)
        has_operator = any(t[0] == "op" and t[1] not in "()[]{},%" for t in toks)
        has_command = any(
            (t[0] == "cmd" and t[1] not in _NON_MATH_CMDS) or (t[0] == "word" and t[1].lower() in _PLAIN_MATH_WORDS)
            for t in toks
        )
        run = _trim_unmatched(text[toks[0][2] : toks[-1][3]])
        if run and (has_number or has_command or has_operator):
            runs.append((toks[0][2], run))

    def last_operand() -> tuple[str, str, int, int] | None:
        if not current or current[-1][0] != "space":
            return None  # only whitespace-separated neighbours are split
        prev = current[-2] if len(current) >= 2 else None
        if prev is not None and (prev[0] in ("num", "word", "scale") or prev[1] in ")]}!%"):
            return prev
        return None

    pos = 0
    n = len(text)
    while pos < n:
        m = _PLAIN_TOKEN_RE.match(text, pos)
        if m is None:
            flush()
            pos += 1
            continue
        kind = m.lastgroup or ""
        tok = m.group(0)
        item = (kind, tok, m.start(), m.end())
        after_number = bool(current) and (current[-1][0] in ("num", "scale") or (
            current[-1][0] == "space" and len(current) >= 2 and current[-2][0] in ("num", "scale")))
        if after_number and kind == "word" and (unit := _PLAIN_UNIT_RE.match(text, m.start())):
            # "12 cm^2", "10 m/s": the number's unit ends the expression (the last one was "2", "m/s").
            flush()
            pos = unit.end()
            continue
        if after_number and kind == "word" and _SCALE_TOKEN_RE.fullmatch(tok):
            current.append(("scale", tok, m.start(), m.end()))  # "3 million": part of the number's value
        elif kind == "alt" or (kind == "word" and tok.lower() == "and"):
            if current:
                current.append(("sep", tok, m.start(), m.end()))
        elif kind in ("unit", "ident") or (kind == "word" and len(tok) > 1 and tok.lower() not in _MATH_WORDS):
            flush()
        else:
            if (prev := last_operand()) is not None and (
                (kind == "word" and len(tok) == 1)
                or (kind == "num" and (prev[0] == "num" or (prev[0] == "word" and len(prev[1]) == 1)))
            ):
                flush()  # "7 a day" -> "7"; "step 2 5", "it's 5": two operands, not a product
            current.append(item)
        pos = m.end()
    flush()
    return runs


def _trim_unmatched(run: str) -> str:
    """Drop unmatched brackets from the ends of ``run`` ("x = 5)" -> "x = 5"); linear time.

    ``(`` and ``[`` close with either ``)`` or ``]`` (half-open intervals). An unmatched bracket
    inside the run is kept: the parser will fail on it.
    """
    stack: list[int] = []
    unmatched: list[int] = []
    for i, c in enumerate(run):
        if c in "([{":
            stack.append(i)
        elif c in ")]}":
            if stack and (run[stack[-1]] == "{") == (c == "}"):
                stack.pop()
            else:
                unmatched.append(i)
    unmatched.extend(stack)
    if not unmatched:
        return run
    drop = set(unmatched)
    lo, hi = 0, len(run)
    while lo < hi and (lo in drop or run[lo].isspace()):
        lo += 1
    while hi > lo and (hi - 1 in drop or run[hi - 1].isspace()):
        hi -= 1
    return run[lo:hi]


def _extract_last_expression(text: str) -> str | None:
    """The rightmost math span (``$..$``, ``\\(..\\)``, ...) or plain-text expression.

    Like Math-Verify, a delimited span and an undelimited expression compete by position: the
    one that ends last wins. The plain-text expression is a whole run of math tokens, so
    ``(x+4)^2`` is taken as written, not as its trailing ``2``.
    """
    tail = text[-_LAST_EXPR_TAIL_CHARS:]
    # From the end: the plain runs after a span, then the span, then the runs before it... The first
    # expression that is not denied wins ("It is 3, not 2" is 3, "So x = 3, not $x = 2$" too: a denied
    # one paid 2). Each stretch of text is read once, and usually only the last.
    spans = list(_MATH_SPAN_RE.finditer(tail))
    stretch_end = len(tail)
    for span in [*reversed(spans), None]:
        stretch_start = span.end() if span is not None else 0
        for start, run in reversed(_plain_runs(tail[stretch_start:stretch_end])):
            if _negated(tail[: stretch_start + start]):
                continue
            if _BOX_RE.match(run) and (boxed := _extract_boxed(run)):
                return boxed  # "last_expression" mode on a boxed answer: the box's content
            return run
        if span is None:
            break
        if _broken_span(span):
            pass  # "Answer $ \n 9 \n $": math meant, but not delimited on one line; not read (Math-Verify: none)
        elif (content := _span_text(span)) and not _negated(tail[: span.start()]):
            return content
        stretch_end = span.start()
    return None


def _broken_span(span: re.Match[str]) -> bool:
    """Whether a math span is inline (``$..$``, ``\\(..\\)``) but crosses a line: inline math is on one line."""
    content = span.group("d") if span.group("d") is not None else span.group("rb")
    return content is not None and "\n" in content


def _negated(before: str) -> bool:
    """Whether the text right before an expression denies it ("it is not", "isn't equal to")."""
    return _NEGATION_RE.search(before[-40:]) is not None


_EXTRACTORS = {
    "boxed": _extract_boxed,
    "answer_tag": _extract_answer_tag,
    "phrase": _extract_phrase,
    "last_expression": _extract_last_expression,
}


def extract_answer(completion: str, extraction: str = "auto", *, parts: int = 1) -> tuple[str, str] | None:
    """Find the final answer in ``completion``.

    Returns ``(answer, rule)`` where ``rule`` is the extraction rule that matched, or ``None``
    when no rule found an answer. ``extraction="auto"`` tries boxed, answer tag, phrase and last
    expression in that order. ``parts``: how many values the ground truth lists (see _extract_boxed).
    """
    if extraction not in EXTRACTION_MODES:
        raise ValueError(f"unknown extraction mode {extraction!r}; expected one of {EXTRACTION_MODES}")
    rules = EXTRACTION_MODES[1:] if extraction == "auto" else (extraction,)
    for rule in rules:
        answer = _extract_boxed(completion, parts) if rule == "boxed" else _EXTRACTORS[rule](completion)
        if answer and rule == "boxed" and extraction == "auto" and (stated := _final_answer_after_boxes(completion)):
            return stated, "phrase"  # "... \\boxed{255} ... Final Answer: The final answer is $10,455$."
        if answer:
            return answer, rule
    return None


def _final_answer_after_boxes(completion: str) -> str | None:
    """The answer of a "final answer" phrase that comes after the last box, or None: the box was a step."""
    last = None
    for last in _FINAL_PHRASE_RE.finditer(completion):  # noqa: B007 - we want the last match
        pass
    boxes = _boxes(completion)
    if last is None or not boxes or last.start() < boxes[-1][2]:
        return None
    return _extract_phrase(completion)


# --------------------------------------------------------------------------------------------
# Normalisation of the extracted strings (before Math-Verify sees them)
# --------------------------------------------------------------------------------------------

_DELIMS = (("$$", "$$"), ("\\[", "\\]"), ("\\(", "\\)"), ("$", "$"))
# Commands whose argument Math-Verify's normaliser treats as text: it rewrites \mathrm, \mathit, \mathbf, \textnormal,
# \textbf, \textit and \textrm to \text, then drops everything from the first \text{ to the end (see
# _text_hiding_math). The others here (\textsf, \texttt, \mathsf, \emph, ...) it cannot parse; they are text too.
_TEXT_MACRO = r"\\(?:text(?:normal|bf|it|rm|sf|tt|up)?|math(?:rm|it|bf|sf|tt)|mbox|emph)(?![A-Za-z])"
_TEXT_CMD_RE = re.compile(rf"{_TEXT_MACRO}\s*\{{([^{{}}]*)\}}")
_SCI_RE = re.compile(r"^(-?\d+(?:\.\d+)?)\s*[eE]\s*([+-]?\d+)$")
_MIXED_RE = re.compile(r"^(-?)(\d+)\s+(\d+)\s*/\s*(\d+)$")
_DECIMAL_COMMA_RE = re.compile(r"^-?\d+,(?:\d{1,2}|\d{4,})$")
_EURO_THOUSANDS_RE = re.compile(r"^-?\d{1,3}(?:\.\d{3})+(?:,\d+)?$")
_CHOICE_GOLD_RE = re.compile(r"^\(?([A-Z])\)?$")
_CHOICE_PRED_RE = re.compile(r"^[(\[]?([A-Za-z])(?:[)\].:]|\s|$)")
# Another choice letter after the answer's: a lone capital A-J not starting a formula ("(B) F = ma" is one).
_OTHER_CHOICE_RE = re.compile(r"(?<![A-Za-z\\])[A-J](?![A-Za-z0-9_^({]|\s*[=<>+*/^-])")
_TEXT_ANSWER_RE = re.compile(r"^[A-Za-z][A-Za-z \-']*$")
_MATH_WORDS = frozenset(
    [
        "sin",
        "cos",
        "tan",
        "cot",
        "sec",
        "csc",
        "log",
        "ln",
        "exp",
        "sqrt",
        "pi",
        "infty",
        "inf",
        "frac",
        "max",
        "min",
        "gcd",
        "lcm",
        "det",
        "arcsin",
        "arccos",
        "arctan",
        "sinh",
        "cosh",
        "tanh",
        "mod",
    ]
)


_UNESCAPED_DOLLAR_RE = re.compile(r"(?<!\\)\$")


def _strip_delims(s: str) -> str:
    """Remove math delimiters that enclose the whole string (repeatedly)."""
    s = s.strip()
    changed = True
    while changed and s:
        changed = False
        for left, right in _DELIMS:
            if len(s) >= len(left) + len(right) and s.startswith(left) and s.endswith(right):
                inner = s[len(left) : -len(right)]
                # "$a$ and $b$" is not one enclosed span ("$\\$5$" is: an escaped dollar sign).
                if left == "$" and _UNESCAPED_DOLLAR_RE.search(inner):
                    continue
                s = inner.strip()
                changed = True
                break
    return s


_SQRT_PAREN_RE = re.compile(r"\\sqrt\s*\(")


def _replace_sqrt_parens(s: str) -> str:
    r"""Rewrite ``\sqrt(x)`` to ``\sqrt{x}``: latex2sympy turns it into ``\\sqrt{x}`` (#41)."""
    out: list[str] = []
    i = 0
    while True:
        m = _SQRT_PAREN_RE.search(s, i)
        if not m:
            out.append(s[i:])
            return "".join(out)
        depth = 0
        j = m.end() - 1
        close = None
        while j < len(s):
            if s[j] == "(":
                depth += 1
            elif s[j] == ")":
                depth -= 1
                if depth == 0:
                    close = j
                    break
            j += 1
        if close is None:
            out.append(s[i:])
            return "".join(out)
        out.append(s[i : m.start()] + "\\sqrt{" + s[m.end() : close] + "}")
        i = close + 1


_PLAIN_FUNC_RE = re.compile(r"(?<![\\A-Za-z])(sqrt|pi|infty)(?![A-Za-z])")
_UNICODE_SQRT_RE = re.compile(r"\u221a\s*(\d+(?:\.\d+)?|[A-Za-z])")
_UNICODE_MATH = str.maketrans(
    {
        "\u221e": "\\infty ",
        "\u03c0": "\\pi ",
        "\u2212": "-",
        "\u00b0": "^{\\circ}",
        "\u00bd": "\\frac{1}{2}",
        "\u2153": "\\frac{1}{3}",
        "\u2154": "\\frac{2}{3}",
        "\u00bc": "\\frac{1}{4}",
        "\u00be": "\\frac{3}{4}",
    }
)
# "x \\text{ или } y", "2或3": other languages' "or" between a list's items (Math-Verify reads "\\text{ or }" itself).
_OR_TEXT_RE = re.compile(rf"{_TEXT_MACRO}\s*\{{\s*,?\s*(?:{_OR_WORD})\s*\}}|\s*(?:{'|'.join(_OR_WORDS_CJK)})\s*",
                         re.IGNORECASE)
_AND_OR_RE = re.compile(rf"(?<![{{\s])(?:\s*,)?\s+(?:and|{'|'.join(_OR_WORDS_ALPHA + _OR_WORDS_SPACED)})\s+(?!\}})",
                        re.IGNORECASE)
_TEXT_NUMBER_RE = re.compile(rf"{_TEXT_MACRO}\s*\{{\s*(-?\d[\d,]*(?:\.\d+)?)([^{{}}\d]*)\}}")
# 0.\overline{3}, 1.2\overline{45}, also written \overline{3} after "0." with a space
_REPEATING_RE = re.compile(r"(-?)(\d{0,30})\.(\d{0,30})\s*\\(?:overline|bar|dot)\s*\{\s*(\d{1,30})\s*\}")
# Commands that only space or style what follows them, with no value (Math-Verify drops or ignores them).
_SPACE_CMD = (r"(?:\s|~|(?<!\\)\\[,;: ]|\\(?:q?quad|(?:neg)?(?:thin|med|thick)space|displaystyle|textstyle)(?![A-Za-z])"
            r"|\\hspace\*?\s*\{[^{}]*\})")
_SPACED_THOUSANDS_RE = re.compile(r"^-?\d{1,3}(?:(?:\\[,!; ]|\{,\}|~|\s)\d{3})+(?:\.\d+)?$")
_INNER_THOUSANDS_RE = re.compile(r"(?<![\d.^_{])\d{1,3}(?:(?:\\[,!]|\{,\})\d{3})+(?![\d])")
_EMPTY_TEXT_RE = re.compile(rf"{_TEXT_MACRO}\s*\{{\s*\}}")
_PHANTOM_RE = re.compile(r"\\[hv]?phantom\s*(?=\{)")
# Words that change the value of the number before them ("2 \text{ thousand}", "1.5 million"): read as their value,
# where Math-Verify's normaliser dropped them as a unit (2 thousand was paid as 2). "percent" is Math-Verify's own.
_SCALE_WORDS = {
    "hundred": "\\times 10^{2}", "thousand": "\\times 10^{3}", "million": "\\times 10^{6}",
    "billion": "\\times 10^{9}", "trillion": "\\times 10^{12}", "quadrillion": "\\times 10^{15}",
    "lakh": "\\times 10^{5}", "crore": "\\times 10^{7}", "dozen": "\\times 12",
    "squared": "^{2}", "cubed": "^{3}",
}
_SCALE_WORD = "|".join(_SCALE_WORDS)
_SCALE_WORDS_RUN = rf"(?:{_SCALE_WORD})s?(?:\s+(?:{_SCALE_WORD})s?)*(?![A-Za-z])"  # "2 hundred thousand"
_SCALE_WORD_RE = re.compile(
    rf"(?<=[\d}}]){_SPACE_CMD}*(?:{_TEXT_MACRO}\s*\{{\s*(?P<in_text>{_SCALE_WORDS_RUN})(?P<rest>[^{{}}]*)\}}"
    rf"|(?P<plain>{_SCALE_WORDS_RUN}))",
    re.IGNORECASE,
)
# One elsewhere in a text ("2 \text{ (in thousands)}", "\text{ dollars, in millions}"): refused, its reading unsure.
# Not "squared" or "cubed" there: after a unit they are its power ("12 \text{ cm squared}" is 12).
_MAGNITUDE_WORD = "|".join(word for word in _SCALE_WORDS if word not in ("squared", "cubed"))
_SCALE_IN_TEXT_RE = re.compile(rf"{_TEXT_MACRO}\s*\{{[^{{}}]*?\b(?:{_MAGNITUDE_WORD})s?\b[^{{}}]*\}}", re.IGNORECASE)
_SCALE_TOKEN_RE = re.compile(rf"(?:{_SCALE_WORD})s?", re.IGNORECASE)
_BOLD_LETTER_RE = re.compile(r"\\(?:mathbf|boldsymbol|bm)\s*\{\s*([A-Za-z])\s*\}")
# The imaginary unit set upright (ISO 80000-2: "\mathrm{i}") or dotless ("\imath"): the letter i.
_UPRIGHT_I_RE = re.compile(r"\\(?:math(?:rm|it)|text(?:rm|up|normal)?|operatorname)\s*\{\s*i\s*\}|\\imath(?![A-Za-z])")
# Euler's number set upright ("\mathrm{e}^2", as ISO 80000-2 and many textbooks write it): the letter e.
_UPRIGHT_E_RE = re.compile(r"\\(?:math(?:rm|it)|text(?:rm|up|normal)?|operatorname)\s*\{\s*e\s*\}")
# Commands that only style what follows them ("\bf 42", "\large 42", "\color{red}42") or their argument
# ("\underline{42}", "\boldsymbol{42}", "\textcolor{red}{42}"), with no value: latex2sympy could not parse them.
# A bold letter stays a vector's symbol (_BOLD_LETTER_RE runs first).
_STYLE_SWITCH_RE = re.compile(
    r"\\(?:bf|it|rm|sf|tt|sl|sc|em|normalfont|tiny|scriptsize|footnotesize|small|normalsize|large|Large|LARGE"
    r"|huge|Huge)(?![A-Za-z])|\\color\s*\{[A-Za-z!0-9]{0,40}\}")
_STYLE_WRAPPER_RE = re.compile(r"\\(?:underline|boldsymbol|bm|textcolor\s*\{[A-Za-z!0-9]{0,40}\})\s*(?=\{)")
# Other spellings of symbols latex2sympy reads: "\textdollar" is "\$", "\degree" (gensymb) is "^\circ".
_TEXT_DOLLAR_RE = re.compile(r"\\textdollar(?![A-Za-z])")
_DEGREE_RE = re.compile(r"\\degree(?![A-Za-z])")


_PERCENT_WORD_RE = re.compile(
    rf"(?<=[\d}}]){_SPACE_CMD}*(?:{_TEXT_MACRO}\s*\{{\s*(?:percent(?:age)?|per\s*cent|pct)\s*\}}"
    r"|(?:percent(?:age)?|per\s*cent|pct)(?![A-Za-z]))",
    re.IGNORECASE,
)


def _scale_word_value(m: re.Match[str]) -> str:
    """``\\times 10^{3}`` for " thousand", keeping the rest of its text ("thousand dollars") as a unit."""
    words = (m.group("in_text") or m.group("plain")).lower().split()
    rest = (m.group("rest") or "").strip()
    value = "".join(f" {_SCALE_WORDS[w if w in _SCALE_WORDS else w[:-1]]}" for w in words)
    return value + (f" \\text{{ {rest}}}" if rest else "")


def _drop_phantoms(s: str) -> str:
    """``s`` without ``\\phantom{..}``, ``\\hphantom{..}``, ``\\vphantom{..}`` and their (invisible) arguments."""
    while m := _PHANTOM_RE.search(s):
        close = _match_brace(s, m.end())
        if close is None:
            return s
        s = s[: m.start()] + " " + s[close + 1 :]
    return s


def _repeating_to_frac(m: re.Match[str]) -> str:
    r"""``0.1\overline{6}`` -> ``\frac{1}{6}`` (exact value of a repeating decimal)."""
    sign, whole, fixed, rep = m.group(1), m.group(2) or "0", m.group(3), m.group(4)
    k, r = len(fixed), len(rep)
    # x = whole.fixed(rep)(rep)...  ->  x * 10^k * (10^r - 1) = (whole fixed rep) - (whole fixed)
    num = int(whole + fixed + rep) - int(whole + fixed)
    den = (10**r - 1) * 10**k
    g = _pymath.gcd(num, den)
    return f"{sign}\\frac{{{num // g}}}{{{den // g}}}"


def _normalize(s: str, *, single_number_gold: bool) -> str:
    """Rewrite notations Math-Verify misreads; keeps everything else for its own normaliser."""
    # Runs of whitespace mean one space in LaTeX; the parser is slow on long ones.
    s = _strip_delims(re.sub(r"\s+", " ", s))
    boxed = _extract_boxed(s)
    if boxed is not None and _BOX_RE.match(s.lstrip("$ ")):
        s = _strip_delims(boxed)
    # A sentence-final period ("5.") is not part of the answer; a decimal point is followed by
    # digits so it is unaffected.
    s = re.sub(r"(?<=[\w}\)\]])\.$", "", s).strip()
    # Plain-text spellings of LaTeX commands: "2 sqrt(3)", "2pi" (latex2sympy reads p*i).
    s = _PLAIN_FUNC_RE.sub(lambda m: "\\" + m.group(1) + ("" if m.group(1) == "sqrt" else " "), s)
    s = s.replace("\\varnothing", "\\emptyset")
    # Unicode math that latex2sympy does not read: "2√3", "√(x+1)", "∞", "½".
    s = _UNICODE_SQRT_RE.sub(r"\\sqrt{\1}", s).replace("\u221a", "\\sqrt")
    s = s.translate(_UNICODE_MATH)
    # Invisible: "2\phantom{3}" shows 2 (latex2sympy read 2 + 3); an empty text is a space ("2\text{ }3" was 23).
    s = _EMPTY_TEXT_RE.sub(" ", _drop_phantoms(s))
    # "2 and 3", "x = 2 or x = 3": a list of answers (Math-Verify reads "\\text{ and }" itself).
    s = _AND_OR_RE.sub(", ", _OR_TEXT_RE.sub(", ", s))
    # "\text{5 cm}": the number inside the text is the value, the rest a unit.
    s = _TEXT_NUMBER_RE.sub(lambda m: m.group(1) + (f"\\text{{ {u}}}" if (u := m.group(2).strip()) else ""), s)
    s = _SCALE_WORD_RE.sub(_scale_word_value, s)
    # "50 \text{ percent}" is 50%: set aside as a unit, it was 50 (paid for 50, refused for 0.5).
    s = _PERCENT_WORD_RE.sub(r"\\%", s)
    # "2\mathbf{i} + 3\mathbf{j}": a bold letter is a vector's symbol, not text (it was read as 2).
    s = _BOLD_LETTER_RE.sub(r" \1 ", s)
    # "1+2\mathrm{i}": the normaliser drops a text command and all after it (it was read as 1 + 2, and paid 3).
    s = _UPRIGHT_I_RE.sub(" i ", s)
    s = _UPRIGHT_E_RE.sub("{e}", s)  # braced: "\frac{1}{ e }", spaces on both sides, did not parse
    s = _STYLE_WRAPPER_RE.sub("", _STYLE_SWITCH_RE.sub(" ", s))
    s = _DEGREE_RE.sub(r"^\\circ", _TEXT_DOLLAR_RE.sub(r"\\$", s))
    s = _units_before_more_math(s)
    s = _replace_sqrt_parens(s)
    s = _REPEATING_RE.sub(_repeating_to_frac, s)
    if _SPACED_THOUSANDS_RE.match(s):
        # "1\,000", "1 000", "1{,}000": SI-style thousands separators.
        s = re.sub(r"\\[,!; ]|\{,\}|~|\s", "", s)
    else:
        # Within a longer answer only the unambiguous separators ("x = 1\,000", "1\,000 \text{ m}" were 1 + 000).
        s = _INNER_THOUSANDS_RE.sub(lambda m: re.sub(r"\\[,!]|\{,\}", "", m.group(0)), s)
    compact = s.replace(" ", "") if re.fullmatch(r"[-\d ,.eE+]+", s) else s
    # A comma and a space separate list items ("2, 5", and "2 or 5" rewritten above): never a
    # decimal comma, or a hedged "2 or 5" would be the single number 2.5.
    listed = bool(re.search(r",\s", s))
    if m := _SCI_RE.match(compact):
        s = f"{m.group(1)}\\times 10^{{{m.group(2)}}}"
    elif m := _MIXED_RE.match(s):
        s = f"{m.group(1)}{m.group(2)}\\frac{{{m.group(3)}}}{{{m.group(4)}}}"
    elif single_number_gold and not listed and _DECIMAL_COMMA_RE.match(compact):
        # "3,5" is 3.5 in much of the world; "1,234" stays a thousands separator.
        s = compact.replace(",", ".")
    elif (
        single_number_gold
        and not listed
        and _EURO_THOUSANDS_RE.match(compact)
        and ("," in compact or compact.count(".") >= 2)
    ):
        # "1.234,5" / "1.234.567": dots as thousands separators (a lone "1.234" stays decimal).
        s = compact.replace(".", "").replace(",", ".")
    return s


# A unit written in symbols after a number, outside \text{}: "10 m/s", "9.8 m/s^2", "12 m²", "100 N", "3 kN·m". The
# normaliser reads one-letter symbols as variables ("10 m/s" is 10m/s), so a number alone as the ground truth never
# matched (Math-Verify's own plain-text rule takes the number). Only symbols of SI units (with their prefixes) and a
# few common others: "2 x" is not 2.
_UNIT_SYMBOL = r"(?:[kcmnpGMµμ]?(?:mol|Hz|Pa|eV|Wh|cal|bar|Ω|[msgNJWVAL])|K|h|min|mph|ft|mi|lb|oz|yd|°[CF])"
_UNIT_POWER = r"(?:\^\{?-?\d\}?|[²³])?+"
_UNIT_SPACE = r"(?:\s|\\[,;:! ]|~)"  # "9.8\,m/s^2"
_UNIT_SEPARATOR = rf"(?:{_UNIT_SPACE}*+(?:[/·*]|\\cdot(?![A-Za-z])){_UNIT_SPACE}*+|{_UNIT_SPACE}++)"
_NUMBER_WITH_UNIT_RE = re.compile(
    rf"\s*+(?P<number>-?(?:\d{{1,3}}(?:,\d{{3}})++|\d++)(?:\.\d++)?+){_UNIT_SPACE}*+"
    rf"{_UNIT_SYMBOL}{_UNIT_POWER}(?:{_UNIT_SEPARATOR}{_UNIT_SYMBOL}{_UNIT_POWER})*+\s*+\.?\s*"
)
# The same unit after a number in plain text, up to the end of the unit: not a letter, a digit or a "(" after it
# ("2 min(a, b)" is not minutes).
_PLAIN_UNIT_RE = re.compile(
    rf"{_UNIT_SYMBOL}{_UNIT_POWER}(?:{_UNIT_SEPARATOR}{_UNIT_SYMBOL}{_UNIT_POWER})*(?![A-Za-z\d(])"
)
# A residue with its modulus: "x \equiv 2 \pmod{5}", "2 \pmod 5", "x \equiv 2 (\bmod 5)".
_RESIDUE_RE = re.compile(
    r"\s*+(?:[A-Za-z]\s*+\\equiv(?![A-Za-z]))?\s*+(?P<number>-?\d++)\s*+"
    r"(?:\\pmod\s*+(?:\{\s*+\d++\s*+\}|\d++)|\(\s*+\\(?:bmod|mod)(?![A-Za-z])\s*+\d++\s*+\))\s*+\.?\s*"
)


def _number_without_unit(answer: str) -> str | None:
    """The number of an answer that is a number with a unit in symbols, or a residue with its modulus; else None."""
    match = _NUMBER_WITH_UNIT_RE.fullmatch(answer) or _RESIDUE_RE.fullmatch(answer)
    return match.group("number") if match else None


# A text block with a number after its first word: "\text{ and 3}", "\mathrm{ (maybe 3)}". (One that starts with
# its number, "\text{5 cm}", is that number with a unit: _TEXT_NUMBER_RE; a unit's power, "\mathrm{cm^3}", is not one.)
_TEXT_WITH_NUMBER_RE = re.compile(rf"{_TEXT_MACRO}\s*\{{\s*[^{{}}\d\s](?:[^{{}}\d]|\^\d)*(?<!\^)\d[^{{}}]*\}}")
# A unit in text ("\text{ cm}", "\text{ m}^2", "\mathrm{~m}", "\mathrm{m/s^2}"), and more math after one: the normaliser
# would drop it with everything after ("3 \text{ m} = 2 \text{ m}" was read as 3, "2\text{ cm}, 3\text{ cm}" and
# "2\text{ m} - 7\text{ m}" as 2). Right after a number, and not a word that joins ("x = 2 \text{ or } x = 3",
# "x^2 \text{ for } x > 0").
_UNIT_TEXT_RE = re.compile(
    rf"(?:(?<=[\d}})])|(?<=\\pi)){_SPACE_CMD}*{_TEXT_MACRO}\s*\{{"
    r"(?!\s*(?:or|and|for|if|when|where|with|is|so|then|else|otherwise|such|as|since|because|given|at|on|to|but)\b)"
    r"(?:\s|~|\\[,;:! ])*[A-Za-z](?:[A-Za-z/ ~.\u00b7]|\\[,;:! ]|\^\{?-?\d\}?){0,24}\}(?:\^\d|\^\{\d\})?",
    re.IGNORECASE,
)
# What may follow a unit that is set aside: an operator, a relation, a separator, a closing bracket, a text, the end.
_UNIT_FOLLOWER_RE = re.compile(
    rf"{_SPACE_CMD}*(?:$|[-=<>+*/,;:.!|&^)\]}}\u00d7\u00f7\u00b7\u2212\u2264\u2265\u2260\u2248]"
    r"|\\(?:times|cdot|div|pm|mp|le|ge|leq|geq|lt|gt|ne|neq|approx|sim|equiv|to|right|end|text|mbox|math[a-z]*)"
    r"(?![A-Za-z])|\\[\\}%])"
)
# A text block that Math-Verify's normaliser turns into a list's comma ("\text{ and }", "\text{or}"), not drops.
_JOINER_TEXT_RE = re.compile(rf"{_TEXT_MACRO}\s*\{{\s*,?\s*(?:and|{_OR_WORD})\s*\}}", re.IGNORECASE)
# Between text blocks, what is not math: spacing, a unit's power, punctuation.
_NOT_MATH_RE = re.compile(r"\s+|~|\\[,;:! ]|\\q?quad(?![A-Za-z])|\^\s*\{?\s*-?\d\s*\}?|[.,;:!?]")


def _math_after(s: str) -> bool:
    """Whether ``s`` holds math: anything but text blocks, spacing, a unit's power and punctuation."""
    return bool(_NOT_MATH_RE.sub("", _TEXT_CMD_RE.sub("", s)))


def _units_before_more_math(s: str) -> str:
    """``s`` without its units in text when more math follows the first one, so that all of it is judged.

    A unit followed by another operand ("2 \\text{ m} 7 \\text{ m}", "3 \\text{ hours } 20 \\text{ minutes}") stays:
    set aside, it would leave two numbers side by side, which latex2sympy adds; _text_hiding_math refuses it.
    """
    first = _UNIT_TEXT_RE.search(s)
    if first is None or not _math_after(s[first.end() :]):
        return s
    return _UNIT_TEXT_RE.sub(lambda m: " " if _UNIT_FOLLOWER_RE.match(s, m.end()) else m.group(0), s)


# A text block that introduces a condition on the answer, and the relations a condition is made of.
_CONDITION_TEXT_RE = re.compile(r"\s*(?:,\s*)?(?:for|if|when|where|with|provided(?:\s+that)?)\s*(?:all\s*)?",
                                re.IGNORECASE)
# What cannot be inside one operand of a condition: spacing, separators, an alignment or a line break.
_NOT_ONE_TERM_RE = re.compile(r"\s|[;&~]|\\\\|\\[,;:! ]|\\q?quad(?![A-Za-z])")
_CONDITION_RELATION_RE = re.compile(r"[<>]|\\(?:[lg]eq?(?:slant)?|[lg]t|neq?|(?:not)?in)(?![A-Za-z])")


def _text_hiding_math(s: str) -> str | None:
    """The text block that Math-Verify's normaliser would drop together with the math after it, or ``None``.

    The normaliser drops everything from the first text block (``\\text``, ``\\mathrm``, ``\\textbf``, ...; not a
    joining "and"/"or") to the end, unless nothing would be left: "2 \\text{ maybe } 3 \\text{ m}" was 2. Units
    right after numbers are set aside before this (_units_before_more_math); a label first ("\\text{Area} = 25")
    is kept by the normaliser.
    """
    for m in _TEXT_CMD_RE.finditer(s):
        if _JOINER_TEXT_RE.fullmatch(m.group(0)):
            continue
        if _math_after(s[: m.start()]) and _math_after(s[m.end() :]):
            return m.group(0)
        return None
    return None


def _without_condition(s: str) -> str:
    """``s`` without a condition at its end: "x^2 \\text{ for } x > 0" is x^2 (Math-Verify read a product of letters).

    Only inequalities and memberships after "for", "if", "when", "where" or "with" are a condition: "5 \\text{ for }
    x = 3" may say where to evaluate, and "5 \\text{ if } x < 0, 7" hides a second answer (both stay refused).
    """
    for m in _TEXT_CMD_RE.finditer(s):
        if _CONDITION_TEXT_RE.fullmatch(m.group(1)) and _only_conditions(s[m.end() :]) and s[: m.start()].strip():
            return s[: m.start()].rstrip().rstrip(",").rstrip()
    return s


def _only_conditions(s: str) -> bool:
    """Whether ``s`` is only inequalities or memberships, comma-separated: "x > 0", "x \\ne 1, y \\in S"."""
    if _TEXT_CMD_RE.search(s) or not s.strip():
        return False
    for part in s.split(","):
        part = re.sub(r"[<>!]=", "<", part)  # "<=", ">=", "!=": relations, no equality
        if "=" in part:
            return False  # "x = 3" may say where to evaluate
        operands = _CONDITION_RELATION_RE.split(part)
        if len(operands) < 2:
            return False  # a part without a relation is another answer
        for operand in operands:
            term = re.sub(r"\s*([-+*/^])\s*", r"\1", operand.strip())
            if not term or _NOT_ONE_TERM_RE.search(term):
                return False  # "n > 2 \\quad 5", "n > 2; 5": a value beside the bound
    return True


# Two numbers with only spacing between them, which latex2sympy adds ("2 \quad 3" and "2\,3" were 5): two answers,
# or a garbled one. SI thousands ("1\,000") are joined by _normalize first; a mixed number ("3 1/2") is one number,
# and a subscript or an exponent is not a number beside the next one ("\log_2 8").
_SIDE_BY_SIDE_RE = re.compile(rf"(?<![\d.^_])(?<![_^]\{{)\d+(?:\.\d+)?\}}*{_SPACE_CMD}+\{{*\.?\d(?!\d*\s*/\s*\d)")
# A numeral with its base ("1011_2", "1011_{2}", "(1011)_{(2)}", "2A_{16}", "1011_{\text{two}}"): Math-Verify drops
# the subscript, so 1011_3 was paid against 1011_2.
_BASE_NUMERAL_RE = re.compile(
    r"(?<![A-Za-z\d.\\])(?:\d[\dA-Z]*|\(\s*\d[\dA-Z]*\s*\)|\{\s*\d[\dA-Z]*\s*\})"
    r"\s*_\s*(?:\{([^{}]*(?:\{[^{}]*\}[^{}]*)*)\}|([\dA-Za-z]))"
)
_BASE_NAMES = {
    "two": "2", "binary": "2", "three": "3", "four": "4", "five": "5", "six": "6", "seven": "7", "eight": "8",
    "octal": "8", "nine": "9", "ten": "10", "decimal": "10", "twelve": "12", "sixteen": "16", "hex": "16",
    "hexadecimal": "16",
}


def _bases(s: str) -> set[str]:
    """The bases of the numerals in ``s``: "2" for ``1011_{2}``, ``1011_{(2)}`` and ``1011_{\\text{two}}``."""
    found = set()
    for m in _BASE_NUMERAL_RE.finditer(s):
        base = re.sub(r"\\[A-Za-z]+|[^\dA-Za-z]", "", m.group(1) if m.group(1) is not None else m.group(2)).lower()
        found.add(_BASE_NAMES.get(base, base.lstrip("0") or "0"))
    return found


def _unwrap_text(s: str) -> str:
    prev = None
    while prev != s:
        prev = s
        s = _TEXT_CMD_RE.sub(r"\1", s)
    return s


def _choice_letter(s: str, *, gold: bool) -> str | None:
    t = _strip_delims(_unwrap_text(s)).strip().rstrip(".").strip()
    t = re.sub(r"^(?:option|choice)\s+", "", t, flags=re.IGNORECASE)
    m = (_CHOICE_GOLD_RE if gold else _CHOICE_PRED_RE).match(t)
    if m and not gold and _OTHER_CHOICE_RE.search(t, m.end(1)):
        return None  # "A and B", "(A)(B)", "A. B.": several choices, not one (it paid the first)
    return m.group(1).upper() if m else None


def _as_text(s: str) -> str:
    t = _unwrap_text(_strip_delims(s)).replace("\\ ", " ").replace("~", " ").replace("\\,", " ")
    t = re.sub(r"\s+", " ", t).strip().strip(".!?;:,\"'").strip()
    return t.lower()


def _is_text_answer(gold: str) -> bool:
    """Gold answers made of words ("Paris", "\\text{no solution}") are compared as text."""
    unwrapped = _strip_delims(_unwrap_text(gold)).strip().rstrip(".")
    if not _TEXT_ANSWER_RE.match(unwrapped):
        return False
    words = re.findall(r"[A-Za-z]+", unwrapped)
    had_text_cmd = bool(_TEXT_CMD_RE.search(gold))
    return had_text_cmd or any(len(w) >= 3 and w.lower() not in _MATH_WORDS for w in words)


# Operators that state a computation instead of its result. Math-Verify evaluates them, so a
# policy could copy the question ("compute the integral ...") into its box and be paid for it.
_SPACING = r"(?:\\[,;:! ]|\\[qm]?quad|\s)*"  # one way to match each run: no backtracking
_D = r"(?:d|\\mathrm\s*\{\s*d\s*\})"  # \partial: refused wherever it stands (first line below)
_UNEVALUATED_RE = re.compile(
    # No lookahead after \int: latex2sympy reads `\intx^{2}dx` as an integral too.
    r"\\[iot]*int|\\(?:sum|prod|lim(?:sup|inf)?|max|min|gcd|lcm|partial|det|[bp]?mod|l?floor|l?ceil)(?![a-zA-Z])"
    r"|\\(?:operatorname|mathrm|text)\s*\{\s*(?:lcm|gcd|max|det|tr|trace|rank|norm|rref|mod|floor|ceil)\s*\}"
    # "min" in text is minutes ("30 \text{ min}") unless its arguments follow.
    r"|\\(?:operatorname|mathrm|text)\s*\{\s*min\s*\}(?=\s*(?:\(|\[|\{|_|\\left|\\\{))"
    # d/dx in its spellings: \frac{d}{dx}, \tfrac{d}{dx}(x^2), \frac{\,d}{dx}x^3, \frac{d(x^2)}{dx},
    # \frac{d x^{3}}{dx}, \frac{d^2 y}{d x^2}, \frac{d}{d\theta}, \frac{\mathrm{d}}{\mathrm{d}x}
    rf"|\\[dtc]?frac\s*\{{{_SPACING}{_D}(?:[^{{}}]|\{{[^{{}}]*\}})*\}}"
    rf"\s*\{{{_SPACING}{_D}\s*(?:\\[a-zA-Z]+|[a-zA-Z])(?:[^{{}}]|\{{[^{{}}]*\}})*\}}"
    # a determinant's bars, a transpose, an evaluation bar (`\Big|_{x=3}`)
    r"|\\begin\s*\{\s*vmatrix\s*\}|\^\s*\{?\s*(?:T|\\top|\\intercal)\s*\}?(?![a-zA-Z])"
    r"|\|\s*_\s*\{?\s*\\?[a-zA-Z]+\s*="
    "|[\u222b-\u2233\u2211\u220f\u2202]"  # the Unicode integrals, sum, product, partial
)


# Where a ground truth is itself a list or several values ("\\pm 1"), "or" in an answer is a list.
# (A text ground truth with one of the words: "Tai Chi" has Finnish "or" in it, and is not refused as a hedge.)
_LIST_GOLD_RE = re.compile(
    rf",|;|(?<![\\a-zA-Z])and(?![a-zA-Z])|{_OR_WORD}|\\(?:vee|lor|cup|pm|mp)(?![a-zA-Z])|[\u00b1\u2213]",
    re.IGNORECASE)


def _top_level(s: str) -> str:
    """``s`` without what its brackets hold: "(1, 2)" is one value, a point, where "1, 2" is a list."""
    out, depth = [], 0
    for c in s:
        if c in "([":
            depth += 1
        elif c in ")]" and depth:
            depth -= 1
        elif not depth:
            out.append(c)
    return "".join(out)


def _hedge(answer: str, gold: str) -> str | None:
    """The word offering an alternative in ``answer`` when ``gold`` is one value, or ``None``."""
    if _LIST_GOLD_RE.search(_top_level(gold)):
        return None  # "2 or 3" may be how the answer lists "2, 3" ("(1, 2) or (3, 4)" offers two points)
    m = _HEDGE_RE.search(answer)
    return m.group(0) if m else None


# A number past this many bits, or a power with such an exponent, is costly to evaluate (cos(3^{600000}) took 1.5 s
# to 30 digits): a function of one only matches the same expression (see _costly_function).
_MAX_COSTLY_BITS = 2_000


def _costly(expr: Any) -> bool:
    """Whether evaluating ``expr`` to 30 digits may take long: a number or a power past _MAX_COSTLY_BITS."""
    import sympy

    for atom in expr.atoms(sympy.Integer):
        if abs(int(atom)).bit_length() > _MAX_COSTLY_BITS:
            return True
    return any(power.exp.is_Number and abs(power.exp) > _MAX_COSTLY_BITS for power in expr.atoms(sympy.Pow))


def _costly_function(expr: Any) -> bool:
    """Whether ``expr`` applies a function (sin, log, ...) to an argument that :func:`_costly` finds."""
    import sympy

    try:
        return any(_costly(arg) for f in expr.atoms(sympy.Function) for arg in f.args)
    except (AttributeError, TypeError):  # not a sympy expression (a string, a set of them)
        return False


def _right_of_last_equals(s: str) -> str:
    """What follows the last "=" outside braces and brackets (``\\sum_{k=1}^4 k`` has none), or all of ``s``."""
    depth = 0
    for i in range(len(s) - 1, -1, -1):
        c = s[i]
        if c in ")]}":
            depth += 1
        elif c in "([{":
            depth -= 1
        elif c == "=" and depth == 0:
            return s[i + 1 :]
    return s


def _unevaluated_operator(s: str) -> str | None:
    """The first integral, sum, product, limit, derivative, max/min or gcd/lcm in ``s``, or ``None``."""
    m = _UNEVALUATED_RE.search(s)
    return m.group(0) if m else None


def _structure_problem(s: str) -> str | None:
    """Reason to refuse parsing ``s`` (too deeply nested), or ``None``; its length _judge checks first."""
    stack: list[tuple[bool, bool]] = []  # each open group: whether it is bare { ... } (not a command's argument),
    # and whether it is a subscript's
    bare = paren = max_bare = max_paren = subscript = 0
    prev = ""
    i = 0
    while i < len(s):
        c = s[i]
        if c == "\\" and i + 1 < len(s) and s[i + 1] in "{}":
            # \{ ... \} set braces are as ambiguous for the grammar as bare braces.
            bare += 1 if s[i + 1] == "{" else -1
            max_bare = max(max_bare, bare)
            i += 2
            prev = "}"
            continue
        if c == "{":
            is_bare = not (prev.isalpha() or prev in "}]^_")
            is_subscript = prev == "_"
            stack.append((is_bare, is_subscript))
            bare += is_bare
            subscript += is_subscript
            max_bare = max(max_bare, bare)
            if len(stack) > _MAX_TOTAL_DEPTH or subscript > _MAX_SUBSCRIPT_DEPTH:
                return "answer nested too deeply"
        elif c == "}" and stack:
            was_bare, was_subscript = stack.pop()
            bare -= was_bare
            subscript -= was_subscript
        elif c in "([":
            paren += 1
            max_paren = max(max_paren, paren)
        elif c in ")]":
            paren -= 1
        if not c.isspace():
            prev = c
        i += 1
    if max_bare > _MAX_BARE_BRACE_DEPTH or max_paren > _MAX_PAREN_DEPTH:
        return "answer nested too deeply"
    if sum(not m.group(1) for m in _BAR_RE.finditer(s)) > _MAX_BARS:
        return f"more than {_MAX_BARS} absolute-value bars"
    if _power_depth(s) > _MAX_POWER_DEPTH:
        return "exponents nested too deeply"
    return None


def _power_depth(s: str) -> int:
    """How deeply exponents nest in ``s``: 1 for ``x^2``, 3 for ``9^{9^{9^9}}`` and ``x^x^x^x``.

    Linear scan. An unbraced exponent is one token (``x^23`` is ``x^2 * 3``); a ``^`` right
    after an exponent token raises the tower (``x^x^x``), as latex2sympy reads it.
    """
    frames = [0]  # exponent depth inside each open group
    atom: int | None = None  # depth of the exponent token just read, if a "^" may follow it
    best = 0
    i, n = 0, len(s)
    while i < n:
        c = s[i]
        if c == "^":
            base = atom if atom is not None else frames[-1]
            j = i + 1
            while j < n and s[j].isspace():
                j += 1
            best = max(best, base + 1)
            if j < n and s[j] in "{([":
                frames.append(base + 1)
                atom = None
                i = j + 1
                continue
            if j < n and s[j] == "\\":
                j += 1
                while j < n and s[j].isalpha():
                    j += 1
                j = max(j, i + 3)  # \{ or \, and the like: one token either way
            else:
                j += 1
            atom = base + 1
            i = j
            continue
        if c in "{([":
            frames.append(frames[-1])
            atom = None
        elif c in "})]":
            if len(frames) > 1:
                frames.pop()
            atom = None
        elif not c.isspace():
            atom = None
        i += 1
    return best


# --------------------------------------------------------------------------------------------
# Math-Verify integration
# --------------------------------------------------------------------------------------------

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
    but ``\\sin(15^\\circ)`` was ``sin(15)``, fifteen radians, which paid ``\\sin 15`` and refused
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
        # ambiguous bars made LL's full-context prediction most of a parse: 20 nested |x| took 2.5 s, 0.24 s
        # in SLL, and the test suite's and the math benchmark's 3,142 answers parsed in 8.9 s instead of 19.7 s,
        # every tree the same (224 of them, x^2 among them, needed the fallback).
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
    ``e^{(e^{(e^{(e^{(e^{(2+1)}+1)}+1)}+1)}+1)}`` asked for ln 2 to 7e23 bits inside the parse,
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
        # relative one took 1000001.0 for 1000000 and 1.844674e19 for a
        # 20-digit count. Never looser than the relative one, though: near 0
        # an absolute 1e-6 took 0 for 0.0000005. (Exact irrationals keep the
        # precision: with the float tolerance, 2 + pi/10^7 was 2.)
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
            # ("5\\%" was paid for 5 and for 0.05).
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
    ``x^{1/3}+x^{1/5}+x^{1/7}=3`` or six ``|x-k|`` summed ran past 25 s (a red team's, against ``x=3``). The grader
    catches the refusal, as any failure to solve, and takes the relations for different.

    Nor is a relation in one unknown solved: sympy gives its solutions as a list of values, which the grader takes
    for a list of dicts, and fails on (an inequality's, a relational, it tries to iterate). So the solving only ever
    matched two relations without a real solution, equal or not: ``x^2=-4`` against ``x^2=-1`` was paid.
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
    (solving it set to 1 took 0.84 s). Where the unknown sits in a function, an exponent or a root: ``inf``.
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
    evaluation missed, and simplify on them is where untrusted answers spent their time:
    ``\\sin`` of ``\\sin`` ... of 2, 8 deep, took 10 s in ``exptrigsimp``. A difference within
    the margin (an exact zero written the long way, a float that rounds an integer) still goes on.

    Sides with symbols are evaluated at one fixed point (_SAMPLE_POINTS): an identity that
    simplify can prove holds wherever both sides are defined, so sides apart there are different.
    simplify spent 20 s and more on ``(x+1)^{5000}``, ``\\binom{x}{200}`` or ``(x+100)!`` against
    ``x+1``. The point is positive, where roots and logarithms take their real branches, so an
    identity that needs a positive unknown (``\\sqrt{x^2} = x``) is not refused here either.

    The real and imaginary parts are judged apart: one that evaluation resolves decides, whatever
    the other. ``(1+i)^{10000}`` is 2^5000, whose imaginary part comes back from evalf with no
    precision; left to simplify, sympy took 3 minus it for zero and paid it against any number.
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
                # (1-\\sqrt{2})^{30000} against 0 took simplify 8.6 s (an unresolved 0 has no bits).
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
    every sum that cancels, and again inside it, and took 130 s to 1000 digits on a product of sums of
    zeros nested 7 deep (0.003 s here).
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
    # Evaluated first: asking an unevaluated tower of fractions is_integer took 4 s at depth 13.
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
        # level compounds through a tower (2^{2^{2^2}} = 65536 was refused as too large).
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
    ``i`` was not ``\\sqrt{-1}``, ``1+i`` not ``\\frac{2}{1-i}``, ``e^{i\\pi}`` not ``-1``, and ``3+4 i``
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


# --------------------------------------------------------------------------------------------
# Public API
# --------------------------------------------------------------------------------------------


def _result(
    status: str, *, extracted: str = "", rule: str = "", parsed: str = "", gold: str = "", message: str = ""
) -> dict[str, str]:
    return {
        "status": status,
        "extracted_answer": _clip(extracted),
        "extraction": rule,
        "parsed_answer": _clip(parsed),
        "parsed_ground_truth": _clip(gold),
        "message": _clip(message),
    }


def verify(
    completion: str,
    ground_truth: str,
    *,
    extraction: str = "auto",
    float_tolerance: float = 1e-6,
) -> dict[str, str]:
    """Extract the final answer from ``completion`` and check it against ``ground_truth``.

    Args:
        completion: the model's full output.
        ground_truth: the reference answer (LaTeX, with or without ``$``/``\\boxed``, plain
            numbers, choice letters or text).
        extraction: ``"auto"`` (boxed, then ``<answer>`` tag, then answer phrase, then last
            math expression), or one of ``"boxed"``, ``"answer_tag"``, ``"phrase"``,
            ``"last_expression"`` to use only that rule.
        float_tolerance: tolerance used whenever either side is a decimal float: relative,
            but absolute against an integer (``1000001.0`` is not ``1000000``).

    Returns:
        A JSON-able dict with keys ``status`` (``"ok"``, ``"wrong_answer"`` or ``"no_answer"``),
        ``extracted_answer``, ``extraction`` (the rule that matched), ``parsed_answer``,
        ``parsed_ground_truth`` and ``message``; strings are truncated to ~1000 characters.

    Raises:
        ValueError: for an unknown ``extraction`` mode (a caller error, not a model error).
        MemoryError: where it reaches this function (the caller's memory limit). Math-Verify's
            own handlers turn most of them into "not equal" first.

    Never installs signal handlers or timeouts: it is safe in any thread or inside an event loop,
    and relies on the caller to kill it at the deadline.
    """
    completion = _plain_digits(completion if isinstance(completion, str) else str(completion))
    ground_truth = _plain_digits(ground_truth if isinstance(ground_truth, str) else str(ground_truth))

    gold = _gold_answer(ground_truth)
    found = extract_answer(completion, extraction, parts=_count_parts(gold) if len(gold) <= MAX_ANSWER_CHARS else 1)
    if found is None:
        return _result("no_answer", message=f"no answer found (extraction={extraction})")
    answer, rule = found

    token = _float_tolerance.set(float(float_tolerance))
    try:
        return _judge(answer, rule, gold)
    except RecursionError:
        return _result("wrong_answer", extracted=answer, rule=rule, message="answer nested too deeply")
    except MemoryError:
        # The caller's memory limit, which it reports as such (a math server: STATUS_MEMORY_LIMIT).
        raise
    except Exception as exc:  # a parser bug must cost the model the point, not crash the worker
        return _result(
            "wrong_answer", extracted=answer, rule=rule, message=f"could not compare: {type(exc).__name__}"
        )
    finally:
        _float_tolerance.reset(token)


# Decimal digits of other scripts (U+FF13 fullwidth 3, U+0663 Arabic-Indic, U+0969 Devanagari, U+1D7D1 mathematical
# bold: Unicode's Nd), which the parser does not read, and characters that show nothing, inside a number as anywhere
# ("1\u200b234"). Superscripts, Roman numerals and keycaps are not decimal digits and stay as they are.
_OTHER_DIGIT_RE = re.compile(r"(?![0-9])\d")
_ZERO_WIDTH_RE = re.compile("[\u200b\u200c\u200d\u2060\ufeff\u00ad]")


def _plain_digits(text: str) -> str:
    """``text`` with every decimal digit in ASCII and zero-width characters removed."""
    if text.isascii():
        return text
    return _OTHER_DIGIT_RE.sub(lambda m: str(unicodedata.digit(m.group(0))), _ZERO_WIDTH_RE.sub("", text))


_PERCENT_AFTER_BOX_RE = re.compile(r"\$?\s*(?:\\?%|\\text\s*\{\s*percent\s*\}|per\s*cent(?![A-Za-z]))",
                                  re.IGNORECASE)


def _gold_answer(ground_truth: str) -> str:
    """The answer a ground truth gives: its final boxes, read as a completion's are (``\\boxed{2} and \\boxed{3}``
    is "2, 3"; ``\\boxed{1} no no no \\boxed{2}`` is 2, as Math-Verify reads it), or all of it."""
    gold = _strip_delims(ground_truth)
    boxed = _extract_boxed(gold)
    if boxed is None:
        return gold
    # "... or $\\boxed{20}$ percent.": the gold is written as a percentage, its sign outside the box.
    percent = _PERCENT_AFTER_BOX_RE.match(gold, _boxes(gold)[-1][2])
    return _strip_delims(boxed) + ("\\%" if percent else "")


# Marks that the parser drops, each leaving a value the answer did not give (all four were paid for 2): a dangling
# operator ("2+", "2 \\cdot"), a sign as an exponent ("2^+", "2^{-}"), a prime on a number ("2'", "2^\\prime"), a
# question ("2 \\text{?}"). Allowed where the ground truth has one too ("x \\to 0^+").
_DECORATION_RE = re.compile(
    r"(?:[-+*/=<>^_]|\\(?:cdot|times|div|pm|mp|le|ge|leq|geq|neq?)(?![A-Za-z]))\s*$"
    r"|\^\s*(?:\{\s*[-+]\s*\}|[-+](?![\w\\{(]))|(?<=[\d)\]}])\s*(?:'|\^\s*\{?\s*\\prime(?![A-Za-z]))"
    "|[?\uff1f\u2753]"
)
# A ground truth that is one number with a decimal comma ("1,22", "0,111"), which a thousands grouping is not.
_GOLD_DECIMAL_COMMA_RE = re.compile(r"-?\d+,\d+")
_GOLD_THOUSANDS_RE = re.compile(r"-?[1-9]\d{0,2}(?:,\d{3})+")
_CLOCK_TIME_RE = re.compile(r"(\d{1,2}):(\d{2})(?::(\d{2}))?")


def _clock_time(s: str) -> tuple[int, ...] | None:
    """(hours, minutes, seconds) of a time of day written "12:00" or "9:05:30" (in ``$``, a box or text); else None."""
    m = _CLOCK_TIME_RE.fullmatch(_strip_delims(_unwrap_text(_strip_delims(s))).strip().rstrip("."))
    if m is None or int(m.group(1)) > 24 or int(m.group(2)) > 59 or int(m.group(3) or 0) > 59:
        return None
    return int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)


# An answer of more alternatives than this is refused without judging each.
_MAX_ALTERNATIVES = 4


def _each_alternative_matches(answer: str, rule: str, gold_raw: str) -> bool:
    """Whether every alternative an answer offers ("2 \\text{ or } 2", "\\frac{4}{2} or 2") matches the ground truth:
    alternatives that all say the same value are that value, not a hedge."""
    alternatives = _HEDGE_RE.split(_unwrap_text(answer))
    if not 2 <= len(alternatives) <= _MAX_ALTERNATIVES or not all(a.strip() for a in alternatives):
        return False
    return all(_judge(a.strip(), rule, gold_raw)["status"] == "ok" for a in alternatives)


def _judge(answer: str, rule: str, gold_raw: str) -> dict[str, str]:
    base: dict[str, str] = {"extracted": answer, "rule": rule}

    # Before any other look: unwrapping 20,000 nested \text{} took 30 s (each pass peels one level).
    for text, who in ((answer, "answer"), (gold_raw, "ground truth")):
        if len(text) > MAX_ANSWER_CHARS:
            return _result("wrong_answer", message=f"{who}: too long to parse ({len(text)} > {MAX_ANSWER_CHARS} chars)",
                           **base)
    if _GOLD_DECIMAL_COMMA_RE.fullmatch(gold_raw) and not _GOLD_THOUSANDS_RE.fullmatch(gold_raw):
        gold_raw = gold_raw.replace(",", ".")  # "1,22" is 1.22, "0,111" 0.111; "1,234" stays a thousand and more
    if (gold_time := _clock_time(gold_raw)) is not None:
        # "12:00": a time of day, not the ratio 12/0 (both sides read as zoo, and were unequal).
        ok = _clock_time(answer) == gold_time
        return _result("ok" if ok else "wrong_answer", parsed=answer, gold=gold_raw,
                       message="" if ok else "time differs", **base)
    if hedge := _hedge(_unwrap_text(answer), gold_raw):
        if _each_alternative_matches(answer, rule, gold_raw):
            return _result("ok", parsed=answer, gold=gold_raw, **base)  # "2 \\text{ or } 2": one value, twice
        return _result("wrong_answer", message=f"answer: offers alternatives ({hedge.strip()!r})", **base)
    if hidden := _TEXT_WITH_NUMBER_RE.search(answer):
        # Math-Verify's normaliser drops everything from a text to the end ("2 \text{ (maybe 3)}" was 2).
        return _result("wrong_answer", message=f"answer: a number inside text ({hidden.group(0)[:40]!r})", **base)

    # Multiple choice: a single capital letter as gold means "compare letters".
    if (gold_letter := _choice_letter(gold_raw, gold=True)) is not None:
        pred_letter = _choice_letter(answer, gold=False)
        ok = pred_letter == gold_letter
        return _result(
            "ok" if ok else "wrong_answer",
            parsed=pred_letter or "",
            gold=gold_letter,
            message="" if ok else "choice letter differs",
            **base,
        )

    # Text answers: compare normalised words, not products of single-letter symbols.
    if _is_text_answer(gold_raw):
        g, p = _as_text(gold_raw), _as_text(answer)
        ok = g == p
        return _result(
            "ok" if ok else "wrong_answer",
            parsed=p,
            gold=g,
            message="" if ok else "text answer differs",
            **base,
        )

    single_number_gold = bool(re.fullmatch(r"\s*-?[\d.,\s]+\s*", gold_raw)) and "," not in gold_raw
    if single_number_gold and (number := _number_without_unit(answer)) is not None:
        answer = number  # "10 m/s", "x \equiv 2 \pmod{5}" against a number alone
    for text, who in ((answer, "answer"), (gold_raw, "ground truth")):
        if problem := _structure_problem(text):
            return _result("wrong_answer", message=f"{who}: {problem}", **base)
    # Only what the answer gives counts: "\frac{dy}{dx} = 2x" and "\int_0^1 x^2 dx = \frac13" name what they evaluate
    # on the left of their last "=" (they were refused; Math-Verify scores them).
    if (operator := _unevaluated_operator(_right_of_last_equals(answer))) and not _unevaluated_operator(gold_raw):
        # The question restated: its value may be the ground truth, but nothing was solved.
        return _result("wrong_answer", message=f"answer: {operator.strip()} is left to evaluate", **base)

    gold_s = _normalize(gold_raw, single_number_gold=False)
    pred_s = _normalize(answer, single_number_gold=single_number_gold)
    gold_value, pred_value = _without_condition(gold_s), _without_condition(pred_s)
    if (gold_value == gold_s) != (pred_value == pred_s):
        # One side's condition is dropped, never both: two would be dropped unread ("x^2 for x < 0" paid for x > 0).
        gold_s, pred_s = gold_value, pred_value
    # Forms Math-Verify reads as less than they say; each is refused unless the ground truth has it too.
    if (hiding := _text_hiding_math(pred_s)) and not _text_hiding_math(gold_s):
        return _result("wrong_answer", message=f"answer: math after text ({hiding[:40]!r}) would be dropped", **base)
    if (side := _SIDE_BY_SIDE_RE.search(pred_s)) and not _SIDE_BY_SIDE_RE.search(gold_s):
        return _result("wrong_answer", message=f"answer: numbers side by side ({side.group(0)[:40]!r})", **base)
    # Against a ground truth without a base the digits decide: a base written there buys nothing over the digits
    # alone, and datasets leave it out of base-2 answers ("1011_2" against "1011" was refused).
    if (gold_bases := _bases(gold_s)) and (other_bases := _bases(pred_s) - gold_bases):
        return _result("wrong_answer", message=f"answer: a numeral in base {min(other_bases)!r}, not the ground "
                       "truth's", **base)
    if (scaled := _SCALE_IN_TEXT_RE.search(pred_s)) and not _SCALE_IN_TEXT_RE.search(gold_s):
        return _result("wrong_answer", message=f"answer: a scale word in text ({scaled.group(0)[:40]!r})", **base)
    if (decoration := _DECORATION_RE.search(pred_s)) and not _DECORATION_RE.search(gold_s):
        return _result("wrong_answer", message=f"answer: a mark the parser would drop ({decoration.group(0)!r})",
                       **base)

    gold_objs, pred_objs = _with_imaginary_unit(_mv_parse(gold_s), _mv_parse(pred_s))
    gold_str = _safe_str(gold_objs[0]) if gold_objs else gold_s
    pred_str = _safe_str(pred_objs[0]) if pred_objs else pred_s
    res = {"parsed": pred_str, "gold": gold_str, **base}

    if not gold_objs or not pred_objs:
        # Math-Verify's own fallback for unparsable input: exact string comparison.
        ok = gold_s.strip() == pred_s.strip() and bool(gold_s.strip())
        which = "ground truth" if not gold_objs else "answer"
        return _result(
            "ok" if ok else "wrong_answer", message="" if ok else f"could not parse {which}", **res
        )

    # Only a structurally identical answer can match a number too large to evaluate, or a function of one:
    # \cos(3^{600000}) fits, but reducing its argument by pi to 30 digits needs pi to a million bits (18 s in
    # evalf, and more in the grader's simplify).
    gold_big = any(_too_big(o) for o in gold_objs)
    pred_big = any(_too_big(o) for o in pred_objs)
    if gold_big or pred_big:
        unevaluable = "number too large to evaluate"
    elif any(_costly_function(o) for o in pred_objs + gold_objs):
        unevaluable = "function of a number too large to evaluate"
    elif any(_function_depth(o) > _MAX_FUNCTION_DEPTH for o in pred_objs + gold_objs):
        unevaluable = "functions nested too deeply to evaluate"
    else:
        unevaluable = ""
    if unevaluable:
        ok = gold_big == pred_big and any(g == p for g in gold_objs for p in pred_objs)
        return _result("ok" if ok else "wrong_answer", message="" if ok else unevaluable, **res)

    if _compare(gold_objs, pred_objs, _unknowns_in_order(gold_s)):
        return _result("ok", **res)
    return _result("wrong_answer", message="answer not equivalent to ground truth", **res)


def warm() -> None:
    """Import the math libraries and run representative verifications.

    The agent calls this once before its CRIU snapshot so that every forked worker starts with
    modules imported, the ANTLR grammar loaded and sympy's caches populated.
    """
    _load()
    samples = [
        ("The answer is $\\boxed{\\frac{1}{2}}$.", "0.5"),
        ("$\\boxed{\\{1, 2, 3\\}}$", "\\{3,2,1\\}"),
        ("\\boxed{[1, 2)}", "[1,2)"),
        (
            "\\boxed{\\begin{pmatrix}1 & 2\\\\ 3 & 4\\end{pmatrix}}",
            "\\begin{pmatrix}1&2\\\\3&4\\end{pmatrix}",
        ),
        ("Answer: x = 3", "3"),
        ("<answer>y = 2x + 1</answer>", "y=2x+1"),
        ("so we get 1,234 apples", "1234"),
        ("\\boxed{2\\sqrt{2}}", "\\sqrt{8}"),
        ("\\boxed{x \\le 2}", "(-\\infty, 2]"),
        ("\\boxed{50\\%}", "50"),
        ("\\boxed{\\text{Paris}}", "Paris"),
        ("\\boxed{(B)}", "B"),
    ]
    for completion, gold in samples:
        verify(completion, gold)


if __name__ == "__main__":  # pragma: no cover - manual check: python -m sandboxd.verifiers.math C G
    import json

    print(json.dumps(verify(sys.argv[1], sys.argv[2]), indent=2))
