"""The wire between a Python candidate's process and its judge's: frames, and the values that cross them.

A frame is a 4-byte big-endian length, then that many bytes of ASCII JSON
(non-ASCII is escaped, so lone surrogates survive). Values inside a frame are
encoded by a :class:`Codec`, which says what each side of the channel sees:

- **plain data** as itself: ``None``, ``bool``, ``int``, finite ``float``,
  ``str``, ``list``;
- **values**, as one-key objects whose key is a tag (``{"$tuple": [...]}``):
  the other builtin and standard-library value types (tuples, sets, dicts,
  bytes, complex, non-finite floats, ``range``, ``slice``, ``deque``,
  ``Counter``, ``OrderedDict``, ``defaultdict``, dict views, ``Fraction``,
  ``Decimal``, ``datetime``'s four types, namedtuples, ``SimpleNamespace``,
  ``array.array``, ints past 4,300 digits as hex) and numpy's arrays and
  scalars. The receiver rebuilds each as a value of its own, from its own
  classes: a value's methods (``__eq__`` first) are never the sender's;
- **everything else by reference**: ``{"$mine": [id, kind, ...]}`` names an
  object that stays in the sender's process (the receiver gets a proxy, whose
  uses become requests; see harness), and ``{"$yours": id}`` names one of
  the receiver's own objects that it handed over before.

A subclass of a value type that the codec does not know (a candidate's
``class MyInt(int)`` with a lying ``__eq__``) crosses as its base type's data,
read through the base type's own methods, never the subclass's.

Stdlib only: this module runs inside the sandbox image, where numpy is
optional (a value that needs it is refused where it is missing).
"""

from __future__ import annotations

import array
import base64
import binascii
import builtins
import collections
import datetime
import decimal
import fractions
import functools
import json
import math
import pathlib
import re
import socket
import sys
import types
from collections.abc import Callable
from typing import Any

from ..framing import HEADER, Deadline, FrameTooLarge, ProtocolError, body_length, frame, recv_exactly

__all__ = [
    "MAX_BIGINT_BITS",
    "MAX_CONTAINERS",
    "MAX_DEPTH",
    "MAX_FRAME_BYTES",
    "MAX_INT_BITS",
    "Codec",
    "Deadline",
    "FrameTooLarge",
    "ProtocolError",
    "RejectedValue",
    "decode_value",
    "encode_value",
    "recv_frame",
    "send_frame",
    "type_name",
]

# Large enough for the answer of a performance test (3 million ints sorted
# are 24 MB of JSON); what decoding a frame costs the judge is bounded by its
# memory budget (judgeserver.JOB_MEMORY_BYTES, or the job's memory limit) and
# MAX_CONTAINERS. The judge's frames to the candidate are the dataset's own
# data and may be larger (harness.CANDIDATE_FRAME_BYTES).
MAX_FRAME_BYTES = 64 * 1024 * 1024
# Lists and objects in one frame from the candidate, which the test process parses: each costs it
# 56-64 bytes for the 3 of "[]," (twice, once decoded), where numbers and strings cost about 12 times
# their text. A 15 MiB frame of "[]," takes 775 MiB, and two such jobs' judges beside their candidates
# run the sandbox out of memory, which the candidates escape as SANDBOX_LOST. Real values
# hold far fewer: a frame of pairs of numbers stops at about 900,000 of them.
MAX_CONTAINERS = 1 << 20
# Nesting depth of values; json's own C parser stops near the recursion limit
# (1000), and no test data nests anywhere near 100.
MAX_DEPTH = 100
# Python refuses int<->str conversions beyond 4300 digits (CVE-2020-10735);
# 14000 bits is about 4214 digits, so every int sent as a JSON number can also be parsed.
MAX_INT_BITS = 14_000
# A larger int crosses as hex (``{"$bigint": "-1f..."}``), which has no such limit and converts in linear time:
# math.factorial(2000) is 19,053 bits. Up to 4 MiB of hex.
MAX_BIGINT_BITS = 1 << 24
_BIGINT_HEX_CHARS = MAX_BIGINT_BITS // 4 + 1
# Decimals: the largest power of ten (either way) of one that crosses, as many digits as an int may have.
MAX_DECIMAL_EXPONENT = 4300
# numpy arrays: dimensions, and elements along one.
MAX_NDIM = 32
MAX_DIM = 1 << 40


class RejectedValue(ValueError):
    """A value that may not cross the channel: malformed, too big or too deep, or not encodable here."""


def type_name(obj: object) -> str:
    try:
        return str(type(obj).__qualname__)
    except Exception:
        return "?"


# ---------------------------------------------------------------------------
# Framing: the frame is sandboxd's one (verifiers.framing), its JSON strict ASCII without NaN or Infinity
# ---------------------------------------------------------------------------


def _reject_constant(name: str) -> object:
    raise ValueError(f"JSON constant {name} is not allowed (non-finite floats are tagged)")


# Made once, in the zygote: json.dumps and json.loads with options other than the
# defaults build an encoder or decoder per call, Python code that a fresh candidate
# runs (and copies the pages of) for every message: about 15 page faults more per
# HumanEval candidate.
_ENCODER = json.JSONEncoder(ensure_ascii=True, allow_nan=False, separators=(",", ":"))
_DECODER = json.JSONDecoder(parse_constant=_reject_constant)


