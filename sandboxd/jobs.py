"""Between the API and the agent: validate a Job, build the agent's job, score the result.

Everything about a request that can be wrong is found here, before the job
takes a place in the queue, and reported as InvalidRequest (INVALID_ARGUMENT)
with the field that is wrong. Results go the other way: the agent's verdict
becomes a JobResult whose reward is never NaN and whose status says whose
fault a failure was.
"""

from __future__ import annotations

import base64
import functools
import itertools
import json
import logging
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

from sandboxd_client._proto.sandboxd.v1 import sandboxd_pb2 as pb

from sandboxd import rewardpool
from sandboxd.agent import messages
from sandboxd.agent.protocol import MAX_FRAME_BYTES
from sandboxd.config import Config
from sandboxd.errors import InvalidRequest, SandboxdError, Unsupported
from sandboxd.pool import MATH_POOL
from sandboxd.verifiers import code as code_verifier
from sandboxd.verifiers import rewardmodel as reward_model_verifier

log = logging.getLogger("sandboxd.jobs")

DEFAULT_FAILURE_VALUE = -1.0
# PreparedJob.pool of a job answered without any pool (prepare's internal errors).
NO_POOL = ""
MAX_CODE_BYTES = 1 << 20
MAX_MATH_CHARS = 1 << 20
# Far beyond any model's max_length in tokens; keeps a batch's frame well under MAX_FRAME_BYTES.
MAX_REWARD_MODEL_CHARS = 1 << 20


def _names_by_value(proto_enum: Any, prefix: str, unspecified: str) -> dict[int, str]:
    """A proto enum's values -> their names, lower case and without `prefix`; the UNSPECIFIED value -> `unspecified`
    (the name it stands for). Derived by name, as the client derives its own, so a value added to the proto comes
    with its name."""
    return {value: unspecified if name == f"{prefix}UNSPECIFIED" else name.removeprefix(prefix).lower()
            for name, value in proto_enum.items()}


# The agent's names of statuses and limits -> the proto's values (STATUS_UNSPECIFIED is no outcome).
# Typed as the proto's enums (the generated stubs' JobResult/CellResult fields take those, not int).
MODEL_STATUSES = cast("dict[str, pb.Status]", {name: value for value, name in
                                               _names_by_value(pb.Status, "STATUS_", "").items() if name})
# LIMIT_NONE is the agent's "" (no limit ended the run).
LIMITS = cast("dict[str, pb.Limit]", {"" if name == "none" else name: value for value, name in
                                      _names_by_value(pb.Limit, "LIMIT_", "").items()})
CODE_EXTRACTION = _names_by_value(pb.CodeExtraction, "CODE_EXTRACTION_", "last_block")
# CHECKER_UNSPECIFIED takes the checker of the tests' dataset (TestPlan.checker): whitespace for explicit cases.
CHECKERS = _names_by_value(pb.Checker, "CHECKER_", "unspecified")
MATH_EXTRACTION = _names_by_value(pb.MathExtraction, "MATH_EXTRACTION_", "auto")
REWARD_MODES = _names_by_value(pb.RewardMode, "REWARD_MODE_", "binary")


def _enum(names: dict[int, str], value: int, where: str) -> str:
    """The name an enum field's value stands for; INVALID_ARGUMENT for a value this daemon does not know.

    proto3 keeps unknown values (a client built against a newer .proto): taken as
    the default, such a request would be scored another way than its caller asked.
    """
    try:
        return names[value]
    except KeyError:
        raise InvalidRequest(f"{where}: unknown value {value}; this daemon knows {sorted(names)}") from None


# Languages the light python image serves; the rest need the langs image.
PYTHON_POOL_LANGUAGES = {"python", "bash"}


