"""The controller: PID 1 of a sandbox, the daemon's peer on the control socket.

Requests are frames (see protocol.py) on a Unix socket in a folder the
daemon bind-mounts from the host; only root in the sandbox can reach it
(folder 0700), so jobs, which run under other uids, cannot talk to it.

Ops: `hello` (after a start or a restore: reseed, learn the sandbox's id and
its uid slot),
`prepare` (start the warm math servers; the reward model's state), `ping`, `run` (one job: execute,
code or math), and `session_open`,
`session_cell`, `session_close`, `sessions_ended` (see sessions.py).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import concurrent.futures
import contextlib
import ctypes
import errno
import json
import os
import random
import resource
import shutil
import signal
import socket
import stat
import sys
import threading
import time
import traceback
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

from sandboxd.agent import sessions as sessions_module
from sandboxd.agent import usage, worker
from sandboxd.agent.judgeserver import JudgeServers
from sandboxd.agent.mathserver import MathServers
from sandboxd.agent.protocol import (
    DEADLINE_STRETCH,
    HEADER,
    MAX_FRAME_BYTES,
    UIDS_PER_SANDBOX,
    UNSLOTTED_FIRST_UID,
    BadRequest,
    ProtocolError,
    encode_frame,
    first_job_uid,
    read_frame,
    require,
)
from sandboxd.agent.rewardmodel import RewardModelHost
from sandboxd.agent.runner import (
    CURRENT_JOB,
    JobWithdrawal,
    JobWithdrawn,
    Runner,
    RunOutcome,
    RunSpec,
    SandboxDamaged,
    SandboxFull,
    Zygote,
    classify,
    crowded_out,
    kill_uid,
    raise_if_starved,
    remove_files_of,
    remove_ipc_objects_of,
    remove_tree,
    sigkill_uid,
)
from sandboxd.agent.tree import read_tree_file, usage_of, write_tree

PR_SET_CHILD_SUBREAPER = 36
WORK_ROOT = "/tmp/sandboxd"
# Writable folders every uid shares; scrubbed of a run's files after it.
SHARED_WRITABLE = ("/dev/shm", "/dev/mqueue", "/var/tmp", "/run/lock")
# The image's sticky folders, which --private-tmp makes root-only. They are
# on the root file system, which a restored container has writable (the
# engine's restore does not remount it read-only): left 1777 there, a run
# could write to the host's disk (the container's upper layer) past every
# tmpfs cap. So they are locked again at every hello.
STICKY_ROOT_FOLDERS = ("/var/tmp", "/run/lock")
TEXT_PREVIEW_BYTES = 4096
DEFAULT_RLIMITS = {"fsize": 64 << 20, "nproc": 256, "nofile": 512, "core": 0}
# RLIMIT_STACK of an exec'd program (every language but Python): as high as
# the sandbox allows, unlimited under Docker's defaults, as judges' `ulimit -s
# unlimited`. The default 8 MiB overflowed a C++ DFS over a path of 2e5 nodes
# (SIGSEGV in a correct program; Rust aborted at 1e6). Unlimited, the main
# thread's stack is bounded by the run's memory limit alone, and glibc reserves
# 2 MiB for each pthread; a finite limit is also that reservation (at 128 MiB,
# 16 threads could not start under the default 512 MiB memory limit). A Python
# program in the warm interpreter keeps its stack: since 3.11 Python calls
# Python without C stack.
RUN_STACK_LIMIT = resource.getrlimit(resource.RLIMIT_STACK)[1]
# What a compiler's processes may hold together (usage.UsageWatch), whatever
# the job's limit. Peak RSS of the largest process compiling a 5-line program
# with a map and a sort, in the langs image: g++ (bits/stdc++.h) 205 MiB
# (175 MiB from the precompiled header), rustc 181 MiB (177 MiB for 1.85),
# javac 89 MiB, go build 47 MiB (56 MiB for 1.23). A
# template or const-eval bomb grows until it is stopped here.
COMPILE_MEMORY_BYTES = 1 << 30
FILE_COLLECT_BYTES = 16 << 20
# What a function or assert job's candidate and judge get past its total time, which the judge keeps
# itself: its answer with the verdicts so far comes first, then their kill.
JUDGE_GRACE_SECONDS = 1.0
# How long a candidate whose judge saw it die has for its exit to be reported (a few ms here) before it is
# killed as one whose verdict is in.
CANDIDATE_EXIT_SECONDS = 1.0
# A job's files up to this size (paths and contents) are written on the loop: a thread's hand-off costs more.
INLINE_WRITE_BYTES = 256 << 10
COLLECT_TOTAL_BYTES = 24 << 20
# An error reply's message is cut here.
MAX_ERROR_CHARS = 2000
# Concurrent runs share /tmp (sandbox.tmpfs_bytes and tmpfs_inodes). A job
# that gets ENOSPC where the agent writes for it (its work dir, its input
# files, before any process of it runs) or where its compiler writes, while
# the other runs hold at least this share of /tmp's bytes or entries, was
# crowded out: it is retried elsewhere (SandboxFull) rather than answered
# INTERNAL or compile_error. Its own files do not count, so a job whose
# own compile fills /tmp keeps its compile_error. The sandbox takes jobs
# again once less than this share is used (`room`).
NEIGHBOURS_SHARE = 0.5
# A run starved of CPU by the others (runner.starved_out) is retried
# elsewhere; the sandbox takes jobs again once at most this many job threads
# per CPU are ready to run: two single-threaded busy runs on one CPU are
# room, a run of three busy processes beside them is not.
RUNNABLE_PER_CPU = 2
# A compile's "no space left on device" counts only when the space within its
# reach (free, plus what its own folder holds) is under this share of /tmp.
STARVED_SHARE = 0.1
# strerror(ENOSPC), as compilers print it (Go in lower case).
NO_SPACE = b"no space left on device"
# Tries of a uid's System V IPC sweep when no pid is left to fork its helper with, 20 ms apart.
IPC_SWEEP_ATTEMPTS = 50
# pyharness verdicts that are about the dataset's tests, not the candidate.
DATASET_ERRORS = {
    "setup_error": "the dataset's setup code failed",
    "no_calls": "the dataset's tests check nothing",
    "unsupported": "the dataset's tests need what the harness does not provide",
}
# pyharness test statuses -> ours. A candidate that exits or breaks the
# protocol mid-test ("died": sys.exit(0), os._exit) failed that test. One
# whose program or reply was too large for the judge to read ("memory":
# pyharness.TooLargeForJudge) failed it at the memory limit.
HARNESS_STATUSES = {
    "ok": "ok",
    "wrong_answer": "wrong_answer",
    "runtime_error": "runtime_error",
    "timeout": "timeout",
    "total_time": "timeout",
    "died": "runtime_error",
    "load_error": "runtime_error",
    "rejected": "rejected",
    "memory": "memory_limit",
}
# The limit that ended a test of a harness status (HARNESS_STATUSES) of ours; the others name none.
HARNESS_LIMITS = {"timeout": "wall_time", "memory_limit": "memory"}


@dataclass
class MathSettings:
    servers: int = 1
    prestart_memory: int = 0  # the memory limit `prepare` starts and warms servers for


class UidPool:
    """The sandbox's block of job uids (protocol.UIDS_PER_SANDBOX), one per run, server or session."""

    def __init__(self, first: int = UNSLOTTED_FIRST_UID) -> None:
        self._reset(first)

    def _reset(self, first: int) -> None:
        self.first = first
        # Taken from the end, lowest first; a given-back uid goes to the front, to be reused last.
        self._free = list(range(first + UIDS_PER_SANDBOX - 1, first - 1, -1))

    def place(self, first: int) -> None:
        """Move the block, which only a sandbox with no uid taken can do (hello comes before any run)."""
        if first == self.first:
            return
        if len(self._free) != UIDS_PER_SANDBOX:
            raise SandboxDamaged(f"uid block moved to {first} while {UIDS_PER_SANDBOX - len(self._free)} are taken")
        self._reset(first)

    def take(self) -> int:
        if not self._free:
            raise SandboxDamaged("no free job uid")
        return self._free.pop()

    def give_back(self, uid: int) -> None:
        self._free.insert(0, uid)


