"""Bearer tokens on the TCP listener: who may call what.

A tokens file holds one ``name role token`` per line (``#`` starts a comment).
Roles: ``jobs`` (Jobs, Sessions, reflection, and the read-only Pool.GetStatus
and Daemon.GetInfo) and ``admin`` (everything, SetBatchHint and any other pool
control included). grpc.health.v1 answers without a token, so that load
balancers and clients' health checks need none. The Unix socket takes no
token: its file permissions are its door (server.socket_mode).
"""

from __future__ import annotations

import hmac
import logging
import math
import os
import stat
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from sandboxd import metrics
from sandboxd.errors import ConfigError

log = logging.getLogger("sandboxd.auth")

ROLES = ("jobs", "admin")
# Shorter tokens are guessable from a list; `openssl rand -hex 32` gives 64 characters.
MIN_TOKEN_CHARS = 16
OPEN_SERVICES = ("/grpc.health.v1.Health/",)
# Methods a `jobs` token may call; every other method (SetBatchHint, future pool controls, anything
# unknown) needs `admin`: a method added later is closed until it is named here.
JOBS_SERVICES = ("/sandboxd.v1.Jobs/", "/sandboxd.v1.Sessions/", "/grpc.reflection.")
JOBS_METHODS = frozenset({"/sandboxd.v1.Pool/GetStatus", "/sandboxd.v1.Daemon/GetInfo"})
# Refusals are logged at most once per (method, token name, refusal) this often, with a count of
# the others: a client retrying without a token, or a scan, would write a line per call.
REFUSAL_LOG_SECONDS = 10.0
UNAUTHENTICATED_MESSAGE = "missing or unknown bearer token"
PERMISSION_DENIED_MESSAGE = "this token's role may not call this method"


@dataclass(frozen=True)
class Token:
    name: str
    role: str
    secret: bytes

    def __repr__(self) -> str:  # never the secret, whatever logs it
        return f"Token(name={self.name!r}, role={self.role!r})"


def parse_tokens(text: str, where: str) -> list[Token]:
    """Tokens of a tokens file's text; ConfigError naming the line on anything malformed (never quoting a token)."""
    tokens: list[Token] = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        if len(parts) != 3:
            raise ConfigError(f"{where} line {number}: expected 'name role token', got {len(parts)} fields")
        name, role, secret = parts
        if role not in ROLES:
            raise ConfigError(f"{where} line {number}: role must be jobs or admin, got {role!r}")
        if len(secret) < MIN_TOKEN_CHARS or not secret.isascii():
            raise ConfigError(f"{where} line {number}: token {name!r} must be at least {MIN_TOKEN_CHARS} ASCII "
                              "characters (openssl rand -hex 32)")
        if any(t.name == name for t in tokens):
            raise ConfigError(f"{where} line {number}: token name {name!r} is used twice")
        if any(hmac.compare_digest(t.secret, secret.encode()) for t in tokens):
            raise ConfigError(f"{where} line {number}: token {name!r} repeats another's token")
        tokens.append(Token(name, role, secret.encode()))
    if not tokens:
        raise ConfigError(f"{where}: no tokens")
    return tokens


def load_tokens(path: str) -> list[Token]:
    """The tokens of server.tokens_file; ConfigError if it cannot be read, is open to group or others, or is bad."""
    where = f"server.tokens_file {path}"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as exc:
        raise ConfigError(f"{where}: {exc.strerror}") from None
    with os.fdopen(fd) as file:
        mode = os.fstat(file.fileno()).st_mode
        if not stat.S_ISREG(mode):
            raise ConfigError(f"{where}: not a regular file")
        if mode & 0o077:
            raise ConfigError(f"{where}: mode {stat.S_IMODE(mode):04o} lets group or others in; chmod 600 it")
        text = file.read()
    return parse_tokens(text, where)


def required_role(method: str) -> str | None:
    """The role `method` needs; None for methods open to all (health)."""
    if method.startswith(OPEN_SERVICES):
        return None
    if method.startswith(JOBS_SERVICES) or method in JOBS_METHODS:
        return "jobs"
    return "admin"


