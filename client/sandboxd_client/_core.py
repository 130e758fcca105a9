"""Targets, channel options, retry policy and the batch state machine (no I/O).

The sync and async clients differ only in how they wait; every decision (where
to connect, how long to wait, what to retry, when to give up) is made here.
"""

from __future__ import annotations

import enum
import ipaddress
import json
import math
import os
import random
import re
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from ._proto.sandboxd.v1 import sandboxd_pb2 as pb
from ._requests import Result, failure_result, to_result
from .errors import InvalidRequest, Overloaded, PermissionDenied, SandboxdError, Unavailable, Unimplemented

DEFAULT_ADDRESS = "unix:///run/sandboxd/sandboxd.sock"
ADDRESS_ENV = "SANDBOXD_ADDRESS"
FLEET_ENV = "SANDBOXD_FLEET"
TOKEN_ENV = "SANDBOXD_TOKEN"
TLS_CA_ENV = "SANDBOXD_TLS_CA"
TLS_CERT_ENV = "SANDBOXD_TLS_CERT"
TLS_KEY_ENV = "SANDBOXD_TLS_KEY"
# gRPC backs off between connection attempts from 1 s, times 1.6 each, up to 120 s: a
# daemon back after a restart of 10 s was found up to 6 s later, after a minute up to 40 s
# later, while every call failed UNAVAILABLE. Attempts every 0.25-1 s (plus gRPC's 20 %
# jitter) find it within about 1.2 s; min_reconnect_backoff_ms is also each attempt's
# connect timeout, which 1 s leaves ample for a TCP and TLS handshake in a cluster.
RECONNECT_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.initial_reconnect_backoff_ms", 250),
    ("grpc.min_reconnect_backoff_ms", 1000),
    ("grpc.max_reconnect_backoff_ms", 1000),
)

# round_robin spreads calls over every ready daemon; healthCheckConfig makes gRPC
# watch grpc.health.v1 on each and skip those that report NOT_SERVING (draining).
# A daemon without the health service is treated as healthy by gRPC.
JOBS_SERVICE_CONFIG: dict[str, Any] = {
    "loadBalancingConfig": [{"round_robin": {}}],
    "healthCheckConfig": {"serviceName": ""},
}


def reward_model_health_service(model: str) -> str:
    """The grpc.health.v1 service name by which a daemon says whether reward model `model` can score there now.

    SERVING while the daemon serves and the model is loaded in a warm sandbox;
    NOT_SERVING while it loads (the daemon itself serves by then), when it
    failed to load, or while the daemon drains.
    """
    return f"sandboxd.v1.Jobs/reward_model/{model}"


def jobs_service_config(reward_model: str | None) -> dict[str, Any]:
    """The job channel's service config: every serving daemon, or those where `reward_model` can score."""
    if not reward_model:
        return JOBS_SERVICE_CONFIG
    return {**JOBS_SERVICE_CONFIG, "healthCheckConfig": {"serviceName": reward_model_health_service(reward_model)}}


# A session lives on one daemon, so its calls must not be balanced: pick_first
# sticks to one connection, and shuffling spreads sessions over daemons.
SESSION_SERVICE_CONFIG: dict[str, Any] = {
    "loadBalancingConfig": [{"pick_first": {"shuffleAddressList": True}}],
    "healthCheckConfig": {"serviceName": ""},
}
# Pool and Daemon calls (status, info, the batch hint) go to one daemon each, on
# a channel of its own that does not health check: a daemon that is starting,
# or whose pools cannot start sandboxes, reports NOT_SERVING, and is exactly
# the one whose status says why.
CONTROL_SERVICE_CONFIG: dict[str, Any] = {"loadBalancingConfig": [{"pick_first": {}}]}
# Results carry truncated outputs and collected files; 64 MiB leaves room for
# large collect_files without letting one answer exhaust memory.
MAX_MESSAGE_BYTES = 64 << 20


@dataclass(frozen=True)
class Target:
    """Where to connect: one gRPC target string for the channel, and its known addresses."""

    #: What grpc.*_channel() gets, e.g. "unix:///a.sock,/b.sock" or "ipv4:10.0.0.1:50051,10.0.0.2:50051".
    grpc_target: str
    #: Each daemon as its own target (for per-daemon calls such as the batch hint).
    addresses: tuple[str, ...]