def send_frame(sock: socket.socket, obj: object, max_bytes: int = MAX_FRAME_BYTES) -> None:
    """Send one frame: 4-byte big-endian length, then ``obj`` as ASCII JSON.

    ``obj`` must already be JSON-able (encode values with a :class:`Codec`
    first). Raises :class:`FrameTooLarge` before sending anything when the
    JSON is longer than ``max_bytes``, ``OSError`` when the peer is gone.
    """
    sock.sendall(frame(_ENCODER.encode(obj).encode("ascii"), max_bytes))


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
    passes: a deadline that moves). Raises ``EOFError`` when the peer closed
    (before or inside the frame), ``TimeoutError`` past the deadline,
    :class:`FrameTooLarge` for a length over ``max_bytes`` (nothing is read
    past the header), :class:`ProtocolError` for bytes that are not JSON, and
    ``OSError`` for socket errors. With ``max_containers``, a frame of more
    lists and objects than that is a :class:`ProtocolError`, before it is parsed.
    """
    if deadline is None and sock.gettimeout() is not None:
        # Blocking. With a deadline, recv_exactly sets the timeout before each read: setting None first would
        # switch the socket out of timeout mode and back (an ioctl each way) for every frame; and a socket
        # already blocking needs no ioctl at all (the candidate's, every frame).
        sock.settimeout(None)
    size = body_length(recv_exactly(sock, HEADER.size, deadline), max_bytes)
    body = recv_exactly(sock, size, deadline)
    if max_containers is not None and _containers(body) > max_containers:
        raise ProtocolError(f"frame holds more than {max_containers} lists and objects")
    try:
        return _DECODER.decode(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ProtocolError(f"frame is not valid JSON: {exc}") from None


# ---------------------------------------------------------------------------
# Values
# ---------------------------------------------------------------------------

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

# Of those, the ones whose data cannot change: a subclass's value crosses with a reference to the object
# (Codec.subclass_value), for the attributes the base type lacks (an IntEnum member's .name).
_IMMUTABLE_BASES = frozenset({int, float, str, bytes, tuple, frozenset})
# What collections.namedtuple (and typing.NamedTuple) put in a class's namespace besides its fields.
_NAMEDTUPLE_KEYS = frozenset(collections.namedtuple("_Plain", "a").__dict__) | {
    "__annotations__", "__orig_bases__", "__module__", "__qualname__", "__doc__", "__slots__", "_field_defaults",
    "__dict__", "__weakref__", "__static_attributes__", "__firstlineno__"}

# defaultdict factories that cross by name; any other factory (a lambda) crosses as none.
_FACTORIES: dict[str, type] = {cls.__name__: cls for cls in (int, float, str, list, dict, set, tuple, bool, frozenset)}

# Builtin classes and functions that cross by name (each side has its own): `convert(x, int)`,
# `sort_by(items, key=len)`, `pytest.raises(ValueError)` of a candidate's exception's base. Of the
# builtins module, its classes and the functions that only compute: a name must not hand the other side
# its own `open`, `exec` or `getattr` to call with what it is given.
_NAMED_MODULES = ("builtins", "math", "operator", "cmath")
_PURE_BUILTINS = frozenset({
    "abs", "all", "any", "ascii", "bin", "callable", "chr", "divmod", "format", "hash", "hex", "isinstance",
    "issubclass", "iter", "len", "max", "min", "next", "oct", "ord", "pow", "repr", "round", "sorted", "sum",
})


def _named(module: object, name: object, found: object) -> bool:
    """Whether `found`, at `module`.`name`, is one that may cross by name."""
    if module not in _NAMED_MODULES or type(name) is not str or not name.isidentifier() or name.startswith("_"):
        return False
    if isinstance(found, type):
        return True
    return type(found) is types.BuiltinFunctionType and (module != "builtins" or name in _PURE_BUILTINS)


def _named_object(module: str, name: str) -> object:
    found = getattr(sys.modules.get(module) or __import__(module), name, None) if module in _NAMED_MODULES else None
    if not _named(module, name, found):
        raise RejectedValue(f"no builtin {module}.{name} crosses by name")
    return found


def _builtin_name(obj: object) -> list[str] | None:
    """[module, name] of a builtin class or function that each side has under that name, else None."""
    if isinstance(obj, type) or type(obj) is types.BuiltinFunctionType:
        module, name = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    else:
        return None
    if not _named(module, name, obj):
        return None
    try:
        # The same object under that name: a patched builtins.input (a mock) is not input.
        return [module, name] if getattr(sys.modules[str(module)], str(name), None) is obj else None  # type: ignore[list-item]
    except KeyError:
        return None


# Libraries whose classes cross by name (numpy's LinAlgError, json's JSONDecodeError, an Enum base): never
# the harness's own, pytest's or unittest's, whose exceptions mean something to the judge (a SkipTest raised
# by the program must not skip a test).
_NAMED_CLASS_ROOTS = frozenset({
    "numpy", "decimal", "fractions", "datetime", "json", "re", "enum", "abc", "numbers", "collections", "statistics",
    "queue", "array", "string", "itertools", "functools", "heapq", "math", "typing", "dataclasses", "pathlib", "io",
    "csv", "zoneinfo", "struct", "binascii", "random", "copy", "operator",
})


def _class_name(cls: type) -> list[str] | None:
    """[module, qualname] of a library's class (numpy's, the standard library's), which the other side may have."""
    module, qualname = getattr(cls, "__module__", None), getattr(cls, "__qualname__", None)
    if type(module) is not str or type(qualname) is not str or module in ("solution", "__main__", "__sandboxd_test__"):
        return None
    if module not in sys.modules or not all(part.isidentifier() and not part.startswith("_")
                                            for part in qualname.split(".")):
        return None
    return [module, qualname] if _resolve_class(module, qualname) is cls else None


