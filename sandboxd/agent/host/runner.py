"""Running one worker to completion from the controller's side.

This module owns the mechanics every kind of job shares: asking the zygote
for a worker, handing it its job and descriptors, collecting capped output,
enforcing the wall-clock deadline, killing everything the run left behind,
and turning the exit status into a verdict. It knows nothing about tests or
answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import signal
import socket
import time
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from sandboxd.agent.host import usage
from sandboxd.agent.host.cleanup import KILL_GRACE_SECONDS, kill_uid, sigkill_uid
from sandboxd.agent.host.errors import JobWithdrawn, SandboxDamaged
from sandboxd.agent.host.usage import CpuShare, UsageWatch
from sandboxd.agent.host.zygoteclient import Zygote
from sandboxd.agent.messages import SandboxFull
from sandboxd.agent.protocol import (
    CPU_CREDIT,
    DEADLINE_STRETCH,
    HEADER,
    MAX_FRAME_BYTES,
    ProtocolError,
)

# Markers that a program died of its memory limit rather than of a bug; the
# address-space rlimit makes allocation fail instead of summoning the OOM killer.
MEMORY_MARKERS = (
    b"MemoryError",
    b"std::bad_alloc",
    b"Cannot allocate memory",
    b"out of memory",
    b"OutOfMemoryError",
    b"JavaScript heap out of memory",
)
# Output still buffered in a pipe when the run's processes are gone is read
# for at most this long.
DRAIN_SECONDS = 1.0


class JobWithdrawal:
    """A job's withdrawal by the daemon: its runs are killed, and none starts after it.

    The controller sets one per job in CURRENT_JOB; each Runner.run of the
    job registers its kill here while it runs, so that the daemon gets its
    slot back within milliseconds instead of at the job's deadline.
    """

    def __init__(self) -> None:
        self.withdrawn = False
        self._kills: set[Callable[[], None]] = set()

    def watch(self, kill: Callable[[], None]) -> None:
        """Call `kill` on withdrawal (now, if the job is withdrawn already) until `unwatch(kill)`."""
        self._kills.add(kill)
        if self.withdrawn:
            kill()

    def unwatch(self, kill: Callable[[], None]) -> None:
        self._kills.discard(kill)

    def withdraw(self) -> None:
        """Withdraw the job: every kill is tried; the first that failed (SandboxDamaged) is raised after."""
        self.withdrawn = True
        failed: BaseException | None = None
        for kill in list(self._kills):
            try:
                kill()
            except Exception as exc:
                failed = failed or exc
        if failed is not None:
            raise failed


CURRENT_JOB: ContextVar[JobWithdrawal | None] = ContextVar("sandboxd_current_job", default=None)


@dataclass
class RunSpec:
    mode: str  # python | exec | py_callee | py_judge | math_server | py_session | py_final
    uid: int
    cwd: str
    timeout: float
    output_limit: int
    rlimits: dict[str, int]
    argv: list[str] = field(default_factory=list)
    code: str = ""
    # py_callee: how the worker makes its program of ``code`` (sandboxd.verifiers.code.assemble); None: as it is.
    assembly: dict[str, str] | None = None
    # py_callee: run python.harness.IMPLICIT_IMPORTS first (function-call tests, as LeetCode's environment does).
    implicit_imports: bool = False
    # py_callee: its folder (cwd) is shared with its judge, for the files a test and a program hand each other.
    share_files: bool = False
    stdin: bytes = b""
    env: dict[str, str] = field(default_factory=dict)
    peer: socket.socket | None = None
    # A run with no RLIMIT_AS (Go, Java and Node reserve far more address
    # space than they use) is held to its memory limit by its peak resident
    # memory, from its exit report: over it, the run is a memory limit.
    peak_memory_limit: int = 0
    # The memory its processes may hold together, watched while it runs
    # (usage.UsageWatch, which counts every run's CPU); 0: not held.
    memory_limit: int = 0
    # Set by a caller that SIGKILLs the run's uid itself once it needs
    # nothing more of it (the Python harness, after its verdict): that
    # SIGKILL is not the OOM killer's, whatever the host's count says.
    ended_by_caller: bool = False
    # Past output_limit, keep running and drop the rest instead of killing
    # the run: a compiler's warnings are not a verdict (a successful compile
    # with 64 KiB of them is not a compile error).
    output_over_limit_dropped: bool = False
    # A file (a memfd) to keep the time others kept this run off the CPU in
    # (others_took, as CPU_CREDIT, after each sweep): its judge moves its
    # calls' deadlines by it (python.harness). -1: none.
    cpu_credit_fd: int = -1


@dataclass
class RunOutcome:
    wait_status: int
    stdout: bytes
    stderr: bytes
    stdout_truncated: bool
    stderr_truncated: bool
    killed_for: str  # "", "wall_time", "output" or "withdrawn"
    wall_seconds: float
    cpu_seconds: float
    max_rss_bytes: int
    # The worker's exit, when the outcome came before it (Runner.run, settle=False).
    pending_exit: asyncio.Future[dict[str, Any]] | None = None
    # The most its processes were seen holding together (0: not measured), and the most of it in the kernel.
    peak_memory_bytes: int = 0
    peak_kernel_bytes: int = 0
    # Whether the watch saw it pinning memory in the kernel (usage.WatchedRun.pinning): the OOM killer's first
    # choice, for memory no process of it maps.
    pinning: bool = False
    # Whether the watch found it below the OOM score it was given (usage.WatchedRun.lowered), and killed it.
    lowered: bool = False
    # Processes the OOM killer took on the host while it ran (usage.VMSTAT); None after a clean exit, where
    # nothing reads it, and where the kernel does not say.
    oom_kills: int | None = None
    # What it got of the sandbox's CPU, and the other runs meanwhile (usage.UsageWatch); None: not watched.
    cpu_share: CpuShare | None = None
    # How far past its timeout its deadline moved for the time others kept it off the CPU (RunDeadline).
    deadline_moved_seconds: float = 0.0

    @property
    def held_bytes(self) -> int:
        """The most memory the run was known to hold, by the watch or by its exit report."""
        return max(self.peak_memory_bytes, self.max_rss_bytes)

    @property
    def exit_code(self) -> int:
        if os.WIFSIGNALED(self.wait_status):
            return -os.WTERMSIG(self.wait_status)
        return os.WEXITSTATUS(self.wait_status)


def classify(outcome: RunOutcome, spec: RunSpec) -> tuple[str, str, str]:
    """(status, limit, message) for how a run ended, judged from outside it."""
    if outcome.killed_for == "wall_time":
        if moved := outcome.deadline_moved_seconds:
            return "timeout", "wall_time", (
                f"killed after {spec.timeout + moved:.2f} s wall clock: its {spec.timeout:g} s and the {moved:.2f} s "
                f"it waited for a CPU that other runs or the host's other load had")
        return "timeout", "wall_time", f"killed after {spec.timeout:g} s wall clock"
    if outcome.killed_for == "output":
        return "output_limit", "output", f"more than {spec.output_limit} bytes of output"
    if outcome.killed_for == "withdrawn":
        return "internal", "", "the daemon withdrew the job"
    if outcome.killed_for == "memory":
        return "memory_limit", "memory", LOWERED_MESSAGE if outcome.lowered else held_over_limit(
            outcome.peak_memory_bytes, outcome.peak_kernel_bytes, spec.memory_limit)
    if spec.peak_memory_limit and outcome.max_rss_bytes > spec.peak_memory_limit:
        return ("memory_limit", "memory",
                f"peak memory {outcome.max_rss_bytes >> 20} MiB over the limit of {spec.peak_memory_limit >> 20} MiB")
    tail = outcome.stderr[-4096:]
    if os.WIFSIGNALED(outcome.wait_status):
        sig = os.WTERMSIG(outcome.wait_status)
        if sig == signal.SIGXCPU or (sig == signal.SIGKILL and _over_cpu(outcome, spec)):
            return "timeout", "cpu_time", f"used {outcome.cpu_seconds:.2f} s of CPU"
        if sig == signal.SIGXFSZ:
            return "runtime_error", "file_size", "wrote a file larger than the limit"
        if sig == signal.SIGKILL:
            if outcome.oom_kills == 0:
                # No OOM kill on the host meanwhile (usage.VMSTAT): the run killed itself.
                return "runtime_error", "", "killed by signal SIGKILL"
            if outcome.pinning:
                return "memory_limit", "memory", (
                    f"killed by the out-of-memory killer while its processes pinned memory in the kernel: they were "
                    f"last seen holding {outcome.peak_memory_bytes >> 20} MiB together"
                    f"{_in_kernel(outcome.peak_kernel_bytes)}")
            return "memory_limit", "memory", "killed by the out-of-memory killer"
        if any(marker in tail for marker in MEMORY_MARKERS):
            return "memory_limit", "memory", "allocation failed at the memory limit"
        return "runtime_error", "", f"killed by signal {signal.Signals(sig).name}"
    code = os.WEXITSTATUS(outcome.wait_status)
    if code == 0:
        return "ok", "", ""
    if any(marker in tail for marker in MEMORY_MARKERS):
        return "memory_limit", "memory", "allocation failed at the memory limit"
    return "runtime_error", "", f"exit status {code}"


# A run the watch killed for lowering its OOM score (usage.WatchedRun.lowered).
LOWERED_MESSAGE = "killed for lowering its out-of-memory score below the one it was given"


def held_over_limit(held: int, kernel: int, limit: int) -> str:
    """A run's memory limit message: what its processes held, and how much of it they pinned in the kernel."""
    return f"its processes held {held >> 20} MiB together, over the limit of {limit >> 20} MiB{_in_kernel(kernel)}"


