"""Objects that live in one process and are used from the other: the candidate's and the judge's.

The two-process harness (harness) keeps the candidate's code and the
dataset's tests apart. Values cross the channel by value (wire); every
other object stays where it was made and the other side gets a **proxy**,
whose uses become requests answered by the object's own process:

- the judge holds proxies of the candidate's functions, classes (stand-in
  classes, so that ``isinstance``, ``pytest.raises(solution.MyError)`` and
  class attributes work), instances and iterators; a test that asks the
  candidate's objects (``len(stack)``, ``Point(1, 2) == Point(1, 2)``,
  ``node.next.val``) is answered by the candidate's methods, as Python would;
- the candidate holds proxies of what a test passed it that is not a value:
  its lambdas and callbacks, its iterators, mocks, ``io.StringIO`` buffers,
  instances of the test's own classes;
- arguments that the candidate mutates in place (``a.sort()``, ``m[:] = ...``)
  are written back into the test's own objects after each request.

The rules that keep a reward honest:

- a comparison of a candidate's object with anything that is not another of
  its objects is the judge's, and Python's default for an object that does not
  compare (``NotImplemented``: not equal, unordered): an always-equal object or
  a lying ``__eq__``/``__lt__`` cannot pass a test against the test's own values;
  values (a returned list, an int, an array) are rebuilt in the judge from its
  own classes before anything compares them;
- the candidate reaches nothing of the judge but what a test handed it, and of
  that only calls, iteration, and the public attributes of the test's own
  objects, mocks and buffers: no ``_``-names (``__globals__``, ``gi_frame``);
  a proxy of the judge's is good for the test that handed it over only;
- a candidate's context manager cannot swallow a failed assertion;
- ``open`` reaches the judge only while a test has patched it (a mock); an
  unpatched ``open`` is the candidate's own, under its own uid.

Requests nest: while one side waits for its answer, the other may ask it
something (a callback into the test, which may call the candidate again).

Stdlib only: this module runs inside the sandbox image.
"""

from __future__ import annotations

import builtins
import collections
import contextlib
import copy
import inspect
import io
import itertools
import math
import operator
import os
import random
import socket
import stat
import sys
import time
import types
import warnings
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, NoReturn

from .wire import (
    _ENCODER,
    MAX_CONTAINERS,
    MAX_FRAME_BYTES,
    Codec,
    Deadline,
    FrameTooLarge,
    ProtocolError,
    RejectedValue,
    decode_value,
    encode_value,
    recv_frame,
    send_frame,
)
from .wire import type_name as _type_name

# The harness's own clocks, bound here: a test may patch the time module's (PATCHABLE_FUNCTIONS), which the program's
# side then routes to the test, and the harness must not call its own requests in the middle of one.
_monotonic = time.monotonic
_time_ns = time.time_ns

__all__ = [
    "MESSAGE_LIMIT",
    "TYPE_NAME_LIMIT",
    "CandidateDied",
    "CandidateEndpoint",
    "CandidateError",
    "CandidateTimeout",
    "JudgeEndpoint",
    "Proxy",
    "TestsTimeUp",
    "TooLargeForJudge",
    "Unsupported",
    "share_files",
]

# Error messages from the candidate are for humans; keep them short.
MESSAGE_LIMIT = 2000
# An exception's type name is the candidate's to choose too (a class named with 9 MB).
TYPE_NAME_LIMIT = 200
# Requests inside requests (a callback that calls the candidate, that calls back, ...).
MAX_NESTING = 64
# What a candidate prints during one request reaches the judge with its answer (a test's
# redirect_stdout or capsys reads it); past this, over the whole job, its output is dropped.
OUTPUT_LIMIT_BYTES = 8 << 20
# Warnings the program makes during one request that reach the tests (warnings.warn: a test's pytest.warns or
# catch_warnings sees them); past this, the rest of the request's are dropped.
WARNINGS_PER_FRAME = 64
# Items an iterator of the candidate's sends at most per request: it asks for 1, then twice as
# many each time, so an infinite generator read with next() computes few items ahead.
ITERATOR_BATCH_MAX = 4096
# The program's own functions and classes its ready frame names (CandidateEndpoint.definitions): enough for the
# datasets' programs; one with more is asked for the names its tests want instead.
READY_DEFINITIONS = 32
TIME_UP_MESSAGE = "the time for all the tests ran out"
REPLY_TOO_LARGE = "the candidate's reply took more memory to decode than the judge may use (MemoryError)"

_ENDS_ITERATION = (StopIteration, StopAsyncIteration)
# Builtins that a test may patch (unittest.mock.patch("builtins.input")) and the candidate's code
# must then see patched: its own are routed to the judge's while they are (see CandidateEndpoint).
PATCHABLE_BUILTINS = ("input", "print", "open")  # JudgeEndpoint.patched names the three
_REAL_BUILTINS = {name: getattr(builtins, name) for name in PATCHABLE_BUILTINS}
# Standard-library functions that tests patch (``mock.patch("time.sleep")``, ``monkeypatch.setattr(random,
# "choice", ...)``) and a program calls through its module (``time.sleep(1)``): while the test's module has one
# patched, the program's calls go to the test's patch, which answers them and records them for its asserts, as
# one process would. (A program that bound the function itself, ``from time import sleep``, keeps it, as under
# pytest; tests patch ``solution.sleep`` for that.) Named "module.function" in a request's "p", as builtins are.
PATCHABLE_FUNCTIONS = (
    "time.sleep", "time.time", "time.monotonic", "time.perf_counter", "time.time_ns",
    "random.random", "random.randint", "random.randrange", "random.choice", "random.choices", "random.shuffle",
    "random.sample", "random.uniform", "random.gauss",
    "os.getenv", "os.listdir", "os.remove", "os.path.exists", "os.path.isfile", "os.path.isdir", "os.path.getsize",
)
_PATCHABLE_NAMES = frozenset(PATCHABLE_BUILTINS) | frozenset(PATCHABLE_FUNCTIONS)


# Random generators the tests seeded since the program last took their state: "random" (random.seed) and
# "numpy" (numpy.random.seed), noted by the judge's own wrappers (judge.py, watch_seeds). The next request carries
# the tests' state of each ("rs"), and the program's generator takes it: a test that seeds and then calls the
# program (``random.seed(42); a = roll(); random.seed(42); assert roll() == a``) sees what one process would.
SEEDED: set[str] = set()


def watch_seeds() -> None:
    """In a judge: note each seeding of the random module's generator (and numpy's, once numpy is imported)."""
    real = random.seed
    if getattr(real, "_sandboxd_watched", False):
        return

    def seed(*args: Any, **kwargs: Any) -> None:
        real(*args, **kwargs)
        SEEDED.add("random")

    seed._sandboxd_watched = True  # type: ignore[attr-defined]
    random.seed = seed


def _watch_numpy_seed(numpy: Any) -> None:
    real = numpy.random.seed
    if getattr(real, "_sandboxd_watched", False):
        return

    def seed(*args: Any, **kwargs: Any) -> None:
        real(*args, **kwargs)
        SEEDED.add("numpy")

    seed._sandboxd_watched = True  # type: ignore[attr-defined]
    numpy.random.seed = seed
    # Seeded (or not) before this judge first saw numpy: its state goes over once, to be sure.
    SEEDED.add("numpy")


def _random_states() -> dict[str, object]:
    """The tests' generators' states that the program is to take (SEEDED), as plain data."""
    states: dict[str, object] = {}
    if "random" in SEEDED:
        version, internal, gauss = random.getstate()
        states["random"] = [version, list(internal), gauss]
    numpy = sys.modules.get("numpy")
    if "numpy" in SEEDED and numpy is not None:
        with contextlib.suppress(Exception):  # a generator other than the legacy MT19937 one: not handed over
            name, keys, position, has_gauss, cached = numpy.random.get_state()
            states["numpy"] = [str(name), [int(key) for key in keys], int(position), int(has_gauss), float(cached)]
    SEEDED.clear()
    return states


def _take_random_states(states: object) -> None:
    """In the program's process: its generators take the tests' states (_random_states)."""
    if type(states) is not dict:
        return
    with contextlib.suppress(Exception):  # malformed: the program keeps its own state
        version, internal, gauss = states["random"]
        random.setstate((version, tuple(internal), gauss))
    if "numpy" in states:
        with contextlib.suppress(Exception):
            import numpy

            name, keys, position, has_gauss, cached = states["numpy"]
            numpy.random.set_state((name, numpy.array(keys, dtype=numpy.uint32), position, has_gauss, cached))


def _function_of(name: str) -> tuple[types.ModuleType, str]:
    module, _, function = name.rpartition(".")
    return sys.modules[module], function


# Each process's own (this module is imported before any test or program runs: harness.py).
_REAL_FUNCTIONS = {name: getattr(*_function_of(name)) for name in PATCHABLE_FUNCTIONS}
_WATCHED_FUNCTIONS = tuple((*_function_of(name), original, name) for name, original in _REAL_FUNCTIONS.items())


class CandidateError(Exception):
    """An exception raised by the candidate that has no builtin equivalent.

    Builtin exception types (``ValueError``, ``KeyError``, ...) are re-raised
    in the test process as themselves, so tests that expect them still work;
    the candidate's own exception classes as their stand-ins.
    """


class CandidateDied(BaseException):
    """The candidate process is gone (end of file) or broke the protocol.

    A ``BaseException`` so that test code catching ``Exception`` cannot swallow it;
    the harness also remembers it, so a test that swallows it anyway still fails.
    """


class TooLargeForJudge(CandidateDied):
    """The candidate's program or one of its replies took more memory (or nesting) to read than the judge may use."""


class CandidateTimeout(BaseException):
    """A call to the candidate did not answer within ``call_timeout``."""


class TestsTimeUp(CandidateTimeout):
    """The time for all the tests ran out: during a call, or before it."""

    __test__ = False  # not a pytest class, whatever its name


class Unsupported(Exception):
    """What the harness cannot do safely for a test (a value numpy-less, an object it will not hand over)."""


def describe(exc: BaseException) -> dict[str, str]:
    try:
        message = str(exc)
    except Exception:
        message = "<unprintable exception>"
    return {"type": _type_name(exc)[:TYPE_NAME_LIMIT], "message": message[:MESSAGE_LIMIT]}


_MUTABLE_KINDS = frozenset({list, dict, set, bytearray, deque, collections.defaultdict, collections.Counter,
                            collections.OrderedDict})


def _mutable(value: object) -> bool:
    """Whether a value a request carried may have been changed in place by whoever served it (write-back)."""
    return type(value) in _MUTABLE_KINDS or (
        "numpy" in sys.modules and isinstance(value, sys.modules["numpy"].ndarray))


def _json(value: object, codec: Codec) -> str:
    """A container's contents as text, to tell whether they changed (its encoding may share lists with it)."""
    return _ENCODER.encode(codec.encode(value))


def write_back(original: Any, new: Any, depth: int = 0) -> None:
    """Make ``original`` (a test's list, dict or one of collections' dicts, set, bytearray, deque or array) hold what
    ``new`` holds, in place.

    Nested lists and dicts are updated in place too, so a test that kept a
    row of its matrix sees the row change, as it would in one process.
    """
    kind = type(original)
    if depth > 100 or (type(new) is not kind and not (kind is deque and type(new) is deque)):
        raise Unsupported(f"a {_type_name(original)} argument came back as a {_type_name(new)}")
    if kind is list:
        for index in range(min(len(original), len(new))):
            old, fresh = original[index], new[index]
            if type(old) is type(fresh) and type(old) in (list, dict) and old is not original:
                write_back(old, fresh, depth + 1)
            else:
                original[index] = fresh
        del original[len(new):]
        original.extend(new[len(original):])
    elif issubclass(kind, dict):  # a dict, defaultdict (which keeps its own factory), Counter or OrderedDict
        for key in [key for key in original if key not in new]:
            del original[key]
        for key, fresh in new.items():
            old = original.get(key)
            if type(old) is type(fresh) and type(old) in (list, dict) and old is not original:
                write_back(old, fresh, depth + 1)
            else:
                original[key] = fresh
    elif kind in (set, deque):
        original.clear()
        original.extend(new) if kind is deque else original.update(new)
    elif kind is bytearray:
        original[:] = new
    else:  # a numpy array
        if original.shape != new.shape or original.dtype != new.dtype:
            raise Unsupported("an array argument came back with another shape or dtype")
        original[...] = new


