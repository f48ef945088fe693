"""Property tests of the packed token arrays: every int32 / float32 round-trips exactly,
the bytes are little-endian, and a length that is not a multiple of 4 is refused."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.protocol.packing import float_array, int_array, pack, unpack
from tests.support.protocol_strategies import INT32

PROPERTY = settings(max_examples=100, deadline=None)


@PROPERTY
@given(st.lists(INT32, max_size=64))
def test_int32_ids_round_trip_as_little_endian(values: list[int]) -> None:
    data = pack(int_array(values))
    assert data == struct.pack(f"<{len(values)}i", *values)  # the wire layout, independently
    assert list(unpack("i", data)) == values


@PROPERTY
@given(st.lists(st.floats(width=32), max_size=64))
def test_float32_logprobs_round_trip_bit_for_bit(values: list[float]) -> None:
    data = pack(float_array(values))
    assert data == struct.pack(f"<{len(values)}f", *values)
    back = unpack("f", data)
    assert pack(back) == data  # bit-exact, NaN payloads included
    assert [x for x in back if x == x] == [x for x in values if x == x]


@PROPERTY
@given(st.binary(max_size=64).filter(lambda b: len(b) % 4 != 0), st.sampled_from("if"))
def test_a_length_that_is_not_a_multiple_of_4_is_refused(data: bytes, typecode: str) -> None:
    with pytest.raises(ValueError, match="multiple of 4"):
        unpack(typecode, data)


@PROPERTY
@given(st.binary(max_size=64).map(lambda b: b[: len(b) - len(b) % 4]))
def test_any_aligned_bytes_unpack_and_pack_back_unchanged(data: bytes) -> None:
    for typecode in "if":
        assert pack(unpack(typecode, data)) == data
