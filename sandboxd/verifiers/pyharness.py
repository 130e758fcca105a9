"""Two-process harness for Python function-call and assert tests.

The candidate's code and the tests never share a process:

- the **candidate process** runs :func:`serve_candidate`: it executes the
  candidate's program, then answers calls over a connected ``AF_UNIX``
  ``SOCK_STREAM`` socket until end of file;
- the **test process** (another uid; it never runs candidate code) runs
  :func:`run_tests`: it calls the candidate through proxies and judges the
  decoded return values itself.

What crosses the socket is plain data only (see :func:`encode_value`), so
nothing the candidate does in its own process (lying ``__eq__``, patched
builtins or ``AssertionError``, ``sys.exit(0)``, printing "All tests passed")
can make a test pass: the candidate never sees the expected values, and its
process can only answer with values.

Wire format: each frame is a 4-byte big-endian length, then that many bytes of
ASCII JSON (non-ASCII is escaped, so lone surrogates survive). Frames:

- candidate -> tests, once, first: ``{"ready": true}`` or
  ``{"load_error": {"type": str, "message": str}}`` (then the candidate exits);
- tests -> candidate: ``{"call": name, "args": [enc...], "kwargs": {str: enc}}``
  where ``name`` is a top-level name or ``"Class.method"`` (a fresh instance
  per call), plus ``"handle": int`` to call a method of an object made
  earlier; with ``"attr": true`` as well, ``name`` is an attribute of that
  object for the tests to read, not to call;
- candidate -> tests: ``{"ok": enc}``, ``{"handle": int}`` when the call
  constructed an instance of a top-level class (it stays in the candidate's
  process), ``{"method": true}`` when an attribute read is a method, or
  ``{"error": {"type": str, "message": str}}``.

Tests that import the candidate as a module (KodCode and other pytest-style
datasets: ``from solution import f``, ``import solution``) get, while they run,
a module named ``solution`` in the test process that holds the same proxies
(see :func:`_candidate_module`); the candidate's code is never imported there.

End of file on the socket means the candidate is gone: the call in flight and
every later one fail. ``SystemExit`` (or any other ``BaseException`` that is
not an ``Exception``) raised by a call ends the candidate process, as it would
end a program.

Stdlib only: this module runs inside the sandbox image.
"""

from __future__ import annotations

import ast
import base64
import binascii
import bisect  # noqa: F401 - this and the other F401s: warmed in the zygote for IMPLICIT_IMPORTS
import builtins
import collections  # noqa: F401
import contextlib
import copy  # noqa: F401
import datetime  # noqa: F401
import functools
import heapq  # noqa: F401
import inspect
import io
import itertools
import json
import math
import operator  # noqa: F401
import os
import random  # noqa: F401
import re
import socket
import statistics  # noqa: F401
import string  # noqa: F401
import struct
import sys
import time
import traceback
import types
import typing  # noqa: F401
import unittest
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, NoReturn, cast

from .code import _SYNTAX_ERRORS, FunctionCase, _parse, assemble

__all__ = [
    "MAX_CONTAINERS",
    "MAX_DEPTH",
    "MAX_FRAME_BYTES",
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
    "top_level_definitions",
    "top_level_names",
]

# Large enough for any realistic return value (a 10^6-element list of ints is
# about 7 MB of JSON), small enough that the test process cannot be pushed
# into its memory limit by one frame.
MAX_FRAME_BYTES = 16 * 1024 * 1024
# Lists and objects in one frame from the candidate, which the test process parses: each costs it
# 56-64 bytes for the 3 of "[]," (twice, once decoded), where numbers and strings cost about 12 times
# their text. A 15 MiB frame of "[]," took 775 MiB, and two such jobs' judges beside their candidates
# ran the sandbox out of memory, which the candidates escaped as SANDBOX_LOST (red team). Real values
# hold far fewer: a frame of pairs of numbers stops at about 900,000 of them.
MAX_CONTAINERS = 1 << 20
# Nesting depth of values; json's own C parser stops near the recursion limit
# (1000), and no test data nests anywhere near 100.
MAX_DEPTH = 100
# Python refuses int<->str conversions beyond 4300 digits (CVE-2020-10735);
# 14000 bits is about 4214 digits, so every int we send can also be parsed.
MAX_INT_BITS = 14_000
# Error messages from the candidate are for humans; keep them short.
MESSAGE_LIMIT = 2000
# An exception's type name is the candidate's to choose too (a class named with 9 MB).
TYPE_NAME_LIMIT = 200
# All the messages of one verdict, in the bytes of the judge's reply (ASCII
# JSON, where a character past ASCII takes 6 bytes, 12 past the BMP):
# thousands of failing cases each with a full message would not fit the
# judge's reply (16 MiB), and an oversized verdict would read as the judge's
# failure, not the candidate's. Past this, each further message is cut short,
# to ASCII.
VERDICT_MESSAGES_LIMIT = 4 << 20
# What is left of each message past VERDICT_MESSAGES_LIMIT, in characters.
CUT_MESSAGE_CHARS = 100
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

_HEADER = struct.Struct(">I")
_TAGS = ("$float", "$tuple", "$set", "$frozenset", "$dict", "$bytes", "$complex")
_TEST_FILENAME = "<test>"
# Compiled test code a judge keeps (_compiled), and the longest source it keeps.
COMPILED_TESTS_CACHED = 128
COMPILED_TESTS_MAX_CHARS = 16 << 10


class RejectedValue(ValueError):
    """A value that is not plain data (or is too big or deep) and may not cross the channel."""


class ProtocolError(Exception):
    """A malformed frame, or a frame that breaks the request/reply protocol."""


class FrameTooLarge(ProtocolError):
    """A frame longer than the size cap."""


_ENDS_ITERATION = (StopIteration, StopAsyncIteration)


class CandidateError(Exception):
    """An exception raised by the candidate that has no builtin equivalent.

    Builtin exception types (``ValueError``, ``KeyError``, ...) are re-raised
    in the test process as themselves, so tests that expect them still work.
    """


class CandidateDied(BaseException):
    """The candidate process is gone (end of file) or broke the protocol.

    A ``BaseException`` so that test code catching ``Exception`` cannot swallow it;
    the harness also remembers it, so a test that swallows it anyway still fails.
    """


class TooLargeForJudge(CandidateDied):
    """The candidate's program or one of its replies took more memory (or nesting) to read than the judge may use.

    Its syntax tree, which the judge builds to find the names the tests may
    call, or a reply frame that decodes into far more objects than its bytes
    (15 MiB of two-letter strings are 3.2 million objects). A judge runs each
    job under a memory budget of its own (judgeserver.JOB_MEMORY_BYTES):
    past it, this is the candidate's failure (test status ``memory``), not
    the judge's, whose MemoryError read as the sandbox's (STATUS_INTERNAL).
    """


