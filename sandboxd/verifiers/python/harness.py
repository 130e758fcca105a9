"""Two-process harness for Python function-call and assert tests.

The candidate's code and the tests never share a process:

- the **candidate process** runs :func:`serve_candidate`: it executes the
  candidate's program, then answers requests over a connected ``AF_UNIX``
  ``SOCK_STREAM`` socket until end of file;
- the **test process** (the judge: another uid; it never runs candidate code)
  runs :func:`run_tests`: it runs the dataset's tests, whose calls of the
  candidate's functions, classes and objects become requests (remote), and
  judges what comes back itself.

Values cross the channel by value, rebuilt on the other side from its own
classes (wire): a list, a numpy array, a ``Fraction`` or a namedtuple
that the candidate returns is the judge's own when the test compares it, so
nothing the candidate does in its own process (a lying ``__eq__``, patched
builtins or ``AssertionError``, ``sys.exit(0)``, printing "All tests
passed") can make a test pass, and the expected values never enter the
candidate's process. Everything else crosses by reference (remote): the
candidate's objects are answered by the candidate (``len(stack)``, ``node.next``),
compared only with its own objects; the test's callbacks, mocks and buffers
by the judge, within the rules remote states.

The first frame from the candidate is ``{"ready": true}`` or
``{"load_error": {"type": str, "message": str}}`` (then the candidate
exits). Tests that import the candidate as a module (KodCode and other
pytest-style datasets: ``from solution import f``, ``import solution``) get,
while they run, a module named ``solution`` in the test process whose
attributes are read from the candidate's (see :func:`_candidate_module`); the
candidate's code is never imported there. What the candidate prints during a
call is printed in the judge when the call returns (``redirect_stdout`` and
``capsys`` see it); ``input()`` and ``sys.stdin`` read the test's (empty
unless it patches them); a test that patches ``builtins.print`` or
``builtins.open`` is obeyed by the candidate's.

End of file on the socket means the candidate is gone: the call in flight and
every later one fail. ``SystemExit`` (or any other ``BaseException`` that is
not an ``Exception``) raised by a call ends the candidate process, as it would
end a program.

Stdlib only: this module runs inside the sandbox image (pytest, where a
dataset's tests import it, comes from the image).
"""

from __future__ import annotations

import ast
import bisect  # noqa: F401 - this and the other F401s: warmed in the zygote for IMPLICIT_IMPORTS
import builtins
import collections
import contextlib
import copy  # noqa: F401
import datetime  # noqa: F401
import decimal
import fractions
import functools
import heapq  # noqa: F401
import inspect
import io
import itertools
import json  # noqa: F401
import logging
import operator  # noqa: F401
import os
import pathlib
import random  # noqa: F401
import re  # noqa: F401
import socket
import statistics  # noqa: F401
import string  # noqa: F401
import sys
import tempfile
import time
import traceback
import types
import typing
import unittest
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence, Set
from typing import Any, NoReturn, cast

from ..code import _SYNTAX_ERRORS, FunctionCase, _parse, assemble
from ..code.assembly import split_assembly
from .remote import (
    MESSAGE_LIMIT,
    TEST_MODULE,
    TIME_UP_MESSAGE,
    CandidateClass,
    CandidateDied,
    CandidateEndpoint,
    CandidateError,
    CandidateTimeout,
    JudgeEndpoint,
    Proxy,
    RemoteIterator,
    TestsTimeUp,
    TooLargeForJudge,
    Unsupported,
    describe,
)
from .wire import (
    _ENCODER,
    MAX_CONTAINERS,
    MAX_DEPTH,
    MAX_FRAME_BYTES,
    MAX_INT_BITS,
    FrameTooLarge,
    ProtocolError,
    RejectedValue,
    decode_value,
    encode_value,
    recv_frame,
    send_frame,
)

__all__ = [
    "CANDIDATE_FRAME_BYTES",
    "MAX_CONTAINERS",
    "MAX_DEPTH",
    "MAX_FRAME_BYTES",
    "MAX_INT_BITS",
    "TIME_UP_MESSAGE",
    "CandidateDied",
    "CandidateError",
    "CandidateTimeout",
    "FrameTooLarge",
    "ProtocolError",
    "RejectedValue",
    "TestsTimeUp",
    "TooLargeForJudge",
    "decode_value",
    "encode_value",
    "recv_frame",
    "run_tests",
    "send_frame",
    "serve_candidate",
    "top_level_names",
    "warm",
]

# What the judge may send the candidate in one frame: the dataset's own data, which a performance test
# makes large (3 million ints are 24 MB of JSON). The candidate's own memory limit bounds what it decodes.
CANDIDATE_FRAME_BYTES = 1 << 30
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
# Name of the candidate's module: not "__main__", so that a completion's
# `if __name__ == "__main__":` block (reading stdin, unittest.main() which
# calls sys.exit) does not run, as in HumanEval's and LiveCodeBench's harnesses.
# Also the name under which the tests import it (KodCode's `from solution import f`).
CANDIDATE_MODULE = "solution"

# LeetCode's Python environment, and the graders of the datasets drawn from it (LiveCodeBench's
# testing_util, TACO's, DeepCoder's and verl's), put these names in a solution's namespace before
# it runs: a solution that uses defaultdict, heappush, bisect_left, inf or @cache without importing
# it is correct there, and failed here with a NameError. Function-call tests give the candidate the
# same names (LiveCodeBench's import_string, less its recursion limit); the name a test calls must
# still be the program's own (see _resolve). The modules are imported below as well, so that the
# code sandboxes' zygote holds them and a job's star imports only copy names.
IMPLICIT_IMPORTS = (
    "from string import *\nfrom re import *\nfrom datetime import *\nfrom collections import *\n"
    "from heapq import *\nfrom bisect import *\nfrom copy import *\nfrom math import *\n"
    "from random import *\nfrom statistics import *\nfrom itertools import *\nfrom functools import *\n"
    "from operator import *\nfrom io import *\nfrom sys import *\nfrom json import *\n"
    "from builtins import *\nfrom typing import *\n"
    "import string\nimport re\nimport datetime\nimport collections\nimport heapq\nimport bisect\n"
    "import copy\nimport math\nimport random\nimport statistics\nimport itertools\nimport functools\n"
    "import operator\nimport io\nimport sys\nimport json\n"
)
# Compiled once, in the zygote: 0.07 ms of each function-call job's 0.14 ms for these imports (measured on the host).
_IMPLICIT_IMPORTS_CODE = compile(IMPLICIT_IMPORTS, "<implicit imports>", "exec")

