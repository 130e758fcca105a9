"""A long-lived worker under a uid of its own (a math server, a judge): the controller's side.

Such a worker is forked once, answers request after request, and is closed
(SIGKILL to every process of its uid, its files removed, the uid given
back) when a request is not answered in time, when it fails, when one
request left it holding much more memory than it started with, or after
`recycle_after` requests, so that no state one request leaves lives long.
Its request loop is forked.serving.serve_requests.
"""

from __future__ import annotations

import math
import signal
from typing import TYPE_CHECKING, Any

from sandboxd.agent.host.runner import ResidentWorker, RunSpec

if TYPE_CHECKING:
    from sandboxd.agent.host.jobhost import JobHost

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
            self.host.release_later(self.uid)
            self.uid = 0