def _preview(data: bytes, limit: int = TEXT_PREVIEW_BYTES) -> str:
    return data[:limit].decode("utf-8", errors="replace")


def lock_sticky_folders() -> None:
    """Make STICKY_ROOT_FOLDERS root-only (0755) where the root file system lets us."""
    for folder in STICKY_ROOT_FOLDERS:
        with contextlib.suppress(OSError):  # read-only (a cold start), or not in this image
            os.chmod(folder, 0o755)


class Controller:
    def __init__(self, zygote: Zygote, languages: list[str], math: MathSettings | None = None, *,
                 private_tmp: bool = False) -> None:
        self.zygote = zygote
        self.private_tmp = private_tmp
        self.runner = Runner(zygote, self.reap)
        self.uids = UidPool()
        self.languages = languages
        self.sandbox_id = ""
        # The sandbox's pids limit and CPUs, from the daemon's hello; 0: unknown.
        self.sandbox_pids = 0
        self.sandbox_cpus = 0.0
        self.math = math or MathSettings()
        self.shared_writable = list(SHARED_WRITABLE)
        self.math_servers = MathServers(self, self.math.servers)
        self.judges = JudgeServers(self)
        # Open sessions by uid, which is also the handle the daemon holds.
        self.sessions: dict[int, sessions_module.Session] = {}
        # Set in a reward-model sandbox: the model's scorer process and its batcher.
        self.reward_model: RewardModelHost | None = None
        self._releasing: set[asyncio.Future[None]] = set()

    # ---- process housekeeping ------------------------------------------
    def reap(self) -> None:
        """Collect orphans re-parented to us; the zygote's death is fatal."""
        while True:
            try:
                pid, _status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid == self.zygote.pid:
                print("sandboxd-agent: zygote exited; sandbox is damaged", file=sys.stderr, flush=True)
                os._exit(70)

    # ---- work dirs ------------------------------------------------------
    async def make_workdir(self, uid: int) -> str:
        """A fresh 0700 folder of `uid`'s; SandboxFull when other runs took /tmp's space (NEIGHBOURS_SHARE)."""
        path = f"{WORK_ROOT}/{uid}"
        if os.path.lexists(path):
            # Not expected: a uid comes back only once its folder is gone (release).
            await _off_loop(remove_tree, path)
        try:
            os.mkdir(path, 0o700)
        except OSError as exc:
            if exc.errno == errno.ENOSPC:
                await self.charge_neighbours(None, f"making a work dir: {exc.strerror}")
            raise
        os.chown(path, uid, uid)
        return path

    async def write_files(self, workdir: str, uid: int, files: Iterable[tuple[str, bytes]]) -> None:
        """`write_tree` of `files`, before any process of `uid` runs; SandboxFull as in `make_workdir`.

        In a thread past INLINE_WRITE_BYTES: a job's files are up to 32 MiB
        and 1,024 paths of 4 KB, seconds of system calls at worst, which
        held up the other jobs of the sandbox when made on the loop.
        """
        files = list(files)
        try:
            if sum(len(path) + len(content) for path, content in files) <= INLINE_WRITE_BYTES:
                write_tree(workdir, uid, files)
            else:
                await _off_loop(write_tree, workdir, uid, files)
        except OSError as exc:
            if exc.errno == errno.ENOSPC:
                await self.charge_neighbours(workdir, f"writing {exc.filename!r}: {exc.strerror}")
            raise

    @staticmethod
    async def charge_neighbours(workdir: str | None, what: str) -> None:
        """Raise SandboxFull if other runs than the one in `workdir` hold /tmp (NEIGHBOURS_SHARE); else return.

        For a job that ran out of space in /tmp (`what`): the caller raises
        its own error when this returns. The look at `workdir` runs in a
        thread: a run can fill it with tmpfs_inodes entries.
        """
        if await _off_loop(neighbours_hold, WORK_ROOT, workdir):
            raise SandboxFull(f"/tmp of the sandbox is full ({what}); other runs hold its space")

    async def release(self, uid: int, *, shared_files_removed: bool = False) -> None:
        """Make `uid` free for another run: its processes gone, its files removed, then the uid given back.

        `shared_files_removed`: remove_shared_files ran once nothing of the
        uid could add a file any more. The files are removed in a thread:
        a run can leave as many entries as the tmpfs holds (hard links cost
        no space), and removing them on the event loop held up every other
        job and session of the sandbox (2.5 million links: a concurrent 1 s
        job timed out and the sandbox was lost). The uid is given back only
        once they are gone, so no later run of it can find them. SandboxDamaged
        when they cannot be removed (remove_tree's bound).
        """
        await kill_uid(uid, self.reap)
        if not shared_files_removed:
            await self.remove_shared_files(uid)
        workdir = f"{WORK_ROOT}/{uid}"
        try:
            # What most runs leave (every Python-harness candidate): an empty
            # folder, gone in one call on the loop. Nothing of the uid is left
            # to add to it, and a full one fails at once (ENOTEMPTY). The
            # thread's round trip cost more than the removal.
            os.rmdir(workdir)
        except FileNotFoundError:
            pass
        except OSError:
            await _off_loop(remove_tree, workdir)
        self.uids.give_back(uid)

    async def remove_shared_files(self, uid: int) -> None:
        """Delete what `uid` left where other uids can look: /dev/shm and the like, System V IPC objects.

        Done before a job's reply, once its runs are over (Runner.run): a
        later job must not find a file an earlier one left there, such as
        an expected output that it read. The files go in a thread, as in
        `release`, unless a look on the loop finds the folders empty (the
        usual case; a thread's round trip costs about 0.1 ms here): no
        process of the uid is left to add one. The IPC objects go on the
        loop (a table read, and a fork only when the uid has some); a fork
        refused for want of pids (other runs hold them all) is tried again
        for up to a second, yielding to the loop in between.
        """
        if any(map(_has_entries, self.shared_writable)):
            await _off_loop(self._remove_files_in_shared_folders, uid)
        for attempt in range(IPC_SWEEP_ATTEMPTS):
            try:
                remove_ipc_objects_of(uid)
                return
            except BlockingIOError:
                if attempt == IPC_SWEEP_ATTEMPTS - 1:
                    raise
                await asyncio.sleep(0.02)

    def _remove_files_in_shared_folders(self, uid: int) -> None:
        for folder in self.shared_writable:
            remove_files_of(uid, folder)

    def release_later(self, uid: int, runs: list[RunOutcome] | None = None, *,
                      shared_files_removed: bool = False) -> asyncio.Future[None]:
        """`release(uid)` in the background once `runs` have exited: off the job's path, or a caller's that cannot wait.

        The reply goes out first: a run answered before its exit (Runner.run,
        settle=False) takes 1-2 ms more to end, and the uid sweep (0.14 ms
        here) and the work dir's removal follow it. No process of the job
        can act meanwhile (each is in its exit), its work dir is its uid's
        alone, and the uid is not handed out again until this is done. A
        release that fails ends the agent: the sandbox is damaged.
        """

        async def release() -> None:
            try:
                for outcome in runs or ():
                    await self.runner.settle(outcome)
                await self.release(uid, shared_files_removed=shared_files_removed)
            except Exception as exc:
                # A uid that could not be made clean must never be handed out
                # again; the daemon retires the sandbox when the agent exits.
                if not isinstance(exc, SandboxDamaged):
                    traceback.print_exc()
                self.damaged(f"releasing uid {uid} failed ({exc})")

        task = asyncio.ensure_future(release())
        self._releasing.add(task)
        task.add_done_callback(self._releasing.discard)
        return task

    @staticmethod
    def damaged(why: str) -> None:
        """End the agent: the sandbox can no longer run jobs safely, and the daemon retires it when we exit."""
        print(f"sandboxd-agent: {why}; sandbox is damaged", file=sys.stderr, flush=True)
        os._exit(71)

    @staticmethod
    def _collect_file(workdir: str, relpath: str) -> bytes | None:
        try:
            return read_tree_file(workdir, relpath, FILE_COLLECT_BYTES)
        except (OSError, BadRequest):
            return None  # missing, a link, a folder, a fifo...: left out, as the proto says

    # ---- building runs -----------------------------------------------------
    @staticmethod
    def rlimits(limits: dict[str, Any], *, address_space: bool) -> dict[str, int]:
        rlimits = dict(DEFAULT_RLIMITS)
        rlimits["cpu"] = max(1, int(limits["timeout"] + 0.999))
        if address_space and limits.get("memory"):
            rlimits["as_extra"] = int(limits["memory"])
        return rlimits

    @staticmethod
    def env(workdir: str, extra: dict[str, str] | None = None) -> dict[str, str]:
        env = {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": workdir,
            "TMPDIR": workdir,
            "LANG": "C.UTF-8",
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONHASHSEED": "0",
        }
        from sandboxd.verifiers.code import expand_env

        # Language settings name paths inside the run's own work dir.
        env.update(expand_env(extra or {}, workdir))
        return env

    def _program_spec(self, program: dict[str, Any], limits: dict[str, Any], uid: int, workdir: str,
                      stdin: bytes, args: list[str]) -> RunSpec:
        """A run of the candidate's program: in-process Python or an exec'd binary."""
        common = {
            "uid": uid,
            "cwd": workdir,
            "timeout": limits["timeout"],
            "output_limit": limits["output"],
            "stdin": stdin,
            "env": self.env(workdir, program.get("env")),
            "memory_limit": int(limits.get("memory") or 0),
        }
        if program["language"] == "python":
            return RunSpec(mode="python", code=program["code"], argv=[program.get("source", "main.py"), *args],
                           rlimits=self.rlimits(limits, address_space=True), **common)
        address_space = program.get("address_space_limit", True)
        peak_memory_limit = 0 if address_space else int(limits.get("memory") or 0)
        argv = [*program["run"], *args]
        if peak_memory_limit:
            argv = _sized_to(argv, peak_memory_limit, common["env"])
        rlimits = self.rlimits(limits, address_space=address_space)
        rlimits["stack"] = RUN_STACK_LIMIT
        return RunSpec(mode="exec", argv=argv, rlimits=rlimits, peak_memory_limit=peak_memory_limit, **common)

    async def _compile(self, program: dict[str, Any], limits: dict[str, Any], uid: int,
                       workdir: str) -> tuple[bool, str, float]:
        """Write the source and compile it once; (ok, compiler output, seconds)."""
        if program["language"] == "python":
            return True, "", 0.0  # runs in-process from the code itself
        await self.write_files(workdir, uid, [(program.get("source", "main.py"), program["code"].encode())])
        if not program.get("compile"):
            return True, "", 0.0
        spec = RunSpec(
            mode="exec", uid=uid, cwd=workdir, argv=program["compile"],
            timeout=program.get("compile_timeout", 30.0), output_limit=64 << 10,
            rlimits=dict(DEFAULT_RLIMITS, nproc=512), env=self.env(workdir, program.get("env")),
            memory_limit=COMPILE_MEMORY_BYTES, output_over_limit_dropped=True,
        )
        outcome = await self.runner.run(spec)
        if outcome.exit_code and crowded_out(outcome, COMPILE_MEMORY_BYTES, self.runner.sandbox_bytes):
            # cc1plus, rustc's or javac's JVM taken by the OOM killer while
            # another run filled the sandbox: the driver reports "Killed".
            raise SandboxFull(f"the sandbox ran out of memory while compiling (the compiler held "
                              f"{outcome.held_bytes >> 20} MiB); the out-of-memory killer took it")
        if outcome.exit_code and not outcome.killed_for and NO_SPACE in (outcome.stderr + outcome.stdout).lower():
            # The compiler's words are the candidate's to write (`#error No space left on device`):
            # only a /tmp that really left this job no room, the others holding it, makes them an excuse.
            tmp = await _off_loop(TmpUsage.read, WORK_ROOT, workdir)
            if tmp.starved() and tmp.others_hold():
                raise SandboxFull("/tmp of the sandbox is full (compiling); other runs hold its space")
        output = _preview(outcome.stderr + outcome.stdout, 8192)
        if outcome.stdout_truncated or outcome.stderr_truncated:
            # First: the preview is cut again on its way to the caller.
            output = f"(the compiler's output past {spec.output_limit >> 10} KiB was dropped)\n{output}"
        if outcome.killed_for == "wall_time":
            return False, f"compilation timed out after {spec.timeout:g} s\n{output}", outcome.wall_seconds
        if outcome.killed_for == "memory":
            return (False, f"the compiler's processes held more than {COMPILE_MEMORY_BYTES >> 20} MiB\n{output}",
                    outcome.wall_seconds)
        return outcome.exit_code == 0, output, outcome.wall_seconds

    # ---- jobs ------------------------------------------------------------
    async def run_job(self, job: dict[str, Any]) -> dict[str, Any]:
        kind = validate_job(job)
        started = time.monotonic()
        if kind == "execute":
            result = await self._under_own_uid(self._execute, job)
        elif kind == "code":
            result = await self._under_own_uid(self._code, job)
        elif kind == "math":
            result = await self._math(job)
        elif kind == "reward_model" and self.reward_model is not None:
            result = await self.reward_model.run(job)
        else:
            raise BadRequest(f"no {kind!r} jobs here")
        result["run_seconds"] = time.monotonic() - started
        return result

    async def _under_own_uid(self, body: Callable[[dict[str, Any], int, list[RunOutcome]],
                                                  Awaitable[dict[str, Any]]],
                             job: dict[str, Any]) -> dict[str, Any]:
        """`body(job, uid, runs)` under a uid of its own, which is released after the reply.

        `body` appends a run that may still be exiting to `runs` (Runner.run,
        settle=False). The shared folders are cleaned before the reply: by
        then no process of the job can add a file (Runner.run).
        """
        uid = self.uids.take()
        runs: list[RunOutcome] = []
        try:
            result = await body(job, uid, runs)
            await self.remove_shared_files(uid)
        except BaseException:
            self.release_later(uid, runs)
            raise
        self.release_later(uid, runs, shared_files_removed=True)
        return result

    async def _execute(self, job: dict[str, Any], uid: int, runs: list[RunOutcome]) -> dict[str, Any]:
        program, limits = job["program"], job["limits"]
        workdir = await self.make_workdir(uid)
        await self.write_files(workdir, uid, decode_files(job.get("files", []), "job.files"))
        ok, compile_output, _ = await self._compile(program, limits, uid, workdir)
        if not ok:
            return {"status": "compile_error", "message": "compilation failed",
                    "execute": {"exit_code": 1, "stdout": "", "stderr": base64.b64encode(
                        compile_output.encode()).decode()}}
        spec = self._program_spec(program, limits, uid, workdir,
                                  decode_base64(job.get("stdin", ""), "job.stdin"), job.get("args", []))
        # Files are collected after the run's processes are gone.
        outcome = await self.runner.run(spec, settle=bool(job.get("collect_files")))
        runs.append(outcome)
        status, limit, message = classify(outcome, spec)
        files = []
        collected = 0
        for relpath in job.get("collect_files", []):
            content = self._collect_file(workdir, relpath)
            # The reply must fit a frame (64 MiB, base64 included): files past 24 MiB in all are left out.
            if content is not None and collected + len(content) <= COLLECT_TOTAL_BYTES:
                collected += len(content)
                files.append({"path": relpath, "content": base64.b64encode(content).decode()})
        return {
            "status": status,
            "limit": limit,
            "message": message,
            "execute": {
                "exit_code": outcome.exit_code,
                "stdout": base64.b64encode(outcome.stdout).decode(),
                "stderr": base64.b64encode(outcome.stderr).decode(),
                "stdout_truncated": outcome.stdout_truncated,
                "stderr_truncated": outcome.stderr_truncated,
                "files": files,
            },
        }

    async def _code(self, job: dict[str, Any], uid: int, runs: list[RunOutcome]) -> dict[str, Any]:
        from sandboxd.verifiers.code import compare_stdout

        program, limits, plan = job["program"], job["limits"], job["plan"]
        workdir = await self.make_workdir(uid)
        ok, compile_output, _ = await self._compile(program, limits, uid, workdir)
        if not ok:
            return {"status": "compile_error", "message": "compilation failed",
                    "code": {"compile_output": compile_output, "tests_total": plan["total"]}}
        if plan["kind"] == "stdio":
            tests = []
            ran_out = _total_time_ran_out(limits["total_timeout"])
            # The compile step has its own limit; the job's time starts here.
            job_started = time.monotonic()
            job_deadline = job_started + limits["total_timeout"]
            for index, case in enumerate(plan["stdio"]):
                if runs:
                    await self.runner.settle(runs.pop())
                    await kill_uid(uid, self.reap)
                left = job_deadline - time.monotonic()
                if left <= 0:
                    tests.append({"index": index, "status": "timeout", "limit": "total_time",
                                  "message": f"not run: {ran_out}",
                                  "time_seconds": 0.0, "stdout": "", "stderr": ""})
                    break
                spec = self._program_spec(program, limits, uid, workdir, case["stdin"].encode(), [])
                # Cut short, the case keeps its CPU-time limit: what ended it is the job's clock.
                cut_short = left < spec.timeout
                if cut_short:
                    spec.timeout = left
                outcome = await self.runner.run(spec, settle=False)
                runs.append(outcome)
                # The job's clock moves with each case's (runner.RunDeadline), within the stretch the daemon waits.
                job_deadline = min(job_deadline + outcome.deadline_moved_seconds,
                                   job_started + DEADLINE_STRETCH * limits["total_timeout"])
                status, limit, message = classify(outcome, spec)
                if cut_short and limit == "wall_time":
                    limit, message = "total_time", f"killed when {ran_out}"
                actual = outcome.stdout.decode("utf-8", errors="replace")
                if status == "ok" and not compare_stdout(actual, case["expected_stdout"],
                                                         job.get("checker", "whitespace"),
                                                         job.get("tolerance", 1e-6)):
                    status, message = "wrong_answer", "output differs from the expected output"
                tests.append(_test_entry(index, status, limit, message, outcome))
                if limit == "total_time" or (status != "ok" and job.get("stop_on_first_failure")):
                    break
            return _code_result(tests, plan["total"])
        return await self._python_harness(job, uid, workdir)

    async def _python_harness(self, job: dict[str, Any], uid: int, workdir: str) -> dict[str, Any]:
        """Function-call and assert tests: the candidate in a fresh process, the judge a resident one, two uids."""
        plan, limits = job["plan"], job["limits"]
        candidate_end, judge_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        # Where the runner keeps the time others keep the candidate off the CPU, for the judge's deadlines to move by.
        cpu_credit_fd = os.memfd_create("sandboxd-cpu-credit", os.MFD_CLOEXEC)
        cases = max(1, plan["total"])
        # The judge calls the candidate once per case: the deadline covers them all.
        timeout = min(limits["timeout"] * cases, limits["total_timeout"])
        capped = timeout < limits["timeout"] * cases
        run_limits = dict(limits, timeout=timeout)
        harness = dict(job["harness"], call_timeout=limits["timeout"])
        # A HumanEval prompt's program is assembled by the candidate and by the judge (code.assemble).
        assembly = job.get("assembly")
        if plan["kind"] == "assert":
            # The judge parses it for the names the tests may call (pyharness.run_tests), on this job's time.
            harness["program"] = job["program"]["code"]
            if assembly is not None:
                harness["assembly"] = assembly
        # Where the job's total time is what runs out, the judge keeps that clock itself and answers with
        # the verdicts of the tests before it (a fraction reward counts them); the candidate and the judge
        # get JUDGE_GRACE more, so that it is the judge's clock that ends the tests, not their kill.
        grace = JUDGE_GRACE_SECONDS if capped else 0.0
        if capped:
            harness["time_for_all"] = timeout
        # The files a test writes for the program (tmp_path, tempfile, a relative path) and those the program writes
        # for the test: the candidate's folder is the tests' working directory too, shared with its judge's group
        # only, for this job (pyremote.share_files keeps each side's files usable by the other's uid).
        harness["files"] = workdir

        def share(judge_uid: int) -> None:
            os.chown(workdir, -1, judge_uid)
            os.chmod(workdir, 0o2770)

        try:
            candidate = RunSpec(
                mode="py_callee", uid=uid, cwd=workdir, code=job["program"]["code"], assembly=assembly,
                implicit_imports=plan["kind"] == "function", timeout=timeout + grace,
                output_limit=limits["output"], rlimits=self.rlimits(run_limits, address_space=True),
                env=self.env(workdir), peer=candidate_end, memory_limit=int(limits.get("memory") or 0),
                cpu_credit_fd=cpu_credit_fd, share_files=True,
            )
            # The judge may use as much memory for the tests as the job may for the program: a performance test's
            # 3 million ints cost the judge about 180 MiB to build and send (judgeserver.JOB_MEMORY_BYTES at least).
            request = {"plan_kind": plan["kind"], "harness": harness, "memory_budget": int(limits.get("memory") or 0)}
            candidate_task = asyncio.ensure_future(self.runner.run(candidate))
            no_room: SandboxFull | None = None
            try:
                judged, verdict, message = await self.judges.judge(request, judge_end, cpu_credit_fd,
                                                                   timeout * DEADLINE_STRETCH + grace, share=share)
            except SandboxFull as exc:
                # The candidate ends as below, so that nothing of it acts once this returns.
                no_room, judged, verdict, message = exc, "", None, ""
            except BaseException:
                candidate_task.cancel()
                raise
            if isinstance(verdict, dict) and verdict.get("candidate_died"):
                # The judge saw the candidate's end of the socket close, which comes before its exit's report:
                # that exit says whether the OOM killer took it while the others held the sandbox's memory
                # (runner.crowded_out, then retried as a stdio run is) or at its own limit.
                await asyncio.wait([candidate_task], timeout=CANDIDATE_EXIT_SECONDS)
            # The judge is done: whatever the candidate still does is moot,
            # and its death by our SIGKILL says nothing about it. The run
            # waits for the worker's exit, then sweeps the uid until empty.
            killed_by_us = not candidate_task.done()
            candidate.ended_by_caller = killed_by_us
            # Closed first: a candidate not yet launched when the judge
            # answered (no one to signal yet) then reads end of file and exits.
            judge_end.close()
            sigkill_uid(uid)
            candidate_outcome = await candidate_task
        finally:
            candidate_end.close()
            judge_end.close()
            os.close(cpu_credit_fd)
        if no_room is not None:
            # The judge's look counted the candidate's files as others'. A
            # candidate that itself holds NEIGHBOURS_SHARE of /tmp, while the
            # others do not, filled it: it must not be retried (its answer
            # spared) for that. Anything else is the neighbours' doing, though
            # they may have left since.
            if not (await _off_loop(TmpUsage.read, WORK_ROOT, workdir)).filled_alone():
                raise no_room
            return _code_result([], plan["total"], status="runtime_error",
                                message="the program filled /tmp before its tests could start")
        if judged == "timeout":
            raise_if_starved(candidate_outcome.cpu_share, candidate_outcome.wall_seconds)  # the judge gave up on it
            if capped:
                message = f"killed when {_total_time_ran_out(timeout)}"
            return _code_result([], plan["total"], status="timeout", limit="total_time" if capped else "wall_time",
                                message=message)
        if judged != "ok" or not isinstance(verdict, dict):
            return {"status": "internal", "message": message or "no verdict", "code": {"tests_total": plan["total"]}}
        candidate_status, candidate_limit, candidate_message = classify(candidate_outcome, candidate)
        if killed_by_us:
            candidate_status, candidate_limit, candidate_message = "ok", "", ""
        if verdict.get("status") == "unsupported":
            return {"status": "unsupported_test", "do_not_retry": True,
                    "message": f"{DATASET_ERRORS['unsupported']}: {verdict.get('message')}",
                    "code": {"tests_total": plan["total"]}}
        if verdict.get("status") in DATASET_ERRORS:
            # Not the model's fault, and no reason to score it as passed; the
            # same tests would say the same on any sandbox, so not retried.
            return {"status": "internal", "do_not_retry": True,
                    "message": f"{DATASET_ERRORS[verdict['status']]}: {verdict.get('message')}",
                    "code": {"tests_total": plan["total"]}}
        tests: list[dict[str, Any]] = []
        for entry in verdict.get("tests", []):
            status = HARNESS_STATUSES.get(str(entry.get("status")), "wrong_answer")
            message = str(entry.get("message", ""))
            # A call the judge gave up on at its deadline, a program or reply too large for it to read; or below,
            # all the tests' time ran out.
            limit = HARNESS_LIMITS.get(status, "")
            if entry.get("status") == "total_time":
                limit = "total_time"
                message = (f"not run: {_total_time_ran_out(timeout)}" if message.startswith("not run")
                           else f"killed when {_total_time_ran_out(timeout)}")
            elif status != "ok" and candidate_status in ("memory_limit", "output_limit", "timeout"):
                status, limit, message = candidate_status, candidate_limit, candidate_message
            tests.append({"index": int(entry.get("index", len(tests))), "status": status, "limit": limit,
                          "message": message[:2000], "time_seconds": float(entry.get("time_seconds", 0.0)),
                          "stderr": _preview(candidate_outcome.stderr, 2000)})
        if any(test["limit"] in ("wall_time", "total_time") for test in tests):
            # The judge gave up on it; at a deadline the candidate's wait had moved by the whole stretch and more?
            raise_if_starved(candidate_outcome.cpu_share, candidate_outcome.wall_seconds,
                             past_stretch=verdict.get("past_stretch") is True)
        return _code_result(tests, int(verdict.get("total", plan["total"])))

    async def _math(self, job: dict[str, Any]) -> dict[str, Any]:
        outcome, verdict, message = await self.math_servers.verify(job)
        if outcome == "ok" and verdict is not None:
            return {"status": verdict.get("status", "internal"), "limit": "", "message": verdict.get("message", ""),
                    "math": verdict}
        if outcome == "timeout":
            return {"status": "timeout", "limit": "wall_time", "message": message, "math": {}}
        if outcome == "memory":
            return {"status": "memory_limit", "limit": "memory", "message": message, "math": {}}
        if outcome == "died":
            # The parser, not a model's program, crashed: a hostile answer.
            return {"status": "wrong_answer", "limit": "", "message": message, "math": {}}
        return {"status": "internal", "limit": "", "message": message, "math": {}}

    # ---- the control socket ----------------------------------------------
    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Serve one connection, request after request, until the daemon closes it.

        Only a broken stream (end of file, a malformed frame, a reset) ends
        it. Whatever serving one request raises is that request's error
        reply (see `answer`): the daemon reads a dropped connection as a
        lost sandbox, and retires it with every job and session it holds.
        The daemon withdraws a job by closing its side of the connection
        while it runs (`answer_job`); the reply still goes out.
        """
        try:
            while True:
                try:
                    request = await read_frame(reader)
                except (EOFError, ProtocolError, ConnectionError):
                    return
                stream_broken = False
                if isinstance(request, dict) and request.get("op") == "run":
                    reply, stream_broken = await self.answer_job(request, reader)
                else:
                    reply = await self.answer(request)
                writer.write(encode_reply(reply))
                await writer.drain()
                if reply.get("damaged"):
                    os._exit(71)
                if stream_broken:
                    return
        except ConnectionError:
            pass
        finally:
            writer.close()

    async def answer_job(self, request: dict[str, Any],
                         reader: asyncio.StreamReader) -> tuple[dict[str, Any], bool]:
        """`answer(request)` for a job, which the daemon withdraws by an end of file on `reader` meanwhile.

        The daemon sends nothing else while it waits for a reply, so the
        only thing a read can return before the reply is that end of file
        (its caller gave up: a client deadline, a cancelled batch). The
        job's runs are then killed and no other starts (JobWithdrawal), and the
        reply comes within milliseconds: the daemon holds the job's slot
        until it does. Anything else read there is a broken stream: the job
        is withdrawn too, and the connection ends after the reply: returns
        (reply, whether the stream is broken).
        """
        job = JobWithdrawal()
        token = CURRENT_JOB.set(job)
        try:
            answering = asyncio.ensure_future(self.answer(request))  # copies the context, and `job` with it
        finally:
            CURRENT_JOB.reset(token)
        hangup = asyncio.ensure_future(reader.read(1))
        try:
            await asyncio.wait((answering, hangup), return_when=asyncio.FIRST_COMPLETED)
            if not answering.done():
                try:
                    job.withdraw()
                except SandboxDamaged as exc:
                    self.damaged(f"withdrawing a job failed ({exc})")
        finally:
            if not hangup.done():
                hangup.cancel()
                # Its wait on the reader must end before the next frame's read starts.
                await asyncio.wait((hangup,))
        # Bytes mid-request (one of them now read) or a reset: no frame can be read from here on.
        broken = hangup.done() and not hangup.cancelled() and (hangup.exception() is not None or hangup.result() != b"")
        return await answering, broken

    async def answer(self, request: Any) -> dict[str, Any]:
        """The reply to one request, errors included: nothing but cancellation escapes."""
        try:
            if not isinstance(request, dict):
                raise BadRequest(f"a request is a JSON object, not {type(request).__name__}")
            return await self._dispatch(request)
        except SandboxDamaged as exc:
            return {"error": str(exc), "damaged": True}
        except SandboxFull as exc:
            # Not the job's doing: the daemon runs it elsewhere, and gives this sandbox no job until `room`.
            return {"error": str(exc), "full": True}
        except JobWithdrawn as exc:
            return {"error": str(exc)}
        except BadRequest as exc:
            # The daemon's request, refused on purpose where it is checked: nothing of ours to trace.
            return {"error": f"bad request: {exc}"[:MAX_ERROR_CHARS]}
        except Exception as exc:
            # A bug of ours that one request hit: that request fails, the others go on.
            op = request.get("op") if isinstance(request, dict) else None
            print(f"sandboxd-agent: internal error serving {op!r}:", file=sys.stderr, flush=True)
            traceback.print_exc()
            sys.stderr.flush()
            return {"error": f"internal error in the agent: {type(exc).__name__}: {exc}"[:MAX_ERROR_CHARS]}

    async def _dispatch(self, request: dict[str, Any]) -> dict[str, Any]:
        op = request.get("op")
        if op == "ping":
            return {"ok": True}
        if op == "hello":
            self.sandbox_id = require(request, "sandbox_id", str, default="")
            # The daemon's word: a sandbox restored from a snapshot sees another cgroup than its own (usage.VMSTAT).
            self.runner.sandbox_bytes = require(request, "memory_bytes", int, default=0) or None
            self.sandbox_pids = require(request, "pids", int, default=0)
            self.sandbox_cpus = float(require(request, "cpus", (int, float), default=0.0))
            # What its runs can have at once: what waiting behind themselves earns them nothing up to (usage.CpuShare).
            self.runner.usage.cpus = self.sandbox_cpus or 1.0
            if "uid_slot" in request:
                self.uids.place(first_job_uid(request["uid_slot"]))
            if self.private_tmp:
                lock_sticky_folders()
            # Only these need scrubbing after a run; the others are locked
            # (--private-tmp) or read-only. Checked again after every restore,
            # whose root file system may be writable where the template's was not.
            self.shared_writable = [folder for folder in SHARED_WRITABLE if _writable_by_all(folder)]
            random.seed()
            self.zygote.reseed()
            self.zygote.drop_spares()
            return {"ok": True, "languages": self.languages, "pid": os.getpid(), "landlock_abi": worker.landlock_abi()}
        if op == "prepare":
            # After hello, before the pool hands the sandbox jobs (and never
            # in a snapshot's template): what cannot be snapshotted starts
            # here, and the pool learns the reward model's state.
            if self.math.prestart_memory:
                await self.math_servers.prestart(self.math.prestart_memory)
            reply: dict[str, Any] = {"ok": True}
            if self.reward_model is not None:
                reply["reward_model"] = (await self.reward_model.run({"op": "status"}))["reward_model"]
            return reply
        if op == "room":
            return {"room": has_room(WORK_ROOT, self.runner.sandbox_bytes or 0, self.sandbox_pids,
                                     self.sandbox_cpus)}
        if op == "run":
            return {"result": await self.run_job(require(request, "job", dict))}
        if op == "session_open":
            files = decode_files(require(request, "files", list, default=[]), "files")
            opened = await sessions_module.open_session(self, require(request, "language", str), files,
                                                        require(request, "limits", dict))
            self.sessions[opened.uid] = opened
            return {"session": opened.uid}
        if op == "session_cell":
            session = self.sessions.get(require(request, "session", int))
            if session is None:
                return {"result": {"status": "gone", "message": "no such session", "alive": False}}
            try:
                result = await session.run_cell(require(request, "code", str),
                                                float(require(request, "timeout", (int, float))),
                                                require(request, "output", int))
            except Exception:
                # The daemon ends a session whose cell got no result without
                # telling us (it counts it dead): end it here too.
                self.close_session(session.uid)
                raise
            if not session.alive:
                releasing = self.close_session(session.uid)
                if session.over_files_share and releasing is not None:
                    # Its files go before the answer: a neighbour's cell that follows it finds its room.
                    await asyncio.shield(releasing)
            return {"result": result}
        if op == "session_close":
            self.close_session(require(request, "session", int))
            return {"ok": True}
        if op == "sessions_ended":
            # The daemon's look, every few seconds, for the sessions of `sessions` that ended on their own.
            ended: dict[str, str] = {}
            for handle in require(request, "sessions", list):
                session = self.sessions.get(handle) if isinstance(handle, int) else None
                why = "the sandbox no longer holds it" if session is None else session.ended_between_cells()
                if why:
                    ended[str(handle)] = why
            return {"ended": ended}
        raise BadRequest(f"unknown op {op!r}")

    def close_session(self, uid: int) -> asyncio.Future[None] | None:
        """End a session: its interpreter killed now, its uid swept and its files removed in the background
        (the returned release, None for no session).

        A session's folder can hold as many entries as the tmpfs allows; its
        removal held the Close (3 million links: more than 10 s) and with it
        every other session of the sandbox.
        """
        session = self.sessions.pop(uid, None)
        if session is None:
            return None
        session.close()
        return self.release_later(uid)


def encode_reply(reply: dict[str, Any]) -> bytes:
    """`reply` as a frame the daemon can turn into protobuf strings, which must be valid UTF-8.

    A lone surrogate (from a file name that is not UTF-8, or a message a
    job made) passes JSON, but the daemon's protobuf refused it and the
    call failed with UNKNOWN. Such strings are sent with each surrogate
    written out as its escape (\\udcff). A reply that cannot be a frame
    at all (too large) is answered as an internal error.
    """
    try:
        body = json.dumps(reply, ensure_ascii=False, separators=(",", ":")).encode()
    except UnicodeEncodeError:
        body = json.dumps(_valid_text(reply), ensure_ascii=False, separators=(",", ":")).encode()
    except (TypeError, ValueError, RecursionError) as exc:
        return _error_frame(reply, exc)
    if len(body) > MAX_FRAME_BYTES:
        return _error_frame(reply, ProtocolError(f"reply of {len(body)} bytes exceeds {MAX_FRAME_BYTES}"))
    return HEADER.pack(len(body)) + body


def _error_frame(reply: dict[str, Any], exc: BaseException) -> bytes:
    print(f"sandboxd-agent: a reply could not be sent: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
    error: dict[str, Any] = {"error": f"internal error in the agent: its reply could not be sent: "
                                      f"{type(exc).__name__}: {exc}"[:MAX_ERROR_CHARS]}
    if reply.get("damaged"):
        error["damaged"] = True
    return encode_frame(_valid_text(error))


def _valid_text(value: Any) -> Any:
    """`value` with every string made valid UTF-8 (lone surrogates escaped)."""
    if isinstance(value, str):
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, dict):
        return {_valid_text(key): _valid_text(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_valid_text(item) for item in value]
    return value


_T = TypeVar("_T")


async def _off_loop(call: Callable[..., _T], *args: Any) -> _T:
    """`call(*args)`, once, in a thread, off the event loop; on the loop where no thread can start.

    A thread counts against the sandbox's pids limit, which concurrent runs
    can fill: a removal that failed for that retired the whole sandbox. The
    executor queues the call before it starts a thread, so when the start
    fails the call is still queued: whichever of the loop and a worker comes
    first runs it, and the other only waits for its result (run twice, a
    removal hit a folder that was by then another job's).
    """
    outcome: concurrent.futures.Future[_T] = concurrent.futures.Future()
    claim = threading.Lock()

    def once() -> None:
        if not claim.acquire(blocking=False):
            return
        try:
            outcome.set_result(call(*args))
        except BaseException as exc:
            outcome.set_exception(exc)

    try:
        asyncio.get_running_loop().run_in_executor(None, once)
    except RuntimeError:  # "can't start new thread"
        once()
    return await asyncio.wrap_future(outcome)


# Of a run's memory limit, what a managed runtime's heap may take: the rest is
# its code, stacks and collector.
HEAP_SHARE = 0.75


def _sized_to(argv: list[str], limit: int, env: dict[str, str]) -> list[str]:
    """`argv` of a run held to `limit` by its peak resident memory, with its runtime told that limit.

    Left to their defaults, the JVM sizes its heap from the container's
    memory (a quarter of 2 GiB), Node's V8 from the host's, and Go lets
    garbage reach twice the live heap: a correct program that allocates
    freely would be judged over the limit instead of collecting.
    """
    if argv[0] == "java":
        return [argv[0], f"-XX:MaxRAM={limit}", f"-XX:MaxRAMPercentage={HEAP_SHARE * 100:g}", *argv[1:]]
    if argv[0] == "node":
        return [argv[0], f"--max-old-space-size={max(16, int(limit * HEAP_SHARE) >> 20)}", *argv[1:]]
    # A soft limit on the runtime's own memory, which the binary's pages come on top of: at the full limit a
    # loaded host's run peaked 1 MiB over it.
    env["GOMEMLIMIT"] = f"{int(limit * HEAP_SHARE)}B"
    return argv


@dataclass(frozen=True)
class TmpUsage:
    """One look at a file system (/tmp): its size and entries, what is used, and what the folder `own` holds of it.

    A file system with no cap on bytes or entries (size or nr_inodes 0) is
    never counted full on that one.
    """

    size: int
    used_bytes: int
    entries: int
    used_entries: int
    own_bytes: int = 0
    own_entries: int = 0

    @classmethod
    def read(cls, root: str, own: str | None = None) -> TmpUsage:
        """The usage of `root`'s file system; `own` is walked (a thread's work: up to tmpfs_inodes entries)."""
        fs = os.statvfs(root)
        own_bytes, own_entries = usage_of(own) if own else (0, 0)
        return cls(fs.f_blocks * fs.f_frsize, (fs.f_blocks - fs.f_bfree) * fs.f_frsize, fs.f_files,
                   fs.f_files - fs.f_ffree, own_bytes, own_entries)

    def _reaches(self, nbytes: int, entries: int, share: float) -> bool:
        return (self.size > 0 and nbytes >= share * self.size) or (self.entries > 0 and entries >= share * self.entries)

    def others_hold(self) -> bool:
        """Whether what is outside `own` takes NEIGHBOURS_SHARE of the bytes or the entries."""
        return self._reaches(self.used_bytes - self.own_bytes, self.used_entries - self.own_entries, NEIGHBOURS_SHARE)

    def filled_alone(self) -> bool:
        """Whether `own` takes NEIGHBOURS_SHARE of the bytes or entries, and the rest does not."""
        return self._reaches(self.own_bytes, self.own_entries, NEIGHBOURS_SHARE) and not self.others_hold()

    def starved(self) -> bool:
        """Whether what is free plus what `own` holds is under STARVED_SHARE (bytes or entries).

        A compile that got ENOSPC with more than that within reach ran out of
        its own accord, or only says it did.
        """
        free_bytes, free_entries = self.size - self.used_bytes, self.entries - self.used_entries
        return ((self.size > 0 and free_bytes + self.own_bytes < STARVED_SHARE * self.size)
                or (self.entries > 0 and free_entries + self.own_entries < STARVED_SHARE * self.entries))


def neighbours_hold(root: str, own: str | None) -> bool:
    """Whether what is on `root`'s file system outside the folder `own` takes NEIGHBOURS_SHARE of it."""
    return TmpUsage.read(root, own).others_hold()


