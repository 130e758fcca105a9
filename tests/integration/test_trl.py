"""A real TRL ``GRPOTrainer`` whose reward function is ours, scoring with a real daemon.

CPU only and offline: a 2-layer Llama (hidden 64) and a word-level tokenizer
are built in the test and saved to a temp folder; the Hugging Face hub is
switched off (``HF_HUB_OFFLINE``, ``TRANSFORMERS_OFFLINE``, a temp ``HF_HOME``).
The trainer generates completions from a tiny vocabulary holding right and
wrong boxed answers, calls ``sandboxd_math`` (dataset column ``answer``), and
logs per-completion rewards (``trainer._logs``) and their mean
(``rewards/sandboxd_math/mean`` in ``state.log_history``). The test then scores
the very completions the trainer logged with a separate client and checks
that the trainer logged exactly what the daemon computed.

Needs torch, transformers, trl and datasets: the ``test`` extra has them and
scripts/setup.sh installs it (torch==2.13.0 first: the local CPU wheel, not a
multi-GB CUDA build from PyPI). By hand::

    .venv/bin/pip install torch==2.13.0 && .venv/bin/pip install -e '.[test]'

Without them the tests skip, except under CI (``CI`` set), where they fail.
"""

from __future__ import annotations

import importlib.util
import math
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sandboxd_client import SandboxClient, Status, math_job
from sandboxd_client.trl import make_async_reward_func, make_reward_func

from tests.conftest import DaemonProcess, skip_or_fail

MISSING = [m for m in ("torch", "transformers", "trl", "datasets") if importlib.util.find_spec(m) is None]
pytestmark = [pytest.mark.docker, pytest.mark.slow]


@pytest.fixture(scope="module", autouse=True)
def _trl_installed() -> None:
    if MISSING:
        skip_or_fail(f"no {', '.join(MISSING)}: run scripts/setup.sh (the test extra; torch==2.13.0 first)")

# Whitespace-split words: "\boxed{4}" stays one token, so random generations
# from an untrained model hold right, wrong and missing answers.
VOCAB = [
    "<pad>", "<eos>", "<unk>",
    "what", "is", "two", "plus", "three", "?", "the", "answer", "so",
    "\\boxed{4}", "\\boxed{5}", "\\boxed{6}", "4", "5", "6",
]  # fmt: skip
PROMPTS = [("what is two plus two ?", "4"), ("what is two plus three ?", "5"), ("what is three plus three ?", "6")]
REWARD_NAME = "sandboxd_math"
FAILURE_VALUE = 0.0


