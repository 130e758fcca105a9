"""gRPC servicers: the API's surface, validation at the door, errors mapped once."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import grpc
from sandboxd_client._proto.sandboxd.v1 import sandboxd_pb2 as pb
from sandboxd_client._proto.sandboxd.v1 import sandboxd_pb2_grpc as pb_grpc

import sandboxd
from sandboxd import jobs
from sandboxd.errors import InvalidRequest, Overloaded, SandboxdError
from sandboxd.pool import MATH_POOL
from sandboxd.rewardpool import RewardModelPool

if TYPE_CHECKING:
    from sandboxd.daemon import Daemon

RETRY_AFTER_KEY = "retry-after-seconds"


async def _abort(context: grpc.aio.ServicerContext, error: SandboxdError) -> None:
    if isinstance(error, Overloaded):
        context.set_trailing_metadata(((RETRY_AFTER_KEY, f"{error.retry_after_seconds:.3f}"),))
    await context.abort(error.code, str(error))


class JobsServicer(pb_grpc.JobsServicer):
    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon

    async def Run(self, request: pb.Job, context: grpc.aio.ServicerContext) -> pb.JobResult:
        try:
            self.daemon.check_ready()
            prepared = jobs.prepare(request, self.daemon.config)
            self.daemon.scheduler.admit([prepared])
        except SandboxdError as error:
            await _abort(context, error)
        return await self.daemon.scheduler.run(prepared)

    async def RunBatch(self, request: pb.RunBatchRequest, context: grpc.aio.ServicerContext) -> Any:
        scheduler = self.daemon.scheduler
        try:
            self.daemon.check_ready()
            if not request.jobs:
                raise InvalidRequest("jobs is empty")
            if len(request.jobs) > self.daemon.config.scheduler.max_batch:
                raise InvalidRequest(f"{len(request.jobs)} jobs exceed the batch limit of "
                                     f"{self.daemon.config.scheduler.max_batch}")
            # All or nothing: a malformed item rejects the batch before any runs.
            prepared = [jobs.prepare(job, self.daemon.config) for job in request.jobs]
            scheduler.admit(prepared)
        except SandboxdError as error:
            await _abort(context, error)
        tasks = [asyncio.ensure_future(scheduler.run(item)) for item in prepared]
        try:
            for next_done in asyncio.as_completed(tasks):
                yield await next_done
        finally:
            for task in tasks:
                task.cancel()


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