def has_room(root: str, memory_bytes: int = 0, pids: int = 0, cpus: float = 0.0) -> bool:
    """Whether jobs can come back: less than NEIGHBOURS_SHARE of `root`'s file system's bytes and entries, and of
    the sandbox's `memory_bytes` (a run the OOM killer took: runner.crowded_out) and `pids`, is used, and at most
    RUNNABLE_PER_CPU job threads per CPU of `cpus` wait to run (a run starved: runner.starved_out). 0: unknown."""
    if neighbours_hold(root, None):
        return False
    if cpus and usage.runnable_job_tasks() > RUNNABLE_PER_CPU * max(1.0, cpus):
        return False
    if not memory_bytes and not pids:
        return True
    held, tasks = usage.sandbox_usage()
    return not ((memory_bytes and held >= NEIGHBOURS_SHARE * memory_bytes)
                or (pids and tasks >= NEIGHBOURS_SHARE * pids))


def decode_base64(value: Any, what: str) -> bytes:
    if not isinstance(value, str):
        raise BadRequest(f"{what} must be base64 text, not {type(value).__name__}")
    try:
        return base64.b64decode(value, validate=True)
    except binascii.Error as exc:
        raise BadRequest(f"{what} is not base64: {exc}") from None


def decode_files(items: Any, what: str) -> list[tuple[str, bytes]]:
    """[(path, content)] from a request's [{"path", "content" (base64)}]; BadRequest for any other shape."""
    if not isinstance(items, list):
        raise BadRequest(f"{what} must be a list, not {type(items).__name__}")
    files = []
    for index, item in enumerate(items):
        where = f"{what}[{index}]"
        if not isinstance(item, dict):
            raise BadRequest(f"{where} must be an object, not {type(item).__name__}")
        files.append((require(item, "path", str, what=where),
                      decode_base64(require(item, "content", str, what=where), f"{where}.content")))
    return files