def _resolve_class(module: str, qualname: str) -> object:
    """The class at `module`.`qualname` in a module this process has already imported (it imports nothing)."""
    found: object = sys.modules.get(module) if module.partition(".")[0] in _NAMED_CLASS_ROOTS else None
    for part in qualname.split("."):
        if found is None or not part.isidentifier() or part.startswith("_"):
            return None
        found = getattr(found, part, None)
    return found if isinstance(found, type) else None


@functools.lru_cache(maxsize=256)
def _namedtuple_class(name: str, fields: tuple[str, ...]) -> type:
    """One class per name and fields, as the sender had (a bounded cache: a judge lives long)."""
    return collections.namedtuple(name, fields)


_DTYPE = re.compile(r"[<>|=][?biufcmMUS]\d{1,4}(\[\w{1,6}\])?")


def _numpy() -> Any:
    """numpy if this process has it (it is imported only for values that need it); RejectedValue otherwise."""
    numpy = sys.modules.get("numpy")
    if numpy is None:
        try:
            import numpy
        except ImportError:
            raise RejectedValue("a numpy value, and numpy is not installed here") from None
    return numpy


def _is_numpy(obj: object) -> bool:
    numpy = sys.modules.get("numpy")
    return numpy is not None and isinstance(obj, (numpy.ndarray, numpy.generic))


