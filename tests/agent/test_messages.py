"""The control socket's messages: each op the controller serves is declared, and each declared op is served; the
jobs the daemon builds are shaped as declared, and the agent requires only what is declared."""

from __future__ import annotations

import inspect
import json
import types
import typing
from typing import Any

from sandboxd_client._proto.sandboxd.v1 import sandboxd_pb2 as pb

from sandboxd import errors, jobs
from sandboxd.agent import messages
from sandboxd.agent.host.controller import Controller
from sandboxd.agent.host.jobs import JOB_FIELDS
from sandboxd.agent.messages import ASSEMBLY_KEYS, ErrorReply, HarnessArguments, Job, JudgeArguments, Request
from sandboxd.config import Config, ModelConfig
from sandboxd.verifiers.python import harness


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


# ---- the run op's job: what sandboxd/jobs.py builds is what messages declares ----------------------------------

HUMANEVAL = {"prompt": "def add(a, b):\n    \"\"\"Add.\"\"\"\n", "entry_point": "add",
             "test": "def check(candidate):\n    assert candidate(1, 2) == 3\n"}
FUNCTION_CALLS = {"fn_name": "add", "inputs": [[1, 2], [3, 4]], "outputs": [3, 7]}


def built_jobs() -> list[tuple[str, Any]]:
    """Real jobs from API requests, one or more of each kind: (what, the job as sent to the sandbox)."""
    code = "```python\ndef add(a, b):\n    return a + b\n```"
    requests = {
        "execute": pb.Job(execute=pb.ExecuteJob(language="python", code="print(1)", stdin=b"x", args=["-v"],
                                                files=[pb.File(path="data/in.txt", content=b"1")],
                                                collect_files=["out.txt"])),
        "execute in C": pb.Job(execute=pb.ExecuteJob(language="c", code="int main(void) { return 0; }")),
        "code, stdio": pb.Job(code=pb.CodeJob(completion="```python\nprint(input())\n```", tests=pb.CodeTests(
            stdio=[pb.StdioCase(stdin="1\n", expected_stdout="1\n")]))),
        "code, function calls": pb.Job(code=pb.CodeJob(completion=code, tests=pb.CodeTests(
            dataset_json=json.dumps(FUNCTION_CALLS)))),
        "code, HumanEval": pb.Job(code=pb.CodeJob(completion="```python\n    return a + b\n```", tests=pb.CodeTests(
            dataset_json=json.dumps(HUMANEVAL)))),
        "math": pb.Job(math=pb.MathJob(completion="\\boxed{2}", ground_truth="2")),
        "reward_model": pb.Job(reward_model=pb.RewardModelJob(prompt="p", completion="c")),
    }
    settings = Config()
    settings.models = {"rm": ModelConfig(path="/m")}
    built = []
    for what, request in requests.items():
        prepared = jobs.prepare(request, settings)
        assert prepared.agent_job is not None, (what, prepared.early_result)
        built.append((what, prepared.agent_job))
    return built


def keys_of(declared: Any) -> tuple[set[str], set[str]]:
    """(required keys, all keys) of a TypedDict of messages.

    Its __required_keys__ as corrected by the markers: the annotations are
    strings there (postponed), in which Python 3.11 sees no Required or
    NotRequired, and takes each key as its class's totality says.
    """
    hints = typing.get_type_hints(declared, include_extras=True)
    required = set()
    for name, hint in hints.items():
        origin = typing.get_origin(hint)
        if origin is typing.Required or (origin is not typing.NotRequired and name in declared.__required_keys__):
            required.add(name)
    return required, set(hints)


def assert_shaped(value: Any, declared: Any, where: str) -> None:
    """`value`'s keys are those `declared` (a TypedDict) requires, and at most those it names; in depth."""
    keys = set(value)
    required, names = keys_of(declared)
    assert required <= keys, f"{where}: {sorted(required - keys)} missing"
    assert keys <= names, f"{where}: {sorted(keys - names)} not declared"
    hints = typing.get_type_hints(declared)
    for key in keys:
        inner = hints[key]
        if typing.get_origin(inner) is list and typing.is_typeddict(typing.get_args(inner)[0]):
            for position, item in enumerate(value[key]):
                assert_shaped(item, typing.get_args(inner)[0], f"{where}.{key}[{position}]")
        elif typing.is_typeddict(inner):
            assert_shaped(value[key], inner, f"{where}.{key}")


def test_every_kind_of_job_the_daemon_builds_has_its_declared_keys() -> None:
    """A key added to a job on one side only (sandboxd/jobs.py, or the declaration the agent reads it by) fails."""
    declared = {typing.get_args(typing.get_type_hints(kind)["kind"])[0]: kind for kind in typing.get_args(Job)}
    built = built_jobs()
    assert {job["kind"] for _what, job in built} == set(declared) == set(JOB_FIELDS)
    for what, job in built:
        assert_shaped(job, declared[job["kind"]], what)
    by_what = dict(built)
    # The optional parts are there where their jobs need them.
    assert "harness" not in by_what["code, stdio"] and "assembly" not in by_what["code, function calls"]
    assert {"harness", "assembly"} <= set(by_what["code, HumanEval"])
    assert set(by_what["code, HumanEval"]["assembly"]) == set(ASSEMBLY_KEYS)


def test_what_the_agent_requires_of_a_job_is_declared() -> None:
    """validate_job's fields (JOB_FIELDS) are each a required key of their kind's declaration."""
    declared = {typing.get_args(typing.get_type_hints(kind)["kind"])[0]: kind for kind in typing.get_args(Job)}
    for kind, fields in JOB_FIELDS.items():
        assert set(fields) <= keys_of(declared[kind])[0], kind


def test_the_judge_is_given_only_arguments_run_tests_takes() -> None:
    """JudgeArguments (the daemon's HarnessArguments and the host's) are keyword arguments of python.harness.run_tests,
    which the judge passes them to with **: a key the harness does not take would fail every job there."""
    parameters = inspect.signature(harness.run_tests).parameters
    assert keys_of(JudgeArguments)[1] <= {name for name, p in parameters.items() if p.kind == p.KEYWORD_ONLY}
    assert keys_of(HarnessArguments)[1] <= keys_of(JudgeArguments)[1]
    assert keys_of(JudgeArguments)[0] == keys_of(HarnessArguments)[0] | {"call_timeout", "files"}


def test_the_daemons_sandbox_full_is_the_agents() -> None:
    """One SandboxFull: the daemon's, raised from the agent's `full` reply, is the agent's class with a gRPC code."""
    assert issubclass(errors.SandboxFull, messages.SandboxFull) and issubclass(errors.SandboxFull, errors.SandboxLost)
    assert errors.SandboxFull.code == errors.SandboxLost.code
    assert "full" in keys_of(ErrorReply)[1] - keys_of(ErrorReply)[0]
