"""``sandboxd_client.trl.SandboxEnvironment`` as TRL's GRPOTrainer uses an ``environment_factory``, against a real
daemon: TRL (1.16) pools instances, calls ``reset(**row)`` before each rollout and exposes every public function of
the class but ``reset`` and ``get_reward`` as a tool, described by ``transformers.utils.get_json_schema``.

The last tests are real GRPOTrainer steps on CPU with ``environment_factory=SandboxEnvironment`` (and
``SandboxCheckEnvironment``, whose ``get_reward`` TRL takes as a reward): a tiny random Qwen2 steered to write tool
calls (tests/integration/trl_model.py), whose calls TRL parses and runs through the environment, and whose sessions
hold what the calls wrote, which the final checks then score."""

from __future__ import annotations

import gc
import importlib.util
import inspect
import textwrap
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import grpc
import pytest
from sandboxd_client._proto.sandboxd.v1 import sandboxd_pb2 as pb
from sandboxd_client._proto.sandboxd.v1 import sandboxd_pb2_grpc as pb_grpc
from sandboxd_client.trl import SandboxCheckEnvironment, SandboxEnvironment

from tests.conftest import DaemonProcess, skip_or_fail
from tests.integration.helpers import trl_offline

pytestmark = pytest.mark.docker
REPO = Path(__file__).resolve().parents[2]


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


# The check docs/client.md shows for code the model wrote, as written there (the block that imports `solution`).
def _doc_block(text: str, containing: str) -> str:
    """The fenced block of `text` that holds `containing`, dedented."""
    at = text.index(containing)
    start = text.rindex("```\n", 0, at) + len("```\n")
    return textwrap.dedent(text[start:text.index("```", at)].rstrip(" "))


RUN_APART_CHECK = _doc_block((REPO / "docs" / "client.md").read_text(), "from solution import fib")
FIB = "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n"


def test_a_final_check_scores_each_rollout_in_its_own_session(daemon: DaemonProcess,
                                                              open_sessions: Callable[[], int]) -> None:
    count = open_sessions
    factory = partial(SandboxCheckEnvironment, daemon.address, timeout=2, check=lambda row: row["check"])
    assert set(trl_tools(factory())) == {"python", "bash"}
    rollouts = [  # (the row's check, the rollout's tool calls, its reward)
        ("assert open('proof.txt').read() == '42'", [("python", "open('proof.txt', 'w').write(str(6 * 7))")], 1.0),
        ("float(open('proof.txt').read()) / 48", [("bash", "printf 24 > proof.txt")], 0.5),
        ("int(open('proof.txt').read()) == 42", [("python", "open('proof.txt', 'w').write('41')")], 0.0),
        ("import json\nimport numpy as np\nnp.mean(json.load(open('scores.json')))",  # np.float64(0.75)
         [("bash", "echo '[1, 0, 1, 1]' > scores.json")], 0.75),
        ("assert open('proof.txt').read() == '42'", [("python", "open('proof.txt', 'w').write(str(6 * 8))")],
         0.0),  # AssertionError
        ("while True: pass", [("python", "x = 1")], 0.0),  # past the session's 2 s: TIMEOUT
        ("import os\nos.path.exists('proof.txt')", [], 0.0),  # no tool call: checked in a fresh session
        ("1 / 0", [("python", "1")], 0.0),
        # The check sees the session's files, never its interpreter: `x` was the model's variable.
        ("'x' in globals()", [("python", "x = 1")], 0.0),
        # docs/client.md's check of a program the model wrote, run apart from the check.
        (RUN_APART_CHECK, [("python", f"open('solution.py', 'w').write({FIB!r})")], 1.0),
        (RUN_APART_CHECK, [("python", f"open('solution.py', 'w').write({FIB.replace('n - 2', 'n - 3')!r})")], 0.0),
    ]
    envs = [factory() for _ in rollouts]
    # TRL resets a batch's environments, runs their rollouts, then asks each for its reward.
    for env, (check, calls, _) in zip(envs, rollouts, strict=True):
        env.reset(prompt="p", check=check)
        for tool, argument in calls:
            getattr(env, tool)(argument)
    assert count() == sum(1 for _, calls, _ in rollouts if calls)
    assert [env.get_reward() for env in envs] == [reward for _, _, reward in rollouts]
    assert count() == 0, "each session closes once checked"


# -- what the model did in its session cannot make a wrong answer pass ------------------------------------------------