# What the agent reads of a job of each kind before its own code takes over: a request that lacks one is refused as
# a bad request (the daemon's fault, jobs.py), while a KeyError past these checks is a bug of ours. A reward-model
# job is its host's to check (it also carries the host's own ops).
JOB_FIELDS: dict[str, dict[str, type | tuple[type, ...]]] = {
    "execute": {"program": dict, "limits": dict},
    "code": {"program": dict, "limits": dict, "plan": dict},
    "math": {"completion": str, "ground_truth": str, "limits": dict},
    "reward_model": {},
}


def validate_job(job: dict[str, Any]) -> str:
    """The job's kind, once the fields JOB_FIELDS names are there with their types; BadRequest where not."""
    kind = require(job, "kind", str, what="job")
    fields = JOB_FIELDS.get(kind)
    if fields is None:
        raise BadRequest(f"unknown job kind {kind!r}")
    for name, kinds in fields.items():
        require(job, name, kinds, what="job")
    if "limits" in fields:
        require(job["limits"], "timeout", (int, float), what="job.limits")
    if kind == "code":
        require(job["limits"], "total_timeout", (int, float), what="job.limits")
    if "program" in fields:
        require(job["limits"], "output", int, what="job.limits")
        require(job["program"], "language", str, what="job.program")
        require(job["program"], "code", str, what="job.program")
    if "plan" in fields:
        require(job["plan"], "kind", str, what="job.plan")
        require(job["plan"], "total", int, what="job.plan")
    if kind == "code" and job.get("assembly") is not None:
        require(job, "assembly", dict, what="job")
        for name in ("head", "prompt", "prompt_head", "entry_point"):
            require(job["assembly"], name, str, what="job.assembly")
    return kind


