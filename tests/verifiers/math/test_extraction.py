"""Tests of answer extraction (sandboxd.verifiers.math.extraction)."""

from __future__ import annotations

import pytest

from sandboxd.verifiers.math import extraction


@pytest.mark.parametrize(
    ("completion", "answer", "rule"),
    [
        ("We get $\\boxed{7}$.", "7", "boxed"),
        ("First \\boxed{3}, then on reflection \\boxed{5}.", "5", "boxed"),
        ("Nested: \\boxed{\\frac{\\sqrt{2}}{2}} done", "\\frac{\\sqrt{2}}{2}", "boxed"),
        ("A set \\boxed{\\{1, 2\\}}", "\\{1, 2\\}", "boxed"),
        ("Framed \\fbox{12} ok", "12", "boxed"),
        ("Spaced $\\boxed 9$", "9", "boxed"),
        ("Truncated last box \\boxed{4} and \\boxed{5", "4", "boxed"),
        ("<think>2+2</think><answer> 4 </answer>", "4", "answer_tag"),
        ("<answer>\\boxed{6}</answer> junk", "6", "boxed"),
        ("So the answer is 12.", "12", "phrase"),
        ("The answer is $\\frac{3}{4}$, clearly.", "\\frac{3}{4}", "phrase"),
        ("Working...\nAnswer: 3.5", "3.5", "phrase"),
        ("**Answer:** 17", "17", "phrase"),
        (
            "Final Answer: The final answer is $2\\pi$. I hope it is correct.",
            "2\\pi",
            "phrase",
        ),
        ("The answer is:\n\n$$x^2 + 1$$", "x^2 + 1", "phrase"),
        ("We computed $a=1$ and then $b = 2$", "b = 2", "last_expression"),
        ("so 3 apples plus 4 apples makes 7 apples", "7", "last_expression"),
        ("inline \\(\\frac{1}{3}\\) end", "\\frac{1}{3}", "last_expression"),
        # An undelimited expression is taken whole, not as its last number.
        ("(x+4)^2", "(x+4)^2", "last_expression"),
        ("We factor and get (x+4)^2.", "(x+4)^2", "last_expression"),
        ("\\sqrt{2}", "\\sqrt{2}", "last_expression"),
        ("so f(x) = 2x+3", "f(x) = 2x+3", "last_expression"),
        ("Half of it: 3 1/2 cups", "3 1/2", "last_expression"),
        ("The roots are 2 and 3.", "2 and 3", "last_expression"),
        ("The sum of 2 and 3 is 5.", "5", "last_expression"),
        ("she earns 7 a day", "7", "last_expression"),
        ("it is in [1, 2)", "[1, 2)", "last_expression"),
        ("(so x = 5)", "x = 5", "last_expression"),
        ("Let $n$ be the count; then the count is 12.", "12", "last_expression"),  # rightmost wins
        ("so it is 1,000.99m\u00b2", "1,000.99", "last_expression"),
        ("not it's not 10 it's 1 000", "1 000", "last_expression"),
        # After an answer phrase, trailing words are not part of the expression.
        ("The answer is 7 a day", "7", "phrase"),
        ("The answer is 12 apples.", "12", "phrase"),
        ("The answer is x = 5 because it works", "x = 5", "phrase"),
        ("The answer is Paris", "Paris", "phrase"),
    ],
)
def test_auto_extraction(completion: str, answer: str, rule: str) -> None:
    assert extraction.extract_answer(completion) == (answer, rule)


@pytest.mark.parametrize(
    ("completion", "mode", "expected"),
    [
        ("<answer>4</answer> but \\boxed{5}", "auto", ("5", "boxed")),
        ("<answer>4</answer> but \\boxed{5}", "answer_tag", ("4", "answer_tag")),
        ("The answer is 8. Later \\boxed{9}", "phrase", ("8", "phrase")),
        ("The answer is 8. Later \\boxed{9}", "last_expression", ("9", "last_expression")),
        ("no box here, 42", "boxed", None),
        ("no tag", "answer_tag", None),
        ("nothing numeric at all", "auto", None),
        ("I am not sure, a well-known case.", "auto", None),
        ("", "auto", None),
        ("\\boxed{}", "boxed", None),
    ],
)
def test_extraction_modes(completion: str, mode: str, expected: tuple[str, str] | None) -> None:
    assert extraction.extract_answer(completion, mode) == expected
