"""Scoring: a pass count made a reward (:func:`score`)."""

from __future__ import annotations

import math


def score(passed: int, total: int, mode: str = "binary", failure_value: float = -1.0) -> float:
    """The reward for ``passed`` of ``total`` tests; never NaN.

    ``"binary"`` (default, also ``""``/``"unspecified"``): 1.0 when every test
    passed, else ``failure_value``. ``"fraction"``: ``passed / total``, or
    ``failure_value`` when nothing passed. No tests (``total <= 0``) always
    scores ``failure_value``. Raises ``ValueError`` for an unknown mode or a
    non-finite failure value.
    """
    if not math.isfinite(failure_value):
        raise ValueError(f"failure_value must be finite, got {failure_value!r}")
    name = (mode or "binary").strip().lower().removeprefix("reward_mode_")
    if name not in ("binary", "unspecified", "", "fraction"):
        raise ValueError(f"unknown reward mode {mode!r}")
    if total <= 0 or passed <= 0:
        return float(failure_value)
    if name == "fraction":
        return min(passed, total) / total
    return 1.0 if passed >= total else float(failure_value)
