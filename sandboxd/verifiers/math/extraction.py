"""Extraction: the final answer of a completion, from its ``\\boxed{}``, ``<answer>`` tag, answer phrase or last math
expression (:func:`extract_answer`)."""

from __future__ import annotations

import re

from .notation import _MATH_WORDS, _OR_WORD, _PLAIN_UNIT_RE, _SCALE_TOKEN_RE, _TEXT_CMD_RE, _strip_delims

#: Extraction modes accepted by :func:`verify`; "auto" tries the others in this order.
EXTRACTION_MODES: tuple[str, ...] = ("auto", "boxed", "answer_tag", "phrase", "last_expression")
# Only the tail of a long completion is searched for a "last expression": the final answer is at
# the end, and regex scans over megabytes of text are wasted work.
_LAST_EXPR_TAIL_CHARS = 10_000
# How many \boxed occurrences (from the end) we try before giving up on malformed ones.
_MAX_BOX_TRIES = 20


_BOX_RE = re.compile(r"\\(?:boxed|fbox)\b")
_BOX_TOKEN_RE = re.compile(r"[^\s$]+")  # the argument of "\boxed 5"
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
# not equal; but "2 \\text{ or 3}", "2 \\text{(or 3)}", "B or C" and "x = 2 \\vee x = 3" would be read as one of their
# alternatives and paid, and so would "2 oder 3", "2 или 3" and "2或3" in plain text: a hedge is refused.
_HEDGE_RE = re.compile(rf"{_OR_WORD}|\\(?:vee|lor)(?![A-Za-z])|\u2228", re.IGNORECASE)
# Text between two boxes longer than this does not join them (and bounds the joiner's scan).
_MAX_JOINER_CHARS = 200
_PHRASE_RE = re.compile(r"(?:final\s+answer\s*(?:is\b|:)|the\s+answer\s+is\b|\banswer\s*:)", re.IGNORECASE)
_HOPE_RE = re.compile(r"\.?\s*I\s+hope\s+it\s+is\s+correct.*$", re.IGNORECASE | re.DOTALL)
# Span lengths are bounded so that text full of unclosed "\(" cannot make the scan quadratic.
# "\$" is a dollar sign, not a delimiter: "The answer is $\$120$" is not the span "\".
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

    "The largest $n$ is 34", "The volume of $ABCDEFGH$ is 120": what follows the last "is" (outside math; not
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
            # "12 cm^2", "10 m/s": the number's unit ends the expression (not "2", "m/s").
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
