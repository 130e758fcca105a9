"""Judging: :func:`verify`, the ordered rules that decide or refuse an answer before Math-Verify compares it, and
:func:`warm`."""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .extraction import _HEDGE_RE, _boxes, _count_parts, _extract_boxed, extract_answer
from .mathverify import (
    _clip,
    _compare,
    _float_tolerance,
    _function_depth,
    _load,
    _mv_parse,
    _safe_str,
    _too_big,
    _unknowns_in_order,
    _with_imaginary_unit,
)
from .normalisation import (
    _SCALE_IN_TEXT_RE,
    _SIDE_BY_SIDE_RE,
    _TEXT_WITH_NUMBER_RE,
    _as_text,
    _bases,
    _choice_letter,
    _costly_function,
    _hedge,
    _is_text_answer,
    _normalize,
    _number_without_unit,
    _right_of_last_equals,
    _structure_problem,
    _text_hiding_math,
    _unevaluated_operator,
    _unwrap_text,
    _without_condition,
)
from .notation import _strip_delims

#: Extracted answers (and ground truths) longer than this are rejected before parsing: no real
#: final answer is that long, and the LaTeX parser needs ~1.5 s per 1000 chars of a polynomial
#: (a 20 000-char sum of ``x^{2}`` terms takes ~30 s; at this limit it is ~6 s).
MAX_ANSWER_CHARS = 5_000
# Function applications nested deeper than this (\\log(\\log(... + 1) + 1)) only match the same
# tree: sympy's evalf re-evaluates a log's argument near 1, so the cost grows about 2.5 times a
# level (12 deep: about 30 s; 6 deep: 0.5 s, all of it parsing). No final answer nests 7 deep.
_MAX_FUNCTION_DEPTH = 6


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


# Marks that the parser drops, each leaving a value the answer does not give (all four are paid for 2): a dangling
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


@dataclass
class _Case:
    """One answer on its way through RULES: the strings as the rules before have left them, and what they found."""

    extracted: str  # the answer as extracted, which the result reports
    rule: str  # the extraction rule that found it
    answer: str  # the answer as the rules read it (a number without its unit, ...)
    gold_raw: str
    single_number_gold: bool = False
    gold_s: str = ""  # both sides normalised for Math-Verify
    pred_s: str = ""
    gold_objs: list[Any] = field(default_factory=list)  # ... and parsed
    pred_objs: list[Any] = field(default_factory=list)
    parsed: str = ""  # the parsed sides as the result shows them
    gold: str = ""

    def refuse(self, message: str) -> dict[str, str]:
        """The answer is wrong for ``message``, decided before Math-Verify parsed it."""
        return _result("wrong_answer", message=message, extracted=self.extracted, rule=self.rule)

    def decide(self, ok: bool, why_not: str, *, parsed: str, gold: str) -> dict[str, str]:
        """The verdict ``ok``, its message ``why_not`` where it is not, with the sides as they were compared."""
        return _result("ok" if ok else "wrong_answer", parsed=parsed, gold=gold, message="" if ok else why_not,
                       extracted=self.extracted, rule=self.rule)


#: What a rule gives: a verdict, which ends the judging, or None, to go on to the next rule (a rule that only
#: rewrites the case gives None).
_Verdict = dict[str, str] | None


def _too_long(case: _Case) -> _Verdict:
    # Before any other look: unwrapping 20,000 nested \text{} takes about 30 s (each pass peels one level).
    for text, who in ((case.answer, "answer"), (case.gold_raw, "ground truth")):
        if len(text) > MAX_ANSWER_CHARS:
            return case.refuse(f"{who}: too long to parse ({len(text)} > {MAX_ANSWER_CHARS} chars)")
    return None


def _gold_decimal_comma(case: _Case) -> _Verdict:
    # "1,22" is 1.22, "0,111" 0.111; "1,234" stays a thousand and more.
    if _GOLD_DECIMAL_COMMA_RE.fullmatch(case.gold_raw) and not _GOLD_THOUSANDS_RE.fullmatch(case.gold_raw):
        case.gold_raw = case.gold_raw.replace(",", ".")
    return None