class Codec:
    """Encodes values for the wire and decodes them; references go through `export` and `proxy`.

    The base class has no references: a value that is not a value type is a
    :class:`RejectedValue`. harness's endpoints override :meth:`export`
    (one of this side's objects: its ``$mine`` tag), :meth:`own` (an object
    of ours that the peer names with ``$yours``), :meth:`proxy` (a
    ``$mine`` of the peer's) and :meth:`peer_id` (our proxy of a peer's
    object: its id, to name it back with ``$yours``).
    """

    def export(self, obj: object) -> object:
        raise RejectedValue(f"a value of type {type_name(obj)} is not plain data")

    def own(self, ref: object) -> object:
        raise RejectedValue("no objects are shared on this channel")

    def proxy(self, body: object) -> object:
        raise RejectedValue("no objects are shared on this channel")

    def peer_id(self, obj: object) -> int | None:
        return None

    def held_id(self, obj: object) -> int | None:
        """The id of one of the peer's containers that this side holds as its own (`$held`); None for none."""
        return None

    def held_object(self, hid: object) -> object:
        raise RejectedValue("no containers are held on this channel")

    def subclass_value(self, obj: object, data: object) -> object:
        """What crosses for `obj`, an instance of a class of its sender's own that derives from an immutable value
        type (an IntEnum member, a NamedTuple with methods), whose `data` (its base type's) is encoded: the data
        only, here; with a reference to the object too where references cross (harness's CandidateEndpoint)."""
        return data

    def value_with_object(self, value: object, remote: object) -> object:
        """A ``$sub``'s value, which keeps `remote` (the sender's object) for the attributes its base type lacks;
        refused where references do not cross."""
        raise RejectedValue("no objects are shared on this channel")

    def namedtuple_class(self, name: str, fields: tuple[str, ...]) -> type:
        """The class a ``$namedtuple`` of `name` and `fields` is rebuilt as here (the judge's own tests' class of
        that name and fields, where they have one: harness's JudgeEndpoint)."""
        return _namedtuple_class(name, fields)

    # ---- encoding ----

    def encode(self, obj: object, depth: int = 0) -> object:
        """``obj`` as JSON-able data (see the module docstring); RejectedValue past MAX_DEPTH or MAX_BIGINT_BITS."""
        if depth > MAX_DEPTH:
            raise RejectedValue(f"value nested deeper than {MAX_DEPTH} levels")
        kind = type(obj)
        if obj is None or kind is bool or kind is str:
            return obj
        if kind is int:
            if obj.bit_length() > MAX_INT_BITS:  # type: ignore[attr-defined]
                if obj.bit_length() > MAX_BIGINT_BITS:  # type: ignore[attr-defined]
                    raise RejectedValue(f"int with more than {MAX_BIGINT_BITS} bits")
                return {"$bigint": format(obj, "x")}
            return obj
        if kind is float:
            if math.isfinite(obj):  # type: ignore[arg-type]
                return obj
            return {"$float": "nan" if math.isnan(obj) else ("inf" if obj > 0 else "-inf")}  # type: ignore[arg-type,operator]
        depth += 1
        if kind in _HELD_KINDS:
            held = self.held_id(obj)
            if held is not None:
                return {"$held": held}
        if kind is list:
            return self._items(obj, depth)  # type: ignore[arg-type]
        encoder = _ENCODERS.get(kind)
        if encoder is not None:
            return encoder(self, obj, depth)
        peer = self.peer_id(obj)
        if peer is not None:
            return {"$yours": peer}
        if _is_numpy(obj):
            return self._numpy(obj, depth)
        if type(obj).__name__ == "LocalPath" and type(obj).__module__ == "_pytest._py.path":
            return {"$path": [str(obj), True]}  # pytest's tmpdir
        named = _builtin_name(obj)
        if named is not None:
            return {"$builtin": named}
        if isinstance(obj, BaseException) and _builtin_name(kind) is not None:
            # A builtin exception (what a test's `with` block raised, for a context manager's __exit__).
            try:
                return {"$exception": [kind.__name__, [self.encode(arg, depth) for arg in obj.args]]}
            except RejectedValue:
                return self.export(obj)
        if isinstance(obj, type):
            where = _class_name(obj)
            if where is not None:
                # numpy's LinAlgError for `pytest.raises(np.linalg.LinAlgError)`: each side's own, where it has it.
                return {"$class": [*where, self.export(obj)]}
        if isinstance(obj, tuple) and hasattr(kind, "_fields") and type(kind._fields) is tuple:
            return self._namedtuple(obj, depth)
        # issubclass of type(obj), which the value cannot fake (isinstance would ask its __class__).
        if getattr(kind, "_sandboxd_hybrid", False) and "_sandboxd_remote" in getattr(obj, "__dict__", {}):
            # The peer's object that came with its data (value_with_object): back to the peer as its own.
            return self.encode(obj.__dict__["_sandboxd_remote"], depth - 1)
        for base, read in _BASE_READERS:
            if issubclass(kind, base) and not _is_known_subclass(kind):
                data = self.encode(read(obj), depth - 1)
                return self.subclass_value(obj, data) if base in _IMMUTABLE_BASES else data
        return self.export(obj)

    def _items(self, items: list[Any], depth: int) -> list[object]:
        # Plain scalars need no walk: a list of 3 million ints crosses in 0.2 s without it, 1.5 s with it.
        if items and _all_plain_scalars(items):
            return items
        return [self.encode(item, depth) for item in items]

    def _pairs(self, items: Any, depth: int) -> list[object]:
        return [[self.encode(key, depth), self.encode(value, depth)] for key, value in items]

    def _namedtuple(self, obj: tuple[Any, ...], depth: int) -> object:
        cls = type(obj)
        fields = list(cls._fields)  # type: ignore[attr-defined]
        name = cls.__name__
        if not all(type(field) is str for field in fields) or type(name) is not str:
            return self.encode(tuple(tuple.__iter__(obj)), depth - 1)
        data = {"$namedtuple": [name, fields, self._items(list(tuple.__iter__(obj)), depth)]}
        # A NamedTuple with methods or properties of its own (`Interval.length`), or a subclass of one: those too.
        own = set(cls.__dict__) - _NAMEDTUPLE_KEYS - set(fields)
        return self.subclass_value(obj, data) if own or len(cls.__mro__) > 3 else data

    def _numpy(self, obj: Any, depth: int) -> object:
        numpy = _numpy()
        if isinstance(obj, numpy.generic):
            # A subclass of a numpy scalar crosses as its dtype's data (and is of numpy's own type over there).
            if obj.dtype.kind == "O" or not _DTYPE.fullmatch(obj.dtype.str):
                return self.export(obj)
            return {"$npscalar": [obj.dtype.str, base64.b64encode(obj.tobytes()).decode("ascii")]}
        array = numpy.ndarray.view(obj, numpy.ndarray)
        if array.dtype.kind == "O":
            return {"$ndarray": ["O", list(array.shape), self._items(array.ravel().tolist(), depth)]}
        if not _DTYPE.fullmatch(array.dtype.str):
            return self.export(obj)
        data = numpy.ascontiguousarray(array).tobytes()
        return {"$ndarray": [array.dtype.str, list(array.shape), base64.b64encode(data).decode("ascii")]}

    # ---- decoding ----

    def decode(self, obj: object, depth: int = 0) -> object:
        """What :meth:`encode` produced (after a JSON round trip), as this side's values; RejectedValue otherwise.

        Refuses unknown or extra tags, malformed bodies, unhashable set
        items or dict keys, duplicate dict keys, nesting deeper than
        :data:`MAX_DEPTH`. Every value is built from this process's own
        classes, so it is safe to compare here.
        """
        if depth > MAX_DEPTH:
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
        depth += 1
        if kind is list:
            if _all_plain_scalars(obj, decoded=True):  # type: ignore[arg-type]
                # A copy: the frame's own list must stay as it came, to tell what a call changed (write-back).
                return list(obj)  # type: ignore[call-overload]
            return [self.decode(item, depth) for item in obj]  # type: ignore[attr-defined]
        if kind is not dict or len(obj) != 1:  # type: ignore[arg-type]
            raise RejectedValue(f"not an encoded value: {type_name(obj)}")
        ((tag, body),) = obj.items()  # type: ignore[attr-defined]
        decoder = _DECODERS.get(tag)
        if decoder is None:
            raise RejectedValue(f"unknown tag {tag!r}")
        try:
            return decoder(self, body, depth)
        except RejectedValue:
            raise
        except (TypeError, ValueError, OverflowError, ArithmeticError, binascii.Error) as exc:
            raise RejectedValue(f"{tag} is malformed: {type(exc).__name__}") from None

    def items(self, body: object, depth: int, tag: str) -> list[Any]:
        if type(body) is not list:
            raise RejectedValue(f"{tag} must hold a list")
        if _all_plain_scalars(body, decoded=True):
            return body
        return [self.decode(item, depth) for item in body]

    def pairs(self, body: object, depth: int, tag: str) -> list[tuple[Any, Any]]:
        if type(body) is not list:
            raise RejectedValue(f"{tag} must hold a list of [key, value] pairs")
        result = []
        for pair in body:
            if type(pair) is not list or len(pair) != 2:
                raise RejectedValue(f"{tag} must hold a list of [key, value] pairs")
            result.append((self.decode(pair[0], depth), self.decode(pair[1], depth)))
        return result

    def mapping(self, factory: Callable[[], dict[Any, Any]], body: object, depth: int, tag: str) -> dict[Any, Any]:
        result = factory()
        for key, value in self.pairs(body, depth, tag):
            try:
                if key in result:
                    raise RejectedValue(f"{tag} has a duplicate key")
            except TypeError:
                raise RejectedValue(f"{tag} has an unhashable key") from None
            result[key] = value
        return result