class CandidateTimeout(BaseException):
    """A call to the candidate did not answer within ``call_timeout``."""


class TestsTimeUp(CandidateTimeout):
    """The time for all the tests (``run_tests``' ``time_for_all``) ran out: during a call, or before it."""

    __test__ = False  # not a pytest class, whatever its name


TIME_UP_MESSAGE = "the time for all the tests ran out"
REPLY_TOO_LARGE = "the candidate's reply took more memory to decode than the judge may use (MemoryError)"
VALUE_TOO_LARGE = "the candidate's value took more memory to judge than the judge may use (MemoryError)"


# ---------------------------------------------------------------------------
# Value codec
# ---------------------------------------------------------------------------


def _type_name(obj: object) -> str:
    try:
        return str(type(obj).__qualname__)
    except Exception:
        return "?"


def encode_value(obj: object, _depth: int = 0) -> object:
    """Encode plain Python data as JSON-able data, rejecting everything else.

    Plain data: ``None``, ``bool``, ``int``, ``float`` (``nan``/``inf``
    included), ``complex``, ``str``, ``bytes``, ``list``, ``tuple``, ``dict``
    (any plain hashable keys), ``set`` and ``frozenset``, nested. A subclass of
    one of these (``Counter``, ``defaultdict``, ``OrderedDict``, a namedtuple,
    an ``IntEnum``, numpy's ``float64``) is encoded as its base type's data,
    read through the base type's own methods (``dict.items``, ``int.__index__``),
    never the subclass's: the reference graders compare with ``==``, which takes
    ``Counter({1: 2}) == {1: 2}``, while an ``int`` whose ``__eq__`` lies is sent
    as the number it holds. Anything else (``deque``, numpy's ``int64``, a class
    instance) raises :class:`RejectedValue`.

    Encoding: ``None``/``bool``/``int``/``str``, finite ``float`` and ``list``
    are themselves; every other value is a one-key object:
    ``{"$float": "nan"|"inf"|"-inf"}``, ``{"$tuple": [...]}``,
    ``{"$set": [...]}``, ``{"$frozenset": [...]}``,
    ``{"$dict": [[key, value], ...]}``, ``{"$bytes": "<base64>"}``,
    ``{"$complex": [real, imag]}``.
    """
    if _depth > MAX_DEPTH:
        raise RejectedValue(f"value nested deeper than {MAX_DEPTH} levels")
    kind = type(obj)
    if obj is None or kind is bool or kind is str:
        return obj
    if kind is int:
        if obj.bit_length() > MAX_INT_BITS:  # type: ignore[attr-defined]
            raise RejectedValue(f"int with more than {MAX_INT_BITS} bits")
        return obj
    if kind is float:
        if math.isfinite(obj):  # type: ignore[arg-type]
            return obj
        return {"$float": "nan" if math.isnan(obj) else ("inf" if obj > 0 else "-inf")}  # type: ignore[arg-type,operator]
    depth = _depth + 1
    if kind is list:
        return [encode_value(item, depth) for item in obj]  # type: ignore[attr-defined]
    if kind is tuple:
        return {"$tuple": [encode_value(item, depth) for item in obj]}  # type: ignore[attr-defined]
    if kind is dict:
        return {"$dict": [[encode_value(k, depth), encode_value(v, depth)] for k, v in obj.items()]}  # type: ignore[attr-defined]
    if kind is set:
        return {"$set": [encode_value(item, depth) for item in obj]}  # type: ignore[attr-defined]
    if kind is frozenset:
        return {"$frozenset": [encode_value(item, depth) for item in obj]}  # type: ignore[attr-defined]
    if kind is bytes:
        return {"$bytes": base64.b64encode(obj).decode("ascii")}  # type: ignore[arg-type]
    if kind is complex:
        return {"$complex": [encode_value(obj.real, depth), encode_value(obj.imag, depth)]}  # type: ignore[attr-defined]
    # issubclass of type(obj), which the value cannot fake (isinstance would ask its __class__).
    for base, read in _BASE_READERS:
        if issubclass(kind, base):
            return encode_value(read(obj), _depth)
    raise RejectedValue(f"a value of type {_type_name(obj)} is not plain data")


# The data of a subclass of a plain type, as that exact type, read by the base type's own methods.
_BASE_READERS: tuple[tuple[type, Callable[[Any], object]], ...] = (
    (int, int.__index__),
    (float, float.__float__),
    (str, str.__str__),
    (bytes, bytes.__bytes__),
    (list, lambda obj: list(list.__iter__(obj))),
    (tuple, lambda obj: tuple(tuple.__iter__(obj))),
    (dict, lambda obj: dict(dict.items(obj))),
    (set, lambda obj: set(set.__iter__(obj))),
    (frozenset, lambda obj: frozenset(frozenset.__iter__(obj))),
)


def _decode_items(body: object, depth: int, tag: str) -> list[object]:
    if type(body) is not list:
        raise RejectedValue(f"{tag} must hold a list")
    return [decode_value(item, depth) for item in body]


def _hashable_collection(factory: Callable[[list[object]], object], items: list[object], tag: str) -> object:
    try:
        return factory(items)
    except TypeError:
        raise RejectedValue(f"{tag} holds an unhashable item") from None


