"""Hypothesis strategies for the trajectory protocol's types (turns, segments, records).

Values stay inside what the wire format carries exactly: int32 token ids, float32 logprobs,
finite floats for the JSON header fields.
"""

from __future__ import annotations

from hypothesis import strategies as st

from services.protocol import Segment, SegmentReason, Turn
from services.protocol.packing import float_array, int_array

INT32 = st.integers(min_value=-(2**31), max_value=2**31 - 1)
TOKEN_IDS = st.lists(st.integers(min_value=0, max_value=2**31 - 1), max_size=8)
FLOAT32 = st.floats(width=32, allow_nan=False)
LOGPROB = st.floats(min_value=-50.0, max_value=0.0, width=32)
HEADER_FLOAT = st.floats(allow_nan=False, allow_infinity=False)
TEXT = st.text(max_size=8)


@st.composite
def turns(draw: st.DrawFn, min_outputs: int = 0) -> Turn:
    outputs = draw(st.lists(st.integers(0, 2**31 - 1), min_size=min_outputs, max_size=8))
    logprobs = draw(st.lists(LOGPROB, min_size=len(outputs), max_size=len(outputs)))
    return Turn(
        observation_ids=int_array(draw(TOKEN_IDS)),
        output_ids=int_array(outputs),
        output_logprobs=float_array(logprobs),
        weight_version=draw(st.integers(min_value=0, max_value=2**40)),
        finish_reason=draw(st.sampled_from(["stop", "length", "tool_calls"]) | TEXT),
        engine=draw(TEXT),
        started_at=draw(HEADER_FLOAT),
        latency_s=draw(HEADER_FLOAT),
        queue_wait_s=draw(HEADER_FLOAT),
        prompt_tokens=draw(st.integers(min_value=0, max_value=2**40)),
        cached_tokens=draw(st.integers(min_value=0, max_value=2**40)),
    )


@st.composite
def segments(draw: st.DrawFn, max_turns: int = 4, min_prompt: int = 0) -> Segment:
    return Segment(
        prompt_ids=int_array(
            draw(st.lists(st.integers(0, 2**31 - 1), min_size=min_prompt, max_size=8))
        ),
        turns=draw(st.lists(turns(), max_size=max_turns)),
        reason=draw(st.sampled_from(list(SegmentReason))),
        started_at=draw(HEADER_FLOAT),
    )
