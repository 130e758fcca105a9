"""``sandboxd_client.trl.SandboxEnvironment`` as TRL's GRPOTrainer uses an ``environment_factory``, against a real
daemon: TRL (1.16) pools instances, calls ``reset(**row)`` before each rollout and exposes every public function of
the class but ``reset`` and ``get_reward`` as a tool, described by ``transformers.utils.get_json_schema``."""

from __future__ import annotations

import gc
import importlib.util
import inspect
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import grpc
import pytest
from sandboxd_client._proto.sandboxd.v1 import sandboxd_pb2 as pb
from sandboxd_client._proto.sandboxd.v1 import sandboxd_pb2_grpc as pb_grpc
from sandboxd_client.trl import SandboxEnvironment

from tests.conftest import DaemonProcess, skip_or_fail

pytestmark = pytest.mark.docker


def trl_tools(env: object) -> dict[str, Callable[..., Any]]:
    """The tools GRPOTrainer takes from an environment (trl/trainer/grpo_trainer.py, _generate)."""
    return {
        name: getattr(env, name)
        for name, _ in inspect.getmembers(type(env), predicate=inspect.isfunction)
        if name not in ("reset", "get_reward") and not name.startswith("_")
    }


@pytest.fixture
def open_sessions(channel: grpc.Channel) -> Iterator[Callable[[], int]]:
    stub = pb_grpc.SessionsStub(channel)

    def count() -> int:
        return len(stub.List(pb.ListSessionsRequest(), timeout=10).sessions)

    before = count()
    yield lambda: count() - before
    SandboxEnvironment.close_all()


def test_one_session_per_rollout_with_python_and_bash_tools(daemon: DaemonProcess,
                                                             open_sessions: Callable[[], int]) -> None:
    count = open_sessions
    factory = partial(SandboxEnvironment, daemon.address, timeout=20)
    env = factory()
    assert set(trl_tools(env)) == {"python", "bash"}
    env.reset(prompt="p", answer="1")  # returns None: nothing is added to the prompt
    assert count() == 0, "a rollout that calls no tool holds no sandbox"
    assert env.python("x = 41\nx + 1") == "42"
    assert env.python("def f():\n    return x\nprint('x is', f())") == "x is 41"
    # bash runs in the same sandbox and folder: the files are the Python tool's.
    assert env.bash("echo hi > note.txt; ls; cat note.txt") == "note.txt\nhi"
    assert env.python("open('note.txt').read()") == "'hi\\n'"
    assert env.bash("echo oops >&2; exit 3") == "oops\n[exit status 3]"
    assert env.bash("cd /; pwd") == "/" and env.bash("pwd") != "/"  # a fresh shell each time
    error = env.python("1/0")
    assert "ZeroDivisionError" in error and "[RUNTIME_ERROR]" in error
    assert env.python("x") == "41", "an error does not end the session"
    assert count() == 1
    # The next rollout starts clean, and the previous session is given back.
    env.reset(prompt="q")
    assert count() == 0
    assert "NameError" in env.python("x")
    assert count() == 1
    # Rollouts in flight at once (TRL's pool) each have their own.
    other = factory()
    other.reset()
    assert other.python("x = 'other'\nx") == "'other'" and "NameError" in env.python("x")
    assert count() == 2
    SandboxEnvironment.close_all()
    assert count() == 0
    # A garbage-collected environment gives its session back.
    other.reset()
    other.python("1")
    assert count() == 1
    del other
    gc.collect()
    assert count() == 0


def test_output_is_capped_and_a_lost_session_is_replaced(daemon: DaemonProcess,
                                                          open_sessions: Callable[[], int]) -> None:
    count = open_sessions
    with SandboxEnvironment(daemon.address, max_output_chars=100) as env:
        env.reset()
        out = env.python("print('a' * 1000)")
        assert out.startswith("a" * 100) and out.endswith("[... 900 more characters]")
        env.python("y = 1")
        # The daemon dropped the session (expired, or lost with its sandbox): one error, then a fresh interpreter.
        assert env._session is not None
        env._session.close()
        with pytest.raises(KeyError):  # SessionNotFound, which TRL hands the model as the tool's error
            env.python("y")
        assert "NameError" in env.python("y")
    assert count() == 0


def test_tool_schemas_are_what_transformers_makes_of_the_docstrings(daemon: DaemonProcess) -> None:
    if importlib.util.find_spec("transformers") is None:
        skip_or_fail("transformers is not installed (the test extra installs it)")
    from transformers.utils import get_json_schema

    env = SandboxEnvironment(daemon.address)
    schemas = {name: get_json_schema(tool)["function"] for name, tool in trl_tools(env).items()}
    assert schemas["python"]["parameters"]["properties"] == {
        "code": {"type": "string", "description": "The Python code to run."}
    }
    assert schemas["bash"]["parameters"]["properties"] == {
        "command": {"type": "string", "description": "The bash command line to run."}
    }
    assert all(schema["parameters"]["required"] == [arg] for schema, arg in
               ((schemas["python"], "code"), (schemas["bash"], "command")))
    assert "persistent interpreter" in schemas["python"]["description"]