def bearer(metadata: Sequence[tuple[str, str | bytes]] | None) -> bytes | None:
    """The token of the call's `authorization: Bearer ...` header; None without one."""
    for key, value in metadata or ():
        if key == "authorization":
            text = value.decode("latin-1") if isinstance(value, bytes) else value
            scheme, _, token = text.strip().partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return token.strip().encode("utf-8", "replace")
            return None
    return None


def find_token(tokens: Sequence[Token], presented: bytes | None) -> Token | None:
    """The token whose secret is `presented`, compared in constant time with every one (no early exit)."""
    if presented is None:
        return None
    found = None
    for token in tokens:
        if hmac.compare_digest(token.secret, presented):
            found = token
    return found


def authorize(tokens: Sequence[Token], method: str,
              metadata: Sequence[tuple[str, str | bytes]] | None) -> tuple[Token | None, grpc.StatusCode | None]:
    """(the caller's token, None) when the call may go on; (token or None, the refusal's status) otherwise."""
    role = required_role(method)
    if role is None:
        return None, None
    token = find_token(tokens, bearer(metadata))
    if token is None:
        return None, grpc.StatusCode.UNAUTHENTICATED
    if role == "admin" and token.role != "admin":
        return token, grpc.StatusCode.PERMISSION_DENIED
    return token, None


def _refusal(handler: grpc.RpcMethodHandler, code: grpc.StatusCode, message: str) -> grpc.RpcMethodHandler:
    """A handler of `handler`'s kind that answers `code`: no request is decoded and no servicer runs."""

    async def refuse(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await context.abort(code, message)

    async def refuse_stream(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await context.abort(code, message)
        yield  # an async generator, as a streaming handler is

    streaming = handler.response_streaming
    if handler.request_streaming:
        kind = grpc.stream_stream_rpc_method_handler if streaming else grpc.stream_unary_rpc_method_handler
    else:
        kind = grpc.unary_stream_rpc_method_handler if streaming else grpc.unary_unary_rpc_method_handler
    return kind(refuse_stream if streaming else refuse)


class BearerTokens(grpc.aio.ServerInterceptor):
    """Checks every call's bearer token against the tokens file (UNAUTHENTICATED, PERMISSION_DENIED)."""

    def __init__(self, tokens: Sequence[Token]) -> None:
        self.tokens = list(tokens)
        # (method, token name, refusal) -> (when last logged, refusals not logged since)
        self._logged: dict[tuple[str, str, str], tuple[float, int]] = {}

    def _log_refusal(self, method: str, token: Token | None, reason: str) -> None:
        key = (method, token.name if token else "", reason)
        now = time.monotonic()
        last, unlogged = self._logged.get(key, (-math.inf, 0))
        if now - last < REFUSAL_LOG_SECONDS:
            self._logged[key] = (last, unlogged + 1)
            return
        if len(self._logged) > 10_000:  # methods named by callers: bounded
            self._logged.clear()
        self._logged[key] = (now, 0)
        more = f" (and {unlogged} more in the last {now - last:.0f} s)" if unlogged else ""
        if token is None:
            log.info("refused %s: %s%s", method, UNAUTHENTICATED_MESSAGE, more)
        else:
            log.warning("refused %s to token %r (role %s)%s", method, token.name, token.role, more)

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        method = handler_call_details.method
        token, refused = authorize(self.tokens, method, handler_call_details.invocation_metadata)
        if refused is None:
            if token is not None:
                metrics.AUTH_CALLS.labels(token.name, "ok").inc()
            return await continuation(handler_call_details)
        handler = await continuation(handler_call_details)
        if handler is None:  # an unknown method: UNIMPLEMENTED says nothing a token should guard
            return None
        if refused == grpc.StatusCode.UNAUTHENTICATED:
            metrics.AUTH_CALLS.labels("", "unauthenticated").inc()
            self._log_refusal(method, None, "unauthenticated")
            return _refusal(handler, refused, UNAUTHENTICATED_MESSAGE)
        assert token is not None
        metrics.AUTH_CALLS.labels(token.name, "permission_denied").inc()
        self._log_refusal(method, token, "permission_denied")
        return _refusal(handler, refused, PERMISSION_DENIED_MESSAGE)
