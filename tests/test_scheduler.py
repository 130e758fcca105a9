"""Admission and slot accounting (pure logic: a sandbox whose agent is an asyncio.Event; jobs are in integration)."""

from __future__ import annotations

import asyncio
from typing import Any

from sandboxd_client._proto.sandboxd.v1 import sandboxd_pb2 as pb

from sandboxd.config import Config
from sandboxd.errors import SandboxLost
from sandboxd.jobs import PreparedJob
from sandboxd.pool import Pool
from sandboxd.sandbox import Sandbox, Withdrawal
from sandboxd.scheduler import Scheduler
from tests.test_pool import one_slot_pool


class HeldSandbox(Sandbox):
    """Answers each job once `answer` is set, as an agent answers at the job's end."""

    answer: asyncio.Event
    runs: int = 0
    lose: bool = False
    withdrawals: list[Withdrawal]

    async def run(self, job: dict[str, Any], timeout: float, withdrawal: Withdrawal | None = None) -> dict[str, Any]:
        self.runs += 1
        assert withdrawal is not None
        self.withdrawals.append(withdrawal)
        await self.answer.wait()
        if self.lose:
            raise SandboxLost("gone")
        return {"status": "ok", "execute": {"exit_code": 0}}


def scheduler_with_held_sandbox() -> tuple[Scheduler, Pool, HeldSandbox]:
    pool, _ = one_slot_pool()
    sandbox = HeldSandbox(name="s", pool="python", container_id="c", control_dir="/x", started_by="cold")
    sandbox.answer = asyncio.Event()
    sandbox.withdrawals = []
    pool.sandboxes = [sandbox]
    return Scheduler({"python": pool}, Config()), pool, sandbox


def job(index: int) -> PreparedJob:
    return PreparedJob(index=index, kind="execute", pool="python", failure_value=-1.0, agent_job={"kind": "execute"},
                       budget_seconds=5.0)


async def _settle() -> None:
    for _ in range(10):
        await asyncio.sleep(0)


async def _abandoned_job(scheduler: Scheduler) -> asyncio.Task[pb.JobResult]:
    """A job that reached its sandbox, and whose caller then gave up."""
    first = asyncio.create_task(scheduler.run(job(0)))
    await _settle()
    first.cancel()
    await _settle()
    return first


def test_a_job_whose_caller_gave_up_keeps_its_slot_until_the_agent_answers() -> None:
    """A client deadline cancelled the RPC, and its slot went to the next job while the agent still ran the first:
    30 endless loops piled into sandboxes counted as idle, and an innocent job timed out among them. The job is
    withdrawn from the agent now, and its slot comes back with the agent's answer."""

    async def scenario() -> None:
        scheduler, pool, sandbox = scheduler_with_held_sandbox()
        first = await _abandoned_job(scheduler)
        assert sandbox.runs == 1 and first.cancelled()
        assert [w.withdrawn for w in sandbox.withdrawals] == [True], "the agent is told to stop the job"
        assert (scheduler.in_flight, sandbox.in_flight, pool.busy_count()) == (1, 1, 1)
        second = asyncio.create_task(scheduler.run(job(1)))
        await _settle()
        assert sandbox.runs == 1 and scheduler.queued == 1, "the second job ran beside the abandoned one"
        sandbox.answer.set()
        result = await asyncio.wait_for(second, 5)
        assert result.status == pb.STATUS_OK and sandbox.runs == 2
        assert (scheduler.in_flight, sandbox.in_flight, scheduler.queued) == (0, 0, 0)
        assert not scheduler._abandoned

    asyncio.run(scenario())


def test_an_abandoned_job_whose_sandbox_is_lost_is_not_retried() -> None:
    async def scenario() -> None:
        scheduler, _pool, sandbox = scheduler_with_held_sandbox()
        await _abandoned_job(scheduler)
        sandbox.lose = True
        sandbox.answer.set()
        await _settle()
        assert sandbox.runs == 1 and sandbox.damaged and sandbox.in_flight == 0
        assert not scheduler._abandoned

    asyncio.run(scenario())


def test_close_stops_waiting_for_abandoned_jobs() -> None:
    async def scenario() -> None:
        scheduler, _pool, sandbox = scheduler_with_held_sandbox()
        await _abandoned_job(scheduler)
        assert len(scheduler._abandoned) == 1
        await asyncio.wait_for(scheduler.close(), 5)
        assert not scheduler._abandoned and sandbox.in_flight == 0 and scheduler.in_flight == 0

    asyncio.run(scenario())