def decode_value(obj: object, _depth: int = 0) -> object:
    """Decode what :func:`encode_value` produced (after a JSON round trip).

    Raises :class:`RejectedValue` on anything else: unknown or extra tags,
    malformed bodies, unhashable set items or dict keys, duplicate dict keys,
    nesting deeper than :data:`MAX_DEPTH`. The result is built only from
    builtin types, so it is safe to compare in the test process.
    """
    if _depth > MAX_DEPTH:
        raise RejectedValue(f"value nested deeper than {MAX_DEPTH} levels")
    kind = type(obj)
    if obj is None or kind is bool or kind is str:
        return obj
    if kind is int:
        if obj.bit_length() > MAX_INT_BITS:  # type: ignore[attr-defined]
            raise RejectedValue(f"int with more than {MAX_INT_BITS} bits")
        return obj
    if kind is float:
        if not math.isfinite(obj):  # type: ignore[arg-type]
            raise RejectedValue("non-finite floats must be tagged")
        return obj
    depth = _depth + 1
    if kind is list:
        return [decode_value(item, depth) for item in obj]  # type: ignore[attr-defined]
    if kind is not dict or len(obj) != 1:  # type: ignore[arg-type]
        raise RejectedValue(f"not an encoded value: {_type_name(obj)}")
    ((tag, body),) = obj.items()  # type: ignore[attr-defined]
    if tag == "$float":
        if body not in ("nan", "inf", "-inf") or type(body) is not str:
            raise RejectedValue("$float must be 'nan', 'inf' or '-inf'")
        return float(body)
    if tag == "$tuple":
        return tuple(_decode_items(body, depth, tag))
    if tag == "$set":
        return _hashable_collection(set, _decode_items(body, depth, tag), tag)
    if tag == "$frozenset":
        return _hashable_collection(frozenset, _decode_items(body, depth, tag), tag)
    if tag == "$dict":
        if type(body) is not list:
            raise RejectedValue("$dict must hold a list of [key, value] pairs")
        result: dict[object, object] = {}
        for pair in body:
            if type(pair) is not list or len(pair) != 2:
                raise RejectedValue("$dict must hold a list of [key, value] pairs")
            key = decode_value(pair[0], depth)
            try:
                if key in result:
                    raise RejectedValue("$dict has a duplicate key")
            except TypeError:
                raise RejectedValue("$dict has an unhashable key") from None
            result[key] = decode_value(pair[1], depth)
        return result
    if tag == "$bytes":
        if type(body) is not str:
            raise RejectedValue("$bytes must hold a base64 string")
        try:
            return base64.b64decode(body, validate=True)
        except (binascii.Error, ValueError):
            raise RejectedValue("$bytes holds invalid base64") from None
    if tag == "$complex":
        parts = _decode_items(body, depth, tag)
        if len(parts) != 2 or not all(type(part) in (int, float) for part in parts):
            raise RejectedValue("$complex must hold [real, imag]")
        try:
            return complex(parts[0], parts[1])  # type: ignore[call-overload]
        except OverflowError:  # an int past the float range
            raise RejectedValue("$complex part too large for a float") from None
    raise RejectedValue(f"unknown tag {tag!r}")


# ---------------------------------------------------------------------------
# Framing
# ---------------------------------------------------------------------------


def send_frame(sock: socket.socket, obj: object, max_bytes: int = MAX_FRAME_BYTES) -> None:
    """Send one frame: 4-byte big-endian length, then ``obj`` as ASCII JSON.

    ``obj`` must already be JSON-able (encode values with :func:`encode_value`
    first). Raises :class:`FrameTooLarge` before sending anything when the
    JSON is longer than ``max_bytes``, ``OSError`` when the peer is gone.
    """
    data = _ENCODER.encode(obj).encode("ascii")
    if len(data) > max_bytes:
        raise FrameTooLarge(f"frame of {len(data)} bytes exceeds the limit of {max_bytes}")
    sock.sendall(_HEADER.pack(len(data)) + data)


Deadline = float | Callable[[], float] | None


def _recv_exact(sock: socket.socket, size: int, deadline: Deadline) -> bytes:
    buffer = bytearray(size)
    view = memoryview(buffer)
    got = 0
    while got < size:
        if deadline is not None:
            remaining = (deadline() if callable(deadline) else deadline) - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("no complete frame before the deadline")
            sock.settimeout(remaining)
        try:
            n = sock.recv_into(view[got:])
        except TimeoutError:
            if callable(deadline):
                continue  # asked again: it may have moved meanwhile
            raise
        if n == 0:
            raise EOFError("connection closed" if got == 0 else "connection closed in the middle of a frame")
        got += n
    return bytes(buffer)


def _reject_constant(name: str) -> object:
    raise ValueError(f"JSON constant {name} is not allowed (non-finite floats are tagged)")


# Made once, in the zygote: json.dumps and json.loads with options other than the
# defaults build an encoder or decoder per call, Python code that a fresh candidate
# runs (and copies the pages of) for every message: 613-619 -> 597-604 page faults
# per HumanEval candidate here.
_ENCODER = json.JSONEncoder(ensure_ascii=True, allow_nan=False, separators=(",", ":"))
_DECODER = json.JSONDecoder(parse_constant=_reject_constant)


# A JSON string of a frame (ASCII: see send_frame), whose brackets are text, not lists or objects.
_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*+"')


def _containers(body: bytes) -> int:
    """How many lists and objects a frame's JSON holds (at most; exactly when it is valid JSON)."""
    count = body.count(b"[") + body.count(b"{")
    if count > MAX_CONTAINERS:  # only then do the brackets inside strings matter
        text = _JSON_STRING.sub(b"", body)
        count = text.count(b"[") + text.count(b"{")
    return count


