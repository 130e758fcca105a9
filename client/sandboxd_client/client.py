"""``SandboxClient`` and ``AsyncSandboxClient``: twins with the same methods, arguments and semantics.

Everything that is not waiting on the network (targets, request building,
deadlines, what to retry) lives in ``_core`` and ``_requests`` and is shared;
each twin only drives the RPCs with blocking or ``grpc.aio`` calls.
"""

from __future__ import annotations

import asyncio
import functools
import math
import queue
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from typing import Any

import grpc

from ._core import (
    CONTROL_SERVICE_CONFIG,
    SESSION_SERVICE_CONFIG,
    ChunkState,
    LocalFirst,
    RetryPolicy,
    Route,
    Target,
    bearer_token,
    channel_options,
    jobs_service_config,
    merge_pool_status,
    plan_chunks,
    resolve_fleet,
    resolve_target,
    spills,
    tls_files,
)
from ._proto.sandboxd.v1 import sandboxd_pb2 as pb
from ._proto.sandboxd.v1 import sandboxd_pb2_grpc as pb_grpc
from ._requests import (
    DEADLINE_STRETCH,
    CellResult,
    CodeTestsLike,
    Result,
    _check_finite,
    _check_str,
    _files,
    _limits,
    _refusing,
    code_job,
    execute_job,
    job_deadline,
    math_job,
    reward_model_job,
    to_cell_result,
    validate_batch,
    validate_job,
)
from .errors import InvalidRequest, SandboxdError, SessionNotFound, Unavailable, Unimplemented, from_rpc_error

__all__ = ["AsyncSandboxClient", "AsyncSession", "SandboxClient", "Session"]

_Metadata = Sequence[tuple[str, str]]


def _check_deadline(deadline: float | None) -> None:
    _check_finite(deadline, "deadline", positive=True)


def _by_index(result: Result) -> int:
    return result.index


