"""The job kinds: execute, code (stdin/stdout cases, or the two-process Python harness), math, reward model.

A job runs under a uid of its own that the JobHost hands out and takes
back after the reply; what a kind needs of the sandbox beyond that (the
resident judges, the math servers, the reward model) it is given.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import os
import resource
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, cast

from sandboxd.agent.host.cleanup import kill_uid, sigkill_uid
from sandboxd.agent.host.jobhost import DEFAULT_RLIMITS, JobHost
from sandboxd.agent.host.judgeservers import JudgeServers
from sandboxd.agent.host.mathservers import MathServers
from sandboxd.agent.host.offloop import off_loop
from sandboxd.agent.host.rewardmodel import RewardModelHost
from sandboxd.agent.host.runner import RunOutcome, RunSpec, classify, crowded_out, raise_if_starved
from sandboxd.agent.host.tmpspace import TmpUsage
from sandboxd.agent.host.tree import read_tree_file
from sandboxd.agent.messages import (
    ASSEMBLY_KEYS,
    CaseResult,
    CodeJob,
    ExecuteJob,
    FileItem,
    Job,
    JobLimits,
    JobResult,
    JudgeArguments,
    JudgeRequest,
    MathJob,
    Program,
    SandboxFull,
)
from sandboxd.agent.protocol import DEADLINE_STRETCH, BadRequest, require
from sandboxd.verifiers.code import compare_stdout

TEXT_PREVIEW_BYTES = 4096
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
# How long a candidate whose judge has its verdict has to end on the end of file it reads, before it is killed.
CANDIDATE_EOF_SECONDS = 0.1
COLLECT_TOTAL_BYTES = 24 << 20
# strerror(ENOSPC), as compilers print it (Go in lower case).
NO_SPACE = b"no space left on device"
# python.harness verdicts that are about the dataset's tests, not the candidate.
DATASET_ERRORS = {
    "setup_error": "the dataset's setup code failed",
    "no_calls": "the dataset's tests check nothing",
    "unsupported": "the dataset's tests need what the harness does not provide",
}
# python.harness test statuses -> ours. A candidate that exits or breaks the
# protocol mid-test ("died": sys.exit(0), os._exit) failed that test. One
# whose program or reply was too large for the judge to read ("memory":
# python.harness.TooLargeForJudge) failed it at the memory limit.
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


# A job of one kind (messages.Job), for what runs each kind the same way.
KindOfJob = TypeVar("KindOfJob", ExecuteJob, CodeJob)


def _preview(data: bytes, limit: int = TEXT_PREVIEW_BYTES) -> str:
    return data[:limit].decode("utf-8", errors="replace")


class Jobs:
    """Runs a job of each kind; `reward_model` is set in a reward-model sandbox."""

    def __init__(self, host: JobHost, judges: JudgeServers, math_servers: MathServers) -> None:
        self.host = host
        self.judges = judges
        self.math_servers = math_servers
        self.reward_model: RewardModelHost | None = None

    def _program_spec(self, program: Program, limits: JobLimits, uid: int, workdir: str,
                      stdin: bytes, args: list[str]) -> RunSpec:
        """A run of the candidate's program: in-process Python or an exec'd binary."""
        common: dict[str, Any] = {
            "uid": uid,
            "cwd": workdir,
            "timeout": limits["timeout"],
            "output_limit": limits["output"],
            "stdin": stdin,
            "env": self.host.env(workdir, program.get("env")),
            "memory_limit": int(limits.get("memory") or 0),
        }
        if program["language"] == "python":
            return RunSpec(mode="python", code=program["code"], argv=[program.get("source", "main.py"), *args],
                           rlimits=self.host.rlimits(limits, address_space=True), **common)
        address_space = program.get("address_space_limit", True)
        peak_memory_limit = 0 if address_space else int(limits.get("memory") or 0)
        argv = [*program["run"], *args]
        if peak_memory_limit:
            argv = _sized_to(argv, peak_memory_limit, common["env"])
        rlimits = self.host.rlimits(limits, address_space=address_space)
        rlimits["stack"] = RUN_STACK_LIMIT
        return RunSpec(mode="exec", argv=argv, rlimits=rlimits, peak_memory_limit=peak_memory_limit, **common)

    async def _compile(self, program: Program, limits: JobLimits, uid: int,
                       workdir: str) -> tuple[bool, str, float]:
        """Write the source and compile it once; (ok, compiler output, seconds)."""
        if program["language"] == "python":
            return True, "", 0.0  # runs in-process from the code itself
        await self.host.write_files(workdir, uid, [(program.get("source", "main.py"), program["code"].encode())])
        compile_argv = program.get("compile")
        if not compile_argv:
            return True, "", 0.0
        spec = RunSpec(
            mode="exec", uid=uid, cwd=workdir, argv=compile_argv,
            timeout=program.get("compile_timeout", 30.0), output_limit=64 << 10,
            rlimits=dict(DEFAULT_RLIMITS, nproc=512), env=self.host.env(workdir, program.get("env")),
            memory_limit=COMPILE_MEMORY_BYTES, output_over_limit_dropped=True,
        )
        outcome = await self.host.runner.run(spec)
        if outcome.exit_code and crowded_out(outcome, COMPILE_MEMORY_BYTES, self.host.runner.sandbox_bytes):
            # cc1plus, rustc's or javac's JVM taken by the OOM killer while
            # another run filled the sandbox: the driver reports "Killed".
            raise SandboxFull(f"the sandbox ran out of memory while compiling (the compiler held "
                              f"{outcome.held_bytes >> 20} MiB); the out-of-memory killer took it")
        if outcome.exit_code and not outcome.killed_for and NO_SPACE in (outcome.stderr + outcome.stdout).lower():
            # The compiler's words are the candidate's to write (`#error No space left on device`):
            # only a /tmp that really left this job no room, the others holding it, makes them an excuse.
            tmp = await off_loop(TmpUsage.read, self.host.work_root, workdir)
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


    async def run(self, request: dict[str, Any]) -> JobResult:
        """The result of the `run` op's job (untrusted JSON: validate_job checks it first)."""
        job = validate_job(request)
        started = time.monotonic()
        if job["kind"] == "execute":
            result = await self._under_own_uid(self._execute, job)
        elif job["kind"] == "code":
            result = await self._under_own_uid(self._code, job)
        elif job["kind"] == "math":
            result = await self._math(job)
        elif job["kind"] == "reward_model" and self.reward_model is not None:
            # The request itself: it may also be one of the reward model host's own ops (`status`).
            result = await self.reward_model.run(request)
        else:
            raise BadRequest(f"no {job['kind']!r} jobs here")
        result["run_seconds"] = time.monotonic() - started
        return result

    async def _under_own_uid(self, body: Callable[[KindOfJob, int, list[RunOutcome]], Awaitable[JobResult]],
                             job: KindOfJob) -> JobResult:
        """`body(job, uid, runs)` under a uid of its own, which is released after the reply.

        `body` appends a run that may still be exiting to `runs` (Runner.run,
        settle=False). The shared folders are cleaned before the reply: by
        then no process of the job can add a file (Runner.run).
        """
        uid = self.host.uids.take()
        runs: list[RunOutcome] = []
        try:
            result = await body(job, uid, runs)
            await self.host.remove_shared_files(uid)
        except BaseException:
            self.host.release_later(uid, runs)
            raise
        self.host.release_later(uid, runs, shared_files_removed=True)
        return result

    async def _execute(self, job: ExecuteJob, uid: int, runs: list[RunOutcome]) -> JobResult:
        program, limits = job["program"], job["limits"]
        workdir = await self.host.make_workdir(uid)
        await self.host.write_files(workdir, uid, decode_files(job.get("files", []), "job.files"))
        ok, compile_output, _ = await self._compile(program, limits, uid, workdir)
        if not ok:
            return {"status": "compile_error", "message": "compilation failed",
                    "execute": {"exit_code": 1, "stdout": "", "stderr": base64.b64encode(
                        compile_output.encode()).decode()}}
        spec = self._program_spec(program, limits, uid, workdir,
                                  decode_base64(job.get("stdin", ""), "job.stdin"), job.get("args", []))
        # Files are collected after the run's processes are gone.
        outcome = await self.host.runner.run(spec, settle=bool(job.get("collect_files")))
        runs.append(outcome)
        status, limit, message = classify(outcome, spec)
        files: list[FileItem] = []
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

    async def _code(self, job: CodeJob, uid: int, runs: list[RunOutcome]) -> JobResult:
        program, limits, plan = job["program"], job["limits"], job["plan"]
        workdir = await self.host.make_workdir(uid)
        ok, compile_output, _ = await self._compile(program, limits, uid, workdir)
        if not ok:
            return {"status": "compile_error", "message": "compilation failed",
                    "code": {"compile_output": compile_output, "tests_total": plan["total"]}}
        if plan["kind"] == "stdio":
            tests: list[CaseResult] = []
            ran_out = _total_time_ran_out(limits["total_timeout"])
            # The compile step has its own limit; the job's time starts here.
            job_started = time.monotonic()
            job_deadline = job_started + limits["total_timeout"]
            for index, case in enumerate(plan["stdio"]):
                if runs:
                    await self.host.runner.settle(runs.pop())
                    await kill_uid(uid, self.host.reap)
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
                outcome = await self.host.runner.run(spec, settle=False)
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

    async def _python_harness(self, job: CodeJob, uid: int, workdir: str) -> JobResult:
        """Function-call and assert tests: the candidate in a fresh process, the judge a resident one, two uids."""
        plan, limits = job["plan"], job["limits"]
        candidate_end, judge_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        # Where the runner keeps the time others keep the candidate off the CPU, for the judge's deadlines to move by.
        cpu_credit_fd = os.memfd_create("sandboxd-cpu-credit", os.MFD_CLOEXEC)
        cases = max(1, plan["total"])
        # The judge calls the candidate once per case: the deadline covers them all.
        timeout = min(limits["timeout"] * cases, limits["total_timeout"])
        capped = timeout < limits["timeout"] * cases
        run_limits: JobLimits = {**limits, "timeout": timeout}
        # The files a test writes for the program (tmp_path, tempfile, a relative path) and those the program writes
        # for the test: the candidate's folder is the tests' working directory too, shared with its judge's group
        # only, for this job (python.remote.share_files keeps each side's files usable by the other's uid).
        harness: JudgeArguments = {**job["harness"], "call_timeout": limits["timeout"], "files": workdir}
        # A HumanEval prompt's program is assembled by the candidate and by the judge (code.assemble).
        assembly = job.get("assembly")
        if plan["kind"] == "assert":
            # The judge parses it for the names the tests may call (python.harness.run_tests), on this job's time.
            harness["program"] = job["program"]["code"]
            if assembly is not None:
                harness["assembly"] = assembly
        # Where the job's total time is what runs out, the judge keeps that clock itself and answers with
        # the verdicts of the tests before it (a fraction reward counts them); the candidate and the judge
        # get JUDGE_GRACE more, so that it is the judge's clock that ends the tests, not their kill.
        grace = JUDGE_GRACE_SECONDS if capped else 0.0
        if capped:
            harness["time_for_all"] = timeout

        def share(judge_uid: int) -> None:
            os.chown(workdir, -1, judge_uid)
            os.chmod(workdir, 0o2770)

        try:
            candidate = RunSpec(
                mode="py_callee", uid=uid, cwd=workdir, code=job["program"]["code"], assembly=assembly,
                implicit_imports=plan["kind"] == "function", timeout=timeout + grace,
                output_limit=limits["output"], rlimits=self.host.rlimits(run_limits, address_space=True),
                env=self.host.env(workdir), peer=candidate_end, memory_limit=int(limits.get("memory") or 0),
                cpu_credit_fd=cpu_credit_fd, share_files=True,
            )
            # The judge may use as much memory for the tests as the job may for the program: a performance test's
            # 3 million ints cost the judge about 180 MiB to build and send (judgeserver.JOB_MEMORY_BYTES at least).
            request: JudgeRequest = {"plan_kind": plan["kind"], "harness": harness,
                                     "memory_budget": int(limits.get("memory") or 0)}
            candidate_task = asyncio.ensure_future(self.host.runner.run(candidate))
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
            # Closed first: a candidate not yet launched when the judge
            # answered (no one to signal yet) then reads end of file and exits.
            judge_end.close()
            if no_room is None and _candidate_idle(verdict):
                # Its judge is done and it waits for a request: the end of file the judge sent ends it
                # (python.candidate), and the run's end sweeps its uid. A sweep to kill it first would look at
                # every process of the sandbox for nothing (about 0.1 ms of the agent's CPU a job).
                await asyncio.wait([candidate_task], timeout=CANDIDATE_EOF_SECONDS)
            # The judge is done: whatever the candidate still does is moot,
            # and its death by our SIGKILL says nothing about it. The run
            # waits for the worker's exit, then sweeps the uid until empty.
            killed_by_us = not candidate_task.done()
            candidate.ended_by_caller = killed_by_us
            if killed_by_us:
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
            if not (await off_loop(TmpUsage.read, self.host.work_root, workdir)).filled_alone():
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
        tests: list[CaseResult] = []
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

    async def _math(self, job: MathJob) -> JobResult:
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

    @staticmethod
    def _collect_file(workdir: str, relpath: str) -> bytes | None:
        try:
            return read_tree_file(workdir, relpath, FILE_COLLECT_BYTES)
        except (OSError, BadRequest):
            return None  # missing, a link, a folder, a fifo...: left out, as the proto says


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