_TEST_FILENAME = "<test>"
# Compiled test code a judge keeps (_compiled; and the names of prompts, _source_names), and the longest source it
# keeps. A judge answers 200 jobs (agent.host.judgeservers.RECYCLE_AFTER_JOBS) of at most two such sources each:
# it keeps all it sees. A HumanEval source's code object is about 2.4 KB, the densest 16 KiB source's 43 KB: 17 MB
# at most, within the growth that recycles a judge (64 MiB). 128 kept none of a batch of 164 problems cycled.
COMPILED_TESTS_CACHED = 400
COMPILED_TESTS_MAX_CHARS = 16 << 10


# ---------------------------------------------------------------------------
# Candidate side
# ---------------------------------------------------------------------------

# What IMPLICIT_IMPORTS bound in this candidate's module, by name (set by _serve).
_implicit_names: dict[str, object] = {}


def _resolve(target: str, namespace: dict[str, Any]) -> Any:
    """The callable a function-call test names: a top-level name, ``Class.method`` (on a fresh instance, as
    LeetCode's judge does) or a method of a top-level ``Solution`` class.

    A name still bound to what IMPLICIT_IMPORTS bound is not the program's: the tests of a
    gcd or sqrt that the program never wrote must not call math's (nor would a program's own
    `from math import gcd` pass them).
    """
    if not all(part.isidentifier() for part in target.split(".")):
        raise ProtocolError(f"bad call target {target!r}")
    name = target.partition(".")[0]
    if name in _implicit_names and namespace.get(name) is _implicit_names[name]:
        namespace = {key: value for key, value in namespace.items() if key != name}
    if "." in target:
        class_name, _, method = target.partition(".")
        if "." in method:
            raise ProtocolError(f"bad call target {target!r}")
        cls = namespace.get(class_name)
        if not isinstance(cls, type):
            raise NameError(f"no top-level class {class_name!r}")
        return getattr(cls(), method)
    if target in namespace:
        return namespace[target]
    solution = namespace.get("Solution")
    # LeetCode-style datasets (LiveCodeBench functional tests) name the method only.
    if isinstance(solution, type) and hasattr(solution, target):
        return getattr(solution(), target)
    raise NameError(f"name {target!r} is not defined")
def end_if_forked(own_pid: int) -> None:
    """End here, silently, if this is a child the candidate forked (os.fork) that came back into our loop.

    Parent and child share the channel: the child's frames interleaved with
    its parent's, so a correct program that forked was scored on its
    child's answers, or on none. The child ends as it would have at the end
    of ``python main.py``: its output flushed, exit status 0.
    """
    if os.getpid() != own_pid:
        _flush_stdio()
        os._exit(0)


def _flush_stdio() -> None:
    for stream in (sys.stdout, sys.stderr):
        # The candidate may have replaced or closed them.
        with contextlib.suppress(BaseException):
            stream.flush()



def _serve(code: str, channel: socket.socket, max_frame_bytes: int, assembly: Mapping[str, str] | None,
           implicit_imports: bool = False, files: str = "") -> int:
    own_pid = os.getpid()
    module = types.ModuleType(CANDIDATE_MODULE)
    module.__file__ = "<solution>"
    # Registered so that dataclasses, typing.get_type_hints and pickle find it.
    sys.modules[CANDIDATE_MODULE] = module
    namespace = module.__dict__
    endpoint = CandidateEndpoint(channel, max_frame_bytes, CANDIDATE_FRAME_BYTES, namespace,
                                 lambda target: _resolve(target, namespace), own_pid=own_pid, files=files)
    # Whatever fd 0 is, input() reads the test's stdin (empty unless a test patches it), never blocks.
    endpoint.install()
    try:
        if implicit_imports:
            before = set(namespace)
            exec(_IMPLICIT_IMPORTS_CODE, namespace)
            _implicit_names.update((name, namespace[name]) for name in namespace if name not in before)
        if assembly is not None:
            code = assemble(code, assembly)  # a MemoryError here is the program's load error too
        exec(compile(code, "<solution>", "exec"), namespace)
    except BaseException as exc:  # SystemExit at import time is a failed load, not a success
        end_if_forked(own_pid)
        endpoint.send({"load_error": describe(exc)})
        return 1
    end_if_forked(own_pid)
    endpoint.send({"ready": True})
    while True:
        try:
            request = endpoint.receive()
        except EOFError:
            return 0
        if "q" not in request:
            raise ProtocolError("a frame that is not a request")
        # A child the program forked that returns here ends in send (CandidateEndpoint.own_pid), before it writes.
        endpoint.send(endpoint.serve(request))


def serve_candidate(code: str, channel: socket.socket, *, max_frame_bytes: int = MAX_FRAME_BYTES,
                    assembly: Mapping[str, str] | None = None, implicit_imports: bool = False,
                    files: str = "") -> NoReturn:
    """Run the candidate's program and answer requests on ``channel`` until end of file.

    With ``assembly`` (a HumanEval prompt's, from
    :func:`~sandboxd.verifiers.code.program_assembly`), the program is first
    made of ``code`` by :func:`~sandboxd.verifiers.code.assemble`, as the
    judge makes it. Executes the program (compiled with filename
    ``"<solution>"``) as the body of a fresh module named ``"solution"``
    (so ``if __name__ == "__main__":`` blocks do not run), with its stdio
    and ``input()`` the test's (see the module docstring). Sends
    ``{"ready": true}``, or ``{"load_error": ...}`` if the program raised
    (``SyntaxError`` and ``SystemExit`` included), then serves requests
    (remote.CandidateEndpoint). With ``implicit_imports`` (function-call
    tests), IMPLICIT_IMPORTS runs in the module first, as LeetCode's
    environment does. ``files``: the job's folder, the program's working
    directory, which it shares with its tests (remote.share_files).
    Exceptions of requests are answered as errors; a
    ``BaseException`` that is not an ``Exception`` ends the process.

    Never returns: the process ends with ``os._exit`` (0 after end of file,
    1 after a failed load or any other way out), so nothing the parent
    process registered (atexit, buffered files) runs in this one.
    """
    status = 1
    try:
        status = _serve(code, channel, max_frame_bytes, assembly, implicit_imports, files)
    except BaseException:  # whatever happened, the test process sees "candidate gone"
        status = 1
    finally:
        _flush_stdio()
        os._exit(status)