def _split_env(value: str) -> list[str]:
    return [part.strip() for part in value.split(",") if part.strip()]


def resolve_target(address: str | Sequence[str] | None) -> Target:
    """Turn the user's address (or ``$SANDBOXD_ADDRESS``, or the default socket) into a Target.

    One address is passed to gRPC as is. Several are joined into one
    multi-address target (all ``unix:`` paths, all IPv4 or all IPv6; host names
    are resolved once here) so gRPC's round_robin balances over them.
    """
    if address is None:
        address = os.environ.get(ADDRESS_ENV) or DEFAULT_ADDRESS
    if isinstance(address, str):
        # "unix:///a,/b" and "ipv4:a,b" are already gRPC multi-address targets.
        if "," in address and not address.startswith(("unix:", "ipv4:", "ipv6:")):
            address = _split_env(address)
        else:
            return Target(address.strip(), _expand_multi(address.strip()))
    addresses = [a.strip() for a in address if isinstance(a, str) and a.strip()]
    if len(addresses) != len(list(address)) or not addresses:
        raise InvalidRequest(f"address list must hold non-empty strings, got {address!r}")
    if len(addresses) == 1:
        return resolve_target(addresses[0])
    if any(a.startswith(("dns:", "xds:")) for a in addresses):
        raise InvalidRequest("a dns:/xds: target balances by itself; pass it alone, not in a list")
    kinds = [_classify(a) for a in addresses]
    families = {family for family, _ in kinds}
    if len(families) != 1:
        raise InvalidRequest(f"cannot mix unix sockets, IPv4 and IPv6 in one address list: {addresses}")
    family = families.pop()
    parts = [part for _, part in kinds]
    prefix = "unix://" if family == "unix" else f"{family}:"
    singles = tuple(f"unix://{p}" if family == "unix" else f"{family}:{p}" for p in parts)
    return Target(prefix + ",".join(parts), singles)


def resolve_fleet(fleet: str | Sequence[str] | None) -> Target | None:
    """The fleet a client spills to: ``fleet``, else ``$SANDBOXD_FLEET``; None for none (also for ``""`` or ``[]``)."""
    if fleet is None:
        fleet = os.environ.get(FLEET_ENV, "")
    if isinstance(fleet, str):
        fleet = fleet.strip()
    elif not isinstance(fleet, Sequence):
        raise InvalidRequest(f"fleet must be an address, a list of addresses or None, got {type(fleet).__name__}")
    return resolve_target(fleet) if fleet else None


def _expand_multi(target: str) -> tuple[str, ...]:
    for scheme in ("unix://", "unix:", "ipv4:", "ipv6:"):
        if target.startswith(scheme) and "," in target:
            parts = target[len(scheme) :].split(",")
            return tuple(scheme + p for p in parts if p)
    return (target,)


def _classify(address: str) -> tuple[str, str]:
    """(family, address part) for one address of a list."""
    if address.startswith("unix://"):
        return "unix", address[len("unix://") :]
    if address.startswith("unix:"):
        return "unix", address[len("unix:") :]
    if address.startswith("/"):
        return "unix", address
    for family in ("ipv4", "ipv6"):
        if address.startswith(f"{family}:"):
            return family, address[len(family) + 1 :]
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise InvalidRequest(f"address {address!r} is not host:port, a unix: path or an ipv4:/ipv6: target")
    host = host.strip("[]")
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        ip = _lookup(host, int(port))
    if ip.version == 6:
        return "ipv6", f"[{ip}]:{port}"
    return "ipv4", f"{ip}:{port}"


def _lookup(host: str, port: int) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    # Resolved once, at construction: a list of names is a fixed set of daemons.
    # Use a single "dns:///name:port" target to follow DNS changes instead.
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise InvalidRequest(f"cannot resolve {host!r}: {e}") from e
    ips = [ipaddress.ip_address(info[4][0]) for info in infos]
    # Prefer IPv4 so "localhost" mixes with IPv4 literals.
    return next((ip for ip in ips if ip.version == 4), ips[0])


