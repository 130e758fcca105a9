"""One sandbox as the pool sees it: a container with an agent behind a socket.

The pool never handles container ids or HTTP; it holds Sandbox objects and
asks them to run jobs. A sandbox that fails to answer is marked damaged and
the pool replaces it; the job goes back to the scheduler as SandboxLost.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from sandboxd.agent.messages import Job, JobResult, Request
from sandboxd.agent.protocol import ProtocolError, encode_frame, read_frame
from sandboxd.errors import SandboxFull, SandboxLost

_serial = itertools.count(1)


class SandboxGone(SandboxLost):
    """The sandbox was dead before the request reached its agent: nothing of the job ran there.

    Its socket refused the connection (or is gone), or the kept-open
    connection had been closed by the agent while idle. The scheduler does
    not count such a sandbox as one of the job's attempts: after a mass loss
    (the engine restarted, every container removed at once) a job would
    otherwise spend all of them in milliseconds on sandboxes that died idle.
    """


class Withdrawal:
    """Lets a job's caller that gave up withdraw it from the agent while it runs.

    `withdraw()` closes the daemon's side of the job's connection (a
    half-close: the reply can still come back). The agent reads that end of
    file, kills the job's runs and answers at once (agent/host/controller.py,
    `answer_job`), so the sandbox's slot comes back within milliseconds
    rather than at the job's deadline.
    """

    def __init__(self) -> None:
        self.withdrawn = False
        self._writer: asyncio.StreamWriter | None = None

    def withdraw(self) -> None:
        self.withdrawn = True
        if self._writer is not None:
            self._half_close(self._writer)

    def _answered(self) -> bool:
        """The reply came: a withdrawal from now on must not reach the connection. Whether it was withdrawn."""
        self._writer = None
        return self.withdrawn

    def _attach(self, writer: asyncio.StreamWriter) -> None:
        self._writer = writer
        if self.withdrawn:
            self._half_close(writer)

    @staticmethod
    def _half_close(writer: asyncio.StreamWriter) -> None:
        # After what is buffered: the agent reads the whole request first.
        with contextlib.suppress(OSError, RuntimeError):
            if not writer.is_closing():
                writer.write_eof()


class _Unreached(Exception):
    """Raised inside Sandbox.request when its agent was gone before the request reached it."""


@dataclass(eq=False)
class Sandbox:
    name: str
    pool: str
    container_id: str
    control_dir: str
    started_by: str  # "restore" or "cold"
    ready_seconds: float = 0.0
    # Of ready_seconds, the time spent waiting for the node's restore turn (SnapshotStore.restoring).
    restore_wait_seconds: float = 0.0
    in_flight: int = 0
    jobs_done: int = 0
    damaged: bool = False
    retiring: bool = False
    # A job found its /tmp, pids, memory or CPU taken by other runs: no job until `has_room` (Pool.mark_full).
    full: bool = False
    # How many replies said so: a `room` answer given while another came is stale.
    full_reports: int = 0
    languages: list[str] = field(default_factory=list)
    serial: int = field(default_factory=lambda: next(_serial))
    _idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = field(default_factory=list, repr=False)
    # Connections with a request in flight: abort() ends them (a frozen agent never answers).
    _active: set[asyncio.StreamWriter] = field(default_factory=set, repr=False)

    @property
    def socket_path(self) -> str:
        return f"{self.control_dir}/agent.sock"

    async def request(self, message: Request, timeout: float,
                      withdrawal: Withdrawal | None = None) -> dict[str, Any]:
        """One request/response with the agent; any failure marks the sandbox damaged.

        Connections are kept open between requests (one per request in
        flight; the agent serves each in order): a connect and accept on both
        sides cost more than a trivial job's frames. A request that was
        withdrawn (`withdrawal`) still waits for its reply, and its
        connection, half-closed, is not kept.
        """
        # Before any connection: a message that cannot be a frame (too large) is
        # the request's fault, raised as is; taken for a lost sandbox, it
        # recycled a healthy one per attempt.
        frame = encode_frame(message)
        connection = None
        try:
            async with asyncio.timeout(timeout):
                connection = self._idle.pop() if self._idle else await self._connect()
                reader, writer = connection
                if reader.at_eof() or reader.exception() is not None:
                    # The agent closes a connection only at our end of file: it died while this one was idle.
                    raise _Unreached("the agent closed its idle connection")
                self._active.add(writer)
                writer.write(frame)
                if withdrawal is not None:
                    withdrawal._attach(writer)
                await writer.drain()
                reply = await read_frame(reader)
        except BaseException as exc:
            # Cancelled mid-request too: the reply may still arrive on this connection.
            if connection is not None:
                connection[1].close()
            if isinstance(exc, _Unreached):
                self.damaged = True
                raise SandboxGone(f"sandbox {self.name}: {exc}") from None
            if not isinstance(exc, OSError | EOFError | ProtocolError | TimeoutError):
                raise
            self.damaged = True
            raise SandboxLost(f"sandbox {self.name}: {type(exc).__name__}: {exc}") from None
        finally:
            if connection is not None:
                self._active.discard(connection[1])
        if withdrawal is not None and withdrawal._answered():
            connection[1].close()  # half-closed
        else:
            self._idle.append(connection)
        if reply.get("damaged"):
            self.damaged = True
            raise SandboxLost(f"sandbox {self.name}: {reply.get('error')}")
        if reply.get("full"):
            # The agent answered (it is fine) without running the job: the job goes elsewhere.
            self.full = True
            self.full_reports += 1
            raise SandboxFull(f"sandbox {self.name}: {reply.get('error')}")
        return reply

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        try:
            return await asyncio.open_unix_connection(self.socket_path)
        except (FileNotFoundError, ConnectionRefusedError) as exc:
            # Nothing listens (the container is gone) or the socket's folder is: no byte of ours got there.
            raise _Unreached(f"{type(exc).__name__}: {exc}") from None

    def abort(self) -> None:
        """The container is gone or frozen (the engine says so): end every connection to it now.

        A request in flight then fails at once (SandboxLost) instead of at
        its timeout, a job's budget plus slack later: a paused container's
        agent never answers, and its jobs sat there for the whole timeout.
        """
        self.damaged = True
        for writer in [*self._active, *(writer for _reader, writer in self._idle)]:
            writer.transport.abort()  # not close(): that would wait to flush to an agent that reads nothing
        self._idle.clear()

    async def has_room(self) -> bool:
        """Whether the sandbox's /tmp has space for jobs again; SandboxLost as `request`."""
        return bool((await self.request({"op": "room"}, timeout=5.0)).get("room"))

    async def close_connections(self, *, wait: bool = False) -> None:
        """Close the kept-open connections; with `wait`, until the agent has closed its ends too.

        The agent closes a connection at end of file, so an empty read back
        proves its socket is gone (a checkpoint must find none).
        """
        while self._idle:
            reader, writer = self._idle.pop()
            if wait:
                with contextlib.suppress(OSError, TimeoutError):
                    writer.write_eof()
                    async with asyncio.timeout(5.0):
                        while await reader.read(65536):
                            pass
            writer.close()

    async def wait_ready(self, timeout: float, alive: Callable[[], Awaitable[bool]], uid_slot: int,
                         memory_bytes: int = 0, pids: int = 0, cpus: float = 0.0) -> dict[str, Any]:
        """Poll until the agent answers `hello` (it reseeds on it after a restore).

        `alive` tells whether the container still runs, so that an agent that
        crashed at start fails now rather than at the timeout. `uid_slot`
        places the sandbox's block of job uids (agent/protocol.py).
        `memory_bytes`, `pids` and `cpus` are the container's limits, which
        a restored agent cannot read from its cgroup (agent/host/usage.py).
        """
        deadline = time.monotonic() + timeout
        polls = 0
        while True:
            try:
                reply = await self.request({"op": "hello", "sandbox_id": self.name, "uid_slot": uid_slot,
                                            "memory_bytes": memory_bytes, "pids": pids, "cpus": cpus},
                                           timeout=5.0)
                if "error" in reply:
                    raise RuntimeError(f"sandbox {self.name} refused hello: {reply['error']}")
                return reply
            except SandboxLost:
                polls += 1
                if time.monotonic() > deadline or (polls % 20 == 0 and not await alive()):
                    raise
                self.damaged = False
                await asyncio.sleep(0.05)

    async def run(self, job: Job, timeout: float, withdrawal: Withdrawal | None = None) -> JobResult:
        reply = await self.request({"op": "run", "job": job}, timeout=timeout, withdrawal=withdrawal)
        if "result" not in reply:
            # The agent refused the job as malformed: a sandboxd bug, not the model's.
            return {"status": "internal", "message": reply.get("error", "agent gave no result")}
        return reply["result"]