# ---------------------------------------------------------------------------
# Warm-up, in the zygote
# ---------------------------------------------------------------------------

# Small jobs of the shapes the datasets use, whose candidate side the zygote runs before it forks any worker: a
# HumanEval-style assert job (its prompt assembled with the completion) and a LeetCode-style function-call job.
_WARM_PROMPT = 'from typing import List\n\n\ndef shift(xs: List[int], k: int) -> List[int]:\n    """Add k."""\n'
_WARM_COMPLETION = _WARM_PROMPT + "    return [x + k for x in xs]\n"
_WARM_TEST = ("def check(candidate):\n    assert candidate([1, 2], 1) == [2, 3]\n    assert candidate([], 3) == []\n"
              "    assert abs(candidate([0.5], 1)[0] - 1.5) < 1e-6\n    assert candidate(['a'], 'b') == ['ab']\n"
              "    assert candidate([True], 1) == [2]\n")
_WARM_CASES = ({"args": [[1, 2], 1], "expected": [2, 3]}, {"args": [[], 3], "expected": []},
               {"args": [["a"], "b"], "expected": ["ab"]})
# Runs of each: CPython quickens a code object after its first few runs (PEP 659), and its inline caches then settle.
WARM_UP_RUNS = 10


def _warm_jobs() -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(the candidate's arguments of :func:`_serve`, the judge's of :func:`run_tests`) of each warm-up job."""
    assembly = {"head": "", "prompt": _WARM_PROMPT, "prompt_head": _WARM_PROMPT.partition("def ")[0],
                "entry_point": "shift"}
    return [
        ({"code": _WARM_COMPLETION, "assembly": assembly},
         {"plan_kind": "assert", "program": _WARM_COMPLETION, "assembly": assembly, "assert_code": _WARM_TEST,
          "entry_point": "shift", "setup_code": _WARM_PROMPT}),
        ({"code": _WARM_COMPLETION, "assembly": None, "implicit_imports": True},
         {"plan_kind": "function", "fn_name": "shift", "cases": list(_WARM_CASES)}),
    ]


def warm(runs: int = WARM_UP_RUNS) -> int:
    """Run the candidate's side of the warm-up jobs ``runs`` times each in this process, each against a judge in a
    child process; the number of runs whose verdict passed.

    The zygote calls it (``--warm``) before it freezes its heap and forks
    workers. CPython 3.11 counts a code object's first runs in the code
    object and then rewrites its bytecode in place with inline caches: done
    in every candidate, those writes fell on pages each worker shares with
    the zygote, one copy-on-write fault each (on the host, a HumanEval
    candidate took about 715 faults cold, 650 warmed). Done here, the
    workers inherit the quickened code. Leaves nothing of the jobs behind
    (builtins, stdio, ``sys.modules``); a run that fails ends the warm-up
    (reported on stderr, never raised: a zygote without it is only slower).
    """
    saved = (builtins.input, builtins.print, builtins.open, sys.stdin, sys.stdout, sys.stderr)
    passed, failure = 0, ""
    try:
        for _ in range(runs):
            for candidate, judge in _warm_jobs():
                if not _warm_run(candidate, judge):
                    raise RuntimeError(f"a warm-up job ({judge['plan_kind']}) did not pass")
                passed += 1
    except Exception:
        failure = traceback.format_exc()
    finally:
        builtins.input, builtins.print, builtins.open, sys.stdin, sys.stdout, sys.stderr = saved
        sys.modules.pop(CANDIDATE_MODULE, None)
        _implicit_names.clear()
    if failure:  # on the zygote's own stderr, now that the candidate's is gone
        sys.stderr.write(f"python harness warm-up stopped after {passed} runs:\n{failure}")
    return passed


def _warm_run(candidate: dict[str, Any], judge: dict[str, Any]) -> bool:
    ours, theirs = socket.socketpair()
    try:
        pid = os.fork()
        if pid == 0:
            status = 1
            try:
                ours.close()
                verdict = run_tests(channel=theirs, **judge)
                status = 0 if verdict["passed"] else 1
            finally:
                os._exit(status)
        theirs.close()
        _serve(channel=ours, max_frame_bytes=MAX_FRAME_BYTES, **candidate)
    finally:
        ours.close()
        theirs.close()
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0


# ---------------------------------------------------------------------------
# Test side
# ---------------------------------------------------------------------------


def top_level_names(code: str) -> list[str]:
    """Names a program binds at top level, in order: what tests may call.

    Functions, classes and assigned names, including those inside top-level
    ``if``/``try``/``with`` blocks; not imports, not dunder names. ``[]`` when
    the code does not parse.
    """
    tree = _parse(code)
    return [] if tree is None else _definitions(tree)


def _definitions(tree: ast.Module) -> list[str]:
    names: list[str] = []

    def add_target(target: ast.expr) -> None:
        if isinstance(target, ast.Name):
            names.append(target.id)
        elif isinstance(target, (ast.Tuple, ast.List)):
            for element in target.elts:
                add_target(element)
        elif isinstance(target, ast.Starred):
            add_target(target.value)

    # A stack, not recursion: an if with 1,500 elifs (each the orelse of the one before) raised RecursionError in
    # the daemon, which answered the request UNKNOWN (red team).
    bodies: list[Iterator[ast.stmt]] = [iter(tree.body)]
    while bodies:
        node = next(bodies[-1], None)
        if node is None:
            bodies.pop()
            continue
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.append(node.name)
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                add_target(target)
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
            add_target(node.target)
        elif isinstance(node, ast.If):
            bodies.append(itertools.chain(node.body, node.orelse))
        elif isinstance(node, (ast.With, ast.AsyncWith)):
            bodies.append(iter(node.body))
        elif isinstance(node, ast.Try) or type(node).__name__ == "TryStar":
            bodies.append(itertools.chain(node.body, *(handler.body for handler in node.handlers),  # type: ignore[attr-defined]
                                          node.orelse, node.finalbody))  # type: ignore[attr-defined]
    return _public(names)


def _public(names: Iterable[str]) -> list[str]:
    """Each name once, at its first place, without dunder names."""
    return [name for name in dict.fromkeys(names) if not (name.startswith("__") and name.endswith("__"))]


def _program_names(program: str, assembly: Mapping[str, str] | None) -> list[str]:
    """:func:`top_level_names` of the candidate's program, assembled as the candidate assembles it, in the judge.

    With a HumanEval prompt, the names of the part before a completion that
    comes whole after it (the prompt) are parsed once per judge
    (:func:`_source_names`), and the completion's own tree gives the rest.
    Raises :class:`TooLargeForJudge` where the judge runs out of memory or of
    recursion on it: its syntax tree takes about 500 bytes of memory per
    byte of ``[1,1,1,...]`` (430 MiB for a 900 KB program here, which
    compile() in the candidate does in 315 MiB). Before, the judge built a
    tree of any size, in the sandbox's memory beside its other jobs. The
    parser's own limits (its stack: a MemoryError for 200,000 nested ``-``;
    a RecursionError past about 3,000 levels) are the same in the candidate,
    whose load error is then the verdict (see :func:`run_tests`).
    """
    try:
        if assembly is None:
            return _definitions(ast.parse(program))
        before, tree = split_assembly(program, assembly)
        if tree is None:
            return _definitions(ast.parse(before))
        names = _source_names(before)
        if names is None:  # a head that does not parse alone: the whole program, as it runs
            return _definitions(ast.parse(before + program))
        return _public([*names, *_definitions(tree)])
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
        return tuple(_definitions(ast.parse(source)))
    except _SYNTAX_ERRORS:
        return None


@functools.lru_cache(maxsize=COMPILED_TESTS_CACHED)
def _parsed_names_small(source: str) -> tuple[str, ...] | None:
    return _parsed_names(source)


def _short(value: object, limit: int = 200) -> str:
    """repr(value), cut to `limit` characters, without the repr of what the cut drops.

    A wrong answer of 900,000 pairs (13 MiB of reply) took a 236 MiB repr
    for the first 200 characters of its message.
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
        text = str(exc)[:MESSAGE_LIMIT]
        return _test(index, "runtime_error",
                     text if isinstance(exc, CandidateError) else f"{type(exc).__name__}: {text}")
    try:
        if case.matches(answer, tolerance):
            return _test(index, "ok")
        return _test(index, "wrong_answer", f"expected {_short(case.expected)}, got {_short(answer)}")
    except MemoryError:
        # A value that barely fitted the judge's budget when decoded, and what comparing it or describing it takes
        # runs past it: the whole repr() of 900,000 pairs of ints (13 MiB of reply, 236 MiB decoded) for a wrong
        # answer's message did, before _short, and the job ended INTERNAL.
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


