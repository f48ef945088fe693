"""Token-exact incremental recording of one trajectory (DESIGN.md "Appending only new tokens").

The engine is fed token ids, never text, and the ids it was fed are exactly the ids recorded:

* the first request of a trajectory renders the whole conversation with the chat template
  (generation prompt included) and tokenises it: that is the prompt of segment 0;
* a later request *continues* the segment when (1) its messages start with the previous
  request's messages followed by an assistant message equal to the one the adapter returned
  (compared after normalising whitespace and tool-call argument JSON, see
  :func:`adapter.messages.canonical`), and (2) the rendering of ``previous messages + that
  assistant message`` without a generation prompt is a string prefix of the rendering of the new
  messages with one. Then only the new text is tokenised -- template glue after the assistant's
  end-of-turn marker (the ``\\n`` after ``<|im_end|>``), the new tool results / user messages,
  and the generation prompt -- and appended after the generated ids as observation tokens
  (action mask 0). The generated ids end with the end-of-turn token the model produced; when the
  model stopped for another reason (length, a stop string) the marker itself is part of the
  observation, so the sequence stays what the template would show the model;
* any failed check opens a new segment whose prompt is the full rendering of the new
  conversation, and the reason is counted (``history_mismatch`` / ``prefix_mismatch``). History is
  never re-tokenised inside a segment.

A prompt that cannot fit the context window is refused while planning
(:class:`adapter.rendering.ContextLengthError`), before or right after tokenising its new text.

:class:`Recorder` is pure bookkeeping: :meth:`Recorder.plan` decides what to send to the engine
(it changes nothing, so a request that fails leaves the record as it was), and
:meth:`Recorder.commit` turns the engine's answer into a :class:`Turn` (and, for a new segment, a
:class:`Segment` header) plus the binary entries to write through to the store.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from typing import Any

from adapter.messages import canonical
from adapter.openai_schema import ChatMessage
from adapter.rendering import Renderer
from services.protocol import Segment, SegmentReason, Turn
from services.protocol.packing import float_array, int_array

MessageKey = tuple[Any, ...]


@dataclass
class SegmentState:
    """What the recorder remembers about a trajectory's current segment between requests."""

    index: int  # position of the segment in the record (0 = first)
    token_ids: array  # every token of the segment so far: prompt, observations, outputs
    messages: list[MessageKey]  # canonical keys of the last request's messages
    returned: MessageKey  # canonical key of the assistant message the adapter answered
    ends_with_eot: bool  # the last generated token is the end-of-turn marker
    template_msgs: list[dict[str, Any]]  # the last request's messages as rendered
    tools: list[dict[str, Any]] | None  # the last request's tools as rendered
    n_turns: int = 1


@dataclass(frozen=True)
class TurnPlan:
    """What to send to the engine for one request, and how it will be recorded."""

    input_ids: list[int]
    observation_ids: list[int]  # continuing: the appended tokens; new segment: empty
    prompt_ids: list[int] | None  # new segment only: its prompt (== input_ids)
    reason: SegmentReason | None  # None when the request continues the segment
    segment_index: int
    message_keys: list[MessageKey] = field(repr=False)
    template_msgs: list[dict[str, Any]] = field(repr=False)
    tools: list[dict[str, Any]] | None = field(repr=False)

    @property
    def new_segment(self) -> bool:
        return self.reason is not None


@dataclass(frozen=True)
class TurnResult:
    """The engine's answer and the bookkeeping of one generate call."""

    output_ids: list[int]
    output_logprobs: list[float]
    weight_version: int  # of the first output token
    finish_reason: str
    engine: str = ""
    started_at: float = 0.0
    latency_s: float = 0.0
    queue_wait_s: float = 0.0
    cached_tokens: int = 0
    # (start index, version) per run when a token-mode refresh switched versions mid-turn.
    version_runs: list[tuple[int, int]] = field(default_factory=list)
    scripted: bool = False  # a replayed script, not the policy's samples (test machinery)


@dataclass(frozen=True)
class Committed:
    state: SegmentState
    turn: Turn
    entries: list[bytes]  # binary record entries to append, in order
    counters: dict[str, int]  # increments


