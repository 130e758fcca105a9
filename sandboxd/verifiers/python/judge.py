"""The judge's side of the two-process harness: :func:`run_tests` runs a plan's tests against the candidate at the
other end of a channel (function-call cases, or assert tests with the candidate's names bound as proxies and
``import solution`` answered by :class:`_CandidateModule`), and :func:`top_level_names` says which names a
program binds. Never executes candidate code.

Stdlib only: this module runs inside the sandbox image.
"""

from __future__ import annotations

import ast
import builtins
import collections
import contextlib
import decimal
import fractions
import functools
import io
import itertools
import os
import socket
import sys
import time
import traceback
import types
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, NoReturn, cast

from ..code import _SYNTAX_ERRORS, FunctionCase, _parse
from ..code.assembly import split_assembly
from ..code.plans import public_names, top_level_definitions
from .candidate import CANDIDATE_FRAME_BYTES, CANDIDATE_MODULE
from .pytest_emulation import _TEST_FILENAME, _hook, _run_test_functions, _run_unittest_cases
from .remote import (
    TEST_MODULE,
    CandidateDied,
    CandidateError,
    CandidateTimeout,
    JudgeEndpoint,
    RemoteIterator,
    TestsTimeUp,
    TooLargeForJudge,
    Unsupported,
    describe,
    watch_seeds,
)
from .wire import _ENCODER, MAX_CONTAINERS, MAX_DEPTH, MAX_FRAME_BYTES

# All the messages of one verdict, in the bytes of the judge's reply (ASCII
# JSON, where a character past ASCII takes 6 bytes, 12 past the BMP):
# thousands of failing cases each with a full message would not fit the
# judge's reply (16 MiB), and an oversized verdict would read as the judge's
# failure, not the candidate's. Past this, each further message is cut short,
# to ASCII.
VERDICT_MESSAGES_LIMIT = 4 << 20
# What is left of each message past VERDICT_MESSAGES_LIMIT, in characters.
CUT_MESSAGE_CHARS = 100
VALUE_TOO_LARGE = "the candidate's value took more memory to judge than the judge may use (MemoryError)"
# Items the judge reads at most of an iterator a function-call case returns, to compare it as a list.
MAX_ITERATOR_ITEMS = MAX_CONTAINERS


# Compiled test code a judge keeps (_compiled; and the names of prompts, _source_names), and the longest source it
# keeps. A judge answers 200 jobs (agent.host.judgeservers.RECYCLE_AFTER_JOBS) of at most two such sources each:
# it keeps all it sees. A HumanEval source's code object is about 2.4 KB, the densest 16 KiB source's 43 KB: 17 MB
# at most, within the growth that recycles a judge (64 MiB). Fewer than a batch's problems keep none of them when the
# batch cycles: 128 keep none of HumanEval's 164.
COMPILED_TESTS_CACHED = 400
COMPILED_TESTS_MAX_CHARS = 16 << 10


def top_level_names(code: str) -> list[str]:
    """Names a program binds at top level, in order: what tests may call.

    Functions, classes and assigned names, including those inside top-level
    ``if``/``try``/``with`` blocks; not imports, not dunder names. ``[]`` when
    the code does not parse.
    """
    tree = _parse(code)
    return [] if tree is None else top_level_definitions(tree)


def _program_names(program: str, assembly: Mapping[str, str] | None,
                   head_names: Sequence[str] | None = None) -> list[str]:
    """:func:`top_level_names` of the candidate's program, assembled as the candidate assembles it, in the judge.

    With a HumanEval prompt, the names of the part before a completion that
    comes whole after it (the prompt) are ``head_names`` (the daemon's), or
    parsed once per judge (:func:`_source_names`), and the completion's own
    tree gives the rest.
    Raises :class:`TooLargeForJudge` where the judge runs out of memory or of
    recursion on it: its syntax tree takes about 500 bytes of memory per
    byte of ``[1,1,1,...]`` (430 MiB for a 900 KB program, which compile()
    in the candidate does in 315 MiB), and a tree of any size would take the
    sandbox's memory beside its other jobs. The
    parser's own limits (its stack: a MemoryError for 200,000 nested ``-``;
    a RecursionError past about 3,000 levels) are the same in the candidate,
    whose load error is then the verdict (see :func:`run_tests`).
    """
    try:
        if assembly is None:
            return top_level_definitions(ast.parse(program))
        before, tree = split_assembly(program, assembly)
        if tree is None:
            return top_level_definitions(ast.parse(before))
        names = tuple(head_names) if head_names is not None else _source_names(before)
        if names is None:  # a head that does not parse alone: the whole program, as it runs
            return top_level_definitions(ast.parse(before + program))
        return public_names([*names, *top_level_definitions(tree)])
    except _SYNTAX_ERRORS:
        return []
    except (MemoryError, RecursionError) as exc:
        raise TooLargeForJudge(f"the program took more memory or nesting to parse than the judge may use "
                               f"({type(exc).__name__})") from None