def _run_unittest_cases(namespace: dict[str, Any]) -> None:
    """Run the unittest.TestCase classes the test code defined; AssertionError on failure."""
    loader = unittest.TestLoader()
    suite = unittest.TestSuite()
    for value in list(namespace.values()):
        if (
            isinstance(value, type)
            and issubclass(value, unittest.TestCase)
            and value is not unittest.TestCase
        ):
            suite.addTests(loader.loadTestsFromTestCase(value))
    if suite.countTestCases() == 0:
        return
    stream = io.StringIO()
    result = unittest.TextTestRunner(stream=stream, verbosity=0).run(suite)
    if not result.wasSuccessful():
        failures = result.failures + result.errors
        first = failures[0][1].strip().splitlines()[-1] if failures else "unexpected success"
        raise AssertionError(f"{len(failures)} of {result.testsRun} unittest tests failed; first: {first}")


def _is_main_guard(node: ast.If) -> bool:
    """``if __name__ == "__main__":`` (either way round): its body never runs in the test namespace."""
    test = node.test
    if not isinstance(test, ast.Compare) or len(test.ops) != 1 or not isinstance(test.ops[0], ast.Eq):
        return False
    sides = (test.left, test.comparators[0])
    return any(isinstance(side, ast.Name) and side.id == "__name__" for side in sides) and any(
        isinstance(side, ast.Constant) and side.value == "__main__" for side in sides
    )


def _names_used(source: str) -> set[str]:
    """Names the test code reads anywhere, except in top-level ``__main__`` blocks (which never run here)."""
    tree = _parse(source)
    if tree is None:
        return set()
    used: set[str] = set()
    for statement in tree.body:
        runs = statement.orelse if isinstance(statement, ast.If) and _is_main_guard(statement) else [statement]
        for part in runs:
            used.update(node.id for node in ast.walk(part) if isinstance(node, ast.Name) and type(node.ctx) is ast.Load)
    return used


# pytest marks that say a test is not expected to pass here: such a test, or
# such a parameter set, is left out, as pytest would not count its failure.
_NOT_RUN_MARKS = frozenset({"skip", "xfail"})


def _marks(marks: Iterable[Any] | None) -> list[Any]:
    """The pytest marks among `marks` (a test's ``pytestmark``, a ``pytest.param``'s ``marks``).

    Duck-typed: the harness never imports pytest.
    """
    return [mark for mark in (marks or ()) if isinstance(getattr(mark, "name", None), str)]


def _skipped(marks: Iterable[Any]) -> bool:
    for mark in marks:
        if mark.name in _NOT_RUN_MARKS:
            return True
        # skipif(condition, reason=...): a bool condition; a string one (evaluated by pytest) is not ours to run.
        if mark.name == "skipif" and any(bool(condition) for condition in getattr(mark, "args", ())):
            return True
    return False


