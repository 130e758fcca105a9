"""Every error sandboxd raises on purpose, and the gRPC status each maps to.

One place for the mapping, so that a client in any language can rely on it:
INVALID_ARGUMENT for a malformed request, RESOURCE_EXHAUSTED (with a retry
hint) when admission control refuses work, UNAVAILABLE while the daemon is
not ready, FAILED_PRECONDITION for a request the daemon cannot serve in its
configuration (a language whose image is missing, a GPU pool without GPUs).
"""

from __future__ import annotations

import grpc

from sandboxd.agent import messages


class SandboxdError(Exception):
    """Base class; `code` is the gRPC status it is reported with."""

    code = grpc.StatusCode.INTERNAL


class ConfigError(SandboxdError):
    """The configuration is invalid; raised at start-up, never later."""

    code = grpc.StatusCode.FAILED_PRECONDITION


class InvalidRequest(SandboxdError):
    code = grpc.StatusCode.INVALID_ARGUMENT


class Unsupported(SandboxdError):
    """Well-formed, but this daemon cannot serve it (missing image, no GPU)."""

    code = grpc.StatusCode.FAILED_PRECONDITION


class Overloaded(SandboxdError):
    code = grpc.StatusCode.RESOURCE_EXHAUSTED

    def __init__(self, message: str, retry_after_seconds: float) -> None:
        super().__init__(message)
        self.retry_after_seconds = retry_after_seconds


class NotReady(SandboxdError):
    code = grpc.StatusCode.UNAVAILABLE


class BackendUnavailable(SandboxdError):
    """The Docker engine does not answer."""

    code = grpc.StatusCode.UNAVAILABLE


class NoSandbox(SandboxdError):
    """A job waited for a sandbox that cannot come: the engine that would start one does not answer.

    Or its pool cannot start one (PoolFailing).
    """

    code = grpc.StatusCode.UNAVAILABLE


class PoolFailing(NoSandbox):
    """A job's pool cannot start sandboxes (Pool.failing): no retry soon can help.

    Its result says so (JobResult.do_not_retry), and clients return the
    failure at once instead of retrying it for their whole backoff (about 15 s).
    """


class SandboxLost(SandboxdError):
    """A sandbox died or stopped answering under a job: retried elsewhere."""

    code = grpc.StatusCode.UNAVAILABLE


class SandboxFull(SandboxLost, messages.SandboxFull):
    """The agent's SandboxFull (agent/messages.py), raised again here from its `full` reply (Sandbox.request).

    The job found no room that it is not to blame for (/tmp, pids, memory or
    CPU that other runs there hold): retried elsewhere, as when lost, and with
    a lost sandbox's gRPC code should it reach a caller. The sandbox itself
    lives on, and takes no job until it has room again (Pool.mark_full).
    """


class SessionNotFound(SandboxdError):
    """No live session has this id: never opened, closed, expired, or lost with its sandbox."""

    code = grpc.StatusCode.NOT_FOUND


class SessionBusy(SandboxdError):
    """A cell is already running in the session; cells of one session run one at a time."""

    code = grpc.StatusCode.FAILED_PRECONDITION
