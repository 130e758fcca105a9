"""The reward-model agent's dynamic batching, with a stand-in scorer (pure logic, no model)."""

from __future__ import annotations

import asyncio
import time

import pytest

from sandboxd.agent.rewardmodel import FRAME_BUDGET_BYTES, Batcher, RewardModelHost, _frame_sized


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


async def test_host_without_model_answers_every_job_with_a_status() -> None:
    host = RewardModelHost({"name": "m", "max_batch": 4})
    host.error = "OSError: no such file"
    result = await host.run({"kind": "reward_model", "prompt": "p", "completion": "c", "limits": {"timeout": 1}})
    assert result == {"status": "internal", "message": "reward model 'm' failed to load: OSError: no such file"}
