"""Tests of the Python harness's public face (sandboxd.verifiers.python.harness): the value codec and framing it
exports; and the helpers the other tests of the harness share (``harness``: a candidate process and a test
process joined by a socketpair, run for real)."""

from __future__ import annotations

import contextlib
import enum
import json
import math
import os
import socket
import subprocess
import sys
import threading
import time
from collections import namedtuple
from pathlib import Path
from typing import Any

import pytest

from sandboxd.verifiers.code import FunctionCase
from sandboxd.verifiers.python.harness import (
    MAX_BIGINT_BITS,
    MAX_DEPTH,
    FrameTooLarge,
    ProtocolError,
    RejectedValue,
    decode_value,
    encode_value,
    recv_frame,
    run_tests,
    send_frame,
    top_level_names,
)

REPO = Path(__file__).resolve().parents[3]

pytestmark = pytest.mark.timeout(60)


# ---------------------------------------------------------------------------
# Codec and framing
# ---------------------------------------------------------------------------


ROUND_TRIP = [
    None,
    True,
    False,
    0,
    -(10**40),
    1.5,
    -0.0,
    float("inf"),
    float("-inf"),
    "héllo \ud800",
    b"\x00\xff",
    [1, [2, [3]]],
    (1, "a", (2.5,)),
    (),
    {1: "a", "1": "b", (1, 2): [3], None: None, 2.5: True, frozenset({1}): ()},
    {1, "a", (2, 3)},
    frozenset({1, 2}),
    {"$tuple": [1]},  # a dict whose key looks like a tag is still a dict
    complex(1, -2),
    complex(float("inf"), float("nan")),
    [True, 1, 1.0],
]


@pytest.mark.parametrize("value", ROUND_TRIP, ids=repr)
def test_codec_round_trip(value: Any) -> None:
    wire = json.loads(json.dumps(encode_value(value), allow_nan=False))
    decoded = decode_value(wire)
    assert type(decoded) is type(value)
    assert repr(decoded) == repr(value)


def test_ints_past_python_s_string_limit_cross_as_hex() -> None:
    """math.factorial(2000) is 19,053 bits, past the 4,300 digits int() and str() take: it crosses as hex, in a
    container and as a key too, and so do a negative one and a subclass (as its int)."""
    big = math.factorial(2000)
    for value in (big, -big, [1, big], {big: (big,)}):
        wire = json.loads(json.dumps(encode_value(value)))
        assert decode_value(wire) == value
    assert encode_value(_IntSub(big)) == encode_value(big) == {"$bigint": format(big, "x")}
    assert encode_value(10**4000) == 10**4000  # a JSON number still, where it can be parsed as one


def test_codec_keeps_nan_and_bool_types() -> None:
    decoded = decode_value(json.loads(json.dumps(encode_value([float("nan"), True, 1]))))
    assert isinstance(decoded, list)
    assert math.isnan(decoded[0]) and [type(x) for x in decoded] == [float, bool, int]


class _LyingEq:
    def __eq__(self, other: object) -> bool:
        return True

    def __hash__(self) -> int:
        return 0


class _IntSub(int):
    def __eq__(self, other: object) -> bool:
        return True

    __hash__ = int.__hash__


class _StrSub(str):
    pass


class _Color(enum.IntEnum):
    RED = 1


_Point = namedtuple("_Point", "x y")


@pytest.mark.parametrize(
    "value",
    [
        _LyingEq(),
        [1, _LyingEq()],
        {_LyingEq(): 1},
        map(str, [1]),
        object(),
        lambda: 1,
        1 << (MAX_BIGINT_BITS + 1),
        _IntSub(1 << (MAX_BIGINT_BITS + 1)),
    ],
    ids=lambda v: type(v).__name__,
)
def test_encode_rejects_non_plain_values(value: Any) -> None:
    with pytest.raises(RejectedValue):
        encode_value(value)


class _LyingDict(dict[str, int]):
    def items(self) -> Any:
        return [("forged", 1)]

    def __iter__(self) -> Any:
        return iter(["forged"])

    def __eq__(self, other: object) -> bool:
        return True

    __hash__ = None


class _LyingList(list[int]):
    def __iter__(self) -> Any:
        return iter([99])


class _LyingInt(int):
    def __eq__(self, other: object) -> bool:
        return True

    def __index__(self) -> int:
        return 99

    __hash__ = int.__hash__


class _LyingStr(str):
    def __str__(self) -> str:
        return "forged"


@pytest.mark.parametrize(
    ("value", "plain"),
    [
        (_Color.RED, 1),
        (_IntSub(3), 3),
        (_StrSub("x"), "x"),
        ({"k": _IntSub(1), _StrSub("s"): [(0, 1)]}, {"k": 1, "s": [(0, 1)]}),
        # Whatever a subclass says about itself, the data it holds is what is sent.
        (_LyingDict(x=1), {"x": 1}),
        (_LyingList([1, 2]), [1, 2]),
        (_LyingInt(5), 5),
        (_LyingStr("abc"), "abc"),
    ],
    ids=lambda v: type(v).__name__,
)
def test_a_subclass_of_a_plain_type_is_sent_as_the_data_it_holds(value: Any, plain: Any) -> None:
    """The reference graders compare with ==, which takes Counter({1: 2}) == {1: 2}: such returns were refused."""
    assert encode_value(value) == encode_value(plain)


def test_encode_rejects_deep_and_cyclic_values() -> None:
    deep: list[Any] = []
    for _ in range(MAX_DEPTH + 5):
        deep = [deep]
    with pytest.raises(RejectedValue, match="deeper"):
        encode_value(deep)
    cyclic: list[Any] = []
    cyclic.append(cyclic)
    with pytest.raises(RejectedValue):
        encode_value(cyclic)