def _source_names(source: str) -> tuple[str, ...] | None:
    """The dataset's code's top-level names (None: it does not parse alone), parsed once per judge when small."""
    if len(source) > COMPILED_TESTS_MAX_CHARS:
        return _parsed_names(source)
    return _parsed_names_small(source)


def _parsed_names(source: str) -> tuple[str, ...] | None:
    try:
        return tuple(top_level_definitions(ast.parse(source)))
    except _SYNTAX_ERRORS:
        return None


@functools.lru_cache(maxsize=COMPILED_TESTS_CACHED)
def _parsed_names_small(source: str) -> tuple[str, ...] | None:
    return _parsed_names(source)


def _short(value: object, limit: int = 200) -> str:
    """repr(value), cut to `limit` characters, without the repr of what the cut drops.

    The whole repr of a wrong answer of 900,000 pairs (13 MiB of reply)
    takes 236 MiB, for the first 200 characters of its message.
    """
    try:
        text = repr(_first_items(value, [limit]))
    except (CandidateDied, CandidateTimeout, Exception):  # an object of the candidate's that does not answer
        text = f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _first_items(value: object, room: list[int]) -> object:
    """`value` with its lists, tuples and dicts cut past their first `room[0]` items, counted over the whole value.

    Each item kept (in the order repr writes them) adds a character or more
    to the repr, so the repr of what is kept starts as the whole value's for
    `room` characters. Sets are kept whole: a smaller set may iterate in
    another order.
    """
    room[0] -= 1
    kind = type(value)
    if kind is list or kind is tuple:
        items = []
        for item in cast("Sequence[object]", value):
            if room[0] <= 0:
                break
            items.append(_first_items(item, room))
        return kind(items)
    if kind is dict:
        kept: dict[object, object] = {}
        for key, item in cast("dict[object, object]", value).items():
            if room[0] <= 0:
                break
            kept[key] = _first_items(item, room)
            room[0] -= 1
        return kept
    return value


def _as_case(case: object) -> FunctionCase:
    """A FunctionCase from a FunctionCase, a dict or an (args, expected) pair."""
    if isinstance(case, FunctionCase):
        return case
    if isinstance(case, Mapping):
        return FunctionCase(tuple(case["args"]), case["expected"], bool(case.get("unwrap_single", False)),
                            bool(case.get("int_keys", False)))
    args, expected = cast("Sequence[Any]", case)
    return FunctionCase(tuple(args), expected)


def _test(index: int, status: str, message: str = "") -> dict[str, object]:
    return {"index": index, "passed": status == "ok", "status": status, "message": message}


def _broken_status(exc: BaseException) -> str:
    if isinstance(exc, TestsTimeUp):
        return "total_time"
    if isinstance(exc, TooLargeForJudge):
        return "memory"
    return "timeout" if isinstance(exc, CandidateTimeout) else "died"