def _parameter_sets(marks: Sequence[Any]) -> list[dict[str, object]] | None:
    """The keyword arguments of each call ``@pytest.mark.parametrize`` asks for (stacked ones multiply).

    ``[{}]`` without parametrize; None where a parametrize needs what the
    harness does not provide (``indirect``: fixtures) or does not parse.
    """
    calls: list[dict[str, object]] = [{}]
    for mark in marks:
        if mark.name != "parametrize":
            continue
        args, kwargs = tuple(getattr(mark, "args", ())), dict(getattr(mark, "kwargs", {}))
        names = args[0] if args else kwargs.get("argnames")
        values = args[1] if len(args) > 1 else kwargs.get("argvalues")
        if kwargs.get("indirect") or names is None or values is None:
            return None
        if isinstance(names, str):
            names = [name.strip() for name in names.split(",") if name.strip()]
        names = list(names)
        rows: list[dict[str, object]] = []
        for value in values:
            if hasattr(value, "values") and hasattr(value, "marks") and hasattr(value, "id"):  # pytest.param()
                if _skipped(_marks(value.marks)):
                    continue
                value = value.values[0] if len(names) == 1 else value.values
            row = [value] if len(names) == 1 else list(value)
            if len(row) != len(names):
                return None
            rows.append(dict(zip(names, row, strict=True)))
        calls = [{**done, **row} for done in calls for row in rows]
    return calls


class _Unsupported(Exception):
    """A test that pytest would run but the harness cannot run as pytest would: it needs a
    fixture, an indirect parameter, an event loop. Never dropped silently: the tests that did
    run could all pass while the one a wrong program fails is the one left out."""


def _mark_list(marks: object) -> list[Any]:
    """A ``pytestmark`` as a list: pytest takes one mark or a list of them."""
    if marks is None:
        return []
    return _marks(marks if isinstance(marks, (list, tuple)) else [marks])


def _mock_arguments(test: Callable[..., object]) -> int:
    """How many leading parameters ``@unittest.mock.patch`` decorators fill with mocks (as pytest counts them)."""
    patchings = getattr(test, "patchings", None)
    if not patchings:
        return 0
    from unittest import mock

    return sum(1 for patching in patchings if not getattr(patching, "attribute_name", None)
               and getattr(patching, "new", None) is mock.DEFAULT)




_CaptureResult = collections.namedtuple("_CaptureResult", "out err")


class _Capture:
    """pytest's ``capsys`` (and ``capfd``): what the test and the candidate print, while the test runs."""

    def __init__(self) -> None:
        self._out, self._err = io.StringIO(), io.StringIO()
        self._saved: tuple[Any, Any] | None = None

    def start(self) -> None:
        self._saved = (sys.stdout, sys.stderr)
        sys.stdout, sys.stderr = self._out, self._err

    def stop(self) -> None:
        if self._saved is not None:
            sys.stdout, sys.stderr = self._saved
            self._saved = None

    def readouterr(self) -> Any:
        out, err = self._out.getvalue(), self._err.getvalue()
        for buffer in (self._out, self._err):
            buffer.seek(0)
            buffer.truncate()
        try:
            from _pytest import capture
        except ImportError:
            return _CaptureResult(out, err)
        return cast("Any", capture).CaptureResult(out, err)

    @contextlib.contextmanager
    def disabled(self) -> Iterator[None]:
        saved = (sys.stdout, sys.stderr)
        self.stop()
        try:
            yield
        finally:
            self._saved = (sys.stdout, sys.stderr)
            sys.stdout, sys.stderr = saved


class _CapLog(logging.Handler):
    """pytest's ``caplog``: the log records of the test and of the program (remote forwards them)."""

    def __init__(self, remote: JudgeEndpoint, cleanup: contextlib.ExitStack) -> None:
        super().__init__(logging.NOTSET)
        self.remote, self.cleanup = remote, cleanup
        self.records: list[logging.LogRecord] = []
        self.setFormatter(logging.Formatter("%(levelname)-8s %(name)s:%(filename)s:%(lineno)d %(message)s"))
        logging.root.addHandler(self)
        cleanup.callback(logging.root.removeHandler, self)
        remote.log_level("", logging.root.level)

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    @property
    def handler(self) -> logging.Handler:
        return self

    @property
    def text(self) -> str:
        return "".join(self.format(record) + "\n" for record in self.records)

    @property
    def record_tuples(self) -> list[tuple[str, int, str]]:
        return [(record.name, record.levelno, record.getMessage()) for record in self.records]

    @property
    def messages(self) -> list[str]:
        return [record.getMessage() for record in self.records]

    def clear(self) -> None:
        self.records.clear()

    def set_level(self, level: int | str, logger: str | None = None) -> None:
        target = logging.getLogger(logger)
        before = target.level
        target.setLevel(level)
        self.remote.log_level(logger or "", target.level)
        self.cleanup.callback(self._restore, target, logger, before)

    def _restore(self, target: logging.Logger, name: str | None, level: int) -> None:
        target.setLevel(level)
        self.remote.log_level(name or "", level)

    @contextlib.contextmanager
    def at_level(self, level: int | str, logger: str | None = None) -> Iterator[None]:
        target = logging.getLogger(logger)
        before = target.level
        target.setLevel(level)
        self.remote.log_level(logger or "", target.level)
        try:
            yield
        finally:
            self._restore(target, logger, before)


class _Request:
    """pytest's ``request``, as far as a parametrized fixture reads it."""

    def __init__(self, name: str, param: object) -> None:
        self.fixturename = name
        self.param = param