def _in_kernel(kernel: int) -> str:
    if kernel < 1 << 20:
        return ""
    return f" ({kernel >> 20} MiB of it in the kernel: socket buffers, pipes and other descriptors)"


def _sigkilled(wait_status: int) -> bool:
    return os.WIFSIGNALED(wait_status) and os.WTERMSIG(wait_status) == signal.SIGKILL


def _over_cpu(outcome: RunOutcome, spec: RunSpec) -> bool:
    """Whether the run used its CPU-time limit (SIGKILL at the hard one)."""
    cpu_limit = spec.rlimits.get("cpu", 0)
    return bool(cpu_limit) and outcome.cpu_seconds >= cpu_limit


def crowded_out(outcome: RunOutcome, limit: int, sandbox_bytes: int | None) -> bool:
    """Whether the OOM killer's work during the run, not the run, ended it; `limit`: what the run may hold.

    A run killed by the OOM killer, or (a compiler) whose child was, while
    it held less than its own limit and less than half of the sandbox's
    memory, is taken because the others hold the rest: it is run again
    elsewhere (SandboxFull), not charged MEMORY_LIMIT. One that held half
    the sandbox or more keeps its verdict: a program that fills a sandbox
    alone must not escape its failure score by being retried until the
    daemon gives up. Nor is one the watch saw pinning memory in the kernel:
    the OOM killer took it first for that (usage.PINNING_OOM_SCORE_ADJ).
    """
    if not outcome.oom_kills or outcome.killed_for or not sandbox_bytes or outcome.pinning:
        return False
    held = outcome.held_bytes
    return held <= limit and 2 * held < sandbox_bytes


