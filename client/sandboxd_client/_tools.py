"""What the tool-use adapters (TRL's environment, verl's tool) share: the bash cell and what a model sees of a cell."""

from __future__ import annotations

from ._requests import CellResult

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
