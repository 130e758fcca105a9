"""Admission and slot accounting (pure logic: a sandbox whose agent is an asyncio.Event; jobs are in integration)."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from typing import cast

import pytest
from sandboxd_client._proto.sandboxd.v1 import sandboxd_pb2 as pb

from sandboxd import pool as pool_module
from sandboxd.agent.messages import Job, JobResult
from sandboxd.agent.protocol import ProtocolError, encode_frame, read_frame
from sandboxd.config import Config
from sandboxd.errors import InvalidRequest, NoSandbox, Overloaded, PoolFailing, SandboxFull, SandboxLost
from sandboxd.jobs import NO_POOL, PreparedJob
from sandboxd.pool import Pool
from sandboxd.sandbox import Sandbox, SandboxGone, Withdrawal
from sandboxd.scheduler import Scheduler
from tests.test_pool import one_slot_pool

# What the fake sandboxes and agents here are sent: none reads more of it than its kind.
STUB_JOB = cast("Job", {"kind": "execute"})


class HeldSandbox(Sandbox):
    """Answers each job once `answer` is set, as an agent answers at the job's end."""

    answer: asyncio.Event
    runs: int = 0
    lose: bool = False
    withdrawals: list[Withdrawal]

    async def run(self, job: Job, timeout: float, withdrawal: Withdrawal | None = None) -> JobResult:
        self.runs += 1
        assert withdrawal is not None
        self.withdrawals.append(withdrawal)
        await self.answer.wait()
        if self.lose:
            raise SandboxLost("gone")
        return {"status": "ok", "execute": {"exit_code": 0, "stdout": "", "stderr": ""}}


def scheduler_with_held_sandbox() -> tuple[Scheduler, Pool, HeldSandbox]:
    pool, _ = one_slot_pool()
    sandbox = HeldSandbox(name="s", pool="python", container_id="c", control_dir="/x", started_by="cold")
    sandbox.answer = asyncio.Event()
    sandbox.withdrawals = []
    pool.sandboxes = [sandbox]
    return Scheduler({"python": pool}, Config()), pool, sandbox


