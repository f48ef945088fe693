"""The ``/generate`` answers the reference engine builds, shaped as SGLang 0.5.23 shapes them.

Two paths, as in SGLang:

* :func:`request_output`: a request that reached the model (prefilled) answers through
  SGLang's batch output path (``TokenizerManager._handle_batch_output``): ``prompt_tokens``,
  ``cached_tokens``, logprobs, ...; a running request that is aborted finishes this way too
  (the scheduler sets ``to_finish`` and the request leaves through the normal output).
* :func:`queued_abort_output`: a request aborted while still in the scheduler's waiting queue
  never reached the model; SGLang's scheduler pops it and sends an ``AbortReq`` back
  (``Scheduler.abort_request``, "Abort method 1"), and ``TokenizerManager._handle_abort_req``
  answers with ``id``, ``finish_reason``, ``weight_version``, ``e2e_latency``, the (empty)
  logprob fields and ``completion_tokens``: **no** ``prompt_tokens``, **no** ``cached_tokens``.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from services.reference_engine.engine import EngineRequest

# What SGLang's tokenizer manager says for a request aborted in the waiting queue when the
# AbortReq carries no message (``/abort_request``, abort_all, ``/pause_generation`` abort).
QUEUED_ABORT_MESSAGE = "Abort in waiting queue"


def request_output(
    request: EngineRequest, tokenizer: Any, weight_version: str, scripted: bool
) -> dict[str, Any]:
    """The answer (or streamed chunk) of a request that was prefilled."""
    params = request.sampling
    finish = request.finish
    meta: dict[str, Any] = {
        "id": request.rid,
        "finish_reason": finish,
        "prompt_tokens": len(request.prompt),
        "weight_version": weight_version,
        "total_retractions": 0,
        "completion_tokens": len(request.output_ids),
        "cached_tokens": request.cached_tokens,
    }
    if scripted:
        meta["scripted"] = True
    if request.return_logprob:
        meta.update(_logprob_fields(request, tokenizer))
    if finish is not None:
        meta["e2e_latency"] = time.time() - request.created
    text = _text(request, tokenizer, params, finish)
    return {"text": text, "output_ids": list(request.output_ids), "meta_info": meta}


def queued_abort_output(
    request: EngineRequest, weight_version: str, scripted: bool
) -> dict[str, Any]:
    """The answer of a request aborted before its prefill, keyed and ordered as
    ``TokenizerManager._handle_abort_req`` (sglang/srt/managers/tokenizer_manager.py) builds
    it; with ``return_logprob`` its logprob lists are empty (``add_logprob_to_meta_info`` over
    a request state that never received any)."""
    meta: dict[str, Any] = {
        "id": request.rid,
        "finish_reason": request.finish,
        "weight_version": weight_version,
        "e2e_latency": time.time() - request.created,
    }
    if request.return_logprob:
        meta["input_token_logprobs"] = []
        meta["output_token_logprobs"] = []
        meta["output_token_logprobs_length"] = 0
        if request.top_logprobs_num > 0:
            meta["input_top_logprobs"] = []
            meta["output_top_logprobs"] = []
    meta["completion_tokens"] = 0
    if scripted:
        meta["scripted"] = True
    return {"text": "", "output_ids": [], "meta_info": meta}


def _text(request: EngineRequest, tokenizer: Any, params: Any, finish: Any) -> str:
    text_ids = request.output_ids
    # SGLang leaves a matched stop token out of the text (not out of output_ids).
    trim_token = finish is not None and finish["type"] == "stop" and not params.no_stop_trim
    if trim_token and isinstance(finish.get("matched"), int) and text_ids:
        text_ids = text_ids[:-1]
    text: str = tokenizer.decode(text_ids, skip_special_tokens=params.skip_special_tokens)
    if finish is not None and isinstance(finish.get("matched"), str) and not params.no_stop_trim:
        position = text.find(finish["matched"])
        if position != -1:
            text = text[:position]
    return text


def _logprob_fields(request: EngineRequest, tokenizer: Any) -> dict[str, Any]:
    """``input_token_logprobs``, ``output_token_logprobs`` (+ its length) and, with
    ``top_logprobs_num``, the top lists (SGLang's ``add_logprob_to_meta_info``)."""
    texts = (
        [tokenizer.decode([t]) for t in request.output_ids]
        if request.return_text_in_logprobs
        else None
    )
    fields: dict[str, Any] = {
        "input_token_logprobs": request.input_logprobs,
        "output_token_logprobs": [
            [lp, tok, texts[i] if texts else None]
            for i, (lp, tok) in enumerate(
                zip(request.output_logprobs, request.output_ids, strict=True)
            )
        ],
        "output_token_logprobs_length": len(request.output_ids),
    }
    if request.top_logprobs_num > 0:
        fields["input_top_logprobs"] = [None] * len(request.input_logprobs)
        fields["output_top_logprobs"] = (
            [
                [[lp, tok, tokenizer.decode([tok])] for lp, tok, _ in row]
                for row in request.output_top
            ]
            if request.return_text_in_logprobs
            else request.output_top
        )
    return fields