def _has_entries(folder: str) -> bool:
    """Whether `folder` holds anything, from its first entry alone."""
    try:
        with os.scandir(folder) as entries:
            return next(entries, None) is not None
    except FileNotFoundError:
        return False


def _writable_by_all(folder: str) -> bool:
    try:
        return bool(os.stat(folder).st_mode & stat.S_IWOTH) and not os.statvfs(folder).f_flag & os.ST_RDONLY
    except OSError:
        return False


def _test_entry(index: int, status: str, limit: str, message: str, outcome: RunOutcome) -> dict[str, Any]:
    return {
        "index": index,
        "status": status,
        "limit": limit,
        "message": message,
        "time_seconds": outcome.wall_seconds,
        "stdout": _preview(outcome.stdout),
        "stderr": _preview(outcome.stderr),
    }


def _total_time_ran_out(seconds: float) -> str:
    return f"the job's {seconds:g} s for all its tests ran out"


def _code_result(tests: list[dict[str, Any]], total: int, *, status: str = "", limit: str = "",
                 message: str = "") -> dict[str, Any]:
    passed = sum(1 for t in tests if t["status"] == "ok")
    if not status:
        failures = [t for t in tests if t["status"] != "ok"]
        if not failures and passed == total:
            status = "ok"
        elif failures:
            first = failures[0]
            status, limit, message = first["status"], first.get("limit", ""), first.get("message", "")
        else:
            status = "wrong_answer"
    return {"status": status, "limit": limit, "message": message, "tests": tests,
            "code": {"tests_passed": passed, "tests_total": total}}