def _as_plain(value: object, depth: int = 0) -> object:
    """A function-call case's answer as the plain data its JSON expected value is: numpy's values as Python's,
    an iterator or a view as the list of its items, a deque or a range as a list, Counter and the other
    dicts as dicts, a whole Fraction or Decimal as an int and any other as a float.

    The judge's own values only (rebuilt from the wire, or the items of a candidate's iterator); an object of
    the candidate's stays what it is, and equals nothing (compare_values).
    """
    if depth > MAX_DEPTH:
        return value
    kind = type(value)
    if kind in (int, float, str, bool, bytes, complex) or value is None:
        return value
    depth += 1
    if getattr(kind, "_sandboxd_hybrid", False):
        # A value of a class of the candidate's derived from a value type (an IntEnum member, a str Enum's): its
        # base type's data, as json would have written it, with the judge's own methods.
        base: Callable[[Any], object] = next(
            base for base in kind.__mro__[1:] if base in (int, float, str, bytes, tuple, frozenset))
        return _as_plain(base(value), depth)
    if kind is list:
        return [_as_plain(item, depth) for item in cast("list[object]", value)]
    if isinstance(value, RemoteIterator):
        items = list(itertools.islice(value, MAX_ITERATOR_ITEMS + 1))
        if len(items) > MAX_ITERATOR_ITEMS:
            raise ValueError(f"the returned iterator holds more than {MAX_ITERATOR_ITEMS} items")
        return [_as_plain(item, depth) for item in items]
    if isinstance(value, tuple):  # namedtuples too
        return tuple(_as_plain(item, depth) for item in tuple.__iter__(value))
    if isinstance(value, dict) or kind is type({}.items()):
        return {_as_plain(k, depth): _as_plain(v, depth) for k, v in dict(value).items()}  # type: ignore[call-overload]
    if kind in (set, frozenset):
        return kind(_as_plain(item, depth) for item in cast("set[object]", value))
    if kind in (collections.deque, range, type({}.keys()), type({}.values())):
        return [_as_plain(item, depth) for item in cast("Iterable[object]", value)]
    if kind is bytearray:
        return bytes(cast("bytearray", value))
    if kind in (fractions.Fraction, decimal.Decimal):
        number = cast("fractions.Fraction | decimal.Decimal", value)
        return int(number) if number == int(number) else float(number)
    numpy = sys.modules.get("numpy")
    if numpy is not None and isinstance(value, (numpy.ndarray, numpy.generic)):
        return _as_plain(value.tolist() if isinstance(value, numpy.ndarray) else value.item(), depth)
    return value


def _function_case(
    remote: JudgeEndpoint, fn_name: str, index: int, case: FunctionCase, tolerance: float
) -> dict[str, object]:
    try:
        try:
            answer = _as_plain(remote.request("call_name", [fn_name, *case.call_args()]))
        finally:
            remote.forget_exports()
    except (CandidateDied, CandidateTimeout) as exc:
        return _test(index, _broken_status(exc), str(exc))
    except Unsupported as exc:
        return _test(index, "unsupported", str(exc))
    except MemoryError:
        return _test(index, "memory", VALUE_TOO_LARGE)
    except Exception as exc:
        if remote.broken is not None:
            return _test(index, _broken_status(remote.broken), str(remote.broken))
        text = describe(exc)["message"]  # str() of it may raise (an int past 4,300 digits in its args)
        return _test(index, "runtime_error",
                     text if isinstance(exc, CandidateError) else f"{type(exc).__name__}: {text}")
    try:
        if case.matches(answer, tolerance):
            return _test(index, "ok")
        return _test(index, "wrong_answer", f"expected {_short(case.expected)}, got {_short(answer)}")
    except MemoryError:
        # A value that barely fits the judge's budget when decoded, and what comparing it or describing it takes
        # runs past it (as the whole repr() of 900,000 pairs of ints, 13 MiB of reply, would for a wrong answer's
        # message without _short: 236 MiB): a memory verdict, not an INTERNAL job.
        return _test(index, "memory", VALUE_TOO_LARGE)
def _failure_line(exc: BaseException, source: str) -> str:
    lineno = None
    for frame, line in traceback.walk_tb(exc.__traceback__):
        if frame.f_code.co_filename == _TEST_FILENAME:
            lineno = line
    if lineno is None:
        return ""
    lines = source.splitlines()
    text = lines[lineno - 1].strip() if 0 < lineno <= len(lines) else ""
    return f" at line {lineno}: {text[:200]}"


def _own_names(*sources: str) -> frozenset[str]:
    """The top-level names the dataset's own code binds (not by importing them): the only ones the harness reads as
    its hooks (`check`, `pytestmark`, `setup_module`, ...)."""
    names: set[str] = set()
    for source in sources:
        if source:
            names.update(_names_bound(source))
    return frozenset(names)


# Top-level names of the dataset's sources a judge has parsed, by their length and hash (small keys: a judge lives
# for 200 jobs, and a training step's batch holds hundreds of problems, so more are kept than _compiled keeps). Not a
# hashlib digest: importing hashlib maps OpenSSL's libcrypto, 3.5 MB more in the zygote that every worker's fork
# copies the page tables of. The sources are the dataset's, and str hashes are keyed per process (SipHash): two
# of them that collide by chance are about one in 2^64.
_NAMES_BOUND: collections.OrderedDict[tuple[int, int], frozenset[str]] = collections.OrderedDict()
NAMES_BOUND_CACHED = 4096


