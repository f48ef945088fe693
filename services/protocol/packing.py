"""Binary packing of token data: int32 token ids / versions and float32 log-probabilities.

Token data never travels as JSON lists: a turn's ids and logprobs are little-endian packed arrays
(4 bytes per id, 4 per logprob), which keeps a recorded generated token at 8 bytes and an
observation token at 4 bytes.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Iterable

_LITTLE = sys.byteorder == "little"


def int_array(values: Iterable[int] = ()) -> array:
    return array("i", values)


def float_array(values: Iterable[float] = ()) -> array:
    return array("f", values)


def pack(values: array) -> bytes:
    """Little-endian bytes of an int32 ('i') or float32 ('f') array."""
    if values.typecode not in ("i", "f") or values.itemsize != 4:
        raise ValueError(f"only 4-byte 'i'/'f' arrays are packed, got {values.typecode!r}")
    if _LITTLE:
        return values.tobytes()
    swapped = array(values.typecode, values)
    swapped.byteswap()
    return swapped.tobytes()


def unpack(typecode: str, data: bytes | memoryview) -> array:
    if typecode not in ("i", "f"):
        raise ValueError(f"unknown typecode {typecode!r}")
    if len(data) % 4:
        raise ValueError(f"packed {typecode!r} data has {len(data)} bytes, not a multiple of 4")
    out = array(typecode)
    out.frombytes(bytes(data))
    if not _LITTLE:
        out.byteswap()
    return out