class _ClientBase:
    """Configuration and every non-I/O decision shared by the twins."""

    # The job channels' stubs (each twin's _setup): the local daemon's, and the fleet's when there is one.
    _jobs: pb_grpc.JobsStub
    _fleet_jobs: pb_grpc.JobsStub | None

    def __init__(
        self,
        address: str | Sequence[str] | None = None,
        *,
        fleet: str | Sequence[str] | None = None,
        deadline: float | None = None,
        job_timeout: float = 10.0,
        deadline_margin: float = 60.0,
        rpc_timeout: float = 30.0,
        max_retries: int = 8,
        retry_policy: RetryPolicy | None = None,
        batch_size: int = 64,
        max_batch_bytes: int = 3 << 20,
        max_concurrent_batches: int = 16,
        token: str | None = None,
        tls: bool | None = None,
        tls_ca: str | None = None,
        tls_cert: str | None = None,
        tls_key: str | None = None,
        tls_server_name: str | None = None,
        credentials: grpc.ChannelCredentials | None = None,
        metadata: _Metadata = (),
        options: Sequence[tuple[str, Any]] = (),
        reward_model: str | None = None,
    ) -> None:
        for name, value in (
            ("job_timeout", job_timeout),
            ("deadline_margin", deadline_margin),
            ("rpc_timeout", rpc_timeout),
        ):
            if value is None:
                raise InvalidRequest(f"{name} must be a number, got None")
            _check_finite(value, name, positive=True)
        _check_deadline(deadline)
        if max_retries < 0 or batch_size < 1 or max_concurrent_batches < 1:
            raise InvalidRequest("max_retries must be >= 0, batch_size and max_concurrent_batches >= 1")
        self.target: Target = resolve_target(address)
        #: Where work goes while the daemons of ``address`` refuse it or cannot be reached; None without a fleet.
        self.fleet: Target | None = resolve_fleet(fleet)
        self._router = LocalFirst() if self.fleet is not None else None
        self._call_deadline = deadline
        self._job_timeout = float(job_timeout)
        self._margin = float(deadline_margin)
        self._rpc_timeout = float(rpc_timeout)
        self._policy = retry_policy or RetryPolicy(max_retries=max_retries)
        self._batch_size = batch_size
        self._max_batch_bytes = max_batch_bytes
        self._max_concurrent = max_concurrent_batches
        files = tls_files(tls, tls_ca, tls_cert, tls_key)
        if credentials is not None and files is not None:
            raise InvalidRequest("pass credentials or the tls settings, not both")
        self._credentials = credentials
        self._tls = None if files is None else grpc.ssl_channel_credentials(files.ca, files.key, files.cert)
        token = bearer_token(token)
        self._metadata: tuple[tuple[str, str], ...] = tuple(metadata) + (
            (("authorization", f"Bearer {token}"),) if token else ()
        )
        # A list of host names is resolved to addresses (resolve_target): the name the
        # daemon's certificate carries is then given here.
        self._extra_options = tuple(options) + (
            (("grpc.ssl_target_name_override", tls_server_name),) if tls_server_name else ()
        )
        named = {name for name, _ in self._extra_options}
        if self._tls is not None and not named & {"grpc.ssl_target_name_override", "grpc.default_authority"}:
            # gRPC checks every certificate of a list's channel against one name, the list's own text
            # ("10.0.0.1:50051,10.0.0.2:50051"), which no certificate carries, not an address of it: every
            # call failed UNAVAILABLE ("Hostname Verification Check failed"), and was retried for its backoff.
            for where in (self.target, self.fleet):
                if where is not None and len(where.addresses) > 1 and not where.grpc_target.startswith("unix"):
                    raise InvalidRequest(f"TLS to the list {where.grpc_target} needs tls_server_name: the name its "
                                         "daemons' certificates share (a dns:/// name needs none)")
        self._jobs_service_config = jobs_service_config(reward_model)
        self._closed = False
        self._setup()

    def _setup(self) -> None:
        """Open the twin's channels (blocking or grpc.aio)."""
        raise NotImplementedError

    @property
    def address(self) -> str:
        """The gRPC target this client's job channel connects to (the local one, when there is a fleet)."""
        return self.target.grpc_target

    @property
    def _addresses(self) -> tuple[str, ...]:
        """Every daemon this client may use, its own first: those of ``address``, then the fleet's."""
        return self.target.addresses + (self.fleet.addresses if self.fleet is not None else ())

    def _session_targets(self) -> list[str]:
        """Where a session may be opened, in order: the local daemon first, then the fleet."""
        return [self.target.grpc_target, *([self.fleet.grpc_target] if self.fleet is not None else [])]

    def _jobs_for(self, route: Route) -> pb_grpc.JobsStub:
        """The Jobs stub of `route`'s channel."""
        if route is Route.FLEET and self._fleet_jobs is not None:
            return self._fleet_jobs
        return self._jobs

    def _channel_credentials(self, target: str) -> grpc.ChannelCredentials | None:
        """The credentials given, else TLS from the tls settings, which a Unix socket (plaintext) never gets."""
        if self._credentials is not None:
            return self._credentials
        return None if target.startswith("unix") else self._tls

    def _options(self, service_config: Mapping[str, Any]) -> list[tuple[str, Any]]:
        extra = self._extra_options
        if service_config is SESSION_SERVICE_CONFIG:
            # With the shared subchannel pool pick_first reuses whichever connection
            # is already up, so every session would land on the same daemon.
            extra = (("grpc.use_local_subchannel_pool", 1), *extra)
        return channel_options(service_config, extra)

    def _deadline(self, jobs: Iterable[pb.Job], deadline: float | None) -> float:
        """Seconds each RPC may take: the call's, the client's, or derived from the jobs' own limits."""
        deadline = deadline if deadline is not None else self._call_deadline
        if deadline is not None:
            _check_deadline(deadline)
            return float(deadline)
        return max(job_deadline(j, default_timeout=self._job_timeout, margin=self._margin) for j in jobs)

    def _chunks(self, jobs: Sequence[pb.Job]) -> list[dict[int, pb.Job]]:
        plan = plan_chunks(jobs, max_jobs=self._batch_size, max_bytes=self._max_batch_bytes)
        return [{i: jobs[i] for i in chunk} for chunk in plan]

    @_refusing
    def _open_request(
        self,
        language: str,
        timeout: float | None,
        memory_bytes: int | None,
        output_bytes: int | None,
        files: Mapping[str, str | bytes] | None,
        idle_timeout: float | None,
    ) -> pb.OpenSessionRequest:
        return pb.OpenSessionRequest(
            language=_check_str(language, "language", allow_empty=False),
            limits=_limits(timeout, memory_bytes, output_bytes),
            files=_files(files),
            idle_timeout_seconds=_check_finite(idle_timeout, "idle_timeout", positive=True) or 0.0,
            # One key per open_session call, sent again on each of its retries (_unary resends this
            # request): an UNAVAILABLE can come after the daemon opened the session, and the daemon
            # answers a repeat with that session instead of opening a second one.
            request_id=uuid.uuid4().hex,
        )

    def _hint_shares(self, batch_size: int, sessions: int,
                     pools: Sequence[str]) -> list[tuple[str, pb.BatchHint]]:
        if batch_size < 0 or sessions < 0:
            raise InvalidRequest("batch_size and sessions must be >= 0")
        if isinstance(pools, str):
            raise InvalidRequest("pools is a list of pool names, not one string")
        # round_robin gives each daemon about 1/k of the work, so each sizes for its share. With a fleet, each
        # side is told what it takes when it takes everything: the local daemon all of it while it keeps up,
        # the fleet all of it once the local one is full or gone (a pool grows no further than pool.max_size).
        shares: list[tuple[str, pb.BatchHint]] = []
        for target in (self.target, self.fleet):
            if target is None:
                continue
            k = len(target.addresses)
            hint = pb.BatchHint(batch_size=math.ceil(batch_size / k), sessions=math.ceil(sessions / k), pools=pools)
            shares.extend((address, hint) for address in target.addresses)
        return shares

    def _check_open(self) -> None:
        if self._closed:
            raise SandboxdError("the client is closed")


