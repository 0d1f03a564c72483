"""Free JSON <-> Struct: any JSON value survives the round trip, at any depth."""

from __future__ import annotations

import math

import pytest
from bidi_responses.codec import (
    JSONObject,
    JSONValue,
    dict_to_struct,
    restore_integers,
    struct_to_dict,
)
from bidi_responses.codec.depth import PROTOBUF_DEFAULT_DEPTH
from hypothesis import given
from hypothesis import strategies as st

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**53) + 1, 2**53 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=10),
)
json_values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=20,
)


@given(st.dictionaries(st.text(max_size=6), json_values, max_size=5))
def test_round_trip_gives_the_json_back_with_its_integers(value: JSONObject) -> None:
    assert restore_integers(struct_to_dict(dict_to_struct(value))) == restore_integers(value)


def test_numbers_come_back_as_doubles_until_their_integers_are_restored() -> None:
    decoded = struct_to_dict(dict_to_struct({"n": 3, "x": 1.5, "big": 2**60}))
    assert decoded == {"n": 3.0, "x": 1.5, "big": float(2**60)}
    assert type(decoded["n"]) is float
    restored = restore_integers(decoded)
    assert type(restored["n"]) is int
    assert type(restored["big"]) is float  # beyond 2**53 a double is not an exact integer


def test_non_finite_numbers_pass_through_for_the_core_to_refuse() -> None:
    decoded = struct_to_dict(dict_to_struct({"nan": math.nan, "inf": math.inf}))
    assert math.isnan(decoded["nan"])
    assert decoded["inf"] == math.inf


def test_nesting_deeper_than_protobufs_limit_is_built() -> None:
    value: JSONValue = "leaf"
    for _ in range(PROTOBUF_DEFAULT_DEPTH):
        value = {"k": [value]}
    assert struct_to_dict(dict_to_struct({"root": value})) == {"root": value}


def test_a_value_json_cannot_hold_is_refused_by_type() -> None:
    with pytest.raises(TypeError, match="set"):
        dict_to_struct({"bad": {1, 2}})
