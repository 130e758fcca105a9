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

import ctypes
import os
import socket
import time
from typing import TYPE_CHECKING, Any, NoReturn

from sandboxd.agent.protocol import ProtocolError, recv_frame, send_frame
from sandboxd.agent.runner import ResidentWorker, RunSpec

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
        self.jobs_done = 0
        self.worker = ResidentWorker(controller.runner, RESULT_FRAME_BYTES)

    async def start(self) -> None:
        controller = self.controller
        self.uid = controller.uids.take()
        try:
            workdir = controller.make_workdir(self.uid)
            rlimits = controller.rlimits({"timeout": SERVER_CPU_SECONDS, "memory": self.memory}, address_space=True)
            await self.worker.start(RunSpec(mode="math_server", uid=self.uid, cwd=workdir, timeout=0, output_limit=0,
                                            rlimits=rlimits, env=controller.env(workdir)))
        except BaseException:
            self.close()
            raise

    @property
    def usable(self) -> bool:
        return self.worker.alive and self.jobs_done < RECYCLE_AFTER_JOBS

    async def verify(self, job: dict[str, Any], timeout: float) -> tuple[str, dict[str, Any] | None, str]:
        """(outcome, verdict, message); outcome is ok, timeout, memory, died or error.

        Anything but ok leaves the server closed.
        """
        self.jobs_done += 1
        request = {"completion": job["completion"], "ground_truth": job["ground_truth"],
                   "extraction": job.get("extraction", "auto"), "tolerance": job.get("tolerance", 1e-6)}
        reply = await self.worker.request(request, timeout=timeout)
        if reply is not None and isinstance(reply.get("result"), dict):
            return "ok", reply["result"], ""
        busy = reply is None and self.worker.alive
        detail, killed = self.worker.describe_exit()
        self.close()
        if busy:
            return "timeout", None, f"killed after {timeout:g} s wall clock"
        if reply is not None and reply.get("memory"):
            return "memory", None, "the verifier ran out of memory on this answer"
        if reply is not None:
            return "error", None, str(reply.get("error", "the math worker gave no verdict"))
        if killed:
            return "memory", None, "killed by the out-of-memory killer"
        return "died", None, f"the math worker {detail} on this answer"

    def close(self) -> None:
        """Kill the server and give its uid back. Idempotent."""
        self.worker.close()
        if self.uid:
            # Kills whatever else runs under the uid, then removes its files.
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
