"""The values that cross between a candidate's process and its judge's: each rebuilt from the receiver's own classes."""

from __future__ import annotations

import collections
import datetime
import decimal
import fractions
import json
from typing import Any

import numpy as np
import pytest

from sandboxd.verifiers.python.wire import Codec, RejectedValue, decode_value, encode_value

Point = collections.namedtuple("Point", "x y")


def _round_trip(value: object) -> Any:
    return decode_value(json.loads(json.dumps(encode_value(value))))


@pytest.mark.parametrize(
    "value",
    [
        collections.deque([1, 2, 3]),
        collections.deque([1], maxlen=4),
        collections.Counter("abracadabra"),
        collections.OrderedDict([("b", 1), ("a", 2)]),
        range(2, 20, 3),
        slice(1, None, 2),
        bytearray(b"\x00\xff"),
        fractions.Fraction(1, 3),
        decimal.Decimal("1.10"),
        datetime.date(2024, 2, 29),
        datetime.datetime(2024, 2, 29, 13, 5, 1, 7, tzinfo=datetime.timezone(datetime.timedelta(hours=-3))),
        datetime.time(23, 59, 1),
        datetime.timedelta(days=-1, seconds=5, microseconds=3),
        Point(1, [2]),
        ...,
        {"k": (1, 2.5, None, True)},
        frozenset({(1, 2)}),
        float("inf"),
    ],
    ids=lambda value: type(value).__name__,
)
def test_standard_values_cross_with_their_own_type(value: object) -> None:
    back = _round_trip(value)
    assert type(back) is type(value) or (isinstance(value, tuple) and back._fields == value._fields)  # type: ignore[attr-defined]
    assert back == value
    if isinstance(value, collections.deque):
        assert back.maxlen == value.maxlen


def test_a_defaultdict_keeps_a_builtin_factory_and_drops_any_other() -> None:
    counts = _round_trip(collections.defaultdict(int, a=1))
    counts["b"] += 1
    assert counts == {"a": 1, "b": 1} and counts.default_factory is int
    custom = _round_trip(collections.defaultdict(lambda: 7, a=1))
    assert custom.default_factory is None and custom == {"a": 1}


def test_dict_views_and_their_comparisons() -> None:
    data = {"a": 1, "b": 2}
    assert _round_trip(data.keys()) == {"a", "b"}
    assert _round_trip(data.items()) == {("a", 1), ("b", 2)}
    assert sorted(_round_trip(data.values())) == [1, 2]


@pytest.mark.parametrize(
    "value",
    [np.int64(7), np.bool_(True), np.float32(0.5), np.complex128(1 - 2j), np.uint8(255), np.datetime64("2024-01-02")],
    ids=lambda value: type(value).__name__,
)
def test_numpy_scalars_stay_numpy_scalars(value: Any) -> None:
    back = _round_trip(value)
    assert type(back) is type(value) and back == value


@pytest.mark.parametrize(
    "array",
    [np.arange(6).reshape(2, 3), np.array([[True, False]]), np.array(["ab", "c"]), np.zeros((0, 4)),
     np.asfortranarray(np.arange(4.0).reshape(2, 2)), np.array([1, None, "x"], dtype=object)],
    ids=["int", "bool", "str", "empty", "fortran", "object"],
)
def test_numpy_arrays_keep_dtype_shape_and_data(array: Any) -> None:
    back = _round_trip(array)
    assert type(back) is np.ndarray and back.dtype == array.dtype and back.shape == array.shape
    assert back.tolist() == array.tolist() and back.flags.writeable


def test_a_list_of_millions_of_plain_scalars_is_not_walked_item_by_item() -> None:
    """A performance test's 3 million ints: they cross as the JSON list they are, and come back a copy (a frame's
    own list must stay as it came, to tell what a call changed)."""
    data = list(range(3_000_000))
    encoded = encode_value(data)
    assert encoded is data
    raw = json.loads(json.dumps(encoded))
    decoded = decode_value(raw)
    assert decoded == data and decoded is not raw


@pytest.mark.parametrize(
    "body",
    [
        {"$ndarray": ["<i8", [2], "AAAAAAAAAAA="]},  # 8 bytes for 2 elements
        {"$ndarray": ["<i8", [-1], ""]},
        {"$ndarray": ["<i8,<i8", [1], ""]},  # a structured dtype
        {"$ndarray": ["O", [2], [1]]},
        {"$npscalar": ["|O8", ""]},
        {"$namedtuple": ["P", ["x", "x"], [1, 2]]},
        {"$namedtuple": ["P", ["x"], [1, 2]]},
        {"$defaultdict": ["os.system", []]},
        {"$deque": [[1], -1]},
        {"$fraction": [1, 0]},
        {"$decimal": "not a number"},
        {"$date": "yesterday"},
        {"$range": [0, 10, 0]},
        {"$builtin": ["os", "system"]},
        {"$builtin": ["builtins", "__import__"]},
        {"$builtin": ["builtins", "open"]},
        {"$keys": [[1]]},
        {"$mine": [1, "object", "x"]},  # no references on a plain codec
        {"$yours": 1},
        {"$nope": 1},
    ],
    ids=lambda body: next(iter(body)) + str(next(iter(body.values())))[:20],
)
def test_malformed_or_forbidden_values_are_refused(body: object) -> None:
    with pytest.raises(RejectedValue):
        decode_value(body)


def test_builtins_cross_by_name_only_when_they_are_the_builtin() -> None:
    assert _round_trip(len) is len and _round_trip(int) is int and _round_trip(ValueError) is ValueError

    def fake_len(value: object) -> int:
        return 0

    fake_len.__module__, fake_len.__qualname__ = "builtins", "len"
    with pytest.raises(RejectedValue):
        encode_value(fake_len)


def test_a_subclass_that_lies_crosses_as_its_base_data_and_the_receivers_type() -> None:
    class Lying(collections.Counter):
        def __eq__(self, other: object) -> bool:
            return True

        __hash__ = None  # type: ignore[assignment]

    back = _round_trip(Lying("aab"))
    assert type(back) is dict and back == {"a": 2, "b": 1} and back != {"a": 1}


def test_a_codec_without_references_refuses_objects() -> None:
    with pytest.raises(RejectedValue, match="not plain data"):
        Codec().encode(object())