# A run that waited for a CPU at least STARVED_WAIT_SHARE of its wall time
# while the other runs in the sandbox ran STARVED_OTHERS_RATIO times its CPU
# is starved by them (starved_out): a busy loop beside 10 others in a one-CPU
# container runs about 0.28 s and waits 2.75 s of 3 s. By the
# same sharing, a busy run beside one busy run of as many threads waits
# about half its time on one CPU, and more on a host loaded past its CPUs,
# but its neighbour runs about what it runs: not starved by it.
STARVED_WAIT_SHARE = 0.5
STARVED_OTHERS_RATIO = 3.0
# A run kept off the CPU more than 1 - 1 / DEADLINE_STRETCH of its wall time
# is starved too, whoever kept it off (the other runs, or the host's other
# load, which no count here sees): its deadline moves by the whole stretch
# (RunDeadline) and it still has less than its timeout of time to run or
# sleep. Beside a host at load 20 (two CPUs), a correct program that needs
# 0.6 s of CPU runs about 0.07 s in its 1 s and waits 0.98 s; its neighbour,
# a busy loop, as little. So on a host that leaves a sandbox less than a third of
# a CPU a busy loop is retried, and answered SANDBOX_LOST once the attempts
# are spent: no count tells it from a correct program that needed its time.
# It must also still be waiting at its deadline, for at least STARVED_WAIT_SHARE
# of its last usage.RECENT_WAIT_SECONDS: a sleeper whose start (a fork and an
# import) waits over half its 2 s beside a run of 31 busy processes under
# load, then sleeps through its deadline, is not to be retried: a CPU would
# not have saved it. A run still waiting there had its deadline moved until
# DEADLINE_STRETCH stopped it.
# Nor is a run that had more processes than this at once: their waits are summed,
# so it waits mostly behind itself, and processes shorter than a sweep escape the
# count of its CPU. Of two fork bombs in one sandbox, one can run 0.12 s by the
# count and "wait 73 s" in 2 s, against the other's 1.59 s: excused, it would be
# retried and answered SANDBOX_LOST (a failure a trainer drops) instead of TIMEOUT.
STARVED_MAX_PROCESSES = 8


