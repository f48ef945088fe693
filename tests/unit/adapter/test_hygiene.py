"""JSON bodies the json module accepts but the adapter refuses (adapter.hygiene)."""

from __future__ import annotations

import pytest

from adapter.errors import APIError
from adapter.hygiene import MAX_JSON_DEPTH, decode_json


def refused(raw: bytes) -> APIError:
    with pytest.raises(APIError) as info:
        decode_json(raw)
    assert info.value.status == 400 and info.value.code == "invalid_json"
    return info.value


def test_depth_bound_is_exact() -> None:
    ok = b"[" * MAX_JSON_DEPTH + b"]" * MAX_JSON_DEPTH
    assert decode_json(ok) is not None
    deeper = b"[" * (MAX_JSON_DEPTH + 1) + b"]" * (MAX_JSON_DEPTH + 1)
    assert "nested more than" in refused(deeper).message
    objects = b'{"a": ' * (MAX_JSON_DEPTH + 1) + b"1" + b"}" * (MAX_JSON_DEPTH + 1)
    error = refused(objects)
    assert error.param == "a" and "a.a.a" in error.message


def test_recursion_in_the_decoder_is_a_400() -> None:
    assert "nested too deeply" in refused(b"[" * 100_000 + b"]" * 100_000).message


@pytest.mark.parametrize(
    "raw",
    [
        b'{"x": "\\ud800"}',
        b'{"x": ["ok", "\\uDC00"]}',
        b'{"x": {"\\ud9ff": 1}}',
        b'{"x": "\\ude00\\ud83d"}',  # a pair in the wrong order is two lone surrogates
        b'{"x": "\xed\xa0\x80"}',  # a surrogate encoded as UTF-8 bytes
    ],
)
def test_lone_surrogates_are_refused_with_their_place(raw: bytes) -> None:
    error = refused(raw)
    assert "surrogate" in error.message and error.param == "x"


def test_valid_unicode_passes() -> None:
    value = decode_json('{"x": "\\ud83d\\ude00 é \\\\ud800", "ü": "日本"}'.encode())
    assert value == {"x": "\U0001f600 é \\ud800", "ü": "日本"}


@pytest.mark.parametrize(
    ("raw", "fragment"),
    [
        (b'{"x": NaN}', "NaN is not a JSON number"),
        (b'{"x": -Infinity}', "-Infinity is not a JSON number"),
        (b'{"x": 1e400}', "overflows"),
        (b'{"x": ' + b"9" * 5000 + b"}", "not valid JSON"),
        (b'{"x": 1', "not valid JSON"),
        (b'{"x": "\xff"}', "not valid JSON"),
    ],
)
def test_non_json_numbers_and_bad_bytes(raw: bytes, fragment: str) -> None:
    assert fragment in refused(raw).message
