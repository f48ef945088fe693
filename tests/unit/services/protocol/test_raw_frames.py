"""The ``/raw`` framing: round trips (through a real record) and refusal of damaged bodies."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.protocol import ProtocolError, Segment, SegmentReason, TrajectoryMeta, Turn
from services.protocol.packing import float_array, int_array
from services.protocol.raw_frames import decode_frames, encode_frames
from services.protocol.trajectory import TrajectoryRecord


def _record() -> TrajectoryRecord:
    turn = Turn(
        observation_ids=int_array([]),
        output_ids=int_array([5, 6, 7]),
        output_logprobs=float_array([-0.5, -1.0, -0.25]),
        weight_version=3,
        finish_reason="stop",
    )
    segment = Segment(prompt_ids=int_array([1, 2, 3, 4]), reason=SegmentReason.INITIAL)
    segment.turns.append(turn)
    record = TrajectoryRecord(meta=TrajectoryMeta(trajectory_id="t-1"))
    record.segments.append(segment)
    return record


def test_the_layout_is_a_u32_le_length_before_each_entry() -> None:
    # Written out by hand from the documented layout (docs/adapter.md), not from the encoder.
    assert encode_frames([b"ab", b"", b"\x00\x01\x02"]) == (
        b"\x02\x00\x00\x00ab" + b"\x00\x00\x00\x00" + b"\x03\x00\x00\x00\x00\x01\x02"
    )
    assert encode_frames([]) == b""


def test_a_record_survives_the_round_trip() -> None:
    record = _record()
    entries = record.to_entries()
    body = encode_frames(entries)
    decoded = decode_frames(body, expected_count=str(len(entries)))
    assert decoded == entries
    rebuilt = TrajectoryRecord.from_entries(record.meta, decoded)
    assert rebuilt.segments[0].token_ids() == [1, 2, 3, 4, 5, 6, 7]
    assert rebuilt.segments[0].turns[0].weight_version == 3


@given(st.lists(st.binary(max_size=64), max_size=20))
def test_any_entries_round_trip(entries: list[bytes]) -> None:
    assert decode_frames(encode_frames(entries), expected_count=len(entries)) == entries


@pytest.mark.parametrize(
    ("body", "count", "message"),
    [
        (b"\x05\x00", None, "length prefix needs 4"),
        (struct.pack("<I", 10) + b"short", None, "declares 10 bytes, 5 remain"),
        (encode_frames([b"a", b"b"]) + b"\x01", None, "truncated frame"),
        (encode_frames([b"a", b"b"]), 3, "says 3 entries, the body holds 2"),
        (encode_frames([b"a"]), "", "non-negative integer"),
        (encode_frames([b"a"]), "-1", "non-negative integer"),
        (encode_frames([b"a"]), "１", "non-negative integer"),
        (encode_frames([b"a"]), True, "must be a count"),
        (b"", "1", "says 1 entries, the body holds 0"),
    ],
)
def test_damaged_bodies_are_refused(body: bytes, count: int | str | None, message: str) -> None:
    with pytest.raises(ProtocolError, match=message):
        decode_frames(body, expected_count=count)


def test_a_body_cut_on_a_frame_boundary_is_caught_by_the_count() -> None:
    entries = _record().to_entries()
    body = encode_frames(entries)
    cut = body[: 4 + len(entries[0])]
    assert decode_frames(cut) == entries[:1]  # looks whole without the header
    with pytest.raises(ProtocolError, match="the body holds 1"):
        decode_frames(cut, expected_count=len(entries))
