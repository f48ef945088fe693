"""Property tests of the trajectory wire format and of segment flattening.

``Turn``/``Segment`` survive ``to_bytes`` -> ``from_bytes`` exactly, so does a record through
``to_entries`` -> ``from_entries``; any truncation or extension of a turn's bytes is a
``ProtocolError``, never a silently different turn; ``Segment.flatten`` lays out exactly the
segment's tokens after the prompt, with mask, logprobs and versions on the generated ones.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.protocol import ProtocolError, Segment, TrajectoryMeta, TrajectoryRecord, Turn
from tests.support.protocol_strategies import segments, turns

PROPERTY = settings(max_examples=40, deadline=None)


@PROPERTY
@given(turns())
def test_a_turn_round_trips_through_its_bytes(turn: Turn) -> None:
    assert Turn.from_bytes(turn.to_bytes()) == turn


@PROPERTY
@given(turns(), st.data())
def test_a_cut_or_extended_turn_is_a_protocol_error(turn: Turn, data: st.DataObject) -> None:
    raw = turn.to_bytes()
    cut = data.draw(st.integers(min_value=0, max_value=len(raw) - 1), label="cut")
    with pytest.raises(ProtocolError):
        Turn.from_bytes(raw[:cut])
    extra = data.draw(st.binary(min_size=1, max_size=8), label="extra")
    with pytest.raises(ProtocolError):
        Turn.from_bytes(raw + extra)


@PROPERTY
@given(segments(max_turns=0))
def test_a_segment_header_round_trips(segment: Segment) -> None:
    back = Segment.from_header_bytes(segment.header_bytes())
    assert (back.prompt_ids, back.reason, back.started_at) == (
        segment.prompt_ids,
        segment.reason,
        segment.started_at,
    )


@PROPERTY
@given(st.lists(segments(max_turns=2), max_size=2))
def test_a_record_round_trips_through_its_entries(parts: list[Segment]) -> None:
    meta = TrajectoryMeta(trajectory_id="t-1", group_id="g-1")
    record = TrajectoryRecord(meta=meta, segments=parts)
    back = TrajectoryRecord.from_entries(meta, record.to_entries())
    assert back.segments == record.segments
    assert back.n_tokens == record.n_tokens


@PROPERTY
@given(segments())
def test_flatten_lays_out_the_post_prompt_tokens(segment: Segment) -> None:
    flat = segment.flatten()
    n = len(flat["tokens"])
    assert len(flat["action_mask"]) == len(flat["logprobs"]) == len(flat["versions"]) == n
    assert flat["tokens"] == segment.token_ids()[len(segment.prompt_ids) :]
    # walk the turns independently: observation span (mask 0), then output span (mask 1)
    position = 0
    for turn in segment.turns:
        for _ in turn.observation_ids:
            assert flat["action_mask"][position] == 0
            assert flat["logprobs"][position] == 0.0 and flat["versions"][position] == -1
            position += 1
        for token, logprob in zip(turn.output_ids, turn.output_logprobs, strict=True):
            assert flat["tokens"][position] == token and flat["action_mask"][position] == 1
            assert flat["logprobs"][position] == logprob
            assert flat["versions"][position] == turn.weight_version
            position += 1
    assert position == n
