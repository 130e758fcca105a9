"""A long-lived worker (a session's interpreter, a math server, a judge): the controller's side.

Such a worker is forked once, answers request after request, and is closed
(SIGKILL to every process of its uid, its files removed, the uid given
back) when a request is not answered in time, when it fails, when one
request left it holding much more memory than it started with, or after
`recycle_after` requests, so that no state one request leaves lives long.
Its request loop is forked.serving.serve_requests.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import signal
import socket
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from sandboxd.agent.host.runner import DRAIN_SECONDS, Runner, RunSpec
from sandboxd.agent.protocol import HEADER, ProtocolError, encode_frame, read_frame

if TYPE_CHECKING:
    from sandboxd.agent.host.jobhost import JobHost


class ResidentWorker:
    """A worker forked once that answers many requests: a session's interpreter, a math server.

    Requests go down its control channel, with descriptors riding on the frame
    header when given; answers come back as frames on a results socket, its
    fourth descriptor. Its exit, reported by the zygote, is the one thing the
    code it runs cannot fake, so every wait is on the answer or the exit,
    whichever comes first.
    """

    def __init__(self, runner: Runner, max_reply_bytes: int) -> None:
        self.runner = runner
        self.pid = 0
        self.exited: asyncio.Future[dict[str, Any]] | None = None
        self._max_reply_bytes = max_reply_bytes
        # Why the last request() returned None (see there).
        self.no_answer = ""
        self._channel: socket.socket | None = None
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def start(self, spec: RunSpec) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        stdin_fd = os.memfd_create("stdin", os.MFD_CLOEXEC)
        devnull = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
        try:
            self.pid, self._channel, self.exited = await self.runner.launch(
                spec, [stdin_fd, devnull, devnull, theirs.fileno()])
            self._reader, self._writer = await asyncio.open_unix_connection(sock=ours)
        except BaseException:
            ours.close()
            self.close()
            raise
        finally:
            os.close(stdin_fd)
            os.close(devnull)
            theirs.close()

    @property
    def alive(self) -> bool:
        return self._channel is not None and self.exited is not None and not self.exited.done()

    async def request(self, message: Mapping[str, Any], *, timeout: float, fds: tuple[int, ...] = (),
                      on_timeout: Callable[[], None] | None = None, grace: float = 0.0) -> dict[str, Any] | None:
        """Send `message` and wait up to `timeout` for the answer.

        `fds` are handed over and closed here once sent. At the timeout
        `on_timeout()` is called and the answer awaited `grace` seconds more.
        None when no answer came; `no_answer` then says why: "timeout" (still
        busy at the deadline), "malformed" (the results socket closed, or
        carried something other than a frame of a JSON object) or "exited"
        (the worker ended first: see `describe_exit`).
        """
        assert self._channel is not None and self._reader is not None and self.exited is not None
        self.no_answer = ""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        reply_task = asyncio.ensure_future(read_frame(self._reader, max_bytes=self._max_reply_bytes))
        try:
            try:
                frame = encode_frame(message)
                socket.send_fds(self._channel, [frame[:HEADER.size]], list(fds))
                # Within the deadline too: a stopped worker fills the socket buffer.
                await asyncio.wait_for(loop.sock_sendall(self._channel, frame[HEADER.size:]), timeout)
            except OSError:
                pass  # a dead worker: the exit future tells
            except TimeoutError:
                self.no_answer = "timeout"
                return None
            finally:
                for fd in fds:
                    os.close(fd)
            waiting = {reply_task, self.exited}
            done, _ = await asyncio.wait(waiting, timeout=max(0.0, deadline - loop.time()),
                                         return_when=asyncio.FIRST_COMPLETED)
            if not done and on_timeout is not None:
                on_timeout()
                done, _ = await asyncio.wait(waiting, timeout=grace, return_when=asyncio.FIRST_COMPLETED)
            if reply_task not in done:
                self.no_answer = "exited" if self.exited in done else "timeout"
                return None
            with contextlib.suppress(EOFError, ProtocolError, OSError, ConnectionError):
                reply = reply_task.result()
                if isinstance(reply, dict):
                    return reply
            # The results socket closed first; the exit status follows from the zygote.
            await asyncio.wait([self.exited], timeout=DRAIN_SECONDS)
            self.no_answer = "exited" if self.exited.done() else "malformed"
            return None
        finally:
            if not reply_task.done():
                reply_task.cancel()

    def _wait_status(self) -> int | None:
        exited = self.exited
        if exited is None or not exited.done() or exited.cancelled() or exited.exception() is not None:
            return None
        return int(exited.result()["status"])

    @property
    def exit_signal(self) -> int:
        """The signal that ended the worker (its own code never exits that way); 0 if none did."""
        wait_status = self._wait_status()
        return os.WTERMSIG(wait_status) if wait_status is not None and os.WIFSIGNALED(wait_status) else 0

    def describe_exit(self) -> tuple[str, bool]:
        """(how the worker ended, for a message; whether SIGKILL ended it, which only the OOM killer sends)."""
        wait_status = self._wait_status()
        if wait_status is None:
            return "did not answer", False
        if sig := self.exit_signal:
            return f"was killed by signal {signal.Signals(sig).name}", sig == signal.SIGKILL
        return f"exited with status {os.WEXITSTATUS(wait_status)}", False

    def close(self) -> None:
        """Kill the worker and drop its channels. Idempotent."""
        if self._writer is not None:
            self._writer.transport.abort()
            self._writer = None
        if self._channel is not None:
            self._channel.close()
            self._channel = None
        if self.pid:
            # Only while its exit is unreported is `pid` still this worker's:
            # once reaped, the number may be another process's: a session's
            # interpreter killed from within, then the pid counter wrapped
            # round, and the session's Close would kill the interpreter of a
            # session opened since, given that pid.
            if self.exited is None or not self.exited.done():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.pid, signal.SIGKILL)
            self.runner.zygote.forget(self.pid)
            self.pid = 0


# The CPU rlimit covers the worker's whole life, not one request.
SERVER_CPU_SECONDS = 3600


class ResidentServer:
    def __init__(self, host: JobHost, mode: str, *, recycle_after: int, max_reply_bytes: int,
                 memory: int = 0) -> None:
        self.host = host
        self.mode = mode
        self.recycle_after = recycle_after
        self.memory = memory  # its address space limit on top of the warm interpreter's; 0: none
        self.uid = 0
        self.jobs_done = 0
        # Set when the server said it holds far more memory than it started with (see serve_requests).
        self.worn = False
        # The CPU it said it had used with its last answer (see has_cpu_for).
        self.cpu_seconds = 0.0
        self.worker: ResidentWorker = ResidentWorker(host.runner, max_reply_bytes)

    async def start(self) -> None:
        host = self.host
        self.uid = host.uids.take()
        try:
            workdir = await host.make_workdir(self.uid)
            rlimits = host.rlimits({"timeout": SERVER_CPU_SECONDS, "memory": self.memory}, address_space=True)
            await self.worker.start(RunSpec(mode=self.mode, uid=self.uid, cwd=workdir, timeout=0, output_limit=0,
                                            rlimits=rlimits, env=host.env(workdir)))
        except BaseException:
            self.close()
            raise

    @property
    def usable(self) -> bool:
        return self.worker.alive and self.jobs_done < self.recycle_after and not self.worn

    def has_cpu_for(self, seconds: float) -> bool:
        """Whether a request that may run `seconds` fits in what is left of its lifetime CPU limit.

        The limit (SERVER_CPU_SECONDS) covers all of a server's requests: a
        judge of slow dataset tests, or a math server of answers that each
        run just short of their timeout, could reach it in the middle of an
        innocent job, whose answer would then be lost (STATUS_INTERNAL). A
        request runs on one thread, so its wall-clock deadline bounds its CPU;
        a server without that much left is replaced before the request
        instead. A new server has all of it (a single request may still
        outlast it: a job's total time can be as long as the limit).
        """
        return self.cpu_seconds + seconds < SERVER_CPU_SECONDS

    async def ask(self, request: Mapping[str, Any], timeout: float,
                  fds: tuple[int, ...] = ()) -> tuple[str, dict[str, Any] | None, str]:
        """(outcome, result, message) for one job's request; `fds` are handed over.

        outcome is ok, timeout (still busy at `timeout`), memory (a
        MemoryError answered, or SIGKILL, which only the OOM killer sends),
        died (another signal: what the request made our code do) or error
        (our own failure: an error answered, a malformed or oversized
        answer, an exit of its own, the CPU limit of its whole life). Anything but ok leaves the server closed.
        """
        self.jobs_done += 1
        reply = await self.worker.request(request, timeout=timeout, fds=fds)
        if reply is not None and isinstance(reply.get("result"), dict):
            self.worn = bool(reply.get("worn"))
            cpu_seconds = reply.get("cpu_seconds")
            if isinstance(cpu_seconds, (int, float)) and math.isfinite(cpu_seconds):
                self.cpu_seconds = float(cpu_seconds)
            return "ok", reply["result"], ""
        no_answer = self.worker.no_answer
        detail, killed = self.worker.describe_exit()
        exit_signal = self.worker.exit_signal
        self.close()
        if no_answer == "timeout":
            return "timeout", None, f"killed after {timeout:g} s wall clock"
        if no_answer == "malformed":
            return "error", None, f"{self.mode} gave a malformed or oversized answer"
        if reply is not None and reply.get("memory"):
            return "memory", None, "ran out of memory"
        if reply is not None:
            return "error", None, str(reply.get("error", "no result"))
        if killed:
            return "memory", None, "killed by the out-of-memory killer"
        if exit_signal == signal.SIGXCPU:
            # Its CPU rlimit covers its whole life (SERVER_CPU_SECONDS), not this request.
            return "error", None, f"{self.mode} {detail} (its CPU limit over all its requests)"
        if exit_signal:
            return "died", None, detail
        return "error", None, f"{self.mode} {detail}"

    def close(self) -> None:
        """Kill the server and give its uid back. Idempotent."""
        self.worker.close()
        if self.uid:
            # In the background: kills whatever else runs under the uid, removes its files, gives it back.
            self.host.release_later(self.uid)
            self.uid = 0