def channel_options(
    service_config: Mapping[str, Any], extra: Sequence[tuple[str, Any]] = ()
) -> list[tuple[str, Any]]:
    """Channel arguments for a client channel with the given service config, then ``extra`` (the caller's).

    gRPC takes the first of two arguments with one name: the service config
    (balancing, health checks, a session's pick_first) stays ours, while the
    caller's message limits replace the defaults (they were ignored).
    """
    named = {name for name, _ in extra}
    limits = [(name, MAX_MESSAGE_BYTES) for name in ("grpc.max_receive_message_length", "grpc.max_send_message_length")
              if name not in named]
    reconnect = [(name, value) for name, value in RECONNECT_OPTIONS if name not in named]
    return [("grpc.service_config", json.dumps(service_config)), *limits, *reconnect, *extra]


def bearer_token(token: str | None) -> str | None:
    """``token``, else ``$SANDBOXD_TOKEN``; None for neither. A token gRPC could not send is refused here."""
    token = token if token is not None else os.environ.get(TOKEN_ENV) or None
    if token is not None and (not token or not token.isascii() or not token.isprintable() or " " in token):
        raise InvalidRequest("token must be non-empty printable ASCII without spaces")
    return token


@dataclass(frozen=True)
class TlsFiles:
    """PEM contents for a TLS channel: the CA to trust (None: the system's) and a client certificate and key."""

    ca: bytes | None = None
    cert: bytes | None = None
    key: bytes | None = None


def _read(kind: str, path: str) -> bytes:
    try:
        with open(path, "rb") as file:
            return file.read()
    except OSError as e:
        raise InvalidRequest(f"cannot read {kind} {path}: {e.strerror}") from None


def tls_files(
    tls: bool | None, ca: str | None, cert: str | None, key: str | None
) -> TlsFiles | None:
    """The TLS settings from the arguments, each else its ``$SANDBOXD_TLS_*`` variable; None for plaintext.

    TLS is on when ``tls`` is true or any file is named (``tls=False`` turns it off whatever the environment
    says). A client certificate (mutual TLS) needs its key.
    """
    if tls is False:
        return None
    ca = ca or os.environ.get(TLS_CA_ENV) or None
    cert = cert or os.environ.get(TLS_CERT_ENV) or None
    key = key or os.environ.get(TLS_KEY_ENV) or None
    if not (tls or ca or cert or key):
        return None
    if bool(cert) != bool(key):
        raise InvalidRequest("tls_cert and tls_key (a client certificate for mutual TLS) go together")
    return TlsFiles(
        ca=_read("tls_ca", ca) if ca else None,
        cert=_read("tls_cert", cert) if cert else None,
        key=_read("tls_key", key) if key else None,
    )


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with jitter for infrastructure failures only.

    Attempt ``n`` (1 = first retry) waits between half and all of
    ``min(max_backoff, initial_backoff * multiplier ** (n - 1))``; a daemon's
    retry hint is a floor, plus up to 10% so clients told the same hint do not
    come back in step, capped at ``max_retry_after``. The defaults wait about
    11 to 23 s over 8 retries: enough to ride out a lost sandbox or a daemon
    restart, short next to a training step.
    """

    max_retries: int = 8
    initial_backoff: float = 0.25
    max_backoff: float = 5.0
    multiplier: float = 2.0
    max_retry_after: float = 30.0

    def delay(
        self, attempt: int, retry_after: float | None = None, rng: random.Random | None = None
    ) -> float:
        """Seconds to wait before retry number ``attempt``."""
        uniform = rng.uniform if rng is not None else random.uniform
        cap = min(self.max_backoff, self.initial_backoff * self.multiplier ** max(0, attempt - 1))
        wait = cap / 2 + uniform(0, cap / 2)
        if retry_after:
            wait = max(wait, retry_after + uniform(0, 0.1 * retry_after))
        return min(wait, self.max_retry_after)


class Route(enum.Enum):
    """Which of a client's two job channels an RPC takes."""

    #: The client's ``address``: the node's own daemon (or the only daemons, without a fleet).
    LOCAL = "local"
    #: The client's ``fleet``: where work goes while the local daemon refuses it or cannot be reached.
    FLEET = "fleet"


