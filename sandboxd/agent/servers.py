"""A long-lived worker under a uid of its own (a math server, a judge): its request loop and the controller's side.

Such a worker is forked once, answers request after request, and is closed
(SIGKILL to every process of its uid, its files removed, the uid given
back) when a request is not answered in time, when it fails, when one
request left it holding much more memory than it started with, or after
`recycle_after` requests, so that no state one request leaves lives long.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import os
import resource
import signal
import socket
from typing import TYPE_CHECKING, Any, NoReturn

from sandboxd.agent.protocol import ProtocolError, send_frame
from sandboxd.agent.worker import memory_bytes

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from sandboxd.agent.controller import Controller
    from sandboxd.agent.runner import ResidentWorker

# The CPU rlimit covers the worker's whole life, not one request.
SERVER_CPU_SECONDS = 3600
PR_SET_NAME = 15
# A server whose resident memory grew by more than this since it started is replaced after its
# answer. A hostile math answer that ends in a MemoryError, which Math-Verify's own handlers
# turn into "not equal", left its server holding about 500 MB of freed heap that the allocator
# keeps (585 MB, measured under the default 512 MiB limit) for up to 500 more jobs. A few such
# servers (one per CPU, plus those started when all are busy) would fill a 2 GiB sandbox, and
# the OOM killer would then take a server in the middle of another job. Ordinary math jobs
# grow a server by about 2 MB in 300.
RECYCLE_GROWTH_BYTES = 64 << 20


@contextlib.contextmanager
def _memory_budget(extra: int) -> Iterator[None]:
    """A soft RLIMIT_AS of `extra` bytes over what this process maps now, for the block (0: none).

    Soft, so that it can be raised again after: an unprivileged process may
    raise its soft limit up to the hard one, never the hard one it lowered.
    Never above a limit already set (a math server's address space, which is
    both soft and hard).
    """
    if not extra:
        yield
        return
    before = resource.getrlimit(resource.RLIMIT_AS)
    soft = memory_bytes()[0] + extra
    if before[0] != resource.RLIM_INFINITY:
        soft = min(soft, before[0])
    resource.setrlimit(resource.RLIMIT_AS, (soft, before[1]))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, before)


def serve_requests(name: bytes, receive: Callable[[], tuple[dict[str, Any], list[int]]],
                   handle: Callable[[dict[str, Any], list[int]], dict[str, Any]],
                   results: socket.socket, memory_per_request: int = 0) -> NoReturn:
    """Worker side: one answer on `results` per request `receive` returns, until the channel closes.

    What `handle` raises is answered as an error (a MemoryError flagged as
    such), after which the controller replaces this server. So is an answer
    after which this process holds RECYCLE_GROWTH_BYTES more than when it
    began: flagged ``worn``, answered, then replaced.

    With `memory_per_request`, each `handle` call may map that many bytes
    more than the server maps when the call starts; past it, allocations
    fail with MemoryError (which `handle` may answer itself) instead of
    growing the server into the memory that the sandbox's other jobs share.
    The limit is lifted again for the answer and between requests. A
    request's ``memory_budget`` raises it for that request (a judge's job
    whose memory limit admits more of the dataset's own data).
    """
    # Named, so that a look at /proc tells the server from a job's leftovers.
    ctypes.CDLL(None).prctl(PR_SET_NAME, name, 0, 0, 0)
    _, started_with = memory_bytes()
    while True:
        try:
            request, fds = receive()
        except (EOFError, OSError, ProtocolError):
            os._exit(0)
        reply: dict[str, Any]
        try:
            budget = memory_per_request and max(memory_per_request, int(request.get("memory_budget") or 0))
            with _memory_budget(budget):
                reply = handle(request, fds)
        except MemoryError:
            reply = {"error": "MemoryError", "memory": True}
        except BaseException as exc:  # our own code's failure: reported, then this server is replaced
            reply = {"error": f"{type(exc).__name__}: {exc}"[:2000]}
        if memory_bytes()[1] - started_with > RECYCLE_GROWTH_BYTES:
            reply["worn"] = True
        # What this process has used of SERVER_CPU_SECONDS, so that the controller hands it no request it may
        # not have the CPU left to finish (one times(2) call).
        used = os.times()
        reply["cpu_seconds"] = used.user + used.system
        try:
            send_frame(results, reply)
        except OSError:
            os._exit(0)


class ResidentServer:
    def __init__(self, controller: Controller, mode: str, *, recycle_after: int, max_reply_bytes: int,
                 memory: int = 0) -> None:
        self.controller = controller
        self.mode = mode
        self.recycle_after = recycle_after
        self.memory = memory  # its address space limit on top of the warm interpreter's; 0: none
        self.uid = 0
        self.jobs_done = 0
        # Set when the server said it holds far more memory than it started with (see serve_requests).
        self.worn = False
        # The CPU it said it had used with its last answer (see has_cpu_for).
        self.cpu_seconds = 0.0
        # Imported here: the runner needs asyncio, which the server's own
        # process (forked from a zygote that holds no asyncio) does not.
        from sandboxd.agent.runner import ResidentWorker
        self.worker: ResidentWorker = ResidentWorker(controller.runner, max_reply_bytes)

    async def start(self) -> None:
        from sandboxd.agent.runner import RunSpec
        controller = self.controller
        self.uid = controller.uids.take()
        try:
            workdir = await controller.make_workdir(self.uid)
            rlimits = controller.rlimits({"timeout": SERVER_CPU_SECONDS, "memory": self.memory}, address_space=True)
            await self.worker.start(RunSpec(mode=self.mode, uid=self.uid, cwd=workdir, timeout=0, output_limit=0,
                                            rlimits=rlimits, env=controller.env(workdir)))
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

    async def ask(self, request: dict[str, Any], timeout: float,
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
            self.controller.release_later(self.uid)
            self.uid = 0