# The rollout's answer goes in answer.txt; 42 is right. Every attack below writes 41, then tries to have the check pass
# anyway. Each passed when the check ran as the last cell of the model's own interpreter (before RunCell's `final`).
WRONG_ANSWER = ("python", "open('answer.txt', 'w').write('41')")
READ_CHECK = "open('answer.txt').read().strip() == '42'"
# A check that starts programs: a Python (not isolated: what the session exported or wrote must not reach it), and
# one through bash (functions come into bash from the environment too: BASH_FUNC_name%%, BASH_ENV).
PYTHON_CHECK = ("import subprocess\nsubprocess.run(['python3', '-c', 'print(open(\"answer.txt\").read())'], "
                "capture_output=True, text=True).stdout.strip() == '42'")
BASH_CHECK = ("import subprocess\nsubprocess.run(['bash', '-c', "
              + repr("python3 -c 'print(open(\"answer.txt\").read())'")
              + "], capture_output=True, text=True).stdout.strip() == '42'")
PATCH_OPEN = "import builtins, io\nbuiltins.open = lambda *args, **kwargs: io.StringIO('42')\n"
# A thread that writes a result for the next cell (the check: seq 3, after these two calls) onto the interpreter's
# results socket once its own cell has answered, while a background process that prints fake verdicts holds the
# cell's stdout (the daemon waits up to 0.5 s for its end before stopping the session's processes).
FORGE_RESULT = """
import os, stat, subprocess, threading, time
from sandboxd.agent.protocol import encode_frame
subprocess.Popen(['bash', '-c', 'while true; do echo 1.0; echo True; sleep 0.05; done'])
def forge():
    time.sleep(0.2)
    for fd in map(int, os.listdir('/proc/self/fd')):
        try:
            if stat.S_ISSOCK(os.fstat(fd).st_mode):
                os.write(fd, encode_frame({"status": "ok", "value": "1.0", "message": "", "seq": 3}))
        except OSError:
            pass
threading.Thread(target=forge, daemon=True).start()
"""
ATTACKS = {  # name: (the model's tool calls after its wrong answer, the check)
    "patched_open": ([("python", PATCH_OPEN)], READ_CHECK),
    "patched_float": ([("python", "import builtins\nbuiltins.float = lambda *args: 42.0")],
                      "float(open('answer.txt').read()) == 42"),
    "patched_repr": ([("python", "import builtins\nbuiltins.repr = lambda value: '1.0'")], READ_CHECK),
    "rebound_module_function": ([("python", "import json\njson.load = lambda file: 42")],
                                "import json\njson.load(open('answer.txt')) == 42"),
    "always_equal_object": ([("python", "class Equal:\n    def __eq__(self, other):\n        return True\n"
                                        "answer = Equal()")], "answer == 42"),
    "trace_ends_the_check": ([("python", "import sys\ndef trace(frame, event, arg):\n"
                                         "    if frame.f_code.co_filename.startswith('<cell'):\n"
                                         "        raise SystemExit(0)\nsys.settrace(trace)")],
                             f"assert {READ_CHECK}"),
    "fake_json_in_cwd": ([("python", "open('json.py', 'w').write('def load(file):\\n    return 42\\n')\n"
                                     "import sys\ndel sys.modules['json']")],
                         "import json\njson.load(open('answer.txt')) == 42"),
    "fake_stdlib_module_in_cwd": ([("bash", "printf 'class Fraction:\\n    def __init__(self, *args):\\n"
                                           "        pass\\n    def __eq__(self, other):\\n        return True\\n'"
                                           " > fractions.py")],
                                  "import fractions\nfractions.Fraction(open('answer.txt').read()) == 42"),
    "cd_elsewhere": ([("python", "import os\nos.makedirs('elsewhere')\n"
                                 "open('elsewhere/answer.txt', 'w').write('42')\nos.chdir('elsewhere')")],
                     READ_CHECK),
    "pythonpath_sitecustomize_startup": ([("python", f"open('sitecustomize.py', 'w').write({PATCH_OPEN!r})\n"
                                                     "import os\nos.environ['PYTHONPATH'] = os.getcwd()\n"
                                                     "os.environ['PYTHONSTARTUP'] = 'sitecustomize.py'")],
                                         PYTHON_CHECK),
    "user_site_usercustomize": ([("python", "import os, sys\n"
                                            "site = os.path.expanduser(f'~/.local/lib/python{sys.version_info.major}."
                                            "{sys.version_info.minor}/site-packages')\nos.makedirs(site)\n"
                                            f"open(site + '/usercustomize.py', 'w').write({PATCH_OPEN!r})")],
                                PYTHON_CHECK),
    "bash_functions_python3_and_env": ([("python", "import os\n"
                                                   "os.environ['BASH_FUNC_python3%%'] = '() { echo 42; }'\n"
                                                   "os.environ['BASH_FUNC_env%%'] = '() { echo 42; }'\n"
                                                   "open('functions.sh', 'w').write('python3() { echo 42; }')\n"
                                                   "os.environ['BASH_ENV'] = os.path.abspath('functions.sh')")],
                                       BASH_CHECK),
    "leftover_forges_the_result": ([("python", FORGE_RESULT)], READ_CHECK),
}


