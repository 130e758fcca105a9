"""Normalisation of the extracted strings before Math-Verify sees them, and the cheap checks that refuse what would be
costly to parse (nesting, towers of powers, bars) or what Math-Verify would read as less than it says."""

from __future__ import annotations

import math as _pymath
import re
from typing import Any

from .extraction import _BOX_RE, _HEDGE_RE, _extract_boxed, _match_brace
from .notation import (
    _MATH_WORDS,
    _OR_WORD,
    _OR_WORDS_ALPHA,
    _OR_WORDS_CJK,
    _OR_WORDS_SPACED,
    _SCALE_WORD,
    _SCALE_WORDS,
    _TEXT_CMD_RE,
    _TEXT_MACRO,
    _UNIT_POWER,
    _UNIT_SEPARATOR,
    _UNIT_SPACE,
    _UNIT_SYMBOL,
    _strip_delims,
)

# Nesting limits, found by measurement: the ANTLR LaTeX grammar backtracks exponentially on bare
# nested braces ({{{{1}}}} at depth 15 takes ~2 s, depth 20 ~100 s) and slowly on parentheses.
# Command arguments (\frac{..}{..}, \sqrt{..}) are cheap and only fall under the total limit.
_MAX_BARE_BRACE_DEPTH = 5
_MAX_PAREN_DEPTH = 16
_MAX_TOTAL_DEPTH = 40
# Subscripts in subscripts cost the grammar's prediction about the square of their depth: x_{x_{...}} 10 deep take
# 0.46 s, 30 deep 4.2 s. Indices of indices (a_{n_{k}}) are as deep as answers go.
_MAX_SUBSCRIPT_DEPTH = 4
# Absolute-value bars are ambiguous for the grammar (an opening bar looks like a closing one), and each costs its
# prediction more the more there are: |x| written 10 times side by side takes 0.53 s, 22 times 3.6 s, 52 times
# 5 s; summed, 400 take 6.9 s. \left| and \right| are not ambiguous and not counted.
_MAX_BARS = 16
_BAR_RE = re.compile(r"(\\left|\\right)?\s*(?:\||\\[lr]?vert(?![a-zA-Z]))")
# Towers of exponents: the grammar's prediction is exponential in the tower height (x^x^...^x
# with 12 carets ~1 s, with 20 carets ~20 s) and sympy evaluates them eagerly. 9^{9^{9^9}} is 3.
_MAX_POWER_DEPTH = 5
_SCI_RE = re.compile(r"^(-?\d+(?:\.\d+)?)\s*[eE]\s*([+-]?\d+)$")
_MIXED_RE = re.compile(r"^(-?)(\d+)\s+(\d+)\s*/\s*(\d+)$")
_DECIMAL_COMMA_RE = re.compile(r"^-?\d+,(?:\d{1,2}|\d{4,})$")
_EURO_THOUSANDS_RE = re.compile(r"^-?\d{1,3}(?:\.\d{3})+(?:,\d+)?$")
_CHOICE_GOLD_RE = re.compile(r"^\(?([A-Z])\)?$")
_CHOICE_PRED_RE = re.compile(r"^[(\[]?([A-Za-z])(?:[)\].:]|\s|$)")
# Another choice letter after the answer's: a lone capital A-J not starting a formula ("(B) F = ma" is one).
_OTHER_CHOICE_RE = re.compile(r"(?<![A-Za-z\\])[A-J](?![A-Za-z0-9_^({]|\s*[=<>+*/^-])")
_TEXT_ANSWER_RE = re.compile(r"^[A-Za-z][A-Za-z \-']*$")


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
# A run of scale words (notation's _SCALE_WORDS) after a number, in a text or plain.
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
    # Invisible: "2\phantom{3}" shows 2 (latex2sympy reads 2 + 3); an empty text is a space ("2\text{ }3" is not 23).
    s = _EMPTY_TEXT_RE.sub(" ", _drop_phantoms(s))
    # "2 and 3", "x = 2 or x = 3": a list of answers (Math-Verify reads "\\text{ and }" itself).
    s = _AND_OR_RE.sub(", ", _OR_TEXT_RE.sub(", ", s))
    # "\text{5 cm}": the number inside the text is the value, the rest a unit.
    s = _TEXT_NUMBER_RE.sub(lambda m: m.group(1) + (f"\\text{{ {u}}}" if (u := m.group(2).strip()) else ""), s)
    s = _SCALE_WORD_RE.sub(_scale_word_value, s)
    # "50 \text{ percent}" is 50%: set aside as a unit, it would be 50 (paid for 50, refused for 0.5).
    s = _PERCENT_WORD_RE.sub(r"\\%", s)
    # "2\mathbf{i} + 3\mathbf{j}": a bold letter is a vector's symbol, not text (read as text, it is 2).
    s = _BOLD_LETTER_RE.sub(r" \1 ", s)
    # "1+2\mathrm{i}": the normaliser drops a text command and all after it (1 + 2, paid for 3).
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
        # Within a longer answer only the unambiguous separators ("x = 1\,000", "1\,000 \text{ m}" would be 1 + 000).
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


# A number followed by a unit in symbols (notation's _UNIT_SYMBOL), outside \text{}: the number is the answer.
_NUMBER_WITH_UNIT_RE = re.compile(
    rf"\s*+(?P<number>-?(?:\d{{1,3}}(?:,\d{{3}})++|\d++)(?:\.\d++)?+){_UNIT_SPACE}*+"
    rf"{_UNIT_SYMBOL}{_UNIT_POWER}(?:{_UNIT_SEPARATOR}{_UNIT_SYMBOL}{_UNIT_POWER})*+\s*+\.?\s*"
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
# would drop it with everything after ("3 \text{ m} = 2 \text{ m}" reads as 3, "2\text{ cm}, 3\text{ cm}" and
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
    joining "and"/"or") to the end, unless nothing would be left: "2 \\text{ maybe } 3 \\text{ m}" is 2. Units
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


# Two numbers with only spacing between them, which latex2sympy adds ("2 \quad 3" and "2\,3" read as 5): two answers,
# or a garbled one. SI thousands ("1\,000") are joined by _normalize first; a mixed number ("3 1/2") is one number,
# and a subscript or an exponent is not a number beside the next one ("\log_2 8").
_SIDE_BY_SIDE_RE = re.compile(rf"(?<![\d.^_])(?<![_^]\{{)\d+(?:\.\d+)?\}}*{_SPACE_CMD}+\{{*\.?\d(?!\d*\s*/\s*\d)")
# A numeral with its base ("1011_2", "1011_{2}", "(1011)_{(2)}", "2A_{16}", "1011_{\text{two}}"): Math-Verify drops
# the subscript, so 1011_3 would be paid against 1011_2.
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


# A number past this many bits, or a power with such an exponent, is costly to evaluate (cos(3^{600000}) takes 1.5 s
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