def recv_frame(
    sock: socket.socket, max_bytes: int = MAX_FRAME_BYTES, deadline: Deadline = None,
    max_containers: int | None = None,
) -> object:
    """Receive one frame and parse its JSON (values inside are still encoded).

    ``deadline`` is a ``time.monotonic()`` instant for the whole frame, so a
    peer sending a byte at a time cannot stretch it; or a function that
    answers that instant as it stands when asked (it is asked again when it
    passes: a deadline that moves, see ``_Remote``). Raises ``EOFError`` when
    the peer closed (before or inside the frame), ``TimeoutError`` past the
    deadline, :class:`FrameTooLarge` for a length over ``max_bytes`` (nothing
    is read past the header), :class:`ProtocolError` for bytes that are not
    JSON, and ``OSError`` for socket errors. With ``max_containers``, a frame
    of more lists and objects than that is a :class:`ProtocolError`, before
    it is parsed.
    """
    sock.settimeout(None)
    (size,) = _HEADER.unpack(_recv_exact(sock, _HEADER.size, deadline))
    if size > max_bytes:
        raise FrameTooLarge(f"frame of {size} bytes exceeds the limit of {max_bytes}")
    body = _recv_exact(sock, size, deadline)
    if max_containers is not None and _containers(body) > max_containers:
        raise ProtocolError(f"frame holds more than {max_containers} lists and objects")
    try:
        return _DECODER.decode(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ProtocolError(f"frame is not valid JSON: {exc}") from None


# ---------------------------------------------------------------------------
# Candidate side
# ---------------------------------------------------------------------------


def _describe(exc: BaseException) -> dict[str, str]:
    try:
        message = str(exc)
    except Exception:
        message = "<unprintable exception>"
    return {"type": _type_name(exc)[:TYPE_NAME_LIMIT], "message": message[:MESSAGE_LIMIT]}


def _error(type_name: str, message: str) -> dict[str, object]:
    return {"error": {"type": type_name, "message": message[:MESSAGE_LIMIT]}}


# What IMPLICIT_IMPORTS bound in this candidate's module, by name (set by _serve).
_implicit_names: dict[str, object] = {}


def _resolve(request: Mapping[str, object], namespace: dict[str, Any], objects: dict[int, object]) -> Any:
    """The callable a request names, and whether calling it makes a remote object.

    A name still bound to what IMPLICIT_IMPORTS bound is not the program's: the tests of a
    gcd or sqrt that the program never wrote must not call math's (nor would a program's own
    `from math import gcd` pass them).
    """
    target = request.get("call")
    if type(target) is not str or not all(part.isidentifier() for part in target.split(".")):
        raise ProtocolError(f"bad call target {target!r}")
    name = target.partition(".")[0]
    if request.get("handle") is None and name in _implicit_names and namespace.get(name) is _implicit_names[name]:
        namespace = {key: value for key, value in namespace.items() if key != name}
    handle = request.get("handle")
    if handle is not None:
        if type(handle) is not int or handle not in objects or "." in target:
            raise ProtocolError(f"bad handle {handle!r}")
        return getattr(objects[handle], target), False
    if "." in target:
        class_name, _, method = target.partition(".")
        if "." in method:
            raise ProtocolError(f"bad call target {target!r}")
        cls = namespace.get(class_name)
        if not isinstance(cls, type):
            raise NameError(f"no top-level class {class_name!r}")
        return getattr(cls(), method), False
    if target in namespace:
        function = namespace[target]
        return function, isinstance(function, type)
    solution = namespace.get("Solution")
    # LeetCode-style datasets (LiveCodeBench functional tests) name the method only.
    if isinstance(solution, type) and hasattr(solution, target):
        return getattr(solution(), target), False
    raise NameError(f"name {target!r} is not defined")


def _answer(request: object, namespace: dict[str, Any], objects: dict[int, object]) -> dict[str, object]:
    if type(request) is not dict:
        raise ProtocolError("a request must be a JSON object")
    args = decode_value(request.get("args", []))
    raw_kwargs = request.get("kwargs", {})
    if type(args) is not list or type(raw_kwargs) is not dict:
        raise ProtocolError("args must be a list and kwargs an object")
    kwargs = {str(key): decode_value(value) for key, value in raw_kwargs.items()}
    if request.get("attr") is True:  # the tests read an attribute of an object (_RemoteObject)
        if request.get("handle") is None:
            raise ProtocolError("only an object's attributes are read")
        value, _ = _resolve(request, namespace, objects)
        return {"method": True} if callable(value) else {"ok": encode_value(value)}
    function, constructs = _resolve(request, namespace, objects)
    result = function(*args, **kwargs)
    if constructs:
        handle = len(objects) + 1
        objects[handle] = result
        return {"handle": handle}
    return {"ok": encode_value(result)}


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
           implicit_imports: bool = False) -> int:
    own_pid = os.getpid()
    # Whatever fd 0 is, input() must fail fast instead of blocking until the deadline.
    sys.stdin = io.StringIO("")
    module = types.ModuleType(CANDIDATE_MODULE)
    module.__file__ = "<solution>"
    # Registered so that dataclasses, typing.get_type_hints and pickle find it.
    sys.modules[CANDIDATE_MODULE] = module
    namespace = module.__dict__
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
        send_frame(channel, {"load_error": _describe(exc)})
        return 1
    end_if_forked(own_pid)
    send_frame(channel, {"ready": True})
    objects: dict[int, object] = {}
    while True:
        try:
            request = recv_frame(channel, max_frame_bytes)
        except EOFError:
            return 0
        try:
            reply = _answer(request, namespace, objects)
        except ProtocolError as exc:
            reply = _error("ProtocolError", str(exc))
        except Exception as exc:
            reply = {"error": _describe(exc)}
        end_if_forked(own_pid)
        try:
            send_frame(channel, reply, max_frame_bytes)
        except FrameTooLarge:
            send_frame(channel, _error("ValueTooLarge", f"return value exceeds {max_frame_bytes} bytes"))


def serve_candidate(code: str, channel: socket.socket, *, max_frame_bytes: int = MAX_FRAME_BYTES,
                    assembly: Mapping[str, str] | None = None, implicit_imports: bool = False) -> NoReturn:
    """Run the candidate's program and answer calls on ``channel`` until end of file.

    With ``assembly`` (a HumanEval prompt's, from
    :func:`~sandboxd.verifiers.code.program_assembly`), the program is first
    made of ``code`` by :func:`~sandboxd.verifiers.code.assemble`, as the
    judge makes it. Executes the program (compiled with filename
    ``"<solution>"``) as the body of a fresh module named ``"solution"``
    (so ``if __name__ == "__main__":`` blocks do not run), with ``sys.stdin``
    empty. Sends ``{"ready": true}``, or ``{"load_error": ...}`` if the
    program raised (``SyntaxError`` and ``SystemExit`` included), then
    serves requests (see the module docstring).
    ``Class.method`` instantiates ``Class()`` for every call, like LeetCode's
    judge; a bare name that is not defined at top level but is a method of a
    top-level ``Solution`` class is called the same way. With
    ``implicit_imports`` (function-call tests), IMPLICIT_IMPORTS runs in the
    module first, as LeetCode's environment does. Exceptions of calls
    are answered as errors (type name and message, truncated); a
    ``BaseException`` that is not an ``Exception`` ends the process.

    Never returns: the process ends with ``os._exit`` (0 after end of file,
    1 after a failed load or any other way out), so nothing the parent
    process registered (atexit, buffered files) runs in this one.
    """
    status = 1
    try:
        status = _serve(code, channel, max_frame_bytes, assembly, implicit_imports)
    except BaseException:  # whatever happened, the test process sees "candidate gone"
        status = 1
    finally:
        _flush_stdio()
        os._exit(status)


# ---------------------------------------------------------------------------
# Test side
# ---------------------------------------------------------------------------


def top_level_names(code: str) -> list[str]:
    """Names a program binds at top level, in order: what tests may call.

    Functions, classes and assigned names, including those inside top-level
    ``if``/``try``/``with`` blocks; not imports, not dunder names. ``[]`` when
    the code does not parse.
    """
    return top_level_definitions(code)[0]


def top_level_definitions(code: str) -> tuple[list[str], list[str]]:
    """:func:`top_level_names`, and those of them that a ``class`` statement binds
    (the only names whose calls may make objects for the tests: ``run_tests(classes=)``);
    one parse for both."""
    tree = _parse(code)
    return ([], []) if tree is None else _definitions(tree)