def _builtin_fixture(name: str, files: str, cleanup: contextlib.ExitStack,
                     remote: JudgeEndpoint) -> tuple[bool, object]:
    """(found, value) of one of pytest's own fixtures the harness provides; its teardown goes on ``cleanup``."""
    if name == "caplog":
        return True, _CapLog(remote, cleanup)
    if name in ("capsys", "capfd"):
        capture = _Capture()
        capture.start()
        cleanup.callback(capture.stop)
        return True, capture
    if name in ("tmp_path", "tmpdir"):
        path = pathlib.Path(tempfile.mkdtemp(prefix="pytest-", dir=files or None))
        if name == "tmp_path":
            return True, path
        try:
            from _pytest._py.path import LocalPath
        except ImportError:
            return False, None
        return True, LocalPath(str(path))
    if name == "monkeypatch":
        try:
            from _pytest.monkeypatch import MonkeyPatch
        except ImportError:
            return False, None
        patcher = MonkeyPatch()
        cleanup.callback(patcher.undo)
        return True, patcher
    return False, None


_Fixture = tuple[Callable[..., object], Any]  # the fixture's function and its marker (scope, params, autouse)


def _fixtures(namespace: dict[str, Any]) -> dict[str, _Fixture]:
    """The ``@pytest.fixture`` functions the test code defined, by fixture name.

    Duck-typed across pytest versions: 8.4+ wraps a fixture in a
    ``FixtureFunctionDefinition`` with ``_fixture_function_marker``, older ones
    set ``_pytestfixturefunction`` on the function.
    """
    found: dict[str, _Fixture] = {}
    for name, value in list(namespace.items()):
        if isinstance(value, (Proxy, CandidateClass)):
            continue  # the candidate's: asking it about pytest's attributes would be calling it
        marker = getattr(value, "_fixture_function_marker", None) or getattr(value, "_pytestfixturefunction", None)
        # Only pytest's own marker: a mock's `call` answers any attribute with another `call`.
        if type(marker).__name__ != "FixtureFunctionMarker" or not isinstance(getattr(marker, "name", None),
                                                                              (str, type(None))):
            continue
        function = value._get_wrapped_function() if hasattr(value, "_get_wrapped_function") else value
        fixture_name = getattr(marker, "name", None) or name
        found[fixture_name] = (function, marker)
    return found


def _arguments_of(function: Callable[..., object], skip: int = 0) -> tuple[set[str], set[str]]:
    """(required, all) parameter names of a test or a fixture, past the ``skip`` first (mocks, self)."""
    try:
        parameters = list(inspect.signature(function).parameters.values())[skip:]
    except (TypeError, ValueError):
        raise _Unsupported("its signature cannot be read") from None
    required = {parameter.name for parameter in parameters if parameter.default is inspect.Parameter.empty
                and parameter.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)}
    return required, {parameter.name for parameter in parameters}


_PROVIDED = frozenset({"capsys", "capfd", "caplog", "tmp_path", "tmpdir", "monkeypatch", "request"})


def _fixture_closure(names: Iterable[str], fixtures: Mapping[str, _Fixture], where: str) -> list[str]:
    """The test's fixtures and theirs, each after those it needs; _Unsupported for one nobody provides."""
    order: list[str] = []
    visiting: set[str] = set()

    def visit(name: str) -> None:
        if name in order or (name in _PROVIDED and name not in fixtures):
            return
        if name not in fixtures:
            raise _Unsupported(f"{where}: needs the fixture {name}, which the harness does not provide")
        if name in visiting:
            raise _Unsupported(f"{where}: fixture {name} depends on itself")
        visiting.add(name)
        function, _marker = fixtures[name]
        if inspect.iscoroutinefunction(function) or inspect.isasyncgenfunction(function):
            raise _Unsupported(f"{where}: fixture {name} is async (pytest runs these only with a plugin)")
        for needed in _arguments_of(function)[0]:
            visit(needed)
        order.append(name)

    for name in names:
        visit(name)
    return order


class _FixtureValues:
    """The fixtures of one call of a test, each made once, function-scoped; teardowns go on ``cleanup``."""

    def __init__(self, fixtures: Mapping[str, _Fixture], params: Mapping[str, object], files: str,
                 cleanup: contextlib.ExitStack, remote: JudgeEndpoint) -> None:
        self.fixtures, self.params, self.files, self.cleanup, self.remote = fixtures, params, files, cleanup, remote
        self.values: dict[str, object] = {}

    def get(self, name: str) -> object:
        if name in self.values:
            return self.values[name]
        if name in self.fixtures:
            value = self._make(name)
        elif name == "request":
            value = _Request("", None)
        else:
            found, value = _builtin_fixture(name, self.files, self.cleanup, self.remote)
            if not found:
                raise _Unsupported(f"needs the fixture {name}, which the harness does not provide")
        self.values[name] = value
        return value

    def _make(self, name: str) -> object:
        function, _marker = self.fixtures[name]
        required, accepted = _arguments_of(function)
        kwargs: dict[str, object] = {}
        for needed in accepted:
            if needed == "request":
                kwargs[needed] = _Request(name, self.params.get(name))
            elif needed in required or needed in self.fixtures:
                kwargs[needed] = self.get(needed)
        if inspect.isgeneratorfunction(function):
            generator = function(**kwargs)
            value = next(generator)
            self.cleanup.callback(lambda: next(generator, None))
            return value
        return function(**kwargs)