def validate_job(job: dict[str, Any]) -> Job:
    """The job, once the fields JOB_FIELDS names are there with their types; BadRequest where not.

    Returned as its kind's declared shape (messages.Job), which is the daemon's word for the rest: a field
    read past these checks is read with a default or checked where it is read (decode_files).
    """
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
        for name in ASSEMBLY_KEYS:
            require(job["assembly"], name, str, what="job.assembly")
    return cast("Job", job)


def _test_entry(index: int, status: str, limit: str, message: str, outcome: RunOutcome) -> CaseResult:
    return {
        "index": index,
        "status": status,
        "limit": limit,
        "message": message,
        "time_seconds": outcome.wall_seconds,
        "stdout": _preview(outcome.stdout),
        "stderr": _preview(outcome.stderr),
    }


def _candidate_idle(verdict: object) -> bool:
    """Whether a judge's verdict leaves its candidate waiting for a request: no call of it was given up on."""
    if not isinstance(verdict, dict) or verdict.get("candidate_died"):
        return False
    tests = verdict.get("tests")
    return isinstance(tests, list) and not any(
        isinstance(test, dict) and test.get("status") in ("timeout", "total_time") for test in tests)


def _total_time_ran_out(seconds: float) -> str:
    return f"the job's {seconds:g} s for all its tests ran out"


def _code_result(tests: list[CaseResult], total: int, *, status: str = "", limit: str = "",
                 message: str = "") -> JobResult:
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