class Recorder:
    """Plans and commits turns for any number of trajectories (state is passed in and out)."""

    def __init__(self, renderer: Renderer) -> None:
        self.renderer = renderer
        self.eot = renderer.end_of_turn
        self._eot_cache: dict[int, bool] = {}

    # -- planning ------------------------------------------------------------------------------

    def plan(
        self,
        state: SegmentState | None,
        messages: list[ChatMessage],
        template_msgs: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        n_segments: int = 0,
    ) -> TurnPlan:
        """Decide how to record a request; ``n_segments`` counts the record's segments so far
        (used when ``state`` is None: a fresh trajectory, or one whose state was evicted)."""
        keys = [canonical(m) for m in messages]
        if state is None:
            reason = SegmentReason.INITIAL if n_segments == 0 else SegmentReason.HISTORY_MISMATCH
            return self._new_segment(n_segments, reason, template_msgs, tools, keys)
        k = len(state.messages)
        if len(keys) <= k or keys[k] != state.returned or keys[:k] != state.messages:
            return self._new_segment(
                state.index + 1, SegmentReason.HISTORY_MISMATCH, template_msgs, tools, keys
            )
        # The old part is rendered from what the previous request really sent (its messages and
        # tools), so any change in how the history renders -- a tool list that changed, an old
        # message edited beyond whitespace -- fails the prefix check. Only the echoed assistant
        # message is taken from the new request: its own rendering is replaced by the generated
        # tokens anyway.
        head = self.renderer.render(
            [*state.template_msgs, template_msgs[k]], state.tools, add_generation_prompt=False
        )
        full = self.renderer.render(template_msgs, tools, add_generation_prompt=True)
        cut = head.rfind(self.eot)
        if not full.startswith(head) or cut < 0 or head[cut + len(self.eot) :].strip():
            return self._new_segment(
                state.index + 1, SegmentReason.PREFIX_MISMATCH, template_msgs, tools, keys, full
            )
        glue = head[cut + len(self.eot) :] if state.ends_with_eot else head[cut:]
        observation = self.renderer.encode_prompt(
            glue + full[len(head) :], known_tokens=len(state.token_ids)
        )
        input_ids = state.token_ids.tolist()
        input_ids.extend(observation)
        return TurnPlan(
            input_ids=input_ids,
            observation_ids=observation,
            prompt_ids=None,
            reason=None,
            segment_index=state.index,
            message_keys=keys,
            template_msgs=template_msgs,
            tools=tools,
        )

    def _new_segment(
        self,
        index: int,
        reason: SegmentReason,
        template_msgs: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        keys: list[MessageKey],
        rendered: str | None = None,
    ) -> TurnPlan:
        text = rendered or self.renderer.render(template_msgs, tools, add_generation_prompt=True)
        ids = self.renderer.encode_prompt(text)
        return TurnPlan(
            input_ids=ids,
            observation_ids=[],
            prompt_ids=ids,
            reason=reason,
            segment_index=index,
            message_keys=keys,
            template_msgs=template_msgs,
            tools=tools,
        )

    # -- committing ----------------------------------------------------------------------------

    def ends_with_eot(self, output_ids: list[int]) -> bool:
        if not output_ids:
            return False
        last = output_ids[-1]
        hit = self._eot_cache.get(last)
        if hit is None:
            hit = self.renderer.token_text(last) == self.eot
            self._eot_cache[last] = hit
        return hit

    def commit(
        self,
        state: SegmentState | None,
        plan: TurnPlan,
        result: TurnResult,
        returned: ChatMessage,
    ) -> Committed:
        if len(result.output_ids) != len(result.output_logprobs):
            raise ValueError(
                f"engine returned {len(result.output_ids)} ids and "
                f"{len(result.output_logprobs)} logprobs"
            )
        turn = _turn(plan, result)
        counters = {
            "turns": 1,
            "generated_tokens": len(result.output_ids),
            "observation_tokens": len(plan.observation_ids),
        }
        entries: list[bytes] = []
        if plan.reason is not None:
            assert plan.prompt_ids is not None
            segment = Segment(prompt_ids=int_array(plan.prompt_ids), reason=plan.reason)
            entries.append(segment.header_bytes())
            counters["segments"] = 1
            counters["prompt_tokens"] = len(plan.prompt_ids)
            if plan.reason is not SegmentReason.INITIAL:
                counters[str(plan.reason)] = 1
            n_turns = 1
        else:
            assert state is not None
            n_turns = state.n_turns + 1
        entries.append(turn.to_bytes())
        new_state = SegmentState(
            index=plan.segment_index,
            token_ids=_segment_tokens(state, plan, turn),
            messages=plan.message_keys,
            returned=canonical(returned),
            ends_with_eot=self.ends_with_eot(result.output_ids),
            template_msgs=plan.template_msgs,
            tools=plan.tools,
            n_turns=n_turns,
        )
        return Committed(state=new_state, turn=turn, entries=entries, counters=counters)


def _turn(plan: TurnPlan, result: TurnResult) -> Turn:
    """The record's turn for the engine's answer to ``plan``."""
    return Turn(
        observation_ids=int_array(plan.observation_ids),
        output_ids=int_array(result.output_ids),
        output_logprobs=float_array(result.output_logprobs),
        weight_version=result.weight_version,
        finish_reason=result.finish_reason,
        engine=result.engine,
        started_at=result.started_at,
        latency_s=result.latency_s,
        queue_wait_s=result.queue_wait_s,
        prompt_tokens=len(plan.input_ids),
        cached_tokens=result.cached_tokens,
        version_runs=list(result.version_runs),
        scripted=result.scripted,
    )


def _segment_tokens(state: SegmentState | None, plan: TurnPlan, turn: Turn) -> array:
    """Every token of the segment after ``turn``: the old buffer extended in place when the turn
    continues it (the old state is superseded: no O(n) copy), else the new prompt."""
    if plan.reason is None and state is not None:
        tokens = state.token_ids
        tokens.extend(turn.observation_ids)
    else:
        tokens = int_array(plan.input_ids)
    tokens.extend(turn.output_ids)
    return tokens