def _run_pytest_style(pytest_test: _PytestTest, fixtures: Mapping[str, _Fixture], remote: JudgeEndpoint,
                      files: str) -> None:
    """Call one pytest-style test once per parameter set (and per fixture parameter), with its fixtures.

    Raises :class:`_Unsupported` before calling it when it needs what the harness
    does not provide (a fixture nobody defines, ``indirect`` parameters) or what
    pytest itself fails (``async def`` without a plugin, ``yield`` tests).
    """
    name, test, setup, teardown, outer_marks = pytest_test[:5]
    declared = getattr(test, "__func__", test)  # a method's marks are on its function
    function = inspect.unwrap(declared)
    marks = [*_marks(getattr(declared, "pytestmark", None)), *outer_marks]
    if _skipped(marks):
        return
    calls = _parameter_sets(marks)
    if calls is None:
        raise _Unsupported(f"{name}: a parametrize the harness cannot apply (indirect, or not parsed)")
    if inspect.iscoroutinefunction(function) or inspect.isasyncgenfunction(function):
        raise _Unsupported(f"{name}: an async test (pytest runs these only with a plugin)")
    if inspect.isgeneratorfunction(function):
        raise _Unsupported(f"{name}: a yield test (pytest fails these)")
    required, accepted = _arguments_of(test, _mock_arguments(test))
    autouse = [fixture for fixture, (_f, marker) in fixtures.items() if getattr(marker, "autouse", False)]
    runs: list[tuple[dict[str, object], list[str], dict[str, object]]] = []
    for arguments in calls:
        wanted = [*autouse, *sorted((required | (accepted & fixtures.keys())) - arguments.keys())]
        order = _fixture_closure(wanted, fixtures, name)
        parametrized = [fixture for fixture in order if getattr(fixtures[fixture][1], "params", None) is not None]
        for chosen in itertools.product(*(list(fixtures[fixture][1].params) for fixture in parametrized)):
            runs.append((arguments, order, dict(zip(parametrized, chosen, strict=True))))
    for arguments, order, params in runs:
        with contextlib.ExitStack() as cleanup:
            try:
                values = _FixtureValues(fixtures, params, files, cleanup, remote)
                for fixture in order:
                    values.get(fixture)
                kwargs = {key: value for key, value in arguments.items() if key in accepted}
                for parameter in accepted - kwargs.keys():
                    if parameter in required or parameter in fixtures:
                        kwargs[parameter] = values.get(parameter)
                if setup is not None:
                    setup()
                if teardown is not None:
                    cleanup.callback(teardown)
                test(**kwargs)
            finally:
                remote.forget_exports()


class _PytestTest(typing.NamedTuple):
    name: str  # in the namespace: "test_f" or "TestC.test_m"
    test: Callable[..., object]
    setup: Callable[[], object] | None  # xunit-style: setup_function / setup_method, before each call
    teardown: Callable[[], object] | None
    marks: list[Any]  # the class's and the module's
    owner: type | None  # its class, whose setup_class / teardown_class run around its tests


def _defined_here(function: types.FunctionType) -> bool:
    """A function the test code wrote, under any decorators that kept ``__wrapped__`` (mock.patch, wraps)."""
    unwrapped = inspect.unwrap(function)
    return isinstance(unwrapped, types.FunctionType) and unwrapped.__code__.co_filename == _TEST_FILENAME


def _xunit(function: object, argument: object) -> Callable[[], object] | None:
    """An xunit-style setup or teardown as pytest calls it: with its argument only if it takes one."""
    if not callable(function):
        return None
    try:
        takes = any(parameter.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                       inspect.Parameter.VAR_POSITIONAL)
                    for parameter in inspect.signature(function).parameters.values())
    except (TypeError, ValueError):
        takes = False
    return functools.partial(function, argument) if takes else function


def _pytest_tests(namespace: dict[str, Any], own: Set[str]) -> list[_PytestTest]:
    """The pytest-style tests the test code defined, in order, with their xunit setups and marks.

    ``test*`` functions (with the module's ``setup_function``/``teardown_function``),
    and the ``test*`` methods of ``Test*`` classes that are not unittest's
    (those run on their own) and have no ``__init__``, each on an instance of
    its own, with ``setup_method``/``teardown_method`` around each call. The
    module's ``pytestmark`` applies to all of them, a class's to its methods.
    """
    module_marks = _mark_list(_hook(namespace, own, "pytestmark"))
    tests: list[_PytestTest] = []
    for name, value in list(namespace.items()):
        if name.startswith("test") and isinstance(value, types.FunctionType):
            if _defined_here(value):
                tests.append(_PytestTest(name, value, _xunit(_hook(namespace, own, "setup_function"), value),
                                         _xunit(_hook(namespace, own, "teardown_function"), value), module_marks,
                                         None))
        elif (
            name.startswith("Test")
            and isinstance(value, type)
            and not issubclass(value, unittest.TestCase)
            and value.__module__ == namespace.get("__name__")
            and "__init__" not in vars(value)
        ):
            class_marks = [*_mark_list(vars(value).get("pytestmark")), *module_marks]
            if _skipped(class_marks):
                continue
            for method_name, method in list(vars(value).items()):
                if method_name.startswith("test") and isinstance(method, types.FunctionType):
                    bound = getattr(value(), method_name)
                    instance = bound.__self__
                    tests.append(_PytestTest(f"{name}.{method_name}", bound,
                                             _xunit(getattr(instance, "setup_method", None), bound),
                                             _xunit(getattr(instance, "teardown_method", None), bound),
                                             class_marks, value))
    return tests


def _run_test_functions(namespace: dict[str, Any], source: str, called_candidate: bool, remote: JudgeEndpoint,
                        files: str, own: Set[str] = frozenset()) -> list[str]:
    """Call the pytest-style tests the test code defined and does not call itself.

    As pytest would: ``test*`` functions and ``Test*`` classes' ``test*``
    methods, once per ``@pytest.mark.parametrize`` parameter set (the
    function's, its class's and the module's ``pytestmark``) and per
    parameter of the fixtures they use, leaving out those marked
    ``skip``/``xfail``, with the fixtures the test code defines (autouse ones
    too; every fixture function-scoped) and pytest's ``capsys``, ``capfd``,
    ``tmp_path``, ``tmpdir``, ``monkeypatch`` and ``request.param``. When
    the code already called the candidate (a script that calls its own test
    functions, or a module-level instance the tests share), the tests its
    code refers to by name are left out, so that none runs twice; the others
    still run, or a module-level ``Counter()`` would pass them unchecked.

    Returns why each test that the harness cannot run as pytest would (it
    needs a fixture nobody defines, an ``indirect`` parameter, an event loop)
    was not run; the others still run, so that a wrong program still fails them.
    """
    tests = _pytest_tests(namespace, own)
    if tests and called_candidate:
        used = _names_used(source)
        tests = [test for test in tests if test.name.partition(".")[0] not in used]
    fixtures = _fixtures(namespace)
    unsupported = []
    module = types.SimpleNamespace(**namespace)
    with contextlib.ExitStack() as module_scope:
        if tests:
            _setup_scope(module_scope, _hook(namespace, own, "setup_module"), _hook(namespace, own, "teardown_module"),
                         module)
        owner: type | None = None
        class_scope = contextlib.ExitStack()
        module_scope.push(class_scope)
        for test in tests:
            if test.owner is not owner:
                class_scope.close()
                owner = test.owner
                if owner is not None:
                    _setup_scope(class_scope, getattr(owner, "setup_class", None),
                                 getattr(owner, "teardown_class", None), owner)
            try:
                _run_pytest_style(test, fixtures, remote, files)
            except _Unsupported as exc:
                unsupported.append(str(exc))
    return unsupported