# What one pass of share_files looks at, at most: a test or a program that makes more files than this in the
# job's folder has the rest shared on later passes, one frame at a time.
SHARE_FILES_ENTRIES = 1000


def share_files(folder: str) -> None:
    """Make what this process made in the job's folder usable by the other side's: files 0666, folders 0777.

    The candidate and the judge run under two uids whose umask is 077, and a
    test hands the program files it wrote (``tmp_path``, ``tempfile``, a
    relative path) or reads files the program wrote. Each side runs this
    before it hands control to the other (each frame it sends). The folder
    itself is the candidate's own, shared with its judge's group only
    (host.jobs._python_harness), so nothing of it is any other job's to
    see. Symbolic links are not followed; entries of the other uid are left
    as they are.

    A folder is read again only when it may have changed since it was last
    read: HumanEval's checks make dozens of calls a job, and reading the
    folder before each frame costs 1.8 ms of a job's 10 (host, all 164
    problems). Its mtime moves with every entry made or removed, but in steps
    of the kernel's coarse clock: a folder changed within one step
    (SHARE_FILES_SETTLE_NS) of its last reading is read again. A folder
    not read yet whose mtime is UNTOUCHED_FOLDER_MTIME_NS is taken as read:
    empty, as the agent made it (host.jobhost.make_workdir).
    """
    known = _shared_in.get("/") if _shared_in.get("") == folder else None
    if known is None or not known[2]:  # a folder without subfolders: one stat says whether to read it
        try:
            mtime = os.stat(folder, follow_symlinks=False).st_mtime_ns
        except OSError:
            return
        if known is None and mtime == UNTOUCHED_FOLDER_MTIME_NS:
            # Empty as the agent made it: nothing to share until an entry is made, which moves the mtime.
            _shared_in.clear()
            _shared_in[""] = folder
            _shared_in["/"] = (mtime, _time_ns(), [])
            return
        if known is not None and known[0] == mtime and known[1] > mtime + SHARE_FILES_SETTLE_NS:
            return
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return
    if _shared_in.get("") != folder:  # another job's folder (a judge lives long): nothing known of this one
        _shared_in.clear()
        _shared_in[""] = folder
    try:
        _share_in(fd, "", os.geteuid(), [SHARE_FILES_ENTRIES])
    finally:
        os.close(fd)


# The mtime the agent gives a job's folder that it made empty (host.jobhost, os.utime): share_files then reads nothing
# until an entry is made or removed there, which sets the mtime to the present. A fresh job's folder is otherwise
# read before every frame of a short job (its mtime within a clock step: see SHARE_FILES_SETTLE_NS): 0.2 ms of a
# HumanEval candidate's CPU and 25 of its page faults, on the host. A program that sets it back on a folder it
# wrote to keeps its own files from its tests; nothing of the judge's depends on it.
UNTOUCHED_FOLDER_MTIME_NS = 0
# Folder (relative to the job's; "" names the job's folder's path itself) -> (mtime, when last read), in ns.
_shared_in: dict[str, Any] = {}
# Timestamps of files move in steps of the kernel's coarse clock (CLOCK_REALTIME_COARSE, whose id the time module
# does not name: 5 on Linux; a jiffy, 4 ms at 250 Hz): a folder read more than a step after its mtime gets a later
# mtime from any change after the reading. A fixed 50 ms would keep each job's folder, made as the job starts, read
# before every frame of a whole HumanEval job (0.9 ms of its judge's CPU in a sandbox).
_CLOCK_REALTIME_COARSE = 5
SHARE_FILES_SETTLE_NS = int(time.clock_getres(_CLOCK_REALTIME_COARSE) * 1e9) + 1_000_000


def _share_in(dir_fd: int, path: str, uid: int, budget: list[int], depth: int = 0) -> None:
    if depth > 16:
        return
    try:
        mtime = os.fstat(dir_fd).st_mtime_ns
    except OSError:
        return
    known = _shared_in.get(path + "/")
    if known is not None and known[0] == mtime and known[1] > mtime + SHARE_FILES_SETTLE_NS:
        subfolders = known[2]
    else:
        read_at = _time_ns()
        subfolders = []
        with os.scandir(dir_fd) as entries:
            for entry in entries:
                budget[0] -= 1
                if budget[0] < 0:
                    return  # not remembered as read: the rest is shared on a later pass
                try:
                    info = entry.stat(follow_symlinks=False)
                    if stat.S_ISDIR(info.st_mode):
                        subfolders.append(entry.name)
                    elif stat.S_ISREG(info.st_mode) and info.st_uid == uid and info.st_mode & 0o666 != 0o666:
                        _chmod_file(dir_fd, entry.name, uid)
                except OSError:
                    continue
        _shared_in[path + "/"] = (mtime, read_at, subfolders)
    for name in subfolders:
        try:
            child = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dir_fd)
        except OSError:
            continue
        try:
            # By the folder opened (no links followed), not its name: see _chmod_file.
            opened = os.fstat(child)
            if opened.st_uid == uid and stat.S_IMODE(opened.st_mode) & 0o777 != 0o777:
                os.fchmod(child, 0o777)
            _share_in(child, f"{path}/{name}", uid, budget, depth + 1)
        except OSError:
            pass
        finally:
            os.close(child)


def _chmod_file(dir_fd: int, name: str, uid: int) -> None:
    """Make one of our files in the job's folder 0666, by the file opened (no links followed), not by its name.

    The folder is the program's: between a look at an entry and a chmod of
    its name, the program (a thread of it, running while the tests do) may
    put a symbolic link there, which chmod by name follows: the judge would
    make a file of its own anywhere 0666 for the program's uid.
    """
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY, dir_fd=dir_fd)
    except OSError:
        return  # a link now, or a file of ours we may not read (0200): left as it is
    try:
        info = os.fstat(fd)
        if stat.S_ISREG(info.st_mode) and info.st_uid == uid and info.st_mode & 0o666 != 0o666:
            os.fchmod(fd, stat.S_IMODE(info.st_mode) | 0o666)
    finally:
        os.close(fd)


# ---------------------------------------------------------------------------
# Both sides
# ---------------------------------------------------------------------------


class Endpoint(Codec):
    """One side's end of the channel: its objects the peer holds, the peer's it holds, requests that nest.

    Frames: a request ``{"q": op, "a": [args...], "k": {kwargs}}`` (plus extras
    of each side); a reply ``{"r": value}``, ``{"m": true}`` (an attribute that
    is a method of the object) or ``{"e": {"type", "message", ...}}``.
    """

    def __init__(self, channel: socket.socket, send_limit: int, receive_limit: int) -> None:
        self.channel = channel
        self.send_limit = send_limit
        self.receive_limit = receive_limit
        # Ours that the peer may name (kept alive, so that their ids stay theirs).
        self.exported: dict[int, object] = {}
        self.export_ids: dict[int, int] = {}
        self.next_id = itertools.count(1)
        # The peer's that we hold, one proxy each, so that `is` works.
        self.proxies: dict[int, object] = {}
        self.proxy_ids: dict[int, int] = {}
        self.nesting = 0

    # ---- references ----

    def export(self, obj: object) -> object:
        ref = self.export_ids.get(id(obj))
        if ref is None or self.exported.get(ref) is not obj:
            ref = next(self.next_id)
            self.exported[ref] = obj
            self.export_ids[id(obj)] = ref
        return {"$mine": self.describe_export(ref, obj)}

    def describe_export(self, ref: int, obj: object) -> list[object]:
        kind = "iterator" if isinstance(obj, Iterator) else "function" if callable(obj) else "object"
        return [ref, kind, _type_name(obj)[:TYPE_NAME_LIMIT]]

    def own(self, ref: object) -> object:
        if type(ref) is not int or ref not in self.exported:
            raise RejectedValue(f"no object {ref!r} of this side's is shared (a reference past its test?)")
        return self.exported[ref]

    def peer_id(self, obj: object) -> int | None:
        ref = self.proxy_ids.get(id(obj))
        return ref if ref is not None and self.proxies.get(ref) is obj else None

    def remember(self, ref: int, proxy: object) -> object:
        self.proxies[ref] = proxy
        self.proxy_ids[id(proxy)] = ref
        return proxy

    # ---- frames ----

    def encode_call(self, op: str, args: Sequence[object], kwargs: Mapping[str, object]) -> dict[str, Any]:
        return {"q": op, "a": [self.encode(arg) for arg in args],
                "k": {str(k): self.encode(v) for k, v in kwargs.items()}}

    def decode_call(self, request: Mapping[str, Any]) -> tuple[str, list[Any], dict[str, Any]]:
        op, raw_args, raw_kwargs = request.get("q"), request.get("a", []), request.get("k", {})
        if type(op) is not str or type(raw_args) is not list or type(raw_kwargs) is not dict:
            raise ProtocolError("a request is {q: op, a: [args], k: {kwargs}}")
        return op, [self.decode(arg) for arg in raw_args], {str(k): self.decode(v) for k, v in raw_kwargs.items()}


def _checked(result: object, kind: type | tuple[type, ...], op: str) -> Any:
    if not isinstance(result, kind) or (kind is int and type(result) is bool and op != "bool"):
        raise TypeError(f"{op}() of the candidate's object returned {_type_name(result)}")
    return result


# Operations one side may ask of the other's objects: name -> function of the serving side.
_OPERATORS: dict[str, Callable[..., object]] = {
    "call": lambda target, /, *args, **kwargs: target(*args, **kwargs),
    "callmethod": lambda obj, name, /, *args, **kwargs: getattr(obj, name)(*args, **kwargs),
    "getattr": getattr, "setattr": setattr, "delattr": delattr,
    "len": len, "bool": bool, "str": str, "repr": repr, "hash": hash, "format": format, "dir": dir,
    "iter": iter, "reversed": reversed,
    "getitem": operator.getitem, "setitem": operator.setitem, "delitem": operator.delitem,
    "contains": operator.contains, "isinstance": isinstance, "issubclass": issubclass,
    "int": int, "float": float, "complex": complex, "index": operator.index, "round": round,
    "trunc": math.trunc, "floor": math.floor, "ceil": math.ceil,
    "neg": operator.neg, "pos": operator.pos, "abs": operator.abs, "invert": operator.invert,
    "eq": operator.eq, "ne": operator.ne, "lt": operator.lt, "le": operator.le, "gt": operator.gt, "ge": operator.ge,
    "copy": copy.copy, "deepcopy": copy.deepcopy,
    "enter": lambda obj: type(obj).__enter__(obj),
    "exit": lambda obj, *args: type(obj).__exit__(obj, *args),
}
_BINARY = ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "matmul", "and", "or", "xor", "lshift", "rshift")
for _name in _BINARY:
    _OPERATORS[_name] = getattr(operator, _name + ("_" if _name in ("and", "or") else ""))
    _OPERATORS["i" + _name] = getattr(operator, "i" + _name)
_COMPARISONS = frozenset({"eq", "ne", "lt", "le", "gt", "ge"})


# ---------------------------------------------------------------------------
# The candidate's side
# ---------------------------------------------------------------------------


class _Output(io.TextIOBase):
    """The candidate's sys.stdout/sys.stderr: what it prints goes to the judge with its next frame."""

    def __init__(self, endpoint: CandidateEndpoint, name: str) -> None:
        self.endpoint = endpoint
        self.name = name
        self.parts: list[str] = []

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        if type(text) is not str:
            raise TypeError(f"write() argument must be str, not {_type_name(text)}")
        room = OUTPUT_LIMIT_BYTES - self.endpoint.output_sent
        if room > 0:
            self.parts.append(text[:room])
            self.endpoint.output_sent += min(len(text), room)
        return len(text)

    def take(self) -> str:
        text = "".join(self.parts)
        self.parts.clear()
        return text

    @property
    def buffer(self) -> _OutputBuffer:
        """``sys.stdout.buffer``: bytes written there go with the text (as UTF-8; other bytes escaped, as the
        test's capsysbinary gives them back)."""
        return _OutputBuffer(self)


class _OutputBuffer(io.RawIOBase):
    def __init__(self, text: _Output) -> None:
        self.text = text

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        self.text.write(bytes(view).decode("utf-8", "surrogateescape"))
        return len(view)