def _names_bound(source: str) -> frozenset[str]:
    """One source's top-level names, parsed once per judge: a HumanEval prompt and its tests parsed for every job
    would cost the judge about 1 ms of each."""
    key = (len(source), hash(source))
    names = _NAMES_BOUND.get(key)
    if names is None:
        tree = _parse(source)
        names = frozenset(top_level_definitions(tree)) if tree is not None else frozenset()
        _NAMES_BOUND[key] = names
        if len(_NAMES_BOUND) > NAMES_BOUND_CACHED:
            _NAMES_BOUND.popitem(last=False)
    return names


def _is_test_failure(exc: BaseException) -> bool:
    """An assert that failed, or pytest's own failure (``pytest.fail``, ``pytest.raises``' "DID NOT RAISE")."""
    cls = type(exc)
    # Failed says its module is "builtins"; its base, OutcomeException, lives in _pytest.outcomes.
    return isinstance(exc, AssertionError) or (
        cls.__name__ == "Failed" and any(base.__module__ == "_pytest.outcomes" for base in cls.__mro__)
    )


class _CandidateModule(types.ModuleType):
    """The module the tests get for ``import solution``: its attributes are the candidate's module's, read when
    read (a constant, a function, a class); setting or deleting one (``mock.patch("solution.helper")``) sets
    or deletes the candidate's."""

    def __init__(self, remote: JudgeEndpoint, names: Sequence[str]) -> None:
        super().__init__(CANDIDATE_MODULE)
        object.__setattr__(self, "_sandboxd_remote", remote)
        # ``from solution import *`` binds these: the public names the tests' namespace binds anyway.
        object.__setattr__(self, "__all__", list(names))

    def __getattr__(self, name: str) -> Any:
        # No dunders: a candidate's `__getattr__` or `__path__` would change how imports resolve.
        if name.startswith("__") or name.startswith("_sandboxd"):
            raise AttributeError(name)
        remote: JudgeEndpoint = object.__getattribute__(self, "_sandboxd_remote")
        found = remote.request("globals", [name])
        remote.calls -= 1  # reading a name is not calling the candidate (see no_calls)
        if name not in found:
            raise AttributeError(f"module 'solution' has no attribute {name!r}")
        return found[name]

    def __setattr__(self, name: str, value: object) -> None:
        if name.startswith("__"):
            object.__setattr__(self, name, value)
            return
        object.__getattribute__(self, "_sandboxd_remote").request("setglobal", [name, value])

    def __delattr__(self, name: str) -> None:
        object.__getattribute__(self, "_sandboxd_remote").request("delglobal", [name])

    @property  # ModuleType's own __dict__ is the judge's; this one shows the candidate's
    def __dict__(self) -> dict[str, Any]:  # type: ignore[override]
        # pytest's monkeypatch saves a module attribute for its undo from the module's __dict__: an empty one made
        # it delete the candidate's global afterwards (`monkeypatch.setattr(solution, "LIMIT", 1)`, then NameError
        # in the next test), where the value read through the module is what it must put back.
        return _CandidateGlobals(self)


class _CandidateGlobals(dict[str, Any]):
    """A `_CandidateModule`'s ``__dict__`` as the tests see it: each name read from the candidate when asked.

    A dict (``dir(solution)`` takes nothing else) whose keys are the public names the module binds; its values are
    read through the module, never kept here.
    """

    def __init__(self, module: _CandidateModule) -> None:
        super().__init__(dict.fromkeys(object.__getattribute__(module, "__all__")))
        self._module = module

    def __getitem__(self, name: str) -> Any:
        try:
            return getattr(self._module, name)
        except AttributeError:
            raise KeyError(name) from None

    def get(self, name: str, default: Any = None) -> Any:
        try:
            return self[name]
        except KeyError:
            return default

@contextlib.contextmanager
def _importable(module: types.ModuleType) -> Iterator[None]:
    """``module`` in ``sys.modules`` while the tests run; afterwards what was there before (nothing, in a judge).

    The judge judges job after job: a later job's tests must not import an
    earlier job's module, whatever the tests did to ``sys.modules`` or raised.
    """
    name = module.__name__
    missing = object()
    before = sys.modules.get(name, missing)
    sys.modules[name] = module
    try:
        yield
    finally:
        if before is missing:
            sys.modules.pop(name, None)
        else:
            sys.modules[name] = before  # type: ignore[assignment]


