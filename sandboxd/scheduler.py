"""Admission, routing to a pool, retries on infrastructure failure.

The scheduler never talks to Docker. It admits a job (or refuses it with
RESOURCE_EXHAUSTED and a retry hint while `max_queued` jobs already wait),
waits for a warm sandbox from the job's pool, runs the job there and, when
the sandbox dies under it, runs it again on another sandbox, up to
`attempts` times. Every admitted job gets exactly one answer.

A caller that gives up (a client deadline, a cancelled RPC or batch)
withdraws its job from the agent, which kills the job's runs and answers
at once; the slot stays taken until that answer, which is dropped. Freeing
the slot at once, while the agent ran the job on to its own deadline, let a
trainer with short deadlines pile 30 endless loops into sandboxes that were
counted as idle.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque

from sandboxd_client._proto.sandboxd.v1 import sandboxd_pb2 as pb

from sandboxd import metrics
from sandboxd.agent.messages import JobResult
from sandboxd.agent.protocol import DEADLINE_STRETCH
from sandboxd.config import Config
from sandboxd.errors import InvalidRequest, NoSandbox, Overloaded, PoolFailing, SandboxFull, SandboxLost, Unsupported
from sandboxd.jobs import NO_POOL, PreparedJob, infrastructure_result, to_result
from sandboxd.pool import MATH_POOL, Pool
from sandboxd.sandbox import Sandbox, SandboxGone, Withdrawal

log = logging.getLogger("sandboxd.scheduler")
# Slack over the job's own budget before the daemon gives up on a sandbox
# that no longer answers (the agent enforces the real deadline inside).
AGENT_SLACK_SECONDS = 10.0


class Scheduler:
    def __init__(self, pools: dict[str, Pool], config: Config) -> None:
        self.pools = pools
        self.config = config
        self.queued = 0
        # Admitted jobs not yet in run(): a batch's jobs start a moment after their
        # admission (or later, while their caller does not read its results), and
        # another batch admitted meanwhile must count them.
        self.reserved = 0
        self.in_flight = 0
        self.jobs_total = 0
        self._finished: deque[float] = deque(maxlen=100_000)
        # Attempts whose caller gave up, running on until the agent answers.
        self._abandoned: set[asyncio.Task[JobResult]] = set()
        # Bytes of the requests admitted and not yet answered in full: the daemon holds each (its jobs' code and
        # tests) until its last result is sent.
        self.held_bytes = 0

    def admit(self, prepared: list[PreparedJob]) -> int:
        """Admit `prepared` as a whole, or refuse it: a job no pool serves, a full queue, too many bytes held.

        Admitted jobs that need a sandbox count against `max_queued` from here until
        they enter run() (or the caller calls unreserve() for those that never will);
        their requests' bytes, which this returns, against `max_held_bytes` until release().
        """
        for item in prepared:
            if item.pool != NO_POOL:
                self.pool_for(item)
        # Jobs decided without a sandbox (no code in the completion) never queue.
        count = sum(1 for item in prepared if item.early_result is None)
        limit = self.config.scheduler.max_queued
        if count > limit:
            # Never admissible, however idle the daemon: RESOURCE_EXHAUSTED would have
            # clients retry it forever.
            raise InvalidRequest(f"jobs: {count} jobs need a sandbox, more than the daemon queues at once "
                                 f"(scheduler.max_queued={limit}); send at most {limit} per batch")
        byte_limit = self.config.scheduler.max_held_bytes
        request_bytes = sum(item.request_bytes for item in prepared)
        if request_bytes > byte_limit:
            raise InvalidRequest(f"the request holds {request_bytes} bytes, more than the daemon holds for "
                                 f"requests at once (scheduler.max_held_bytes={byte_limit}); send fewer or smaller "
                                 "jobs per request")
        waiting = self.queued + self.reserved
        if waiting + count > limit:
            metrics.REJECTED.inc()
            raise Overloaded(f"{waiting} jobs are queued (limit {limit})", self._retry_after(waiting + count))
        if self.held_bytes + request_bytes > byte_limit:
            # Many large requests at once (a dataset's tests sent with every completion) would otherwise hold
            # the daemon's memory without bound: max_queued counts jobs, whatever their size.
            metrics.REJECTED.inc()
            raise Overloaded(f"requests of {self.held_bytes} bytes are being answered (limit {byte_limit})",
                             self._retry_after(waiting + count))
        self.held_bytes += request_bytes
        now = time.monotonic()
        for item in prepared:
            item.admitted_at = now
            if item.early_result is None and not item.reserved:
                item.reserved = True
                self.reserved += 1
        return request_bytes

    def _retry_after(self, jobs: int) -> float:
        """Seconds to drain `jobs` at the current throughput, within reason: a refusal's hint."""
        return min(30.0, max(0.5, jobs / max(self.jobs_per_second(), 1.0) / 2))

    def release(self, request_bytes: int) -> None:
        """An admitted request is answered in full (or its caller went away): its bytes are no longer held."""
        self.held_bytes -= request_bytes

    def unreserve(self, prepared: PreparedJob) -> None:
        """`prepared` no longer waits to enter run(): it has, or it never will (its caller went away)."""
        if prepared.reserved:
            prepared.reserved = False
            self.reserved -= 1

    def pool_for(self, prepared: PreparedJob) -> Pool:
        pool = self.pools.get(prepared.pool)
        if pool is None and prepared.pool == "python" and prepared.kind in ("execute", "code"):
            # The langs image is built on the python image: a daemon running
            # only langs sandboxes lists python and bash, and serves them there.
            pool = self.pools.get("langs")
        if pool is None:
            where = prepared.where or f"jobs[{prepared.index}]"
            if prepared.pool == MATH_POOL:
                why = "pool.math is false" if not self.config.pool.math else "python is not in pool.images"
                raise Unsupported(f"{where} is a math job, and this daemon runs no math pool ({why})")
            raise Unsupported(f"{where} needs the {prepared.pool} image, which this daemon "
                              "does not run (build it with `python -m sandboxd.images build langs`)")
        return pool

    def jobs_per_second(self) -> float:
        horizon = time.monotonic() - 60.0
        while self._finished and self._finished[0] < horizon:
            self._finished.popleft()
        return len(self._finished) / 60.0

    async def run(self, prepared: PreparedJob) -> pb.JobResult:
        """Run one admitted job to its single answer."""
        self.unreserve(prepared)
        admitted = prepared.admitted_at or time.monotonic()
        try:
            if prepared.early_result is not None:
                result = to_result(prepared, prepared.early_result, 0)
            else:
                result = await self._run_with_retries(prepared, admitted)
        except Exception as exc:
            log.exception("job %d failed inside sandboxd", prepared.index)
            result = infrastructure_result(prepared, pb.STATUS_INTERNAL, f"internal error: {exc}", 0)
        done = time.monotonic()
        result.timings.run_seconds = done - admitted - result.timings.queued_seconds
        result.timings.total_seconds = done - admitted
        self.jobs_total += 1
        self._finished.append(done)
        metrics.JOBS.labels(prepared.kind, pb.Status.Name(result.status)[len("STATUS_"):].lower()).inc()
        metrics.JOB_SECONDS.labels(prepared.kind).observe(done - admitted)
        return result

    async def _run_with_retries(self, prepared: PreparedJob, admitted: float) -> pb.JobResult:
        pool = self.pool_for(prepared)
        last_error = ""
        queued = True
        queued_seconds = 0.0
        self.queued += 1
        metrics.QUEUE_DEPTH.set(self.queued)
        try:
            attempt = 1
            # Sandboxes found dead before the job reached them (SandboxGone) cost no attempt, up to as
            # many as the pool holds: each leaves the ready set, so this cannot go round for ever.
            unreached = 0
            while attempt <= self.config.scheduler.attempts:
                # A lost sandbox is marked damaged and leaves the ready set, and a
                # full one takes no job until its space is back, so a retry lands
                # on another sandbox (or on that one, emptied).
                try:
                    sandbox = await pool.acquire()
                except NoSandbox as exc:
                    result = infrastructure_result(prepared, pb.STATUS_SANDBOX_LOST, f"no sandbox: {exc}", attempt - 1)
                    result.do_not_retry = isinstance(exc, PoolFailing)
                    result.timings.queued_seconds = time.monotonic() - admitted
                    return result
                if queued:
                    queued = False
                    self.queued -= 1
                    metrics.QUEUE_DEPTH.set(self.queued)
                    queued_seconds = time.monotonic() - admitted
                withdrawal = Withdrawal()
                attempt_task = asyncio.ensure_future(self._attempt(pool, sandbox, prepared, withdrawal))
                try:
                    outcome = await asyncio.shield(attempt_task)
                except SandboxLost as exc:
                    last_error = str(exc)
                    metrics.RETRIES.inc()
                    log.warning("job %d: %s (attempt %d)", prepared.index, exc, attempt)
                    unreached += isinstance(exc, SandboxGone)
                    if not isinstance(exc, SandboxGone) or unreached > pool.most_sandboxes:
                        attempt += 1
                    continue
                except asyncio.CancelledError:
                    if not attempt_task.done():
                        withdrawal.withdraw()
                        self._abandon(attempt_task, prepared)
                    elif not attempt_task.cancelled():
                        attempt_task.exception()  # nobody reads it now: not "never retrieved"
                    raise
                result = to_result(prepared, outcome, attempt)
                result.timings.queued_seconds = queued_seconds
                return result
        finally:
            if queued:
                self.queued -= 1
                metrics.QUEUE_DEPTH.set(self.queued)
        result = infrastructure_result(prepared, pb.STATUS_SANDBOX_LOST,
                                       f"sandbox lost {self.config.scheduler.attempts} times: {last_error}",
                                       self.config.scheduler.attempts)
        result.timings.queued_seconds = queued_seconds
        return result

    async def _attempt(self, pool: Pool, sandbox: Sandbox, prepared: PreparedJob,
                       withdrawal: Withdrawal) -> JobResult:
        """Run the job on `sandbox`, whose slot is released only once the agent has answered (or is lost)."""
        self.in_flight += 1
        metrics.IN_FLIGHT.set(self.in_flight)
        try:
            # The agent may move a run's deadline for the CPU its neighbours took (DEADLINE_STRETCH).
            timeout = prepared.budget_seconds * DEADLINE_STRETCH + AGENT_SLACK_SECONDS
            if prepared.agent_job is None:
                # prepare() gives every job it sends no sandbox an early result, which Scheduler.run answers.
                raise RuntimeError(f"job {prepared.index} has neither a job for a sandbox nor a result")
            return await sandbox.run(prepared.agent_job, timeout=timeout, withdrawal=withdrawal)
        except SandboxFull:
            pool.mark_full(sandbox)
            raise
        except SandboxLost:
            pool.mark_lost(sandbox)
            raise
        finally:
            self.in_flight -= 1
            metrics.IN_FLIGHT.set(self.in_flight)
            await pool.release(sandbox)

    def _abandon(self, attempt_task: asyncio.Task[JobResult], prepared: PreparedJob) -> None:
        metrics.ABANDONED.labels(prepared.kind).inc()
        self._abandoned.add(attempt_task)

        def done(task: asyncio.Task[JobResult]) -> None:
            self._abandoned.discard(task)
            error = None if task.cancelled() else task.exception()
            if error is not None:
                log.warning("job %d, abandoned by its caller, ended in %s: %s", prepared.index,
                            type(error).__name__, error)

        attempt_task.add_done_callback(done)

    async def close(self) -> None:
        """At shutdown, after the server's grace: stop waiting for the answers nobody will read."""
        for task in list(self._abandoned):
            task.cancel()
        await asyncio.gather(*self._abandoned, return_exceptions=True)
