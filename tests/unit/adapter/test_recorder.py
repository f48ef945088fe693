"""Token-exact incremental recording (adapter.recorder) on the tiny model's real tokenizer.

Expected token ids are computed here from text the test writes out by hand (the Qwen chat
format) with transformers' tokenizer (the reference: the adapter's own tokenizer and template
renderer are torch-free reimplementations), never from the recorder's own rendering.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import pytest

from adapter.messages import template_messages
from adapter.openai_schema import ChatMessage
from adapter.recorder import Recorder, SegmentState, TurnPlan, TurnResult
from adapter.rendering import Renderer
from services.protocol import SegmentReason, TrajectoryMeta, TrajectoryRecord

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "run a command",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
        },
    }
]


@pytest.fixture(scope="module")
def renderer(tiny_model_dir: Path) -> Renderer:
    return Renderer(tiny_model_dir)


@pytest.fixture(scope="module")
def coder_renderer(tiny_coder_dir: Path) -> Renderer:
    return Renderer(tiny_coder_dir)


@functools.cache
def _reference(model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_dir))


def hf(renderer: Renderer) -> Any:
    """transformers' tokenizer of ``renderer``'s model: the reference for ids and templates."""
    return _reference(renderer.model_dir)


def msgs(raw: list[dict[str, Any]]) -> list[ChatMessage]:
    return [ChatMessage.model_validate(m) for m in raw]


def plan(
    rec: Recorder, state: SegmentState | None, raw: list[dict[str, Any]], tools: Any = TOOLS,
    as_object: bool = False, n_segments: int = 0,
) -> TurnPlan:  # fmt: skip
    m = msgs(raw)
    return rec.plan(state, m, template_messages(m, as_object), tools, n_segments)


def result(ids: list[int], finish: str = "stop", version: int = 0) -> TurnResult:
    return TurnResult(
        output_ids=ids,
        output_logprobs=[-0.5 - i / 100 for i in range(len(ids))],
        weight_version=version,
        finish_reason=finish,
    )


FIRST = [
    {"role": "system", "content": "You are a careful engineer."},
    {"role": "user", "content": "List the files."},
]
CALL_TEXT = '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>'
ASSISTANT = {
    "role": "assistant",
    "content": None,
    "tool_calls": [
        {
            "id": "call_0",
            "type": "function",
            "function": {"name": "bash", "arguments": '{"command": "ls"}'},
        }
    ],
}
TOOL_RESULT = {"role": "tool", "tool_call_id": "call_0", "name": "bash", "content": "a.py\nb.py"}
OBS_TEXT = (
    "\n<|im_start|>user\n<tool_response>\na.py\nb.py\n</tool_response><|im_end|>\n"
    "<|im_start|>assistant\n"
)


def first_turn(renderer: Renderer, rec: Recorder) -> tuple[TurnPlan, SegmentState, list[int]]:
    p = plan(rec, None, FIRST)
    out = [*renderer.encode(CALL_TEXT), hf(renderer).convert_tokens_to_ids("<|im_end|>")]
    committed = rec.commit(None, p, result(out), ChatMessage.model_validate(ASSISTANT))
    return p, committed.state, out


def test_first_request_opens_segment_with_the_rendered_prompt(renderer: Renderer) -> None:
    rec = Recorder(renderer)
    p = plan(rec, None, FIRST)
    expected = hf(renderer).apply_chat_template(
        FIRST, tools=TOOLS, add_generation_prompt=True, tokenize=False
    )
    assert expected.endswith("<|im_start|>user\nList the files.<|im_end|>\n<|im_start|>assistant\n")
    assert p.reason is SegmentReason.INITIAL
    assert (
        p.input_ids == p.prompt_ids == hf(renderer)(expected, add_special_tokens=False)["input_ids"]
    )
    assert p.observation_ids == []


def test_continuation_appends_only_the_new_tokens(renderer: Renderer) -> None:
    rec = Recorder(renderer)
    p0, state, out = first_turn(renderer, rec)
    before = state.token_ids.tolist()
    p1 = plan(rec, state, [*FIRST, ASSISTANT, TOOL_RESULT])
    assert p1.reason is None
    assert p1.segment_index == 0
    assert p1.observation_ids == hf(renderer)(OBS_TEXT, add_special_tokens=False)["input_ids"]
    assert p1.input_ids == p0.input_ids + out + p1.observation_ids
    assert state.token_ids.tolist() == before  # planning changes nothing


def test_recorded_segment_is_exactly_prompt_outputs_and_observations(renderer: Renderer) -> None:
    rec = Recorder(renderer)
    p0 = plan(rec, None, FIRST)
    eos = hf(renderer).convert_tokens_to_ids("<|im_end|>")
    out0 = [*renderer.encode(CALL_TEXT), eos]
    c0 = rec.commit(None, p0, result(out0, version=3), ChatMessage.model_validate(ASSISTANT))
    p1 = plan(rec, c0.state, [*FIRST, ASSISTANT, TOOL_RESULT])
    out1 = [*renderer.encode("Done."), eos]
    c1 = rec.commit(
        c0.state, p1, result(out1, version=4), ChatMessage(role="assistant", content="Done.")
    )
    record = TrajectoryRecord.from_entries(
        TrajectoryMeta(trajectory_id="t"), c0.entries + c1.entries
    )
    assert len(record.segments) == 1
    seg = record.segments[0]
    assert list(seg.prompt_ids) == p0.prompt_ids
    assert [list(t.output_ids) for t in seg.turns] == [out0, out1]
    assert [t.weight_version for t in seg.turns] == [3, 4]
    assert list(seg.turns[1].observation_ids) == p1.observation_ids
    flat = seg.flatten()
    assert flat["action_mask"] == [1] * len(out0) + [0] * len(p1.observation_ids) + [1] * len(out1)
    # The generated text is what the template renders for the returned messages, so the whole
    # segment decodes to the chat-template rendering of the full conversation.
    full = hf(renderer).apply_chat_template(
        [*FIRST, ASSISTANT, TOOL_RESULT, {"role": "assistant", "content": "Done."}],
        tools=TOOLS,
        tokenize=False,
    )
    assert hf(renderer).decode(seg.token_ids()) + "\n" == full
    assert c1.state.token_ids.tolist() == seg.token_ids()
    assert c0.counters == {
        "turns": 1, "generated_tokens": len(out0), "observation_tokens": 0, "segments": 1,
        "prompt_tokens": len(p0.prompt_ids),
    }  # fmt: skip


def test_truncated_output_gets_the_end_of_turn_marker_as_observation(renderer: Renderer) -> None:
    rec = Recorder(renderer)
    p0 = plan(rec, None, FIRST)
    out = renderer.encode("I will look at the fi")  # stopped by max_tokens: no <|im_end|>
    returned = ChatMessage(role="assistant", content="I will look at the fi")
    c0 = rec.commit(None, p0, result(out, finish="length"), returned)
    assert not c0.state.ends_with_eot
    user = {"role": "user", "content": "go on"}
    p1 = plan(rec, c0.state, [*FIRST, returned.model_dump(exclude_none=True), user])
    text = "<|im_end|>\n<|im_start|>user\ngo on<|im_end|>\n<|im_start|>assistant\n"
    assert p1.reason is None
    assert p1.observation_ids == hf(renderer)(text, add_special_tokens=False)["input_ids"]


def test_echo_with_other_whitespace_and_key_order_continues(renderer: Renderer) -> None:
    rec = Recorder(renderer)
    _, state, _ = first_turn(renderer, rec)
    echoed = json.loads(json.dumps(ASSISTANT))
    echoed["content"] = ""
    echoed["tool_calls"][0]["function"]["arguments"] = '{ "command" :"ls" }'
    echoed["tool_calls"][0]["id"] = "call_other"
    p1 = plan(rec, state, [*FIRST, echoed, TOOL_RESULT])
    assert p1.reason is None


def test_rewritten_assistant_opens_a_new_segment(renderer: Renderer) -> None:
    rec = Recorder(renderer)
    _, state, _ = first_turn(renderer, rec)
    rewritten = json.loads(json.dumps(ASSISTANT))
    rewritten["tool_calls"][0]["function"]["arguments"] = '{"command": "ls -la"}'
    new = [*FIRST, rewritten, TOOL_RESULT]
    p1 = plan(rec, state, new)
    assert p1.reason is SegmentReason.HISTORY_MISMATCH
    assert p1.segment_index == 1
    whole = hf(renderer).apply_chat_template(
        new, tools=TOOLS, add_generation_prompt=True, tokenize=False
    )
    assert p1.prompt_ids == hf(renderer)(whole, add_special_tokens=False)["input_ids"]
    committed = rec.commit(state, p1, result([5, 6]), ChatMessage(role="assistant", content="x"))
    assert committed.counters["history_mismatch"] == 1
    assert committed.counters["segments"] == 1
    assert committed.entries[0][:4] == b"SWS1"  # a segment header precedes the turn


def test_condensed_history_opens_a_new_segment(renderer: Renderer) -> None:
    rec = Recorder(renderer)
    _, state, _ = first_turn(renderer, rec)
    condensed = [FIRST[0], {"role": "user", "content": "Summary: listed files."}]
    assert plan(rec, state, condensed).reason is SegmentReason.HISTORY_MISMATCH


def test_changed_rendering_of_old_history_is_a_prefix_mismatch(renderer: Renderer) -> None:
    rec = Recorder(renderer)
    _, state, _ = first_turn(renderer, rec)
    other_tools = [{**TOOLS[0], "function": {**TOOLS[0]["function"], "description": "changed"}}]
    p1 = plan(rec, state, [*FIRST, ASSISTANT, TOOL_RESULT], tools=other_tools)
    assert p1.reason is SegmentReason.PREFIX_MISMATCH


def test_lost_state_of_a_recorded_trajectory_starts_a_counted_segment(renderer: Renderer) -> None:
    rec = Recorder(renderer)
    p = plan(rec, None, FIRST, n_segments=2)
    assert p.reason is SegmentReason.HISTORY_MISMATCH
    assert p.segment_index == 2


def test_coder_template_continuation(coder_renderer: Renderer) -> None:
    rec = Recorder(coder_renderer)
    p0 = plan(rec, None, FIRST, as_object=True)
    call = (
        "<tool_call>\n<function=bash>\n<parameter=command>\nls\n</parameter>\n"
        "</function>\n</tool_call>"
    )
    eos = hf(coder_renderer).convert_tokens_to_ids("<|im_end|>")
    out = [*coder_renderer.encode(call), eos]
    c0 = rec.commit(None, p0, result(out), ChatMessage.model_validate(ASSISTANT))
    p1 = plan(rec, c0.state, [*FIRST, ASSISTANT, TOOL_RESULT], as_object=True)
    text = (
        "\n<|im_start|>user\n<tool_response>\na.py\nb.py\n</tool_response>\n<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert p1.reason is None
    assert p1.observation_ids == hf(coder_renderer)(text, add_special_tokens=False)["input_ids"]


def test_commit_rejects_mismatched_logprobs(renderer: Renderer) -> None:
    rec = Recorder(renderer)
    p0 = plan(rec, None, FIRST)
    bad = TurnResult(
        output_ids=[1, 2], output_logprobs=[-1.0], weight_version=0, finish_reason="stop"
    )
    with pytest.raises(ValueError, match="2 ids and 1 logprobs"):
        rec.commit(None, p0, bad, ChatMessage(role="assistant", content="x"))


def test_old_message_rendered_differently_is_a_prefix_mismatch(renderer: Renderer) -> None:
    """Whitespace-only edits pass the message comparison, but the rendering must still match."""
    rec = Recorder(renderer)
    _, state, _ = first_turn(renderer, rec)
    edited = [FIRST[0], {"role": "user", "content": "List the files.  "}]
    p1 = plan(rec, state, [*edited, ASSISTANT, TOOL_RESULT])
    assert p1.reason is SegmentReason.PREFIX_MISMATCH
