"""Notation the extractor and the normaliser both read: math delimiters, text macros, the words of math, units,
scale words and the words for "or"."""

from __future__ import annotations

import re

# "or" in the languages models answer in: a word that offers an alternative ("2 oder 3", "2 или 3", "2或3"). Alphabetic
# words stand apart from letters of any script (not "four", "color"); the one-letter ones ("o", "ή") only between
# spaces; the CJK and Thai ones are written without spaces.
_OR_WORDS_ALPHA = ("or", "oder", "bzw", "ou", "oppure", "ovvero", "eller", "lub", "albo", "nebo", "vagy", "sau", "tai",
                   "veya", "yahut", "atau", "hoặc", "или", "либо", "або", "أو", "או", "या", "अथवा", "یا")  # noqa: RUF001
_OR_WORDS_SPACED = ("o", "ó", "ή")
_OR_WORDS_CJK = ("或者", "或", "還是", "还是", "または", "もしくは", "또는", "혹은", "หรือ")
_OR_WORD = (rf"(?<![^\W\d_\\])(?:{'|'.join(_OR_WORDS_ALPHA)})(?![^\W\d_])|(?<=\s)(?:{'|'.join(_OR_WORDS_SPACED)})(?=\s)"
            rf"|{'|'.join(_OR_WORDS_CJK)}")


_DELIMS = (("$$", "$$"), ("\\[", "\\]"), ("\\(", "\\)"), ("$", "$"))
# Commands whose argument Math-Verify's normaliser treats as text: it rewrites \mathrm, \mathit, \mathbf, \textnormal,
# \textbf, \textit and \textrm to \text, then drops everything from the first \text{ to the end (see
# _text_hiding_math). The others here (\textsf, \texttt, \mathsf, \emph, ...) it cannot parse; they are text too.
_TEXT_MACRO = r"\\(?:text(?:normal|bf|it|rm|sf|tt|up)?|math(?:rm|it|bf|sf|tt)|mbox|emph)(?![A-Za-z])"
_TEXT_CMD_RE = re.compile(rf"{_TEXT_MACRO}\s*\{{([^{{}}]*)\}}")
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


# Words that change the value of the number before them ("2 \text{ thousand}", "1.5 million"): read as their value,
# where Math-Verify's normaliser drops them as a unit (2 thousand would be paid as 2). "percent" is Math-Verify's own.
_SCALE_WORDS = {
    "hundred": "\\times 10^{2}", "thousand": "\\times 10^{3}", "million": "\\times 10^{6}",
    "billion": "\\times 10^{9}", "trillion": "\\times 10^{12}", "quadrillion": "\\times 10^{15}",
    "lakh": "\\times 10^{5}", "crore": "\\times 10^{7}", "dozen": "\\times 12",
    "squared": "^{2}", "cubed": "^{3}",
}
_SCALE_WORD = "|".join(_SCALE_WORDS)
_SCALE_TOKEN_RE = re.compile(rf"(?:{_SCALE_WORD})s?", re.IGNORECASE)


# A unit written in symbols after a number, outside \text{}: "10 m/s", "9.8 m/s^2", "12 m²", "100 N", "3 kN·m". The
# normaliser reads one-letter symbols as variables ("10 m/s" is 10m/s), so a number alone as the ground truth never
# matched (Math-Verify's own plain-text rule takes the number). Only symbols of SI units (with their prefixes) and a
# few common others: "2 x" is not 2.
_UNIT_SYMBOL = r"(?:[kcmnpGMµμ]?(?:mol|Hz|Pa|eV|Wh|cal|bar|Ω|[msgNJWVAL])|K|h|min|mph|ft|mi|lb|oz|yd|°[CF])"
_UNIT_POWER = r"(?:\^\{?-?\d\}?|[²³])?+"
_UNIT_SPACE = r"(?:\s|\\[,;:! ]|~)"  # "9.8\,m/s^2"
_UNIT_SEPARATOR = rf"(?:{_UNIT_SPACE}*+(?:[/·*]|\\cdot(?![A-Za-z])){_UNIT_SPACE}*+|{_UNIT_SPACE}++)"
# The same unit after a number in plain text, up to the end of the unit: not a letter, a digit or a "(" after it
# ("2 min(a, b)" is not minutes).
_PLAIN_UNIT_RE = re.compile(
    rf"{_UNIT_SYMBOL}{_UNIT_POWER}(?:{_UNIT_SEPARATOR}{_UNIT_SYMBOL}{_UNIT_POWER})*(?![A-Za-z\d(])"
)