class _SessionBase:
    """State and request building shared by :class:`Session` and :class:`AsyncSession`."""

    def __init__(
        self,
        client: _ClientBase,
        channel: Any,
        stub: pb_grpc.SessionsStub,
        info: pb.SessionInfo,
        cell_timeout: float,
    ) -> None:
        self._client = client
        self._channel = channel
        self._stub = stub
        self.info = info
        self._cell_timeout = cell_timeout
        self._closed = False

    @property
    def id(self) -> str:
        """The daemon's session id."""
        return self.info.session_id

    def _cell_call(self, code: str, timeout: float | None, final: bool) -> tuple[pb.RunCellRequest, float]:
        """The RunCell request for ``code`` and the RPC deadline: the cell's limit, as far as the daemon may stretch
        it (DEADLINE_STRETCH), plus the client's margin."""
        if self._closed:
            raise SessionNotFound(f"session {self.id} is closed")
        code = _check_str(code, "code")
        timeout = _check_finite(timeout, "timeout", positive=True)
        request = pb.RunCellRequest(session_id=self.id, code=code, timeout_seconds=timeout or 0.0, final=bool(final))
        return request, (timeout or self._cell_timeout) * DEADLINE_STRETCH + self._client._margin

    def _cell_result(self, request: pb.RunCellRequest, msg: pb.CellResult) -> CellResult:
        """The answer to ``request``; Unimplemented for a final cell that a daemon without ``final`` ran as any cell,
        in the session's interpreter, where the session's code could have made its result."""
        if request.final and not msg.final:
            raise Unimplemented(
                f"the daemon does not run final cells (it predates RunCellRequest.final): it ran the cell in "
                f"session {self.id}'s own interpreter, so its result is not trusted")
        return to_cell_result(msg)

    def _close_request(self) -> tuple[pb.CloseSessionRequest, float]:
        """The Close request and its RPC timeout."""
        return pb.CloseSessionRequest(session_id=self.id), self._client._rpc_timeout


# ---------------------------------------------------------------------------
# Blocking twin.
# ---------------------------------------------------------------------------


