"""Every exception the client raises, and the one place gRPC status codes map to them.

Scoring calls (``run``, ``score_*``, ``run_batch``, ``score_batch``) do not raise
for infrastructure failures: they return a :class:`~sandboxd_client.Result` whose
``error`` holds one of these (see ``Result.raise_for_status``). Control calls
(sessions, pool, info) raise them directly.
"""

from __future__ import annotations

from collections.abc import Iterable

import grpc

#: Trailing-metadata key the daemon sets with RESOURCE_EXHAUSTED: seconds to wait.
RETRY_AFTER_KEY = "retry-after-seconds"


class SandboxdError(Exception):
    """Base of every error raised by the client."""

    #: The gRPC code the error came from; None when raised before any RPC.
    code: grpc.StatusCode | None = None
    #: Whether retrying the same request later may succeed.
    retryable: bool = False

    def __init__(self, message: str, *, code: grpc.StatusCode | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code


class InvalidRequest(SandboxdError, ValueError):
    """The request is malformed: found by the client before any RPC, or by the daemon."""

    code = grpc.StatusCode.INVALID_ARGUMENT


class MessageTooLarge(InvalidRequest):
    """A request or its answer is over gRPC's size limit for one message (RESOURCE_EXHAUSTED from gRPC itself).

    The client's limit is 64 MiB each way (``options`` can change it), the
    daemon's 256 MiB. Not the daemon's capacity: the same request is as large
    next time, so it is not retried. Send less per request (smaller files,
    fewer collected ones).
    """

    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class Overloaded(SandboxdError):
    """The daemon refused the work for lack of capacity (RESOURCE_EXHAUSTED)."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED
    retryable = True

    def __init__(
        self, message: str, *, retry_after: float | None = None, code: grpc.StatusCode | None = None
    ) -> None:
        super().__init__(message, code=code)
        #: Seconds the daemon asked us to wait before retrying, if it said.
        self.retry_after = retry_after


class Unavailable(SandboxdError):
    """No daemon could be reached, or the one serving the call went away (UNAVAILABLE)."""

    code = grpc.StatusCode.UNAVAILABLE
    retryable = True


class DeadlineExceeded(SandboxdError, TimeoutError):
    """The call's deadline passed before the daemon answered."""

    code = grpc.StatusCode.DEADLINE_EXCEEDED


class Cancelled(SandboxdError):
    """The call was cancelled (by the daemon shutting down, or by us)."""

    code = grpc.StatusCode.CANCELLED


class SessionNotFound(SandboxdError, KeyError):
    """The session is unknown to the daemon: closed, expired, or lost with its sandbox."""

    code = grpc.StatusCode.NOT_FOUND

    def __str__(self) -> str:
        # KeyError.__str__ would repr() the message.
        return self.message


class PermissionDenied(SandboxdError):
    """Missing or wrong credentials (UNAUTHENTICATED / PERMISSION_DENIED)."""

    code = grpc.StatusCode.PERMISSION_DENIED


class Unimplemented(SandboxdError):
    """The daemon does not implement this call (an older or newer API version)."""

    code = grpc.StatusCode.UNIMPLEMENTED


class InternalError(SandboxdError):
    """A bug or unexpected failure inside sandboxd (INTERNAL, UNKNOWN, DATA_LOSS, ...)."""

    code = grpc.StatusCode.INTERNAL


_BY_CODE: dict[grpc.StatusCode, type[SandboxdError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidRequest,
    grpc.StatusCode.OUT_OF_RANGE: InvalidRequest,
    grpc.StatusCode.FAILED_PRECONDITION: InvalidRequest,
    grpc.StatusCode.RESOURCE_EXHAUSTED: Overloaded,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceeded,
    grpc.StatusCode.CANCELLED: Cancelled,
    grpc.StatusCode.NOT_FOUND: SessionNotFound,
    grpc.StatusCode.UNAUTHENTICATED: PermissionDenied,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDenied,
    grpc.StatusCode.UNIMPLEMENTED: Unimplemented,
}


def retry_after_from_metadata(metadata: Iterable[tuple[str, str | bytes]] | None) -> float | None:
    """The ``retry-after-seconds`` hint from trailing metadata, or None if absent or garbled."""
    for key, value in metadata or ():
        if key.lower() != RETRY_AFTER_KEY:
            continue
        try:
            seconds = float(value.decode() if isinstance(value, bytes) else value)
        except ValueError:
            return None
        # A negative or non-finite hint is a daemon bug; ignore it rather than sleep forever.
        return seconds if 0.0 <= seconds < float("inf") else None
    return None


def from_status(
    code: grpc.StatusCode,
    details: str | None,
    trailing_metadata: Iterable[tuple[str, str | bytes]] | None = None,
) -> SandboxdError:
    """Map a gRPC status to the matching :class:`SandboxdError`."""
    message = f"{code.name}: {details or 'no details'}"
    # gRPC's own words for its message size limit ("Sent message larger than
    # max (N vs. M)" where the request is made, "Received ..." where it is
    # read): the client retried such a request for its whole backoff (23 s
    # for a session opened with a 200 MB file), and each time it was as large.
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED and "message larger than max" in (details or "").lower():
        return MessageTooLarge(message, code=code)
    cls = _BY_CODE.get(code, InternalError)
    if cls is Overloaded:
        return Overloaded(message, retry_after=retry_after_from_metadata(trailing_metadata), code=code)
    return cls(message, code=code)


def from_rpc_error(error: grpc.RpcError) -> SandboxdError:
    """Map an ``RpcError`` from a sync or ``grpc.aio`` call to a :class:`SandboxdError`."""
    # Both grpc.Call (sync) and AioRpcError expose code()/details()/trailing_metadata().
    code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
    details = error.details() if hasattr(error, "details") else str(error)
    trailing = error.trailing_metadata() if hasattr(error, "trailing_metadata") else None
    return from_status(code or grpc.StatusCode.UNKNOWN, details, trailing)