class _Stdin(io.TextIOBase):
    """The candidate's sys.stdin: reads what the test's sys.stdin holds (a test that patched it with a StringIO)."""

    def __init__(self, endpoint: CandidateEndpoint) -> None:
        self.endpoint = endpoint

    def readable(self) -> bool:
        return True

    def read(self, size: int | None = -1) -> str:
        return str(self.endpoint.ask("stdin", ["read", -1 if size is None else size]))

    def readline(self, size: int | None = -1) -> str:  # type: ignore[override]
        return str(self.endpoint.ask("stdin", ["readline", -1 if size is None else size]))

    def readlines(self, hint: int | None = -1) -> list[str]:  # type: ignore[override]
        lines = self.endpoint.ask("stdin", ["readlines", -1 if hint is None else hint])
        return [str(line) for line in lines] if isinstance(lines, list) else []

    def __iter__(self) -> Iterator[str]:  # type: ignore[override]
        return self

    def __next__(self) -> str:  # type: ignore[override]
        line = self.readline()
        if not line:
            raise StopIteration
        return line


# Log records a program may send its tests over a job; past this they are dropped.
LOG_RECORDS_LIMIT = 10_000


class JudgeObject:
    """In the candidate: something a test handed it that is not a value (a callback, an iterator, a mock, a buffer).

    What it may do with it is the judge's to allow (see JudgeEndpoint._serve).
    """

    __slots__ = ("_sandboxd_batch", "_sandboxd_buffer", "_sandboxd_endpoint", "_sandboxd_ref", "_sandboxd_type")

    def __init__(self, endpoint: CandidateEndpoint, ref: int, type_name: str) -> None:
        object.__setattr__(self, "_sandboxd_endpoint", endpoint)
        object.__setattr__(self, "_sandboxd_ref", ref)
        object.__setattr__(self, "_sandboxd_type", type_name)
        object.__setattr__(self, "_sandboxd_buffer", deque())
        object.__setattr__(self, "_sandboxd_batch", 1)

    def _ask(self, op: str, *args: object, **kwargs: object) -> Any:
        return self._sandboxd_endpoint.ask(op, [self, *args], kwargs)

    def __call__(self, *args: object, **kwargs: object) -> Any:
        return self._ask("call", *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return self._ask("getattr", name)

    def __setattr__(self, name: str, value: object) -> None:
        self._ask("setattr", name, value)

    def __iter__(self) -> Iterator[Any]:
        return self._ask("iter")

    def __next__(self) -> Any:
        buffer: deque[Any] = self._sandboxd_buffer
        if not buffer:
            batch = self._sandboxd_batch
            object.__setattr__(self, "_sandboxd_batch", min(batch * 2, ITERATOR_BATCH_MAX))
            items, ended = self._ask("next", batch)
            buffer.extend(items)
            if ended and not buffer:
                raise StopIteration
            if ended:
                buffer.append(_END)
        item = buffer.popleft()
        if item is _END:
            raise StopIteration
        return item

    def __bool__(self) -> bool:
        # Asked, not len(): `while node:` of a test's Node, or `if key:` of its callback, is True in Python though
        # neither has a len(), which the test's process refused (a correct program failed).
        return bool(self._ask("bool"))

    def __len__(self) -> int:
        return int(self._ask("len"))

    def __getitem__(self, key: object) -> Any:
        return self._ask("getitem", key)

    def __contains__(self, item: object) -> bool:
        return bool(self._ask("contains", item))

    def __enter__(self) -> Any:
        return self._ask("enter")

    def __exit__(self, *exc: object) -> Any:
        return self._ask("exit", None, None, None)

    def __str__(self) -> str:
        return str(self._ask("str"))

    def __repr__(self) -> str:
        return f"<test's {self._sandboxd_type}>"


_END = object()


class CandidateEndpoint(Endpoint):
    """The candidate's end: answers the judge's requests; its callbacks go the other way."""

    def __init__(self, channel: socket.socket, max_frame_bytes: int, receive_limit: int,
                 namespace: dict[str, Any], resolve: Callable[[str], Any], own_pid: int = 0,
                 files: str = "") -> None:
        super().__init__(channel, max_frame_bytes, receive_limit)
        # The job's folder, which the program shares with its tests (see share_files); "" for none.
        self.files = files
        # A child that the program forked (os.fork) and that comes back to us must not write on our channel: it
        # ends instead, its output flushed (harness.end_if_forked), when it first would.
        self.own_pid = own_pid
        self.namespace = namespace
        self.resolve = resolve
        self.output_sent = 0
        self.stdout = _Output(self, "stdout")
        self.stderr = _Output(self, "stderr")
        # Builtins the test has patched at the moment (see PATCHABLE_BUILTINS): the judge says with each request.
        self.patched: frozenset[str] = frozenset()
        # This process's own environment variables, kept when the tests first change theirs.
        self.own_environ: dict[str, str] | None = None
        # The test's containers this program holds (see hold): by the judge's id, their JSON as last synced,
        # and the id of each by the object's identity.
        self.held: dict[int, object] = {}
        self.held_base: dict[int, object] = {}
        self.held_ids: dict[int, int] = {}
        self.writing: object = None
        # The warnings the program made since the last frame: [category, message, lineno] each.
        self.warnings_made: list[list[object]] = []
        # The program's log records since the last frame, once a test's caplog asked for them.
        self.logging_forwarded = False
        self.log_records: list[list[object]] = []
        self.log_records_sent = 0
        self.batches: dict[int, int] = {}

    def subclass_value(self, obj: object, data: object) -> object:
        return {"$sub": [data, self.export(obj)]}

    def proxy(self, body: object) -> object:
        if type(body) is not list or len(body) != 3 or type(body[0]) is not int or type(body[2]) is not str:
            raise RejectedValue("$mine must hold [id, kind, type]")
        found = self.proxies.get(body[0])
        return found if found is not None else self.remember(body[0], JudgeObject(self, body[0], body[2]))

    def install(self) -> None:
        """Route the program's stdio, input() and (while a test patches them) print and open through the judge."""
        sys.stdout, sys.stderr, sys.stdin = self.stdout, self.stderr, _Stdin(self)
        real_print, real_open = builtins.print, builtins.open

        def input(prompt: object = "") -> str:
            answer = self.ask("input", [prompt] if prompt != "" else [])
            if not isinstance(answer, str):
                raise TypeError(f"the test's input() returned {_type_name(answer)}")
            return answer

        def print(*args: object, **kwargs: object) -> None:
            if "print" in self.patched:
                self.ask("print", list(args), {key: value for key, value in kwargs.items() if key in ("sep", "end")})
                return
            real_print(*args, **kwargs)  # type: ignore[call-overload]

        def open(*args: Any, **kwargs: Any) -> Any:
            if "open" in self.patched:
                return self.ask("open", list(args), kwargs)
            return real_open(*args, **kwargs)

        builtins.input, builtins.print, builtins.open = input, print, open

        # Every warning the program makes goes to the tests, as if made in their process: their filters decide
        # (pytest.warns records it, the default filters drop a DeprecationWarning), not the program's defaults,
        # which ignore one made outside __main__ and show each place's only once.
        def showwarning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                        file: object = None, line: object = None) -> None:
            if len(self.warnings_made) < WARNINGS_PER_FRAME:
                self.warnings_made.append([_warning_name(category), str(message)[:MESSAGE_LIMIT], int(lineno)])

        warnings.simplefilter("always")
        warnings.showwarning = showwarning

    def frame_extras(self, frame: dict[str, Any]) -> dict[str, Any]:
        if self.log_records:
            frame["log"], self.log_records = self.log_records, []
        if self.warnings_made:
            frame["warn"], self.warnings_made = self.warnings_made, []
        out, err = self.stdout.take(), self.stderr.take()
        if out:
            frame["out"] = out
        if err:
            frame["err"] = err
        return frame

    def send(self, frame: dict[str, Any]) -> None:
        if self.own_pid and os.getpid() != self.own_pid:
            with contextlib.suppress(BaseException):
                sys.__stdout__.flush()  # type: ignore[union-attr]
            os._exit(0)
        if self.files:
            share_files(self.files)
        try:
            send_frame(self.channel, self.frame_extras(frame), self.send_limit)
        except FrameTooLarge:
            send_frame(self.channel, {"e": {"type": "ValueTooLarge",
                                            "message": f"the answer exceeds {self.send_limit} bytes"}})

    def receive(self) -> dict[str, Any]:
        message = recv_frame(self.channel, self.receive_limit)
        if type(message) is not dict:
            raise ProtocolError("a frame must be a JSON object")
        patched = message.get("p")
        if type(patched) is list:
            self.take_patches(frozenset(name for name in patched if name in _PATCHABLE_NAMES))
        elif "q" in message and self.patched:
            self.take_patches(frozenset())
        if "q" in message:
            if "rs" in message:
                _take_random_states(message["rs"])
            self.follow(message)
        return message

    def take_patches(self, patched: frozenset[str]) -> None:
        """Route the functions the test has patched now (PATCHABLE_FUNCTIONS) to the test's, and put back those
        it no longer has; builtins are routed by `install`'s own."""
        for name in (patched ^ self.patched) - frozenset(PATCHABLE_BUILTINS):
            module, function = _function_of(name)
            setattr(module, function, self._patched_function(name) if name in patched else _REAL_FUNCTIONS[name])
        self.patched = patched

    def _patched_function(self, name: str) -> Callable[..., Any]:
        def patched(*args: object, **kwargs: object) -> Any:
            return self.ask("patched", [name, *args], kwargs)

        patched.__name__ = patched.__qualname__ = name.rpartition(".")[2]
        return patched

    def follow(self, request: Mapping[str, Any]) -> None:
        """Take on what the tests changed of their process's environment: variables (monkeypatch.setenv), the
        working directory (monkeypatch.chdir) and sys.argv, as a program in their process would see them."""
        changes = request.get("env")
        if type(changes) is list and len(changes) == 2 and type(changes[0]) is dict and type(changes[1]) is list:
            if self.own_environ is None:
                self.own_environ = dict(os.environ)
            wanted = {**self.own_environ, **{str(k): str(v) for k, v in changes[0].items()}}
            for key in changes[1]:
                wanted.pop(str(key), None)
            with contextlib.suppress(ValueError, OSError):
                os.environ.clear()
                os.environ.update(wanted)
        cwd = request.get("cwd")
        if type(cwd) is str:
            with contextlib.suppress(OSError, ValueError):
                os.chdir(cwd)
        argv = request.get("argv")
        if type(argv) is list and all(type(arg) is str for arg in argv):
            sys.argv[:] = argv
        levels = request.get("log")
        if type(levels) is dict:
            self.forward_logs(levels)

    def forward_logs(self, levels: dict[object, object]) -> None:
        """Send the program's log records to the tests (their caplog), at the levels the tests set."""
        from .logcapture import forward_logs  # only once a test asks: see logcapture's docstring

        installed, self.logging_forwarded = self.logging_forwarded, True
        forward_logs(self, levels, installed)

    def ask(self, op: str, args: Sequence[object], kwargs: Mapping[str, object] | None = None) -> Any:
        """A callback into the test's process; its answer, or the exception it raised (as ours)."""
        if self.nesting >= MAX_NESTING:
            raise RecursionError("requests nested too deep between the program and its tests")
        self.send(self.encode_call(op, args, kwargs or {}))
        self.nesting += 1
        try:
            while True:
                message = self.receive()
                if "q" in message:
                    self.send(self.serve(message))
                    continue
                break
        finally:
            self.nesting -= 1
        if "r" in message:
            return self.decode(message["r"])
        error = message.get("e")
        if type(error) is dict:
            raise _rebuilt(error)
        raise ProtocolError("bad answer to a callback")

    def serve(self, request: dict[str, Any]) -> dict[str, Any]:
        """The answer to one of the judge's requests (never raises but for a BaseException that ends the program).

        A value of the test's that this process cannot take (numpy missing) is the harness's limit, not the
        program's failure; whatever the program's own code or values raise is the program's.
        """
        try:
            op, args, kwargs = self.decode_call(request)
            self.hold(request, args, kwargs)
        except RejectedValue as exc:
            return {"e": {"type": "Unsupported", "message": str(exc)[:MESSAGE_LIMIT], "unsupported": True}}
        except ProtocolError as exc:
            return {"e": {"type": "ProtocolError", "message": str(exc)[:MESSAGE_LIMIT]}}
        try:
            reply = self._serve(request, op, args, kwargs)
        except ProtocolError as exc:
            reply = {"e": {"type": "ProtocolError", "message": str(exc)[:MESSAGE_LIMIT]}}
        except Exception as exc:
            reply = {"e": self.describe_error(exc)}
        del args, kwargs
        # Also after an error: what the program changed before it raised is changed in the test.
        self.sync_held(reply)
        return reply

    def hold(self, request: Mapping[str, Any], args: list[Any], kwargs: dict[str, Any]) -> None:
        """Take the test's containers a request names as held (see JudgeEndpoint.held), one object each.

        A held container the program keeps (a `Transaction(account)`) is the
        same object every time the test hands it over, brought up to date in
        place with what the test changed meanwhile; it is written back after
        each request while the program holds it, and is `$held` when the
        program hands it back (`out is lst`).
        """
        if request.get("f") is True:
            self.held.clear()
            self.held_base.clear()
            self.held_ids.clear()
        for entry in request.get("fw") or ():
            if type(entry) is list and len(entry) == 2 and type(entry[0]) is int and entry[0] in self.held:
                write_back(self.held[entry[0]], self.decode(entry[1]))
                self.held_base[entry[0]] = entry[1]
        for entry in request.get("h") or ():
            if type(entry) is not list or len(entry) != 2 or type(entry[1]) is not int:
                raise ProtocolError("held containers are [position, id]")
            position, hid = entry
            if type(position) is int and 0 <= position < len(args):
                value, raw = args[position], request["a"][position]
            elif type(position) is str and position in kwargs:
                value, raw = kwargs[position], request["k"][position]
            else:
                raise ProtocolError("a held container names no argument")
            if not _mutable(value):
                raise ProtocolError("only containers are held")
            if hid in self.held:
                write_back(self.held[hid], value)
                value = self.held[hid]
                if type(position) is int:
                    args[position] = value
                else:
                    kwargs[position] = value
            else:
                self.held[hid] = value
                self.held_ids[id(value)] = hid
            # What it held as it came: the frame's own JSON data, which nothing else refers to.
            self.held_base[hid] = raw

    def sync_held(self, reply: dict[str, Any]) -> None:
        """Add to a reply the held containers the request changed, and those the program no longer holds."""
        changed, dropped = [], []
        for hid in list(self.held):
            # Held by our table and getrefcount's argument only (asked first: its encoding may be itself): nothing
            # of the program's keeps it, so nothing will change it after this request.
            kept = sys.getrefcount(self.held[hid]) > 2
            fresh = self.encode_contents(self.held[hid])
            base = self.held_base[hid]
            # Compared as data while the base is the frame's (a C-level walk); once changed, as JSON text, since
            # the fresh encoding shares its lists with the container.
            if (fresh != base) if type(base) is not str else (_ENCODER.encode(fresh) != base):
                changed.append([hid, fresh])
                self.held_base[hid] = _ENCODER.encode(fresh)
            del fresh
            if not kept:
                dropped.append(hid)
                self.held_ids.pop(id(self.held.pop(hid)), None)
                del self.held_base[hid]
        if changed:
            reply["w"] = changed
        if dropped:
            reply["d"] = dropped

    def held_id(self, obj: object) -> int | None:
        hid = self.held_ids.get(id(obj))
        return hid if hid is not None and self.held.get(hid) is obj and obj is not self.writing else None

    def encode_contents(self, obj: object) -> object:
        """A held container's contents (not its `$held` name), for a write-back."""
        self.writing = obj
        try:
            return self.encode(obj)
        finally:
            self.writing = None

    def definitions(self) -> dict[str, Any]:
        """For the ready frame: the program's own functions and classes, by name (``{"defs": [[name, value],
        ...]}``), so that assert tests bind them without asking (JudgeEndpoint.definitions); nothing for a program
        with more than READY_DEFINITIONS of them, or whose names cannot be read plainly.

        Only plain functions and classes of plain ``type``, defined in the
        program's module: reading them runs none of the program's code (no
        metaclass, no descriptor), and they go by reference, never as data.
        """
        module = self.namespace.get("__name__")
        try:
            # A function goes by reference, as encode() would send it, without encode's look at every other kind of
            # value first: its first run in a fresh candidate copies the pages of all that code (about 15 faults).
            found = [[name, self.export(value) if type(value) is types.FunctionType else self.encode(value)]
                     for name, value in list(self.namespace.items())
                     if type(name) is str and not name.startswith("__")
                     and type(value) in (types.FunctionType, type) and value.__module__ == module]
        except Exception:
            return {}
        return {"defs": found} if 0 < len(found) <= READY_DEFINITIONS else {}

    def describe_error(self, exc: BaseException) -> dict[str, Any]:
        error: dict[str, Any] = describe(exc)
        cls = type(exc)
        args = _plain_args(exc)
        if args is not None:
            error["args"] = args
        if getattr(builtins, cls.__name__, None) is not cls:
            with contextlib.suppress(Exception):
                error["cls"] = self.encode(cls)
                error["obj"] = self.export(exc)
        return error

    def _serve(self, request: dict[str, Any], op: str, args: list[Any], kwargs: dict[str, Any]) -> dict[str, Any]:
        if op == "globals":
            found = {}
            for name in args:
                if type(name) is str and name in self.namespace:
                    found[name] = self.encode(self.namespace[name])
            return {"r": {"$dict": [[name, value] for name, value in found.items()]}}
        if op in ("setglobal", "delglobal"):
            if not args or type(args[0]) is not str or (op == "setglobal") != (len(args) == 2):
                raise ProtocolError(f"{op} needs a name")
            if op == "setglobal":
                self.namespace[args[0]] = args[1]
            elif args[0] in self.namespace:
                del self.namespace[args[0]]
            else:
                raise AttributeError(args[0])
            return {"r": None}
        if op == "call_name":
            if not args or type(args[0]) is not str:
                raise ProtocolError("call_name needs a name")
            target = self.resolve(args[0])
            result = target(*args[1:], **kwargs)
        elif op == "next":
            if len(args) != 2 or type(args[1]) is not int:
                raise ProtocolError("next needs an iterator and a count")
            return self.frame_next(args[0], max(1, min(args[1], ITERATOR_BATCH_MAX)))
        else:
            function = _OPERATORS.get(op)
            if function is None:
                raise ProtocolError(f"unknown request {op!r}")
            if op == "getattr" and len(args) == 2 and type(args[1]) is str:
                value = getattr(args[0], args[1])
                if isinstance(value, (types.MethodType, types.BuiltinMethodType)) and value.__self__ is args[0]:
                    return {"m": True}
                result = value
            else:
                result = function(*args, **kwargs)
        return {"r": self.encode(result)}

    def frame_next(self, iterator: Any, count: int) -> dict[str, Any]:
        """Up to `count` items of one of our iterators, and whether it ended; an error after some items waits."""
        items: list[object] = []
        ended = False
        try:
            for _ in range(count):
                items.append(next(iterator))
        except StopIteration:
            ended = True
        except Exception as exc:
            if not items:
                raise
            # The items before it come first; the error is raised at the next request.
            ref = self.export_ids.get(id(iterator))
            if ref is not None:
                self.exported[ref] = _raising(exc)
        return {"r": [[self.encode(item) for item in items], ended]}

    def describe_export(self, ref: int, obj: object) -> list[object]:
        if type(obj) is types.FunctionType:  # what the checks below make of it, without the ABC's isinstance
            return [ref, "function", obj.__name__[:TYPE_NAME_LIMIT]]
        if isinstance(obj, type):
            return [ref, "class", str(obj.__name__)[:TYPE_NAME_LIMIT],
                    [self.encode(base) for base in obj.__bases__ if base is not object]]
        if isinstance(obj, Iterator):
            return [ref, "iterator", _type_name(obj)[:TYPE_NAME_LIMIT]]
        if callable(obj) and isinstance(getattr(obj, "__name__", None), str) and not _programs(type(obj)):
            return [ref, "function", obj.__name__[:TYPE_NAME_LIMIT]]  # type: ignore[attr-defined]
        # An object of a class the program defined comes with its class, whose stand-in its proxy is.
        cls = type(obj)
        return [ref, "object", _type_name(obj)[:TYPE_NAME_LIMIT], self.encode(cls) if _programs(cls) else None]