def _clock_times(case: _Case) -> _Verdict:
    if (gold_time := _clock_time(case.gold_raw)) is not None:
        # "12:00": a time of day, not the ratio 12/0 (as ratios both read as zoo, which Math-Verify finds unequal).
        ok = _clock_time(case.answer) == gold_time
        return case.decide(ok, "time differs", parsed=case.answer, gold=case.gold_raw)
    return None


def _alternatives(case: _Case) -> _Verdict:
    if hedge := _hedge(_unwrap_text(case.answer), case.gold_raw):
        if _each_alternative_matches(case.answer, case.rule, case.gold_raw):
            return case.decide(True, "", parsed=case.answer, gold=case.gold_raw)  # "2 \\text{ or } 2": one value, twice
        return case.refuse(f"answer: offers alternatives ({hedge.strip()!r})")
    return None


def _number_inside_text(case: _Case) -> _Verdict:
    if hidden := _TEXT_WITH_NUMBER_RE.search(case.answer):
        # Math-Verify's normaliser drops everything from a text to the end ("2 \text{ (maybe 3)}" would be 2).
        return case.refuse(f"answer: a number inside text ({hidden.group(0)[:40]!r})")
    return None


def _choice_letters(case: _Case) -> _Verdict:
    # Multiple choice: a single capital letter as gold means "compare letters".
    if (gold_letter := _choice_letter(case.gold_raw, gold=True)) is not None:
        pred_letter = _choice_letter(case.answer, gold=False)
        return case.decide(pred_letter == gold_letter, "choice letter differs", parsed=pred_letter or "",
                           gold=gold_letter)
    return None


def _text_answers(case: _Case) -> _Verdict:
    # Text answers: compare normalised words, not products of single-letter symbols.
    if _is_text_answer(case.gold_raw):
        g, p = _as_text(case.gold_raw), _as_text(case.answer)
        return case.decide(g == p, "text answer differs", parsed=p, gold=g)
    return None


def _number_with_unit(case: _Case) -> _Verdict:
    gold_raw = case.gold_raw
    case.single_number_gold = bool(re.fullmatch(r"\s*-?[\d.,\s]+\s*", gold_raw)) and "," not in gold_raw
    if case.single_number_gold and (number := _number_without_unit(case.answer)) is not None:
        case.answer = number  # "10 m/s", "x \equiv 2 \pmod{5}" against a number alone
    return None


def _structure(case: _Case) -> _Verdict:
    for text, who in ((case.answer, "answer"), (case.gold_raw, "ground truth")):
        if problem := _structure_problem(text):
            return case.refuse(f"{who}: {problem}")
    return None


def _left_to_evaluate(case: _Case) -> _Verdict:
    # Only what the answer gives counts: "\frac{dy}{dx} = 2x" and "\int_0^1 x^2 dx = \frac13" name what they evaluate
    # on the left of their last "=", and are scored, as Math-Verify scores them.
    operator = _unevaluated_operator(_right_of_last_equals(case.answer))
    if operator and not _unevaluated_operator(case.gold_raw):
        # The question restated: its value may be the ground truth, but nothing was solved.
        return case.refuse(f"answer: {operator.strip()} is left to evaluate")
    return None


def _normalised(case: _Case) -> _Verdict:
    gold_s = _normalize(case.gold_raw, single_number_gold=False)
    pred_s = _normalize(case.answer, single_number_gold=case.single_number_gold)
    gold_value, pred_value = _without_condition(gold_s), _without_condition(pred_s)
    if (gold_value == gold_s) != (pred_value == pred_s):
        # One side's condition is dropped, never both: two would be dropped unread ("x^2 for x < 0" paid for x > 0).
        gold_s, pred_s = gold_value, pred_value
    case.gold_s, case.pred_s = gold_s, pred_s
    return None


# Forms Math-Verify reads as less than they say; each is refused unless the ground truth has it too.


def _math_after_text(case: _Case) -> _Verdict:
    if (hiding := _text_hiding_math(case.pred_s)) and not _text_hiding_math(case.gold_s):
        return case.refuse(f"answer: math after text ({hiding[:40]!r}) would be dropped")
    return None