@dataclass
class PreparedJob:
    """A validated job, ready for a sandbox, or already decided without one."""

    index: int
    kind: str
    pool: str
    failure_value: float
    agent_job: messages.Job | None
    # Seconds the whole job may take inside the sandbox (all cases, compile).
    budget_seconds: float
    # Set when the verdict needs no sandbox (no code found in the completion).
    early_result: messages.JobResult | None = None
    # For to_result only, never sent to the sandbox: code jobs' extracted code and
    # reward mode, reward-model jobs' (mode, scale, shift) normalisation.
    extracted_code: str = ""
    reward_mode: str = "binary"
    normalize: tuple[str, float, float] = ("none", 1.0, 0.0)
    # The request field that names the job in errors: jobs[POSITION] in a batch.
    where: str = ""
    # Set by Scheduler.admit: when, and whether the job still counts as admitted
    # but not yet in Scheduler.run (a batch's jobs start a moment later).
    admitted_at: float = 0.0
    reserved: bool = False
    # The Job's size as received: the daemon holds it until the job is answered (Scheduler.admit).
    request_bytes: int = 0


def resolve_limits(requested: pb.Limits, config: Config, where: str) -> messages.JobLimits:
    """The effective {timeout, memory, output, total_timeout}: defaults for zeros, INVALID_ARGUMENT past the maxima."""
    limits = config.limits
    timeout = requested.timeout_seconds or limits.default_timeout_seconds
    memory = requested.memory_bytes or limits.default_memory_bytes
    output = requested.output_bytes or limits.default_output_bytes
    total_timeout = requested.total_timeout_seconds or limits.default_total_timeout_seconds
    for name, value, maximum in (("timeout_seconds", timeout, limits.max_timeout_seconds),
                                 ("total_timeout_seconds", total_timeout, limits.max_total_timeout_seconds)):
        if not math.isfinite(value) or value <= 0:
            raise InvalidRequest(f"{where}.{name} must be positive")
        if value > maximum:
            raise InvalidRequest(f"{where}.{name}={value:g} exceeds the daemon's maximum {maximum:g}")
    if memory > limits.max_memory_bytes:
        raise InvalidRequest(f"{where}.memory_bytes={memory} exceeds the daemon's "
                             f"maximum {limits.max_memory_bytes}")
    if output > limits.max_output_bytes:
        raise InvalidRequest(f"{where}.output_bytes={output} exceeds the daemon's "
                             f"maximum {limits.max_output_bytes}")
    return {"timeout": timeout, "memory": memory, "output": output, "total_timeout": total_timeout}


def _limits(job: pb.Job, config: Config, where: str) -> messages.JobLimits:
    return resolve_limits(job.limits, config, f"{where}.limits")


def _program(language: str, code: str, config: Config, where: str) -> messages.Program:
    try:
        spec = code_verifier.resolve_language(language or "python", code)
    except ValueError as exc:
        raise InvalidRequest(f"{where}.language: {exc}") from None
    return {
        "language": spec.name,
        "code": code,
        "source": spec.source_file,
        "compile": list(spec.compile_argv) if spec.compile_argv else None,
        "run": list(spec.run_argv),
        "env": dict(spec.env),
        "compile_timeout": min(spec.compile_timeout, config.limits.compile_timeout_seconds),
        "address_space_limit": spec.address_space_limit,
    }


DEFAULT_FLOAT_TOLERANCE = 1e-6


def _tolerance(request: pb.CodeJob | pb.MathJob, where: str) -> float:
    """A request's float tolerance: 1e-6 when unset, INVALID_ARGUMENT unless finite and >= 0.

    The field is ``optional`` (explicit presence), so an explicit 0 is not "unset": it asks
    for exact comparison, which the verifiers do with a tolerance of 0.
    """
    if not request.HasField("float_tolerance"):
        return DEFAULT_FLOAT_TOLERANCE
    tolerance = request.float_tolerance
    if not math.isfinite(tolerance) or tolerance < 0:
        raise InvalidRequest(f"{where} must be a finite number >= 0, got {tolerance!r}")
    return tolerance + 0.0  # -0.0 is 0.0


def _pool_for(language: str) -> str:
    return "python" if language in PYTHON_POOL_LANGUAGES else "langs"


