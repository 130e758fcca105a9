"""Every TRL snippet of the README and the docs, and examples/trl_grpo.py, run against a real daemon.

The snippets are read from the files themselves: every fenced ``python`` block of README.md, docs/client.md and
docs/sessions.md that names TRL (``GRPOTrainer`` or ``sandboxd_client.trl``). Each runs as written, with
``SANDBOXD_ADDRESS`` set to the test's daemon and only its ``...`` filled in: ``model=...`` is a tiny steered
model (tests/integration/trl_model.py) and a bare ``...`` argument stands for the rest of a user's arguments
(that model, its tokenizer, a one-step ``GRPOConfig`` and a one-row dataset). The trainer then takes its step
(``trainer.train()``, unless the snippet calls it), and the rewards it logged are checked: the model gives a right
answer, which sandboxd scores 1.0 whether the snippet's reward function is for math, code or both, or its reward is
a final check of what the model's tool call left in the session.

examples/trl_grpo.py cannot fetch GSM8K or Qwen2.5 here: its ``main()`` runs with ``load_dataset`` giving rows
of GSM8K's shape and the model name mapped to the steered model; its own ``to_conversation``, reward function
and ``GRPOConfig`` are used.
"""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from sandboxd_client._proto.sandboxd.v1 import sandboxd_pb2 as pb
from sandboxd_client._proto.sandboxd.v1 import sandboxd_pb2_grpc as pb_grpc

from tests.conftest import DaemonProcess
from tests.integration.helpers import trl_offline

