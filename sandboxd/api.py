"""gRPC servicers: the API's surface, validation at the door, errors mapped once."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any

import grpc
from google.protobuf.message import DecodeError
from sandboxd_client._proto.sandboxd.v1 import sandboxd_pb2 as pb
from sandboxd_client._proto.sandboxd.v1 import sandboxd_pb2_grpc as pb_grpc

import sandboxd
from sandboxd import jobs
from sandboxd.errors import InvalidRequest, Overloaded, SandboxdError
from sandboxd.pool import MATH_POOL
from sandboxd.rewardpool import RewardModelPool
from sandboxd.scheduler import Scheduler

if TYPE_CHECKING:
    from sandboxd.daemon import Daemon

RETRY_AFTER_KEY = "retry-after-seconds"
# The status message travels percent-encoded in a header, and gRPC clients drop
# a response whose metadata passes 8-16 KiB (by default), reporting
# RESOURCE_EXHAUSTED "Stream removed" instead: which clients retry. Errors that
# quote the request (a 100 KB language name, pool or session id) are cut.
MAX_DETAILS_BYTES = 4096
# A RunBatch stream runs ahead of its reader by at most this many results: jobs
# past it start when the client has read some. A client that never reads would
# hold every result of its batch in the daemon (1 MiB of output each by default,
# 16,384 jobs), and an OOM kill of the daemon takes every other client's jobs.
MIN_BATCH_WINDOW_JOBS = 64
MAX_UNSENT_RESULT_BYTES = 64 << 20
# Reading a batch's jobs gives the event loop back at least this often: one
# item of 1 MiB of code takes 24-26 ms (jobs.prepare: extraction and copies),
# and a batch of many would hold every other call (health checks, other
# trainers' results) for their sum.
PREPARE_SLICE_SECONDS = 0.01


def status_details(message: str) -> str:
    """`message`, cut so that its percent-encoding stays within MAX_DETAILS_BYTES."""
    size = 0
    for end, char in enumerate(message):
        size += 1 if " " <= char <= "~" and char != "%" else 3 * len(char.encode("utf-8", "replace"))
        if size > MAX_DETAILS_BYTES - 16:
            return message[:end] + " [cut]"
    return message


async def _abort(context: grpc.aio.ServicerContext, error: SandboxdError) -> None:
    if isinstance(error, Overloaded):
        context.set_trailing_metadata(((RETRY_AFTER_KEY, f"{error.retry_after_seconds:.3f}"),))
    await context.abort(error.code, status_details(str(error)))


OUR_METHODS = f"/{pb.DESCRIPTOR.package}."


class _Undecodable:
    """What a request that is not its method's message decodes to: answered INVALID_ARGUMENT by DecodeErrors."""

    def __init__(self, error: DecodeError) -> None:
        self.error = error


class DecodeErrors(grpc.aio.ServerInterceptor):
    """A request that does not decode as its method's message is INVALID_ARGUMENT.

    grpc decodes a request before any servicer sees it, and answered such a
    request (a string field holding bytes that are not UTF-8, corrupt wire
    bytes) UNKNOWN "Unexpected DecodeError", with a traceback in the log per
    request. Each of our methods takes one request message; its streamed
    answers come from an async generator.
    """

    def __init__(self) -> None:
        # Our handlers are fixed once the server starts: each is wrapped once, not per call.
        self._wrapped: dict[str, grpc.RpcMethodHandler] = {}

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        method = handler_call_details.method
        wrapped = self._wrapped.get(method)
        if wrapped is not None:
            return wrapped
        handler = await continuation(handler_call_details)
        # Ours only: health's Watch streams through context.write, not a generator, and
        # reflection streams requests.
        if (handler is None or handler.request_streaming or handler.request_deserializer is None
                or not method.startswith(OUR_METHODS)):
            return handler
        self._wrapped[method] = wrapped = self._wrap(handler, method)
        return wrapped

    @staticmethod
    def _wrap(handler: grpc.RpcMethodHandler, method: str) -> grpc.RpcMethodHandler:
        decode = handler.request_deserializer

        def decode_or_mark(data: bytes) -> Any:
            try:
                return decode(data)
            except DecodeError as exc:
                return _Undecodable(exc)

        async def refuse(request: _Undecodable, context: grpc.aio.ServicerContext) -> None:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                status_details(f"the request is not a valid {method} message: {request.error}"))

        if handler.response_streaming:
            stream = handler.unary_stream

            async def unary_stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
                if isinstance(request, _Undecodable):
                    await refuse(request, context)
                responses = stream(request, context)
                try:
                    async for response in responses:
                        yield response
                finally:
                    # Closed with this one (a cancelled or abandoned stream), not whenever it is collected:
                    # RunBatch withdraws its jobs in its own `finally`.
                    await responses.aclose()

            return grpc.unary_stream_rpc_method_handler(unary_stream, request_deserializer=decode_or_mark,
                                                        response_serializer=handler.response_serializer)
        unary = handler.unary_unary

        async def unary_unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
            if isinstance(request, _Undecodable):
                await refuse(request, context)
            return await unary(request, context)

        return grpc.unary_unary_rpc_method_handler(unary_unary, request_deserializer=decode_or_mark,
                                                   response_serializer=handler.response_serializer)