def _numbers_side_by_side(case: _Case) -> _Verdict:
    if (side := _SIDE_BY_SIDE_RE.search(case.pred_s)) and not _SIDE_BY_SIDE_RE.search(case.gold_s):
        return case.refuse(f"answer: numbers side by side ({side.group(0)[:40]!r})")
    return None


def _other_base(case: _Case) -> _Verdict:
    # Against a ground truth without a base the digits decide: a base written there buys nothing over the digits
    # alone, and datasets leave it out of base-2 answers ("1011_2" against "1011" is not refused).
    if (gold_bases := _bases(case.gold_s)) and (other_bases := _bases(case.pred_s) - gold_bases):
        return case.refuse(f"answer: a numeral in base {min(other_bases)!r}, not the ground truth's")
    return None


def _scale_word_in_text(case: _Case) -> _Verdict:
    if (scaled := _SCALE_IN_TEXT_RE.search(case.pred_s)) and not _SCALE_IN_TEXT_RE.search(case.gold_s):
        return case.refuse(f"answer: a scale word in text ({scaled.group(0)[:40]!r})")
    return None


def _dropped_mark(case: _Case) -> _Verdict:
    if (decoration := _DECORATION_RE.search(case.pred_s)) and not _DECORATION_RE.search(case.gold_s):
        return case.refuse(f"answer: a mark the parser would drop ({decoration.group(0)!r})")
    return None


def _parsed(case: _Case) -> _Verdict:
    gold_objs, pred_objs = _with_imaginary_unit(_mv_parse(case.gold_s), _mv_parse(case.pred_s))
    case.gold_objs, case.pred_objs = gold_objs, pred_objs
    case.gold = _safe_str(gold_objs[0]) if gold_objs else case.gold_s
    case.parsed = _safe_str(pred_objs[0]) if pred_objs else case.pred_s
    if not gold_objs or not pred_objs:
        # Math-Verify's own fallback for unparsable input: exact string comparison.
        ok = case.gold_s.strip() == case.pred_s.strip() and bool(case.gold_s.strip())
        which = "ground truth" if not gold_objs else "answer"
        return case.decide(ok, f"could not parse {which}", parsed=case.parsed, gold=case.gold)
    return None


def _unevaluable(case: _Case) -> _Verdict:
    # Only a structurally identical answer can match a number too large to evaluate, or a function of one:
    # \cos(3^{600000}) fits, but reducing its argument by pi to 30 digits needs pi to a million bits (18 s in
    # evalf, and more in the grader's simplify).
    gold_objs, pred_objs = case.gold_objs, case.pred_objs
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
        return case.decide(ok, unevaluable, parsed=case.parsed, gold=case.gold)
    return None


def _equivalent(case: _Case) -> _Verdict:
    ok = _compare(case.gold_objs, case.pred_objs, _unknowns_in_order(case.gold_s))
    return case.decide(ok, "answer not equivalent to ground truth", parsed=case.parsed, gold=case.gold)


#: The judge's rules, in the order they are tried: each refuses or decides the answer, or rewrites the case for those
#: after it and goes on. The cheap looks at the strings come first, then Math-Verify's parse, and its comparison last.
RULES: tuple[Callable[[_Case], _Verdict], ...] = (
    _too_long,
    _gold_decimal_comma,
    _clock_times,
    _alternatives,
    _number_inside_text,
    _choice_letters,
    _text_answers,
    _number_with_unit,
    _structure,
    _left_to_evaluate,
    _normalised,
    _math_after_text,
    _numbers_side_by_side,
    _other_base,
    _scale_word_in_text,
    _dropped_mark,
    _parsed,
    _unevaluable,
    _equivalent,
)


def _judge(answer: str, rule: str, gold_raw: str) -> dict[str, str]:
    case = _Case(extracted=answer, rule=rule, answer=answer, gold_raw=gold_raw)
    for judge_rule in RULES:
        if (verdict := judge_rule(case)) is not None:
            return verdict
    raise AssertionError("the last rule decides every case")  # pragma: no cover - _equivalent always does


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