def prepare(job: pb.Job, config: Config, where: str = "") -> PreparedJob:
    """Validate one Job; raises InvalidRequest naming the offending field (`where`: jobs[INDEX] by default).

    A bug of ours that the job's input hits here (an exception that is not a
    SandboxdError) answers that job STATUS_INTERNAL, with its failure value,
    and lets the rest of its batch run. Raised, it would fail the whole call
    as UNKNOWN: one completion that reaches a parser's RecursionError would
    take its batch's other results with it.
    """
    where = where or f"jobs[{job.index}]"
    try:
        prepared = _prepare(job, config, where)
    except SandboxdError:
        raise
    except Exception as exc:
        log.exception("%s: preparing the job failed inside sandboxd", where)
        failure_value = _requested_failure_value(job)
        prepared = PreparedJob(job.index, job.WhichOneof("kind") or "", NO_POOL,
                               failure_value if math.isfinite(failure_value) else DEFAULT_FAILURE_VALUE, None, 0.0)
        prepared.early_result = {"status": "internal",
                                 "message": f"internal error preparing {where}: {type(exc).__name__}: {exc}"}
    prepared.where = where
    prepared.request_bytes = job.ByteSize()
    if prepared.agent_job is not None:
        check_frame_size(job, prepared.agent_job, where, prepared.request_bytes)
    return prepared


# A request whose protobuf is below this is far below the agent's frame limit
# once JSON-encoded (at most 6 bytes per byte, a few copies), so only larger
# ones pay for a trial encoding.
FRAME_CHECK_BYTES = MAX_FRAME_BYTES // 32


def check_frame_size(job: pb.Job, agent_job: messages.Job, where: str, job_bytes: int) -> None:
    """INVALID_ARGUMENT for a job too large for the agent's frames.

    Sent anyway, such a job fails to encode at the daemon, which takes it for a
    lost sandbox: each attempt would recycle a healthy sandbox, and the caller
    get STATUS_SANDBOX_LOST (which clients retry) after three.
    """
    if job_bytes <= FRAME_CHECK_BYTES:
        return
    size = len(json.dumps({"op": "run", "job": agent_job}, separators=(",", ":")))
    if size <= MAX_FRAME_BYTES - 4096:
        return
    kind = job.WhichOneof("kind")
    if kind == "execute":
        execute = job.execute
        parts = {"execute.stdin": len(execute.stdin), "execute.files": sum(f.ByteSize() for f in execute.files),
                 "execute.args": sum(len(a) for a in execute.args), "execute.code": len(execute.code)}
    elif kind == "code":
        parts = {"code.tests": job.code.tests.ByteSize(), "code.completion": len(job.code.completion)}
    else:
        parts = {kind or "job": job.ByteSize()}
    largest = max(parts, key=lambda name: parts[name])
    raise InvalidRequest(f"{where}.{largest} is too large: the job is {size} bytes as sent to the sandbox "
                         f"(JSON, bytes in base64), over the limit of {MAX_FRAME_BYTES}")


def _requested_failure_value(job: pb.Job) -> float:
    return job.failure_value if job.HasField("failure_value") else DEFAULT_FAILURE_VALUE


