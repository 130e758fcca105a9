"""FakeSandboxd: a test double for the sandboxd daemon, NOT the daemon.

A real ``grpc.aio`` server on a real unix socket or loopback TCP port, running
on its own event loop thread (so blocking clients can call it from the test's
thread), with scripted Jobs, Sessions, Pool and Daemon services and the
standard grpc.health.v1 service. Its verdicts are canned: it checks nothing.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import TypeAlias, TypedDict

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from sandboxd_client._proto.sandboxd.v1 import sandboxd_pb2 as pb
from sandboxd_client._proto.sandboxd.v1 import sandboxd_pb2_grpc as pb_grpc


@dataclass
class Abort:
    """End the RPC with this status (and, for RESOURCE_EXHAUSTED, a retry hint)."""

    code: grpc.StatusCode
    details: str = "scripted failure"
    retry_after: float | None = None


@dataclass
class Delay:
    """Wait before answering (then answer with the default verdict, or ``then``)."""

    seconds: float
    then: pb.JobResult | None = None


Action: TypeAlias = pb.JobResult | Abort | Delay | None
# (fake, job, attempt number for this job index on this fake) -> what to do; None = default verdict.
Script = Callable[["FakeSandboxd", pb.Job, int], Action]


def default_verdict(job: pb.Job) -> pb.JobResult:
    """OK when a math completion equals its ground truth, or a completion contains "correct"."""
    failure = job.failure_value if job.HasField("failure_value") else -1.0
    kind = job.WhichOneof("kind")
    if kind == "math":
        ok = job.math.completion.strip() == job.math.ground_truth.strip()
        return pb.JobResult(
            index=job.index,
            reward=1.0 if ok else failure,
            status=pb.STATUS_OK if ok else pb.STATUS_WRONG_ANSWER,
            math=pb.MathDetail(extracted_answer=job.math.completion),
            attempts=1,
        )
    if kind == "code":
        ok = "correct" in job.code.completion
        return pb.JobResult(
            index=job.index,
            reward=1.0 if ok else failure,
            status=pb.STATUS_OK if ok else pb.STATUS_WRONG_ANSWER,
            code=pb.CodeDetail(language=job.code.language, tests_passed=4 if ok else 1, tests_total=4),
            attempts=1,
        )
    if kind == "execute":
        return pb.JobResult(
            index=job.index,
            reward=1.0,
            status=pb.STATUS_OK,
            execute=pb.ExecuteOutput(exit_code=0, stdout=job.execute.stdin),
            attempts=1,
        )
    return pb.JobResult(index=job.index, reward=0.5, status=pb.STATUS_OK, attempts=1)


class _Session(TypedDict):
    """A scripted session: the names its interpreter has been given, its files, and how many cells it has run."""

    vars: dict[str, str]
    files: dict[str, str]
    cells: int


class FakeSandboxd(
    pb_grpc.JobsServicer, pb_grpc.SessionsServicer, pb_grpc.PoolServicer, pb_grpc.DaemonServicer
):
    """Scripted stand-in for the daemon; counts what it receives."""

    def __init__(self, name: str = "fake", script: Script | None = None) -> None:
        self.name = name
        self.script = script
        self.attempts: Counter[int] = Counter()  # job index -> times seen
        self.jobs_seen = 0
        self.batches: list[list[int]] = []
        self.hints: list[pb.BatchHint] = []
        self.sessions: dict[str, _Session] = {}
        self.open_requests: list[pb.OpenSessionRequest] = []
        # Each Open takes the first, after opening its session: the answer lost on the way back.
        self.open_failures: list[Abort] = []
        # Canned answers to a cell's exact code; a canned answer with session_alive false ends the session.
        self.cells: dict[str, pb.CellResult] = {}
        # False: a daemon that predates RunCellRequest.final, which runs a final cell as any other.
        self.knows_final = True
        # Sessions that ended, by id: why, as the daemon says it ("session ID ended: WHY").
        self.ended: dict[str, str] = {}
        self.cell_requests: list[pb.RunCellRequest] = []
        self._ids = itertools.count(1)

    async def _answer(self, job: pb.Job, context: grpc.aio.ServicerContext) -> pb.JobResult:
        self.attempts[job.index] += 1
        self.jobs_seen += 1
        action = self.script(self, job, self.attempts[job.index]) if self.script else None
        if isinstance(action, Delay):
            await asyncio.sleep(action.seconds)
            action = action.then
        if isinstance(action, Abort):
            if action.retry_after is not None:
                context.set_trailing_metadata((("retry-after-seconds", str(action.retry_after)),))
            await context.abort(action.code, action.details)
        result = action if isinstance(action, pb.JobResult) else default_verdict(job)
        result.index = job.index
        result.message = result.message or self.name
        result.node = self.name
        return result

    # -- Jobs -------------------------------------------------------------

    async def Run(self, request: pb.Job, context: grpc.aio.ServicerContext) -> pb.JobResult:
        return await self._answer(request, context)

    async def RunBatch(
        self, request: pb.RunBatchRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.JobResult]:
        self.batches.append([j.index for j in request.jobs])
        for job in request.jobs:
            yield await self._answer(job, context)

    # -- Sessions ---------------------------------------------------------

    async def Open(self, request: pb.OpenSessionRequest, context: grpc.aio.ServicerContext) -> pb.SessionInfo:
        self.open_requests.append(request)
        session_id = f"{self.name}-{next(self._ids)}"
        self.sessions[session_id] = {"vars": {}, "files": {}, "cells": 0}
        if self.open_failures:
            failure = self.open_failures.pop(0)
            await context.abort(failure.code, failure.details)
        return pb.SessionInfo(session_id=session_id, language=request.language or "python", alive=True)

    async def RunCell(self, request: pb.RunCellRequest, context: grpc.aio.ServicerContext) -> pb.CellResult:
        session = self.sessions.get(request.session_id)
        if session is None:
            why = self.ended.get(request.session_id)
            await context.abort(grpc.StatusCode.NOT_FOUND, f"session {request.session_id} ended: {why}" if why
                                else f"no session {request.session_id}")
        assert session is not None  # context.abort raises
        self.cell_requests.append(request)
        session["cells"] = int(session["cells"]) + 1
        final = request.final and self.knows_final
        answer = self._cell(session, request.code.strip(), final)
        if final:
            answer.final, answer.session_alive = True, False
        if not answer.session_alive:
            self.sessions.pop(request.session_id, None)
        return answer

    def _cell(self, session: _Session, code: str, final: bool) -> pb.CellResult:
        if code in self.cells:
            answer = pb.CellResult()
            answer.CopyFrom(self.cells[code])
            return answer
        # Cells are "name = value" and "name" (the interpreter's names), "file name = value" (a file written):
        # enough to show state kept between calls. A final cell runs in a fresh interpreter: it sees the files only.
        names: dict[str, str] = session["files"] if final else session["vars"]
        if code.startswith("file ") and "=" in code:
            key, value = (s.strip() for s in code[len("file "):].split("=", 1))
            session["files"][key] = value
            return pb.CellResult(status=pb.STATUS_OK, session_alive=True, stdout=self.name)
        if "=" in code:
            key, value = (s.strip() for s in code.split("=", 1))
            names[key] = value
            return pb.CellResult(status=pb.STATUS_OK, session_alive=True, stdout=self.name)
        if code in names:
            return pb.CellResult(status=pb.STATUS_OK, value=names[code], session_alive=True, stdout=self.name)
        return pb.CellResult(status=pb.STATUS_RUNTIME_ERROR, stderr=f"NameError: {code}", session_alive=True)

    async def Close(
        self, request: pb.CloseSessionRequest, context: grpc.aio.ServicerContext
    ) -> pb.CloseSessionResponse:
        if self.sessions.pop(request.session_id, None) is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no session {request.session_id}")
        return pb.CloseSessionResponse()

    async def List(
        self, request: pb.ListSessionsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListSessionsResponse:
        return pb.ListSessionsResponse(sessions=[pb.SessionInfo(session_id=s) for s in self.sessions])

    # -- Pool and Daemon --------------------------------------------------

    async def SetBatchHint(self, request: pb.BatchHint, context: grpc.aio.ServicerContext) -> pb.PoolStatus:
        self.hints.append(request)
        return pb.PoolStatus(pools=[pb.PoolState(name=self.name, target=request.batch_size)])

    async def GetStatus(self, request: pb.GetPoolStatusRequest, context: grpc.aio.ServicerContext) -> pb.PoolStatus:
        return pb.PoolStatus(pools=[pb.PoolState(name=self.name)], jobs_total=self.jobs_seen)

    async def GetInfo(self, request: pb.GetInfoRequest, context: grpc.aio.ServicerContext) -> pb.Info:
        return pb.Info(version=f"fake-{self.name}", languages=["python"], job_kinds=["code", "math"])


class FakeServer:
    """Runs a FakeSandboxd on ``address`` in a thread with its own event loop."""

    def __init__(self, fake: FakeSandboxd, address: str) -> None:
        self.fake = fake
        self._address = address
        self.address = address
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=f"fake-{fake.name}", daemon=True)
        self._server: grpc.aio.Server | None = None
        self._health: health.aio.HealthServicer | None = None

    def _call(self, coro):  # type: ignore[no-untyped-def]
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=30)

    def start(self) -> FakeServer:
        self._thread.start()
        self._call(self._start())
        return self

    async def _start(self) -> None:
        server = grpc.aio.server()
        for add in (
            pb_grpc.add_JobsServicer_to_server,
            pb_grpc.add_SessionsServicer_to_server,
            pb_grpc.add_PoolServicer_to_server,
            pb_grpc.add_DaemonServicer_to_server,
        ):
            add(self.fake, server)
        self._health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        port = server.add_insecure_port(self._address)
        if self._address.endswith(":0"):
            self.address = f"{self._address.rsplit(':', 1)[0]}:{port}"
        await server.start()
        await self._health.set("", health_pb2.HealthCheckResponse.SERVING)
        self._server = server

    def set_serving(self, serving: bool, service: str = "") -> None:
        """Flip grpc.health.v1 for the whole server, as a draining daemon would, or for one `service`."""
        status = (
            health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        assert self._health is not None
        self._call(self._health.set(service, status))

    def stop(self, grace: float | None = None) -> None:
        """Stop serving; in-flight calls end with UNAVAILABLE when grace is None."""
        if self._server is not None:
            self._call(self._server.stop(grace))
            self._server = None

    def close(self) -> None:
        self.stop()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()