# A run's deadline moves on by the time it was kept off a CPU it could have
# used (RunDeadline, usage.CpuShare.kept_off_seconds), up to DEADLINE_STRETCH
# times its timeout: it is killed once it has had its timeout of time to run
# or sleep. The sandbox's CPU is shared per thread: beside one busy run a
# correct C program that needs 0.53 s of CPU gets half the CPU and would be
# killed at a fixed 1 s deadline; a trainer cannot tell that TIMEOUT from a
# slow program's. The host shares its CPUs with other containers and CI's
# jobs the same way: beside a host at load 20 a correct program gets 7% of a
# CPU, and its neighbour as little, so a move by the other runs' CPU alone
# would leave its deadline where it is. A sleeping run waits on no run queue,
# and one that only its own threads or processes crowd waits while the
# sandbox's CPUs are its own: neither moves. On a
# sandbox of one CPU a run is never given more than its timeout of CPU: its
# move is at most the CPU its processes left unused; RLIMIT_CPU (the timeout,
# rounded up) still ends a busy process at its own CPU. DEADLINE_STRETCH
# lives in protocol: the daemon waits as much longer.

# A move shorter than this ends the run instead: the watch's sweeps tick in 50 ms.
DEADLINE_MIN_MOVE = 0.01


@dataclass
class RunDeadline:
    """When a run started and when it is to be killed: its timeout after its start, moved on by the time others kept
    it off the CPU."""

    started: float  # time.monotonic()
    timeout: float
    moved_seconds: float = 0.0
    # Whether, at the last move, others had kept the run off the CPU longer than the stretch covers: at its end
    # it did not have its timeout (starved_out). Told here, where its wall time to the kill and its reaping, longer
    # under the load that starved it, does not dilute the share it was kept off.
    past_stretch: bool = False

    @property
    def at(self) -> float:
        return self.started + self.timeout + self.moved_seconds

    def move(self, share: CpuShare | None) -> bool:
        """Move the deadline by the time others kept the run off the CPU (`share`, up to now); whether it moved."""
        most = (DEADLINE_STRETCH - 1.0) * self.timeout
        kept_off = others_took(share, math.inf)
        self.past_stretch = kept_off > most
        moved = min(kept_off, most)
        if moved - self.moved_seconds < DEADLINE_MIN_MOVE:
            return False
        self.moved_seconds = moved
        return True


def others_took(share: CpuShare | None, most: float) -> float:
    """Seconds of a run's life others (the sandbox's other runs, or the host's other load) kept it off a CPU it could
    have used, up to `most`: what its deadline moves by (RunDeadline, with (DEADLINE_STRETCH - 1) times its timeout).

    Its wait, to no more than the sandbox's CPUs over its life less what all
    its threads ran (usage.CpuShare.kept_off_seconds): on a CPU of its own it
    waits for nobody, and behind its own threads it waits while the CPUs are
    its own. A run of more than STARVED_MAX_PROCESSES processes moves
    nothing: their waits are summed and its CPU is counted short.
    """
    if share is None or share.most_processes > STARVED_MAX_PROCESSES:
        return 0.0
    return min(share.kept_off_seconds, most)


def starved_out(share: CpuShare | None, wall_seconds: float, past_stretch: bool = False) -> bool:
    """Whether a run that reached its deadline was kept off the CPU by others (the sandbox's other runs, or the host's
    other load), not by itself.

    Such a run is run again elsewhere (SandboxFull), not charged TIMEOUT: it
    needed the CPU (it waited for one most of its life, and still did at the
    end), and others took it: several times its CPU in the other runs, or
    more of its time than its deadline could move for (kept off more than
    1 - 1 / DEADLINE_STRETCH of its wall time, or `past_stretch`: so its
    RunDeadline, or its judge, found the deadline that ended it). A program
    that sleeps waits on no run queue; one that starves itself with its own
    threads counts their CPU as its own. A run too young for the end's wait
    to be told (`waited_lately` None) is judged by its life's.
    """
    if share is None or wall_seconds <= 0 or share.most_processes > STARVED_MAX_PROCESSES:
        return False
    if share.waited_lately is not None and share.waited_lately < STARVED_WAIT_SHARE:
        return False
    return (past_stretch or share.kept_off_seconds > (1.0 - 1.0 / DEADLINE_STRETCH) * wall_seconds
            or (share.waited_seconds >= STARVED_WAIT_SHARE * wall_seconds
                and share.others_ran_seconds >= STARVED_OTHERS_RATIO * max(share.ran_seconds, 1e-3)))