def _definitions(tree: ast.Module) -> tuple[list[str], list[str]]:
    names: list[str] = []
    classes: set[str] = set()

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
            if isinstance(node, ast.ClassDef):
                classes.add(node.name)
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

    unique = dict.fromkeys(names)  # first occurrence wins, order kept
    public = [name for name in unique if not (name.startswith("__") and name.endswith("__"))]
    return public, [name for name in public if name in classes]


def _program_definitions(program: str, assembly: Mapping[str, str] | None) -> tuple[list[str], list[str]]:
    """:func:`top_level_definitions` of the candidate's program, assembled as the candidate assembles it, in the judge.

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
        if assembly is not None:
            program = assemble(program, assembly, strict=True)
        tree = ast.parse(program)
    except _SYNTAX_ERRORS:
        return [], []
    except (MemoryError, RecursionError) as exc:
        raise TooLargeForJudge(f"the program took more memory or nesting to parse than the judge may use "
                               f"({type(exc).__name__})") from None
    return _definitions(tree)


class _Remote:
    """The test process's end of the channel: one request, one reply, until it breaks."""

    def __init__(self, channel: socket.socket, max_frame_bytes: int, call_timeout: float | None,
                 classes: frozenset[str] = frozenset(), deadline: float | None = None,
                 cpu_credit: Callable[[], float] | None = None, deadline_stretch: float = 1.0) -> None:
        self.channel = channel
        # When all the tests' time runs out (time.monotonic()), whatever call is then in flight.
        self.deadline = deadline
        # The seconds the other runs of the sandbox have had the CPU while the
        # candidate waited for one, as its agent counts them: each deadline
        # moves on by what they took meanwhile, up to deadline_stretch times
        # its span (sandboxd.agent.runner.RunDeadline, the same rule).
        self.cpu_credit = cpu_credit
        self.deadline_stretch = max(1.0, deadline_stretch)
        self.started = time.monotonic()
        self.credit_at_start = self._credit()
        # Names whose calls may answer with an object living in the candidate's
        # process (see _unwrap): its top-level classes, by its source.
        self.classes = classes
        self.max_frame_bytes = max_frame_bytes
        self.call_timeout = call_timeout
        # Set once the channel is unusable; every later call fails the same way.
        self.broken: CandidateDied | CandidateTimeout | None = None
        # Exceptions the proxies raised, to tell the candidate's errors from the tests'.
        self.raised: list[BaseException] = []
        # Requests sent: tests that never call the candidate check nothing.
        self.calls = 0

    def _credit(self) -> float:
        return self.cpu_credit() if self.cpu_credit is not None else 0.0

    def _moved(self, started: float, span: float, credit_then: float) -> float:
        """`span` after `started`, moved on by the credit since then (up to the stretch) once that has passed: the
        credit is read only then, off a call's usual path."""
        ends = started + span
        if time.monotonic() < ends:
            return ends
        return ends + min(max(0.0, self._credit() - credit_then), (self.deadline_stretch - 1.0) * span)

    def _time_for_all_ends(self) -> float | None:
        if self.deadline is None:
            return None
        return self._moved(self.started, self.deadline - self.started, self.credit_at_start)

    def _deadline(self) -> Callable[[], float] | None:
        """The deadline of a call starting now, as it stands whenever asked (None: none)."""
        if self.call_timeout is None and self.deadline is None:
            return None
        call_started, credit_then, call_timeout = time.monotonic(), self._credit(), self.call_timeout

        def now() -> float:
            for_all = self._time_for_all_ends()
            if call_timeout is None:
                assert for_all is not None  # one of the two is set (above)
                return for_all
            call_ends = self._moved(call_started, call_timeout, credit_then)
            return call_ends if for_all is None else min(call_ends, for_all)

        return now

    def _time_up(self) -> bool:
        ends = self._time_for_all_ends()
        return ends is not None and time.monotonic() >= ends

    def _receive(self) -> object:
        try:
            return recv_frame(self.channel, self.max_frame_bytes, self._deadline(), MAX_CONTAINERS)
        except TimeoutError:
            if self._time_up():
                self.broken = TestsTimeUp(TIME_UP_MESSAGE)
            else:
                self.broken = CandidateTimeout(f"the candidate did not answer within {self.call_timeout} s")
        except EOFError:
            self.broken = CandidateDied("the candidate process exited")
        except ProtocolError as exc:
            self.broken = CandidateDied(f"the candidate broke the protocol: {exc}")
        except OSError as exc:
            self.broken = CandidateDied(f"the channel failed: {exc}")
        except MemoryError:
            self.broken = TooLargeForJudge(REPLY_TOO_LARGE)
        raise self.broken

    def handshake(self) -> dict[str, str] | None:
        """None when the program loaded, else its load error (type, message)."""
        hello = self._receive()
        if hello == {"ready": True}:
            return None
        if type(hello) is dict and set(hello) == {"load_error"}:
            error = hello["load_error"]
            if type(error) is dict and type(error.get("type")) is str and type(error.get("message")) is str:
                self.broken = CandidateDied("the program failed to load")
                return {"type": error["type"][:TYPE_NAME_LIMIT], "message": error["message"][:MESSAGE_LIMIT]}
        self.broken = CandidateDied("the candidate broke the protocol: bad greeting")
        raise self.broken

    def request(
        self, target: str, args: Sequence[object], kwargs: Mapping[str, object], handle: int | None = None,
        *, attribute: bool = False,
    ) -> tuple[str, object, str]:
        """Call the candidate: ("ok", value, ""), ("handle", n, class) or ("error", type, message).

        With ``attribute``, read the attribute ``target`` of the object ``handle``
        instead: ("ok", value, ""), ("method", None, target) or ("error", type, message).
        """
        if self.broken is not None:
            raise type(self.broken)(f"not run: {self.broken}")
        try:
            message: dict[str, object] = {
                "call": target,
                "args": encode_value(list(args)),
                "kwargs": {str(k): encode_value(v) for k, v in kwargs.items()},
            }
        except RejectedValue as exc:
            raise TypeError(f"only plain data can be passed to the candidate: {exc}") from None
        if handle is not None:
            message["handle"] = handle
        if attribute:
            message["attr"] = True
        if self._time_up():
            self.broken = TestsTimeUp(TIME_UP_MESSAGE)
            raise type(self.broken)(f"not run: {self.broken}")
        self.calls += 1
        try:
            ends = self._deadline()
            self.channel.settimeout(None if ends is None else max(1e-3, ends() - time.monotonic()))
            send_frame(self.channel, message, self.max_frame_bytes)
        except TimeoutError:
            self.broken = (TestsTimeUp(TIME_UP_MESSAGE) if self._time_up()
                           else CandidateTimeout("the candidate stopped reading its requests"))
            raise self.broken from None
        except FrameTooLarge:
            raise TypeError("arguments too large to pass to the candidate") from None
        except OSError as exc:
            self.broken = CandidateDied(f"the candidate process exited ({exc.strerror or exc})")
            raise self.broken from None
        reply = self._receive()
        try:
            return self._read(reply, target, attribute)
        except MemoryError:
            # Raised below, not in this handler: it would keep the MemoryError as its context, and in that the
            # frames that hold the half-decoded reply, for as long as self.broken lives.
            pass
        del reply  # and this frame, which it keeps in its own traceback
        self.broken = TooLargeForJudge(REPLY_TOO_LARGE)
        raise self.broken

    def _read(self, reply: object, target: str, attribute: bool) -> tuple[str, object, str]:
        """The reply to a request (see `request`), decoded; CandidateDied when it is not one."""
        if type(reply) is dict and len(reply) == 1:
            ((kind, body),) = reply.items()
            try:
                if kind == "ok":
                    return "ok", decode_value(body), ""
                if kind == "handle" and type(body) is int:
                    return "handle", body, target
                if kind == "method" and body is True and attribute:
                    return "method", None, target
                if kind == "error" and type(body) is dict:
                    error_type, error_message = body.get("type"), body.get("message")
                    if type(error_type) is str and type(error_message) is str:
                        return "error", error_type[:TYPE_NAME_LIMIT], error_message[:MESSAGE_LIMIT]
            except RejectedValue as exc:
                self.broken = CandidateDied(f"the candidate sent a value that is not plain data: {exc}")
                raise self.broken from None
        self.broken = CandidateDied("the candidate broke the protocol: bad reply")
        raise self.broken

    def candidate_exception(self, type_name: str, message: str) -> BaseException:
        """The exception to raise in test code for an error the candidate answered."""
        cls = getattr(builtins, type_name, None) if type_name.isidentifier() else None
        exc: BaseException | None = None
        # Not StopIteration: raised by a proxy inside the tests' own map(),
        # zip() or next() loop, it would end that loop as if the data had run
        # out, and `assert all(map(check, cases))` would pass unchecked.
        if isinstance(cls, type) and issubclass(cls, Exception) and not issubclass(cls, _ENDS_ITERATION):
            try:
                exc = cls(message)
            except Exception:
                exc = None
        if exc is None:
            exc = CandidateError(f"{type_name}: {message}")
        self.raised.append(exc)
        return exc