def _programs(cls: type) -> bool:
    """Whether the program defined this class (in its module, or in a function of it)."""
    return type.__dict__["__module__"].__get__(cls) == "solution"


def _raising(exc: Exception) -> Iterator[Any]:
    raise exc
    yield  # a generator that raises at once


def _warning_name(category: type[Warning]) -> str:
    """The builtin warning category that `category` is, or derives from first (a program's own class of
    DeprecationWarning is one), by name; "UserWarning" for none."""
    for base in getattr(category, "__mro__", ()):
        if isinstance(base, type) and issubclass(base, Warning) and _builtin(base):
            return base.__name__
    return "UserWarning"


def _plain_args(exc: BaseException) -> object:
    """An exception's ``args`` by value (``KeyError("z").args`` is ``("z",)``, where its text is ``"'z'"``), for one
    whose text a builtin exception's ``__str__`` makes of them, so that the same args make the same text over
    there; None for any other, or args that are not plain values."""
    text_of = getattr(type(exc).__str__, "__objclass__", None)
    if not (isinstance(text_of, type) and issubclass(text_of, BaseException) and _builtin(text_of)):
        return None
    try:
        encoded = encode_value(list(exc.args))
    except Exception:
        return None
    # Not an int past what str() takes: the judge writes the exception's text, for its verdict and the tests.
    return None if '"$bigint"' in _ENCODER.encode(encoded) else encoded


def _args_of(error: Mapping[str, Any]) -> tuple[Any, ...] | None:
    """The args `_plain_args` sent; None for none, or none that decode as values."""
    if "args" not in error:
        return None
    try:
        args = decode_value(error["args"])
    except RejectedValue:
        return None
    return tuple(args) if type(args) is list else None


def _builtin_exception(name: str, message: str, args: tuple[Any, ...] | None = None) -> Exception | None:
    """The builtin exception `name` with `message`, made on this side; None for any other name.

    Not StopIteration: raised inside the other side's own map(), zip() or
    next() loop, it would end that loop as if the data had run out, and
    `assert all(map(check, cases))` would pass unchecked.
    """
    cls = getattr(builtins, name, None) if name.isidentifier() else None
    if isinstance(cls, type) and issubclass(cls, Exception) and not issubclass(cls, _ENDS_ITERATION):
        if args is not None:
            with contextlib.suppress(Exception):
                return cls(*args)
        with contextlib.suppress(Exception):
            return cls(message)
    return None


def _rebuilt(error: Mapping[str, Any]) -> Exception:
    """In the candidate: the exception a callback into the test raised, as a builtin exception of ours."""
    name, message = str(error.get("type", "Exception")), str(error.get("message", ""))
    return _builtin_exception(name, message) or RuntimeError(f"{name}: {message}")


# ---------------------------------------------------------------------------
# The judge's side
# ---------------------------------------------------------------------------


def _environ_data() -> Mapping[bytes, bytes]:
    """os.environ's table, keys and values in bytes, as CPython keeps it (a dict of str elsewhere)."""
    return getattr(os.environ, "_data", None) or {os.fsencode(k): os.fsencode(v) for k, v in os.environ.items()}


def _exposable(obj: object) -> bool:
    """Whether the candidate may read and set public attributes of a test's object: the test's own classes'
    instances, mocks, and the buffers and generators of random numbers tests hand over."""
    if isinstance(obj, (io.StringIO, io.BytesIO, random.Random, types.SimpleNamespace)):
        return True
    mock = sys.modules.get("unittest.mock")
    if mock is not None and isinstance(obj, mock.NonCallableMock):
        return True
    code = getattr(getattr(type(obj), "__init__", None), "__code__", None)
    module = type(obj).__dict__.get("__module__")
    return module == TEST_MODULE or (code is not None and code.co_filename in TEST_FILENAMES)