def available_languages(toolchains: dict[str, str]) -> list[str]:
    return sorted(lang for lang, binary in toolchains.items() if shutil.which(binary))


async def serve(socket_path: str, zygote_process: tuple[socket.socket, int], toolchains: dict[str, str],
                reward_model: dict[str, Any] | None = None, math: MathSettings | None = None, *,
                private_tmp: bool = False) -> None:
    """Run the agent until SIGTERM.

    zygote_process: the zygote's channel and pid, from zygote.spawn (which the
    entry point calls before it imports this module). private_tmp: jobs get
    no shared place on disk to leave files (/tmp and the image's sticky folders root-only).
    """
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    if private_tmp:
        # Docker 20.10 ignores mode= in --tmpfs options and mounts 1777. (The
        # sticky folders on the root file system are locked at hello, the only
        # time they can be: a cold start's root is read-only.)
        os.chmod("/tmp", 0o755)
    os.makedirs(WORK_ROOT, mode=0o711, exist_ok=True)
    os.chmod(WORK_ROOT, 0o711)
    zygote = Zygote(*zygote_process)
    controller = Controller(zygote, available_languages(toolchains), math, private_tmp=private_tmp)
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGCHLD, controller.reap)
    await zygote.ready
    if reward_model is not None:
        # Loaded before the socket exists: the sandbox is ready (and snapshotted) with its model.
        controller.reward_model = RewardModelHost(reward_model)
        await controller.reward_model.start()
    folder = os.path.dirname(socket_path)
    os.makedirs(folder, exist_ok=True)
    os.chmod(folder, 0o700)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(socket_path)
    server = await asyncio.start_unix_server(controller.handle, path=socket_path)
    os.chmod(socket_path, 0o600)
    print(f"sandboxd-agent: ready on {socket_path}", flush=True)
    stop: asyncio.Future[None] = loop.create_future()

    def on_sigterm() -> None:
        if not stop.done():
            stop.set_result(None)

    loop.add_signal_handler(signal.SIGTERM, on_sigterm)
    async with server:
        await stop
