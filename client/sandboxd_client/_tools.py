"""What the tool-use adapters (TRL's environment, verl's tool) share: the bash cell, what a model sees of a cell, and
the reward a final check's cell gives."""

from __future__ import annotations

import logging
import math
import re

from ._requests import CellResult

log = logging.getLogger(__name__)

# A bash command run from the Python session, so that both tools share one sandbox, its files and its working folder:
# a fresh bash each time, stdin empty, stderr into stdout, the exit status said when it is not 0. Only names already
# in any namespace are used: the cell leaves nothing behind in the model's variables.
_BASH_CELL = (
    "(lambda r: print(r.stdout + (f'[exit status {{r.returncode}}]' if r.returncode else ''), end=''))("
    "__import__('subprocess').run(['bash', '-c', {command!r}], stdin=__import__('subprocess').DEVNULL, "
    "stdout=__import__('subprocess').PIPE, stderr=__import__('subprocess').STDOUT, text=True, errors='replace'))"
)
SESSION_ENDED = "[the session ended: the next call starts a fresh interpreter]"


def bash_cell(command: str) -> str:
    """The Python cell that runs ``command`` with ``bash -c`` in the session's sandbox and folder."""
    return _BASH_CELL.format(command=command)


def cell_text(result: CellResult, max_chars: int) -> str:
    """What the model sees of a cell: its output and last value; the error and status when it failed; capped."""
    parts = [result.stdout, result.value]
    if not result.ok:
        parts += [result.stderr, result.message, f"[{result.status.name}]"]
    if not result.session_alive:
        parts.append(SESSION_ENDED)
    text = "\n".join(part for part in parts if part).strip()
    if len(text) > max_chars:
        text = text[:max_chars] + f"\n[... {len(text) - max_chars} more characters]"
    return text


# The reprs a check's last value may have that mean a number: Python's own, and numpy's scalars (numpy 2 writes
# np.float64(0.5), np.int64(3), np.True_).
_BOOLS = {"True": 1.0, "False": 0.0, "np.True_": 1.0, "np.False_": 0.0}
_NUMPY_NUMBER = re.compile(r"np\.(?:float|int|uint)\d*\((.*)\)")


def check_reward(result: CellResult, failure_value: float, infra_failure_value: float | None) -> float | None:
    """The reward of a final check run as a session's last cell.

    A check that ends without error scores the value of its last expression
    (a number; ``True`` 1.0, ``False`` 0.0), or 1.0 when it has none (its last
    statement is not an expression, or the value is None): it ran to its end,
    so its asserts held. A check that raises, times out or runs out of memory
    scores ``failure_value``, and so does a last value that is not a finite
    number. A cell the infrastructure failed scores ``infra_failure_value``.
    What the check printed is not read: the model's own functions, and
    threads it left running, print into the same output.
    """
    if result.status.is_infrastructure_failure:
        return infra_failure_value
    if not result.ok:
        return failure_value
    value = result.value.strip()
    if not value:
        return 1.0
    if value in _BOOLS:
        return _BOOLS[value]
    number = _NUMPY_NUMBER.fullmatch(value)
    try:
        reward = float(number.group(1) if number else value)
    except ValueError:
        log.warning("sandboxd: a check's last value is not a number, reward %r: %.200s", failure_value, value)
        return failure_value
    return reward if math.isfinite(reward) else failure_value