class SandboxClient(_ClientBase):
    """Blocking client for sandboxd. Thread-safe; one per process is enough.

    ``address`` is a gRPC target (``"unix:///run/sandboxd/sandboxd.sock"``,
    ``"host:port"``, ``"dns:///name:port"``) or a list of them, defaulting to
    ``$SANDBOXD_ADDRESS`` then the local socket. Several daemons share one
    channel balanced by gRPC (round_robin with health checking). With
    ``reward_model="NAME"`` the jobs go only to daemons where that reward
    model is loaded (its own health service), not to one where it still
    loads or failed to load.

    ``fleet`` (else ``$SANDBOXD_FLEET``; ``""`` for none) is where work goes
    when the daemon of ``address``, the node's own, refuses it
    (RESOURCE_EXHAUSTED) or cannot be reached (UNAVAILABLE): a list of
    addresses or a ``dns:///`` name, balanced like ``address``. Such a request
    moves at once, without spending a retry, and the local daemon is skipped
    for a second (or its retry hint, up to 5 s). ``result.node`` names the
    daemon that answered.

    A daemon's TCP listener may ask for TLS and a bearer token (docs/deploy.md):
    ``token`` (else ``$SANDBOXD_TOKEN``) is sent on every call; ``tls_ca``,
    ``tls_cert`` and ``tls_key`` (PEM paths, else ``$SANDBOXD_TLS_CA``,
    ``$SANDBOXD_TLS_CERT``, ``$SANDBOXD_TLS_KEY``) turn TLS on, trusting
    ``tls_ca`` (default: the system's CAs, or ``tls=True`` with no file), and
    present a client certificate for mutual TLS. ``unix:`` targets stay
    plaintext. ``tls_server_name`` is the name the daemons' certificates
    carry when the address is a list (needed with TLS: gRPC checks every
    certificate of a list's channel against one name).

    Scoring calls return a :class:`Result` for every job, even when the
    infrastructure failed after ``max_retries`` retries (``result.error`` then
    says why); they raise only :class:`InvalidRequest` (and permission errors).
    Two budgets, never confused: a job's ``timeout`` (given to the builders,
    ``score_code(..., timeout=2)``) is the sandbox's limit per run or test case,
    a verdict on the model when hit (status TIMEOUT); ``deadline`` (seconds,
    on the client or on a call) is how long the client waits for one RPC
    before giving up on it (status DEADLINE_EXCEEDED, an infrastructure
    failure, not retried). By default the deadline is derived from the jobs:
    each one's limit (or ``job_timeout`` when it leaves the limit to the
    daemon) times its test cases, times 3 (a run's deadline moves on by the
    time others kept it off the CPU, up to 3 times its limit), plus
    ``deadline_margin`` for queueing.
    """

    def _setup(self) -> None:
        self._channel = self._make_channel(self.target.grpc_target, self._jobs_service_config)
        self._jobs = pb_grpc.JobsStub(self._channel)
        self._fleet_channel = (self._make_channel(self.fleet.grpc_target, self._jobs_service_config)
                               if self.fleet is not None else None)
        self._fleet_jobs = pb_grpc.JobsStub(self._fleet_channel) if self._fleet_channel is not None else None
        self._lock = threading.Lock()
        self._executor: ThreadPoolExecutor | None = None
        self._address_channels: dict[str, grpc.Channel] = {}

    def _make_channel(self, target: str, service_config: Mapping[str, Any]) -> grpc.Channel:
        options = self._options(service_config)
        credentials = self._channel_credentials(target)
        if credentials is not None:
            return grpc.secure_channel(target, credentials, options=options)
        return grpc.insecure_channel(target, options=options)

    def _channel_for(self, address: str) -> grpc.Channel:
        """The control channel to the daemon at `address` (see CONTROL_SERVICE_CONFIG)."""
        with self._lock:
            if address not in self._address_channels:
                self._address_channels[address] = self._make_channel(address, CONTROL_SERVICE_CONFIG)
            return self._address_channels[address]

    def _unary(self, method: Any, request: Any, timeout: float | None = None, *, retry: bool = True) -> Any:
        """An idempotent call, retried on UNAVAILABLE / RESOURCE_EXHAUSTED (unless `retry` is false)."""
        self._check_open()
        attempt = 0
        while True:
            attempt += 1
            try:
                return method(request, timeout=timeout or self._rpc_timeout, metadata=self._metadata)
            except grpc.RpcError as e:
                error = from_rpc_error(e)
                if not error.retryable or not retry or attempt > self._policy.max_retries:
                    raise error from None
                time.sleep(self._policy.delay(attempt, getattr(error, "retry_after", None)))

    # -- jobs -------------------------------------------------------------

    def run(self, job: pb.Job, *, deadline: float | None = None) -> Result:
        """Run one job (built with ``code_job``, ``math_job``, ...) and return its result.

        ``deadline``: seconds each RPC attempt may take (default: from the job's
        limits). A retry after UNAVAILABLE or an overload starts a fresh one.
        """
        self._check_open()
        job = validate_job(job)
        deadline = self._deadline([job], deadline)
        state = ChunkState({job.index: job}, self._policy, self._router)
        while True:
            (request,) = state.request().jobs
            final: Result | None = None
            error: SandboxdError | None = None
            try:
                msg = self._jobs_for(state.route).Run(request, timeout=deadline, metadata=self._metadata)
                msg.index = request.index  # a unary answer is ours whatever index it carries
                final = state.on_message(msg)
            except grpc.RpcError as e:
                error = from_rpc_error(e)
            finals = state.on_end(error)
            if final is not None or finals:
                return final if final is not None else finals[0]
            time.sleep(state.next_delay())

    def score_code(
        self, completion: str, tests: CodeTestsLike, *, deadline: float | None = None, **job_options: Any
    ) -> Result:
        """Score a code completion against tests; ``job_options`` (``timeout`` per test...) as :func:`code_job`."""
        return self.run(code_job(completion, tests, **job_options), deadline=deadline)

    def score_math(
        self,
        completion: str,
        ground_truth: str | int | float,
        *,
        deadline: float | None = None,
        **job_options: Any,
    ) -> Result:
        """Check a math completion against its ground truth; ``job_options`` as :func:`math_job`."""
        return self.run(math_job(completion, ground_truth, **job_options), deadline=deadline)

    def execute(
        self,
        code: str,
        language: str = "python",
        stdin: str | bytes = b"",
        *,
        deadline: float | None = None,
        **job_options: Any,
    ) -> Result:
        """Run a program as-is; ``result.details`` is an :class:`ExecuteOutput`."""
        return self.run(execute_job(code, language, stdin, **job_options), deadline=deadline)

    def score_reward_model(
        self, prompt: str, completion: str, *, model: str, deadline: float | None = None, **job_options: Any
    ) -> Result:
        """Score (prompt, completion) with the daemon's reward model ``model``."""
        return self.run(reward_model_job(prompt, completion, model=model, **job_options), deadline=deadline)

    def run_batch(self, jobs: Iterable[pb.Job], *, deadline: float | None = None) -> Iterator[Result]:
        """Run jobs, yielding each :class:`Result` as it finishes; ``result.index`` is its position.

        The batch goes out as several RunBatch streams at once (so round_robin
        spreads it); only the jobs that failed for infrastructure reasons are
        retried. ``deadline`` applies to each stream (default: the slowest job's
        limits); jobs still unanswered when it passes get DEADLINE_EXCEEDED.
        Validation happens before the first RPC.
        """
        self._check_open()
        jobs = validate_batch(jobs)
        deadline = self._deadline(jobs, deadline)
        return self._stream(jobs, deadline)

    def _stream(self, jobs: list[pb.Job], deadline: float) -> Iterator[Result]:
        out: queue.Queue[Result | BaseException] = queue.Queue()
        stop = threading.Event()
        calls: set[Any] = set()
        executor = self._get_executor()
        for chunk in self._chunks(jobs):
            future = executor.submit(self._run_chunk, chunk, deadline, out, stop, calls)
            # close() cancels the chunks still queued: their jobs would never be answered, and the loop below
            # would wait for them for ever.
            future.add_done_callback(functools.partial(_report_if_cancelled, out))
        try:
            for _ in range(len(jobs)):
                item = out.get()
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            stop.set()
            with self._lock:
                pending = list(calls)
            for call in pending:
                call.cancel()

    def _run_chunk(
        self,
        chunk: dict[int, pb.Job],
        deadline: float,
        out: queue.Queue[Result | BaseException],
        stop: threading.Event,
        calls: set[Any],
    ) -> None:
        state = ChunkState(chunk, self._policy, self._router)
        try:
            while state.pending and not stop.is_set():
                error: SandboxdError | None = None
                request = state.request()
                call = self._jobs_for(state.route).RunBatch(request, timeout=deadline, metadata=self._metadata)
                with self._lock:
                    calls.add(call)
                try:
                    for msg in call:
                        result = state.on_message(msg)
                        if result is not None:
                            out.put(result)
                except grpc.RpcError as e:
                    error = from_rpc_error(e)
                finally:
                    with self._lock:
                        calls.discard(call)
                if stop.is_set():
                    return
                for result in state.on_end(error):
                    out.put(result)
                if state.pending:
                    stop.wait(state.next_delay())
        except BaseException as e:  # handed to the consumer, which re-raises it
            # A channel that close() shut mid-call raises grpc's own errors (ValueError here).
            out.put(_closed_during_batch() if self._closed else e)

    def _get_executor(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(self._max_concurrent, thread_name_prefix="sandboxd-batch")
            return self._executor

    def score_batch(self, jobs: Iterable[pb.Job], *, deadline: float | None = None) -> list[Result]:
        """Run jobs and return their results in input order (validated before the first RPC)."""
        return sorted(self.run_batch(jobs, deadline=deadline), key=_by_index)

    # -- sessions ---------------------------------------------------------

    def open_session(
        self,
        language: str = "python",
        *,
        timeout: float | None = None,
        memory_bytes: int | None = None,
        output_bytes: int | None = None,
        files: Mapping[str, str | bytes] | None = None,
        idle_timeout: float | None = None,
    ) -> Session:
        """Hold a sandbox for a multi-turn episode; ``timeout`` etc. are per-cell limits.

        Use it as a context manager, or call ``close()``: an open session keeps
        a sandbox busy until its idle timeout.
        """
        self._check_open()
        request = self._open_request(language, timeout, memory_bytes, output_bytes, files, idle_timeout)
        *first, last = self._session_targets()
        for target in first:
            try:
                return self._open_on(target, request, retry=False)
            except SandboxdError as error:
                if not spills(error):
                    raise
                # The local daemon is full or gone: the fleet's turn.
        return self._open_on(last, request, retry=True)

    def _open_on(self, target: str, request: pb.OpenSessionRequest, *, retry: bool) -> Session:
        # A channel of its own: pick_first keeps every cell on the daemon holding the session.
        channel = self._make_channel(target, SESSION_SERVICE_CONFIG)
        stub = pb_grpc.SessionsStub(channel)
        try:
            info = self._unary(stub.Open, request, retry=retry)
        except BaseException:
            channel.close()
            raise
        return Session(self, channel, stub, info, request.limits.timeout_seconds or self._job_timeout)

    # -- pool and daemon --------------------------------------------------

    def set_batch_hint(self, batch_size: int, sessions: int = 0, *, pools: Sequence[str] = ()) -> pb.PoolStatus:
        """Tell the daemons how many completions (and live sessions) each step brings.

        `pools` names the job pools the completions go to (as in
        :meth:`pool_status`: "python", "langs", "math", a reward model's);
        empty sizes every job pool. Each known daemon is told its round_robin
        share; returns their pool status merged.
        """
        return merge_pool_status(
            [
                self._unary(pb_grpc.PoolStub(self._channel_for(address)).SetBatchHint, hint)
                for address, hint in self._hint_shares(batch_size, sessions, pools)
            ]
        )

    def pool_status(self) -> pb.PoolStatus:
        """Pools, queue and throughput of every known daemon (pools listed together, counters summed)."""
        request = pb.GetPoolStatusRequest()
        return merge_pool_status(
            [
                self._unary(pb_grpc.PoolStub(self._channel_for(a)).GetStatus, request)
                for a in self._addresses
            ]
        )

    def info(self) -> pb.Info:
        """Version, languages, job kinds and limits of the first daemon that answers, serving or not."""
        error: SandboxdError | None = None
        for address in self._addresses:
            try:
                return self._unary(pb_grpc.DaemonStub(self._channel_for(address)).GetInfo, pb.GetInfoRequest())
            except Unavailable as exc:
                error = exc
        assert error is not None
        raise error

    def close(self) -> None:
        """Close the channels and stop the batch threads. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            channels = list(self._address_channels.values())
            executor, self._executor = self._executor, None
        for channel in (self._channel, *([self._fleet_channel] if self._fleet_channel else []), *channels):
            channel.close()
        if executor is not None:
            executor.shutdown(wait=False, cancel_futures=True)

    def __enter__(self) -> SandboxClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Session(_SessionBase):
    """A sandbox held for one episode; cells share interpreter state."""

    _client: SandboxClient
    _channel: grpc.Channel

    def run(self, code: str, *, timeout: float | None = None, final: bool = False) -> CellResult:
        """Run one cell. Never retried: a cell is not idempotent.

        ``final=True`` runs it as the session's final check (docs/sessions.md):
        every process of the session is killed first, the code runs in a fresh
        interpreter (a fresh bash for a bash session) that sees the session's
        files but none of its interpreter state, and the session ends with it.
        Raises :class:`SessionNotFound` when the session is gone (expired,
        closed, or lost with its sandbox); :class:`Unimplemented` for a final
        cell that a daemon too old to know ``final`` ran as an ordinary cell.
        """
        request, deadline = self._cell_call(code, timeout, final)
        try:
            msg = self._stub.RunCell(request, timeout=deadline, metadata=self._client._metadata)
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None
        return self._cell_result(request, msg)

    def close(self) -> None:
        """Give the sandbox back. Idempotent; a session the daemon already dropped is fine."""
        if self._closed:
            return
        self._closed = True
        try:
            request, timeout = self._close_request()
            self._stub.Close(request, timeout=timeout, metadata=self._client._metadata)
        except grpc.RpcError as e:
            error = from_rpc_error(e)
            if not isinstance(error, SessionNotFound):
                raise error from None
        finally:
            self._channel.close()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ---------------------------------------------------------------------------
# asyncio twin.
# ---------------------------------------------------------------------------


class AsyncSandboxClient(_ClientBase):
    """The asyncio twin of :class:`SandboxClient`: same methods, awaited.

    A ``grpc.aio`` channel belongs to the event loop it was first used on, so
    create one client per event loop (the TRL and verl helpers do this).
    """

    def _setup(self) -> None:
        self._channel = self._make_channel(self.target.grpc_target, self._jobs_service_config)
        self._jobs = pb_grpc.JobsStub(self._channel)
        self._fleet_channel = (self._make_channel(self.fleet.grpc_target, self._jobs_service_config)
                               if self.fleet is not None else None)
        self._fleet_jobs = pb_grpc.JobsStub(self._fleet_channel) if self._fleet_channel is not None else None
        self._address_channels: dict[str, grpc.aio.Channel] = {}
        self._semaphore: asyncio.Semaphore | None = None

    def _make_channel(self, target: str, service_config: Mapping[str, Any]) -> grpc.aio.Channel:
        options = self._options(service_config)
        credentials = self._channel_credentials(target)
        if credentials is not None:
            return grpc.aio.secure_channel(target, credentials, options=options)
        return grpc.aio.insecure_channel(target, options=options)

    def _channel_for(self, address: str) -> grpc.aio.Channel:
        """The control channel to the daemon at `address` (see CONTROL_SERVICE_CONFIG)."""
        if address not in self._address_channels:
            self._address_channels[address] = self._make_channel(address, CONTROL_SERVICE_CONFIG)
        return self._address_channels[address]

    async def _unary(self, method: Any, request: Any, timeout: float | None = None, *, retry: bool = True) -> Any:
        """An idempotent call, retried on UNAVAILABLE / RESOURCE_EXHAUSTED (unless `retry` is false)."""
        self._check_open()
        attempt = 0
        while True:
            attempt += 1
            try:
                return await method(request, timeout=timeout or self._rpc_timeout, metadata=self._metadata)
            except grpc.RpcError as e:
                error = from_rpc_error(e)
                if not error.retryable or not retry or attempt > self._policy.max_retries:
                    raise error from None
                await asyncio.sleep(self._policy.delay(attempt, getattr(error, "retry_after", None)))

    # -- jobs -------------------------------------------------------------

    async def run(self, job: pb.Job, *, deadline: float | None = None) -> Result:
        """Run one job (built with ``code_job``, ``math_job``, ...) and return its result.

        ``deadline``: seconds each RPC attempt may take (default: from the job's
        limits). A retry after UNAVAILABLE or an overload starts a fresh one.
        """
        self._check_open()
        job = validate_job(job)
        deadline = self._deadline([job], deadline)
        state = ChunkState({job.index: job}, self._policy, self._router)
        while True:
            (request,) = state.request().jobs
            final: Result | None = None
            error: SandboxdError | None = None
            try:
                msg = await self._jobs_for(state.route).Run(request, timeout=deadline, metadata=self._metadata)
                msg.index = request.index  # a unary answer is ours whatever index it carries
                final = state.on_message(msg)
            except grpc.RpcError as e:
                error = from_rpc_error(e)
            finals = state.on_end(error)
            if final is not None or finals:
                return final if final is not None else finals[0]
            await asyncio.sleep(state.next_delay())

    async def score_code(
        self, completion: str, tests: CodeTestsLike, *, deadline: float | None = None, **job_options: Any
    ) -> Result:
        """Score a code completion against tests; ``job_options`` (``timeout`` per test...) as :func:`code_job`."""
        return await self.run(code_job(completion, tests, **job_options), deadline=deadline)

    async def score_math(
        self,
        completion: str,
        ground_truth: str | int | float,
        *,
        deadline: float | None = None,
        **job_options: Any,
    ) -> Result:
        """Check a math completion against its ground truth; ``job_options`` as :func:`math_job`."""
        return await self.run(math_job(completion, ground_truth, **job_options), deadline=deadline)

    async def execute(
        self,
        code: str,
        language: str = "python",
        stdin: str | bytes = b"",
        *,
        deadline: float | None = None,
        **job_options: Any,
    ) -> Result:
        """Run a program as-is; ``result.details`` is an :class:`ExecuteOutput`."""
        return await self.run(execute_job(code, language, stdin, **job_options), deadline=deadline)

    async def score_reward_model(
        self, prompt: str, completion: str, *, model: str, deadline: float | None = None, **job_options: Any
    ) -> Result:
        """Score (prompt, completion) with the daemon's reward model ``model``."""
        return await self.run(
            reward_model_job(prompt, completion, model=model, **job_options), deadline=deadline
        )

    def run_batch(self, jobs: Iterable[pb.Job], *, deadline: float | None = None) -> AsyncIterator[Result]:
        """Run jobs, yielding each :class:`Result` as it finishes; ``result.index`` is its position.

        As :meth:`SandboxClient.run_batch`. Validation happens here, before the
        first RPC (and before iteration).
        """
        self._check_open()
        jobs = validate_batch(jobs)
        deadline = self._deadline(jobs, deadline)
        return self._stream(jobs, deadline)

    async def _stream(self, jobs: list[pb.Job], deadline: float) -> AsyncIterator[Result]:
        out: asyncio.Queue[Result | BaseException] = asyncio.Queue()
        if self._semaphore is None:
            self._semaphore = asyncio.Semaphore(self._max_concurrent)
        tasks = [asyncio.ensure_future(self._run_chunk(chunk, deadline, out)) for chunk in self._chunks(jobs)]
        try:
            for _ in range(len(jobs)):
                item = await out.get()
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            for task in tasks:
                task.cancel()

    async def _run_chunk(
        self, chunk: dict[int, pb.Job], deadline: float, out: asyncio.Queue[Result | BaseException]
    ) -> None:
        assert self._semaphore is not None
        state = ChunkState(chunk, self._policy, self._router)
        try:
            while state.pending:
                error: SandboxdError | None = None
                async with self._semaphore:
                    request = state.request()
                    call = self._jobs_for(state.route).RunBatch(request, timeout=deadline, metadata=self._metadata)
                    try:
                        async for msg in call:
                            result = state.on_message(msg)
                            if result is not None:
                                out.put_nowait(result)
                    except grpc.RpcError as e:
                        error = from_rpc_error(e)
                    except asyncio.CancelledError:
                        call.cancel()
                        raise
                for result in state.on_end(error):
                    out.put_nowait(result)
                if state.pending:
                    await asyncio.sleep(state.next_delay())
        except asyncio.CancelledError:
            raise
        except BaseException as e:  # handed to the consumer, which re-raises it
            # A channel that close() shut mid-call raises grpc's own errors (UsageError here).
            out.put_nowait(_closed_during_batch() if self._closed else e)

    async def score_batch(self, jobs: Iterable[pb.Job], *, deadline: float | None = None) -> list[Result]:
        """Run jobs and return their results in input order (validated before the first RPC)."""
        return sorted([r async for r in self.run_batch(jobs, deadline=deadline)], key=_by_index)

    # -- sessions ---------------------------------------------------------

    async def open_session(
        self,
        language: str = "python",
        *,
        timeout: float | None = None,
        memory_bytes: int | None = None,
        output_bytes: int | None = None,
        files: Mapping[str, str | bytes] | None = None,
        idle_timeout: float | None = None,
    ) -> AsyncSession:
        """Hold a sandbox for a multi-turn episode; ``timeout`` etc. are per-cell limits."""
        self._check_open()
        request = self._open_request(language, timeout, memory_bytes, output_bytes, files, idle_timeout)
        *first, last = self._session_targets()
        for target in first:
            try:
                return await self._open_on(target, request, retry=False)
            except SandboxdError as error:
                if not spills(error):
                    raise
                # The local daemon is full or gone: the fleet's turn.
        return await self._open_on(last, request, retry=True)

    async def _open_on(self, target: str, request: pb.OpenSessionRequest, *, retry: bool) -> AsyncSession:
        channel = self._make_channel(target, SESSION_SERVICE_CONFIG)
        stub = pb_grpc.SessionsStub(channel)
        try:
            info = await self._unary(stub.Open, request, retry=retry)
        except BaseException:
            await channel.close()
            raise
        return AsyncSession(self, channel, stub, info, request.limits.timeout_seconds or self._job_timeout)

    # -- pool and daemon --------------------------------------------------

    async def set_batch_hint(self, batch_size: int, sessions: int = 0, *,
                             pools: Sequence[str] = ()) -> pb.PoolStatus:
        """Tell the daemons how many completions (and live sessions) each step brings (see the sync twin)."""
        shares = self._hint_shares(batch_size, sessions, pools)
        answers = await asyncio.gather(
            *(self._unary(pb_grpc.PoolStub(self._channel_for(a)).SetBatchHint, hint) for a, hint in shares)
        )
        return merge_pool_status(answers)

    async def pool_status(self) -> pb.PoolStatus:
        """Pools, queue and throughput of every known daemon (pools listed together, counters summed)."""
        request = pb.GetPoolStatusRequest()
        answers = await asyncio.gather(
            *(
                self._unary(pb_grpc.PoolStub(self._channel_for(a)).GetStatus, request)
                for a in self._addresses
            )
        )
        return merge_pool_status(answers)

    async def info(self) -> pb.Info:
        """Version, languages, job kinds and limits of the first daemon that answers, serving or not."""
        error: SandboxdError | None = None
        for address in self._addresses:
            try:
                return await self._unary(pb_grpc.DaemonStub(self._channel_for(address)).GetInfo,
                                         pb.GetInfoRequest())
            except Unavailable as exc:
                error = exc
        assert error is not None
        raise error

    async def close(self) -> None:
        """Close the channels. Idempotent."""
        if self._closed:
            return
        self._closed = True
        fleet = [self._fleet_channel] if self._fleet_channel is not None else []
        for channel in (self._channel, *fleet, *self._address_channels.values()):
            await channel.close()

    async def __aenter__(self) -> AsyncSandboxClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class AsyncSession(_SessionBase):
    """The asyncio twin of :class:`Session`."""

    _client: AsyncSandboxClient
    _channel: grpc.aio.Channel

    async def run(self, code: str, *, timeout: float | None = None, final: bool = False) -> CellResult:
        """Run one cell. Never retried: a cell is not idempotent. ``final`` as :meth:`Session.run`."""
        request, deadline = self._cell_call(code, timeout, final)
        try:
            msg = await self._stub.RunCell(request, timeout=deadline, metadata=self._client._metadata)
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None
        return self._cell_result(request, msg)

    async def close(self) -> None:
        """Give the sandbox back. Idempotent; a session the daemon already dropped is fine."""
        if self._closed:
            return
        self._closed = True
        try:
            request, timeout = self._close_request()
            await self._stub.Close(request, timeout=timeout, metadata=self._client._metadata)
        except grpc.RpcError as e:
            error = from_rpc_error(e)
            if not isinstance(error, SessionNotFound):
                raise error from None
        finally:
            await self._channel.close()

    async def __aenter__(self) -> AsyncSession:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def _closed_during_batch() -> SandboxdError:
    return SandboxdError("the client was closed while the batch ran; its unanswered jobs were not scored")


def _report_if_cancelled(out: queue.Queue[Result | BaseException], chunk: Future[None]) -> None:
    if chunk.cancelled():
        out.put(_closed_during_batch())


# -- rows of a trainer's batch ------------------------------------------------
#
# The daemon refuses a whole batch, before any of it runs, for one job it cannot take (tests it
# cannot read, an unknown language, a completion over its size limit). A trainer's reward
# function must not lose every row's reward for one such row: the batch is halved until each
# refused job stands alone (about 2 log2(n) refused calls per such job, each answered at once),
# and every other job is scored as usual.


def _shifted(results: list[Result | InvalidRequest], offset: int) -> list[Result | InvalidRequest]:
    return [replace(r, index=r.index + offset) if isinstance(r, Result) else r for r in results]


def score_rows(client: SandboxClient, jobs: Sequence[pb.Job]) -> list[Result | InvalidRequest]:
    """:meth:`SandboxClient.score_batch`, but a job the daemon refuses comes back as its own InvalidRequest."""
    try:
        return list(client.score_batch(jobs))
    except InvalidRequest as error:
        if len(jobs) == 1:
            return [error]
    half = len(jobs) // 2
    return score_rows(client, jobs[:half]) + _shifted(score_rows(client, jobs[half:]), half)


async def score_rows_async(client: AsyncSandboxClient, jobs: Sequence[pb.Job]) -> list[Result | InvalidRequest]:
    """The ``async def`` twin of :func:`score_rows`."""
    try:
        return list(await client.score_batch(jobs))
    except InvalidRequest as error:
        if len(jobs) == 1:
            return [error]
    half = len(jobs) // 2
    return await score_rows_async(client, jobs[:half]) + _shifted(await score_rows_async(client, jobs[half:]), half)
