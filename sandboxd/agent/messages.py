"""The control socket's messages: each op's request (the daemon builds it) and reply (the controller builds it).

Declared once for both ends: the daemon's sandbox.py, sessions.py and
pool.py send these requests, and the controller's handlers (host/controller.py,
`Controller.ops`) return these replies, so that mypy checks each side's keys
against the same declaration. A request arrives at the agent as untrusted
JSON: the controller reads its fields with protocol.require, which checks
each one's type, rather than trusting the declaration.

What a `run` carries (the job: `Job`, one shape per kind) and answers (its
`JobResult`) is declared here too: sandboxd/jobs.py builds jobs and reads
results, agent/host/jobs.py checks a job (validate_job) and runs it. So are
the requests the host sends its forked judges and math servers
(`JudgeRequest`, `MathRequest`), and `SandboxFull`, the one error both ends
name: the agent raises it, answers it as `ErrorReply.full`, and the daemon
raises it again from that reply (sandboxd.errors.SandboxFull).
"""

from __future__ import annotations

from typing import Any, Literal, NotRequired, Required, TypedDict


class SandboxFull(Exception):
    """A job found no room here that it is not to blame for: run it elsewhere, and give this sandbox no job until
    it has room again (the `room` op).

    In the agent: /tmp that other runs of the sandbox hold
    (host/tmpspace.NEIGHBOURS_SHARE), no pid left to fork a worker with (the
    sandbox's pids limit), memory or CPU that its neighbours took. The
    controller answers it as an ErrorReply with `full`; the daemon raises
    sandboxd.errors.SandboxFull, this class with the gRPC code of a lost
    sandbox's job, from that reply (sandbox.Sandbox.request).
    """


class FileItem(TypedDict):
    """A file of a job or session: its relative path, and its content in base64."""

    path: str
    content: str


class PingRequest(TypedDict):
    op: Literal["ping"]


class HelloRequest(TypedDict):
    """After a start or a restore: the sandbox's name and uid slot, and the limits a restored agent cannot read."""

    op: Literal["hello"]
    sandbox_id: str
    uid_slot: int
    memory_bytes: int
    pids: int
    cpus: float


class PrepareRequest(TypedDict):
    op: Literal["prepare"]


class RoomRequest(TypedDict):
    op: Literal["room"]


class RunRequest(TypedDict):
    op: Literal["run"]
    job: Job


class SessionOpenRequest(TypedDict):
    op: Literal["session_open"]
    language: str
    files: list[FileItem]
    limits: SessionLimits


class SessionCellRequest(TypedDict):
    op: Literal["session_cell"]
    session: int
    code: str
    timeout: float
    output: int
    # A final cell: the session's processes killed, the cell run in a fresh process, the session ended.
    final: NotRequired[bool]


class SessionCloseRequest(TypedDict):
    op: Literal["session_close"]
    session: int


class SessionsEndedRequest(TypedDict):
    op: Literal["sessions_ended"]
    sessions: list[int]


Request = (PingRequest | HelloRequest | PrepareRequest | RoomRequest | RunRequest | SessionOpenRequest
           | SessionCellRequest | SessionCloseRequest | SessionsEndedRequest)


class OkReply(TypedDict):
    """`ping` and `session_close`."""

    ok: bool


class HelloReply(TypedDict):
    ok: bool
    languages: list[str]
    pid: int
    landlock_abi: int


class PrepareReply(TypedDict):
    ok: bool
    # In a reward-model sandbox: the model's state (loaded, or why not).
    reward_model: NotRequired[dict[str, Any]]


class RoomReply(TypedDict):
    room: bool


class RunReply(TypedDict):
    result: JobResult


class ResultReply(TypedDict):
    """`session_cell`: the cell's result."""

    result: dict[str, Any]


class SessionOpenReply(TypedDict):
    # The session's handle, which is also its uid.
    session: int


class SessionsEndedReply(TypedDict):
    # Handle (as text: a JSON object's key) -> why it ended.
    ended: dict[str, str]


class ErrorReply(TypedDict):
    """Any op that failed: `damaged` retires the sandbox, `full` sends the job elsewhere (SandboxFull)."""

    error: str
    damaged: NotRequired[bool]
    full: NotRequired[bool]


Reply = (OkReply | HelloReply | PrepareReply | RoomReply | RunReply | ResultReply | SessionOpenReply
         | SessionsEndedReply)


# The `run` op's job, one shape per kind: sandboxd/jobs.py builds them (prepare), agent/host/jobs.py reads them
# once validate_job has checked the fields it relies on.


class JobLimits(TypedDict):
    """A job's limits, the daemon's defaults filled in (jobs.resolve_limits)."""

    # Seconds of one run (of each case of a code job).
    timeout: float
    memory: int
    # Bytes of stdout, and of stderr, that a run may write.
    output: int
    # Seconds for all of a code job's cases.
    total_timeout: float


class Program(TypedDict):
    """The candidate's program and how to build and run it (code.Language, resolved by the daemon)."""

    language: str
    code: str
    # Where the code is written, relative to the run's work dir.
    source: str
    compile: list[str] | None
    run: list[str]
    # Values may name "{workdir}" (code.expand_env).
    env: dict[str, str]
    compile_timeout: float
    # False for runtimes that reserve far more address space than they use: held by their peak memory instead.
    address_space_limit: bool


class PlanStdioCase(TypedDict):
    stdin: str
    expected_stdout: str


class Plan(TypedDict):
    """A code job's tests as the agent runs them (jobs.plan_to_agent): its stdio cases, or how many the judge has."""

    # "stdio", "function" or "assert" (code.TestPlan.kind).
    kind: str
    stdio: list[PlanStdioCase]
    total: int


