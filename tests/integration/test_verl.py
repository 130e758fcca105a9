"""``sandboxd_client.verl`` called the way verl calls a custom reward function, against a real daemon.

verl is not installed in the test environment: ``pip install verl`` (0.9.1)
takes about 2 minutes, adds ~1.9 GB (ray, wandb, tensorboard, tensordict,
peft, ...) and pins ``transformers`` 5.10.4, which would downgrade the
transformers 5.23 that TRL's extra needs. So these tests replicate verl
0.9.1's call paths exactly (read from its source):

* loading: ``verl.trainer.ppo.reward.get_custom_reward_fn`` loads
  ``custom_reward_function.path`` / ``name`` from a file and wraps it as
  ``partial(_call_with_kwargs, raw_fn, reward_kwargs)`` (``_call_with_kwargs_async``
  for an ``async def``), where ``reward_kwargs`` override call-time kwargs;
* ``reward_manager=naive`` in the reward loop
  (``verl/experimental/reward_loop/reward_manager/naive.py``,
  ``NaiveRewardManager.run_single``): one call per sample, all samples
  gathered concurrently; a sync ``compute_score`` runs in the event loop's
  default ``ThreadPoolExecutor`` (``loop.run_in_executor(None, lambda: ...)``),
  an ``async def`` one is awaited on the loop. Keyword arguments
  ``data_source=, solution_str=, ground_truth=, extra_info=``, where
  ``extra_info`` also carries ``num_turns`` and ``rollout_reward_scores``;
  the score is ``result["score"]`` and every key goes to ``reward_extra_info``;
* the legacy ``verl/workers/reward_manager/naive.py``: the same call,
  serially on the driver's main thread;
* ``reward_manager=batch`` (``verl/workers/reward_manager/batch.py``,
  ``BatchRewardManager.verify``): one call with ``data_sources=`` (a numpy
  object array from ``non_tensor_batch``), ``solution_strs=`` (list),
  ``ground_truths=`` (list), ``extra_infos=`` (numpy array of dicts) and
  ``**reward_kwargs``; it indexes ``scores[i]["score"]``.

When verl *is* importable, ``test_real_verl_loader`` also loads the function
through verl's own ``get_custom_reward_fn``.
"""

from __future__ import annotations

import asyncio
import importlib.util
import inspect
import json
import threading
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from sandboxd_client import verl as sandboxd_verl

from tests.conftest import DaemonProcess

np = pytest.importorskip("numpy")

pytestmark = pytest.mark.docker

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "verl_reward.py"
KEYS = {"score", "acc", "pass_rate", "status", "infra_failure"}
ADD = "```python\nprint(sum(map(int, input().split())))\n```"
ADD_TESTS = json.dumps({"inputs": ["1 2\n", "2 2\n"], "outputs": ["3\n", "4\n"]})
# verl's prime_code function-call form: arguments as JSON one per line, the return value as JSON.
PRIME_CALL = "```python\ndef add(a, b):\n    return a + b\n```"
PRIME_CALL_TESTS = json.dumps({"inputs": ["1\n2", "[1]\n[2]"], "outputs": ["3", "[1, 2]"], "fn_name": "add"})

# (data_source, solution_str, ground_truth, extra_info, expected score, acc, pass_rate, status)
ROWS: list[tuple[str, str, Any, dict[str, Any], float, float, float, str]] = [
    ("openai/gsm8k", "so the answer is \\boxed{72}", "72", {"index": 0}, 1.0, 1.0, 1.0, "OK"),
    ("openai/gsm8k", "\\boxed{71}", "72", {"index": 1}, -1.0, 0.0, 0.0, "WRONG_ANSWER"),
    ("lighteval/MATH", "\\boxed{\\frac{1}{2}}", "\\frac{1}{2}", {}, 1.0, 1.0, 1.0, "OK"),
    ("math_dapo", "no idea", "3", {}, -1.0, 0.0, 0.0, "NO_ANSWER"),
    ("codecontests", ADD, ADD_TESTS, {"language": "python"}, 1.0, 1.0, 1.0, "OK"),
    ("codecontests", "```python\nprint(3)\n```", ADD_TESTS, {}, -1.0, 0.0, 0.5, "WRONG_ANSWER"),
    ("likaixin/TACO-verified", ADD, json.loads(ADD_TESTS), {}, 1.0, 1.0, 1.0, "OK"),
    ("apps", PRIME_CALL, PRIME_CALL_TESTS, {}, 1.0, 1.0, 1.0, "OK"),
    ("taco", PRIME_CALL.replace("a + b", "a"), PRIME_CALL_TESTS, {}, -1.0, 0.0, 0.0, "WRONG_ANSWER"),
]