# After the local daemon refused a request (RESOURCE_EXHAUSTED) or could not be reached, requests go straight
# to the fleet for this long, or for the daemon's retry hint when longer, up to LOCAL_SKIP_MAX_SECONDS: asking
# a full or stopped daemon first would cost every request a refused RPC. A refusal is answered before any job
# runs, so the local daemon is asked again soon: it is the cheaper door (no TLS, no network hop), and a full
# one drains at its own pace (its hint: the time to work off half its queue).
LOCAL_SKIP_SECONDS = 1.0
LOCAL_SKIP_MAX_SECONDS = 5.0


class LocalFirst:
    """Where each attempt of a client with a fleet goes: the local daemon, unless it refused lately.

    Shared by every call of one client (threads included: each method reads or
    writes one float). The drivers say what the local daemon answered through
    :class:`ChunkState`.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._skip_until = -math.inf

    def pick(self) -> Route:
        """The route of the next attempt."""
        return Route.LOCAL if self._clock() >= self._skip_until else Route.FLEET

    def refused(self, retry_after: float | None = None) -> None:
        """The local daemon refused a request or could not be reached: send work to the fleet for a while."""
        skip = min(LOCAL_SKIP_MAX_SECONDS, max(LOCAL_SKIP_SECONDS, retry_after or 0.0))
        self._skip_until = max(self._skip_until, self._clock() + skip)


def spills(error: SandboxdError | None) -> bool:
    """Whether a failed RPC to the local daemon sends its work to the fleet: it was full, or could not be reached."""
    return isinstance(error, (Overloaded, Unavailable))


def plan_chunks(jobs: Sequence[pb.Job], *, max_jobs: int, max_bytes: int) -> list[list[int]]:
    """Split a batch into RunBatch requests of at most ``max_jobs`` jobs and about ``max_bytes``.

    Several requests rather than one let round_robin spread a batch over every
    daemon (it balances per RPC) and keep each under the daemon's message limit.
    """
    chunks: list[list[int]] = []
    current: list[int] = []
    size = 0
    for i, job in enumerate(jobs):
        job_size = job.ByteSize() + 16  # index and framing
        if current and (len(current) >= max_jobs or size + job_size > max_bytes):
            chunks.append(current)
            current, size = [], 0
        current.append(i)
        size += job_size
    if current:
        chunks.append(current)
    return chunks


# The daemon's name for the job it refused in a RunBatch: its position in the request.
_REQUEST_POSITION = re.compile(r"^(?:[A-Z_]+: )?jobs\[(?P<position>\d+)\]")

# RPC errors that condemn the request itself rather than the daemon serving it.
_CALLER_ERRORS = (InvalidRequest, PermissionDenied, Unimplemented)


def failure_value_of(job: pb.Job) -> float:
    """The reward a failed job gets: its own failure value or the contract's -1.0."""
    return job.failure_value if job.HasField("failure_value") else -1.0