def _compiled(source: str, filename: str) -> types.CodeType:
    """The dataset's trusted code (a HumanEval prompt, its tests), compiled once per judge when it is small.

    A judge serves up to 200 jobs, and a trainer sends many completions of
    one problem. Compiling HumanEval's prompt and tests each time costs
    about 0.1 ms of the judge's 0.6 ms per job. A code object runs in each job's
    own namespace: nothing of a job stays in it. Large sources are compiled
    each time, so that the cache cannot grow the judge towards its recycling
    (servers.RECYCLE_GROWTH_BYTES).
    """
    if len(source) > COMPILED_TESTS_MAX_CHARS:
        return compile(source, filename, "exec")
    return _compiled_small(source, filename)


@functools.lru_cache(maxsize=COMPILED_TESTS_CACHED)
def _compiled_small(source: str, filename: str) -> types.CodeType:
    return compile(source, filename, "exec")




@contextlib.contextmanager
def _job_environment(files: str) -> Iterator[None]:
    """While one job's tests run in a judge: empty stdin, stdout and stderr of their own, the job's files folder
    as the working directory and the folder of temporary files (the candidate's is the same), and the judge's
    own builtins, sys.modules entries and folder back afterwards, whatever the tests did."""
    saved = (sys.stdin, sys.stdout, sys.stderr, builtins.input, builtins.print, builtins.open)
    # tempfile, if this judge has imported it (a test's import; the zygote does not: see pytest_emulation._tmp_path),
    # and TMPDIR, which a tempfile imported during the job reads.
    temp_module = sys.modules.get("tempfile")
    saved_tempdir = getattr(temp_module, "tempdir", None)
    saved_tmpdir_variable = os.environ.get("TMPDIR")
    cwd = os.open(".", os.O_RDONLY | os.O_DIRECTORY) if files else -1
    sys.stdin, sys.stdout, sys.stderr = io.StringIO(""), io.StringIO(), io.StringIO()
    try:
        if files:
            os.chdir(files)
            os.environ["TMPDIR"] = files
            if temp_module is not None:
                setattr(temp_module, "tempdir", files)  # noqa: B010 - a module mypy cannot see here
        yield
    finally:
        sys.stdin, sys.stdout, sys.stderr, builtins.input, builtins.print, builtins.open = saved
        if files:
            temp_module = sys.modules.get("tempfile")
            if temp_module is not None:
                # None for a tempfile imported during the job: the next job's TMPDIR decides again.
                setattr(temp_module, "tempdir", saved_tempdir)  # noqa: B010
            if saved_tmpdir_variable is None:
                os.environ.pop("TMPDIR", None)
            else:
                os.environ["TMPDIR"] = saved_tmpdir_variable
        if cwd >= 0:
            os.fchdir(cwd)
            os.close(cwd)


def _bind_names(remote: JudgeEndpoint, namespace: dict[str, Any], names: Sequence[str],
                entry_point: str) -> list[str]:
    """Bind the candidate's top-level names the tests may use in their namespace; the names bound, in order.

    Never shadow a builtin: a candidate defining `abs` or `len` would
    otherwise answer for the tests' own `abs(candidate(x) - y) < 1e-6`.
    Names the trusted setup code (HumanEval's prompt) defined stay the
    dataset's, so its helpers (poly, encode_cyclic) cannot be replaced.
    """
    wanted = [name for name in names
              if name.isidentifier() and name not in namespace and not hasattr(builtins, name)
              and not (name.startswith("__") and name.endswith("__"))]
    if entry_point and entry_point not in wanted:
        wanted.append(entry_point)
    if not wanted:
        return []
    # The program's functions and classes came with its ready frame: only the rest is asked for (a name the program
    # does not define, its data, its objects). Nothing has called the program since, so they are as it holds them.
    known, remote.definitions = remote.definitions, {}
    found = {name: known[name] for name in wanted if name in known}
    asked = [name for name in wanted if name not in found]
    if asked:
        found.update(remote.request("globals", asked))
        remote.calls -= 1  # reading names is not calling the candidate (see no_calls)
    bound = []
    for name in wanted:
        if name in found:
            namespace[name] = found[name]
            bound.append(name)
        elif name == entry_point:
            namespace[name] = _Undefined(name)
    return bound


class _Undefined:
    """The entry point a program does not define: calling it fails as calling an undefined name would."""

    def __init__(self, name: str) -> None:
        self.__name__ = name

    def __call__(self, *args: object, **kwargs: object) -> NoReturn:
        raise NameError(f"name {self.__name__!r} is not defined")