def _own_names(*sources: str) -> frozenset[str]:
    """The top-level names the dataset's own code binds (not by importing them): the only ones the harness reads as
    its hooks (`check`, `pytestmark`, `setup_module`, ...)."""
    names: set[str] = set()
    for source in sources:
        if source:
            names.update(_names_bound(source))
    return frozenset(names)


# Top-level names of the dataset's sources a judge has parsed, by their length and hash (small keys: a judge lives
# for 200 jobs, and a training step's batch holds hundreds of problems, more than _compiled's 128 sources). Not a
# hashlib digest: importing hashlib maps OpenSSL's libcrypto, 3.5 MB more in the zygote that every worker's fork
# copies the page tables of. The sources are the dataset's, and str hashes are keyed per process (SipHash): two
# of them that collide by chance are about one in 2^64.
_NAMES_BOUND: collections.OrderedDict[tuple[int, int], frozenset[str]] = collections.OrderedDict()
NAMES_BOUND_CACHED = 4096


def _names_bound(source: str) -> frozenset[str]:
    """One source's top-level names, parsed once per judge: a HumanEval prompt and its tests parsed for every job
    cost the judge about 1 ms of each."""
    key = (len(source), hash(source))
    names = _NAMES_BOUND.get(key)
    if names is None:
        tree = _parse(source)
        names = frozenset(_definitions(tree)) if tree is not None else frozenset()
        _NAMES_BOUND[key] = names
        if len(_NAMES_BOUND) > NAMES_BOUND_CACHED:
            _NAMES_BOUND.popitem(last=False)
    return names


def _hook(namespace: Mapping[str, Any], own: Set[str], name: str) -> Any:
    """A hook of pytest's or HumanEval's (`pytestmark`, `setup_module`, `check`) that the tests' own code defined.

    The tests' namespace also holds every top-level name of the program
    (_bind_names): a program's `pytestmark = [Mark("skip")]` (a namedtuple,
    which crosses as a value) skipped every test, and its `setup_module` or a
    `check` class then counted as calling it, so a wrong program passed
    pytest-style tests (red team). A hook is read only where the dataset's
    code binds its name, and is never one of the program's objects.
    """
    if name not in own:
        return None
    value = namespace.get(name)
    return None if isinstance(value, (Proxy, CandidateClass)) else value


def _setup_scope(scope: contextlib.ExitStack, setup: object, teardown: object, argument: object) -> None:
    """Run an xunit-style setup now and put its teardown on ``scope`` (pytest's setup_module, setup_class)."""
    run_setup, run_teardown = _xunit(setup, argument), _xunit(teardown, argument)
    if run_setup is not None:
        run_setup()
    if run_teardown is not None:
        scope.callback(run_teardown)
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
    one problem. Compiling HumanEval's prompt and tests each time took about
    0.1 ms of the judge's 0.6 ms per job here (jobs of problems the judge
    had seen: 0.57-0.69 -> 0.52-0.53 ms). A code object runs in each job's
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
    saved = (sys.stdin, sys.stdout, sys.stderr, tempfile.tempdir, builtins.input, builtins.print, builtins.open)
    cwd = os.open(".", os.O_RDONLY | os.O_DIRECTORY) if files else -1
    sys.stdin, sys.stdout, sys.stderr = io.StringIO(""), io.StringIO(), io.StringIO()
    try:
        if files:
            os.chdir(files)
            tempfile.tempdir = files
        yield
    finally:
        sys.stdin, sys.stdout, sys.stderr, tempfile.tempdir = saved[:4]
        builtins.input, builtins.print, builtins.open = saved[4:]
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
    found = remote.request("globals", wanted)
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
    remote: JudgeEndpoint, names: Sequence[str], assert_code: str, entry_point: str, setup_code: str, files: str
) -> dict[str, object]:
    namespace: dict[str, Any] = {"__name__": TEST_MODULE, "__builtins__": builtins}
    if setup_code:
        try:
            exec(_compiled(setup_code, "<setup>"), namespace)
        except BaseException as exc:
            return _test(0, "setup_error", f"setup code failed: {describe(exc)['type']}: {exc}")
    try:
        bound = _bind_names(remote, namespace, names, entry_point)
        module = _CandidateModule(remote, [name for name in bound if not name.startswith("_")])
        own = _own_names(setup_code, assert_code)
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
        # the BMP, were 1.5 Mi characters but a 17 MiB reply (red team).
        messages_size += len(message) if message.isascii() else len(_ENCODER.encode(message))
        tests.append(result)
        if on_result is not None:
            on_result(result)

    deadline = None if time_for_all is None else time.monotonic() + time_for_all
    too_large: TooLargeForJudge | None = None
    if plan_kind == "assert" and program:
        # Here, in the trusted test process, while the candidate loads the same program: parsing 1 MiB of it
        # took 1.3-1.7 s, which the daemon's event loop paid when it sent the names.
        try:
            names = _program_names(program, assembly)
        except TooLargeForJudge as exc:
            too_large = exc
    remote = JudgeEndpoint(channel, max_frame_bytes, call_timeout, deadline, cpu_credit=cpu_credit,
                           deadline_stretch=deadline_stretch, send_limit=CANDIDATE_FRAME_BYTES, files=files)
    try:
        with _job_environment(files):
            _run_plan(remote, plan_kind, total, report, too_large, names, assert_code, entry_point, setup_code,
                      fn_name, cases, tolerance, stop_on_first_failure, files)
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
              files: str) -> None:
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
        report(_run_assert(remote, names, assert_code, entry_point, setup_code, files))