def _prepare(job: pb.Job, config: Config, where: str) -> PreparedJob:
    failure_value = _requested_failure_value(job)
    if not math.isfinite(failure_value):
        raise InvalidRequest(f"{where}.failure_value must be a finite number")
    kind = job.WhichOneof("kind")
    if kind is None:
        raise InvalidRequest(f"{where}: set one of execute, code, math, reward_model")
    if kind != "reward_model" and failure_value >= 1.0:
        # A pass is worth 1.0: failures paid as much or more is a caller's slip, not a reward.
        raise InvalidRequest(f"{where}.failure_value must be below 1.0, the reward of a pass (got {failure_value:g})")
    limits = _limits(job, config, where)
    if kind == "execute":
        execute = job.execute
        if len(execute.code.encode()) > MAX_CODE_BYTES:
            raise InvalidRequest(f"{where}.execute.code is larger than {MAX_CODE_BYTES} bytes")
        program = _program(execute.language, execute.code, config, f"{where}.execute")
        if len(execute.files) > MAX_EXECUTE_FILES:
            raise InvalidRequest(f"{where}.execute.files: {len(execute.files)} files; at most {MAX_EXECUTE_FILES}")
        if sum(len(item.content) for item in execute.files) > MAX_EXECUTE_FILES_BYTES:
            raise InvalidRequest(f"{where}.execute.files hold more than {MAX_EXECUTE_FILES_BYTES} bytes")
        paths = [item.path for item in execute.files]
        check_files(paths, f"{where}.execute.files", config.sandbox.tmpfs_inodes)
        source = program["source"]
        if program["language"] != "python" and any(p == source or p.startswith(source + "/") for p in paths):
            # The agent writes the code there before compiling: the clash would fail there, an INTERNAL.
            raise InvalidRequest(f"{where}.execute.files: {source!r} is where the program's {program['language']} "
                                 "source is written")
        if len(execute.collect_files) > MAX_COLLECT_FILES:
            raise InvalidRequest(f"{where}.execute.collect_files: {len(execute.collect_files)} paths; at most "
                                 f"{MAX_COLLECT_FILES}")
        for path in execute.collect_files:
            check_path(path, f"{where}.execute.collect_files")
        check_args(execute.args, f"{where}.execute.args")
        agent_job: messages.ExecuteJob = {
            "kind": "execute", "program": program, "limits": limits,
            "stdin": base64.b64encode(execute.stdin).decode(), "args": list(execute.args),
            "files": [{"path": f.path, "content": base64.b64encode(f.content).decode()} for f in execute.files],
            "collect_files": list(execute.collect_files),
        }
        budget = limits["timeout"] + program["compile_timeout"]
        return PreparedJob(job.index, kind, _pool_for(program["language"]), failure_value, agent_job, budget)
    if kind == "code":
        return _prepare_code(job, config, limits, failure_value, where)
    if kind == "math":
        if len(job.math.completion) > MAX_MATH_CHARS or len(job.math.ground_truth) > MAX_MATH_CHARS:
            raise InvalidRequest(f"{where}.math: completion and ground_truth are limited to {MAX_MATH_CHARS} "
                                 "characters")
        if not job.math.ground_truth.strip():
            raise InvalidRequest(f"{where}.math.ground_truth is empty")
        tolerance = _tolerance(job.math, f"{where}.math.float_tolerance")
        math_job: messages.MathJob = {
            "kind": "math", "completion": job.math.completion, "ground_truth": job.math.ground_truth,
            "extraction": _enum(MATH_EXTRACTION, job.math.extraction, f"{where}.math.extraction"),
            "tolerance": tolerance,
            "limits": limits,
        }
        return PreparedJob(job.index, kind, MATH_POOL, failure_value, math_job, limits["timeout"])
    return _prepare_reward_model(job, config, limits, failure_value, where)


def _prepare_reward_model(job: pb.Job, config: Config, limits: messages.JobLimits, failure_value: float,
                          where: str) -> PreparedJob:
    request = job.reward_model
    if not config.models:
        raise Unsupported(f"{where}: this daemon has no reward models (configure one as [models.NAME])")
    # The model may be left out when the daemon has exactly one.
    name = request.model or (next(iter(config.models)) if len(config.models) == 1 else "")
    if name not in config.models:
        raise InvalidRequest(f"{where}.reward_model.model {request.model!r} is not configured "
                             f"(configured: {', '.join(sorted(config.models))})")
    if len(request.prompt) + len(request.completion) > MAX_REWARD_MODEL_CHARS:
        raise InvalidRequest(f"{where}.reward_model: prompt and completion are limited to {MAX_REWARD_MODEL_CHARS} "
                             "characters together")
    model = config.models[name]
    agent_job: messages.RewardModelJob = {"kind": "reward_model", "prompt": request.prompt,
                                          "completion": request.completion, "limits": limits}
    return PreparedJob(job.index, "reward_model", rewardpool.pool_name(name), failure_value, agent_job,
                       limits["timeout"], normalize=(model.normalize, model.scale, model.shift))


# Linux's limits (PATH_MAX with its NUL, NAME_MAX): a longer path fails in
# the sandbox, and resolving one of hundreds of KB there takes seconds of the
# agent's loop. The agent creates a path one name at a time, so its work
# dir's own prefix does not count (a 4,091-byte path is valid there).
MAX_PATH_BYTES = 4095
MAX_NAME_BYTES = 255
# What an execute job may send in and ask back: the agent's frames are 64 MiB,
# base64 included, and a file collected is at most 16 MiB.
MAX_EXECUTE_FILES = 1024
MAX_EXECUTE_FILES_BYTES = 32 << 20
MAX_COLLECT_FILES = 64
# Linux's MAX_ARG_STRLEN (32 pages, its NUL included), and for the whole list well under what execve takes
# with the sandbox's stack limit (a quarter of it, at most 6 MiB, less the environment): each argument costs
# its bytes, its NUL and a pointer.
MAX_ARG_BYTES = (32 << 12) - 1
MAX_ARGS_BYTES = 1 << 20
ARG_POINTER_BYTES = 8