def starved_reason(share: CpuShare | None, wall: float, past_stretch: bool = False) -> str:
    """How others kept a run that reached its deadline after `wall` s off the CPU; "" where they did not
    (starved_out)."""
    if share is None or not starved_out(share, wall, past_stretch):
        return ""
    if share.others_ran_seconds >= STARVED_OTHERS_RATIO * max(share.ran_seconds, 1e-3):
        return (f"other runs took the sandbox's CPU: in {wall:.2f} s this run ran {share.ran_seconds:.2f} s "
                f"and waited {share.waited_seconds:.2f} s for a CPU, while they ran {share.others_ran_seconds:.2f} s")
    return (f"the host's other load and the sandbox's other runs took its CPU: in {wall:.2f} s this run ran "
            f"{share.ran_seconds:.2f} s and was kept off a CPU for {share.kept_off_seconds:.2f} s, more than its "
            f"deadline could move for ({DEADLINE_STRETCH:g} times its timeout); the other runs ran "
            f"{share.others_ran_seconds:.2f} s")


def raise_if_starved(share: CpuShare | None, wall: float, past_stretch: bool = False) -> None:
    """SandboxFull, to run it again elsewhere, if others kept a run that reached its deadline off the CPU
    (starved_out)."""
    reason = starved_reason(share, wall, past_stretch)
    if reason:
        raise SandboxFull(reason)


class OutputBudget:
    """stdout and stderr together may not exceed the run's output limit."""

    def __init__(self, limit: int, on_overflow: Callable[[], None]) -> None:
        self.remaining = limit
        self.overflowed = False
        self._on_overflow = on_overflow

    def take(self, size: int) -> int:
        granted = min(size, self.remaining)
        self.remaining -= granted
        if granted < size and not self.overflowed:
            self.overflowed = True
            self._on_overflow()
        return granted