def _refused_attribute(target: object, name: str, op: str, value: object) -> str:
    """Why the program may not read or set `name` of a test's exposable object ("" where it may).

    What the test checks with must stay the test's: a program handed a mock
    that sets its `insert.assert_called_once_with` to a function of its own
    (a no-op), or `insert` itself to an object that answers every attribute,
    or `insert.called = True`, would pass `db.insert.assert_called_once_with(5)`
    without a call. So a mock's own API (what its class defines:
    `assert_*`, `called`, `return_value`, `configure_mock`, ...) is not the
    program's to read or set, and nothing the test reaches by attribute (a
    mock's children, a test object's methods) may become the program's
    object: a program sets data (`task.done = True`, `node.next = other`),
    not behaviour (`checker.verify = lambda: None`).
    """
    mock = sys.modules.get("unittest.mock")
    if mock is not None and isinstance(target, mock.NonCallableMock):
        if hasattr(type(target), name) or name in _MOCK_RECORDS:
            return f"use .{name} of the test's mock (its own API)"
        if op == "setattr" and isinstance(value, (Proxy, CandidateClass)):
            return f"set .{name} of the test's mock to an object of its own"
    if op != "setattr":
        return ""
    for where in (type(target), target):
        try:
            found = inspect.getattr_static(where, name)
        except AttributeError:
            continue
        if callable(found) or isinstance(found, (staticmethod, classmethod)):
            return f"replace .{name} of the test's {_type_name(target)}, which is callable"
    return ""


# What a mock records of its calls, held on the instance (not its class): `db.method_calls = [call.insert(1)]`
# would pass `assert db.method_calls == [call.insert(1)]` without a call.
_MOCK_RECORDS = frozenset({"method_calls", "mock_calls", "call_args_list", "call_args", "call_count", "called"})

TEST_MODULE = "__sandboxd_test__"
TEST_FILENAMES = frozenset({"<test>", "<setup>"})
# Public attributes of a test's callable that are its name, not its code or its frames.
_CALLABLE_NAMES = frozenset({"__name__", "__qualname__", "__doc__"})


