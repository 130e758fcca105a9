"""Tests of normalisation and the structure checks (sandboxd.verifiers.math.normalisation)."""

from __future__ import annotations

import pytest

from sandboxd.verifiers.math import normalisation


@pytest.mark.parametrize(
    ("text", "depth"),
    [
        ("x^2 + y^2", 1),
        ("x^2 y^2 z^2 w^2", 1),
        ("x^23", 1),  # an unbraced exponent is one token
        ("e^{-x^2}", 2),
        ("(x^2)^3", 1),
        ("9^{9^{9^{9}}}", 3),
        ("x^x^x^x", 3),
        ("2^{2^{2^{2^{2^{2}}}}}", 5),
        ("x^" * 20 + "x", 20),
    ],
)
def test_power_depth(text: str, depth: int) -> None:
    assert normalisation._power_depth(text) == depth


@pytest.mark.parametrize(
    ("text", "refused"),
    [
        ("|x|" * 8, False),
        ("|x|" * 9, True),
        ("\\left|x\\right|" * 9, False),  # not ambiguous: not counted
        ("\\left\\vert x \\right\\vert" * 9, False),
        ("\\vert x\\vert" * 9, True),
        ("\\lvert x\\rvert" * 9, True),
        ("\\|x\\|" * 9, True),
    ],
)
def test_bars_counted(text: str, refused: bool) -> None:
    assert (normalisation._structure_problem(text) is not None) is refused