@pytest.fixture(scope="module")
def offline_hf(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Hub off and a temp HF_HOME, set before transformers is first imported."""
    mp = pytest.MonkeyPatch()
    home = tmp_path_factory.mktemp("hf_home")
    for key, value in {
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "HF_HOME": str(home),
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "WANDB_DISABLED": "true",
    }.items():
        mp.setenv(key, value)
    try:
        yield home
    finally:
        mp.undo()


@pytest.fixture(scope="module")
def tiny_model(offline_hf: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random 2-layer Llama and a word-level tokenizer, saved where the trainer loads them from."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    folder = tmp_path_factory.mktemp("tiny_llama")
    vocab = {word: i for i, word in enumerate(VOCAB)}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>"
    )
    tokenizer.save_pretrained(folder)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(VOCAB),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=64,
        pad_token_id=vocab["<pad>"],
        eos_token_id=vocab["<eos>"],
        bos_token_id=None,
        tie_word_embeddings=False,
    )
    LlamaForCausalLM(config).save_pretrained(folder)
    return folder


def _train(model_dir: Path, output_dir: Path, reward_func: Any, steps: int = 2) -> Any:
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    dataset = Dataset.from_list([{"prompt": p, "answer": a} for p, a in PROMPTS * 4])
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    args = GRPOConfig(
        output_dir=str(output_dir),
        per_device_train_batch_size=4,
        num_generations=2,
        max_completion_length=6,
        max_steps=steps,
        learning_rate=1e-3,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        bf16=False,
        seed=0,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    trainer = GRPOTrainer(
        model=str(model_dir),
        reward_funcs=[reward_func],
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
    )

    # The trainer keeps only the last generation batch in _logs: take each step's copy.
    class Snapshot(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            logs: dict[str, Any] = trainer._logs
            snapshots.append(
                (list(logs["prompt"]), list(logs["completion"]), list(logs["rewards"][REWARD_NAME]))
            )

    snapshots: list[tuple[list[str], list[str], list[float]]] = []
    trainer.add_callback(Snapshot())
    trainer.train()
    trainer.snapshots = snapshots  # type: ignore[attr-defined]  # read back by the tests
    return trainer


def _check_against_daemon(trainer: Any, address: str, steps: int) -> list[float]:
    """Rescore what the trainer logged with our own client; both must agree exactly."""
    answers = dict(PROMPTS)
    step_means = [e[f"rewards/{REWARD_NAME}/mean"] for e in trainer.state.log_history if "loss" in e]
    assert len(trainer.snapshots) == len(step_means) == steps
    every: list[float] = []
    with SandboxClient(address) as client:
        for (prompts, completions, logged), mean in zip(trainer.snapshots, step_means, strict=True):
            assert len(prompts) == len(completions) == len(logged) == 4
            jobs = [
                math_job(c, answers[p], failure_value=FAILURE_VALUE)
                for p, c in zip(prompts, completions, strict=True)
            ]
            results = client.score_batch(jobs)
            assert not any(r.is_infrastructure_failure for r in results), results
            daemon_rewards = [r.reward for r in results]
            assert logged == daemon_rewards, list(zip(completions, logged, daemon_rewards, strict=True))
            assert math.isclose(mean, sum(daemon_rewards) / len(daemon_rewards), abs_tol=1e-6)
            every += daemon_rewards
            for r in results:
                assert r.status in (Status.OK, Status.WRONG_ANSWER, Status.NO_ANSWER)
    return every


def test_grpo_trainer_with_sandboxd_reward(tiny_model: Path, daemon: DaemonProcess, tmp_path: Path) -> None:
    calls: list[dict[str, Any]] = []
    metrics: dict[str, list[float]] = {}
    inner = make_reward_func("math", address=daemon.address, failure_value=FAILURE_VALUE, infra_failure_value=None)

    # Only observes what TRL passes in; the rewards are inner's, unchanged.
    def reward(*args: Any, **kwargs: Any) -> list[float | None]:
        calls.append({"thread": threading.current_thread().name, "keys": set(kwargs)})
        log_metric = kwargs["log_metric"]

        def capture(name: str, value: float) -> None:
            metrics.setdefault(name, []).append(value)
            log_metric(name, value)

        return inner(*args, **{**kwargs, "log_metric": capture})

    reward.__name__ = inner.__name__
    assert reward.__name__ == REWARD_NAME

    trainer = _train(tiny_model, tmp_path / "out", reward)
    rewards = _check_against_daemon(trainer, daemon.address, steps=2)
    assert set(rewards) <= {0.0, 1.0}
    # Seed 0 on this vocabulary samples both right and wrong answers: the comparison is not vacuous.
    assert 0.0 in rewards and 1.0 in rewards, trainer.snapshots
    assert len(calls) == 2
    assert calls[0]["thread"] == threading.main_thread().name
    assert {"prompts", "completions", "completion_ids", "trainer_state", "log_metric", "answer"} <= calls[0]["keys"]
    assert metrics[f"{REWARD_NAME}/infra_failure_rate"] == [0.0, 0.0]
    logged = [e for e in trainer.state.log_history if "loss" in e]
    assert all(f"{REWARD_NAME}/ok_rate" in e for e in logged), logged[0].keys()


def test_grpo_trainer_with_async_sandboxd_reward(
    tiny_model: Path, daemon: DaemonProcess, tmp_path: Path
) -> None:
    threads: list[str] = []
    inner = make_async_reward_func(
        "math", address=daemon.address, failure_value=FAILURE_VALUE, infra_failure_value=None
    )

    async def reward(*args: Any, **kwargs: Any) -> list[float | None]:
        threads.append(threading.current_thread().name)
        return await inner(*args, **kwargs)

    reward.__name__ = inner.__name__
    trainer = _train(tiny_model, tmp_path / "out", reward)
    _check_against_daemon(trainer, daemon.address, steps=2)
    assert threads == ["GRPOTrainer-AsyncLoop"] * 2