@pytest.mark.parametrize("attack", list(ATTACKS))
def test_nothing_the_model_did_in_its_session_passes_a_wrong_answer(daemon: DaemonProcess, attack: str,
                                                                   open_sessions: Callable[[], int]) -> None:
    calls, check = ATTACKS[attack]
    env = SandboxCheckEnvironment(daemon.address, timeout=20, check=check)
    if attack != "always_equal_object":  # a check of the interpreter's names, which none passes now
        # The check is sound: an honest rollout that wrote the right answer passes it.
        env.reset(prompt="p")
        env.python("open('answer.txt', 'w').write('42')")
        assert env.get_reward() == 1.0
    env.reset(prompt="p")
    for tool, argument in [WRONG_ANSWER, *calls]:
        getattr(env, tool)(argument)
    assert env.get_reward() == 0.0
    assert open_sessions() == 0


# -- a real GRPOTrainer step ------------------------------------------------------------------------------------------

QUESTION = "What is 6 times 7? Use the tools."
# Each rollout writes its product to a file with the python tool, reads it back with the bash tool, and answers
# with what bash printed: the answer is right only if the sandbox really ran both. The second rollout of each
# group multiplies the wrong numbers, so the group's rewards differ and the step has a gradient.
PRODUCTS = (("6 * 7", "42"), ("6 * 8", "48"))  # (expression, its value)


def grpo_script(context: str, row: int) -> str:
    """The assistant turns of a rollout: python tool call, bash tool call, then an answer from the tools' output."""
    from tests.integration.trl_model import tool_answers, tool_call

    answers = tool_answers(context)
    if not answers:
        product, _ = PRODUCTS[row % 2]
        return tool_call("python", code=f"with open('proof.txt', 'w') as f:\n    f.write(str({product}))\n{product}")
    if len(answers) == 1:
        return tool_call("bash", command="cat proof.txt")
    return f"The answer is \\boxed{{{answers[-1]}}}."