def _run_assert(
    remote: JudgeEndpoint, names: Sequence[str], assert_code: str, entry_point: str, setup_code: str, files: str,
    own_names: Sequence[str] | None = None,
) -> dict[str, object]:
    # The tests' namespace is a module's, importable by its name while they run, as a test file's is under pytest:
    # @dataclass, typing.get_type_hints, pickle and enum look a class's module up in sys.modules.
    tests = types.ModuleType(TEST_MODULE)
    tests.__dict__["__builtins__"] = builtins
    with _importable(tests):
        return _run_assert_in(tests.__dict__, remote, names, assert_code, entry_point, setup_code, files, own_names)


def _run_assert_in(
    namespace: dict[str, Any], remote: JudgeEndpoint, names: Sequence[str], assert_code: str, entry_point: str,
    setup_code: str, files: str, own_names: Sequence[str] | None,
) -> dict[str, object]:
    if setup_code:
        try:
            exec(_compiled(setup_code, "<setup>"), namespace)
        except BaseException as exc:
            return _test(0, "setup_error", f"setup code failed: {describe(exc)['type']}: {exc}")
    try:
        own = frozenset(own_names) if own_names is not None else _own_names(setup_code, assert_code)
        # Not the names the tests bind themselves, even where they bind them only under a condition: a test file's
        # `pytestmark`, `check` or `setup_function` bound in an `except ImportError:` branch that did not run must
        # not be the program's (red team: a program's `pytestmark` of parametrize marks replaced the expected
        # values). The tests bind them as they run (`from solution import f`), or they are not bound.
        bound = _bind_names(remote, namespace, [name for name in names if name not in own], entry_point)
        module = _CandidateModule(remote, [name for name in bound if not name.startswith("_")])
        with _importable(module):
            exec(_compiled(assert_code, _TEST_FILENAME), namespace)
            check = _hook(namespace, own, "check")
            if entry_point and callable(check):
                check(namespace[entry_point])
            remote.forget_exports()
            _run_unittest_cases(namespace)
            remote.forget_exports()
            unsupported = _run_test_functions(namespace, assert_code, remote.calls > 0, remote, files, own)
    except (CandidateDied, CandidateTimeout) as exc:
        return _test(0, _broken_status(exc), str(exc))
    except BaseException as exc:
        if remote.broken is not None:
            return _test(0, _broken_status(remote.broken), str(remote.broken))
        where = _failure_line(exc, assert_code)
        if isinstance(exc, Unsupported) or remote.unsupported:
            # What the harness could not do as Python would may be why the test failed: not the model's fault.
            why = str(exc) if isinstance(exc, Unsupported) else remote.unsupported[0]
            return _test(0, "unsupported", f"the harness cannot run this test as Python would: {why}")
        if isinstance(exc, MemoryError) and not any(exc is raised for raised in remote.raised):
            # The judge's, not one the candidate raised: the tests ran out of its budget (judgeserver.JOB_MEMORY_BYTES)
            # on what the candidate gave them, or on their own.
            return _test(0, "memory", f"the tests ran out of the judge's memory{where}")
        description = describe(exc)
        text = f"{description['type']}{where}" + (
            f": {description['message']}" if description["message"] else ""
        )
        if _is_test_failure(exc) and not any(exc is raised for raised in remote.raised):
            return _test(0, "wrong_answer", text)
        return _test(0, "runtime_error", text)
    if remote.broken is not None:
        # The test code swallowed the failure (a bare except); it still fails.
        return _test(0, _broken_status(remote.broken), str(remote.broken))
    if unsupported:
        # Every test that ran passed; those left out may be the ones a wrong program fails.
        more = f" (and {len(unsupported) - 1} more)" if len(unsupported) > 1 else ""
        return _test(0, "unsupported", f"tests the harness cannot run as pytest would: {unsupported[0]}{more}")
    if remote.calls == 0:
        # Any program that loads would pass tests that check nothing.
        return _test(0, "no_calls", "the tests never called the candidate's code, so nothing was checked")
    return _test(0, "ok")
