"""The reward-model agent: its dynamic batching with a stand-in scorer (pure logic), then the host
with the real scorer process and a tiny model (on the CPU; on a GPU too where there is one)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from sandboxd.agent.host.errors import SandboxDamaged
from sandboxd.agent.host.rewardmodel import FRAME_BUDGET_BYTES, Batcher, RewardModelHost, _frame_sized


class Recorder:
    """A scorer that records each batch and takes `seconds` per batch."""

    def __init__(self, seconds: float = 0.0, fail: bool = False) -> None:
        self.seconds = seconds
        self.fail = fail
        self.batches: list[list[int]] = []

    async def __call__(self, items: list[int]) -> list[int]:
        self.batches.append(list(items))
        await asyncio.sleep(self.seconds)
        if self.fail:
            raise RuntimeError("scorer broke")
        return [item * 10 for item in items]


async def test_concurrent_items_become_batches_in_order() -> None:
    scorer = Recorder(seconds=0.02)
    batcher = Batcher(scorer, max_batch=8, wait_seconds=0.05)
    batcher.start()
    try:
        results = await asyncio.gather(*(batcher.submit(n) for n in range(30)))
    finally:
        await batcher.close()
    assert results == [n * 10 for n in range(30)]
    assert [len(batch) for batch in scorer.batches] == [8, 8, 8, 6]
    assert [n for batch in scorer.batches for n in batch] == list(range(30))
    assert (batcher.batches, batcher.items, batcher.largest) == (4, 30, 8)


async def test_a_lone_item_waits_at_most_the_window() -> None:
    scorer = Recorder()
    batcher = Batcher(scorer, max_batch=64, wait_seconds=0.05)
    batcher.start()
    try:
        started = time.monotonic()
        assert await batcher.submit(4) == 40
        waited = time.monotonic() - started
    finally:
        await batcher.close()
    assert 0.04 <= waited < 0.5
    assert scorer.batches == [[4]]


async def test_a_full_batch_leaves_without_waiting() -> None:
    scorer = Recorder()
    batcher = Batcher(scorer, max_batch=4, wait_seconds=10.0)
    batcher.start()
    try:
        results = await asyncio.wait_for(asyncio.gather(*(batcher.submit(n) for n in range(4))), 2.0)
    finally:
        await batcher.close()
    assert results == [0, 10, 20, 30]


async def test_items_arriving_during_a_batch_form_the_next() -> None:
    scorer = Recorder(seconds=0.1)
    batcher = Batcher(scorer, max_batch=16, wait_seconds=0.0)
    batcher.start()
    try:
        first = asyncio.ensure_future(batcher.submit(0))
        await asyncio.sleep(0.02)  # the first batch, of one, is being scored
        rest = await asyncio.gather(*(batcher.submit(n) for n in range(1, 6)))
        assert await first == 0
    finally:
        await batcher.close()
    assert rest == [10, 20, 30, 40, 50]
    assert scorer.batches == [[0], [1, 2, 3, 4, 5]]


async def test_a_failed_batch_fails_its_items_only() -> None:
    scorer = Recorder(fail=True)
    batcher = Batcher(scorer, max_batch=2, wait_seconds=0.0)
    batcher.start()
    try:
        outcomes = await asyncio.gather(*(batcher.submit(n) for n in range(3)), return_exceptions=True)
        scorer.fail = False
        assert await batcher.submit(7) == 70
    finally:
        await batcher.close()
    assert all(isinstance(outcome, RuntimeError) for outcome in outcomes)


async def test_items_whose_caller_gave_up_are_not_scored() -> None:
    scorer = Recorder(seconds=0.1)
    batcher = Batcher(scorer, max_batch=1, wait_seconds=0.0)
    batcher.start()
    try:
        first = asyncio.ensure_future(batcher.submit(1))
        await asyncio.sleep(0.02)
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(batcher.submit(2), 0.01)
        assert await first == 10
        assert await batcher.submit(3) == 30
    finally:
        await batcher.close()
    assert scorer.batches == [[1], [3]]


def test_big_batches_are_split_below_the_frame_limit() -> None:
    pairs = [("p", "x" * (FRAME_BUDGET_BYTES // 3)) for _ in range(7)]
    chunks = _frame_sized(pairs)
    assert [len(chunk) for chunk in chunks] == [2, 2, 2, 1]
    assert _frame_sized([("a", "b")] * 5) == [[("a", "b")] * 5]


async def test_closing_fails_the_waiting_and_the_batch_being_scored() -> None:
    scorer = Recorder(seconds=10.0)
    batcher = Batcher(scorer, max_batch=2, wait_seconds=0.0)
    batcher.start()
    jobs = [asyncio.ensure_future(batcher.submit(n)) for n in range(5)]
    while not scorer.batches:
        await asyncio.sleep(0.01)
    await batcher.close()
    outcomes = await asyncio.wait_for(asyncio.gather(*jobs, return_exceptions=True), 5)
    assert all(isinstance(outcome, SandboxDamaged) for outcome in outcomes), outcomes


async def test_host_without_model_answers_every_job_with_a_status() -> None:
    host = RewardModelHost({"name": "m", "max_batch": 4})
    host.error = "OSError: no such file"
    result = await host.run({"kind": "reward_model", "prompt": "p", "completion": "c", "limits": {"timeout": 1}})
    assert result == {"status": "internal", "message": "reward model 'm' failed to load: OSError: no such file"}


WORDS = ["one", "two", "three", "plus", "minus", "equals", "answer", "the", "is"]


def _real_model(tmp_path: Path, size: str) -> Path:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from sandboxd.testmodels import make_reward_model

    return make_reward_model(tmp_path / "model", kind="llama", size=size)


def _reference(folder: Path, pairs: list[tuple[str, str]], max_length: int) -> list[float | None]:
    """The same pairs scored in this process, on the CPU, one at a time."""
    from sandboxd.verifiers import rewardmodel

    model = rewardmodel.load(rewardmodel.ScorerSettings(name="m", path=str(folder), max_length=max_length,
                                                        dtype="float32", threads=1))
    return [model.score([pair])[0].raw for pair in pairs]


def _job(prompt: str, completion: str) -> dict[str, object]:
    return {"kind": "reward_model", "prompt": prompt, "completion": completion, "limits": {"timeout": 120}}


def _cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


needs_gpu = [pytest.mark.gpu, pytest.mark.skipif(not _cuda(), reason="no CUDA GPU here")]


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=needs_gpu)])
async def test_host_batches_concurrent_jobs_through_the_real_scorer(tmp_path: Path, device: str) -> None:
    """The scorer process a sandbox runs (started, fed over its socket, dropping to its uid
    when root), outside a container: concurrent jobs come back in batches, each with its
    own pair's score."""
    folder = _real_model(tmp_path, "tiny")
    pairs = [(" ".join(WORDS[: 1 + n % 9]), " ".join(WORDS[n % 5:] * (1 + n % 4))) for n in range(20)]
    host = RewardModelHost({"name": "m", "path": str(folder), "device": device, "max_length": 64,
                            "dtype": "float32", "threads": 1, "max_batch": 8, "batch_wait_ms": 50})
    await host.start()
    try:
        assert host.state["state"] == "ready", host.state
        assert host.state["device"] == ("cuda:0" if device == "cuda" else "cpu")
        results = await asyncio.gather(*(host.run(_job(*pair)) for pair in pairs))
        status = host.status()
    finally:
        await host.close()
    assert [result["status"] for result in results] == ["ok"] * len(pairs)
    got = [result["reward_model"]["raw_score"] for result in results]
    assert got == pytest.approx(_reference(folder, pairs, 64), rel=1e-4, abs=1e-4)
    assert status["pairs"] == len(pairs) and status["largest_batch"] == 8 and status["batches"] <= 4