class JudgeEndpoint(Endpoint):
    """The test process's end: requests to the candidate under deadlines; the candidate's callbacks answered."""

    def __init__(self, channel: socket.socket, max_frame_bytes: int, call_timeout: float | None,
                 deadline: float | None = None, cpu_credit: Callable[[], float] | None = None,
                 deadline_stretch: float = 1.0, send_limit: int = MAX_FRAME_BYTES, files: str = "") -> None:
        super().__init__(channel, send_limit, max_frame_bytes)
        # The job's folder, the tests' working directory, shared with the program (see share_files).
        self.files = files
        self.max_frame_bytes = max_frame_bytes
        # When all the tests' time runs out (_monotonic()), whatever call is then in flight.
        self.deadline = deadline
        # The seconds others (the sandbox's other runs, the host's other load)
        # have kept the candidate off a CPU it could have used, as its agent
        # counts them: each deadline moves on by what they took meanwhile, up
        # to deadline_stretch times its span (sandboxd.agent.host.runner.RunDeadline,
        # the same rule).
        self.cpu_credit = cpu_credit
        self.deadline_stretch = max(1.0, deadline_stretch)
        # Whether the deadline the judge gave up on had moved by the whole stretch, the candidate kept off the CPU
        # longer still: it did not have its time to run (its agent retries it rather than charge it); and that of
        # the call in flight, as last asked.
        self.past_stretch = False
        self._call_past_stretch = False
        self.started = _monotonic()
        SEEDED.clear()  # an earlier job's tests' seeds are not this job's
        # The values made with a candidate's object (value_with_object), by the id of its proxy.
        self.hybrids: dict[int, Any] = {}
        # The ids of the candidate's objects (proxies, which the endpoint keeps) made by arithmetic with a test's
        # value (_arithmetic).
        self.tainted: set[int] = set()
        # The program's warnings from the frames of the request in flight (warn).
        self.warnings_pending: list[tuple[str, str, int]] = []
        self.credit_at_start = self._credit()
        self.call_timeout = call_timeout
        # Set once the channel is unusable; every later call fails the same way.
        self.broken: CandidateDied | CandidateTimeout | None = None
        # Exceptions the proxies raised, to tell the candidate's errors from the tests'.
        self.raised: list[BaseException] = []
        # Requests sent: tests that never call the candidate check nothing.
        self.calls = 0
        # Why something a test did could not be done as Python would (see Unsupported).
        self.unsupported: list[str] = []
        # The test's containers handed to the program (see hold), by id; their JSON as last synced; the id of
        # each by the object's identity; and whether the program is yet to hear that the last test's are gone.
        self.held: dict[int, object] = {}
        self.held_json: dict[int, str | None] = {}
        self.held_ids: dict[int, int] = {}
        self.forgotten = False
        # Logger levels a test's caplog set, by name ("" the root), to be told to the program; None until one does.
        self.log_levels: dict[str, int] | None = None
        self.log_levels_told = True
        # The program's load error, once the handshake has said (None: it loaded).
        self.load_error: dict[str, str] | None = None
        # The program's own functions and classes its ready frame named (CandidateEndpoint.definitions), until the
        # tests bind their names: the state of the program as it loaded, before anything called it.
        self.definitions: dict[str, object] = {}

    # ---- deadlines ----

    def _credit(self) -> float:
        return self.cpu_credit() if self.cpu_credit is not None else 0.0

    def _moved(self, started: float, span: float, credit_then: float) -> tuple[float, bool]:
        """`span` after `started`, moved on by the credit since then (up to the stretch) once that has passed: the
        credit is read only then, off a call's usual path; and whether the credit grew past the stretch."""
        ends = started + span
        if _monotonic() < ends:
            return ends, False
        credit, most = max(0.0, self._credit() - credit_then), (self.deadline_stretch - 1.0) * span
        return ends + min(credit, most), credit > most

    def _time_for_all_moved(self) -> tuple[float, bool] | None:
        if self.deadline is None:
            return None
        return self._moved(self.started, self.deadline - self.started, self.credit_at_start)

    def _time_for_all_ends(self) -> float | None:
        moved = self._time_for_all_moved()
        return None if moved is None else moved[0]

    def _deadline(self) -> Callable[[], float] | None:
        """The deadline of a call starting now, as it stands whenever asked (None: none)."""
        if self.call_timeout is None and self.deadline is None:
            return None
        call_started, credit_then, call_timeout = _monotonic(), self._credit(), self.call_timeout

        def now() -> float:
            for_all = self._time_for_all_moved()
            if call_timeout is None:
                assert for_all is not None  # one of the two is set (above)
                ends, self._call_past_stretch = for_all
                return ends
            call_ends = self._moved(call_started, call_timeout, credit_then)
            ends, self._call_past_stretch = call_ends if for_all is None or call_ends[0] <= for_all[0] else for_all
            return ends

        return now

    def time_up(self) -> bool:
        if self.deadline is None:  # no time for all (most jobs): asked before every request
            return False
        ends = self._time_for_all_ends()
        return ends is not None and _monotonic() >= ends

    # ---- frames ----

    def _break(self, exc: CandidateDied | CandidateTimeout) -> NoReturn:
        self.broken = exc
        if isinstance(exc, TestsTimeUp):
            for_all = self._time_for_all_moved()
            self.past_stretch = for_all is not None and for_all[1]
        elif isinstance(exc, CandidateTimeout):
            self.past_stretch = self._call_past_stretch
        raise exc

    def receive(self, deadline: Deadline) -> dict[str, Any]:
        try:
            message = recv_frame(self.channel, self.max_frame_bytes, deadline, MAX_CONTAINERS)
        except TimeoutError:
            if self.time_up():
                self._break(TestsTimeUp(TIME_UP_MESSAGE))
            self._break(CandidateTimeout(f"the candidate did not answer within {self.call_timeout} s"))
        except EOFError:
            self._break(CandidateDied("the candidate process exited"))
        except ProtocolError as exc:
            self._break(CandidateDied(f"the candidate broke the protocol: {exc}"))
        except OSError as exc:
            self._break(CandidateDied(f"the channel failed: {exc}"))
        except MemoryError:
            self._break(TooLargeForJudge(REPLY_TOO_LARGE))
        if type(message) is not dict:
            self._break(CandidateDied("the candidate broke the protocol: a frame that is not an object"))
        for key, stream in (("out", sys.stdout), ("err", sys.stderr)):
            text = message.get(key)
            if type(text) is str and text:
                with contextlib.suppress(Exception):
                    stream.write(text)
        records = message.get("log")
        if type(records) is list and self.log_levels is not None:
            for record in records:
                self.log(record)
        made = message.get("warn")
        if type(made) is list:
            # At most WARNINGS_PER_FRAME for the whole request, however many frames (callbacks) it takes.
            room = WARNINGS_PER_FRAME - len(self.warnings_pending)
            self.warnings_pending.extend(
                (entry[0], entry[1][:MESSAGE_LIMIT], entry[2]) for entry in made[:max(0, room)]
                if type(entry) is list and len(entry) == 3 and type(entry[0]) is str and type(entry[1]) is str
                and type(entry[2]) is int)
        return message

    def warn(self) -> None:
        """Make here, in the tests' process and under their filters, the warnings the program made during the
        request just answered (a test's ``pytest.warns`` records them; an "error" filter raises one)."""
        pending, self.warnings_pending = self.warnings_pending, []
        for name, text, lineno in pending:
            category = getattr(builtins, name, None)
            if not (isinstance(category, type) and issubclass(category, Warning)):
                category = UserWarning
            # Named "<solution>", never the program's file name: showing a warning reads its line of the file
            # (linecache), and a name the program chose could be /dev/zero or a FIFO of its folder.
            warnings.warn_explicit(text, category, "<solution>", lineno)

    def log(self, record: object) -> None:
        """A log record of the program's, handled by the tests' logging as if it were made here (caplog sees it)."""
        if type(record) is not list or len(record) != 5 or not all(
                type(part) is kind for part, kind in zip(record, (str, int, str, str, int), strict=True)):
            return
        from .logcapture import handle_record  # imported by the test's caplog already (log_levels is set)

        handle_record(*record)

    def log_level(self, name: str, level: int) -> None:
        """A test set a logger's level (caplog.set_level): the program's logger takes it with the next request."""
        if self.log_levels is None:
            self.log_levels = {}
        self.log_levels[name] = level
        self.log_levels_told = False

    def handshake(self) -> dict[str, str] | None:
        """None when the program loaded, else its load error (type, message)."""
        self.begin()
        deadline = self._deadline()
        hello = self.receive(deadline)
        while "q" in hello:  # the program reads the test's stdin (or calls input()) as it loads
            self.answer_callback(hello)
            hello = self.receive(deadline)
        # Warnings made as the program loaded are not any test's, as under pytest, which imports it before them.
        self.warnings_pending.clear()
        if hello.get("ready") is True:
            self.definitions = self._definitions(hello.get("defs"))
            return None
        error = hello.get("load_error")
        if type(error) is dict and type(error.get("type")) is str and type(error.get("message")) is str:
            self.broken = CandidateDied("the program failed to load")
            return {"type": error["type"][:TYPE_NAME_LIMIT], "message": error["message"][:MESSAGE_LIMIT]}
        self._break(CandidateDied("the candidate broke the protocol: bad greeting"))

    def _definitions(self, defs: object) -> dict[str, object]:
        """The ready frame's definitions, decoded (by reference); none at all if any of them is not as sent."""
        if type(defs) is not list or len(defs) > READY_DEFINITIONS:
            return {}
        found: dict[str, object] = {}
        for entry in defs:
            if type(entry) is not list or len(entry) != 2 or type(entry[0]) is not str or type(entry[1]) is not dict \
                    or "$mine" not in entry[1]:
                return {}
            try:
                found[entry[0]] = self.decode(entry[1])
            except (ProtocolError, RejectedValue):
                return {}
        return found

    def begin(self) -> None:
        """The tests' environment as the job starts (in the job's folder): what tell_environment compares with."""
        # os.environ's own table of bytes, compared in C: decoding it into a dict of str for every request costs
        # 0.1 ms each, a millisecond of a HumanEval job's judging.
        self.environ = dict(_environ_data())
        self.told_environ = self.environ
        self.told_cwd = self.cwd = os.getcwd()
        self.told_argv = self.argv = list(sys.argv)

    def tell_environment(self, frame: dict[str, Any]) -> None:
        """Add to a request what the tests changed of their environment since the last (CandidateEndpoint.follow)."""
        if not hasattr(self, "environ"):
            return
        data = _environ_data()
        if data != self.told_environ:
            environ = dict(data)
            frame["env"] = [{os.fsdecode(k): os.fsdecode(v) for k, v in environ.items() if self.environ.get(k) != v},
                            [os.fsdecode(k) for k in self.environ if k not in environ]]
            self.told_environ = environ
        try:
            cwd = os.getcwd()
        except OSError:
            cwd = self.told_cwd
        if cwd != self.told_cwd:
            frame["cwd"] = self.told_cwd = cwd
        if sys.argv != self.told_argv:
            self.told_argv = list(sys.argv)
            frame["argv"] = [str(arg) for arg in self.told_argv]

    def patched(self) -> list[str]:
        real = _REAL_BUILTINS
        names = [] if (builtins.input is real["input"] and builtins.print is real["print"]
                       and builtins.open is real["open"]) else [
            name for name in PATCHABLE_BUILTINS if getattr(builtins, name) is not real[name]]
        for module, function, original, name in _WATCHED_FUNCTIONS:
            if getattr(module, function, None) is not original:
                names.append(name)
        return names

    def request(self, op: str, args: Sequence[object] = (), kwargs: Mapping[str, object] | None = None) -> Any:
        """Ask the candidate: the decoded answer, or the exception it raised (as the test's to catch)."""
        if self.broken is not None:
            raise type(self.broken)(f"not run: {self.broken}")
        if self.nesting >= MAX_NESTING:
            raise RecursionError("requests nested too deep between the tests and the program")
        try:
            frame = self.encode_call(op, args, kwargs or {})
        except RejectedValue as exc:
            self.unsupported.append(f"a value the harness cannot pass: {exc}")
            raise Unsupported(f"a value the harness cannot pass to the candidate: {exc}") from None
        patched = self.patched()
        if patched:  # a request without it means none (CandidateEndpoint.receive)
            frame["p"] = patched
        numpy = sys.modules.get("numpy")
        if numpy is not None and not getattr(numpy.random.seed, "_sandboxd_watched", False):
            _watch_numpy_seed(numpy)
        if SEEDED:
            frame["rs"] = _random_states()
        self.tell_environment(frame)
        if self.log_levels is not None and not self.log_levels_told:
            frame["log"], self.log_levels_told = dict(self.log_levels), True
        self.hold(frame, args, kwargs or {})
        if self.time_up():
            self._break(TestsTimeUp(TIME_UP_MESSAGE))
        self.calls += 1
        ends = self._deadline()
        if self.files:
            share_files(self.files)
        try:
            self.channel.settimeout(None if ends is None else max(1e-3, ends() - _monotonic()))
            send_frame(self.channel, frame, self.send_limit)
        except TimeoutError:
            self._break(TestsTimeUp(TIME_UP_MESSAGE) if self.time_up()
                        else CandidateTimeout("the candidate stopped reading its requests"))
        except FrameTooLarge:
            self.unsupported.append("arguments larger than the harness passes")
            raise Unsupported("arguments too large to pass to the candidate") from None
        except OSError as exc:
            self._break(CandidateDied(f"the candidate process exited ({exc.strerror or exc})"))
        self.nesting += 1
        try:
            while True:
                reply = self.receive(ends)
                if "q" not in reply:
                    break
                self.answer_callback(reply)
        finally:
            self.nesting -= 1
        try:
            value, error = self.read(reply, op, frame)
        except MemoryError:
            # Handled below, not here: the handler would keep the MemoryError as its context, and in that the
            # frames that hold the half-decoded reply, for as long as self.broken lives.
            value, error = None, None
        else:
            if self.warnings_pending:
                self.warn()
            if error is not None:
                raise error
            return value
        del reply  # and this frame, which it keeps in its own traceback
        self._break(TooLargeForJudge(REPLY_TOO_LARGE))

    def read(self, reply: dict[str, Any], op: str, sent: object = None) -> tuple[Any, BaseException | None]:
        """(the answer in a reply, or the candidate's exception to raise), after writing its changed containers back
        (and before forgetting those the program no longer holds: the answer may be one of them)."""
        try:
            changed = reply.get("w")
            if changed is not None:
                self.write_back(changed)
            answer: tuple[Any, BaseException | None] | None = None
            if "r" in reply:
                answer = self.decode(reply["r"]), None
            elif reply.get("m") is True and op == "getattr":  # "a method", to a read of an attribute only
                answer = _METHOD, None
            else:
                error = reply.get("e")
                if type(error) is dict and type(error.get("type")) is str and type(error.get("message")) is str:
                    answer = None, self.candidate_exception(error)
            for hid in reply.get("d") or ():
                if type(hid) is int and hid in self.held:
                    self.held_ids.pop(id(self.held.pop(hid)), None)
                    del self.held_json[hid]
            for hid, text in self.held_json.items():
                if text is None:
                    self.held_json[hid] = _json(self.held[hid], self)
            if answer is not None:
                return answer
        except RejectedValue as exc:
            self._break(CandidateDied(f"the candidate sent a value that is not valid: {exc}"))
        self._break(CandidateDied("the candidate broke the protocol: bad reply"))

    def write_back(self, changed: object) -> None:
        """Make the test's held containers hold what the program changed them to (see CandidateEndpoint.hold)."""
        if type(changed) is not list:
            raise RejectedValue("write-back must be a list")
        for entry in changed:
            if type(entry) is not list or len(entry) != 2 or type(entry[0]) is not int or entry[0] not in self.held:
                raise RejectedValue("write-back names no container the test handed over")
            original = self.held[entry[0]]
            try:
                write_back(original, self.decode(entry[1]))
            except Unsupported as exc:
                # The program's process holds the same object as the test's (CandidateEndpoint.hold), so it cannot
                # send it back as another type, shape or dtype but in a frame of its own making: a wrong program's
                # way to make its failure the harness's (unsupported), a dict for the test's list.
                raise RejectedValue(str(exc)) from None
            self.held_json[entry[0]] = None  # taken again once the reply is read, if the program still holds it

    def hold(self, frame: dict[str, Any], args: Sequence[object], kwargs: Mapping[str, object]) -> None:
        """Name in a request the test's containers it hands over (``h``), and send on what the test changed of
        those the program still holds (``fw``), so that the program's objects and the test's stay one."""
        held: list[list[Any]] = []
        for position, value in itertools.chain(enumerate(args), kwargs.items()) if kwargs else enumerate(args):
            if _mutable(value):
                hid = self.held_ids.get(id(value))
                if hid is None or self.held.get(hid) is not value:
                    hid = next(self.next_id)
                    self.held[hid], self.held_ids[id(value)] = value, hid
                held.append([position, hid])
                # Taken once the reply is read, and only if the program holds it then: most it does not keep
                # (3 million ints passed to a function would cost the JSON of them twice more per call otherwise).
                self.held_json[hid] = None
        if held:
            frame["h"] = held
        named = {hid for _, hid in held}
        if len(self.held) > len(named):  # some the program kept from earlier requests: what the test changed of them
            forward = []
            for hid, value in self.held.items():
                if hid not in named and self.held_json[hid] is not None:
                    fresh = _json(value, self)
                    if fresh != self.held_json[hid]:
                        forward.append([hid, self.encode(value)])
                        self.held_json[hid] = fresh
            if forward:
                frame["fw"] = forward
        if self.forgotten:
            frame["f"], self.forgotten = True, False

    def held_object(self, hid: object) -> object:
        if type(hid) is not int or hid not in self.held:
            raise RejectedValue("$held names no container the test handed over")
        return self.held[hid]

    def candidate_exception(self, error: Mapping[str, Any]) -> BaseException:
        """The exception to raise in test code for an error the candidate answered."""
        type_name, message = error["type"][:TYPE_NAME_LIMIT], error["message"][:MESSAGE_LIMIT]
        # An error that says the program's process could not take a value (numpy missing there: wire._numpy) is
        # the program's failure all the same: a judge that sent numpy has it, and so has the program's process, in
        # the same image. Only a program that hid numpy from itself (sys.modules["numpy"] = None), or forged the
        # frame, says so, to make its failure the harness's (red team).
        exc: BaseException
        cls = None
        if "cls" in error:
            with contextlib.suppress(RejectedValue):
                cls = self.decode(error["cls"])
        # An Exception (see stand_in): the program's error must stay one that the harness's `except Exception` takes.
        if isinstance(cls, type) and issubclass(cls, Exception) and not _builtin(cls) \
                and not issubclass(cls, _ENDS_ITERATION):
            exc = BaseException.__new__(cls)
            args = _args_of(error)
            BaseException.__init__(exc, *(args if args is not None else (message,)))
            with contextlib.suppress(RejectedValue):
                exc.__dict__["_sandboxd_object"] = self.decode(error.get("obj"))
            self.raised.append(exc)
            return exc
        exc = _builtin_exception(type_name, message, _args_of(error)) or CandidateError(f"{type_name}: {message}")
        self.raised.append(exc)
        return exc

    # ---- references ----

    def forget_exports(self) -> None:
        """A test ended: what it handed the candidate is no longer the candidate's to use, nor kept in step."""
        self.exported.clear()
        self.export_ids.clear()
        if self.held:
            self.held.clear()
            self.held_json.clear()
            self.held_ids.clear()
            self.forgotten = True

    def proxy(self, body: object) -> object:
        if type(body) is not list or len(body) < 3 or type(body[0]) is not int or type(body[1]) is not str \
                or type(body[2]) is not str:
            raise RejectedValue("$mine must hold [id, kind, type, ...]")
        ref, kind, type_name = body[0], body[1], body[2][:TYPE_NAME_LIMIT]
        found = self.proxies.get(ref)
        if found is not None:
            return found
        if kind == "class":
            made: object = self.stand_in(ref, type_name, body[3:])
        elif kind == "iterator":
            made = (RemoteGenerator if type_name == "generator" else RemoteIterator)(self, ref, type_name)
        elif kind == "function":
            made = RemoteFunction(self, ref, type_name)
        elif kind == "object":
            cls = self.decode(body[3]) if len(body) > 3 and body[3] is not None else None
            if isinstance(cls, CandidateClass) and issubclass(cls, Proxy):
                made = cls.__new__(cls)
                Proxy.__init__(made, self, ref, type_name)
            else:
                made = RemoteObject(self, ref, type_name)
        else:
            raise RejectedValue(f"unknown kind {kind!r}")
        return self.remember(ref, made)

    def stand_in(self, ref: int, name: str, rest: list[object]) -> type:
        """A class of the judge's own for a class of the candidate's; exceptions get their builtin bases."""
        if len(rest) != 1 or type(rest[0]) is not list:
            raise RejectedValue("a class is [id, 'class', name, [bases]]")
        decoded = [self.decode(raw) for raw in rest[0]]
        # Exception's subclasses only: the bases are the program's to say (a metaclass's __bases__ property, or a
        # forged frame), and a stand-in of KeyboardInterrupt, SystemExit or GeneratorExit raised in the tests would
        # get past every `except Exception` of the harness's: run_tests would raise, and the job be INTERNAL.
        exception_bases = tuple(base for base in decoded if isinstance(base, type) and issubclass(base, BaseException))
        if exception_bases and not any(issubclass(base, Exception) for base in exception_bases):
            exception_bases = (Exception,)
        exception_bases = tuple(base for base in exception_bases if issubclass(base, Exception))
        if not name.isidentifier():
            name = "CandidateClass"
        namespace: dict[str, Any] = {"__module__": "solution", "__qualname__": name}
        bases: tuple[type, ...]
        fallback: tuple[type, ...]
        if exception_bases:
            namespace["__getattr__"] = _exception_getattr
            namespace["__str__"] = BaseException.__str__
            bases, fallback = exception_bases, (Exception,)
        else:
            bases = tuple(base for base in decoded if isinstance(base, CandidateClass) and issubclass(base, Proxy))
            bases, fallback = bases or (RemoteObject,), (RemoteObject,)
        try:
            cls = CandidateClass(name, bases, namespace)
        except TypeError:  # bases whose layouts or order conflict
            cls = CandidateClass(name, fallback, namespace)
        type.__setattr__(cls, "_sandboxd_class_endpoint", self)
        return cls

    def export(self, obj: object) -> object:
        if isinstance(obj, (types.FrameType, types.CodeType, types.TracebackType, types.ModuleType)):
            raise RejectedValue(f"a {_type_name(obj)} is not handed to the candidate")
        return super().export(obj)

    def encode(self, obj: object, depth: int = 0) -> object:
        # A test's SimpleNamespace by reference, as before they crossed as values: the program sets its attributes
        # (`bump(state)`), which a copy would lose. The candidate's come back as values.
        if type(obj) is types.SimpleNamespace:
            peer = self.peer_id(obj)
            return {"$yours": peer} if peer is not None else self.export(obj)
        return super().encode(obj, depth)

    def value_with_object(self, value: object, remote: object) -> object:
        # The candidate's value of a class of its own derived from an immutable type: the value, compared and used
        # as its base type's (the judge's own methods), plus what that type lacks read from the candidate's object
        # (an IntEnum member's .name, a NamedTuple's property). Back to the candidate, the object itself.
        if not isinstance(remote, Proxy) or remote._sandboxd_endpoint is not self:
            raise RejectedValue("$sub holds no object of the candidate's")
        made = self.hybrids.get(id(remote))
        if made is not None and made.__dict__["_sandboxd_remote"] is remote:
            return made  # the same object, twice: `result is Level.HIGH`, as in one process
        hybrid = _hybrid_class(type(value), type(remote).__name__)
        made = tuple.__new__(hybrid, value) if isinstance(value, tuple) else hybrid(value)
        made.__dict__["_sandboxd_remote"] = remote
        self.hybrids[id(remote)] = made
        return made

    def namedtuple_class(self, name: str, fields: tuple[str, ...]) -> type:
        # The tests' own namedtuple of that name and fields (a Point of the test's setup that the program returns):
        # `isinstance(result, Point)` holds, as in one process. Its methods are the tests' own.
        tests = sys.modules.get(TEST_MODULE)
        found = tests.__dict__.get(name) if tests is not None else None
        if isinstance(found, type) and issubclass(found, tuple) and getattr(found, "_fields", None) == fields:
            return found
        return super().namedtuple_class(name, fields)

    # ---- the candidate's callbacks ----

    def answer_callback(self, request: dict[str, Any]) -> None:
        try:
            reply = {"r": self.encode(self._callback(request))}
        except (CandidateDied, CandidateTimeout):
            raise
        except RejectedValue as exc:
            reply = {"e": {"type": "TypeError", "message": f"cannot be answered: {exc}"[:MESSAGE_LIMIT]}}
        except Exception as exc:
            reply = {"e": describe(exc)}
        if self.files:
            share_files(self.files)
        try:
            send_frame(self.channel, reply, self.send_limit)
        except FrameTooLarge:
            send_frame(self.channel, {"e": {"type": "ValueError", "message": "the answer is too large"}})
        except OSError as exc:
            self._break(CandidateDied(f"the candidate process exited ({exc.strerror or exc})"))

    def _callback(self, request: dict[str, Any]) -> object:
        try:
            op, args, kwargs = self.decode_call(request)
        except (ProtocolError, RejectedValue) as exc:
            raise ReferenceError(str(exc)) from None
        if op == "input":
            return builtins.input(*args[:1])
        if op == "print":
            builtins.print(*args, **{key: value for key, value in kwargs.items() if key in ("sep", "end")})
            return None
        if op == "open":
            if builtins.open is _REAL_BUILTINS["open"]:
                raise PermissionError("the tests' open() is not the program's")
            return builtins.open(*args, **kwargs)
        if op == "patched":
            # Only a function the tests have patched now: the program may not call the tests' real ones.
            name = args[0] if args else None
            if type(name) is not str or name not in _REAL_FUNCTIONS:
                raise ValueError("not a function the tests may patch")
            function = getattr(*_function_of(name), None)
            if function is _REAL_FUNCTIONS[name] or function is None:
                raise PermissionError(f"the tests' {name} is not the program's")
            return function(*args[1:], **kwargs)
        if op == "stdin":
            if len(args) != 2 or args[0] not in ("read", "readline", "readlines") or type(args[1]) is not int:
                raise ValueError("a bad read of stdin")
            return getattr(sys.stdin, args[0])(args[1])
        target = args[0] if args else None
        ref = self.export_ids.get(id(target))
        if ref is None or self.exported.get(ref) is not target:
            raise ReferenceError("not an object the tests handed over")
        if op == "call":
            if not callable(target):
                raise TypeError(f"'{_type_name(target)}' object is not callable")
            return target(*args[1:], **kwargs)
        if op == "next":
            if len(args) != 2 or type(args[1]) is not int:
                raise ValueError("next needs a count")
            items: list[object] = []
            for item in itertools.islice(target, max(1, min(args[1], ITERATOR_BATCH_MAX))):  # type: ignore[call-overload]
                items.append(item)
            return [items, len(items) < max(1, min(args[1], ITERATOR_BATCH_MAX))]
        if op == "iter":
            return iter(target)  # type: ignore[call-overload]
        if op in ("getattr", "setattr") and len(args) >= 2 and type(args[1]) is str:
            name = args[1]
            if op == "getattr" and name in _CALLABLE_NAMES and callable(target):
                return getattr(target, name)
            if name.startswith("_"):
                raise AttributeError(f"the candidate may not use {name!r} of the tests' objects")
            if not _exposable(target):
                # Of a callable or an iterator the program may call or iterate only (gi_frame, gi_code, func: a
                # way into the tests' frames, the program's doing); another object's is what the harness cannot
                # hand over (a queue.Queue a test passed), which a test that then fails is told as.
                if not (callable(target) or isinstance(target, Iterator)) and _has_static(target, name):
                    self.unsupported.append(f"the program used .{name} of the test's {_type_name(target)}")
                raise AttributeError(f"the harness does not hand over .{name} of a {_type_name(target)}")
            value = args[2] if len(args) > 2 else None
            refused = _refused_attribute(target, name, op, value)
            if refused:
                raise AttributeError(f"the program may not {refused}")
            if op == "getattr":
                return getattr(target, name)
            setattr(target, name, value)
            return None
        if op == "bool":
            return bool(target)  # the test's own __bool__ or __len__, or True: any object's, as Python answers it
        if op in ("repr", "str") and (callable(target) or isinstance(target, Iterator)):
            # A function's or a generator's own text (its name, no more): refused, it was the harness's limit
            # (_python_answers), which a wrong program asked for and swallowed to make its failure unsupported.
            return object.__repr__(target) if not isinstance(target, types.FunctionType) else repr(target)
        if op in ("len", "getitem", "contains", "enter", "exit", "str") and _exposable(target):
            return _OPERATORS[op](*args, **kwargs)
        if _python_answers(op, target):
            self.unsupported.append(f"the program used {op}() on the test's {_type_name(target)}")
        raise TypeError(f"the harness does not hand over {op}() of a {_type_name(target)}")