@pytest.mark.parametrize(
    "wire",
    [
        {"$float": "NaN"},
        {"$float": 1},
        {"$tuple": 1},
        {"$set": [[1]]},
        {"$dict": [[[1], 2]]},
        {"$dict": [[1, 2], [1, 3]]},
        {"$dict": [[1, 2, 3]]},
        {"$bytes": "!!"},
        {"$complex": [1]},
        {"$complex": ["a", 1]},
        {"$bigint": 1},
        {"$bigint": ""},
        {"$bigint": "12g"},
        {"$bigint": "f" * (MAX_BIGINT_BITS // 4 + 3)},
        {"$code": "print(1)"},
        {"$tuple": [], "$set": []},
        {"a": 1},
        {},
        float("nan"),
        object(),
    ],
    ids=repr,
)
def test_decode_rejects_malformed_values(wire: Any) -> None:
    with pytest.raises(RejectedValue):
        decode_value(wire)


def test_frames_round_trip_and_wire_format(pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    send_frame(a, {"ok": encode_value("é")})
    header = b.recv(4, socket.MSG_PEEK)
    assert int.from_bytes(header, "big") == len(b'{"ok":"\\u00e9"}')
    assert recv_frame(b) == {"ok": "é"}


def test_frame_limits(pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    with pytest.raises(FrameTooLarge):
        send_frame(a, "x" * 100, max_bytes=10)
    send_frame(a, "x" * 100)
    with pytest.raises(FrameTooLarge):
        recv_frame(b, max_bytes=10)


@pytest.mark.parametrize(
    ("raw", "error"),
    [
        (b"", EOFError),
        ((10).to_bytes(4, "big") + b"abc", EOFError),
        ((3).to_bytes(4, "big") + b"{x}", ProtocolError),
        ((3).to_bytes(4, "big") + b"NaN", ProtocolError),
        ((2).to_bytes(4, "big") + b"\xff\xfe", ProtocolError),
        ((4000).to_bytes(4, "big") + b"[" * 4000, ProtocolError),
    ],
)
def test_recv_frame_errors(pair: tuple[socket.socket, socket.socket], raw: bytes, error: type) -> None:
    a, b = pair
    a.sendall(raw)
    a.shutdown(socket.SHUT_WR)
    with pytest.raises(error):
        recv_frame(b)


def test_recv_frame_deadline_covers_a_trickling_peer(pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    stop = threading.Event()

    def trickle() -> None:
        a.sendall((100).to_bytes(4, "big"))
        while not stop.is_set():
            a.sendall(b" ")
            time.sleep(0.05)

    thread = threading.Thread(target=trickle, daemon=True)
    thread.start()
    try:
        with pytest.raises(TimeoutError):
            recv_frame(b, deadline=time.monotonic() + 0.5)
    finally:
        stop.set()
        thread.join()


# ---------------------------------------------------------------------------
# The two-process harness, for real
# ---------------------------------------------------------------------------


# A fresh interpreter, not a fork of this one: after the gRPC, torch and reward-model tests this
# process has threads and at-fork handlers, and a forked candidate once died of a segfault in
# one (filelock's) before it ran a line of the candidate (bare-machine CI).
CANDIDATE_MAIN = (
    "import json, socket, sys; from sandboxd.verifiers.python.harness import serve_candidate; "
    "serve_candidate(open(sys.argv[1]).read(), socket.socket(fileno=int(sys.argv[2])), "
    "max_frame_bytes=int(sys.argv[3]), assembly=json.loads(sys.argv[4]), implicit_imports=sys.argv[5] == '1')"
)


def _workdir(tmp_path: Path) -> Path:
    """The folder both processes run in, as the sandbox's workdir: a test's files stay out of the checkout."""
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    return work


def _start_candidate(code: str, tmp_path: Path, max_frame_bytes: int, assembly: dict[str, str] | None = None,
                     implicit_imports: bool = False) -> tuple[socket.socket, subprocess.Popen[bytes]]:
    """Start a candidate process serving ``code``, its stdout in ``tmp_path / "candidate.out"``."""
    source = tmp_path / "candidate.py"
    source.write_text(code)
    parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with open(tmp_path / "candidate.out", "wb") as out:
        process = subprocess.Popen([sys.executable, "-c", CANDIDATE_MAIN, str(source), str(child.fileno()),
                                    str(max_frame_bytes), json.dumps(assembly), "1" if implicit_imports else "0"],
                                   pass_fds=[child.fileno()], stdout=out, cwd=_workdir(tmp_path),
                                   env={**os.environ, "PYTHONPATH": str(REPO)})
    child.close()
    return parent, process


def harness(
    code: str, tmp_path: Path, kind: str = "function", candidate_max_frame: int = 1 << 24,
    candidate_assembly: dict[str, str] | None = None, **kwargs: Any
) -> dict[str, Any]:
    """Run ``code`` in a candidate process and ``run_tests`` here; end the candidate.

    As the agent runs it: function-call tests' candidates get pyharness.IMPLICIT_IMPORTS."""
    channel, process = _start_candidate(code, tmp_path, candidate_max_frame, candidate_assembly,
                                        implicit_imports=kind == "function")
    try:
        if kind == "assert":
            kwargs.setdefault("names", top_level_names(code))
        with contextlib.chdir(_workdir(tmp_path)):
            result = run_tests(kind, channel, **kwargs)
    finally:
        channel.close()
        # A candidate stuck in a loop does not see end of file; the agent would kill it.
        try:
            process.wait(timeout=2)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    out_path = tmp_path / "candidate.out"
    result["stdout"] = out_path.read_text() if out_path.exists() else ""
    return result


ADD_CASES = [FunctionCase((1, 2), 3), FunctionCase((-1, 1), 0), FunctionCase((2, 2), 4)]