class _RemoteFunction:
    """Stands for a top-level callable of the candidate in the test namespace."""

    def __init__(self, remote: _Remote, name: str) -> None:
        self._remote = remote
        self.__name__ = self.__qualname__ = name

    def __call__(self, *args: object, **kwargs: object) -> object:
        return _unwrap(self._remote, self._remote.request(self.__name__, args, kwargs))

    def __repr__(self) -> str:
        return f"<candidate function {self.__name__}>"


class _RemoteObject:
    """An instance of a candidate's class, living in the candidate's process.

    Its attributes are read from the candidate's object: ``obj.method(...)``
    calls a method remotely, and ``obj.size`` is the plain data the attribute
    holds (an attribute that is not plain data fails as a value does).
    """

    def __init__(self, remote: _Remote, handle: int, class_name: str) -> None:
        self._remote = remote
        self._handle = handle
        self._class_name = class_name

    def __getattr__(self, name: str) -> Callable[..., object]:
        # Private names are ours (or copy/pickle probing an instance without
        # them): answering them remotely would recurse or leak proxies.
        if name.startswith("_"):
            raise AttributeError(name)
        remote, handle = self._remote, self._handle
        # Read, not assumed: a method stand-in for any name made `assert light.on` and `node.next is not None`
        # pass for a class that has no such attribute (red team). A candidate that answers "a method" for any
        # name gets no more than one that defines a method of that name, under the dataset's own pytest too.
        kind, body, detail = remote.request(name, (), {}, handle, attribute=True)
        if kind != "method":
            return _unwrap(remote, (kind, body, detail), method=True)  # type: ignore[return-value]

        def method(*args: object, **kwargs: object) -> object:
            return _unwrap(remote, remote.request(name, args, kwargs, handle), method=True)

        method.__name__ = name
        # Kept, so that only the first use of a method asks what it is: a test's loop of 20,000 calls took twice
        # as long, a round trip more each. A method that the object later replaced with data is then called, and
        # fails as a call of data does.
        self.__dict__[name] = method
        return method

    def __repr__(self) -> str:
        return f"<candidate {self._class_name} object>"


def _unwrap(remote: _Remote, reply: tuple[str, object, str], *, method: bool = False) -> object:
    """The test code's value for a reply: plain data, a stand-in for an object, or the candidate's exception.

    An object's methods are the candidate's to answer, so one is taken only
    where the tests asked for one: a call of a class the candidate's source
    defines at top level, not its function under test (``entry_point``), and
    not a method's result. Otherwise a function written as a class, or a
    candidate answering ``{"handle": n}`` to any call, would return a
    stand-in whose ``issubset``/``startswith``/``count`` the candidate
    answers, and ``assert r.issubset(primes)`` would pass.
    """
    kind, body, detail = reply
    if kind == "ok":
        return body
    if kind == "handle":
        if method or detail not in remote.classes:
            what = "a method" if method else repr(detail)
            remote.broken = CandidateDied(f"the candidate answered a call of {what} with an object, not a value")
            raise remote.broken
        return _RemoteObject(remote, body, detail)  # type: ignore[arg-type]
    raise remote.candidate_exception(body, detail)  # type: ignore[arg-type]


def _short(value: object, limit: int = 200) -> str:
    """repr(value), cut to `limit` characters, without the repr of what the cut drops.

    A wrong answer of 900,000 pairs (13 MiB of reply) took a 236 MiB repr
    for the first 200 characters of its message.
    """
    text = repr(_first_items(value, [limit]))
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
        return FunctionCase(tuple(case["args"]), case["expected"], bool(case.get("unwrap_single", False)))
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