_METHOD = object()


# The harness's limits are the tests' (STATUS_UNSUPPORTED_TEST, which a trainer masks), but what the program asks
# is the program's to choose: a wrong program that calls len() of the lambda its test passed and swallows the
# TypeError would make its failed assert unsupported, not a wrong answer. A refusal counts as the harness's limit only
# where Python would have answered: the object's type has the method (or the attribute) that the use needs.
def _python_answers(op: str, target: object) -> bool:
    """Whether `op` of one of the test's objects is something Python does for it (not object's own defaults)."""
    if op not in _OPERATORS or op in ("call", "callmethod", "isinstance", "issubclass"):
        return False
    dunder = "__" + op.rstrip("_") + "__"
    if op in ("bool",):
        return _defines(target, "__bool__") or _defines(target, "__len__")
    if op == "contains":
        return any(_defines(target, name) for name in ("__contains__", "__iter__", "__getitem__"))
    return _defines(target, dunder)


def _defines(target: object, name: str) -> bool:
    found = inspect.getattr_static(type(target), name, None)
    return found is not None and found is not inspect.getattr_static(object, name, None)


def _has_static(target: object, name: str) -> bool:
    try:
        inspect.getattr_static(target, name)
    except AttributeError:
        return False
    return True


def _exception_getattr(self: BaseException, name: str) -> Any:
    """A candidate's exception in the tests: attributes it does not hold here are read from the candidate's."""
    original = self.__dict__.get("_sandboxd_object")
    if original is None or name.startswith("__"):
        raise AttributeError(name)
    return getattr(original, name)


class CandidateClass(type):
    """Stand-in classes of the candidate's classes.

    The candidate's objects of a class are proxies of its stand-in (a
    subclass of RemoteObject), so ``type(pet) is Dog`` and ``isinstance(pet,
    Animal)`` hold as in one process; calls construct in the candidate;
    class attributes, static methods, iteration of an ``Enum`` are the
    candidate's. Its exception classes are real exception classes with the
    candidate's builtin bases, raised in the tests when the candidate raises.
    """

    _sandboxd_class_endpoint: JudgeEndpoint

    def __call__(cls, *args: object, **kwargs: object) -> Any:
        endpoint = cls._sandboxd_class_endpoint
        if issubclass(cls, BaseException):
            return super().__call__(*args, **kwargs)
        return endpoint.request("call", [cls, *args], kwargs)

    def __instancecheck__(cls, obj: object) -> bool:
        if type.__instancecheck__(cls, obj):
            return True
        endpoint = cls._sandboxd_class_endpoint
        # An object the candidate sent without its class (one of a class its module did not define): it asks.
        if type(obj) in _UNTYPED_PROXIES and obj._sandboxd_endpoint is endpoint:  # type: ignore[attr-defined]
            return bool(endpoint.request("isinstance", [obj, cls]))
        # A value that came with the candidate's object (value_with_object): the object's class says.
        remote = getattr(obj, "__dict__", {}).get("_sandboxd_remote") if getattr(type(obj), "_sandboxd_hybrid",
                                                                                   False) else None
        if isinstance(remote, Proxy) and remote._sandboxd_endpoint is endpoint:
            return isinstance(remote, cls)
        # A namedtuple, which crossed as a value (its class is the judge's own): one of this class of the program's
        # if the names and fields are the class's.
        fields = getattr(type(obj), "_fields", None)
        if isinstance(obj, tuple) and type(fields) is tuple and type(obj).__name__ == cls.__name__:
            try:
                return endpoint.request("getattr", [cls, "_fields"]) == fields
            except Exception:  # no _fields there: not a namedtuple class
                return False
        return False

    def __subclasscheck__(cls, sub: type) -> bool:
        return type.__subclasscheck__(cls, sub)

    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__") or name.startswith("_sandboxd"):
            raise AttributeError(name)
        endpoint = cls._sandboxd_class_endpoint
        value = endpoint.request("getattr", [cls, name])
        return RemoteFunction(endpoint, 0, name, (cls, name)) if value is _METHOD else value

    def __setattr__(cls, name: str, value: object) -> None:
        if name.startswith("__"):
            type.__setattr__(cls, name, value)
            return
        cls._sandboxd_class_endpoint.request("setattr", [cls, name, value])

    def __delattr__(cls, name: str) -> None:
        cls._sandboxd_class_endpoint.request("delattr", [cls, name])

    # An Enum's class is a container of its members.
    def __iter__(cls) -> Iterator[Any]:
        return _checked(cls._sandboxd_class_endpoint.request("iter", [cls]), RemoteIterator, "iter")

    def __len__(cls) -> int:
        return _checked(cls._sandboxd_class_endpoint.request("len", [cls]), int, "len")

    def __getitem__(cls, key: object) -> Any:
        return cls._sandboxd_class_endpoint.request("getitem", [cls, key])

    def __contains__(cls, item: object) -> bool:
        return bool(cls._sandboxd_class_endpoint.request("contains", [cls, item]))

    def __repr__(cls) -> str:
        return f"<candidate class {cls.__qualname__}>"


# Attributes that numpy (and the libraries built on it) read from an object to use memory it points to: an
# `__array_interface__` is an address and a layout, which numpy reads as the array's data. A candidate's object
# answering one with a made-up address crashes the judge (SIGSEGV: INTERNAL) in `np.testing.assert_array_equal(
# f(4), expected)`, or reads the judge's memory. Without them numpy asks `__array__`,
# whose answer is a value (an array rebuilt from the judge's own classes).
_RAW_MEMORY_PROTOCOLS = frozenset({"__array_interface__", "__array_struct__", "__cuda_array_interface__",
                                   "__dlpack__", "__dlpack_device__"})