class _ReadEnd:
    """A pipe's read end that the event loop watches; `_closed` resolves (to None, unless set first) on close."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._loop = asyncio.get_running_loop()
        self._closed: asyncio.Future[Any] = self._loop.create_future()
        os.set_blocking(fd, False)
        self._loop.add_reader(fd, self._on_readable)

    def _on_readable(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        if self.fd >= 0:
            self._loop.remove_reader(self.fd)
            os.close(self.fd)
            self.fd = -1
        if not self._closed.done():
            self._closed.set_result(None)


class PipeReader(_ReadEnd):
    """A run's stdout or stderr, kept within the run's output budget."""

    def __init__(self, fd: int, budget: OutputBudget) -> None:
        self.data = bytearray()
        self.truncated = False
        self._budget = budget
        super().__init__(fd)

    @property
    def eof(self) -> asyncio.Future[None]:
        return self._closed

    def _on_readable(self) -> None:
        self._read_chunk()

    def _read_chunk(self) -> bool:
        """One read; False if the pipe had nothing for now."""
        try:
            chunk = os.read(self.fd, 1 << 16)
        except BlockingIOError:
            return False
        if not chunk:
            self.close()
            return True
        granted = self._budget.take(len(chunk))
        self.data += chunk[:granted]
        if granted < len(chunk):
            self.truncated = True
        return True

    def read_now(self) -> bool:
        """Read what the pipe holds without waiting; whether it reached end of file."""
        while self.fd >= 0:
            if not self._read_chunk():
                return False
        return True


class StatusReader(_ReadEnd):
    """The pipe on which a worker reports its exit status before exiting: one byte, or end of file (None)."""

    @property
    def status(self) -> asyncio.Future[int | None]:
        return self._closed

    def _on_readable(self) -> None:
        try:
            data = os.read(self.fd, 1)
        except BlockingIOError:
            return
        if data:
            self._closed.set_result(data[0])
        self.close()


class Runner:
    """Runs workers; one instance per controller."""

    def __init__(self, zygote: Zygote, reap: Callable[[], None]) -> None:
        self.zygote = zygote
        self._reap = reap
        self.usage = UsageWatch()
        self._warm_bytes: int | None = None
        # The sandbox's memory limit, from the daemon's hello; None: unknown.
        self.sandbox_bytes: int | None = None
        # Uids that a run's end swept until none of their processes was left, and that no worker has been handed
        # since: their release has nothing to kill (take_emptied), which spares a job a look at every process.
        self._emptied: set[int] = set()
        # Workers handed each uid so far (launch): a run marks its uid emptied only if no other launch of it began
        # meanwhile, whose worker may take the uid after the run's sweep.
        self._launches: dict[int, int] = {}

    def take_emptied(self, uid: int) -> bool:
        """Whether no process of `uid` can be left: a run's end swept it empty, and no worker has been handed it
        since (none of its processes remained to fork one). Forgotten once asked."""
        if uid in self._emptied:
            self._emptied.discard(uid)
            return True
        return False

    def warm_memory(self) -> int:
        """What a worker holds when forked, shared with the zygote: a run is not charged for it."""
        if self._warm_bytes is None:
            self._warm_bytes = usage.private_memory(self.zygote.pid)
        return self._warm_bytes

    async def launch(self, spec: RunSpec, fds: list[int], extra: dict[str, Any] | None = None,
                     ) -> tuple[int, socket.socket, asyncio.Future[dict[str, Any]]]:
        """A worker that has been handed `spec` (plus `extra` fields) and `fds`; returns (pid, channel, exit future).

        `fds` stay the caller's to close. A worker that died before taking
        its job shows it in the exit future, not here.
        """
        self._launches[spec.uid] = self._launches.get(spec.uid, 0) + 1
        self._emptied.discard(spec.uid)
        job = {
            "uid": spec.uid,
            "mode": spec.mode,
            "cwd": spec.cwd,
            "env": spec.env,
            "argv": spec.argv,
            "code": spec.code,
            "rlimits": spec.rlimits,
            **(extra or {}),
        }
        if spec.assembly is not None:
            job["assembly"] = spec.assembly
        if spec.implicit_imports:
            job["implicit_imports"] = True
        if spec.share_files:
            job["share_files"] = True
        body = json.dumps(job).encode()
        if len(body) > MAX_FRAME_BYTES:
            raise ProtocolError("job too large")
        pid, channel, exited = await self.zygote.take()
        try:
            socket.send_fds(channel, [HEADER.pack(len(body))], fds)
            channel.setblocking(False)
            await asyncio.get_running_loop().sock_sendall(channel, body)
        except OSError:
            pass
        except BaseException:
            # Cancelled: the worker is still root, where no uid sweep finds it.
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            channel.close()
            self.zygote.forget(pid)
            raise
        return pid, channel, exited

    async def run(self, spec: RunSpec, *, settle: bool = True) -> RunOutcome:
        """Run `spec` to its end.

        A Python program's worker writes its status to a pipe of its own
        right before its exit (worker._flush_and_exit), having closed its
        other descriptors. The run then ends there: every process of the uid
        gets SIGKILL, so nothing of the run executes after that point, and
        the output is complete once the pipes are at end of file. Writing
        that byte is something the program can do itself, at any time; it
        ends the run with that status, exactly as os._exit() would.

        With `settle` false the outcome can come back while the worker is
        still being torn down (1-2 ms): `outcome.pending_exit` is then
        set, and the caller awaits `settle(outcome)`, then sweeps the uid
        with kill_uid, before the uid runs anything else. A run whose pipes someone else still held at its
        report (a child it left behind) is always settled here. Either way,
        when the outcome comes back no process of the uid can make a system
        call any more, so what the run left in shared folders is final.
        """
        job = CURRENT_JOB.get()
        if job is not None and job.withdrawn:
            if spec.peer is not None:
                spec.peer.close()  # whoever waits at the other end reads end of file
            raise JobWithdrawn("the daemon withdrew the job")
        stdin_fd = os.memfd_create("stdin", os.MFD_CLOEXEC)
        os.write(stdin_fd, spec.stdin)
        os.lseek(stdin_fd, 0, os.SEEK_SET)
        out_r, out_w = os.pipe2(os.O_CLOEXEC)
        err_r, err_w = os.pipe2(os.O_CLOEXEC)
        fds = [stdin_fd, out_w, err_w]
        if spec.peer is not None:
            fds.append(spec.peer.fileno())
        status_reader: StatusReader | None = None
        status_w = -1
        if spec.mode == "python":
            status_r, status_w = os.pipe2(os.O_CLOEXEC)
            status_reader = StatusReader(status_r)
            fds.append(status_w)
        killed_for = ""

        def kill(reason: str) -> None:
            # Called back (output over budget, a withdrawal) where nothing can
            # wait: the first sweep only. The run's end waits until the uid is
            # empty (kill_uid below, or _until_exiting), off the event loop's back.
            nonlocal killed_for
            if not killed_for:
                killed_for = reason
                sigkill_uid(spec.uid)

        budget = OutputBudget(spec.output_limit,
                              (lambda: None) if spec.output_over_limit_dropped else lambda: kill("output"))
        oom_kills_before = usage.oom_kills()
        stdout = PipeReader(out_r, budget)
        stderr = PipeReader(err_r, budget)
        extra = {"status_fd": len(fds) - 1} if status_reader is not None else None
        launched = self._launches.get(spec.uid, 0) + 1  # this run's launch of its uid (launch counts it first)
        try:
            pid, channel, exited = await self.launch(spec, fds, extra)
        except BaseException:
            stdout.close()
            stderr.close()
            if status_reader is not None:
                status_reader.close()
            raise
        finally:
            for fd in (stdin_fd, out_w, err_w):
                os.close(fd)
            if status_w >= 0:
                os.close(status_w)
            # The worker has its own copy now; ours would hide the worker's
            # death from the process at the other end (no end of file).
            if spec.peer is not None:
                spec.peer.close()
        started = time.monotonic()
        reported: int | None = None
        exit_message: dict[str, Any] | None = None

        def withdraw() -> None:
            kill("withdrawn")
            if not exited.done():
                # A worker not yet under its uid, which the sweep does not find.
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)

        if job is not None:
            job.watch(withdraw)

        def publish_credit() -> None:
            credit = others_took(self.usage.share_of(watched), math.inf)
            with contextlib.suppress(OSError):  # the sweep serves every run: nothing here may end it
                os.pwrite(spec.cpu_credit_fd, CPU_CREDIT.pack(credit), 0)

        watched = self.usage.watch(spec.uid, spec.memory_limit + self.warm_memory() if spec.memory_limit else 0,
                                   bounded_alone="as_extra" in spec.rlimits, on_over=lambda: kill("memory"),
                                   on_counted=publish_credit if spec.cpu_credit_fd >= 0 else None)
        deadline = RunDeadline(started, spec.timeout)
        try:
            if status_reader is not None:
                await self._within(deadline, watched, [exited, status_reader.status])
                if status_reader.status.done() and not exited.done() and not killed_for:
                    # None: it closed the pipe without a status; its exit tells.
                    reported = status_reader.status.result()
            if reported is None:
                await self._within(deadline, watched, [exited])
                exit_message = exited.result()
                if watched.limit and not watched.pinning and _sigkilled(exit_message["status"]) and (
                        oom_kills_before is None or usage.oom_kills() != oom_kills_before):
                    # The OOM killer may have taken it faster than any sweep saw it pin: what the rest of its
                    # processes still pin, before they are killed, tells.
                    await self.usage.count_pinned_now(watched)
        except TimeoutError:
            self.usage.count_now(watched)
            watched.close_looks()
            kill("wall_time")
            exit_message = await self._await_exit(exited)
        finally:
            self.zygote.forget(pid)
            if status_reader is not None:
                status_reader.close()
            if job is not None:
                job.unwatch(withdraw)
            self.usage.unwatch(watched)
        wall = time.monotonic() - started
        pending_exit: asyncio.Future[dict[str, Any]] | None = None
        if reported is not None:
            listed: set[int] = set()
            sigkill_uid(spec.uid, count_exiting=False, listed=listed)
            # The worker closed its pipes before reporting: if they are not at
            # end of file now, something it started holds them.
            held = not (stdout.read_now() and stderr.read_now())
            if settle or held:
                await self._await_exit(exited)
            else:
                await self._until_exiting(spec.uid, listed)
                pending_exit = exited
        if pending_exit is None:
            # Anything the run started (a daemon, a sleeping grandchild) dies with it.
            await kill_uid(spec.uid, self._reap)
            if self._launches.get(spec.uid) == launched:
                self._emptied.add(spec.uid)
        await asyncio.wait([stdout.eof, stderr.eof], timeout=DRAIN_SECONDS)
        stdout.close()
        stderr.close()
        channel.close()
        if exit_message is None:
            # The status the program reported; its resources are not known
            # before its exit, and nothing reads them for a normal exit.
            exit_message = {"status": (reported or 0) << 8, "cpu_seconds": 0.0, "max_rss_bytes": 0}
        # Only a run that did not exit cleanly is judged by the count (classify, crowded_out), and not one its
        # caller ended (a candidate once its judge answered): its caller does not take the verdict.
        oom_kills_after = usage.oom_kills() if exit_message["status"] and not spec.ended_by_caller else None
        outcome = RunOutcome(
            wait_status=exit_message["status"],
            stdout=bytes(stdout.data),
            stderr=bytes(stderr.data),
            stdout_truncated=stdout.truncated,
            stderr_truncated=stderr.truncated,
            killed_for=killed_for,
            wall_seconds=wall,
            cpu_seconds=exit_message["cpu_seconds"],
            max_rss_bytes=exit_message["max_rss_bytes"],
            pending_exit=pending_exit,
            peak_memory_bytes=watched.peak,
            peak_kernel_bytes=watched.peak_kernel,
            pinning=watched.pinning,
            lowered=watched.lowered,
            cpu_share=self.usage.share_of(watched),
            deadline_moved_seconds=deadline.moved_seconds,
            oom_kills=(oom_kills_after - oom_kills_before
                       if oom_kills_before is not None and oom_kills_after is not None else None),
        )
        if (_sigkilled(outcome.wait_status)
                and not spec.ended_by_caller and not _over_cpu(outcome, spec)
                and crowded_out(outcome, spec.memory_limit or self.sandbox_bytes or 0, self.sandbox_bytes)):
            raise SandboxFull(f"the sandbox ran out of memory while this run held {outcome.held_bytes >> 20} MiB; "
                              f"the out-of-memory killer took it")
        if killed_for == "wall_time":
            raise_if_starved(outcome.cpu_share, outcome.wall_seconds, past_stretch=deadline.past_stretch)
        return outcome

    async def _within(self, deadline: RunDeadline, watched: usage.WatchedRun,
                      ends: list[asyncio.Future[Any]]) -> None:
        """Until one of `ends` is done; TimeoutError at `deadline`, once the time others keep the run off the CPU no
        longer moves it (RunDeadline.move)."""
        while True:
            done, _ = await asyncio.wait(ends, timeout=max(0.0, deadline.at - time.monotonic()),
                                         return_when=asyncio.FIRST_COMPLETED)
            if done:
                return
            self.usage.count_now(watched)
            if not deadline.move(self.usage.share_of(watched)):
                raise TimeoutError

    async def _until_exiting(self, uid: int, listed: set[int]) -> None:
        """Wait until every process of `uid` is in its exit; `listed`: those the last sweep saw.

        A sweep is final when it signals nothing and sees no process that
        the one before did not: a process that exits by itself may fork just
        before, after the sweep listed /proc, and only the next sweep sees
        that child. Usually this takes one more sweep (the worker is in its
        exit by then). A process that keeps its descendants coming is left
        to kill_uid, which waits for their end.
        """
        for _ in range(20):
            seen: set[int] = set()
            stopping = sigkill_uid(uid, count_exiting=False, listed=seen)
            if not stopping and seen <= listed:
                return
            listed = seen
            if stopping:
                await asyncio.sleep(0.0005)
        await kill_uid(uid, self._reap)

    @staticmethod
    async def _await_exit(exited: asyncio.Future[dict[str, Any]]) -> dict[str, Any]:
        """The exit report of a worker that was sent SIGKILL (it, or its whole uid)."""
        try:
            return await asyncio.wait_for(asyncio.shield(exited), KILL_GRACE_SECONDS)
        except TimeoutError:
            raise SandboxDamaged("a worker did not exit after SIGKILL") from None

    async def settle(self, outcome: RunOutcome) -> None:
        """For a run that came back before its exit (see `run`): wait for that exit."""
        if outcome.pending_exit is not None:
            await self._await_exit(outcome.pending_exit)
            outcome.pending_exit = None