def load_like_verl(name: str, reward_kwargs: dict[str, Any]) -> Callable[..., Any]:
    """``get_custom_reward_fn`` of verl 0.9.1: load from the file, wrap with reward_kwargs."""
    spec = importlib.util.spec_from_file_location("custom_module", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    raw_fn = getattr(module, name)

    def _call_with_kwargs(raw_fn: Any, extra_kwargs: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        return raw_fn(*args, **{**kwargs, **extra_kwargs})

    async def _call_with_kwargs_async(raw_fn: Any, extra_kwargs: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        return await raw_fn(*args, **{**kwargs, **extra_kwargs})

    if not inspect.iscoroutinefunction(raw_fn):
        return partial(_call_with_kwargs, raw_fn, reward_kwargs)
    return partial(_call_with_kwargs_async, raw_fn, reward_kwargs)


def extra_info_of(row_extra: dict[str, Any]) -> dict[str, Any]:
    # verl adds these to every sample's extra_info before calling.
    return {**row_extra, "num_turns": None, "rollout_reward_scores": {}}


def check(score: Any, row: tuple[Any, ...]) -> None:
    *_, expected, acc, pass_rate, status = row
    assert isinstance(score, dict) and set(score) == KEYS, score
    assert (score["score"], score["acc"], score["pass_rate"], score["status"]) == (expected, acc, pass_rate, status)
    assert score["infra_failure"] is False


@pytest.fixture
def reward_kwargs(daemon: DaemonProcess) -> dict[str, Any]:
    return {"address": daemon.address, "infra_failure_value": 0.0}


async def test_reward_loop_naive_manager_threads(reward_kwargs: dict[str, Any]) -> None:
    """Sync compute_score from the loop's default ThreadPoolExecutor, every sample at once."""
    compute_score = load_like_verl("compute_score", reward_kwargs)
    assert not inspect.iscoroutinefunction(compute_score)
    loop = asyncio.get_running_loop()
    threads: set[str] = set()

    async def run_single(row: tuple[Any, ...]) -> dict[str, Any]:
        data_source, solution_str, ground_truth, extra, *_ = row
        extra_info = extra_info_of(extra)

        def call() -> Any:
            threads.add(threading.current_thread().name)
            return compute_score(
                data_source=data_source, solution_str=solution_str, ground_truth=ground_truth, extra_info=extra_info
            )

        result = await loop.run_in_executor(None, call)
        return {"reward_score": result["score"], "reward_extra_info": dict(result)}

    rows = ROWS * 3
    outs = await asyncio.gather(*(run_single(row) for row in rows))
    for out, row in zip(outs, rows, strict=True):
        check(out["reward_extra_info"], row)
        assert out["reward_score"] == row[4]
    assert threading.main_thread().name not in threads
    assert len(threads) > 1, "verl's calls should have run on several executor threads"


async def test_reward_loop_naive_manager_async(reward_kwargs: dict[str, Any]) -> None:
    """``compute_score_async`` is awaited on verl's loop (``is_async_reward_score``)."""
    compute_score = load_like_verl("compute_score_async", reward_kwargs)
    assert inspect.iscoroutinefunction(compute_score)
    outs = await asyncio.gather(
        *(
            compute_score(data_source=ds, solution_str=s, ground_truth=gt, extra_info=extra_info_of(extra))
            for ds, s, gt, extra, *_ in ROWS
        )
    )
    for out, row in zip(outs, ROWS, strict=True):
        check(out, row)


def test_legacy_naive_manager_serial(reward_kwargs: dict[str, Any]) -> None:
    compute_score = load_like_verl("compute_score", reward_kwargs)
    for row in ROWS:
        data_source, solution_str, ground_truth, extra, *_ = row
        score = compute_score(
            data_source=data_source,
            solution_str=solution_str,
            ground_truth=ground_truth,
            extra_info=extra_info_of(extra),
        )
        check(score, row)


def test_batch_manager(reward_kwargs: dict[str, Any]) -> None:
    """``BatchRewardManager.verify``: numpy columns in, one dict per sample out, in order."""
    rows = ROWS * 4
    compute_score = load_like_verl("compute_score_batch", {})
    scores = compute_score(
        data_sources=np.array([r[0] for r in rows], dtype=object),
        solution_strs=[r[1] for r in rows],
        ground_truths=[r[2] for r in rows],
        extra_infos=np.array([extra_info_of(r[3]) for r in rows], dtype=object),
        **reward_kwargs,
    )
    assert len(scores) == len(rows)
    for score, row in zip(scores, rows, strict=True):
        check(score, row)
    # verl stacks each key across samples: every dict has the same keys and value types.
    assert all({k: type(v) for k, v in s.items()} == {k: type(v) for k, v in scores[0].items()} for s in scores)


def test_a_row_the_daemon_refuses_costs_only_its_own_score(reward_kwargs: dict[str, Any]) -> None:
    """The real daemon refuses a whole batch, before any of it runs, for one job it cannot take (here a
    language it does not know, which only the daemon can tell); the other rows are still scored."""
    rows = ROWS * 2
    extra_infos = [extra_info_of(r[3]) for r in rows]
    refused = len(rows) // 2
    extra_infos[refused] = {**(extra_infos[refused] or {}), "language": "cobol"}
    data_sources = [r[0] for r in rows]
    data_sources[refused] = "codecontests"
    scores = sandboxd_verl.compute_score_batch(
        data_sources=data_sources,
        solution_strs=[r[1] for r in rows],
        ground_truths=[r[2] if i != refused else json.dumps({"inputs": ["1"], "outputs": ["1"]})
                       for i, r in enumerate(rows)],
        extra_infos=extra_infos,
        **reward_kwargs,
    )
    assert scores[refused]["status"] == "INVALID_REQUEST" and scores[refused]["infra_failure"]
    for i, (score, row) in enumerate(zip(scores, rows, strict=True)):
        if i != refused:
            check(score, row)


def test_numpy_ground_truths(reward_kwargs: dict[str, Any]) -> None:
    """Parquet gives numpy scalars and arrays; they must score like plain values."""
    score = sandboxd_verl.compute_score("openai/gsm8k", "\\boxed{72}", np.int64(72), **reward_kwargs)
    assert score["score"] == 1.0
    tests = {"inputs": np.array(["1 2\n"], dtype=object), "outputs": np.array(["3\n"], dtype=object)}
    score = sandboxd_verl.compute_score("codecontests", ADD, tests, **reward_kwargs)
    assert score["status"] == "OK", score


def test_unknown_data_source_stops_the_run(reward_kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="register_data_source"):
        sandboxd_verl.compute_score("my_unknown_set", "x", "1", **reward_kwargs)
    with pytest.raises(ValueError, match="differ in length"):
        sandboxd_verl.compute_score_batch(["openai/gsm8k"], ["a", "b"], ["1"], None, **reward_kwargs)


def test_unreachable_daemon_scores_infra_value() -> None:
    score = sandboxd_verl.compute_score(
        "openai/gsm8k",
        "\\boxed{1}",
        "1",
        address="unix:///nonexistent/sandboxd-verl.sock",
        infra_failure_value=0.0,
        client_options={"max_retries": 0},
    )
    assert score == {"score": 0.0, "acc": 0.0, "pass_rate": 0.0, "status": "UNAVAILABLE", "infra_failure": True}


def test_real_verl_loader(reward_kwargs: dict[str, Any]) -> None:
    """verl's own loader and kwargs merging, when verl is installed."""
    pytest.importorskip("verl")
    from omegaconf import OmegaConf
    from verl.trainer.ppo.reward import get_custom_reward_fn

    for name in ("compute_score", "compute_score_batch"):
        config = OmegaConf.create(
            {"reward": {"custom_reward_function": {"path": str(EXAMPLE), "name": name, "reward_kwargs": reward_kwargs}}}
        )
        fn = get_custom_reward_fn(config)
        assert fn is not None
        if name == "compute_score":
            for row in ROWS:
                ds, s, gt, extra, *_ = row
                check(fn(data_source=ds, solution_str=s, ground_truth=gt, extra_info=extra_info_of(extra)), row)
        else:
            scores = fn(
                data_sources=np.array([r[0] for r in ROWS], dtype=object),
                solution_strs=[r[1] for r in ROWS],
                ground_truths=[r[2] for r in ROWS],
                extra_infos=np.array([extra_info_of(r[3]) for r in ROWS], dtype=object),
            )
            for score, row in zip(scores, ROWS, strict=True):
                check(score, row)