def run_tests(
    plan_kind: str,
    channel: socket.socket,
    *,
    names: Sequence[str] = (),
    files: str = "",
    assert_code: str = "",
    entry_point: str = "",
    fn_name: str = "",
    cases: Sequence[object] = (),
    tolerance: float = 1e-6,
    stop_on_first_failure: bool = False,
    setup_code: str = "",
    program: str = "",
    assembly: Mapping[str, str] | None = None,
    call_timeout: float | None = None,
    time_for_all: float | None = None,
    max_frame_bytes: int = MAX_FRAME_BYTES,
    on_result: Callable[[dict[str, object]], None] | None = None,
    cpu_credit: Callable[[], float] | None = None,
    deadline_stretch: float = 1.0,
    own_names: Sequence[str] | None = None,
    head_names: Sequence[str] | None = None,
) -> dict[str, object]:
    """Run a plan's tests against the candidate at the other end of ``channel``.

    Runs in the trusted test process; never executes candidate code.

    ``plan_kind="function"``: calls ``fn_name`` once per case (a
    :class:`~sandboxd.verifiers.code.FunctionCase`, a dict with ``args``,
    ``expected`` and optional ``unwrap_single`` and ``int_keys``, or an
    ``(args, expected)`` pair) and compares the decoded value with
    :func:`~sandboxd.verifiers.code.compare_values`.

    ``plan_kind="assert"``: executes ``setup_code`` (trusted dataset code, e.g.
    HumanEval's prompt), then binds the candidate's value (a proxy, for a
    function, class or object) of each of ``names`` (given, or computed with
    :func:`top_level_names` from ``program``, the candidate's code; with
    ``assembly``, from the program :func:`~sandboxd.verifiers.code.assemble`
    makes of it, as the candidate does) that neither shadows a builtin nor
    was defined by the setup code, and of ``entry_point`` always, in a fresh
    namespace; executes ``assert_code``; calls
    ``check(<entry_point proxy>)`` if it defined ``check``; runs the
    ``unittest.TestCase`` classes it defined; calls the pytest-style
    ``test*`` functions and ``Test*`` classes' methods it defined, as pytest
    would (parametrized ones once per parameter set, with the fixtures the
    tests define and pytest's own the harness provides; skipped or xfail ones
    are not called), except those its code refers to by name when something
    already called the candidate (it calls them itself). Meanwhile ``import
    solution`` (KodCode's ``from solution import f``) gives a module whose
    attributes are the candidate's (:class:`_CandidateModule`), removed from
    ``sys.modules`` again when the tests end. Any exception fails the test,
    and so does never calling the candidate (status ``no_calls``: nothing was
    checked). What crosses and how is remote's (values by value, the rest
    by reference). Tests that pytest would run but the harness cannot run as
    pytest would (a fixture nobody defines, an ``indirect`` parameter, an
    event loop) do not count as passed: when every test that ran passed, the
    status is ``unsupported`` (the dataset's tests, not the model's fault).

    ``call_timeout`` bounds each call (and the program's start-up) in seconds;
    ``time_for_all``, if given, all of them together from now: the call in
    flight when it runs out and every later one are ``total_time``, and the
    tests that ran keep their verdicts (a job's reward as a fraction of its
    cases counts them). Past that the caller enforces the deadline by
    killing both processes. Both move on by what ``cpu_credit()`` grows by
    meanwhile (the seconds the sandbox's other runs or the host's other load
    kept the candidate off a CPU it could have used), up to
    ``deadline_stretch`` times their span; ``past_stretch`` says whether the
    deadline the judge gave up on last had moved that far, the credit grown
    further (the candidate did not have its time).
    ``on_result`` gets each test's result as soon as it is known.
    ``own_names`` and ``head_names``: the dataset's own top-level names and
    those of what goes before a completion, as code.TestPlan gives them (the
    daemon parses them once per plan); without them the judge parses the
    dataset's code itself.
    The channel is shut down for writing at the end, which ends the candidate.

    Returns ``{"passed": bool, "passed_count": int, "total": int,
    "status": str, "message": str, "load_error": {"type", "message"} | None,
    "candidate_died": bool, "past_stretch": bool, "tests": [{"index", "passed",
    "status", "message"}]}``. Test statuses: ``ok``, ``wrong_answer``, ``runtime_error``
    (the candidate raised, or the test code did), ``timeout``, ``total_time``
    (``time_for_all`` ran out during the call or before it), ``died`` (the
    candidate exited or broke the protocol), ``load_error`` (the program
    raised while loading, ``SystemExit`` and ``SyntaxError`` included),
    ``memory`` (the candidate's program or a reply of it was too large for
    the judge to read, :class:`TooLargeForJudge`, or the judge ran out of
    memory judging a value or running the tests),
    ``setup_error`` (the trusted setup code failed: not the model's fault),
    ``no_calls`` (the tests never called the candidate: not the model's fault either),
    ``unsupported`` (see above: not the model's fault either).
    ``status`` is the first failing test's, else ``ok``; ``tests`` lists the
    tests run, which is fewer than ``total`` after ``stop_on_first_failure``.
    """
    if plan_kind not in ("function", "assert"):
        raise ValueError(f"run_tests handles 'function' and 'assert' plans, not {plan_kind!r}")
    if plan_kind == "function" and (not fn_name or not cases):
        raise ValueError("function tests need fn_name and at least one case")
    total = len(cases) if plan_kind == "function" else 1
    tests: list[dict[str, object]] = []

    messages_size = 0

    def report(result: dict[str, object]) -> None:
        nonlocal messages_size
        message = str(result["message"])
        if messages_size > VERDICT_MESSAGES_LIMIT:
            cut = message[:CUT_MESSAGE_CHARS].encode("ascii", "backslashreplace").decode("ascii")
            result["message"] = message = cut[:CUT_MESSAGE_CHARS]
        # Counted as the reply will hold it: 700 failing cases of the candidate's longest error, in characters past
        # the BMP, are 1.5 Mi characters but a 17 MiB reply.
        messages_size += len(message) if message.isascii() else len(_ENCODER.encode(message))
        tests.append(result)
        if on_result is not None:
            on_result(result)

    deadline = None if time_for_all is None else time.monotonic() + time_for_all
    too_large: TooLargeForJudge | None = None
    if plan_kind == "assert" and program:
        # Here, in the trusted test process, while the candidate loads the same program: parsing 1 MiB of it
        # takes 1.3-1.7 s, which the daemon's event loop would pay if it sent the names.
        try:
            names = _program_names(program, assembly, head_names)
        except TooLargeForJudge as exc:
            too_large = exc
    watch_seeds()  # once per judge: the tests' random.seed reaches the program's generator (remote.SEEDED)
    remote = JudgeEndpoint(channel, max_frame_bytes, call_timeout, deadline, cpu_credit=cpu_credit,
                           deadline_stretch=deadline_stretch, send_limit=CANDIDATE_FRAME_BYTES, files=files)
    try:
        with _job_environment(files):
            _run_plan(remote, plan_kind, total, report, too_large, names, assert_code, entry_point, setup_code,
                      fn_name, cases, tolerance, stop_on_first_failure, files, own_names)
    finally:
        # End of file tells the candidate to exit.
        with contextlib.suppress(OSError):
            channel.shutdown(socket.SHUT_WR)
    passed_count = sum(1 for test in tests if test["passed"])
    first_failure = next((test for test in tests if not test["passed"]), None)
    return {
        "passed": total > 0 and passed_count == total,
        "passed_count": passed_count,
        "total": total,
        "status": "ok" if first_failure is None else first_failure["status"],
        "message": "" if first_failure is None else str(first_failure["message"]),
        "load_error": remote.load_error,
        "candidate_died": isinstance(remote.broken, CandidateDied) and remote.load_error is None,
        "past_stretch": remote.past_stretch,
        "tests": tests,
    }


def _run_plan(remote: JudgeEndpoint, plan_kind: str, total: int, report: Callable[[dict[str, object]], None],
              too_large: TooLargeForJudge | None, names: Sequence[str], assert_code: str, entry_point: str,
              setup_code: str, fn_name: str, cases: Sequence[object], tolerance: float, stop_on_first_failure: bool,
              files: str, own_names: Sequence[str] | None) -> None:
    try:
        remote.load_error = remote.handshake()
    except (CandidateDied, CandidateTimeout) as exc:
        for index in range(total):
            report(_test(index, _broken_status(exc), f"before the program was ready: {exc}"))
        return
    if remote.load_error is not None:
        text = f"{remote.load_error['type']}: {remote.load_error['message']}"
        for index in range(total):
            report(_test(index, "load_error", text))
    elif too_large is not None:
        # Only now: a program the candidate could not load either is that load error.
        report(_test(0, "memory", str(too_large)))
    elif plan_kind == "function":
        for index, case in enumerate(cases):
            result = _function_case(remote, fn_name, index, _as_case(case), tolerance)
            report(result)
            if stop_on_first_failure and not result["passed"]:
                break
    else:
        report(_run_assert(remote, names, assert_code, entry_point, setup_code, files, own_names))