class _ResultWindow:
    """Jobs of one RunBatch between their start and the send of their result, bounded.

    A job starts (enters the scheduler) only while fewer than `max_jobs` of its
    batch have started and not been sent, and the finished ones not yet sent
    hold less than `max_bytes`; the others wait, first come first served, and
    count as admitted meanwhile (Scheduler.reserved).
    """

    def __init__(self, scheduler: Scheduler, max_jobs: int, max_bytes: int) -> None:
        self.scheduler = scheduler
        self.max_jobs = max_jobs
        self.max_bytes = max_bytes
        self.open = 0
        self.unsent_bytes = 0
        self._waiters: deque[asyncio.Future[None]] = deque()

    def _room(self) -> bool:
        return self.open < self.max_jobs and self.unsent_bytes < self.max_bytes

    async def run(self, item: jobs.PreparedJob) -> tuple[pb.JobResult, int]:
        if self._waiters or not self._room():
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            await waiter  # _wake() counted this job as open
        else:
            self.open += 1
        result = await self.scheduler.run(item)
        size = result.ByteSize()
        self.unsent_bytes += size
        return result, size

    def sent(self, size: int) -> None:
        self.open -= 1
        self.unsent_bytes -= size
        while self._waiters and self._room():
            waiter = self._waiters.popleft()
            if not waiter.done():
                self.open += 1
                waiter.set_result(None)


def batch_window_jobs(daemon: Daemon) -> int:
    """Twice the job slots of every job pool at its largest: a reading client's batch always keeps them busy."""
    slots = sum(pool.most_sandboxes * pool.capacity for pool in daemon.pools.values() if pool.kind != "sessions")
    return max(MIN_BATCH_WINDOW_JOBS, 2 * slots)


class JobsServicer(pb_grpc.JobsServicer):
    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon

    async def Run(self, request: pb.Job, context: grpc.aio.ServicerContext) -> pb.JobResult:
        try:
            self.daemon.check_ready()
            prepared = jobs.prepare(request, self.daemon.config)
            held = self.daemon.scheduler.admit([prepared])
        except SandboxdError as error:
            await _abort(context, error)
        try:
            result = await self.daemon.scheduler.run(prepared)
        finally:
            self.daemon.scheduler.release(held)
        result.node = self.daemon.node_name
        return result

    async def RunBatch(self, request: pb.RunBatchRequest, context: grpc.aio.ServicerContext) -> Any:
        scheduler, loop = self.daemon.scheduler, asyncio.get_running_loop()
        try:
            self.daemon.check_ready()
            if not request.jobs:
                raise InvalidRequest("jobs is empty")
            if len(request.jobs) > self.daemon.config.scheduler.max_batch:
                raise InvalidRequest(f"{len(request.jobs)} jobs exceed the batch limit of "
                                     f"{self.daemon.config.scheduler.max_batch}")
            # All or nothing: a malformed item rejects the batch before any runs. Errors
            # name an item by its place in `jobs`: Job.index may be unset or repeated.
            prepared = []
            slice_ends = loop.time() + PREPARE_SLICE_SECONDS
            for position, job in enumerate(request.jobs):
                prepared.append(jobs.prepare(job, self.daemon.config, f"jobs[{position}]"))
                if loop.time() >= slice_ends:
                    await asyncio.sleep(0)
                    slice_ends = loop.time() + PREPARE_SLICE_SECONDS
            self.daemon.check_ready()  # it may have begun to drain meanwhile
            held = scheduler.admit(prepared)
        except SandboxdError as error:
            await _abort(context, error)
        window = _ResultWindow(scheduler, batch_window_jobs(self.daemon), MAX_UNSENT_RESULT_BYTES)
        tasks = [asyncio.ensure_future(window.run(item)) for item in prepared]
        try:
            for next_done in asyncio.as_completed(tasks):
                result, size = await next_done
                result.node = self.daemon.node_name
                yield result
                window.sent(size)
        finally:
            for task in tasks:
                task.cancel()
            for item in prepared:
                scheduler.unreserve(item)  # those that never started
            scheduler.release(held)