# How the candidate's and the judge's processes assemble a HumanEval program from the completion
# (code.program_assembly -> code.assemble): the code verifier's own value, which the agent only carries. A
# str -> str mapping, as code.assemble and python.harness.run_tests take it; validate_job checks these keys.
Assembly = dict[str, str]
ASSEMBLY_KEYS = ("head", "prompt", "prompt_head", "entry_point")


class HarnessCase(TypedDict):
    """A function-call case, as python.harness.run_tests takes one (code.FunctionCase's fields)."""

    args: list[Any]
    expected: Any
    unwrap_single: bool
    int_keys: bool


class HarnessArguments(TypedDict):
    """The daemon's keyword arguments for python.harness.run_tests in the judge (jobs.harness_arguments)."""

    assert_code: str
    entry_point: str
    fn_name: str
    cases: list[HarnessCase]
    setup_code: str
    tolerance: float
    stop_on_first_failure: bool
    # Assert tests of a plan small enough that the daemon keeps it: the top-level names its own code binds
    # (code.TestPlan.own_names), and those of what goes before a completion (head_names; absent when that does
    # not parse alone). A judge parses them itself otherwise.
    own_names: NotRequired[list[str]]
    head_names: NotRequired[list[str]]


class ExecuteJob(TypedDict):
    kind: Literal["execute"]
    program: Program
    limits: JobLimits
    # base64
    stdin: str
    args: list[str]
    files: list[FileItem]
    # Paths, relative to the work dir, whose files come back in the result.
    collect_files: list[str]


class CodeJob(TypedDict):
    kind: Literal["code"]
    program: Program
    limits: JobLimits
    plan: Plan
    # A stdio case's checker (code.compare_stdout).
    checker: str
    tolerance: float
    stop_on_first_failure: bool
    # A HumanEval prompt's job: the program is the bare completion, assembled in the sandbox.
    assembly: NotRequired[Assembly]
    # Function-call and assert tests (not stdio).
    harness: NotRequired[HarnessArguments]


class MathJob(TypedDict):
    kind: Literal["math"]
    completion: str
    ground_truth: str
    # A math.verify extraction mode.
    extraction: str
    tolerance: float
    limits: JobLimits


class RewardModelJob(TypedDict):
    kind: Literal["reward_model"]
    prompt: str
    completion: str
    limits: JobLimits


Job = ExecuteJob | CodeJob | MathJob | RewardModelJob


class SessionLimits(JobLimits):
    """A session's: a job's limits (`timeout` is a cell's default), and the session's own."""

    # Seconds the session's interpreter may live (sessions.max_lifetime_seconds).
    lifetime: float
    # Of the sandbox's /tmp, what the session may keep between cells (1 / sessions.per_sandbox).
    tmpfs_share: float


# What the host sends its forked processes for a job.


class JudgeArguments(HarnessArguments, total=False):
    """All of python.harness.run_tests's keyword arguments that the judge is given: the daemon's, and the host's."""

    # Seconds of one call of the candidate: the job's timeout.
    call_timeout: Required[float]
    # The tests' working directory, shared with the candidate.
    files: Required[str]
    # Assert tests: the candidate's program, whose top-level names the judge binds.
    program: str
    assembly: Assembly
    # Set where the job's total time ends the tests before each call's timeout could.
    time_for_all: float


class JudgeRequest(TypedDict):
    """A function-call or assert job, host/jobs.py -> forked/judgeserver.py."""

    plan_kind: str
    harness: JudgeArguments
    # The job's memory limit: what the judge may take for the tests too.
    memory_budget: int


class MathRequest(TypedDict):
    """A math job's answer to verify, host/mathservers.py -> forked/mathserver.py (math.verify's arguments)."""

    completion: str
    ground_truth: str
    extraction: str
    tolerance: float


# The `run` op's result: agent/host/jobs.py builds it, jobs.to_result reads it. Statuses and limits are the
# names jobs.MODEL_STATUSES and jobs.LIMITS derive from the proto's enums ("" for no limit).


class CaseResult(TypedDict):
    """One test of a code job."""

    index: int
    status: str
    limit: str
    message: str
    time_seconds: float
    # A stdio case's output (the harness's tests have none of their own).
    stdout: NotRequired[str]
    stderr: str


class ExecuteResult(TypedDict):
    exit_code: int
    # base64, as are the files' contents.
    stdout: str
    stderr: str
    stdout_truncated: NotRequired[bool]
    stderr_truncated: NotRequired[bool]
    files: NotRequired[list[FileItem]]


class CodeResult(TypedDict):
    tests_total: int
    tests_passed: NotRequired[int]
    compile_output: NotRequired[str]


class MathResult(TypedDict, total=False):
    """math.verify's verdict; empty where none came (a timeout, the server's death)."""

    status: str
    message: str
    extracted_answer: str
    # The rule that matched.
    extraction: str
    parsed_answer: str
    parsed_ground_truth: str


class RewardModelResult(TypedDict):
    model: str
    device: str
    # A scored job's.
    raw_score: NotRequired[float]


class JobResult(TypedDict):
    """A job's verdict: `status` always; the part of its kind where it got that far."""

    status: str
    limit: NotRequired[str]
    message: NotRequired[str]
    # The same job would fail the same way anywhere (the dataset's tests are broken): no retry.
    do_not_retry: NotRequired[bool]
    tests: NotRequired[list[CaseResult]]
    execute: NotRequired[ExecuteResult]
    code: NotRequired[CodeResult]
    math: NotRequired[MathResult]
    # A reward-model job's; the model's state (RewardModelHost.status) for a job frame's `status` op.
    reward_model: NotRequired[RewardModelResult | dict[str, Any]]
    # Seconds the agent took, set for every job it ran.
    run_seconds: NotRequired[float]
