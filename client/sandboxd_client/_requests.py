"""Request builders, validation and result types shared by the sync and async clients (no I/O).

Everything here turns plain Python values into ``sandboxd.v1`` messages and back,
and raises :class:`InvalidRequest` for anything the daemon would refuse, so a
bad request never costs a round trip.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import difflib
import enum
import functools
import io
import json
import math
import pickle
import re
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar, Union, cast

from ._proto.sandboxd.v1 import sandboxd_pb2 as pb
from .errors import DeadlineExceeded, InvalidRequest, Overloaded, SandboxdError


class Status(enum.IntEnum):
    """Outcome of a job: the proto ``Status`` without its ``STATUS_`` prefix.

    1..99 are verdicts about the model's output, 100 and up infrastructure
    failures. Values from 1000 are made by the client when no daemon answered
    and never travel on the wire.
    """

    UNSPECIFIED = 0
    OK = 1
    WRONG_ANSWER = 2
    RUNTIME_ERROR = 3
    TIMEOUT = 4
    MEMORY_LIMIT = 5
    OUTPUT_LIMIT = 6
    COMPILE_ERROR = 7
    REJECTED = 8
    NO_ANSWER = 9
    SANDBOX_LOST = 100
    OVERLOADED = 101
    INTERNAL = 102
    UNSUPPORTED_TEST = 103
    # Client-side: the RPC itself failed after every retry.
    UNAVAILABLE = 1000
    DEADLINE_EXCEEDED = 1001

    @property
    def is_infrastructure_failure(self) -> bool:
        """True for failures that are not the model's fault (and UNSPECIFIED, which is a daemon bug)."""
        return self >= 100 or self == Status.UNSPECIFIED

    @classmethod
    def from_proto(cls, value: int) -> Status:
        """The member for a wire value; unknown (newer) values count as INTERNAL or a model failure."""
        try:
            return cls(value)
        except ValueError:
            # A newer daemon may add verdicts; keep the infra/model split it encodes.
            return cls.INTERNAL if value >= 100 else cls.WRONG_ANSWER


class Limit(enum.IntEnum):
    """Which enforced limit ended a run: the proto ``Limit`` without its ``LIMIT_`` prefix."""

    NONE = 0
    WALL_TIME = 1
    CPU_TIME = 2
    MEMORY = 3
    OUTPUT = 4
    PROCESSES = 5
    FILE_SIZE = 6
    TOTAL_TIME = 7

    @classmethod
    def from_proto(cls, value: int) -> Limit:
        """The member for a wire value; NONE for values this client does not know."""
        try:
            return cls(value)
        except ValueError:
            return cls.NONE


@dataclass(frozen=True)
class StdioCase:
    """A test that feeds ``stdin`` to the program and compares its stdout."""

    stdin: str
    expected_stdout: str


@dataclass(frozen=True)
class FunctionCase:
    """A test that calls ``fn_name(*args)`` and compares the return value (JSON-comparable)."""

    args: Sequence[Any]
    expected: Any


@dataclass(frozen=True)
class Timings:
    """Where a job's time went, in seconds."""

    queued_seconds: float = 0.0
    run_seconds: float = 0.0
    total_seconds: float = 0.0


@dataclass(frozen=True)
class TestResult:
    """One test case of a code job."""

    __test__ = False  # not a pytest class, despite the name

    index: int
    status: Status
    limit_hit: Limit
    time_seconds: float
    stdout: str
    stderr: str
    message: str


@dataclass(frozen=True)
class CodeDetail:
    """What the code verifier saw."""

    extracted_code: str
    language: str
    tests_passed: int
    tests_total: int
    compile_output: str


@dataclass(frozen=True)
class MathDetail:
    """What the math verifier extracted and compared."""

    extracted_answer: str
    extraction: str
    parsed_answer: str
    parsed_ground_truth: str


@dataclass(frozen=True)
class ExecuteOutput:
    """Output of an execute job."""

    exit_code: int
    stdout: bytes
    stderr: bytes
    stdout_truncated: bool
    stderr_truncated: bool
    files: dict[str, bytes]


@dataclass(frozen=True)
class RewardModelDetail:
    """How a reward model scored."""

    raw_score: float
    model: str
    device: str


Detail = CodeDetail | MathDetail | ExecuteOutput | RewardModelDetail | None