class PoolServicer(pb_grpc.PoolServicer):
    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon

    async def SetBatchHint(self, request: pb.BatchHint, context: grpc.aio.ServicerContext) -> pb.PoolStatus:
        job_pools = {name: pool for name, pool in self.daemon.pools.items() if pool.kind != "sessions"}
        unknown = sorted(set(request.pools) - set(job_pools))
        if unknown:
            await _abort(context, InvalidRequest(
                f"pools: no job pool named {', '.join(map(repr, unknown))} (this daemon's: "
                f"{', '.join(sorted(job_pools)) or 'none'})"))
        for name, pool in self.daemon.pools.items():
            if pool.kind == "sessions":
                pool.set_batch_hint(request.sessions)
            elif not request.pools or name in request.pools:
                # Named pools only, when named: a hint also keeps a pool from scaling
                # down, so a math-only run would otherwise hold the code pools at size.
                pool.set_batch_hint(request.batch_size)
        return self.daemon.pool_status()

    async def GetStatus(self, request: pb.GetPoolStatusRequest,
                        context: grpc.aio.ServicerContext) -> pb.PoolStatus:
        return self.daemon.pool_status()


class DaemonServicer(pb_grpc.DaemonServicer):
    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon

    async def GetInfo(self, request: pb.GetInfoRequest, context: grpc.aio.ServicerContext) -> pb.Info:
        config = self.daemon.config
        pools = self.daemon.pools.values()
        languages = sorted({lang for pool in pools for lang in pool.languages})
        # Pools that never snapshot by design (most reward-model pools) do not
        # make the answer false; when CRIU cannot work, every pool is disabled.
        snapshots = [pool.snapshots for pool in pools if not pool.snapshots.disabled]
        reward_pools = [pool for pool in pools if isinstance(pool, RewardModelPool)]
        return pb.Info(
            version=sandboxd.__version__,
            languages=languages,
            job_kinds=["execute", "code", *(["math"] if MATH_POOL in self.daemon.pools else []),
                       *(["reward_model"] if reward_pools else [])],
            snapshots=bool(snapshots) and all(s.usable for s in snapshots),
            snapshot_state="; ".join(f"{pool.name}: {pool.snapshots.state}" for pool in pools),
            gpus=sorted({gpu for pool in reward_pools for gpu in pool.gpus()}),
            models=[pool.model_name for pool in reward_pools],
            max_timeout_seconds=config.limits.max_timeout_seconds,
            max_memory_bytes=config.limits.max_memory_bytes,
            max_output_bytes=config.limits.max_output_bytes,
            node=self.daemon.node_name,
        )


class SessionsServicer(pb_grpc.SessionsServicer):
    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon

    async def Open(self, request: pb.OpenSessionRequest, context: grpc.aio.ServicerContext) -> pb.SessionInfo:
        try:
            self.daemon.check_ready()
            session = await self.daemon.sessions.open(request)
        except SandboxdError as error:
            await _abort(context, error)
        return session.info(self.daemon.config.sessions.max_lifetime_seconds)

    async def RunCell(self, request: pb.RunCellRequest, context: grpc.aio.ServicerContext) -> pb.CellResult:
        try:
            result = await self.daemon.sessions.run_cell(request)
        except SandboxdError as error:
            await _abort(context, error)
        return result

    async def Close(self, request: pb.CloseSessionRequest,
                    context: grpc.aio.ServicerContext) -> pb.CloseSessionResponse:
        try:
            await self.daemon.sessions.close(request.session_id)
        except SandboxdError as error:
            await _abort(context, error)
        return pb.CloseSessionResponse()

    async def List(self, request: pb.ListSessionsRequest,
                   context: grpc.aio.ServicerContext) -> pb.ListSessionsResponse:
        return pb.ListSessionsResponse(sessions=self.daemon.sessions.list())