def _function_case(
    remote: _Remote, fn_name: str, index: int, case: FunctionCase, tolerance: float
) -> dict[str, object]:
    try:
        kind, body, detail = remote.request(fn_name, case.args, {})
    except (CandidateDied, CandidateTimeout) as exc:
        return _test(index, _broken_status(exc), str(exc))
    except TypeError as exc:  # arguments that are not plain data: a malformed case
        return _test(index, "runtime_error", str(exc))
    if kind == "error":
        return _test(index, "runtime_error", f"{body}: {detail}")
    if kind == "handle":
        return _test(index, "runtime_error", f"{fn_name} is a class; name a method as 'Class.method'")
    try:
        if case.matches(body, tolerance):
            return _test(index, "ok")
        return _test(index, "wrong_answer", f"expected {_short(case.expected)}, got {_short(body)}")
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


def _run_pytest_style(
    name: str, test: Callable[..., object], setup: Callable[[], object] | None = None, outer_marks: Sequence[Any] = ()
) -> None:
    """Call one pytest-style test once per parameter set.

    Raises :class:`_Unsupported` before calling it when it needs what the harness
    does not provide (fixtures, ``indirect`` parameters) or what pytest itself
    fails (``async def`` without a plugin, ``yield`` tests).
    """
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
    try:
        parameters = list(inspect.signature(test).parameters.values())
    except (TypeError, ValueError):
        raise _Unsupported(f"{name}: its signature cannot be read") from None
    parameters = parameters[_mock_arguments(test):]
    required = {
        parameter.name
        for parameter in parameters
        if parameter.default is inspect.Parameter.empty
        and parameter.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    }
    names = {parameter.name for parameter in parameters}
    for arguments in calls:
        missing = required - arguments.keys()
        if missing:
            raise _Unsupported(f"{name}: needs the fixture(s) {', '.join(sorted(missing))}, "
                               "which the harness does not provide")
    for arguments in calls:
        if setup is not None:
            setup()
        test(**{key: value for key, value in arguments.items() if key in names})


_PytestTest = tuple[str, Callable[..., object], "Callable[[], object] | None", list[Any]]


def _defined_here(function: types.FunctionType) -> bool:
    """A function the test code wrote, under any decorators that kept ``__wrapped__`` (mock.patch, wraps)."""
    unwrapped = inspect.unwrap(function)
    return isinstance(unwrapped, types.FunctionType) and unwrapped.__code__.co_filename == _TEST_FILENAME


def _pytest_tests(namespace: dict[str, Any]) -> list[_PytestTest]:
    """(name in the namespace, test, setup, class and module marks) for the pytest-style tests the test code defined.

    ``test*`` functions, and the ``test*`` methods of ``Test*`` classes that
    are not unittest's (those run on their own) and have no ``__init__``,
    each on an instance of its own, with ``setup_method`` before each call.
    The module's ``pytestmark`` applies to all of them, a class's to its methods.
    """
    module_marks = _mark_list(namespace.get("pytestmark"))
    tests: list[_PytestTest] = []
    for name, value in list(namespace.items()):
        if name.startswith("test") and isinstance(value, types.FunctionType):
            if _defined_here(value):
                tests.append((name, value, None, module_marks))
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
                    setup = getattr(bound.__self__, "setup_method", None)
                    tests.append((f"{name}.{method_name}", bound,
                                  functools.partial(setup, bound) if callable(setup) else None, class_marks))
    return tests


def _autouse_fixtures(namespace: dict[str, Any]) -> list[str]:
    """Names of the ``@pytest.fixture(autouse=True)`` fixtures the test code defined (which the harness cannot apply).

    Duck-typed across pytest versions: 8.4+ wraps a fixture in a
    ``FixtureFunctionDefinition`` with ``_fixture_function_marker``, older ones
    set ``_pytestfixturefunction`` on the function.
    """
    names = []
    for name, value in list(namespace.items()):
        marker = getattr(value, "_fixture_function_marker", None) or getattr(value, "_pytestfixturefunction", None)
        if marker is not None and getattr(marker, "autouse", False) is True:
            names.append(name)
    return names


def _run_test_functions(namespace: dict[str, Any], source: str, called_candidate: bool) -> list[str]:
    """Call the pytest-style tests the test code defined and does not call itself.

    As pytest would: ``test*`` functions and ``Test*`` classes' ``test*``
    methods, once per ``@pytest.mark.parametrize`` parameter set (the
    function's, its class's and the module's ``pytestmark``), leaving out
    those marked ``skip``/``xfail``. When the code already called the
    candidate (a script that calls its own test functions, or a module-level
    instance the tests share), the tests its code refers to by name are left
    out, so that none runs twice; the others still run, or a module-level
    ``Counter()`` would pass them unchecked.

    Returns why each test that the harness cannot run as pytest would (it
    needs a fixture, an ``indirect`` parameter, an event loop; or an autouse
    fixture would change every test) was not run; the others still run, so
    that a wrong program still fails them.
    """
    tests = _pytest_tests(namespace)
    if tests and called_candidate:
        used = _names_used(source)
        tests = [test for test in tests if test[0].partition(".")[0] not in used]
    autouse = _autouse_fixtures(namespace)
    if tests and autouse:
        return [f"autouse fixture(s) {', '.join(autouse)}, which the harness cannot apply"]
    unsupported = []
    for name, test, setup, marks in tests:
        try:
            _run_pytest_style(name, test, setup, marks)
        except _Unsupported as exc:
            unsupported.append(str(exc))
    return unsupported


def _is_test_failure(exc: BaseException) -> bool:
    """An assert that failed, or pytest's own failure (``pytest.fail``, ``pytest.raises``' "DID NOT RAISE")."""
    cls = type(exc)
    # Failed says its module is "builtins"; its base, OutcomeException, lives in _pytest.outcomes.
    return isinstance(exc, AssertionError) or (
        cls.__name__ == "Failed" and any(base.__module__ == "_pytest.outcomes" for base in cls.__mro__)
    )


def _candidate_module(
    remote: _Remote, names: Sequence[str], proxies: Mapping[str, _RemoteFunction]
) -> types.ModuleType:
    """The module the tests get for ``import solution``: the candidate's top-level names, as proxies.

    It holds proxies and nothing else, so the tests reach through it nothing
    that their namespace did not already give them. Every top-level name the
    candidate defines is an attribute (the namespace's own proxy where it has
    one): ``from solution import f`` for a name the candidate does not define
    raises ImportError, as it would. ``from solution import *`` binds
    ``__all__``: the public names that the namespace binds anyway, so a star
    import does not make the tests' own ``abs`` or ``len`` the candidate's,
    nor replace the helpers the trusted setup code defined; naming such a name
    in the import gets the candidate's, as the test asked.
    """
    module = types.ModuleType(CANDIDATE_MODULE)
    defined: set[str] = set()
    for name in names:
        # No dunders: a candidate's `__getattr__` or `__path__` would change how imports resolve.
        if name.isidentifier() and not (name.startswith("__") and name.endswith("__")):
            setattr(module, name, proxies.get(name) or _RemoteFunction(remote, name))
            defined.add(name)
    module.__all__ = [name for name in proxies if name in defined and not name.startswith("_")]  # type: ignore[attr-defined]
    return module


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