def _all_plain_scalars(items: list[Any], decoded: bool = False) -> bool:
    """Whether every item is a str, bool, None, small int or finite float (each its own encoding), read in C.

    ``decoded``: items parsed from JSON, whose floats are finite.
    """
    kinds = set(map(type, items))
    if not kinds <= _SCALARS:
        return False
    if float in kinds and not decoded and not all(map(math.isfinite, (item for item in items if type(item) is float))):
        return False
    if int in kinds:
        ints = items if len(kinds) == 1 else [item for item in items if type(item) is int]
        return max(ints).bit_length() <= MAX_INT_BITS and min(ints).bit_length() <= MAX_INT_BITS
    return True


_SCALARS = frozenset({int, float, str, bool, type(None)})
_HELD_KINDS = frozenset({list, dict, set, bytearray, collections.deque, collections.defaultdict,
                         collections.Counter, collections.OrderedDict})

# Subclasses of plain types that are value types of their own (they have encoders).
_KNOWN_SUBCLASSES: tuple[type, ...] = (collections.Counter, collections.OrderedDict, collections.defaultdict, bool)


def _is_known_subclass(kind: type) -> bool:
    return kind in _KNOWN_SUBCLASSES


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(body: object, tag: str) -> bytes:
    if type(body) is not str:
        raise RejectedValue(f"{tag} must hold a base64 string")
    try:
        return base64.b64decode(body, validate=True)
    except (binascii.Error, ValueError):
        raise RejectedValue(f"{tag} holds invalid base64") from None


def _int(value: object, tag: str, optional: bool = False) -> Any:
    if optional and value is None:
        return None
    if type(value) is not int:
        raise RejectedValue(f"{tag} holds a non-int where an int belongs")
    return value


def _encode_slice(codec: Codec, obj: slice, depth: int) -> object:
    return {"$slice": [codec.encode(obj.start, depth), codec.encode(obj.stop, depth), codec.encode(obj.step, depth)]}


def _encode_defaultdict(codec: Codec, obj: collections.defaultdict[Any, Any], depth: int) -> object:
    factory = obj.default_factory
    name: object = (factory.__name__ if isinstance(factory, type) and _FACTORIES.get(factory.__name__) is factory
                    else None)
    if name is None and factory is not None:
        # Any other factory (a test's `defaultdict(lambda: 0)`) by reference, which the receiver calls back; none
        # where references do not cross (encode_value).
        try:
            name = codec.encode(factory, depth)
        except RejectedValue:
            name = None
    return {"$defaultdict": [name, codec._pairs(dict.items(obj), depth)]}


def _encode_float(codec: Codec, obj: float, depth: int) -> object:
    return codec.encode(obj, depth - 1)