def check_args(args: Sequence[str], where: str) -> None:
    """Arguments that an exec'd program can be given: no NUL, each within MAX_ARG_BYTES, all within MAX_ARGS_BYTES.

    Past these execve fails in the sandbox whatever the program: a NUL ends
    the run with exit status 1 and no word of why (Python's execve raises
    ValueError), and an argument list too long with 127, each of which would
    be scored as the model's runtime error for the caller's slip. Python runs in
    the warm interpreter without an exec, but a real `python main.py ARGS`
    fails the same way, so one rule holds for every language.
    """
    total = 0
    for position, arg in enumerate(args):
        if "\0" in arg:
            raise InvalidRequest(f"{where}[{position}] holds a NUL character, which no program's arguments can")
        size = len(arg.encode())
        if size > MAX_ARG_BYTES:
            raise InvalidRequest(f"{where}[{position}] is {size} bytes; execve takes at most {MAX_ARG_BYTES}")
        total += size + 1 + ARG_POINTER_BYTES
    if total > MAX_ARGS_BYTES:
        raise InvalidRequest(f"{where}: {len(args)} arguments take {total} bytes with their pointers; at most "
                             f"{MAX_ARGS_BYTES}")


def check_path(path: str, where: str) -> None:
    parts = path.split("/")
    if not path or path.startswith("/") or any(p in ("", ".", "..") for p in parts) or "\0" in path:
        raise InvalidRequest(f"{where}: {path!r} must be a relative path without '.' or '..' parts")
    if len(path.encode()) > MAX_PATH_BYTES or any(len(part.encode()) > MAX_NAME_BYTES for part in parts):
        raise InvalidRequest(f"{where}: {path[:64]!r}... is longer than {MAX_PATH_BYTES} bytes, or has a part "
                             f"longer than {MAX_NAME_BYTES}")


def check_files(paths: list[str], where: str, max_entries: int) -> None:
    """Files to write in a sandbox: valid paths, none twice, none inside another (`a` and `a/b`), and
    with their folders at most `max_entries` entries (the sandbox's /tmp inodes, sandbox.tmpfs_inodes)."""
    for path in paths:
        check_path(path, where)
    if len(set(paths)) != len(paths):
        raise InvalidRequest(f"{where}: a path appears twice")
    # With "/" read as the lowest character, the paths inside a folder sort right after it. Listing
    # each path's folders instead cost 5 s for 100 paths 2,000 levels deep (quadratic in the depth).
    keys = sorted(path.replace("/", "\0") for path in paths)
    for folder, path in itertools.pairwise(keys):
        if path.startswith(folder + "\0"):
            name = folder.replace("\0", "/")
            raise InvalidRequest(f"{where}: {name!r} is both a file and a folder of another file")
    # Folders count too: 65 paths of 2,040 levels fill a /tmp of 65,536 inodes, which the agent can only
    # answer INTERNAL. In sorted order each path's new folders are those it does not share with
    # the one before it.
    if len(keys) + sum(key.count("\0") for key in keys) <= max_entries:
        return  # even with no folder shared
    entries, previous = len(keys), ""
    for key in keys:
        folders = key[: key.rfind("\0") + 1]  # "a\0b\0": each folder ends with its separator
        entries += folders.count("\0") - folders[: _common_prefix_length(folders, previous)].count("\0")
        previous = folders
    if entries > max_entries:
        raise InvalidRequest(f"{where}: the files and their folders are {entries} entries, more than the "
                             f"{max_entries} a sandbox's /tmp holds")


def _common_prefix_length(a: str, b: str) -> int:
    """By bisection over slices compared in C: over 1,022 paths of 4 KB in sorted order, 4 ms, against
    124 ms for os.path.commonprefix (a loop over characters)."""
    low, high = 0, min(len(a), len(b))
    while low < high:
        middle = (low + high + 1) // 2
        if a[:middle] == b[:middle]:
            low = middle
        else:
            high = middle - 1
    return low