@dataclass(frozen=True)
class Result:
    """The answer to one job, mirroring ``JobResult``.

    ``reward`` is never NaN. For an infrastructure failure it is the job's
    failure value; look at ``is_infrastructure_failure`` to score it otherwise.

    Two counts of tries: ``attempts`` is the daemon's (sandboxes it tried for
    this answer, >1 after it replaced a lost sandbox; 0 when none was needed,
    as for NO_ANSWER found before any run, or when the client made the result
    up); ``client_attempts`` is the client's
    (RPCs that carried this job: 1, plus one per client-side retry after
    UNAVAILABLE, an overload or an infrastructure status).
    """

    index: int
    reward: float
    status: Status
    message: str = ""
    limit_hit: Limit = Limit.NONE
    timings: Timings = field(default_factory=Timings)
    tests: tuple[TestResult, ...] = ()
    attempts: int = 0
    retry_after_seconds: float = 0.0
    details: Detail = None
    client_attempts: int = 1
    #: Set when the client made this result because the RPC failed for good.
    error: SandboxdError | None = None
    #: The daemon that answered (its ``server.node_name``); "" when the client made this result.
    node: str = ""

    @property
    def ok(self) -> bool:
        """True when the job fully succeeded (status OK)."""
        return self.status == Status.OK

    @property
    def is_infrastructure_failure(self) -> bool:
        """True when no verdict about the model could be reached (status >= 100)."""
        return self.status.is_infrastructure_failure

    @property
    def pass_rate(self) -> float:
        """Fraction of tests passed for code jobs; 1.0/0.0 from the status for other kinds."""
        if isinstance(self.details, CodeDetail) and self.details.tests_total:
            return self.details.tests_passed / self.details.tests_total
        if self.tests:
            return sum(t.status == Status.OK for t in self.tests) / len(self.tests)
        return 1.0 if self.ok else 0.0

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict: enums by name, bytes decoded as UTF-8 (replacing errors), the error as text."""
        out = _plain(dataclasses.asdict(self))
        out["error"] = str(self.error) if self.error is not None else None
        out["is_infrastructure_failure"] = self.is_infrastructure_failure
        return out

    def raise_for_status(self) -> Result:
        """Raise the error behind an infrastructure failure; return self otherwise."""
        if not self.is_infrastructure_failure:
            return self
        if self.error is not None:
            raise self.error
        raise SandboxdError(f"{self.status.name}: {self.message or 'infrastructure failure'}")


def status_and_message(status: str, message: str) -> str:
    """A failure's status and message for a log line, the status once (the client's own results start with it)."""
    return message if message.startswith(status) else f"{status}: {message}"


def _plain(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return value.name
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", errors="replace")
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items() if not isinstance(v, SandboxdError)}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


CodeTestsLike = Union[
    "pb.CodeTests",
    Mapping[str, Any],
    str,
    Sequence[StdioCase],
    Sequence[FunctionCase],
    Sequence[Mapping[str, Any]],
    Sequence[str],
    Sequence[tuple[Any, Any]],
]

# Keys that identify a dataset's test shape; the daemon parses these from dataset_json.
DATASET_KEYS: dict[str, tuple[str, ...]] = {
    "verl/APPS/TACO": ("inputs", "outputs"),
    "HumanEval": ("test",),
    "MBPP": ("test_list",),
    "CodeContests": ("public_tests", "private_tests", "generated_tests"),
    "LiveCodeBench": ("public_test_cases", "private_test_cases"),
    "PrimeIntellect": ("test_cases",),
    "SandboxFusion (verl's sandbox_fusion)": ("assert_case",),
}

_CODE_EXTRACTION = {"last_block", "first_block", "whole", "tag"}
_CHECKERS = {"whitespace", "exact", "float", "tokens_ignore_case", "lines_decimal"}
_REWARD_MODES = {"binary", "fraction"}
_MATH_EXTRACTION = {"auto", "boxed", "answer_tag", "phrase", "last_expression"}


# A UTF-16 surrogate code point: alone in a str it cannot be UTF-8, and protobuf refused the whole request with
# UnicodeEncodeError (a model that emits one, or text decoded with surrogateescape).
_SURROGATE = re.compile("[\ud800-\udfff]")


def valid_text(text: str) -> str:
    """``text`` as valid Unicode: each lone surrogate replaced by U+FFFD, a pair of them joined into its character.

    Every string the client sends goes through here (docs/client.md, "Any
    input"), and JSON text through valid_json_escapes too: the daemon then
    scores what it got, as any other text, instead of the request failing
    before it is sent.
    """
    if _SURROGATE.search(text) is None:
        return text
    return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")


# One escape in JSON text: a surrogate pair's, a lone surrogate's, or any other (an escaped backslash among them,
# which one pass from the left keeps from being read as the start of the next).
_JSON_ESCAPE = re.compile(
    r"\\u[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2}|\\u[dD][89a-fA-F][0-9a-fA-F]{2}|\\.", re.DOTALL)


def valid_json_escapes(text: str) -> str:
    """JSON ``text`` with each escape of a lone surrogate (``\\ud800``) written as U+FFFD's (``\\ufffd``).

    It decodes to a str that valid_text would have to fix, and the daemon's copy of it has no UTF-8 form
    (a stdio case's text is refused). The rest of the text is kept as it is, numbers and key order included.
    """
    if "\\ud" not in text and "\\uD" not in text:
        return text
    return _JSON_ESCAPE.sub(lambda escape: "\\ufffd" if len(escape.group()) == 6 else escape.group(), text)


def _json_default(obj: Any) -> Any:
    # verl hands parquet columns over as numpy arrays and scalars; both have tolist().
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if isinstance(obj, (bytes, bytearray)):
        return obj.decode("utf-8", errors="replace")
    raise TypeError(f"{type(obj).__name__} is not JSON serialisable")


def to_json(value: Any) -> str:
    """JSON for dataset values, which may hold numpy arrays (verl) or tuples; lone surrogates in its strings
    become U+FFFD (valid_json_escapes)."""
    try:
        # ASCII JSON writes a lone surrogate as an escape, which the daemon would decode back into one.
        return valid_json_escapes(json.dumps(value, default=_json_default))
    except RecursionError:
        raise InvalidRequest("tests are not JSON serialisable: nested too deeply") from None
    except (TypeError, ValueError) as e:
        # ValueError: a circular reference, or an int past Python's 4,300 digits.
        raise InvalidRequest(f"tests are not JSON serialisable: {e}") from e


# A protobuf enum's values are ints at run time; its stub types them as the enum.
_ProtoEnum = TypeVar("_ProtoEnum", bound=int)


def _enum(proto_enum: type[_ProtoEnum], prefix: str, value: str | int, allowed: set[str], what: str) -> _ProtoEnum:
    if isinstance(value, int) and not isinstance(value, bool):
        try:
            cast(Any, proto_enum).Name(value)
        except ValueError:
            raise InvalidRequest(f"{what} must be one of {sorted(allowed)}, got {value!r}") from None
        return cast(_ProtoEnum, value)
    if not isinstance(value, str) or value.lower() not in allowed:
        raise InvalidRequest(f"{what} must be one of {sorted(allowed)}, got {value!r}")
    return cast(_ProtoEnum, cast(Any, proto_enum).Value(f"{prefix}{value.upper()}"))


def _check_finite(value: float | None, what: str, *, positive: bool = False) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidRequest(f"{what} must be a number, got {type(value).__name__}")
    try:
        finite = math.isfinite(value)
    except OverflowError:  # an int past a float's range
        finite = False
    if not finite:
        raise InvalidRequest(f"{what} must be finite, got {value if isinstance(value, float) else 'a huge int'}")
    if positive and value <= 0:
        raise InvalidRequest(f"{what} must be > 0, got {value!r}")
    return float(value)


def _short_repr(value: Any) -> str:
    """A value for an error message: its repr cut at 80 characters (or its type, where it has no repr)."""
    try:
        text = repr(value)
    except Exception:  # an int past 4,300 digits, a hostile __repr__, a cycle too deep
        return f"a {type(value).__name__}"
    return text if len(text) <= 80 else f"{text[:77]}..."


_F = TypeVar("_F", bound=Callable[..., Any])


def _refusing(build: _F) -> _F:
    """`build`, raising InvalidRequest for any input it cannot take: what it does not check itself (an unknown
    keyword argument, a value protobuf refuses) fails with TypeError, ValueError and the like."""

    @functools.wraps(build)
    def refusing(*args: Any, **kwargs: Any) -> Any:
        try:
            return build(*args, **kwargs)
        except InvalidRequest:
            raise
        except RecursionError:
            raise InvalidRequest(f"{build.__name__}: an argument is nested too deeply") from None
        except (TypeError, ValueError, OverflowError, KeyError, IndexError, AttributeError, UnicodeError) as e:
            raise InvalidRequest(f"{build.__name__}: {type(e).__name__}: {e}") from e

    return cast(_F, refusing)


def _check_str(value: Any, what: str, *, allow_empty: bool = True) -> str:
    if not isinstance(value, str):
        raise InvalidRequest(f"{what} must be a str, got {type(value).__name__}")
    if not allow_empty and not value:
        raise InvalidRequest(f"{what} must not be empty")
    return valid_text(value)


def _limits(timeout: float | None, memory_bytes: int | None, output_bytes: int | None,
            total_timeout: float | None = None) -> pb.Limits:
    limits = pb.Limits(timeout_seconds=_check_finite(timeout, "timeout", positive=True) or 0.0,
                       total_timeout_seconds=_check_finite(total_timeout, "total_timeout", positive=True) or 0.0)
    for name, value in (("memory_bytes", memory_bytes), ("output_bytes", output_bytes)):
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 1 << 64:
            raise InvalidRequest(f"{name} must be a positive int below 2**64, got {_short_repr(value)}")
        setattr(limits, name, value)
    return limits


def _job(
    *,
    timeout: float | None,
    memory_bytes: int | None,
    output_bytes: int | None,
    failure_value: float | None,
    total_timeout: float | None = None,
    scored_to_one: bool = True,
) -> pb.Job:
    job = pb.Job(limits=_limits(timeout, memory_bytes, output_bytes, total_timeout))
    failure = _check_finite(failure_value, "failure_value")
    if failure is not None:
        _check_failure_below_a_pass(failure, scored_to_one)
        job.failure_value = failure
    return job


def _check_failure_below_a_pass(failure_value: float, scored_to_one: bool) -> None:
    # Execute, code and math jobs pay 1.0 for a pass; a reward model's raw scores have no fixed range.
    if scored_to_one and failure_value >= 1.0:
        raise InvalidRequest(f"failure_value must be below 1.0, the reward of a pass, got {failure_value:g}")


# verl's r1 recipe (recipe/r1/data_process.py) stores LiveCodeBench's test cases, and LiveCodeBench its
# private_test_cases, as base64(zlib(pickle(JSON text))). At least 16 characters: a shorter string is no such
# payload, and a bare identifier of assert code (no spaces, no parentheses) that looks like base64 still has to
# inflate with zlib to be taken for one.
_BASE64_TEXT = re.compile(r"[A-Za-z0-9+/]{16,}={0,2}")
# What the decompressed payload may be: the largest request the client sends (_core.MAX_MESSAGE_BYTES).
_COMPRESSED_TESTS_LIMIT = 64 << 20


class _PlainUnpickler(pickle.Unpickler):
    """Reads plain values only (str, bytes, numbers, lists, dicts, tuples, sets, None, bools).

    Unpickling runs code through the callables a pickle names, and it can name one only
    through ``find_class`` (the GLOBAL, STACK_GLOBAL, INST, OBJ and EXT opcodes all call it;
    a persistent id has no loader here and is refused by pickle itself). Refusing every name
    leaves nothing to call.
    """

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"{module}.{name}: only plain values are read from compressed test cases")


def compressed_tests(text: str) -> str | None:
    """The JSON text of test cases stored as base64(zlib(pickle(JSON text))); None when ``text`` is not that.

    verl's r1 recipe writes LiveCodeBench rows' ``ground_truth`` so (``{"inputs", "outputs",
    "fn_name"}``, prime_code's form), and LiveCodeBench its ``private_test_cases``. Read with
    an unpickler that looks up no global (:class:`_PlainUnpickler`), never ``pickle.loads``;
    a payload that inflates past 64 MiB, or holds anything but text, is an ``InvalidRequest``.
    """
    text = text.strip()
    if not _BASE64_TEXT.fullmatch(text):
        return None
    try:
        raw = base64.b64decode(text, validate=True)
        inflate = zlib.decompressobj()
        data = inflate.decompress(raw, _COMPRESSED_TESTS_LIMIT)
    except (binascii.Error, zlib.error):
        return None
    if inflate.unconsumed_tail:
        raise InvalidRequest(f"compressed test cases inflate past {_COMPRESSED_TESTS_LIMIT >> 20} MiB")
    try:
        value = _PlainUnpickler(io.BytesIO(data)).load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, IndexError, KeyError, MemoryError) as exc:
        raise InvalidRequest(f"compressed test cases (base64, zlib, pickle) do not unpickle: {exc}") from None
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    if not isinstance(value, str):
        raise InvalidRequest(f"compressed test cases hold a {type(value).__name__}; expected JSON text")
    return value


def _with_private_cases_decompressed(tests: Mapping[str, Any]) -> Mapping[str, Any]:
    """A LiveCodeBench row as published keeps its private cases compressed (see compressed_tests): decompressed
    here. What does not decompress stays as it is, and the daemon says what is wrong with it."""
    private = tests.get("private_test_cases")
    if not isinstance(private, str):
        return tests
    try:
        decompressed = compressed_tests(private)
    except InvalidRequest:
        return tests
    return tests if decompressed is None else {**tests, "private_test_cases": decompressed}


def _dataset_dict(tests: Mapping[str, Any]) -> str:
    tests = _with_private_cases_decompressed(tests)
    _check_dataset_dict(tests)
    return to_json(dict(tests))


def _check_dataset_dict(tests: Mapping[str, Any]) -> None:
    """Refuse a dataset dict (its private cases decompressed already) of no known shape."""
    keys = set(tests)
    if not any(keys & set(required) for required in DATASET_KEYS.values()):
        shapes = ", ".join(f"{name} {list(k)}" for name, k in DATASET_KEYS.items())
        raise InvalidRequest(
            f"tests dict has keys {sorted(keys)}; expected one of the dataset shapes: {shapes}"
        )
    if ("inputs" in keys) != ("outputs" in keys) and "assert_case" not in keys:
        given, missing = ("inputs", "outputs") if "inputs" in keys else ("outputs", "inputs")
        raise InvalidRequest(f"tests dict has {given!r} but no {missing!r}")
    if "inputs" in keys:
        inputs, outputs = tests["inputs"], tests["outputs"]
        if not all(isinstance(v, (list, tuple)) or hasattr(v, "tolist") for v in (inputs, outputs)):
            raise InvalidRequest(f"tests 'inputs' and 'outputs' must be lists, got {type(inputs).__name__} and "
                                 f"{type(outputs).__name__}")
        if len(inputs) != len(outputs):
            raise InvalidRequest(f"tests have {len(inputs)} inputs but {len(outputs)} outputs")


@_refusing
def code_tests(
    tests: CodeTestsLike, *, fn_name: str | None = None, entry_point: str | None = None
) -> pb.CodeTests:
    """Normalise the test shapes found in the wild into ``CodeTests``.

    Accepts a ``CodeTests`` message; a dataset dict (verl/APPS ``{"inputs",
    "outputs","fn_name"}``, HumanEval ``{"test","entry_point"}``, MBPP
    ``{"test_list"}``, CodeContests ``{"public_tests",...}``, LiveCodeBench,
    PrimeIntellect ``{"test_cases"}``, SandboxFusion ``{"assert_case"}``) or
    the same as a JSON string, passed verbatim as ``dataset_json``; the same
    compressed as verl's r1 recipe stores them (:func:`compressed_tests`); a
    string that is neither, taken as assert code; a list of :class:`StdioCase`, ``(stdin, expected_stdout)`` pairs or
    ``{"stdin","expected_stdout"}`` dicts; a list of :class:`FunctionCase` or
    ``{"args","expected"}`` dicts (needs ``fn_name``); a list of assert strings
    (MBPP ``test_list``); a list of ``{"input","output"}`` dicts (LiveCodeBench).
    """
    if isinstance(tests, pb.CodeTests):
        out = pb.CodeTests()
        out.CopyFrom(tests)
    elif isinstance(tests, Mapping):
        out = pb.CodeTests(dataset_json=_dataset_dict(tests))
    elif isinstance(tests, str):
        out = _tests_from_str(tests)
    elif isinstance(tests, Iterable) and not isinstance(tests, (bytes, bytearray)):
        out = _tests_from_list(list(tests))
    else:
        raise InvalidRequest(f"tests of type {type(tests).__name__} are not supported")
    if fn_name is not None:
        out.fn_name = _check_str(fn_name, "fn_name", allow_empty=False)
    if entry_point is not None:
        out.entry_point = _check_str(entry_point, "entry_point", allow_empty=False)
    if out.function and not out.fn_name:
        raise InvalidRequest("function test cases need fn_name")
    return out


def _tests_from_str(tests: str) -> pb.CodeTests:
    if not tests.strip():
        raise InvalidRequest("tests must not be empty")
    tests = valid_json_escapes(valid_text(tests))
    try:
        parsed = json.loads(tests)
    except RecursionError:
        raise InvalidRequest("tests JSON is nested too deeply") from None
    except ValueError:
        decompressed = compressed_tests(tests)
        if decompressed is not None:
            return _tests_from_str(decompressed)
        # Not JSON: assert code, as in HumanEval's `test` or a hand-written check.
        return pb.CodeTests(assert_code=tests)
    if isinstance(parsed, Mapping):
        row = _with_private_cases_decompressed(parsed)
        _check_dataset_dict(row)
        if row is not parsed:
            return pb.CodeTests(dataset_json=to_json(dict(row)))
        # Verbatim: re-serialising could change numbers or key order the daemon's parser relies on.
        return pb.CodeTests(dataset_json=tests)
    if isinstance(parsed, list):
        return _tests_from_list(parsed, raw_json=tests)
    raise InvalidRequest(f"tests JSON must be an object or a list, got {type(parsed).__name__}")


def _tests_from_list(items: list[Any], raw_json: str | None = None) -> pb.CodeTests:
    if not items:
        raise InvalidRequest("tests must not be empty")
    first = items[0]
    if all(isinstance(t, StdioCase) for t in items):
        return pb.CodeTests(
            stdio=[pb.StdioCase(stdin=t.stdin, expected_stdout=t.expected_stdout) for t in items]
        )
    if all(isinstance(t, FunctionCase) for t in items):
        return pb.CodeTests(
            function=[
                pb.FunctionCase(args_json=to_json(list(t.args)), expected_json=to_json(t.expected))
                for t in items
            ]
        )
    if all(isinstance(t, str) for t in items):
        return pb.CodeTests(dataset_json=raw_json or to_json({"test_list": items}))
    if all(isinstance(t, (tuple, list)) and len(t) == 2 for t in items):
        return pb.CodeTests(stdio=[pb.StdioCase(stdin=_text(i), expected_stdout=_text(o)) for i, o in items])
    if all(isinstance(t, Mapping) for t in items):
        keys = set(first)
        if all(set(t) >= {"stdin", "expected_stdout"} for t in items):
            return pb.CodeTests(
                stdio=[
                    pb.StdioCase(stdin=_text(t["stdin"]), expected_stdout=_text(t["expected_stdout"]))
                    for t in items
                ]
            )
        if all(set(t) >= {"args", "expected"} for t in items):
            return pb.CodeTests(
                function=[
                    pb.FunctionCase(args_json=to_json(list(t["args"])), expected_json=to_json(t["expected"]))
                    for t in items
                ]
            )
        if all(set(t) >= {"input", "output"} for t in items):
            # LiveCodeBench: {"input","output","testtype"}; the daemon knows stdin vs functional.
            return pb.CodeTests(dataset_json=raw_json or to_json(items))
        raise InvalidRequest(f"test case dicts with keys {sorted(keys)} are not a known shape")
    raise InvalidRequest("tests list mixes shapes or holds an unsupported type")


def _text(value: Any) -> str:
    if isinstance(value, str):
        return valid_text(value)
    if isinstance(value, (bytes, bytearray)):
        return value.decode("utf-8", errors="replace")
    raise InvalidRequest(f"stdio test values must be str, got {type(value).__name__}")


def _set_tolerance(request: pb.CodeJob | pb.MathJob, float_tolerance: float | None) -> None:
    """Sets ``float_tolerance`` only when given: unset means the daemon's default (1e-6), while an
    explicit 0.0 (the field is proto3 ``optional``) asks for exact comparison."""
    tolerance = _check_finite(float_tolerance, "float_tolerance")
    if tolerance is not None:
        request.float_tolerance = tolerance


def check_reward_options(
    failure_value: float, code_options: Mapping[str, Any] | None, math_options: Mapping[str, Any] | None
) -> None:
    """Raise ValueError for reward-function settings that no row can make valid.

    The TRL and verl adapters build every row's job with these settings; left to the rows,
    a misspelt extraction or a failure value above a pass scored every completion as
    unscorable for the whole run. Each set of options must make the job of a plain row.
    """
    samples: tuple[tuple[str, Mapping[str, Any] | None, Callable[..., pb.Job]], ...] = (
        ("math_options", math_options, lambda **options: math_job("\\boxed{1}", "1", **options)),
        ("code_options", code_options, lambda **options: code_job("print(1)", [("", "1\n")], **options)),
    )
    for what, options, make in samples:
        try:
            make(**{"failure_value": failure_value, **dict(options or {})})
        except (InvalidRequest, TypeError) as error:
            raise ValueError(f"{what}: {error}") from None


@_refusing
def code_job(
    completion: str,
    tests: CodeTestsLike,
    *,
    language: str = "python",
    fn_name: str | None = None,
    entry_point: str | None = None,
    extraction: str = "last_block",
    tag: str | None = None,
    checker: str | None = None,
    float_tolerance: float | None = None,
    reward_mode: str = "binary",
    stop_on_first_failure: bool = False,
    timeout: float | None = None,
    memory_bytes: int | None = None,
    output_bytes: int | None = None,
    failure_value: float | None = None,
    total_timeout: float | None = None,
) -> pb.Job:
    """A job that extracts a program from ``completion`` and runs it against ``tests``.

    ``tests`` takes any shape :func:`code_tests` accepts. ``timeout`` is per test
    case; ``total_timeout`` bounds all of the test runs together (daemon default 300 s;
    the cases left when it runs out are failed, ``Limit.TOTAL_TIME``).
    ``failure_value`` is the reward for a model failure (daemon default -1.0).
    ``float_tolerance`` (float checker and function tests): None for the daemon's default
    (1e-6, absolute and relative), 0.0 for exact comparison. ``checker`` (stdout tests): None
    for the daemon's default: LiveCodeBench's own grader (``lines_decimal``) for its stdin tests,
    ``whitespace`` for other tests (``tokens_ignore_case``, CodeContests' tester, by name).
    """
    extraction_value = _enum(
        pb.CodeExtraction, "CODE_EXTRACTION_", extraction, _CODE_EXTRACTION, "extraction"
    )
    if extraction_value == pb.CODE_EXTRACTION_TAG and not tag:
        raise InvalidRequest("extraction='tag' needs tag")
    job = _job(
        timeout=timeout, memory_bytes=memory_bytes, output_bytes=output_bytes, failure_value=failure_value,
        total_timeout=total_timeout,
    )
    job.code.CopyFrom(
        pb.CodeJob(
            completion=_check_str(completion, "completion"),
            language=_check_str(language, "language", allow_empty=False),
            tests=code_tests(tests, fn_name=fn_name, entry_point=entry_point),
            extraction=extraction_value,
            tag=_check_str(tag, "tag") if tag else "",
            checker=pb.CHECKER_UNSPECIFIED if checker is None else _enum(pb.Checker, "CHECKER_", checker,
                                                                          _CHECKERS, "checker"),
            reward_mode=_enum(pb.RewardMode, "REWARD_MODE_", reward_mode, _REWARD_MODES, "reward_mode"),
            stop_on_first_failure=bool(stop_on_first_failure),
        )
    )
    _set_tolerance(job.code, float_tolerance)
    return job


@_refusing
def math_job(
    completion: str,
    ground_truth: str | int | float,
    *,
    extraction: str = "auto",
    float_tolerance: float | None = None,
    timeout: float | None = None,
    memory_bytes: int | None = None,
    failure_value: float | None = None,
) -> pb.Job:
    """A job that extracts the answer from ``completion`` and checks it against ``ground_truth``.

    ``float_tolerance``: None for the daemon's default (1e-6, relative; absolute against an
    integer), 0.0 for exact comparison.
    """
    if isinstance(ground_truth, bool) or not isinstance(ground_truth, (str, int, float)):
        raise InvalidRequest(f"ground_truth must be a str or number, got {type(ground_truth).__name__}")
    if isinstance(ground_truth, float) and not math.isfinite(ground_truth):
        raise InvalidRequest(f"ground_truth must be finite, got {ground_truth!r}")
    try:
        truth = valid_text(str(ground_truth))
    except ValueError:
        raise InvalidRequest("ground_truth is an int of more digits than Python writes out (4,300)") from None
    if not truth.strip():
        raise InvalidRequest("ground_truth must not be empty")
    job = _job(timeout=timeout, memory_bytes=memory_bytes, output_bytes=None, failure_value=failure_value)
    job.math.CopyFrom(
        pb.MathJob(
            completion=_check_str(completion, "completion"),
            ground_truth=truth,
            extraction=_enum(
                pb.MathExtraction, "MATH_EXTRACTION_", extraction, _MATH_EXTRACTION, "extraction"
            ),
        )
    )
    _set_tolerance(job.math, float_tolerance)
    return job


def _files(files: Mapping[str, str | bytes] | None) -> list[pb.File]:
    out = []
    for path, content in (files or {}).items():
        path = _check_str(path, "file path", allow_empty=False)
        if isinstance(content, str):
            content = valid_text(content).encode()
        if not isinstance(content, (bytes, bytearray)):
            raise InvalidRequest(f"file {path!r} content must be str or bytes")
        out.append(pb.File(path=path, content=bytes(content)))
    return out


@_refusing
def execute_job(
    code: str,
    language: str = "python",
    stdin: str | bytes = b"",
    *,
    args: Sequence[str] = (),
    files: Mapping[str, str | bytes] | None = None,
    collect_files: Sequence[str] = (),
    timeout: float | None = None,
    memory_bytes: int | None = None,
    output_bytes: int | None = None,
    failure_value: float | None = None,
) -> pb.Job:
    """A job that runs ``code`` as-is; reward 1.0 when it exits 0."""
    if isinstance(stdin, str):
        stdin = valid_text(stdin).encode()
    if not isinstance(stdin, (bytes, bytearray)):
        raise InvalidRequest("stdin must be str or bytes")
    if isinstance(args, str) or isinstance(collect_files, str):
        raise InvalidRequest("args and collect_files must be sequences of str, not a str")
    job = _job(
        timeout=timeout, memory_bytes=memory_bytes, output_bytes=output_bytes, failure_value=failure_value
    )
    job.execute.CopyFrom(
        pb.ExecuteJob(
            language=_check_str(language, "language", allow_empty=False),
            code=_check_str(code, "code"),
            stdin=bytes(stdin),
            args=[_check_str(a, "args item") for a in args],
            files=_files(files),
            collect_files=[_check_str(p, "collect_files item") for p in collect_files],
        )
    )
    return job


@_refusing
def reward_model_job(
    prompt: str,
    completion: str,
    *,
    model: str,
    timeout: float | None = None,
    failure_value: float | None = None,
) -> pb.Job:
    """A job that asks the configured reward model ``model`` to score (prompt, completion)."""
    job = _job(timeout=timeout, memory_bytes=None, output_bytes=None, failure_value=failure_value,
               scored_to_one=False)
    job.reward_model.CopyFrom(
        pb.RewardModelJob(
            model=_check_str(model, "model", allow_empty=False),
            prompt=_check_str(prompt, "prompt"),
            completion=_check_str(completion, "completion"),
        )
    )
    return job


_ROW_OPTIONS = {
    "code": (
        "language",
        "fn_name",
        "entry_point",
        "extraction",
        "tag",
        "checker",
        "float_tolerance",
        "reward_mode",
        "stop_on_first_failure",
        "timeout",
        "total_timeout",
        "memory_bytes",
        "output_bytes",
        "failure_value",
    ),
    "math": ("extraction", "float_tolerance", "timeout", "memory_bytes", "failure_value"),
}


def job_from_row(row: Mapping[str, Any], index: int = 0) -> pb.Job:
    """A job from one JSON object: ``kind`` ("code" or "math"; inferred from ``tests`` /
    ``ground_truth`` when absent), ``completion``, ``tests`` or ``ground_truth``, and any
    option of :func:`code_job` / :func:`math_job` under its own name."""
    if not isinstance(row, Mapping):
        raise InvalidRequest(f"row {index}: expected an object, got {type(row).__name__}")
    kind = row.get("kind") or ("code" if "tests" in row else "math" if "ground_truth" in row else None)
    if kind not in _ROW_OPTIONS:
        raise InvalidRequest(f"row {index}: kind must be 'code' or 'math' (or give tests / ground_truth)")
    required = "tests" if kind == "code" else "ground_truth"
    for key in ("completion", required):
        if key not in row:
            raise InvalidRequest(f"row {index}: a {kind} row needs {key!r}; it has {sorted(row)}")
    options = {k: row[k] for k in _ROW_OPTIONS[kind] if row.get(k) is not None}
    try:
        if kind == "code":
            job = code_job(row["completion"], row["tests"], **options)
        else:
            job = math_job(row["completion"], row["ground_truth"], **options)
    except InvalidRequest as e:
        raise InvalidRequest(f"row {index}: {e.message}") from e
    job.index = index
    return job


# Keys of a row that are not job options: what job_from_row reads besides them.
_ROW_FIELDS = ("kind", "completion", "tests", "ground_truth")


def ignored_row_options(row: Mapping[str, Any]) -> list[tuple[str, str]]:
    """``(key, option)`` for each key of `row` that :func:`job_from_row` ignores but that
    looks like a job option: a misspelling (``timeout_seconds`` for ``timeout``,
    ``memory`` for ``memory_bytes``), or an option of the other kind of row
    (``language`` on a math row). Other keys (``id``, ``prompt``, ...) are the
    caller's own data and are not reported. A row job_from_row refuses gives ``[]``.
    """
    if not isinstance(row, Mapping):
        return []
    kind = row.get("kind") or ("code" if "tests" in row else "math" if "ground_truth" in row else None)
    if kind not in _ROW_OPTIONS:
        return []
    own = set(_ROW_OPTIONS[kind]) | set(_ROW_FIELDS)
    every = sorted(own | {option for options in _ROW_OPTIONS.values() for option in options})
    found: list[tuple[str, str]] = []
    for key in row:
        if not isinstance(key, str) or key in own:
            continue
        if key in every:
            found.append((key, key))  # an option, of the other kind of row
            continue
        # A prefix either way (memory / memory_bytes, timeout_seconds / timeout) or the last words
        # (tolerance / float_tolerance), longest first, then spelling.
        prefixed = [option for option in every
                    if min(len(key), len(option)) >= 4
                    and (key.startswith(option) or option.startswith(key) or option.endswith("_" + key))]
        close = sorted(prefixed, key=len, reverse=True) or difflib.get_close_matches(key, every, n=1, cutoff=0.8)
        if close:
            found.append((key, close[0]))
    return found


def validate_job(job: Any) -> pb.Job:
    """Check a job built by hand before it is sent."""
    if not isinstance(job, pb.Job):
        raise InvalidRequest(f"expected a sandboxd.v1.Job (see code_job/math_job), got {type(job).__name__}")
    if job.WhichOneof("kind") is None:
        raise InvalidRequest("job has no kind (execute, code, math or reward_model)")
    if job.HasField("failure_value"):
        _check_finite(job.failure_value, "failure_value")
        _check_failure_below_a_pass(job.failure_value, job.WhichOneof("kind") != "reward_model")
    for name in ("timeout_seconds", "total_timeout_seconds"):
        value = getattr(job.limits, name)
        if not math.isfinite(value) or value < 0:
            raise InvalidRequest(f"limits.{name} must be finite and >= 0, got {value}")
    return job


def validate_batch(jobs: Iterable[Any]) -> list[pb.Job]:
    """Check every job of a batch; an empty batch is an error (it is always a caller bug)."""
    if isinstance(jobs, pb.Job):
        raise InvalidRequest("expected a sequence of jobs, got a single Job (use run())")
    out = [validate_job(j) for j in jobs]
    if not out:
        raise InvalidRequest("empty batch")
    return out


def count_cases(job: pb.Job) -> int:
    """How many runs a job will make, as far as the client can tell (for its deadline)."""
    if job.WhichOneof("kind") != "code":
        return 1
    tests = job.code.tests
    explicit = len(tests.stdio) + len(tests.function)
    if explicit:
        return explicit
    if tests.dataset_json:
        return _dataset_cases(tests.dataset_json)
    return 1


@functools.lru_cache(maxsize=32)
def _dataset_cases(dataset_json: str) -> int:
    # Cached: a GRPO group sends one problem's tests with every completion.
    try:
        data = json.loads(dataset_json)
    except (ValueError, RecursionError):
        return 1  # the daemon says what is wrong with it
    if isinstance(data, list):
        return max(1, len(data))
    if isinstance(data, Mapping):
        return _mapped_cases(data)
    return 1


def _mapped_cases(data: Mapping[str, Any]) -> int:
    try:
        n = len(data.get("inputs") or ()) + len(data.get("test_list") or ())
        for key in DATASET_KEYS["CodeContests"]:
            n += len((data.get(key) or {}).get("input") or ()) if isinstance(data.get(key), Mapping) else 0
        # LiveCodeBench's and PrimeIntellect's lists, which may come as JSON strings.
        for key in (*DATASET_KEYS["LiveCodeBench"], *DATASET_KEYS["PrimeIntellect"]):
            n += _listed_cases(data.get(key))
    except TypeError:
        return 1  # a count of what is no list: the daemon says what is wrong with it
    return max(1, n)


def _listed_cases(value: Any) -> int:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except (ValueError, RecursionError):
            return 0  # LiveCodeBench's released private cases are not JSON: the daemon refuses them
    return len(value) if isinstance(value, list) else 0


# The daemon moves a run's deadline on by the CPU the other runs of its
# sandbox took while it waited for one, up to this many times its limit
# (sandboxd.agent.protocol.DEADLINE_STRETCH; the client does not import the daemon).
DEADLINE_STRETCH = 3.0


def job_deadline(job: pb.Job, *, default_timeout: float, margin: float) -> float:
    """Seconds to give one job's RPC: its per-run limit times its runs (at most its total_timeout), stretched as
    far as the daemon may stretch them (DEADLINE_STRETCH), plus a margin."""
    runs = (job.limits.timeout_seconds or default_timeout) * count_cases(job)
    if job.limits.total_timeout_seconds:
        runs = min(runs, job.limits.total_timeout_seconds)
    return runs * DEADLINE_STRETCH + margin


def to_result(msg: pb.JobResult, *, index: int | None = None, failure_value: float = -1.0) -> Result:
    """Turn a ``JobResult`` into a :class:`Result` (``index`` overrides the wire index).

    A reward that is not finite (the contract says never; a reward model's raw score could be)
    becomes ``failure_value``, the job's own.
    """
    reward = msg.reward if math.isfinite(msg.reward) else failure_value
    return Result(
        index=msg.index if index is None else index,
        reward=reward,
        status=Status.from_proto(msg.status),
        message=msg.message,
        limit_hit=Limit.from_proto(msg.limit_hit),
        timings=Timings(msg.timings.queued_seconds, msg.timings.run_seconds, msg.timings.total_seconds),
        tests=tuple(
            TestResult(
                index=t.index,
                status=Status.from_proto(t.status),
                limit_hit=Limit.from_proto(t.limit_hit),
                time_seconds=t.time_seconds,
                stdout=t.stdout,
                stderr=t.stderr,
                message=t.message,
            )
            for t in msg.tests
        ),
        attempts=msg.attempts,
        retry_after_seconds=msg.retry_after_seconds,
        details=_detail(msg),
        node=msg.node,
    )


def _detail(msg: pb.JobResult) -> Detail:
    kind = msg.WhichOneof("detail")
    if kind == "code":
        d = msg.code
        return CodeDetail(d.extracted_code, d.language, d.tests_passed, d.tests_total, d.compile_output)
    if kind == "math":
        m = msg.math
        return MathDetail(m.extracted_answer, m.extraction, m.parsed_answer, m.parsed_ground_truth)
    if kind == "execute":
        e = msg.execute
        return ExecuteOutput(
            e.exit_code,
            e.stdout,
            e.stderr,
            e.stdout_truncated,
            e.stderr_truncated,
            {f.path: f.content for f in e.files},
        )
    if kind == "reward_model":
        r = msg.reward_model
        return RewardModelDetail(r.raw_score, r.model, r.device)
    return None


def failure_result(
    index: int, error: SandboxdError, *, failure_value: float, client_attempts: int
) -> Result:
    """The result the client makes for a job whose RPC failed for good (no sandbox answered: ``attempts`` 0)."""
    if isinstance(error, DeadlineExceeded):
        status = Status.DEADLINE_EXCEEDED
    elif isinstance(error, Overloaded):
        status = Status.OVERLOADED
    elif error.retryable:
        status = Status.UNAVAILABLE
    else:
        status = Status.INTERNAL
    retry_after = getattr(error, "retry_after", None) or 0.0
    return Result(
        index=index,
        reward=failure_value,
        status=status,
        message=error.message,
        retry_after_seconds=retry_after,
        error=error,
        client_attempts=client_attempts,
    )


@dataclass(frozen=True)
class CellResult:
    """The outcome of one session cell."""

    status: Status
    stdout: str
    stderr: str
    value: str
    session_alive: bool
    limit_hit: Limit = Limit.NONE
    files_changed: tuple[str, ...] = ()
    time_seconds: float = 0.0
    message: str = ""

    @property
    def ok(self) -> bool:
        """True when the cell ran without error."""
        return self.status == Status.OK


def to_cell_result(msg: pb.CellResult) -> CellResult:
    """Turn a ``CellResult`` message into a :class:`CellResult`."""
    return CellResult(
        status=Status.from_proto(msg.status),
        stdout=msg.stdout,
        stderr=msg.stderr,
        value=msg.value,
        session_alive=msg.session_alive,
        limit_hit=Limit.from_proto(msg.limit_hit),
        files_changed=tuple(msg.files_changed),
        time_seconds=msg.time_seconds,
        message=msg.message,
    )
