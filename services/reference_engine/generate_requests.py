"""Validation of a ``/generate`` body into engine requests (a ValueError is the route's 400).

Follows SGLang's ``GenerateReqInput`` normalisation (single or batch, ``text`` or ``input_ids``,
per-item or shared parameters); see :mod:`services.reference_engine.server` for the deliberate
deviations.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

from pydantic import ValidationError

from services.protocol.sglang import (
    IGNORED_SAMPLING_FIELDS,
    NEUTRAL_SAMPLING_DEFAULTS,
    GenerateRequest,
    SamplingParams,
)
from services.reference_engine.engine import EngineRequest
from services.reference_engine.script import ScriptError
from services.reference_engine.state import ServerState

logger = logging.getLogger("services.reference_engine.server")


def _sampling_params(raw: dict[str, Any]) -> SamplingParams:
    if not isinstance(raw, dict):
        raise ValueError("sampling_params must be a JSON object")
    kept: dict[str, Any] = {}
    for key, value in raw.items():
        if key in IGNORED_SAMPLING_FIELDS or value is None:
            continue
        if key in NEUTRAL_SAMPLING_DEFAULTS:
            if value not in (NEUTRAL_SAMPLING_DEFAULTS[key], None):
                raise ValueError(
                    f"sampling parameter {key}={value!r} is not supported by the reference "
                    f"engine (only {NEUTRAL_SAMPLING_DEFAULTS[key]!r})"
                )
            continue
        kept[key] = value
    unknown = sorted(set(kept) - set(SamplingParams.model_fields))
    if unknown:
        raise ValueError(f"Unknown sampling parameter(s): {unknown}")
    try:
        return SamplingParams(**kept)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in exc.errors()
        )
        raise ValueError(f"Invalid sampling_params: {problems}") from exc


def _per_item(value: Any, count: int, name: str) -> list[Any]:
    if isinstance(value, list):
        if len(value) != count:
            raise ValueError(f"{name} has {len(value)} entries for a batch of {count}")
        return value
    return [value] * count


def build_requests(body: GenerateRequest, state: ServerState) -> list[EngineRequest]:
    """Turn a /generate body into validated engine requests (ValueError -> HTTP 400)."""
    runner = state.runner
    if (body.text is None) == (body.input_ids is None):
        raise ValueError("Either text or input_ids should be provided (exactly one of them).")
    prompts: list[list[int]]
    if body.input_ids is not None:
        if not body.input_ids:
            raise ValueError("input_ids must not be empty")
        batch = body.input_ids if body.is_batch else [body.input_ids]
        prompts = [list(p) for p in batch]  # type: ignore[arg-type]
    else:
        texts = body.text if isinstance(body.text, list) else [body.text]
        prompts = [
            runner.tokenizer.encode(t, add_special_tokens=False) for t in texts if t is not None
        ]
    count = len(prompts)
    if count == 0:
        raise ValueError("the batch is empty")
    if body.stream and body.is_batch:
        raise ValueError("stream is not supported for batch requests by the reference engine")
    rids = _per_item(body.rid, count, "rid") if body.rid is not None else [None] * count
    if body.rid is not None and not isinstance(body.rid, list) and count > 1:
        raise ValueError("rid must be a list for a batch request")
    samplings = _per_item(body.sampling_params or {}, count, "sampling_params")
    return_logprobs = _per_item(body.return_logprob, count, "return_logprob")
    starts = _per_item(body.logprob_start_len, count, "logprob_start_len")
    tops = _per_item(body.top_logprobs_num, count, "top_logprobs_num")
    requests = []
    for i, prompt in enumerate(prompts):
        where = f"request {i}: " if count > 1 else ""
        try:
            requests.append(
                _one_request(
                    prompt,
                    _sampling_params(samplings[i] or {}),
                    rids[i],
                    bool(return_logprobs[i]),
                    int(starts[i]),
                    int(tops[i]),
                    body,
                    state,
                )
            )
        except ValueError as exc:
            raise ValueError(f"{where}{exc}") from exc
    return requests


def _one_request(
    prompt: list[int],
    sampling: SamplingParams,
    rid: str | None,
    return_logprob: bool,
    logprob_start_len: int,
    top_logprobs_num: int,
    body: GenerateRequest,
    state: ServerState,
) -> EngineRequest:
    runner = state.runner
    if not prompt:
        raise ValueError("input_ids must not be empty")
    bad = [t for t in prompt if not 0 <= t < runner.vocab_size]
    if bad:
        raise ValueError(
            f"The input_ids contain values outside the vocabulary [0, {runner.vocab_size}): "
            f"{bad[:5]}"
        )
    context = runner.context_length
    if len(prompt) >= context:
        raise ValueError(
            f"The input ({len(prompt)} tokens) is longer than the model's context length "
            f"({context} tokens)."
        )
    if len(prompt) + sampling.max_new_tokens > context:
        raise ValueError(
            f"Requested token count exceeds the model's maximum context length of {context} "
            f"tokens. You requested a total of {len(prompt) + sampling.max_new_tokens} tokens: "
            f"{len(prompt)} tokens from the input messages and {sampling.max_new_tokens} tokens "
            "for the completion. Please reduce the number of tokens in the input messages or "
            "the completion to fit within the limit."
        )
    if top_logprobs_num < 0:
        raise ValueError("top_logprobs_num must be >= 0")
    if rid is not None and (not isinstance(rid, str) or not rid):
        raise ValueError("rid must be a non-empty string")
    forced = None
    if state.script is not None:
        prompt_text = runner.tokenizer.decode(prompt, skip_special_tokens=False)
        try:
            script, turn, forced = state.script.select(prompt_text)
        except ScriptError as exc:
            raise ValueError(str(exc)) from exc
        logger.info("SCRIPTED: replaying script line %d turn %d", script.line, turn)
    return EngineRequest(
        rid=rid or uuid.uuid4().hex,
        prompt=prompt,
        sampling=sampling,
        sink=no_sink,
        return_logprob=return_logprob,
        logprob_start_len=logprob_start_len,
        top_logprobs_num=top_logprobs_num,
        return_text_in_logprobs=body.return_text_in_logprobs,
        stream=body.stream,
        forced=forced,
    )


def no_sink(output: dict[str, Any], finished: bool) -> None:
    raise RuntimeError("request submitted without an output sink")