# GRPO-style batches send each prompt's tests with every one of its
# completions (8-16 of them); parsing and checking the tests (JSON, then the
# assert code's syntax tree) is about a third of what preparing a HumanEval
# job costs. One parse serves them all: plans are shared, so
# nothing may change one (or the values inside its cases) after the parse.
# Only tests of up to PLAN_CACHE_KEY_CHARS characters, every field counted,
# are kept: at most 4 MB of test text, and what it parses to (typically a
# few times the text; degenerate JSON such as `[[],[],...]` about 20 times).
# 512 prompts cover a rollout batch; a cache smaller than the prompts a batch
# cycles through would keep none of them.
PLAN_CACHE_SIZE = 512
PLAN_CACHE_KEY_CHARS = 8 * 1024
# The dataset's code whose names harness_arguments gives the judge: within a kept plan's key (half of it, for the
# JSON a dataset_json spells it in), so that the daemon parses it once per prompt, not once per completion.
DATASET_NAMES_MAX_CHARS = PLAN_CACHE_KEY_CHARS // 2


def _test_plan(tests: pb.CodeTests) -> code_verifier.TestPlan:
    """normalize_tests() of a job's tests, shared by every job that sends the same tests."""
    key = (
        tuple((c.stdin, c.expected_stdout) for c in tests.stdio), tests.fn_name,
        tuple((c.args_json, c.expected_json) for c in tests.function),
        tests.assert_code, tests.entry_point, tests.dataset_json,
    )
    size = sum(len(text) for text in (tests.fn_name, tests.assert_code, tests.entry_point, tests.dataset_json))
    size += sum(len(a) + len(b) for a, b in (*key[0], *key[2]))
    return _cached_plan(key) if size <= PLAN_CACHE_KEY_CHARS else _plan(key)


def _plan(key: tuple[Any, ...]) -> code_verifier.TestPlan:
    stdio, fn_name, function, assert_code, entry_point, dataset_json = key
    plan = code_verifier.normalize_tests({
        "stdio": [{"stdin": stdin, "expected_stdout": expected} for stdin, expected in stdio],
        "fn_name": fn_name,
        "function": [{"args_json": args, "expected_json": expected} for args, expected in function],
        "assert_code": assert_code,
        "entry_point": entry_point,
        "dataset_json": dataset_json,
    })
    if "\\ud" in dataset_json or "\\uD" in dataset_json:  # the only way a surrogate gets past protobuf's UTF-8
        _refuse_lone_surrogates(plan)
    return plan


# A UTF-16 surrogate code point: alone in a str, it has no UTF-8 form.
_SURROGATE = re.compile("[\ud800-\udfff]")


def _refuse_lone_surrogates(plan: code_verifier.TestPlan) -> None:
    """ValueError if a stdio case's text holds a lone surrogate, which dataset_json's escapes ("\\ud800") can make.

    A program's stdin is written, and its stdout compared, as UTF-8: such a case failed in the agent
    (UnicodeEncodeError, answered INTERNAL; issue #52). Arguments of function cases
    are Python values, where a lone surrogate is a str like any other; assert code that holds one does
    not parse (code.plans._SYNTAX_ERRORS).
    """
    for n, case in enumerate(plan.stdio):
        for what, text in (("stdin", case.stdin), ("expected_stdout", case.expected_stdout)):
            if _SURROGATE.search(text):
                raise ValueError(f"dataset_json: case {n}'s {what} holds a lone surrogate (an escape from "
                                 "\\ud800 to \\udfff that is not half of a pair), which is no text a program can "
                                 "read or write")


# Tests that fail to parse raise, and lru_cache keeps no exceptions: each such job gets its own error.
_cached_plan = functools.lru_cache(maxsize=PLAN_CACHE_SIZE)(_plan)


