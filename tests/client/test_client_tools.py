"""The tool-use adapters' shared parts (sandboxd_client._tools) and SandboxCheckEnvironment's final check, pure and
against FakeSandboxd (whose cells are ``name = value`` and ``name`` in the interpreter, ``file name = value`` a file,
which is all a final cell sees, or answers canned by their code)."""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import FAST, StartFake
from fake_daemon import FakeServer
from sandboxd_client import CellResult, InvalidRequest
from sandboxd_client._proto.sandboxd.v1 import sandboxd_pb2 as pb
from sandboxd_client._requests import Status
from sandboxd_client._tools import check_reward
from sandboxd_client.trl import SandboxCheckEnvironment, SandboxEnvironment


def cell(status: Status = Status.OK, value: str = "", stdout: str = "") -> CellResult:
    return CellResult(status=status, stdout=stdout, stderr="", value=value, session_alive=True)


# -- the check's verdict (pure) ---------------------------------------------------------------------------------------

@pytest.mark.parametrize(("result", "reward"), [
    (cell(), 1.0),  # ran to its end: its asserts held
    (cell(value="True"), 1.0),
    (cell(value="False"), 0.0),
    (cell(value="np.True_"), 1.0),
    (cell(value="np.False_"), 0.0),
    (cell(value="0.25"), 0.25),
    (cell(value="3"), 3.0),
    (cell(value="-2.5"), -2.5),
    (cell(value="np.float64(0.5)"), 0.5),
    (cell(value="np.int64(2)"), 2.0),
    (cell(value=" 1e-3\n"), 0.001),
    # What the check printed is not its verdict: the model's functions print there too.
    (cell(stdout="0.0\n"), 1.0),
    (cell(value="False", stdout="1.0\n"), 0.0),
])
def test_a_check_that_ends_scores_its_last_value_or_a_pass(result: CellResult, reward: float) -> None:
    assert check_reward(result, -1.0, None) == reward


@pytest.mark.parametrize("value", ["'1.0'", "nan", "inf", "-inf", "np.float64(nan)", "[1.0]", "None?", "1" * 400])
def test_a_last_value_that_is_not_a_finite_number_is_a_failure(value: str) -> None:
    assert check_reward(cell(value=value), -1.0, None) == -1.0


@pytest.mark.parametrize("status", [Status.RUNTIME_ERROR, Status.TIMEOUT, Status.MEMORY_LIMIT, Status.OUTPUT_LIMIT])
def test_a_check_that_fails_scores_the_failure_value(status: Status) -> None:
    assert check_reward(cell(status, value="1.0"), 0.0, None) == 0.0


@pytest.mark.parametrize("status", [Status.INTERNAL, Status.SANDBOX_LOST, Status.OVERLOADED, Status.UNSPECIFIED])
def test_a_check_the_infrastructure_failed_scores_the_infra_value(status: Status) -> None:
    assert check_reward(cell(status, value="1.0"), 0.0, None) is None
    assert check_reward(cell(status), 0.0, -0.5) == -0.5


# -- SandboxCheckEnvironment against FakeSandboxd ---------------------------------------------------------------------

@pytest.fixture
def env_options(fake: FakeServer) -> Iterator[dict[str, Any]]:
    yield {"address": fake.address, "client_options": {"retry_policy": FAST}}
    SandboxEnvironment.close_all()


def test_trl_sees_the_tools_and_get_reward() -> None:
    """GRPOTrainer takes every public function but reset and get_reward as a tool, and get_reward as a reward."""
    members = {name for name, _ in inspect.getmembers(SandboxCheckEnvironment, predicate=inspect.isfunction)}
    assert {m for m in members if not m.startswith("_")} == {"python", "bash", "reset", "get_reward"}
    assert "get_reward" not in {name for name, _ in inspect.getmembers(SandboxEnvironment, inspect.isfunction)}
    assert inspect.signature(SandboxCheckEnvironment.get_reward).parameters.keys() == {"self"}


def test_the_check_runs_last_in_the_rollouts_session_which_then_closes(fake: FakeServer,
                                                                       env_options: dict[str, Any]) -> None:
    env = SandboxCheckEnvironment(check="passed", **env_options)
    env.reset(prompt="p")
    env.python("file passed = True")
    (session_id,) = fake.fake.sessions
    assert env.get_reward() == 1.0
    assert fake.fake.cell_requests[-1].session_id == session_id and fake.fake.cell_requests[-1].final
    assert not fake.fake.sessions, "the session is closed once checked"
    opened = len(fake.fake.open_requests)
    assert env.get_reward() == 1.0, "asked again before the next reset, the same reward"
    assert len(fake.fake.open_requests) == opened
    # The next rollout is checked in its own session.
    env.reset(prompt="p")
    env.python("file passed = False")
    assert set(fake.fake.sessions) != {session_id}
    assert env.get_reward() == 0.0


def test_a_check_per_row_from_the_row_trl_passes_to_reset(fake: FakeServer, env_options: dict[str, Any]) -> None:
    env = SandboxCheckEnvironment(check=lambda row: row["check"], failure_value=-1.0, **env_options)
    env.reset(prompt="p", check="score")
    env.python("file score = 0.5")
    assert env.get_reward() == 0.5
    env.reset(prompt="p", check="missing_name")  # the check raises NameError
    env.python("file score = 0.5")
    assert env.get_reward() == -1.0
    # A row without a check is not scored, and holds no session for it.
    env.reset(prompt="p", check=None)
    opened = len(fake.fake.open_requests)
    assert env.get_reward() is None
    assert len(fake.fake.open_requests) == opened
    env.reset(prompt="p", check=None)
    env.python("file score = 1")
    assert env.get_reward() is None and not fake.fake.sessions
    with pytest.raises(TypeError, match="must return Python code"):
        env.reset(prompt="p", check=7)