class Proxy:
    """A candidate's object in the judge (see the module docstring for what it answers itself)."""

    __slots__ = ("__weakref__", "_sandboxd_endpoint", "_sandboxd_methods", "_sandboxd_ref", "_sandboxd_type")

    def __init__(self, endpoint: JudgeEndpoint, ref: int, type_name: str) -> None:
        object.__setattr__(self, "_sandboxd_endpoint", endpoint)
        object.__setattr__(self, "_sandboxd_ref", ref)
        object.__setattr__(self, "_sandboxd_type", type_name)
        object.__setattr__(self, "_sandboxd_methods", {})

    def _ask(self, op: str, *args: object, **kwargs: object) -> Any:
        return self._sandboxd_endpoint.request(op, [self, *args], kwargs)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_sandboxd") or name in _RAW_MEMORY_PROTOCOLS:
            raise AttributeError(name)
        methods = self._sandboxd_methods
        if name in methods:
            return methods[name]
        value = self._ask("getattr", name)
        if value is _METHOD:
            # Kept, so that only the first use of a method asks what it is: a test's loop of 20,000 calls took
            # twice as long, a round trip more each. A method that the object later replaced with data is then
            # called, and fails as a call of data does.
            value = methods[name] = RemoteFunction(self._sandboxd_endpoint, 0, name, (self, name))
        return value

    def __setattr__(self, name: str, value: object) -> None:
        self._sandboxd_methods.pop(name, None)
        self._ask("setattr", name, value)

    def __delattr__(self, name: str) -> None:
        self._sandboxd_methods.pop(name, None)
        self._ask("delattr", name)

    def __call__(self, *args: object, **kwargs: object) -> Any:
        return self._ask("call", *args, **kwargs)

    def __repr__(self) -> str:
        endpoint = self._sandboxd_endpoint
        if endpoint.broken is None:
            with contextlib.suppress(Exception):
                return _checked(self._ask("repr"), str, "repr")
        return f"<candidate {self._sandboxd_type} object>"

    def __str__(self) -> str:
        return _checked(self._ask("str"), str, "str")

    def __format__(self, spec: str) -> str:
        return _checked(self._ask("format", spec), str, "format")

    def __bool__(self) -> bool:
        return _checked(self._ask("bool"), bool, "bool")

    def __len__(self) -> int:
        length = _checked(self._ask("len"), int, "len")
        if length < 0:
            raise ValueError("__len__() should return >= 0")
        return length

    def __hash__(self) -> int:
        return _checked(self._ask("hash"), int, "hash")

    def __iter__(self) -> Iterator[Any]:
        return _checked(self._ask("iter"), RemoteIterator, "iter")

    def __reversed__(self) -> Iterator[Any]:
        return _checked(self._ask("reversed"), RemoteIterator, "reversed")

    def __contains__(self, item: object) -> bool:
        return bool(_checked(self._ask("contains", item), bool, "contains"))

    def __getitem__(self, key: object) -> Any:
        return self._ask("getitem", key)

    def __setitem__(self, key: object, value: object) -> None:
        self._ask("setitem", key, value)

    def __delitem__(self, key: object) -> None:
        self._ask("delitem", key)

    def __dir__(self) -> list[str]:
        names = self._ask("dir")
        return [name for name in names if type(name) is str] if isinstance(names, list) else []

    def __copy__(self) -> Any:
        return self._ask("copy")

    def __deepcopy__(self, memo: object) -> Any:
        return self._ask("deepcopy")

    def __reduce_ex__(self, protocol: object) -> NoReturn:
        raise TypeError(f"the candidate's {self._sandboxd_type} object cannot be pickled in the tests")

    def __enter__(self) -> Any:
        return self._ask("enter")

    def __exit__(self, exc_type: object, exc: object, traceback: object) -> bool:
        # What the test raised stays the judge's: the candidate learns its type only, and may not swallow a failed
        # assertion (a context manager answering True to everything would pass the asserts inside it).
        builtin = exc_type is None or (isinstance(exc_type, type) and _builtin(exc_type))
        told = (exc_type, exc) if builtin else (Exception, None)
        suppressed = bool(self._ask("exit", *told, None))
        if exc_type is not None and isinstance(exc_type, type) and (
                issubclass(exc_type, AssertionError) or not issubclass(exc_type, Exception)):
            # Nor pytest's own failures ("DID NOT RAISE", pytest.fail), which are BaseExceptions, nor the harness's.
            return False
        return suppressed

    def __int__(self) -> int:
        return _untainted(self, "int", _checked(self._ask("int"), int, "int"))

    def __index__(self) -> int:
        return _untainted(self, "index", _checked(self._ask("index"), int, "index"))

    def __float__(self) -> float:
        return _untainted(self, "float", _checked(self._ask("float"), float, "float"))

    def __complex__(self) -> complex:
        return _untainted(self, "complex", _checked(self._ask("complex"), complex, "complex"))

    def __round__(self, digits: int | None = None) -> Any:
        return _untainted(self, "round", self._ask("round") if digits is None else self._ask("round", digits))

    def _compare(self, op: str, other: object) -> Any:
        # Only between the candidate's own objects: against the test's values, Python's default for objects that
        # do not compare, whatever the candidate's __eq__ would say.
        if isinstance(other, Proxy) and other._sandboxd_endpoint is self._sandboxd_endpoint:
            return self._ask(op, other)
        return NotImplemented

    def __eq__(self, other: object) -> Any:
        return self._compare("eq", other)

    def __ne__(self, other: object) -> Any:
        return self._compare("ne", other)

    def __lt__(self, other: object) -> Any:
        return self._compare("lt", other)

    def __le__(self, other: object) -> Any:
        return self._compare("le", other)

    def __gt__(self, other: object) -> Any:
        return self._compare("gt", other)

    def __ge__(self, other: object) -> Any:
        return self._compare("ge", other)


_HYBRIDS: dict[tuple[type, str], type] = {}
HYBRID_CLASSES_CACHED = 1024


def _hybrid_attribute(self: object, name: str) -> Any:
    remote = self.__dict__.get("_sandboxd_remote")
    if remote is None or name.startswith("__") or name.startswith("_sandboxd"):
        # One the tests made from it (`_replace`, `type(x)(v)`) has the value only.
        raise AttributeError(name)
    return getattr(remote, name)


def _hybrid_class(base: type, name: str) -> type:
    """A subclass of `base` (the judge's own value type, or its namedtuple class) named as the candidate's class,
    whose instances read from the candidate's object only the attributes `base` lacks (__getattr__)."""
    key = (base, name)
    found = _HYBRIDS.get(key)
    if found is None:
        if len(_HYBRIDS) >= HYBRID_CLASSES_CACHED:
            _HYBRIDS.clear()
        found = _HYBRIDS[key] = type(name if name.isidentifier() else "CandidateValue", (base,), {
            "__getattr__": _hybrid_attribute, "_sandboxd_hybrid": True, "__module__": "solution"})
    return found


def _builtin(cls: type) -> bool:
    return getattr(builtins, cls.__name__, None) is cls


def _binary(name: str) -> tuple[Callable[..., Any], Callable[..., Any], Callable[..., Any]]:
    def forward(self: Proxy, other: object) -> Any:
        return _arithmetic(self, other, self._sandboxd_endpoint.request(name, [self, other]))

    def reflected(self: Proxy, other: object) -> Any:
        return _arithmetic(self, other, self._sandboxd_endpoint.request(name, [other, self]))

    def in_place(self: Proxy, other: object) -> Any:
        return _arithmetic(self, other, self._sandboxd_endpoint.request("i" + name, [self, other]))

    return forward, reflected, in_place


def _arithmetic(proxy: Proxy, other: object, result: object) -> object:
    """`result` of arithmetic between the candidate's object and `other`, unless the candidate answered with plain
    data an operation with one of the test's own values: its answer is then what the test's check compares, whatever
    the test's value was. `abs(candidate(x) - expected) < 1e-6` (HumanEval's, unittest's assertAlmostEqual) passed
    for an object whose __sub__ returns 0.0 (red team). The harness takes it as an object that does not do
    arithmetic with plain values (TypeError, the program's failure), as it takes comparisons with them
    (Proxy._compare); a correct program returns the number itself. Between the candidate's own objects
    (`Vec(1, 2) + Vec(3, 4)`), or where it answers with an object of its own (`Money(5) * 2`), Python's answer
    stands."""
    endpoint = proxy._sandboxd_endpoint
    if isinstance(other, Proxy) and other._sandboxd_endpoint is endpoint:
        return result
    if isinstance(result, Proxy) or (isinstance(result, (tuple, list)) and result  # divmod's pair of its own
                                     and all(isinstance(item, Proxy) for item in result)):
        # Made with the test's value: what the tests then make of it (abs(), round(), float()) is not the
        # candidate's to answer with plain data either (`abs(candidate(x) - y)` where `-` gives an object whose
        # __abs__ returns 0.0).
        for item in (result if isinstance(result, (tuple, list)) else (result,)):
            endpoint.tainted.add(id(item))
        return result
    raise TypeError(f"the program's {type(proxy).__name__} answered arithmetic with the test's own "
                    f"{_type_name(other)} with plain data ({_type_name(result)}), which the harness does not take")


def _unary(name: str) -> Callable[[Proxy], Any]:
    def ask(self: Proxy) -> Any:
        return _untainted(self, name, self._sandboxd_endpoint.request(name, [self]))

    return ask


def _untainted(proxy: Proxy, op: str, result: Any) -> Any:
    """`result` of `op` on the candidate's object, unless that object was made by arithmetic with a test's value
    (_arithmetic) and the candidate answers with plain data: the program's TypeError, as for the arithmetic."""
    if isinstance(result, Proxy) or id(proxy) not in proxy._sandboxd_endpoint.tainted:
        return result
    raise TypeError(f"the program's {type(proxy).__name__}, made by arithmetic with the test's own value, answered "
                    f"{op}() with plain data, which the harness does not take")


for _name in ("trunc", "floor", "ceil", "neg", "pos", "abs", "invert"):
    setattr(Proxy, f"__{_name}__", _unary(_name))
for _name in _BINARY:
    _forward, _reflected, _in_place = _binary(_name)
    setattr(Proxy, f"__{_name}__", _forward)
    setattr(Proxy, f"__r{_name}__", _reflected)
    setattr(Proxy, f"__i{_name}__", _in_place)


class RemoteObject(Proxy):
    """An instance of the candidate's (one of its classes', or any object that is not a value)."""

    __slots__ = ()


class RemoteFunction(Proxy):
    """A function of the candidate's, or a method of one of its objects (called in one round trip)."""

    __slots__ = ("_sandboxd_method",)

    def __init__(self, endpoint: JudgeEndpoint, ref: int, name: str, method: tuple[object, str] | None = None) -> None:
        super().__init__(endpoint, ref, name)
        object.__setattr__(self, "_sandboxd_method", method)

    @property
    def __name__(self) -> str:
        return self._sandboxd_type

    def __call__(self, *args: object, **kwargs: object) -> Any:
        method = self._sandboxd_method
        if method is not None:
            owner, name = method
            return self._sandboxd_endpoint.request("callmethod", [owner, name, *args], kwargs)
        return self._sandboxd_endpoint.request("call", [self, *args], kwargs)

    def __repr__(self) -> str:
        return f"<candidate function {self._sandboxd_type}>"


class RemoteIterator(Proxy):
    """An iterator of the candidate's (a generator, a map): its items come in batches, as the test reads them."""

    __slots__ = ("_sandboxd_batch", "_sandboxd_buffer", "_sandboxd_ended")

    def __init__(self, endpoint: JudgeEndpoint, ref: int, type_name: str) -> None:
        super().__init__(endpoint, ref, type_name)
        object.__setattr__(self, "_sandboxd_buffer", deque())
        object.__setattr__(self, "_sandboxd_batch", 1)
        object.__setattr__(self, "_sandboxd_ended", False)

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        buffer: deque[Any] = self._sandboxd_buffer
        if not buffer:
            if self._sandboxd_ended:
                raise StopIteration
            batch = self._sandboxd_batch
            object.__setattr__(self, "_sandboxd_batch", min(batch * 2, ITERATOR_BATCH_MAX))
            items, ended = self._sandboxd_endpoint.request("next", [self, batch])
            buffer.extend(items)
            object.__setattr__(self, "_sandboxd_ended", ended)
            if not buffer:
                raise StopIteration
        return buffer.popleft()


class RemoteGenerator(RemoteIterator):
    """A generator of the candidate's: `isinstance(g, types.GeneratorType)` holds, as in one process."""

    __slots__ = ()

    @property  # type: ignore[misc]
    def __class__(self) -> type:
        return types.GeneratorType


# Proxies of objects sent without their class (not of a class the program defined): isinstance asks the program.
_UNTYPED_PROXIES: tuple[type, ...] = (RemoteObject, RemoteFunction, RemoteIterator, RemoteGenerator)