def _prepare_code(job: pb.Job, config: Config, limits: messages.JobLimits, failure_value: float,
                  where: str) -> PreparedJob:
    request = job.code
    if len(request.completion.encode()) > MAX_CODE_BYTES:
        raise InvalidRequest(f"{where}.code.completion is larger than {MAX_CODE_BYTES} bytes")
    try:
        plan = _test_plan(request.tests)
    except ValueError as exc:
        raise InvalidRequest(f"{where}.code.tests: {exc}") from None
    tolerance = _tolerance(request, f"{where}.code.float_tolerance")
    language = request.language or "python"
    mode = _enum(CODE_EXTRACTION, request.extraction, f"{where}.code.extraction")
    if mode == "tag" and not request.tag:
        raise InvalidRequest(f"{where}.code.tag is required with CODE_EXTRACTION_TAG")
    try:
        extracted = code_verifier.extract_code(request.completion, language, mode, request.tag)
    except ValueError as exc:
        raise InvalidRequest(f"{where}.code: {exc}") from None
    # The source file's name can depend on the code (Java's public class).
    program = _program(language, extracted or "", config, f"{where}.code")
    if plan.kind != "stdio" and program["language"] != "python":
        raise InvalidRequest(f"{where}.code.tests: {plan.kind} tests are supported for python only; "
                             "use stdin/stdout cases for other languages")
    cases = max(1, plan.total)
    budget = min(limits["timeout"] * cases, limits["total_timeout"]) + program["compile_timeout"]
    prepared = PreparedJob(job.index, "code", _pool_for(program["language"]), failure_value, None, budget)
    if extracted is None or not extracted.strip():
        prepared.early_result = {"status": "no_answer", "message": f"no {language} code found in the completion",
                                 "code": {"tests_total": cases}}
        return prepared
    # A HumanEval prompt's program depends on the completion (code.program_assembly): the candidate's and the
    # judge's processes assemble it in the sandbox. A stdio run has no such step; no dataset shape gives it a prompt.
    assembly = code_verifier.program_assembly(plan) if plan.kind != "stdio" else None
    program["code"] = extracted if assembly is not None else code_verifier.assemble_program(extracted, plan)
    checker = _enum(CHECKERS, request.checker, f"{where}.code.checker")
    agent_job: messages.CodeJob = {
        "kind": "code", "program": program, "limits": limits,
        "plan": plan_to_agent(plan), "checker": checker if checker != "unspecified" else plan.checker,
        "tolerance": tolerance, "stop_on_first_failure": request.stop_on_first_failure,
    }
    if assembly is not None:
        agent_job["assembly"] = assembly
    prepared.extracted_code = extracted
    prepared.reward_mode = _enum(REWARD_MODES, request.reward_mode, f"{where}.code.reward_mode")
    if plan.kind != "stdio":
        agent_job["harness"] = harness_arguments(plan, tolerance, request.stop_on_first_failure)
    prepared.agent_job = agent_job
    return prepared


def harness_arguments(plan: code_verifier.TestPlan, tolerance: float,
                      stop_on_first_failure: bool) -> messages.HarnessArguments:
    """Keyword arguments for python.harness.run_tests in the sandbox's judge process.

    Not the candidate's top-level names, which assert tests bind: the agent
    gives the judge the program, which parses it there (1.3-1.7 s for 1 MiB
    of code here), on the job's time instead of the daemon's event loop.
    """
    arguments: messages.HarnessArguments = {
        "assert_code": plan.assert_code,
        "entry_point": plan.entry_point,
        "fn_name": plan.fn_name,
        "cases": [{"args": list(case.args), "expected": case.expected, "unwrap_single": case.unwrap_single,
                   "int_keys": case.int_keys}
                  for case in plan.function],
        "setup_code": plan.prompt,
        "tolerance": tolerance,
        "stop_on_first_failure": stop_on_first_failure,
    }
    dataset_chars = len(plan.assert_code) + len(plan.prompt) + len(plan.prelude)
    if plan.kind == "assert" and dataset_chars <= DATASET_NAMES_MAX_CHARS:
        # Parsed once per plan here (a kept plan serves every completion of its prompt), not in a judge per job:
        # a judge keeps few of a batch's problems, and the dataset's code is parsed twice more there (100 us a job).
        arguments["own_names"] = list(plan.own_names)
        if plan.prompt and plan.head_names is not None:
            arguments["head_names"] = list(plan.head_names)
    return arguments


def plan_to_agent(plan: code_verifier.TestPlan) -> messages.Plan:
    return {
        "kind": plan.kind,
        "stdio": [{"stdin": c.stdin, "expected_stdout": c.expected_stdout} for c in plan.stdio],
        "total": plan.total,
    }