@pytest.mark.gpu
@pytest.mark.skipif(not _cuda(), reason="no CUDA GPU here")
async def test_gpu_memory_fraction_splits_a_batch_and_reports_a_pair_that_never_fits(tmp_path: Path) -> None:
    """Real CUDA out-of-memory errors under the sandbox's memory fraction: a batch too big
    for it is split until its parts fit, a pair too big alone gets memory_limit, and the
    scorer goes on serving."""
    import torch

    from sandboxd.verifiers import rewardmodel

    folder = _real_model(tmp_path, "small")
    pairs = [(" ".join(WORDS), " ".join((WORDS[n % 9:] + WORDS[: n % 9]) * 160)) for n in range(24)]
    huge = ("what", " ".join(WORDS * 1200))
    # The budget is three times what one of `pairs` needs (measured here, weights included):
    # a batch of 24 cannot fit in it, one pair always does, and the huge pair (8,192 tokens
    # against 1,450; attention grows with the square) never does. Passes are not capped in
    # tokens, so the whole batch is one pass until the out-of-memory split cuts it.
    local = rewardmodel.load(rewardmodel.ScorerSettings(name="m", path=str(folder), device="cuda",
                                                        max_length=8192, dtype="float32"))
    torch.cuda.reset_peak_memory_stats()
    assert local.score(pairs[:1])[0].status == "ok"
    budget = 3 * torch.cuda.max_memory_allocated()
    del local
    torch.cuda.empty_cache()
    host = RewardModelHost({"name": "m", "path": str(folder), "device": "cuda", "max_length": 8192,
                            "dtype": "float32", "max_batch": 32, "batch_wait_ms": 200, "max_batch_tokens": 10**9,
                            "memory_fraction": budget / torch.cuda.mem_get_info()[1]})
    await host.start()
    try:
        assert host.state["state"] == "ready", host.state
        results = await asyncio.gather(*(host.run(_job(*pair)) for pair in [*pairs, huge]))
        after = await host.run(_job("one", "two"))
        status = host.status()
    finally:
        await host.close()
    assert status["largest_batch"] == 25, status  # one batch went to the scorer, and was split there
    assert [result["status"] for result in results[:-1]] == ["ok"] * len(pairs), (budget, results[0])
    got = [result["reward_model"]["raw_score"] for result in results[:-1]]
    assert got == pytest.approx(_reference(folder, pairs, 8192), rel=1e-4, abs=1e-4)
    assert (results[-1]["status"], results[-1]["limit"]) == ("memory_limit", "memory"), results[-1]
    assert "out of memory" in results[-1]["message"].lower()
    assert after["status"] == "ok"