def job(index: int) -> PreparedJob:
    return PreparedJob(index=index, kind="execute", pool="python", failure_value=-1.0, agent_job=STUB_JOB,
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


# ---- a job crowded out of a sandbox's /tmp by its neighbours ------------------------------------------------------


class CrowdedSandbox(Sandbox):
    """Answers its first job "full" (SandboxFull, as Sandbox.request raises it); has room after `full_polls` asks."""

    full_polls: int
    room_asks: int
    asks_at_run: list[int]

    async def run(self, job: Job, timeout: float, withdrawal: Withdrawal | None = None) -> JobResult:
        self.asks_at_run.append(self.room_asks)
        if len(self.asks_at_run) == 1:
            self.full = True
            raise SandboxFull(f"sandbox {self.name}: /tmp of the sandbox is full (making a work dir)")
        return {"status": "ok", "execute": {"exit_code": 0, "stdout": "", "stderr": ""}}

    async def has_room(self) -> bool:
        self.room_asks += 1
        return self.room_asks > self.full_polls


def crowded_pool(monkeypatch: pytest.MonkeyPatch, full_polls: int) -> tuple[Scheduler, Pool, CrowdedSandbox]:
    monkeypatch.setattr(pool_module, "ROOM_POLL_SECONDS", 0.001)
    pool, _ = one_slot_pool(slots=2)
    sandbox = CrowdedSandbox(name="s", pool="python", container_id="c", control_dir="/x", started_by="cold")
    sandbox.full_polls, sandbox.room_asks, sandbox.asks_at_run = full_polls, 0, []
    pool.sandboxes = [sandbox]
    return Scheduler({"python": pool}, Config()), pool, sandbox


def test_a_job_crowded_out_of_tmp_runs_again_once_the_sandbox_has_room(monkeypatch: pytest.MonkeyPatch) -> None:
    """A neighbour filled the sandbox's /tmp and an innocent job was answered INTERNAL. It runs again now, and the
    full sandbox (here the only one) is given no job until it says it has room."""

    async def scenario() -> None:
        scheduler, _pool, sandbox = crowded_pool(monkeypatch, full_polls=3)
        result = await asyncio.wait_for(scheduler.run(job(0)), 5)
        assert (result.status, result.attempts) == (pb.STATUS_OK, 2), result
        assert sandbox.asks_at_run == [0, 4], "the retry ran before the sandbox had room"
        assert not (sandbox.full or sandbox.damaged or sandbox.retiring)
        assert (sandbox.in_flight, scheduler.in_flight, scheduler.queued) == (0, 0, 0)

    asyncio.run(scenario())


def test_a_sandbox_that_stays_full_is_replaced(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pool_module, "FULL_RECYCLE_SECONDS", 0.02)

    async def scenario() -> None:
        _scheduler, pool, sandbox = crowded_pool(monkeypatch, full_polls=10**9)
        pool.mark_full(sandbox)
        pool.mark_full(sandbox)  # a second job crowded out meanwhile: one watch
        assert len(pool._tasks) == 1
        async with asyncio.timeout(5):
            while not sandbox.retiring:
                await asyncio.sleep(0.005)
        assert sandbox.room_asks >= 2 and not sandbox.damaged
        assert pool._pick() is None
        await pool.close()

    asyncio.run(scenario())


def test_a_full_reply_is_sandbox_full_and_leaves_the_sandbox_undamaged() -> None:
    """The agent answers "full" for a job it did not run: a retry, and its connection is kept."""
    folder = tempfile.mkdtemp(prefix="sbf-", dir="/tmp")

    async def agent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            try:
                request = await read_frame(reader)
            except EOFError:
                break
            if request["op"] == "run":
                writer.write(encode_frame({"error": "/tmp of the sandbox is full (making a work dir)", "full": True}))
            else:
                writer.write(encode_frame({"room": True}))
            await writer.drain()
        writer.close()

    async def scenario() -> None:
        server = await asyncio.start_unix_server(agent, path=f"{folder}/agent.sock")
        async with server:
            sandbox = Sandbox(name="s", pool="python", container_id="c", control_dir=folder, started_by="cold")
            with pytest.raises(SandboxFull, match="is full"):
                await sandbox.run(STUB_JOB, timeout=5)
            assert sandbox.full and not sandbox.damaged
            assert await sandbox.has_room()
            assert len(sandbox._idle) == 1, "the connection was dropped"
            await sandbox.close_connections()

    try:
        asyncio.run(scenario())
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_a_request_too_large_for_a_frame_leaves_the_sandbox_undamaged(monkeypatch: pytest.MonkeyPatch) -> None:
    """Taken for a lost sandbox, a job that could not be encoded recycled a healthy sandbox per attempt."""
    monkeypatch.setattr("sandboxd.agent.protocol.MAX_FRAME_BYTES", 1024)
    sandbox = Sandbox(name="s", pool="python", container_id="c", control_dir="/nonexistent", started_by="cold")
    with pytest.raises(ProtocolError):
        asyncio.run(sandbox.run(cast("Job", {"kind": "execute", "stdin": "x" * 4096}), timeout=5))
    assert not sandbox.damaged


def test_admitted_jobs_count_against_the_queue_until_they_start() -> None:
    """A batch's jobs start a moment after admission: counted only once queued, concurrent batches were all admitted
    (19,998 jobs queued against a limit of 8,192)."""
    pool, _ = one_slot_pool()
    config = Config()
    config.scheduler.max_queued = 400
    scheduler = Scheduler({"python": pool}, config)
    first = [job(i) for i in range(250)]
    scheduler.admit(first)
    with pytest.raises(Overloaded):
        scheduler.admit([job(i) for i in range(250)])
    for item in first:  # they start (Scheduler.run), or their stream ends
        scheduler.unreserve(item)
    scheduler.admit([job(i) for i in range(250)])
    with pytest.raises(InvalidRequest, match="max_queued=400"):
        scheduler.admit([job(i) for i in range(401)])  # never admissible: not a retry hint


def test_admitted_requests_hold_bytes_until_they_are_answered() -> None:
    """max_queued counts jobs, whatever their size: 8,192 jobs that each carry a dataset's 1 MiB of tests were
    8 GiB held by the daemon at once. Bytes of requests admitted and not answered in full have a limit too."""
    pool, _ = one_slot_pool()
    config = Config()
    config.scheduler.max_held_bytes = 10 << 20
    scheduler = Scheduler({"python": pool}, config)

    def sized(index: int, size: int) -> PreparedJob:
        item = job(index)
        item.request_bytes = size
        return item

    held = scheduler.admit([sized(0, 6 << 20)])
    assert held == 6 << 20
    with pytest.raises(Overloaded, match=r"requests of 6291456 bytes are being answered \(limit 10485760\)"):
        scheduler.admit([sized(1, 6 << 20)])
    assert scheduler.reserved == 1  # the refused request reserved nothing
    scheduler.admit([sized(2, 3 << 20), sized(3, 1 << 20)])  # what is left fits, a batch's jobs summed
    scheduler.release(held)
    scheduler.admit([sized(4, 6 << 20)])
    assert scheduler.held_bytes == 10 << 20
    with pytest.raises(InvalidRequest, match="max_held_bytes=10485760"):
        scheduler.admit([sized(5, 11 << 20)])  # never admissible: not a retry hint


class GoneSandbox(Sandbox):
    """Dead before the job reached it: its agent's socket refuses the connection."""

    runs: int = 0

    async def run(self, job: Job, timeout: float, withdrawal: Withdrawal | None = None) -> JobResult:
        self.runs += 1
        raise SandboxGone(f"sandbox {self.name}: ConnectionRefusedError")


def test_sandboxes_dead_before_the_job_reached_them_cost_no_attempt() -> None:
    """After every idle sandbox died (the engine restarted, `docker rm -f`), a job spent its three attempts on
    them in milliseconds and was answered SANDBOX_LOST by a healthy engine (chaos pass). Such a sandbox leaves
    the ready set and the job goes on to the next, still on its first attempt."""

    async def scenario() -> None:
        pool, _ = one_slot_pool()
        gone = [GoneSandbox(name=f"g{i}", pool="python", container_id=f"g{i}", control_dir="/x", started_by="cold")
                for i in range(3)]
        alive = HeldSandbox(name="ok", pool="python", container_id="ok", control_dir="/x", started_by="cold")
        alive.answer, alive.withdrawals = asyncio.Event(), []
        alive.answer.set()
        pool.sandboxes = [*gone, alive]
        result = await asyncio.wait_for(Scheduler({"python": pool}, Config()).run(job(0)), 5)
        assert (result.status, result.attempts) == (pb.STATUS_OK, 1), result
        assert sum(s.runs for s in gone) == 3 and all(s.damaged for s in gone)

    asyncio.run(scenario())


def test_a_sandbox_without_a_listening_agent_is_gone_not_lost() -> None:
    folder = tempfile.mkdtemp(prefix="sbg-", dir="/tmp")
    try:
        sandbox = Sandbox(name="s", pool="python", container_id="c", control_dir=folder, started_by="cold")
        with pytest.raises(SandboxGone):
            asyncio.run(sandbox.run(STUB_JOB, timeout=5))
        assert sandbox.damaged
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.parametrize(("reason", "error", "do_not_retry"), [
    # The engine may be back by the client's retry.
    ("the Docker engine has not answered for 30 s", NoSandbox, False),
    # A pool that cannot start sandboxes: a retry would only hold the answer back.
    ("pool python cannot start sandboxes", PoolFailing, True),
])
def test_a_job_waiting_for_a_sandbox_that_cannot_come_is_answered_sandbox_lost(
        reason: str, error: type[NoSandbox], do_not_retry: bool) -> None:
    async def scenario() -> None:
        scheduler, pool, sandbox = scheduler_with_held_sandbox()
        first = asyncio.create_task(scheduler.run(job(0)))
        waiting = asyncio.create_task(scheduler.run(job(1)))
        await _settle()
        assert scheduler.queued == 1
        await pool.fail_waiters(reason, error)
        result = await asyncio.wait_for(waiting, 10)
        assert (result.status, result.reward, result.attempts) == (pb.STATUS_SANDBOX_LOST, -1.0, 0)
        assert result.message == f"no sandbox: {reason}"
        assert result.do_not_retry is do_not_retry
        assert scheduler.queued == 0
        sandbox.answer.set()  # the job that had a sandbox is not touched
        assert (await asyncio.wait_for(first, 10)).status == pb.STATUS_OK

    asyncio.run(scenario())


def test_a_job_answered_without_a_pool_is_admitted_beside_jobs_for_sandboxes() -> None:
    async def scenario() -> None:
        scheduler = Scheduler({}, Config())  # no pool at all: only the unsandboxed answer can come back
        internal = PreparedJob(index=3, kind="code", pool=NO_POOL, failure_value=-1.0, agent_job=None,
                               budget_seconds=0.0, early_result={"status": "internal", "message": "a bug"})
        scheduler.admit([internal])
        assert scheduler.reserved == 0
        result = await scheduler.run(internal)
        assert (result.index, result.status, result.reward) == (3, pb.STATUS_INTERNAL, -1.0)

    asyncio.run(scenario())