def _run_assert(
    remote: _Remote, names: Sequence[str], assert_code: str, entry_point: str, setup_code: str
) -> dict[str, object]:
    namespace: dict[str, Any] = {"__name__": "__sandboxd_test__", "__builtins__": builtins}
    if setup_code:
        try:
            exec(_compiled(setup_code, "<setup>"), namespace)
        except BaseException as exc:
            return _test(0, "setup_error", f"setup code failed: {_describe(exc)['type']}: {exc}")
    proxies: dict[str, _RemoteFunction] = {}
    for name in names:
        # Never shadow a builtin: a candidate defining `abs` or `len` would
        # otherwise answer for the tests' own `abs(candidate(x) - y) < 1e-6`.
        # Names the trusted setup code (HumanEval's prompt) defined stay the
        # dataset's, so its helpers (poly, encode_cyclic) cannot be replaced.
        if name.isidentifier() and name not in namespace and not hasattr(builtins, name):
            proxies[name] = _RemoteFunction(remote, name)
    if entry_point:
        proxies[entry_point] = _RemoteFunction(remote, entry_point)
    namespace.update(proxies)
    module = _candidate_module(remote, names, proxies)
    try:
        with _importable(module):
            exec(_compiled(assert_code, _TEST_FILENAME), namespace)
            check = namespace.get("check")
            if entry_point and callable(check) and not isinstance(check, _RemoteFunction):
                check(proxies[entry_point])
            _run_unittest_cases(namespace)
            unsupported = _run_test_functions(namespace, assert_code, remote.calls > 0)
    except (CandidateDied, CandidateTimeout) as exc:
        return _test(0, _broken_status(exc), str(exc))
    except BaseException as exc:
        if remote.broken is not None:
            return _test(0, _broken_status(remote.broken), str(remote.broken))
        where = _failure_line(exc, assert_code)
        if isinstance(exc, MemoryError) and not any(exc is raised for raised in remote.raised):
            # The judge's, not one the candidate raised: the tests ran out of its budget (judgeserver.JOB_MEMORY_BYTES)
            # on what the candidate gave them, or on their own.
            return _test(0, "memory", f"the tests ran out of the judge's memory{where}")
        description = _describe(exc)
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
    classes: Sequence[str] = (),
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
    ``expected`` and optional ``unwrap_single``, or an ``(args, expected)``
    pair) and compares the decoded value with
    :func:`~sandboxd.verifiers.code.compare_values`.

    ``plan_kind="assert"``: executes ``setup_code`` (trusted dataset code, e.g.
    HumanEval's prompt), then binds a proxy for each of ``names`` (given, or
    computed with :func:`top_level_definitions` from ``program``, the
    candidate's code, which then sets ``classes`` too; with ``assembly``,
    from the program :func:`~sandboxd.verifiers.code.assemble` makes of it,
    as the candidate does) that neither shadows a builtin nor was defined
    by the setup code, and one for ``entry_point`` always, in a fresh
    namespace; executes ``assert_code``; calls
    ``check(<entry_point proxy>)`` if it defined ``check``; runs the
    ``unittest.TestCase`` classes it defined; calls the pytest-style
    ``test*`` functions and ``Test*`` classes' methods it defined, as pytest
    would (parametrized ones once per parameter set; those needing fixtures,
    skipped or xfail are not called), except those its code refers to by name
    when something already called the candidate (it calls them itself). Meanwhile ``import solution`` (KodCode's
    ``from solution import f``) gives a module of the candidate's names as
    proxies, removed from ``sys.modules`` again when the tests end (see
    :func:`_candidate_module`). Any exception fails the test, and so does never
    calling the candidate (status ``no_calls``: nothing was checked).
    Calling a proxy of a class makes an instance in the candidate's process
    and returns a stand-in whose methods are called remotely (an attribute
    that is not a method is read as plain data); only plain data can be
    passed as arguments.
    Only the names in ``classes`` (the candidate's top-level ``class``
    statements, by :func:`top_level_definitions`), except ``entry_point``,
    may answer with an object; methods answer with values. Tests that pytest
    would run but the harness cannot run as pytest would (they need a
    fixture, an ``indirect`` parameter, an event loop, an autouse fixture)
    do not count as passed: when every test that ran passed, the status is
    ``unsupported`` (the dataset's tests, not the model's fault).

    ``call_timeout`` bounds each call (and the program's start-up) in seconds;
    ``time_for_all``, if given, all of them together from now: the call in
    flight when it runs out and every later one are ``total_time``, and the
    tests that ran keep their verdicts (a job's reward as a fraction of its
    cases counts them). Past that the caller enforces the deadline by
    killing both processes. Both move on by what ``cpu_credit()`` grows by
    meanwhile (the seconds the sandbox's other runs had the CPU while the
    candidate waited for one), up to ``deadline_stretch`` times their span.
    ``on_result`` gets each test's result as soon as it is known.
    The channel is shut down for writing at the end, which ends the candidate.

    Returns ``{"passed": bool, "passed_count": int, "total": int,
    "status": str, "message": str, "load_error": {"type", "message"} | None,
    "candidate_died": bool, "tests": [{"index", "passed", "status",
    "message"}]}``. Test statuses: ``ok``, ``wrong_answer``, ``runtime_error``
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
            names, classes = _program_definitions(program, assembly)
        except TooLargeForJudge as exc:
            too_large = exc
    remote = _Remote(channel, max_frame_bytes, call_timeout, frozenset(classes) - {entry_point}, deadline,
                     cpu_credit=cpu_credit, deadline_stretch=deadline_stretch)
    load_error: dict[str, str] | None = None
    try:
        try:
            load_error = remote.handshake()
        except (CandidateDied, CandidateTimeout) as exc:
            for index in range(total):
                report(_test(index, _broken_status(exc), f"before the program was ready: {exc}"))
        else:
            if load_error is not None:
                text = f"{load_error['type']}: {load_error['message']}"
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
                report(_run_assert(remote, names, assert_code, entry_point, setup_code))
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
        "load_error": load_error,
        "candidate_died": isinstance(remote.broken, CandidateDied) and load_error is None,
        "tests": tests,
    }
