"""Extraction: the program in a model's completion (:func:`extract_code`)."""

from __future__ import annotations

import re

from .languages import _ALIASES, _canonical_language

# Possessive: a lazy info string before optional trailing blanks is retried at every length, quadratic in a
# line's blanks (a fence and 40,000 spaces, which a degenerate model writes, holds the daemon's loop for seconds).
_FENCE_OPEN = re.compile(r"^(?P<indent>[ \t]*+)(?P<fence>`{3,}+|~{3,}+)(?P<info>[^`\n]*+)$")


# The language word of an info string: pandoc's "{.python}", and attributes after a comma or colon ("rust,ignore",
# "cpp:main.cpp", "python title=x"). A C++ standard after the name ("c++17", "cpp20") names C++.
_INFO_WORD_RE = re.compile(r"[\s{.]*+([^\s,:{}]*+)")
_CPP_STANDARD_RE = re.compile(r"(?:c\+\+|cpp)\d\d")


def _info_language(info: str) -> str:
    """The language word of a fence's info string, lower-cased; "" for none."""
    match = _INFO_WORD_RE.match(info)  # matches any text
    word = match.group(1).rstrip(".").lower() if match else ""
    return "cpp" if _CPP_STANDARD_RE.fullmatch(word) else word


def _fenced_blocks(text: str) -> list[tuple[str, str]]:
    """(info word, body) of every fenced block, in order.

    Follows CommonMark where it matters for model output: ``` or ~~~ fences of
    three or more, closed by the same character at least as long, the opening
    indentation removed from the body. An unclosed last block runs to the end:
    models often stop at EOS without writing the closing fence.
    """
    blocks: list[tuple[str, str]] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        opening = _FENCE_OPEN.match(lines[i])
        if opening is None:
            i += 1
            continue
        fence = opening.group("fence")
        indent = len(opening.group("indent"))
        word = _info_language(opening.group("info"))
        closing = re.compile(rf"^[ \t]*{re.escape(fence[0])}{{{len(fence)},}}[ \t]*$")
        body: list[str] = []
        i += 1
        while i < len(lines) and not closing.match(lines[i]):
            line = lines[i]
            strip = len(line) - len(line.lstrip(" \t"))
            body.append(line[min(indent, strip) :])
            i += 1
        i += 1  # past the closing fence (or the end)
        blocks.append((word, "\n".join(body) + ("\n" if body else "")))
    return blocks


def _pick_block(text: str, language: str, last: bool) -> str | None:
    canonical = _canonical_language(language)
    blocks = _fenced_blocks(text)
    if last:
        blocks.reverse()
    for word, body in blocks:
        if word and _ALIASES.get(word) == canonical:
            return body
    for word, body in blocks:
        if not word:
            return body
    return None


def _last_match(pattern: re.Pattern[str], text: str, end: int) -> re.Match[str] | None:
    """The last of ``pattern``'s non-overlapping matches that end by ``end``."""
    last = None
    for last in pattern.finditer(text, 0, end):  # noqa: B007 (the loop only walks to the last)
        pass
    return last


def extract_code(completion: str, language: str, mode: str = "last_block", tag: str = "") -> str | None:
    """Extract the program from a model completion, or ``None`` if there is none.

    Modes (``CodeExtraction`` in the API, lower-cased without the prefix):

    - ``"last_block"`` (default, also ``""``/``"unspecified"``): the last fenced
      block whose info string names ``language`` or one of its aliases; if
      there is none, the last block with no info string. Blocks tagged with
      another language are never taken.
    - ``"first_block"``: the same rule, first instead of last.
    - ``"whole"``: the completion itself.
    - ``"tag"``: the body of the last complete ``<tag>...</tag>``; if that body
      holds fenced blocks, the ``last_block`` rule is applied inside it.

    Whitespace-only results count as nothing found. Raises ``ValueError`` for an
    unknown mode or language, or ``mode="tag"`` without a tag.
    """
    normalized = (mode or "last_block").strip().lower()
    normalized = normalized.removeprefix("code_extraction_")
    if normalized in ("", "unspecified"):
        normalized = "last_block"
    _canonical_language(language)  # validate even when the mode ignores it
    if normalized == "last_block":
        code = _pick_block(completion, language, last=True)
    elif normalized == "first_block":
        code = _pick_block(completion, language, last=False)
    elif normalized == "whole":
        code = completion
    elif normalized == "tag":
        if not tag or not re.fullmatch(r"[A-Za-z_][\w.:-]*", tag):
            raise ValueError(f"extraction mode 'tag' needs a tag name, got {tag!r}")
        # The last closing tag, then the last opening tag before it: linear, where
        # a lazy `<tag>(.*?)</tag>` scans the rest of the text from every opening
        # tag ("<code>" repeated without a close: 45 s for 240 KB).
        closing = _last_match(re.compile(rf"</{re.escape(tag)}\s{{0,64}}>"), completion, len(completion))
        if closing is None:
            return None
        opening = _last_match(re.compile(rf"<{re.escape(tag)}(?:\s[^<>]{{0,256}})?>"), completion, closing.start())
        if opening is None:
            return None
        body = completion[opening.end() : closing.start()]
        code = _pick_block(body, language, last=True) if _fenced_blocks(body) else body.strip("\n")
    else:
        raise ValueError(f"unknown extraction mode {mode!r}")
    if code is None or not code.strip():
        return None
    return code
