"""The control socket's messages: each op the controller serves is declared, and each declared op is served."""

from __future__ import annotations

import types
import typing

from sandboxd.agent.host.controller import Controller
from sandboxd.agent.messages import Request


def declared_ops() -> set[str]:
    ops = set()
    for request in typing.get_args(Request):
        (op,) = typing.get_args(typing.get_type_hints(request)["op"])
        ops.add(op)
    return ops


def test_the_controllers_ops_are_the_declared_requests() -> None:
    controller = Controller(types.SimpleNamespace(pid=-1), ["python"])  # type: ignore[arg-type]
    assert set(controller.ops) == declared_ops()
    assert {"hello", "run", "session_cell"} <= declared_ops()
