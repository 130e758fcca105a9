"""What the math verifier's tests share: the autouse warm-up, verdict checks and generated answers."""

from __future__ import annotations

import json
from typing import TypedDict, Unpack

import pytest

from sandboxd.verifiers import math as mathv

OK, WRONG, NONE = "ok", "wrong_answer", "no_answer"


@pytest.fixture(scope="module", autouse=True)
def _warm() -> None:
    mathv.warm()


def boxed(s: str) -> str:
    return f"Reasoning... so the final result is $\\boxed{{{s}}}$."


class VerifyOptions(TypedDict, total=False):
    """The keyword options of ``mathv.verify``."""

    extraction: str
    float_tolerance: float


def check(completion: str, gold: str, expected: str, **kwargs: Unpack[VerifyOptions]) -> dict:
    result = mathv.verify(completion, gold, **kwargs)
    assert result["status"] == expected, result
    assert json.loads(json.dumps(result)) == result
    return result


def nest(template: str, depth: int, seed: str) -> str:
    expr = seed
    for _ in range(depth):
        expr = template.format(expr)
    return expr


def powers(count: int) -> str:
    return "\\{" + ",".join(f"x^{{{k}}}" for k in range(1, count + 1)) + "\\}"


def symbolic_intervals(count: int) -> str:
    return "\\cup".join(f"(x^{{{2 * k + 1}}},x^{{{2 * k + 2}}})" for k in range(count))
