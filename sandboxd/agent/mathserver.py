"""Long-lived math workers: the verifier stays warm between jobs instead of a fork per job.

A math job runs our own code (the verifier) on untrusted strings; no model
code runs. Forking a fresh worker per job from the sympy-sized zygote cost
most of a math job's CPU (copy-on-write faults and a garbage collector
walking the inherited heap), so the controller keeps a few math servers: a
worker forked once, under a uid of its own, that verifies job after job.

What a hostile answer can still do is what it could do before: make the
parser slow or hungry. A server past its job's deadline is killed (SIGKILL
to every process of its uid, as for any run) and replaced; one that dies,
answers with an error, or has verified RECYCLE_AFTER_JOBS answers is
replaced too, so no state that one answer leaves in sympy's caches lives
long. Jobs see the same limits as before: the deadline per job, the
address space per server (servers are kept per memory limit).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import socket
import time
from typing import TYPE_CHECKING, Any, NoReturn

from sandboxd.agent.protocol import ProtocolError, encode_frame, read_frame, recv_frame, send_frame
from sandboxd.agent.runner import RunSpec

if TYPE_CHECKING:
    from sandboxd.agent.controller import Controller

RECYCLE_AFTER_JOBS = 500
# Idle servers kept per memory limit; more are started while jobs overlap.
IDLE_SERVERS = 4
# The server's CPU rlimit covers its whole life, not one job.
SERVER_CPU_SECONDS = 3600
RESULT_FRAME_BYTES = 1 << 20
PR_SET_NAME = 15
SERVER_NAME = b"sandboxd-math"


def serve(channel: socket.socket, results: socket.socket) -> NoReturn:
    """Worker side: one verdict per request frame until the channel closes."""
    from sandboxd.verifiers import math as math_verifier

    # Named, so that a look at /proc tells the verifier from a job's leftovers.
    ctypes.CDLL(None).prctl(PR_SET_NAME, SERVER_NAME, 0, 0, 0)
    while True:
        try:
            job = recv_frame(channel)
        except (EOFError, OSError, ProtocolError):
            os._exit(0)
        try:
            verdict = math_verifier.verify(job["completion"], job["ground_truth"],
                                           extraction=job.get("extraction", "auto"),
                                           float_tolerance=job.get("tolerance", 1e-6))
            reply: dict[str, Any] = {"result": verdict}
        except MemoryError:
            reply = {"error": "MemoryError", "memory": True}
        except BaseException as exc:  # the verifier's own failure: reported, then this server is replaced
            reply = {"error": f"{type(exc).__name__}: {exc}"[:2000]}
        try:
            send_frame(results, reply)
        except OSError:
            os._exit(0)


class MathServer:
    """Controller side of one math server."""

    def __init__(self, controller: Controller, memory: int) -> None:
        self.controller = controller
        self.memory = memory
        self.uid = 0
        self.pid = 0
        self.jobs_done = 0
        self._channel: socket.socket | None = None
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._exited: asyncio.Future[dict[str, Any]] | None = None

    async def start(self) -> None:
        controller = self.controller
        self.uid = controller.uids.take()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        stdin_fd = os.memfd_create("stdin", os.MFD_CLOEXEC)
        devnull = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
        try:
            workdir = controller.make_workdir(self.uid)
            rlimits = controller.rlimits({"timeout": SERVER_CPU_SECONDS, "memory": self.memory}, address_space=True)
            spec = RunSpec(mode="math_server", uid=self.uid, cwd=workdir, timeout=0, output_limit=0,
                           rlimits=rlimits, env=controller.env(workdir))
            self.pid, self._channel, self._exited = await controller.runner.launch(
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
    def usable(self) -> bool:
        return (self._channel is not None and self._exited is not None and not self._exited.done()
                and self.jobs_done < RECYCLE_AFTER_JOBS)

    async def verify(self, job: dict[str, Any], timeout: float) -> tuple[str, dict[str, Any] | None, str]:
        """(outcome, verdict, message); outcome is ok, timeout, memory, died or error.

        Anything but ok leaves the server closed.
        """
        assert self._channel is not None and self._reader is not None and self._exited is not None
        self.jobs_done += 1
        request = {"completion": job["completion"], "ground_truth": job["ground_truth"],
                   "extraction": job.get("extraction", "auto"), "tolerance": job.get("tolerance", 1e-6)}
        reply_task = asyncio.ensure_future(read_frame(self._reader, max_bytes=RESULT_FRAME_BYTES))
        try:
            with contextlib.suppress(OSError):  # a dead server: the exit future tells
                await asyncio.get_running_loop().sock_sendall(self._channel, encode_frame(request))
            done, _ = await asyncio.wait({reply_task, self._exited}, timeout=timeout,
                                         return_when=asyncio.FIRST_COMPLETED)
            if not done:
                self.close()
                return "timeout", None, f"killed after {timeout:g} s wall clock"
            reply = None
            if reply_task in done:
                with contextlib.suppress(EOFError, ProtocolError, OSError, ConnectionError):
                    reply = reply_task.result()
            if isinstance(reply, dict) and isinstance(reply.get("result"), dict):
                return "ok", reply["result"], ""
            if isinstance(reply, dict) and reply.get("memory"):
                self.close()
                return "memory", None, "the verifier ran out of memory on this answer"
            if isinstance(reply, dict) and "error" in reply:
                self.close()
                return "error", None, str(reply["error"])
            if not self._exited.done():
                await asyncio.wait([self._exited], timeout=1.0)
            status = self._exited.result()["status"] if self._exited.done() and not self._exited.exception() else 0
            self.close()
            if os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL:
                return "memory", None, "killed by the out-of-memory killer"
            return "died", None, "the math worker died on this answer"
        finally:
            if not reply_task.done():
                reply_task.cancel()

    def close(self) -> None:
        """Kill the server and give its uid back. Idempotent."""
        if self._writer is not None:
            self._writer.transport.abort()
            self._writer = None
        if self._channel is not None:
            self._channel.close()
            self._channel = None
        if self.pid:
            self.controller.runner.zygote.forget(self.pid)
            self.pid = 0
        if self.uid:
            # Kills every process of the uid, then removes its files.
            self.controller.release(self.uid)
            self.uid = 0


class MathServers:
    """Idle servers by memory limit; a job borrows one and gives it back if it is still good."""

    def __init__(self, controller: Controller) -> None:
        self.controller = controller
        self._idle: dict[int, list[MathServer]] = {}

    async def verify(self, job: dict[str, Any]) -> tuple[str, dict[str, Any] | None, str, float]:
        limits = job["limits"]
        memory = int(limits.get("memory") or 0)
        idle = self._idle.setdefault(memory, [])
        server = None
        while idle and server is None:
            candidate = idle.pop()
            if candidate.usable:
                server = candidate
            else:
                candidate.close()
        if server is None:
            server = MathServer(self.controller, memory)
            await server.start()
        started = time.monotonic()
        outcome, verdict, message = await server.verify(job, float(limits["timeout"]))
        seconds = time.monotonic() - started
        if outcome == "ok" and server.usable and len(idle) < IDLE_SERVERS:
            idle.append(server)
        else:
            server.close()
        return outcome, verdict, message, seconds

    def close(self) -> None:
        for servers in self._idle.values():
            for server in servers:
                server.close()
        self._idle.clear()