_ENCODERS: dict[type, Callable[[Codec, Any, int], object]] = {
    tuple: lambda codec, obj, depth: {"$tuple": codec._items(list(obj), depth)},
    dict: lambda codec, obj, depth: {"$dict": codec._pairs(obj.items(), depth)},
    set: lambda codec, obj, depth: {"$set": codec._items(list(obj), depth)},
    frozenset: lambda codec, obj, depth: {"$frozenset": codec._items(list(obj), depth)},
    bytes: lambda codec, obj, depth: {"$bytes": _b64(obj)},
    bytearray: lambda codec, obj, depth: {"$bytearray": _b64(bytes(obj))},
    complex: lambda codec, obj, depth: {"$complex": [codec.encode(obj.real, depth), codec.encode(obj.imag, depth)]},
    range: lambda codec, obj, depth: {"$range": [obj.start, obj.stop, obj.step]},
    slice: _encode_slice,
    collections.deque: lambda codec, obj, depth: {"$deque": [codec._items(list(obj), depth), obj.maxlen]},
    collections.Counter: lambda codec, obj, depth: {"$counter": codec._pairs(dict.items(obj), depth)},
    collections.OrderedDict: lambda codec, obj, depth: {"$ordereddict": codec._pairs(dict.items(obj), depth)},
    collections.defaultdict: _encode_defaultdict,
    types.SimpleNamespace: lambda codec, obj, depth: {"$namespace": codec._pairs(
        ((key, value) for key, value in vars(obj).items() if type(key) is str), depth)},
    array.array: lambda codec, obj, depth: {"$array": [obj.typecode, _b64(obj.tobytes())]},
    type({}.keys()): lambda codec, obj, depth: {"$keys": codec._items(list(obj), depth)},
    type({}.values()): lambda codec, obj, depth: {"$values": codec._items(list(obj), depth)},
    type({}.items()): lambda codec, obj, depth: {"$items": codec._pairs(obj, depth)},
    fractions.Fraction: lambda codec, obj, depth: {"$fraction": [codec.encode(obj.numerator, depth),
                                                                 codec.encode(obj.denominator, depth)]},
    decimal.Decimal: lambda codec, obj, depth: {"$decimal": str(obj)},
    datetime.date: lambda codec, obj, depth: {"$date": obj.isoformat()},
    datetime.datetime: lambda codec, obj, depth: {"$datetime": obj.isoformat()},
    datetime.time: lambda codec, obj, depth: {"$time": obj.isoformat()},
    datetime.timedelta: lambda codec, obj, depth: {"$timedelta": [obj.days, obj.seconds, obj.microseconds]},
    type(Ellipsis): lambda codec, obj, depth: {"$ellipsis": None},
    pathlib.PosixPath: lambda codec, obj, depth: {"$path": [str(obj), True]},
    pathlib.PurePosixPath: lambda codec, obj, depth: {"$path": [str(obj), False]},
}


def _hashable(factory: Callable[[list[Any]], object], items: list[Any], tag: str) -> object:
    try:
        return factory(items)
    except TypeError:
        raise RejectedValue(f"{tag} holds an unhashable item") from None


def _decode_path(codec: Codec, body: object, depth: int) -> object:
    if type(body) is not list or len(body) != 2 or type(body[0]) is not str or type(body[1]) is not bool:
        raise RejectedValue("$path must hold [path, concrete]")
    return pathlib.Path(body[0]) if body[1] else pathlib.PurePosixPath(body[0])


def _decode_keys(items: list[Any]) -> object:
    try:
        return dict.fromkeys(items).keys()
    except TypeError:
        raise RejectedValue("$keys holds an unhashable item") from None


def _decode_bigint(codec: Codec, body: object, depth: int) -> object:
    if type(body) is not str or not 0 < len(body) <= _BIGINT_HEX_CHARS + 1:
        raise RejectedValue("$bigint must hold a hex string")
    return int(body, 16)  # ValueError for anything but hex digits and a sign: malformed


def _decode_float(codec: Codec, body: object, depth: int) -> object:
    if type(body) is not str or body not in ("nan", "inf", "-inf"):
        raise RejectedValue("$float must be 'nan', 'inf' or '-inf'")
    return float(body)


def _decode_complex(codec: Codec, body: object, depth: int) -> object:
    parts = codec.items(body, depth, "$complex")
    if len(parts) != 2 or not all(type(part) in (int, float) for part in parts):
        raise RejectedValue("$complex must hold [real, imag]")
    try:
        return complex(parts[0], parts[1])
    except OverflowError:  # an int past the float range
        raise RejectedValue("$complex part too large for a float") from None


def _decode_range(codec: Codec, body: object, depth: int) -> object:
    if type(body) is not list or len(body) != 3:
        raise RejectedValue("$range must hold [start, stop, step]")
    return range(*(_int(part, "$range") for part in body))


def _decode_slice(codec: Codec, body: object, depth: int) -> object:
    if type(body) is not list or len(body) != 3:
        raise RejectedValue("$slice must hold [start, stop, step]")
    return slice(*(codec.decode(part, depth) for part in body))


def _decode_deque(codec: Codec, body: object, depth: int) -> object:
    if type(body) is not list or len(body) != 2:
        raise RejectedValue("$deque must hold [items, maxlen]")
    maxlen = _int(body[1], "$deque", optional=True)
    if maxlen is not None and maxlen < 0:
        raise RejectedValue("$deque has a negative maxlen")
    return collections.deque(codec.items(body[0], depth, "$deque"), maxlen)


def _decode_defaultdict(codec: Codec, body: object, depth: int) -> object:
    if type(body) is not list or len(body) != 2:
        raise RejectedValue("$defaultdict must hold [factory, pairs]")
    name = body[0]
    factory: Any = None
    if type(name) is dict:
        factory = codec.decode(name, depth)  # a reference, or an error
        if not callable(factory):
            raise RejectedValue("$defaultdict has a factory that is not callable")
    elif name is not None and (type(name) is not str or name not in _FACTORIES):
        raise RejectedValue("$defaultdict has an unknown factory")
    elif name is not None:
        factory = _FACTORIES[name]
    return codec.mapping(lambda: collections.defaultdict(factory), body[1], depth, "$defaultdict")