def test_a_rollout_that_called_no_tool_is_checked_in_a_fresh_session(fake: FakeServer,
                                                                     env_options: dict[str, Any]) -> None:
    env = SandboxCheckEnvironment(check="passed", **env_options)
    env.reset()
    assert env.get_reward() == 0.0  # NameError: the model left nothing behind
    assert len(fake.fake.open_requests) == 1 and not fake.fake.sessions


def test_a_session_the_model_ended_is_checked_afresh_one_the_daemon_lost_is_not_scored(
        fake: FakeServer, env_options: dict[str, Any]) -> None:
    env = SandboxCheckEnvironment(check="passed", **env_options)
    # The model's own cell ended its interpreter (os._exit): the check runs, in a fresh session, and fails.
    fake.fake.cells["exit"] = pb.CellResult(status=pb.STATUS_RUNTIME_ERROR, session_alive=False)
    env.reset()
    env.python("file passed = True")
    env.python("exit")
    assert env.get_reward() == 0.0
    # The daemon dropped the session (expired, or lost with its sandbox): the files the check judges are gone.
    env.reset()
    env.python("file passed = True")
    fake.fake.sessions.clear()
    with pytest.raises(KeyError):  # SessionNotFound, the tool's error for the model
        env.python("passed")
    env.python("file passed = True")  # a fresh session, without what the rollout did before
    assert env.get_reward() is None
    assert not fake.fake.sessions
    # A cell the infrastructure ended (a starved cell that did not take its interrupt) loses the state too.
    fake.fake.cells["starved"] = pb.CellResult(status=pb.STATUS_INTERNAL, session_alive=False)
    env.reset()
    env.python("file passed = True")
    env.python("starved")
    assert env.get_reward() is None
    # The next rollout is scored again.
    env.reset()
    env.python("file passed = True")
    assert env.get_reward() == 1.0


def test_a_session_its_program_ended_between_cells_scores_the_failure_value_not_none(
        fake: FakeServer, env_options: dict[str, Any]) -> None:
    """A program that ends its own interpreter after its cell answered (a timer) left the next call a
    SessionNotFound, taken for a lost session: None, which TRL leaves out of the group, so a rollout could
    escape its failing check by ending its interpreter. The daemon says the session died: the model's doing."""
    env = SandboxCheckEnvironment(check="passed", failure_value=-1.0, **env_options)
    env.reset()
    env.python("file passed = True")
    (session_id,) = fake.fake.sessions
    del fake.fake.sessions[session_id]
    fake.fake.ended[session_id] = "the session died: its interpreter exited (status 0)"
    with pytest.raises(KeyError):  # SessionNotFound, the tool's error for the model
        env.python("passed")
    assert env.get_reward() == -1.0  # checked afresh: what the model left is gone with it
    # Lost with its sandbox: not the model's, not scored.
    env.reset()
    env.python("file passed = True")
    (session_id,) = fake.fake.sessions
    del fake.fake.sessions[session_id]
    fake.fake.ended[session_id] = "its sandbox was lost"
    with pytest.raises(KeyError):
        env.python("passed")
    assert env.get_reward() is None


def test_the_check_sees_the_sessions_files_never_its_interpreter(fake: FakeServer,
                                                                 env_options: dict[str, Any]) -> None:
    """The check ran as the last cell of the model's own interpreter: whatever the model bound or patched there
    (the check's names, builtins, an object equal to everything) made the verdict. It now runs as a final cell,
    which sees the session's files alone."""
    env = SandboxCheckEnvironment(check="passed", **env_options)
    env.reset()
    env.python("passed = True")  # the interpreter's state: what a patched builtin or rebound name stands for here
    env.python("file passed = False")
    assert env.get_reward() == 0.0
    assert [request.final for request in fake.fake.cell_requests] == [False, False, True]


def test_a_daemon_that_cannot_run_final_cells_scores_no_reward(fake: FakeServer, env_options: dict[str, Any]) -> None:
    """A daemon that predates RunCellRequest.final runs the check in the model's interpreter: its answer is not
    taken, whatever it says."""
    fake.fake.knows_final = False
    env = SandboxCheckEnvironment(check="passed", failure_value=-1.0, **env_options)
    env.reset()
    env.python("passed = True")
    assert env.get_reward() is None
    assert not fake.fake.sessions


def test_infrastructure_failures_score_the_infra_value_and_never_raise(start_fake: StartFake) -> None:
    server = start_fake("infra")
    env = SandboxCheckEnvironment(server.address, check="check", infra_failure_value=-0.5,
                                  client_options={"retry_policy": FAST})
    server.fake.cells["check"] = pb.CellResult(status=pb.STATUS_INTERNAL, session_alive=True, message="starved")
    env.reset()
    assert env.get_reward() == -0.5 and not server.fake.sessions
    env.reset()
    env.python("file x = 1")
    server.stop()  # the daemon is gone
    assert env.get_reward() == -0.5
    env.reset()
    assert env.get_reward() == -0.5  # cannot even open a session
    SandboxEnvironment.close_all()


def test_the_environment_checks_its_arguments() -> None:
    for check in (None, 3, b"x == 1"):
        with pytest.raises(TypeError, match="check must be"):
            SandboxCheckEnvironment(check=check)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="check is empty"):
        SandboxCheckEnvironment(check="  \n")
    with pytest.raises(InvalidRequest, match="failure_value"):
        SandboxCheckEnvironment(check="x", failure_value=float("nan"))
    with pytest.raises(InvalidRequest, match="infra_failure_value"):
        SandboxCheckEnvironment(check="x", infra_failure_value=float("inf"))
    with pytest.raises(TypeError):
        SandboxCheckEnvironment()  # type: ignore[call-arg]