pytestmark = [pytest.mark.docker, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
DOCS = ("README.md", "docs/client.md", "docs/sessions.md")
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
# The snippets' placeholders, and what each becomes.
FILLS = (("model=...", "model=MODEL"), ("(...,", "(model=MODEL, **REST,"), (", ...)", ", **REST)"))

QUESTION = "What is 6 * 7? Give a program that multiplies the two integers it reads, and the answer."
# One right answer for every kind of reward function: a program that passes the row's tests and a boxed number.
ANSWER = "```python\na, b = map(int, input().split())\nprint(a * b)\n```\nSo the answer is \\boxed{42}."


def trl_snippets() -> list[tuple[str, str]]:
    """(where, code) of every python block in the docs that names TRL."""
    found = []
    for doc in DOCS:
        text = (REPO / doc).read_text()
        for match in BLOCK.finditer(text):
            if "GRPOTrainer" in match.group(1) or "sandboxd_client.trl" in match.group(1):
                found.append((f"{doc}:{text.count(chr(10), 0, match.start()) + 2}", match.group(1)))
    return found


SNIPPETS = trl_snippets()


def answer_script(context: str, row: int) -> str:
    """Answer right away; with tools in the prompt, first have the bash tool work the product out (and leave it in
    answer.txt, where the docs' final check looks: the check sees the session's files)."""
    from tests.integration.trl_model import tool_answers, tool_call

    if "<tools>" in context and not tool_answers(context):
        return tool_call("bash", command="echo $((6 * 7)) | tee answer.txt")
    return ANSWER


@pytest.fixture
def offline_hf(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    with trl_offline(monkeypatch, tmp_path / "hf_home"):
        yield


@pytest.fixture
def trl_setup(daemon: DaemonProcess, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
              offline_hf: None) -> dict[str, Any]:
    """What a snippet's ``...`` stands for, and the trainer class it names."""
    monkeypatch.setenv("SANDBOXD_ADDRESS", daemon.address)
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from tests.integration.trl_model import steered_model, tokenizer

    tok = tokenizer()
    row = {"prompt": [{"role": "user", "content": QUESTION}], "answer": "42",
           "tests": {"inputs": ["6 7\n", "2 3\n"], "outputs": ["42\n", "6\n"]}}
    return {
        "GRPOTrainer": GRPOTrainer,
        "MODEL": steered_model(tok, answer_script),
        "REST": {
            "processing_class": tok,
            "train_dataset": Dataset.from_list([row] * 2),
            "args": one_step_config(GRPOConfig, tmp_path / "out"),
        },
    }


def one_step_config(config_class: Any, output_dir: Path, /, **given: Any) -> Any:
    """A GRPOConfig for one step on CPU: the given arguments, with the sizes and outputs of a test."""
    return config_class(**{
        **given, "output_dir": str(output_dir), "max_steps": 1, "per_device_train_batch_size": 2, "num_generations": 2,
        "max_completion_length": 256, "logging_steps": 1, "save_strategy": "no", "report_to": "none",
        "use_cpu": True, "bf16": False, "seed": 0, "dataloader_num_workers": 0, "disable_tqdm": True,
    })


def test_the_docs_have_the_trl_snippets_this_test_knows() -> None:
    """A snippet added to the docs is run by the test below; one that disappears is noticed here."""
    where = [w.split(":")[0] for w, _ in SNIPPETS]
    assert where == ["README.md", "docs/client.md", "docs/client.md", "docs/client.md"], SNIPPETS


@pytest.mark.parametrize(("where", "snippet"), SNIPPETS, ids=[w for w, _ in SNIPPETS])
def test_trl_snippet_runs_as_written(where: str, snippet: str, trl_setup: dict[str, Any],
                                     channel: grpc.Channel) -> None:
    code = snippet
    for placeholder, fill in FILLS:
        code = code.replace(placeholder, fill)
    printed: list[str] = []  # what the snippet's own print() calls print (the trainer prints its logs too)
    namespace = {**trl_setup, "print": lambda *values: printed.append(" ".join(map(str, values)))}
    exec(compile(code, where, "exec"), namespace)
    trainer = namespace["trainer"]
    if "trainer.train()" not in code:
        trainer.train()
    # What the snippet says it prints (its "# 1.0" comments), it prints.
    assert printed == re.findall(r"#\s*(-?\d+\.\d+)\s*$", snippet, re.M)
    assert trainer.state.global_step == 1
    logged = trainer._logs["rewards"]
    assert len(logged) == 1 and list(next(iter(logged.values()))) == [1.0, 1.0], logged
    if "environment_factory" in code:
        step = next(e for e in trainer.state.log_history if "loss" in e)
        assert step["tools/call_frequency"] == 1.0 and step["tools/failure_frequency"] == 0.0
        tool_answers = [m["content"] for c in trainer._logs["completion"] for m in c if m["role"] == "tool"]
        assert tool_answers == ["42", "42"], "the bash tool ran in the sandbox"
        # The snippet's close_all(), or the final check, gave the rollouts' sessions back.
        assert not pb_grpc.SessionsStub(channel).List(pb.ListSessionsRequest(), timeout=10).sessions


def test_trl_grpo_example_runs(trl_setup: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = importlib.util.spec_from_file_location("trl_grpo_example", REPO / "examples" / "trl_grpo.py")
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    from datasets import Dataset

    # GSM8K's shape: a question, and a worked answer ending in "#### <number>".
    gsm8k = Dataset.from_list([{"question": "Natalia sold 48 clips in April and half as many in May. How many?",
                                "answer": "She sold 48 / 2 = 24 in May.\n48 + 24 = 72\n#### 72"}] * 2)
    loaded: list[tuple[Any, ...]] = []

    def load_dataset(*args: Any, **kwargs: Any) -> Any:
        loaded.append(args)
        return gsm8k

    trainers: list[Any] = []
    trainer_class: Callable[..., Any] = trl_setup["GRPOTrainer"]

    def grpo_trainer(*, model: str, args: Any, **kwargs: Any) -> Any:
        assert model == "Qwen/Qwen2.5-0.5B-Instruct"
        trainer = trainer_class(model=trl_setup["MODEL"], processing_class=trl_setup["REST"]["processing_class"],
                                args=args, **kwargs)
        trainers.append(trainer)
        return trainer

    from tests.integration.trl_model import steered_model

    trl_setup["MODEL"] = steered_model(trl_setup["REST"]["processing_class"], lambda context, row: "\\boxed{72}")
    configs: list[dict[str, Any]] = []

    def grpo_config(**given: Any) -> Any:
        configs.append(given)
        from trl import GRPOConfig

        return one_step_config(GRPOConfig, tmp_path / "out", **given)

    monkeypatch.setattr(example, "load_dataset", load_dataset)
    monkeypatch.setattr(example, "GRPOTrainer", grpo_trainer)
    monkeypatch.setattr(example, "GRPOConfig", grpo_config)
    example.main()
    assert loaded == [("openai/gsm8k", "main")]
    assert configs[0]["num_generations"] == 8  # the example's own; one step here generates 2
    (trainer,) = trainers
    assert trainer.state.global_step == 1
    assert list(trainer._logs["rewards"]["sandboxd_math"]) == [1.0, 1.0]
    prompts = trainer._logs["prompt"]
    assert all("#### " not in str(p) and "Natalia" in str(p) for p in prompts)
