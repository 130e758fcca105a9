"""Sessions for multi-turn tool use: a slot in a warm sandbox, held by one rollout.

The manager speaks in sessions and slots. Open takes a slot from the
sessions pool (a sandbox already warm; the pool grows ahead of the
trainer's session hint, so no episode waits on a cold start) and asks that
sandbox's agent for a session; RunCell forwards one cell; Close, the idle
timeout, the maximum lifetime, the maximum cell count, the interpreter's
death and the sandbox's loss all end a session the same way: the agent
forgets it, the slot goes back, and the id answers NOT_FOUND with the reason
from then on. Nothing here talks to Docker.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import hashlib
import logging
import math
import secrets
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from sandboxd_client._proto.sandboxd.v1 import sandboxd_pb2 as pb

from sandboxd import metrics
from sandboxd.agent.messages import FileItem, JobLimits, SessionLimits
from sandboxd.agent.protocol import DEADLINE_STRETCH
from sandboxd.config import Config
from sandboxd.errors import (
    InvalidRequest,
    Overloaded,
    SandboxdError,
    SandboxFull,
    SandboxLost,
    SessionBusy,
    SessionNotFound,
    Unsupported,
)
from sandboxd.jobs import LIMITS, MODEL_STATUSES, check_files, resolve_limits
from sandboxd.pool import Pool
from sandboxd.sandbox import Sandbox

log = logging.getLogger("sandboxd.sessions")
LANGUAGES = ("python", "bash")
MAX_SESSION_FILES_BYTES = 16 << 20
MAX_CELL_CODE_BYTES = 1 << 20
# Ended sessions whose reason is remembered for NOT_FOUND messages.
REMEMBERED_ENDINGS = 4096
EXPIRY_TICK_SECONDS = 0.5
# How often each sandbox is asked which of its idle Python sessions ended on their own (agent op
# sessions_ended): one small request per such sandbox, and List is at most this late.
DEATH_CHECK_SECONDS = 2.0
AGENT_SLACK_SECONDS = 10.0
OPEN_ATTEMPTS = 3
# OpenSessionRequest.request_id: at most this long (a uuid4's hex is 32), remembered this long after its
# session opened (a client's retries of one open end well within it: the Python client's default policy
# waits about 11 to 23 s in all, and at most 8 x 30 s, its cap on a retry hint), and at most
# this many at once: 16,384 keys of 128 characters hold about 7 MB, and 1,024 sessions (the default
# maximum) turned over in 600 s are 27 opens a second.
MAX_REQUEST_ID_CHARS = 128
REQUEST_ID_SECONDS = 600.0
REMEMBERED_REQUEST_IDS = 16384


@dataclass(eq=False)
class Session:
    id: str
    language: str
    sandbox: Sandbox
    handle: int  # the agent's name for it (the session's uid)
    limits: JobLimits
    idle_timeout: float
    opened_at_unix: float = field(default_factory=time.time)
    opened_at: float = field(default_factory=time.monotonic)
    last_used: float = field(default_factory=time.monotonic)
    cells_run: int = 0
    busy: bool = False
    ended: str = ""

    def expires_at(self, lifetime: float) -> float:
        """Monotonic time at which the idle timeout or the lifetime ends it, whichever is first."""
        return min(self.last_used + self.idle_timeout, self.opened_at + lifetime)

    def info(self, lifetime: float) -> pb.SessionInfo:
        expires_unix = self.opened_at_unix + (self.expires_at(lifetime) - self.opened_at)
        return pb.SessionInfo(session_id=self.id, language=self.language, opened_at_unix=self.opened_at_unix,
                              expires_at_unix=expires_unix, cells_run=self.cells_run, alive=not self.ended)


SessionGroup = list[Session]  # named here: inside SessionManager, `list` is its method


@dataclass(frozen=True, slots=True)
class _KeyOpening:
    """An open with a request_id, in flight: `done` is set when it opened or failed."""

    digest: bytes  # of the whole request: a repeat must be the same request
    done: asyncio.Event


@dataclass(frozen=True, slots=True)
class _KeyOpened:
    digest: bytes
    session: Session
    at: float  # monotonic


class SessionManager:
    def __init__(self, pool: Pool | None, config: Config) -> None:
        self.pool = pool
        self.config = config
        self.sessions: dict[str, Session] = {}
        self._endings: OrderedDict[str, str] = OrderedDict()
        self._opening = 0
        # request_id -> the open it named: in flight, or done (oldest first) for REQUEST_ID_SECONDS.
        self._keys_opening: dict[str, _KeyOpening] = {}
        self._keys_opened: OrderedDict[str, _KeyOpened] = OrderedDict()
        self._task: asyncio.Task[None] | None = None
        # Endings started from a lost sandbox, held until done (a bare task may be collected).
        self._endings_running: set[asyncio.Task[None]] = set()
        # Sandboxes (by name) asked which sessions ended, not yet answered: one question at a time each.
        self._death_checks: dict[str, asyncio.Task[None]] = {}

    @property
    def max_sessions(self) -> int:
        return self.config.sessions.per_sandbox * self.config.sessions.max_sandboxes

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._expire_loop())

    # ---- open ------------------------------------------------------------------
    def _validate(self, request: pb.OpenSessionRequest) -> tuple[str, JobLimits, float, list[FileItem]]:
        settings = self.config.sessions
        language = request.language or "python"
        if language not in LANGUAGES:
            raise InvalidRequest(f"language={language!r}: sessions speak {' and '.join(LANGUAGES)}")
        limits = resolve_limits(request.limits, self.config, "limits")
        idle = request.idle_timeout_seconds or settings.idle_timeout_seconds
        if not math.isfinite(idle) or idle <= 0:
            raise InvalidRequest("idle_timeout_seconds must be positive")
        if idle > settings.max_idle_timeout_seconds:
            raise InvalidRequest(f"idle_timeout_seconds={idle:g} exceeds the daemon's maximum "
                                 f"{settings.max_idle_timeout_seconds:g}")
        total = 0
        files: list[FileItem] = []
        check_files([item.path for item in request.files], "files", self.config.sandbox.tmpfs_inodes)
        for item in request.files:
            total += len(item.content)
            files.append({"path": item.path, "content": base64.b64encode(item.content).decode()})
        if total > MAX_SESSION_FILES_BYTES:
            raise InvalidRequest(f"files hold {total} bytes; at most {MAX_SESSION_FILES_BYTES} per session")
        # A session's files are held to its share of the sandbox's /tmp after each cell (docs/sessions.md).
        share = self.config.sandbox.tmpfs_bytes // settings.per_sandbox
        if total > share:
            raise InvalidRequest(f"files hold {total} bytes; a session's share of its sandbox's /tmp is {share} "
                                 "(sandbox.tmpfs_bytes / sessions.per_sandbox)")
        return language, limits, idle, files

    async def open(self, request: pb.OpenSessionRequest) -> Session:
        """Open a session; a repeat of a request_id gets the session its first open opened.

        A repeat that comes while the first is in flight waits for it, so
        concurrent opens with one key end with one session; if the first
        failed, the repeat opens anew. Keys are the daemon's, not a
        caller's: it knows no caller identity (any caller on its socket may
        List every session and use its id), and the peer address cannot
        scope them, since a retry after a dropped connection comes on a new
        one. A key then gives no more than the session id it answers with,
        which List shows anyway; clients make it random (uuid4), so that no
        two of them pick one key.
        """
        key = request.request_id
        if not key:
            return await self._open(request)
        if len(key) > MAX_REQUEST_ID_CHARS:
            raise InvalidRequest(f"request_id has {len(key)} characters; at most {MAX_REQUEST_ID_CHARS}")
        # The key is among the bytes hashed, and the same in a repeat: a digest that differs is another request.
        digest = hashlib.sha256(request.SerializeToString(deterministic=True)).digest()
        while True:
            self._forget_request_ids()
            earlier = self._keys_opened.get(key) or self._keys_opening.get(key)
            if earlier is None:
                break
            if earlier.digest != digest:
                raise InvalidRequest(f"request_id {key!r} was sent before with another request (language, "
                                     "limits, files or idle_timeout_seconds differ); a key names one open")
            if isinstance(earlier, _KeyOpened):
                return earlier.session
            await earlier.done.wait()  # then it opened (answered above), or failed and this one opens anew
        opening = _KeyOpening(digest, asyncio.Event())
        self._keys_opening[key] = opening
        try:
            session = await self._open(request)
            self._keys_opened[key] = _KeyOpened(digest, session, time.monotonic())
            self._forget_request_ids()
            return session
        finally:
            del self._keys_opening[key]
            opening.done.set()

    def _forget_request_ids(self) -> None:
        cutoff = time.monotonic() - REQUEST_ID_SECONDS
        opened = self._keys_opened
        while opened and (len(opened) > REMEMBERED_REQUEST_IDS or next(iter(opened.values())).at < cutoff):
            opened.popitem(last=False)

    async def _open(self, request: pb.OpenSessionRequest) -> Session:
        language, limits, idle, files = self._validate(request)
        pool = self.pool
        if pool is None:
            raise Unsupported("sessions are disabled in this daemon's configuration (sessions.enabled)")
        if len(self.sessions) + self._opening >= self.max_sessions:
            raise Overloaded(f"{len(self.sessions)} sessions are open (limit {self.max_sessions})", 5.0)
        self._opening += 1
        try:
            # Each session's share of its sandbox's /tmp between cells (agent/host/sessions.py).
            agent_limits: SessionLimits = {**limits, "lifetime": self.config.sessions.max_lifetime_seconds,
                                           "tmpfs_share": 1 / self.config.sessions.per_sandbox}
            for attempt in range(1, OPEN_ATTEMPTS + 1):
                sandbox = await self._take_slot(pool)
                opening = asyncio.ensure_future(sandbox.request(
                    {"op": "session_open", "language": language, "files": files, "limits": agent_limits},
                    timeout=AGENT_SLACK_SECONDS * 3))
                try:
                    # Shielded: a cancelled Open lets the agent finish, and what it opened is closed (below).
                    reply = await asyncio.shield(opening)
                except SandboxFull as exc:
                    # Its other sessions are fine: it only takes no new one until its space is back.
                    await pool.release(sandbox)
                    pool.mark_full(sandbox)
                    log.warning("session open: %s (attempt %d of %d)", exc, attempt, OPEN_ATTEMPTS)
                    continue
                except SandboxLost as exc:
                    await pool.release(sandbox)
                    self._sandbox_lost(sandbox)
                    log.warning("session open: %s (attempt %d of %d)", exc, attempt, OPEN_ATTEMPTS)
                    continue
                except BaseException as exc:
                    # A cancel can land in the step where the open finishes (its reply
                    # is there): it is still the caller's cancel, not our failure, and
                    # the session it opened is closed like any other cancelled open's.
                    if opening.done() and not isinstance(exc, asyncio.CancelledError):
                        # Our own failure: the sandbox takes no more sessions and is
                        # replaced once its other sessions end.
                        sandbox.retiring = True
                        await pool.release(sandbox)
                        raise
                    # Cancelled mid-open (the caller's deadline, a dropped connection):
                    # the session the agent is opening would hold its slot with nothing
                    # to close it. Retiring the sandbox for it would replace a sandbox
                    # of up to sessions.per_sandbox live sessions per cancel; instead
                    # the open finishes and its session is closed.
                    task = asyncio.ensure_future(self._close_unclaimed_open(sandbox, opening))
                    self._endings_running.add(task)
                    task.add_done_callback(self._ending_done)
                    raise
                if "session" not in reply:
                    await pool.release(sandbox)
                    raise SandboxdError(f"the sandbox's agent refused to open a session: {reply.get('error')}")
                session = Session(id=secrets.token_urlsafe(18), language=language, sandbox=sandbox,
                                  handle=int(reply["session"]), limits=limits, idle_timeout=idle)
                self.sessions[session.id] = session
                metrics.SESSIONS_OPEN.set(len(self.sessions))
                return session
            raise Overloaded("sandboxes kept failing while opening the session", 1.0)
        finally:
            self._opening -= 1

    async def _take_slot(self, pool: Pool) -> Sandbox:
        wait = self.config.sessions.open_wait_seconds
        try:
            async with asyncio.timeout(wait):
                return await pool.acquire()
        except TimeoutError:
            raise Overloaded(f"no session slot became free within {wait:g} s (the pool holds "
                             f"{self.config.sessions.max_sandboxes} x {pool.capacity})", 5.0) from None

    # ---- cells -------------------------------------------------------------------
    def get(self, session_id: str) -> Session:
        session = self.sessions.get(session_id)
        if session is None:
            why = self._endings.get(session_id)
            if why:
                raise SessionNotFound(f"session {session_id} ended: {why}")
            raise SessionNotFound(f"no session {session_id!r}")
        return session

    async def run_cell(self, request: pb.RunCellRequest) -> pb.CellResult:
        session = self.get(request.session_id)
        if len(request.code.encode()) > MAX_CELL_CODE_BYTES:
            raise InvalidRequest(f"code exceeds {MAX_CELL_CODE_BYTES} bytes")
        timeout = request.timeout_seconds or session.limits["timeout"]
        if not math.isfinite(timeout) or timeout <= 0:
            raise InvalidRequest("timeout_seconds must be positive")
        if timeout > self.config.limits.max_timeout_seconds:
            raise InvalidRequest(f"timeout_seconds={timeout:g} exceeds the daemon's maximum "
                                 f"{self.config.limits.max_timeout_seconds:g}")
        if session.busy:
            raise SessionBusy(f"a cell is already running in session {session.id}; cells run one at a time")
        session.busy = True
        session.last_used = time.monotonic()
        try:
            reply = await session.sandbox.request(
                {"op": "session_cell", "session": session.handle, "code": request.code, "timeout": timeout,
                 "output": session.limits["output"], "final": request.final},
                timeout=timeout * DEADLINE_STRETCH + AGENT_SLACK_SECONDS)  # a command cell's deadline moves
        except SandboxFull as exc:
            # "full" is no lost sandbox: the sandbox and its other sessions live on. The agent answers a cell
            # the others crowd out itself (uncharged, its session lives); one that says "full" instead has
            # ended the session, as it does for any cell that raised.
            if self.pool is not None:
                self.pool.mark_full(session.sandbox)  # no new session there until its room is back
            await self._end(session, f"its cell found the sandbox full: {exc}", "died", tell_agent=False)
            metrics.SESSION_CELLS.labels(session.language, "internal").inc()
            return pb.CellResult(status=pb.STATUS_INTERNAL, session_alive=False, final=request.final,
                                 message=f"{exc}; the session was closed")
        except SandboxLost:
            self._sandbox_lost(session.sandbox)
            metrics.SESSION_CELLS.labels(session.language, "sandbox_lost").inc()
            return pb.CellResult(status=pb.STATUS_SANDBOX_LOST, session_alive=False, final=request.final,
                                 message="the session's sandbox was lost; the session is closed")
        finally:
            session.busy = False
            session.last_used = time.monotonic()
        # An agent that answers without a result (an error: a reply too large to send, a failure of its
        # own) may still hold the session, its interpreter and whatever it started: it is told to end
        # it. Left alone, those outlive the session, its uid is never given back, and a cell can
        # do that on purpose (16 MiB of control characters, which JSON sends as 96 MiB).
        agent_holds_it = "result" not in reply
        result = reply.get("result") or {}
        status = str(result.get("status", "internal"))
        alive = bool(result.get("alive", False))
        message = str(result.get("message", "") or reply.get("error", ""))
        if status == "gone":
            status, alive = "internal", False
        if status == "busy":
            raise SessionBusy(message)  # the agent ran nothing: not a cell of the session's max_cells
        session.cells_run += 1
        if request.final:
            # The agent ended it with the cell (agent/sessions.py), whatever the cell's outcome.
            alive = False
            await self._end(session, "closed by its final cell", "closed", tell_agent=agent_holds_it)
        elif not alive:
            await self._end(session, f"the session died: {message}", "died", tell_agent=agent_holds_it)
        elif session.cells_run >= self.config.sessions.max_cells:
            alive = False
            message = (message + "; " if message else "") + \
                f"the session reached its {self.config.sessions.max_cells} cells and is closed"
            await self._end(session, f"reached {self.config.sessions.max_cells} cells", "max_cells")
        elif session.ended:
            alive = False  # expired while the cell ran
        metrics.SESSION_CELLS.labels(session.language, status).inc()
        return pb.CellResult(
            status=MODEL_STATUSES.get(status, pb.STATUS_INTERNAL),
            limit_hit=LIMITS.get(str(result.get("limit", "")), pb.LIMIT_NONE),
            stdout=str(result.get("stdout", "")),
            stderr=str(result.get("stderr", "")),
            value=str(result.get("value", "")),
            files_changed=[str(path) for path in result.get("files_changed", [])],
            time_seconds=float(result.get("time_seconds", 0.0)),
            session_alive=alive,
            message=message,
            final=request.final,
        )

    # ---- ending ------------------------------------------------------------------
    async def close(self, session_id: str) -> None:
        """End a session; closing one that already ended is not an error."""
        session = self.sessions.get(session_id)
        if session is None:
            if session_id in self._endings:
                return
            raise SessionNotFound(f"no session {session_id!r}")
        await self._end(session, "closed by the client", "closed")

    def list(self) -> list[pb.SessionInfo]:
        lifetime = self.config.sessions.max_lifetime_seconds
        return [session.info(lifetime) for session in self.sessions.values()]

    async def _end(self, session: Session, why: str, reason: str, *, tell_agent: bool = True) -> None:
        if session.ended:
            return
        session.ended = why
        self.sessions.pop(session.id, None)
        self._remember(session.id, why)
        metrics.SESSIONS_OPEN.set(len(self.sessions))
        metrics.SESSIONS_ENDED.labels(reason).inc()
        try:
            if tell_agent and not session.sandbox.damaged:
                await session.sandbox.request({"op": "session_close", "session": session.handle},
                                              timeout=AGENT_SLACK_SECONDS)
        except SandboxLost as exc:
            log.warning("session %s: closing it lost its sandbox: %s", session.id, exc)
        finally:
            # Also when a Close RPC is cancelled here: the slot must come back.
            if self.pool is not None:
                await self.pool.release(session.sandbox)

    async def _close_unclaimed_open(self, sandbox: Sandbox, opening: asyncio.Future[dict[str, Any]]) -> None:
        """The end of an open whose caller is gone: close the session it opened, give its slot back."""
        pool = self.pool
        assert pool is not None
        lost = False
        try:
            reply = await opening
            if "session" in reply:
                await sandbox.request({"op": "session_close", "session": int(reply["session"])},
                                      timeout=AGENT_SLACK_SECONDS)
        except SandboxFull:
            pool.mark_full(sandbox)  # no session was opened; it takes no new one until its space is back
        except SandboxLost as exc:
            log.warning("a session open its caller cancelled lost its sandbox: %s", exc)
            lost = True
        except BaseException:
            sandbox.retiring = True  # what it left open is unknown: as before, no new session there
            raise
        finally:
            await pool.release(sandbox)
        if lost:
            self._sandbox_lost(sandbox)

    def _remember(self, session_id: str, why: str) -> None:
        self._endings[session_id] = why
        while len(self._endings) > REMEMBERED_ENDINGS:
            self._endings.popitem(last=False)

    def _sandbox_lost(self, sandbox: Sandbox) -> None:
        """Every session in a lost sandbox ends; their slots go back so the pool can replace it."""
        for session in [s for s in self.sessions.values() if s.sandbox is sandbox]:
            task = asyncio.ensure_future(self._end(session, "its sandbox was lost", "sandbox_lost",
                                                   tell_agent=False))
            self._endings_running.add(task)
            task.add_done_callback(self._ending_done)

    def _ending_done(self, task: asyncio.Task[None]) -> None:
        self._endings_running.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("ending a session failed", exc_info=task.exception())

    def _check_for_deaths(self) -> None:
        """Ask each sandbox holding idle Python sessions which of them ended on their own.

        A thread or process a session leaves running can end its interpreter
        between cells (os._exit from a timer), as can the memory watch: the
        session then stayed in List as alive and held its slot until its
        next cell or its idle timeout. Each question runs in its own task,
        so an agent slow to answer holds up no expiry; it has the slack any
        request has, past which the sandbox counts as lost, as for a cell.
        """
        idle: dict[str, SessionGroup] = {}
        for session in self.sessions.values():
            if session.language == "python" and not session.busy and not session.sandbox.damaged:
                idle.setdefault(session.sandbox.name, []).append(session)
        for name, sessions in idle.items():
            if name not in self._death_checks:
                task = asyncio.ensure_future(self._ask_which_ended(sessions[0].sandbox, sessions))
                self._death_checks[name] = task
                task.add_done_callback(functools.partial(self._death_check_done, name))

    def _death_check_done(self, sandbox_name: str, _task: asyncio.Task[None]) -> None:
        self._death_checks.pop(sandbox_name, None)

    async def _ask_which_ended(self, sandbox: Sandbox, sessions: SessionGroup) -> None:
        try:
            reply = await sandbox.request({"op": "sessions_ended", "sessions": [s.handle for s in sessions]},
                                          timeout=AGENT_SLACK_SECONDS)
        except SandboxFull:
            return  # (a SandboxLost that is not lost: the agent says it only for a job it did not run)
        except SandboxLost as exc:
            log.warning("sandbox %s: asking which sessions ended failed: %s", sandbox.name, exc)
            self._sandbox_lost(sandbox)  # as a cell's request would
            return
        except Exception:
            log.exception("sandbox %s: asking which sessions ended failed", sandbox.name)
            return
        ended = reply.get("ended")
        if not isinstance(ended, dict):
            return  # a reply without the answer: the sessions' next cells find out
        for session in sessions:
            why = ended.get(str(session.handle))
            # A cell started since the question answers for itself.
            if why and not session.busy and self.sessions.get(session.id) is session:
                await self._end(session, f"the session died: {why}", "died")

    async def _expire_loop(self) -> None:
        lifetime = self.config.sessions.max_lifetime_seconds
        ticks_per_check = max(1, round(DEATH_CHECK_SECONDS / EXPIRY_TICK_SECONDS))
        ticks = 0
        while True:
            await asyncio.sleep(EXPIRY_TICK_SECONDS)
            ticks += 1
            if ticks % ticks_per_check == 0:
                self._check_for_deaths()
            now = time.monotonic()
            for session in list(self.sessions.values()):
                if session.busy:
                    continue
                try:
                    if now - session.opened_at >= lifetime:
                        await self._end(session, f"reached its maximum lifetime of {lifetime:g} s", "lifetime")
                    elif now - session.last_used >= session.idle_timeout:
                        await self._end(session, f"idle for {session.idle_timeout:g} s", "idle")
                except Exception:
                    log.exception("session %s: expiry failed", session.id)

    async def close_all(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for task in list(self._death_checks.values()):
            task.cancel()
        await asyncio.gather(*self._death_checks.values(), return_exceptions=True)
        await asyncio.gather(*(self._end(s, "the daemon shut down", "shutdown", tell_agent=False)
                               for s in list(self.sessions.values())), return_exceptions=True)