def _decode_sub(codec: Codec, body: object, depth: int) -> object:
    if type(body) is not list or len(body) != 2 or type(body[1]) is not dict:
        raise RejectedValue("$sub must hold [value, reference]")
    value = codec.decode(body[0], depth)
    if type(value) not in _IMMUTABLE_BASES and not (isinstance(value, tuple) and hasattr(type(value), "_fields")):
        raise RejectedValue("$sub holds a value of a type that can change")
    return codec.value_with_object(value, codec.decode(body[1], depth))


def _decode_namespace(codec: Codec, body: object, depth: int) -> object:
    attributes = codec.mapping(dict, body, depth, "$namespace")
    if not all(type(key) is str for key in attributes):
        raise RejectedValue("$namespace has a name that is not a str")
    return types.SimpleNamespace(**attributes)


def _decode_array(codec: Codec, body: object, depth: int) -> object:
    if type(body) is not list or len(body) != 2 or type(body[0]) is not str or len(body[0]) != 1 \
            or body[0] not in array.typecodes:
        raise RejectedValue("$array must hold [typecode, base64 bytes]")
    data = _unb64(body[1], "$array")
    made = array.array(body[0])
    if len(data) % made.itemsize:
        raise RejectedValue("$array holds a partial item")
    made.frombytes(data)
    return made


def _decode_fraction(codec: Codec, body: object, depth: int) -> object:
    parts = codec.items(body, depth, "$fraction")
    if len(parts) != 2 or not all(type(part) is int for part in parts) or parts[1] == 0:
        raise RejectedValue("$fraction must hold [numerator, non-zero denominator]")
    return fractions.Fraction(parts[0], parts[1])


def _decode_decimal(codec: Codec, body: object, depth: int) -> object:
    if type(body) is not str or len(body) > 10_000:
        raise RejectedValue("$decimal must hold a short string")
    try:
        number = decimal.Decimal(body)
    except decimal.InvalidOperation:
        raise RejectedValue("$decimal holds no number") from None
    # What an int crossing may hold (MAX_INT_BITS, about 4214 digits), also as a power of ten: int() of the 11
    # characters "1E+10000000" does not end in any time a judge has (52 s for 1E+1000000), and a function-call case
    # does it to every Decimal answer (judge._as_plain), as Fraction(), round() or math.floor() of one do.
    if number.is_finite() and abs(number.adjusted()) > MAX_DECIMAL_EXPONENT:
        raise RejectedValue(f"$decimal with an exponent past {MAX_DECIMAL_EXPONENT}")
    return number


def _iso(parse: Callable[[str], object], tag: str) -> Callable[[Codec, object, int], object]:
    def decode(codec: Codec, body: object, depth: int) -> object:
        if type(body) is not str or len(body) > 64:
            raise RejectedValue(f"{tag} must hold an ISO 8601 string")
        return parse(body)

    return decode


def _decode_timedelta(codec: Codec, body: object, depth: int) -> object:
    if type(body) is not list or len(body) != 3:
        raise RejectedValue("$timedelta must hold [days, seconds, microseconds]")
    days, seconds, micros = (_int(part, "$timedelta") for part in body)
    return datetime.timedelta(days=days, seconds=seconds, microseconds=micros)


def _decode_namedtuple(codec: Codec, body: object, depth: int) -> object:
    if type(body) is not list or len(body) != 3 or type(body[0]) is not str or type(body[1]) is not list:
        raise RejectedValue("$namedtuple must hold [name, fields, items]")
    name, fields = body[0], body[1]
    if not all(type(field) is str for field in fields) or len(fields) > 255 or len(name) > 200:
        raise RejectedValue("$namedtuple has bad fields")
    items = codec.items(body[2], depth, "$namedtuple")
    if len(items) != len(fields):
        raise RejectedValue("$namedtuple has as many items as fields")
    try:
        cls = codec.namedtuple_class(name, tuple(fields))
    except ValueError:
        raise RejectedValue("$namedtuple has bad names") from None
    make = getattr(cls, "_make", None)
    return make(items) if callable(make) else cls(*items)


def _shape(body: object) -> tuple[int, ...]:
    if type(body) is not list or len(body) > MAX_NDIM or not all(type(n) is int and 0 <= n <= MAX_DIM for n in body):
        raise RejectedValue("$ndarray has a bad shape")
    return tuple(body)


def _decode_ndarray(codec: Codec, body: object, depth: int) -> object:
    if type(body) is not list or len(body) != 3 or type(body[0]) is not str:
        raise RejectedValue("$ndarray must hold [dtype, shape, data]")
    numpy = _numpy()
    dtype_name, shape = body[0], _shape(body[1])
    count = math.prod(shape)
    if dtype_name == "O":
        items = codec.items(body[2], depth, "$ndarray")
        if len(items) != count:
            raise RejectedValue("$ndarray holds as many items as its shape")
        array = numpy.empty(count, dtype=object)
        array[:] = items
        return array.reshape(shape)
    if not _DTYPE.fullmatch(dtype_name):
        raise RejectedValue("$ndarray has an unknown dtype")
    dtype = numpy.dtype(dtype_name)
    data = _unb64(body[2], "$ndarray")
    if len(data) != count * dtype.itemsize:
        raise RejectedValue("$ndarray holds as many bytes as its shape")
    return numpy.frombuffer(data, dtype=dtype).reshape(shape).copy()


