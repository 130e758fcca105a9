"""Tests of sandboxd.verifiers.code.extraction: the program in a completion."""

from __future__ import annotations

import pytest

from sandboxd.verifiers.code import (
    extract_code,
)

pytestmark = pytest.mark.timeout(60)


def test_last_block_prefers_the_language_over_later_untagged_blocks() -> None:
    text = "think\n```python\nprint(1)\n```\nthen\n```\nplain\n```\n```py\nprint(2)\n```\nbye ```"
    assert extract_code(text, "python") == "print(2)\n"
    assert extract_code(text, "python", "first_block") == "print(1)\n"


def test_last_block_falls_back_to_untagged_and_ignores_other_languages() -> None:
    text = "```cpp\nint main(){}\n```\n```\nx = 1\n```\n```bash\nls\n```"
    assert extract_code(text, "python") == "x = 1\n"
    assert extract_code(text, "c++") == "int main(){}\n"
    assert extract_code(text, "sh") == "ls\n"
    assert extract_code("```java\nclass A{}\n```", "python") is None
    assert extract_code("```c\nint main(){}\n```", "cpp") is None  # another language, however close
    assert extract_code("```python3.11\nx = 1\n```", "python") is None  # not a name the table has
    assert extract_code("no code here", "python") is None


@pytest.mark.parametrize(
    ("info", "language"),
    [
        ("python3", "python"),
        ("Python", "python"),
        ("{.python}", "python"),
        ("c++", "cpp"),
        ("cxx", "cpp"),
        ("js", "javascript"),
        ("node", "javascript"),
        ("golang", "go"),
        ("rs", "rust"),
        ("shell", "bash"),
        ("java", "java"),
        ("c", "c"),
        # Attributes after the name, and C++ standards (red team: each found no code).
        ("rust,ignore", "rust"),
        ("cpp:main.cpp", "cpp"),
        ("c++17", "cpp"),
        ("cpp20", "cpp"),
        ("python{cmd=true}", "python"),
        ("mjs", "javascript"),
    ],
)
def test_language_aliases(info: str, language: str) -> None:
    assert extract_code(f"```{info}\nBODY\n```", language) == "BODY\n"


def test_fences_tildes_longer_fences_indentation_and_unclosed_block() -> None:
    assert extract_code("~~~python\na = 1\n~~~", "python") == "a = 1\n"
    nested = "````python\ns = '''\n```\n'''\n````"
    assert extract_code(nested, "python") == "s = '''\n```\n'''\n"
    indented = "1. step\n   ```python\n   def f():\n       return 1\n   ```"
    assert extract_code(indented, "python") == "def f():\n    return 1\n"
    assert extract_code("```python title=x\nok\n```", "python") == "ok\n"
    assert extract_code("text\n```python\nprint('cut off')", "python") == "print('cut off')\n"
    assert extract_code("```python\r\nx = 1\r\n```\r\n", "python") == "x = 1\n"


def test_empty_blocks_are_nothing() -> None:
    assert extract_code("```python\n```", "python") is None
    assert extract_code("```python\n   \n```", "python") is None


def test_whole_and_tag_modes() -> None:
    assert extract_code("x = 1\n", "python", "whole") == "x = 1\n"
    assert extract_code("  \n", "python", "whole") is None
    text = "<code>first</code> and <code>\n```python\nsecond = 2\n```\n</code>"
    assert extract_code(text, "python", "tag", "code") == "second = 2\n"
    assert extract_code("<answer>\ny = 2\n</answer>", "python", "tag", "answer") == "y = 2"
    assert extract_code("<answer>unclosed", "python", "tag", "answer") is None
    assert extract_code("x", "python", "CODE_EXTRACTION_WHOLE") == "x"


@pytest.mark.timeout(20)  # the time bound: these took minutes to hours before
def test_tag_mode_takes_the_last_closed_tag_and_copes_with_degenerate_text() -> None:
    text = '<code lang="py">a = 1</code> prose <code>\nb = 2\n</code > trailing <code>unclosed'
    assert extract_code(text, "python", "tag", "code") == "b = 2"
    assert extract_code("<code>a<code>b = 3</code>", "python", "tag", "code") == "b = 3"  # the innermost
    # A model stuck repeating an opening tag: no code (the lazy regex this replaced took 45 s for 240 KB).
    assert extract_code("<code>" * 100_000, "python", "tag", "code") is None
    assert extract_code("<code " * 100_000 + "</code>", "python", "tag", "code") is None


@pytest.mark.timeout(20)  # the time bound: these took minutes to hours before
def test_fence_lines_of_degenerate_completions_are_read_in_linear_time() -> None:
    """An opening fence's info string was matched lazily before optional blanks: "```python" and 40,000 spaces took
    6.7 s on the daemon's event loop, quadratic in the blanks (a degenerate model writes such lines)."""
    spaces = " " * 1_000_000
    assert extract_code(f"```python{spaces}x\nprint(1)\n```\n", "python") == "print(1)\n"
    assert extract_code(f"```python{spaces}\nprint(2)\n```{spaces}\n", "python") == "print(2)\n"
    assert extract_code("~" * 1_000_000 + "`\nprint(3)\n", "python") is None
    assert extract_code(f"~~~ py {{.x}}{spaces}\nprint(4)\n~~~~\n", "python") == "print(4)\n"


def test_extraction_errors() -> None:
    with pytest.raises(ValueError, match="tag name"):
        extract_code("<a>x</a>", "python", "tag")
    with pytest.raises(ValueError, match="unknown extraction mode"):
        extract_code("x", "python", "middle_block")
    with pytest.raises(ValueError, match="unsupported language"):
        extract_code("x", "cobol")