class ChunkState:
    """The jobs of one RPC (a RunBatch chunk or a single Run) through their attempts.

    Drivers call :meth:`request`, feed every answer to :meth:`on_message`
    (emitting what it returns at once), then :meth:`on_end` with the RPC's
    error if any; while :attr:`pending` is non-empty they sleep
    :meth:`next_delay` and go again.
    """

    def __init__(self, jobs: Mapping[int, pb.Job], policy: RetryPolicy, router: LocalFirst | None = None) -> None:
        self._jobs = jobs
        self._policy = policy
        self._router = router
        #: Where the latest attempt went (always LOCAL without a router).
        self.route = Route.LOCAL
        # Attempts that moved the jobs to the fleet after the local daemon refused them: routing, not retries,
        # they count in client_attempts but not against max_retries.
        self._spills = 0
        self._spilled = False
        self.pending: list[int] = list(jobs)
        # The jobs of the latest request, in its order: request.jobs[k] is self._jobs[self._sent[k]].
        self._sent: list[int] = []
        self.attempt = 0
        self._answered: set[int] = set()
        self._retry: list[int] = []
        self._hint: float | None = None

    def _next_attempt(self) -> list[int]:
        """Start an attempt; returns the indexes of the jobs it carries."""
        self.attempt += 1
        self._answered = set()
        self._retry = []
        self._hint = None
        # A spilled attempt's jobs go to the fleet whatever the router says by now (a wait for a batch slot may
        # outlast its skip): else a busy client could send them back to the full local daemon again and again.
        if self._router is None:
            self.route = Route.LOCAL
        else:
            self.route = Route.FLEET if self._spilled else self._router.pick()
        self._spilled = False
        self._sent = list(self.pending)
        return list(self._sent)

    def request(self) -> pb.RunBatchRequest:
        """The next attempt's pending jobs, each copied once and stamped with its index.

        A single-job chunk sends ``request().jobs[0]`` through Run.
        """
        request = pb.RunBatchRequest()
        for i in self._next_attempt():
            job = request.jobs.add()
            job.CopyFrom(self._jobs[i])
            job.index = i
        return request

    @property
    def can_retry(self) -> bool:
        """Whether another attempt is allowed after this one."""
        return self.attempt - self._spills <= self._policy.max_retries

    def on_message(self, msg: pb.JobResult) -> Result | None:
        """A result from the daemon: final (returned) or kept for a retry (None)."""
        i = msg.index
        if i not in self._jobs or i in self._answered or i not in self.pending:
            return None  # unknown or duplicate index: the contract promises one per job
        self._answered.add(i)
        result = to_result(msg, failure_value=failure_value_of(self._jobs[i]))
        # do_not_retry: the job's pool cannot start sandboxes, and a retry
        # would only hold the answer back for the whole backoff (about 15 s).
        if result.is_infrastructure_failure and self.can_retry and not msg.do_not_retry:
            self._retry.append(i)
            if result.retry_after_seconds > 0:
                self._hint = max(self._hint or 0.0, result.retry_after_seconds)
            return None
        return replace(result, client_attempts=self.attempt)

    def on_end(self, error: SandboxdError | None) -> list[Result]:
        """The RPC ended: returns results made for jobs that will not be retried.

        Raises the error when it condemns the request itself (INVALID_ARGUMENT,
        permissions): retrying cannot help, and the caller must fix it.
        """
        unanswered = [i for i in self.pending if i not in self._answered]
        finals: list[Result] = []
        if unanswered and error is None:
            error = Unavailable("the daemon closed the stream without answering every job")
        if unanswered and error is not None:
            if isinstance(error, _CALLER_ERRORS):
                raise self._named_by_index(error)
            if self._router is not None and self.route is Route.LOCAL and spills(error):
                self._router.refused(getattr(error, "retry_after", None))
                self._spills += 1
                self._spilled = True
                self._retry.extend(unanswered)
            elif error.retryable and self.can_retry:
                self._retry.extend(unanswered)
                hint = getattr(error, "retry_after", None)
                if hint:
                    self._hint = max(self._hint or 0.0, hint)
            else:
                finals = [
                    failure_result(
                        i, error, failure_value=failure_value_of(self._jobs[i]), client_attempts=self.attempt
                    )
                    for i in unanswered
                ]
        self.pending = sorted(self._retry)
        return finals

    def _named_by_index(self, error: SandboxdError) -> SandboxdError:
        """The daemon's refusal of a RunBatch, naming the job by its input position (the caller's index).

        The daemon names a batch's bad job by its place in the request, ``jobs[5]``; a batch goes out
        in chunks of ``batch_size``, so the 70th job of a list was ``jobs[5]`` of the second chunk, and
        ``sandboxd score`` sent its user to the file's sixth row. A Run names the job by its index
        already: a one-job request's ``jobs[N]`` is left as it is.
        """
        match = _REQUEST_POSITION.match(error.message)
        if match is None or len(self._sent) < 2 or int(match["position"]) >= len(self._sent):
            return error
        index = self._sent[int(match["position"])]
        error.message = f"{error.message[: match.start('position')]}{index}{error.message[match.end('position'):]}"
        error.args = (error.message,)
        return error

    def next_delay(self) -> float:
        """Seconds to wait before retrying :attr:`pending`: none when they move to the fleet."""
        if self._spilled:
            return 0.0
        return self._policy.delay(self.attempt - self._spills, self._hint)


def merge_pool_status(statuses: Sequence[pb.PoolStatus]) -> pb.PoolStatus:
    """One PoolStatus for several daemons: their pools listed together, counters summed."""
    if len(statuses) == 1:
        return statuses[0]
    merged = pb.PoolStatus()
    for status in statuses:
        merged.pools.extend(status.pools)
        merged.queue_depth += status.queue_depth
        merged.in_flight += status.in_flight
        merged.jobs_total += status.jobs_total
        merged.jobs_per_second += status.jobs_per_second
    return merged