def _decode_npscalar(codec: Codec, body: object, depth: int) -> object:
    if type(body) is not list or len(body) != 2 or type(body[0]) is not str or not _DTYPE.fullmatch(body[0]):
        raise RejectedValue("$npscalar must hold [dtype, data]")
    numpy = _numpy()
    dtype = numpy.dtype(body[0])
    data = _unb64(body[1], "$npscalar")
    if len(data) != dtype.itemsize:
        raise RejectedValue("$npscalar holds as many bytes as its dtype")
    return numpy.frombuffer(data, dtype=dtype)[0]


def _decode_builtin(codec: Codec, body: object, depth: int) -> object:
    if type(body) is not list or len(body) != 2 or not all(type(part) is str for part in body):
        raise RejectedValue("$builtin must hold [module, name]")
    return _named_object(body[0], body[1])


def _decode_exception(codec: Codec, body: object, depth: int) -> object:
    if type(body) is not list or len(body) != 2 or type(body[0]) is not str:
        raise RejectedValue("$exception must hold [name, args]")
    cls = getattr(builtins, body[0], None) if body[0].isidentifier() else None
    if not isinstance(cls, type) or not issubclass(cls, BaseException):
        raise RejectedValue("$exception names no builtin exception")
    return cls(*codec.items(body[1], depth, "$exception"))


def _decode_class(codec: Codec, body: object, depth: int) -> object:
    if type(body) is not list or len(body) != 3 or type(body[0]) is not str or type(body[1]) is not str:
        raise RejectedValue("$class must hold [module, qualname, fallback]")
    found = _resolve_class(body[0], body[1])
    return found if found is not None else codec.decode(body[2], depth)


def _decode_yours(codec: Codec, body: object, depth: int) -> object:
    return codec.own(body)


def _decode_mine(codec: Codec, body: object, depth: int) -> object:
    return codec.proxy(body)


_DECODERS: dict[str, Callable[[Codec, object, int], object]] = {
    "$float": _decode_float,
    "$bigint": _decode_bigint,
    "$tuple": lambda codec, body, depth: tuple(codec.items(body, depth, "$tuple")),
    "$set": lambda codec, body, depth: _hashable(set, codec.items(body, depth, "$set"), "$set"),
    "$frozenset": lambda codec, body, depth: _hashable(frozenset, codec.items(body, depth, "$frozenset"), "$frozenset"),
    "$dict": lambda codec, body, depth: codec.mapping(dict, body, depth, "$dict"),
    "$bytes": lambda codec, body, depth: _unb64(body, "$bytes"),
    "$bytearray": lambda codec, body, depth: bytearray(_unb64(body, "$bytearray")),
    "$complex": _decode_complex,
    "$range": _decode_range,
    "$slice": _decode_slice,
    "$deque": _decode_deque,
    "$counter": lambda codec, body, depth: codec.mapping(collections.Counter, body, depth, "$counter"),
    "$ordereddict": lambda codec, body, depth: codec.mapping(collections.OrderedDict, body, depth, "$ordereddict"),
    "$defaultdict": _decode_defaultdict,
    "$namespace": _decode_namespace,
    "$sub": _decode_sub,
    "$array": _decode_array,
    "$keys": lambda codec, body, depth: _decode_keys(codec.items(body, depth, "$keys")),
    "$values": lambda codec, body, depth: dict(enumerate(codec.items(body, depth, "$values"))).values(),
    "$items": lambda codec, body, depth: codec.mapping(dict, body, depth, "$items").items(),
    "$fraction": _decode_fraction,
    "$decimal": _decode_decimal,
    "$date": _iso(datetime.date.fromisoformat, "$date"),
    "$datetime": _iso(datetime.datetime.fromisoformat, "$datetime"),
    "$time": _iso(datetime.time.fromisoformat, "$time"),
    "$timedelta": _decode_timedelta,
    "$ellipsis": lambda codec, body, depth: ...,
    "$path": _decode_path,
    "$namedtuple": _decode_namedtuple,
    "$ndarray": _decode_ndarray,
    "$npscalar": _decode_npscalar,
    "$builtin": _decode_builtin,
    "$exception": _decode_exception,
    "$class": _decode_class,
    "$yours": _decode_yours,
    "$held": lambda codec, body, depth: codec.held_object(body),
    "$mine": _decode_mine,
}

_PLAIN = Codec()


def encode_value(obj: object) -> object:
    """``obj`` as JSON-able data, by value only: anything that would cross by reference is a RejectedValue."""
    return _PLAIN.encode(obj)


def decode_value(obj: object) -> object:
    """What :func:`encode_value` produced, decoded; references are a RejectedValue."""
    return _PLAIN.decode(obj)