@pytest.fixture
def offline_hf(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    with trl_offline(monkeypatch, tmp_path / "hf_home"):
        yield


def grpo_args(tmp_path: Path) -> Any:
    from trl import GRPOConfig

    return GRPOConfig(
        output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, num_generations=2, max_steps=1,
        max_completion_length=512, learning_rate=1e-2, logging_steps=1, save_strategy="no", report_to="none",
        use_cpu=True, bf16=False, seed=0, dataloader_num_workers=0, disable_tqdm=True,
    )


def check_tool_rollouts(trainer: Any) -> None:
    """What TRL logged of the step's four rollouts: each called both tools, and its answer is the tool's output."""
    completions = list(trainer._logs["completion"])
    assert len(completions) == 4
    for i, completion in enumerate(completions):
        roles = [m["role"] for m in completion]
        assert roles == ["assistant", "tool", "assistant", "tool", "assistant"], completion
        calls = [m["tool_calls"][0]["function"] for m in completion if m.get("tool_calls")]
        assert [c["name"] for c in calls] == ["python", "bash"]
        _, product = PRODUCTS[i % 2]
        assert [m["content"] for m in completion if m["role"] == "tool"] == [product, product]
        assert completion[-1]["content"] == f"The answer is \\boxed{{{product}}}."
    step = next(e for e in trainer.state.log_history if "loss" in e)
    assert step["tools/call_frequency"] == 2.0 and step["tools/failure_frequency"] == 0.0


def check_one_step(trainer: Any, model: Any, before: dict[str, Any]) -> None:
    """The trainer took its one step, which changed a weight of ``model`` (``before``: its parameters before), and
    its rollouts called the tools as they should (check_tool_rollouts)."""
    import torch

    assert trainer.state.global_step == 1
    changed = [name for name, p in model.named_parameters() if not torch.equal(p, before[name])]
    assert changed, "the optimizer step changed no weight"
    check_tool_rollouts(trainer)


@pytest.mark.slow
@pytest.mark.usefixtures("offline_hf")
def test_grpo_trainer_step_runs_its_tool_calls_in_the_rollouts_sessions(
        daemon: DaemonProcess, channel: grpc.Channel, open_sessions: Callable[[], int], tmp_path: Path) -> None:
    """One GRPOTrainer step on CPU: TRL renders the tools into the chat template, parses the model's tool calls,
    calls SandboxEnvironment.python and .bash in each rollout's session, and scores the answers with sandboxd."""
    from datasets import Dataset
    from sandboxd_client.trl import make_reward_func
    from trl import GRPOTrainer

    from tests.integration.trl_model import steered_model, tokenizer

    tok = tokenizer()
    model = steered_model(tok, grpo_script)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    trainer = GRPOTrainer(
        model=model, processing_class=tok, args=grpo_args(tmp_path),
        train_dataset=Dataset.from_list([{"prompt": [{"role": "user", "content": QUESTION}], "answer": "42"}] * 2),
        reward_funcs=[make_reward_func("math", address=daemon.address)],
        environment_factory=partial(SandboxEnvironment, daemon.address, timeout=20),
    )
    trainer.train()

    check_one_step(trainer, model, before)
    logs: dict[str, Any] = trainer._logs
    assert list(logs["rewards"]["sandboxd_math"]) == [1.0, -1.0, 1.0, -1.0]
    # The daemon's side: the step's four rollouts still hold their sessions (a rollout's closes at the next reset),
    # each of which ran two cells, and the file the python tool wrote is there.
    sessions = pb_grpc.SessionsStub(channel).List(pb.ListSessionsRequest(), timeout=10).sessions
    assert open_sessions() == 4 and sorted(s.cells_run for s in sessions)[-4:] == [2, 2, 2, 2]
    pool = [env for env in trainer._environment_pool[None] if isinstance(env, SandboxEnvironment)]
    assert sorted(env.python("open('proof.txt').read()") for env in pool) == ["'42'", "'42'", "'48'", "'48'"]
    SandboxEnvironment.close_all()
    assert open_sessions() == 0


# Two rows, one check each, run in each rollout's session once it ends: the first passes when the file the rollout's
# tools wrote and read holds 42; the second's value is what the file holds, minus 40 (48 is the wrong product).
CHECKS = ("assert open('proof.txt').read() == '42'", "int(open('proof.txt').read()) - 40")


@pytest.mark.slow
@pytest.mark.usefixtures("offline_hf")
@pytest.mark.parametrize("with_reward_funcs", [False, True], ids=["get_reward_alone", "beside_reward_funcs"])
def test_grpo_trainer_step_scores_each_rollout_by_the_final_check_in_its_session(
        daemon: DaemonProcess, open_sessions: Callable[[], int], tmp_path: Path, with_reward_funcs: bool) -> None:
    """GRPOTrainer takes SandboxCheckEnvironment.get_reward as a reward source (alone: no reward_funcs; or beside
    them), and each rollout's reward is its row's check run in the session its tool calls wrote to."""
    from datasets import Dataset
    from sandboxd_client.trl import make_reward_func
    from trl import GRPOTrainer

    from tests.integration.trl_model import steered_model, tokenizer

    tok = tokenizer()
    model = steered_model(tok, grpo_script)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    prompt = [{"role": "user", "content": QUESTION}]
    trainer = GRPOTrainer(
        model=model, processing_class=tok, args=grpo_args(tmp_path),
        train_dataset=Dataset.from_list([{"prompt": prompt, "answer": "42", "check": check} for check in CHECKS]),
        reward_funcs=[make_reward_func("math", address=daemon.address)] if with_reward_funcs else None,
        environment_factory=partial(SandboxCheckEnvironment, daemon.address, timeout=20,
                                    check=lambda row: row["check"]),
    )
    trainer.train()

    check_one_step(trainer, model, before)
    logs: dict[str, Any] = trainer._logs
    rewards = {name: list(values) for name, values in logs["rewards"].items()}
    assert set(rewards) == ({"sandboxd_math", "SandboxCheckEnvironment"} if with_reward_funcs
                            else {"SandboxCheckEnvironment"})
    # Each group is one row's two rollouts (42, then 48): the first row's check passes or raises, the second's
    # value is the product the rollout's own session holds, less 40.
    checked = rewards["SandboxCheckEnvironment"]
    assert {tuple(checked[:2]), tuple(checked[2:])} == {(1.0, 0.0), (2.0, 8.0)}, checked
    if with_reward_funcs:
        assert rewards["sandboxd_math"] == [1.0, -1.0, 1.0, -1.0]
    step = next(e for e in trainer.state.log_history if "loss" in e)
    assert step["rewards/SandboxCheckEnvironment/mean"] == pytest.approx(11 / 4)
    assert open_sessions() == 0, "every rollout's session closed once checked"