def to_result(prepared: PreparedJob, outcome: messages.JobResult, attempts: int) -> pb.JobResult:
    """The agent's verdict as a JobResult; reward from status and the failure value."""
    status_name = outcome.get("status", "internal")
    status = MODEL_STATUSES.get(status_name, pb.STATUS_INTERNAL)
    limit = LIMITS.get(outcome.get("limit", ""), pb.LIMIT_NONE)
    result = pb.JobResult(index=prepared.index, status=status, limit_hit=limit,
                          message=str(outcome.get("message", ""))[:4000], attempts=attempts,
                          do_not_retry=bool(outcome.get("do_not_retry")) and status >= pb.STATUS_SANDBOX_LOST)
    for entry in outcome.get("tests", []):
        result.tests.add(
            index=int(entry.get("index", 0)), status=MODEL_STATUSES.get(entry.get("status"), pb.STATUS_INTERNAL),
            limit_hit=LIMITS.get(entry.get("limit", ""), pb.LIMIT_NONE),
            time_seconds=float(entry.get("time_seconds", 0.0)),
            stdout=str(entry.get("stdout", "")), stderr=str(entry.get("stderr", "")),
            message=str(entry.get("message", ""))[:2000],
        )
    reward = prepared.failure_value
    if prepared.kind == "execute" and "execute" in outcome:
        execute = outcome["execute"]
        result.execute.exit_code = int(execute.get("exit_code", 0))
        result.execute.stdout = base64.b64decode(execute.get("stdout", ""))
        result.execute.stderr = base64.b64decode(execute.get("stderr", ""))
        result.execute.stdout_truncated = bool(execute.get("stdout_truncated"))
        result.execute.stderr_truncated = bool(execute.get("stderr_truncated"))
        for item in execute.get("files", []):
            result.execute.files.add(path=item["path"], content=base64.b64decode(item["content"]))
        if status == pb.STATUS_OK:
            reward = 1.0
    elif prepared.kind == "code":
        detail = outcome.get("code", {})
        passed, total = int(detail.get("tests_passed", 0)), int(detail.get("tests_total", 0))
        agent_job = prepared.agent_job
        result.code.tests_passed, result.code.tests_total = passed, total
        # None where the job was decided without a sandbox (no code found).
        if agent_job is not None and agent_job["kind"] == "code":
            result.code.language = agent_job["program"]["language"]
        result.code.extracted_code = prepared.extracted_code[:20000]
        result.code.compile_output = str(detail.get("compile_output", ""))[:8192]
        if status < pb.STATUS_SANDBOX_LOST:
            reward = code_verifier.score(passed, total, prepared.reward_mode, prepared.failure_value)
    elif prepared.kind == "math":
        verdict = outcome.get("math", {}) or {}
        result.math.extracted_answer = str(verdict.get("extracted_answer", ""))[:2000]
        result.math.extraction = str(verdict.get("extraction", ""))
        result.math.parsed_answer = str(verdict.get("parsed_answer", ""))[:2000]
        result.math.parsed_ground_truth = str(verdict.get("parsed_ground_truth", ""))[:2000]
        if status == pb.STATUS_OK:
            reward = 1.0
    elif prepared.kind == "reward_model":
        scored = outcome.get("reward_model") or {}
        result.reward_model.model = str(scored.get("model", ""))
        result.reward_model.device = str(scored.get("device", ""))
        if status == pb.STATUS_OK:
            raw = scored.get("raw_score")
            if isinstance(raw, (int, float)) and math.isfinite(raw):
                mode, scale, shift = prepared.normalize
                result.reward_model.raw_score = raw
                reward = reward_model_verifier.normalize(raw, mode, scale, shift)
            else:
                result.status, result.message = pb.STATUS_INTERNAL, f"the reward model gave no usable score ({raw!r})"
    if not math.isfinite(reward):
        reward = prepared.failure_value
    result.reward = reward
    return result


def infrastructure_result(prepared: PreparedJob, status: pb.Status, message: str, attempts: int) -> pb.JobResult:
    return pb.JobResult(index=prepared.index, status=status, reward=prepared.failure_value, message=message,
                        attempts=attempts)
