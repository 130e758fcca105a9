"""Tests of sandboxd.verifiers.code.scoring: a pass count made a reward."""

from __future__ import annotations

import pytest

from sandboxd.verifiers.code import (
    score,
)

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize(
    ("passed", "total", "mode", "reward"),
    [
        (3, 3, "binary", 1.0),
        (2, 3, "binary", -1.0),
        (0, 0, "binary", -1.0),
        (0, 0, "fraction", -1.0),
        (0, 4, "fraction", -1.0),
        (1, 4, "fraction", 0.25),
        (4, 4, "REWARD_MODE_FRACTION", 1.0),
        (5, 4, "fraction", 1.0),
        (1, 1, "", 1.0),
    ],
)
def test_score(passed: int, total: int, mode: str, reward: float) -> None:
    assert score(passed, total, mode, -1.0) == reward


def test_score_never_nan() -> None:
    assert score(0, 0, "fraction", 0.0) == 0.0
    with pytest.raises(ValueError):
        score(1, 1, "binary", float("nan"))
    with pytest.raises(ValueError):
        score(1, 1, "best", -1.0)
