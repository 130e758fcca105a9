"""The session interpreter's cell semantics, run in this process (no sandbox needed)."""

from __future__ import annotations

import builtins
from typing import Any

import pytest

from sandboxd.agent.forked.repl import run_cell
from sandboxd.agent.protocol import VALUE_PREVIEW_CHARS


@pytest.fixture
def namespace() -> dict[str, Any]:
    return {"__name__": "__main__", "__builtins__": builtins}


def test_last_expression_is_the_value_and_binds_underscore(namespace: dict[str, Any]) -> None:
    assert run_cell("x = 20\nx + 22", namespace) == {"status": "ok", "value": "42", "message": ""}
    assert namespace["_"] == 42
    assert run_cell("_ + 1", namespace)["value"] == "43"


def test_statements_and_none_have_no_value(namespace: dict[str, Any]) -> None:
    assert run_cell("y = 1", namespace)["value"] == ""
    assert run_cell("None", namespace)["value"] == ""
    assert run_cell("print('hi')", namespace)["value"] == ""
    assert run_cell("", namespace) == {"status": "ok", "value": "", "message": ""}


def test_state_persists_between_cells(namespace: dict[str, Any]) -> None:
    run_cell("import math\ndef area(r):\n    return math.pi * r ** 2", namespace)
    assert run_cell("round(area(1), 4)", namespace)["value"] == "3.1416"


def test_errors_are_reported_with_the_cells_traceback(namespace: dict[str, Any],
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    result = run_cell("def f():\n    return 1 / 0\nf()", namespace, "<cell 7>")
    assert result["status"] == "runtime_error"
    assert result["message"] == "ZeroDivisionError: division by zero"
    err = capsys.readouterr().err
    assert 'File "<cell 7>", line 3' in err and "run_cell" not in err


def test_syntax_errors_are_runtime_errors(namespace: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    result = run_cell("def (", namespace)
    assert result["status"] == "runtime_error" and result["message"].startswith("SyntaxError")
    assert "SyntaxError" in capsys.readouterr().err


@pytest.mark.parametrize(("code", "status", "message"), [
    ("import sys\nsys.exit(0)", "exited", "SystemExit(0)"),
    ("raise SystemExit('bye')", "exited", "SystemExit('bye')"),
    ("raise KeyboardInterrupt", "interrupted", "interrupted"),
    ("raise MemoryError", "memory_limit", "MemoryError: "),
])
def test_exits_interrupts_and_memory_errors(namespace: dict[str, Any], code: str, status: str,
                                            message: str) -> None:
    result = run_cell(code, namespace)
    assert (result["status"], result["message"]) == (status, message)


def test_hostile_repr_and_str_are_contained(namespace: dict[str, Any]) -> None:
    run_cell("class Bad:\n    def __repr__(self):\n        raise ValueError('no repr')\n"
             "class BadError(Exception):\n    def __str__(self):\n        raise RuntimeError('no str')", namespace)
    assert run_cell("Bad()", namespace)["message"] == "ValueError: no repr"
    assert run_cell("raise BadError()", namespace) == {"status": "runtime_error", "value": "",
                                                       "message": "BadError"}


def test_long_values_are_cut(namespace: dict[str, Any]) -> None:
    value = run_cell("'x' * 1_000_000", namespace)["value"]
    assert len(value) < VALUE_PREVIEW_CHARS + 100 and value.endswith("more characters]")
