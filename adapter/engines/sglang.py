"""Async client for SGLang's native HTTP API -- the only way the adapter talks to engines.

It speaks to a real SGLang server and to the reference engine alike (the same contract tests run
against both, see ``tests/integration/adapter/engines``). Every answer is validated;
anything that does not look like SGLang's wire format raises :class:`EngineProtocolError`
rather than propagating half-parsed data into a trajectory record.

Error model (what a caller can rely on):

* :class:`EngineUnavailableError` -- the engine could not serve the call: connection refused,
  timeout, broken connection, or a 5xx. ``tokens_produced`` says whether any output token may
  have reached the client; a non-streaming call never returns partial tokens, so it is always
  ``False`` here and the call can be retried on another engine.
* :class:`EngineProtocolError` (a kind of unavailability) -- the engine answered with something
  that is not the expected protocol.
* :class:`EngineRequestError` -- the engine rejected the request (4xx): retrying it elsewhere
  would fail the same way.

A request aborted by the engine (``/abort_request``, ``/pause_generation`` in abort mode) is not
an error: :meth:`SGLangClient.generate` returns it with ``finish_reason.type == "abort"`` --
except an abort by a token-mode refresh of the adapter (the client's ``barrier`` is set): that
call is continued from its prefix once the engine continues, and the caller gets one stitched
answer whose ``version_runs`` say which weight version produced which tokens
(:mod:`adapter.continuation`).
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, replace
from types import TracebackType
from typing import Any, Self

import httpx
from pydantic import ValidationError

from adapter.continuation import (
    Piece,
    RefreshBarrier,
    continued_sampling,
    stitch_lists,
    straddling_stop,
    version_runs,
)
from services.protocol.sglang import (
    FinishReason,
    GenerateOutput,
    ModelInfo,
    PauseMode,
    SamplingParams,
    UpdateWeightsResult,
    WeightsUpdateGroupResult,
)

__all__ = [
    "EngineError",
    "EngineProtocolError",
    "EngineRequestError",
    "EngineUnavailableError",
    "FinishReason",
    "GenerateResult",
    "ModelInfo",
    "SGLangClient",
    "SamplingParams",
    "UpdateWeightsResult",
]


class EngineError(Exception):
    """Base class of every error the client raises."""

    def __init__(self, url: str, message: str) -> None:
        super().__init__(f"{url}: {message}")
        self.url = url
        self.message = message


class EngineUnavailableError(EngineError):
    """The engine cannot serve the call (down, timed out, 5xx)."""

    def __init__(
        self,
        url: str,
        message: str,
        status: int | None = None,
        tokens_produced: bool = False,
    ) -> None:
        super().__init__(url, message)
        self.status = status
        self.tokens_produced = tokens_produced


class EngineProtocolError(EngineUnavailableError):
    """The engine answered, but not in SGLang's wire format."""


class EngineRequestError(EngineError):
    """The engine rejected the request (4xx)."""

    def __init__(self, url: str, message: str, status: int) -> None:
        super().__init__(url, f"HTTP {status}: {message}")
        self.status = status
        self.detail = message


@dataclass(frozen=True)
class GenerateResult:
    """One finished generation, as recorded into a trajectory turn."""

    rid: str
    text: str
    output_ids: list[int]
    output_logprobs: list[float]
    finish_reason: FinishReason
    weight_version: str | None
    prompt_tokens: int
    cached_tokens: int
    latency_s: float
    engine_latency_s: float | None
    # With top_logprobs_num = k: per output token, the k most likely (logprob, token id).
    output_top_logprobs: list[list[tuple[float, int]]] | None = None
    # (start index in output_ids, weight version) per run of tokens of one version; empty: every
    # token is ``weight_version``'s. Set when a token-mode refresh interrupted the call.
    version_runs: tuple[tuple[int, str | None], ...] = ()
    continuations: int = 0  # times the call was continued after a token-mode pause
    # Per output token, its text (asked for in continuations with stop strings only).
    output_token_texts: tuple[str, ...] | None = None
    # The engine replayed a script (reference engine's scripted mode): not the policy's samples.
    scripted: bool = False

    @property
    def aborted(self) -> bool:
        return self.finish_reason.type == "abort"


KEEPALIVE_EXPIRY_S = 2.0


class SGLangClient:
    """Async HTTP client of one SGLang (or reference) engine.

    ``timeout`` bounds a whole call (generation included); connecting is bounded separately by
    ``connect_timeout`` so a dead engine is detected quickly. ``max_connections`` bounds the
    connections to the engine (kept alive and reused): further calls wait for one (within
    ``timeout``) instead of all connecting at once, which under load can exceed
    ``connect_timeout`` and take a live engine out of rotation.
    """

    def __init__(
        self,
        base_url: str,
        timeout: float = 600.0,
        connect_timeout: float = 5.0,
        client: httpx.AsyncClient | None = None,
        max_connections: int = 256,
    ) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"engine URL must start with http:// or https://, got {base_url!r}")
        if timeout <= 0 or connect_timeout <= 0:
            raise ValueError("timeouts must be positive")
        if max_connections < 1:
            raise ValueError("max_connections must be >= 1")
        self.base_url = base_url.rstrip("/")
        # Set by the adapter's token-mode refresh: aborts inside its pause windows are continued.
        self.barrier: RefreshBarrier | None = None
        self._own_client = client is None
        self._client = client or httpx.AsyncClient(
            timeout=httpx.Timeout(timeout, connect=min(connect_timeout, timeout)),
            # Idle connections are dropped after 2 s, before the server's keep-alive timeout
            # (uvicorn's and SGLang's 5 s; httpx's default is also 5 s): reusing a connection the
            # server is closing fails the call (ReadError) and takes the engine out of rotation.
            limits=httpx.Limits(
                max_connections=max_connections,
                max_keepalive_connections=max_connections,
                keepalive_expiry=KEEPALIVE_EXPIRY_S,
            ),
        )

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        if self._own_client:
            await self._client.aclose()

    # ------------------------------------------------------------------ transport

    async def _request(
        self, method: str, path: str, body: dict[str, Any] | None = None
    ) -> httpx.Response:
        url = self.base_url + path
        try:
            response = await self._client.request(method, url, json=body)
        except httpx.TimeoutException as exc:
            raise EngineUnavailableError(url, f"timed out ({type(exc).__name__})") from exc
        except httpx.TransportError as exc:
            raise EngineUnavailableError(
                url, f"connection failed ({type(exc).__name__}: {exc})"
            ) from exc
        if response.status_code >= 500:
            raise EngineUnavailableError(
                url, f"HTTP {response.status_code}: {_error_text(response)}", response.status_code
            )
        if response.status_code >= 400:
            raise EngineRequestError(url, _error_text(response), response.status_code)
        return response

    async def _json(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        response = await self._request(method, path, body)
        try:
            return response.json()
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise EngineProtocolError(
                self.base_url + path, f"answer is not JSON: {response.text[:200]!r}"
            ) from exc

    # ------------------------------------------------------------------ generation

    async def generate(
        self,
        input_ids: list[int],
        sampling: SamplingParams,
        rid: str | None = None,
        return_logprob: bool = True,
        top_logprobs_num: int = 0,
    ) -> GenerateResult:
        """Generate from token ids; returns output ids with their behaviour logprobs.

        ``top_logprobs_num = k > 0`` (needs ``return_logprob``) also returns, per output token,
        the ``k`` most likely tokens with their logprobs (SGLang's ``output_top_logprobs``).
        With a ``barrier``, a call aborted by a token-mode refresh is continued from its prefix
        under the new weights (see :mod:`adapter.continuation`).
        """
        if not input_ids:
            raise ValueError("input_ids must not be empty")
        if top_logprobs_num < 0 or (top_logprobs_num and not return_logprob):
            raise ValueError("top_logprobs_num must be >= 0 and needs return_logprob")
        rid = rid or uuid.uuid4().hex
        if self.barrier is None:
            return await self._generate_once(
                input_ids, sampling, rid, return_logprob, top_logprobs_num
            )
        return await self._generate_through_pauses(
            self.barrier, input_ids, sampling, rid, return_logprob, top_logprobs_num
        )

    async def _generate_through_pauses(
        self,
        barrier: RefreshBarrier,
        input_ids: list[int],
        sampling: SamplingParams,
        rid: str,
        return_logprob: bool,
        top_logprobs_num: int,
    ) -> GenerateResult:
        """Generate; a piece aborted by a token-mode pause is continued from its prefix once
        the refresh ends, and the pieces are stitched into one answer."""
        started = time.perf_counter()
        stops = sampling.stop_strings() if return_logprob else []
        pieces: list[GenerateResult] = []
        produced: list[int] = []
        while True:
            epoch = barrier.epoch
            params = continued_sampling(sampling, len(produced)) if pieces else sampling
            piece_rid = f"{rid}-c{len(pieces)}" if pieces else rid
            piece = await self._generate_once(
                [*input_ids, *produced],
                params,
                piece_rid,
                return_logprob,
                top_logprobs_num,
                token_texts=bool(pieces and stops),
            )
            if pieces and stops:
                cut = straddling_stop(
                    "".join(p.text for p in pieces), piece.output_token_texts or (), stops
                )
                if cut is not None:  # a stop string straddles the switch: the answer ends
                    pieces.append(_cut(piece, *cut))
                    break
            pieces.append(piece)
            produced.extend(piece.output_ids)
            if not (piece.aborted and barrier.interrupted(epoch)):
                break
            await barrier.wait_resumed()
            if self.base_url in barrier.failed:
                raise EngineUnavailableError(
                    self.base_url + "/generate",
                    "interrupted by a token-mode refresh and the engine did not load the new "
                    "weights; no token reached the client",
                )
            barrier.continued += 1
            if len(produced) >= sampling.max_new_tokens:  # budget spent exactly at the pause
                pieces[-1] = replace(
                    piece, finish_reason=FinishReason(type="length", length=len(produced))
                )
                break
        return _stitch(pieces, time.perf_counter() - started)

    async def _generate_once(
        self,
        input_ids: list[int],
        sampling: SamplingParams,
        rid: str,
        return_logprob: bool,
        top_logprobs_num: int,
        token_texts: bool = False,
    ) -> GenerateResult:
        body: dict[str, Any] = {
            "input_ids": list(input_ids),
            "sampling_params": sampling.to_wire(),
            "return_logprob": return_logprob,
            "rid": rid,
            "stream": False,
        }
        if top_logprobs_num:
            body["top_logprobs_num"] = top_logprobs_num
        if token_texts:
            body["return_text_in_logprobs"] = True
        started = time.perf_counter()
        payload = await self._json("POST", "/generate", body)
        latency = time.perf_counter() - started
        result = parse_generate_output(
            payload,
            self.base_url + "/generate",
            rid,
            return_logprob,
            latency,
            top_logprobs_num,
            prompt_len=len(input_ids),
        )
        if token_texts:
            entries = payload["meta_info"]["output_token_logprobs"]  # checked by the parse
            texts = tuple(str(e[2]) if len(e) > 2 and e[2] is not None else "" for e in entries)
            result = replace(result, output_token_texts=texts)
        return result

    # ------------------------------------------------------------------ control

    async def update_weights_from_disk(
        self,
        model_path: str,
        weight_version: str | None = None,
        abort_all_requests: bool = False,
    ) -> UpdateWeightsResult:
        """Load weights from ``model_path``; raises EngineRequestError if the engine refuses."""
        body: dict[str, Any] = {"model_path": model_path, "abort_all_requests": abort_all_requests}
        if weight_version is not None:
            body["weight_version"] = weight_version
        result = await self._weights_call("/update_weights_from_disk", body, UpdateWeightsResult)
        assert isinstance(result, UpdateWeightsResult)
        return result

    async def init_weights_update_group(
        self,
        master_address: str,
        master_port: int,
        rank_offset: int,
        world_size: int,
        group_name: str,
        backend: str,
    ) -> WeightsUpdateGroupResult:
        """Join the trainer's broadcast group (blocks until every member joined)."""
        body = {
            "master_address": master_address,
            "master_port": master_port,
            "rank_offset": rank_offset,
            "world_size": world_size,
            "group_name": group_name,
            "backend": backend,
        }
        result = await self._weights_call(
            "/init_weights_update_group", body, WeightsUpdateGroupResult
        )
        assert isinstance(result, WeightsUpdateGroupResult)
        return result

    async def update_weights_from_distributed(
        self,
        names: list[str],
        dtypes: list[str],
        shapes: list[list[int]],
        group_name: str,
        weight_version: str | None = None,
        flush_cache: bool = True,
    ) -> WeightsUpdateGroupResult:
        """Receive one bucket that the trainer broadcasts while this call runs."""
        body: dict[str, Any] = {
            "names": names,
            "dtypes": dtypes,
            "shapes": shapes,
            "group_name": group_name,
            "flush_cache": flush_cache,
        }
        if weight_version is not None:
            body["weight_version"] = weight_version
        result = await self._weights_call(
            "/update_weights_from_distributed", body, WeightsUpdateGroupResult
        )
        assert isinstance(result, WeightsUpdateGroupResult)
        return result

    async def begin_weight_update(self) -> WeightsUpdateGroupResult:
        """Open SGLang's weight-update session (``/begin_weight_update``): SGLang 0.5.23 refuses
        ``update_weights_from_distributed`` outside one, before receiving anything."""
        result = await self._weights_call("/begin_weight_update", {}, WeightsUpdateGroupResult)
        assert isinstance(result, WeightsUpdateGroupResult)
        return result

    async def end_weight_update(self) -> WeightsUpdateGroupResult:
        """Close the session (``/end_weight_update``): SGLang runs the post-load steps of the
        loaded weights then; an engine serves a distributed version only after it."""
        result = await self._weights_call("/end_weight_update", {}, WeightsUpdateGroupResult)
        assert isinstance(result, WeightsUpdateGroupResult)
        return result

    async def update_weight_version(self, version: str) -> None:
        """Set the version the engine reports (``/update_weight_version``) without aborting
        anything (SGLang's default aborts every request). After a load whose cache flush was
        refused SGLang's scheduler serves the new weights while its ``/model_info`` still
        names the old version: this makes it name the new one once the cache is flushed."""
        await self._request(
            "POST", "/update_weight_version", {"new_version": version, "abort_all_requests": False}
        )

    async def destroy_weights_update_group(self, group_name: str) -> WeightsUpdateGroupResult:
        """Leave the broadcast group (``/destroy_weights_update_group``), so that a group of the
        same name can be formed again after a broadcast was abandoned."""
        result = await self._weights_call(
            "/destroy_weights_update_group", {"group_name": group_name}, WeightsUpdateGroupResult
        )
        assert isinstance(result, WeightsUpdateGroupResult)
        return result

    async def _weights_call(
        self,
        path: str,
        body: dict[str, Any],
        answer: type[UpdateWeightsResult] | type[WeightsUpdateGroupResult],
    ) -> UpdateWeightsResult | WeightsUpdateGroupResult:
        """POST a weight-control call; ``{success: false}`` or a 4xx -> EngineRequestError."""
        url = self.base_url + path
        try:
            response = await self._client.post(url, json=body)
        except httpx.TimeoutException as exc:
            raise EngineUnavailableError(url, f"timed out ({type(exc).__name__})") from exc
        except httpx.TransportError as exc:
            raise EngineUnavailableError(url, f"connection failed ({exc})") from exc
        if response.status_code >= 500:
            raise EngineUnavailableError(
                url, f"HTTP {response.status_code}: {_error_text(response)}", response.status_code
            )
        try:
            result = answer.model_validate(response.json())
        except (json.JSONDecodeError, ValidationError) as exc:
            if response.status_code >= 400:
                raise EngineRequestError(url, _error_text(response), response.status_code) from exc
            raise EngineProtocolError(url, f"malformed answer: {response.text[:200]!r}") from exc
        if not result.success or response.status_code >= 400:
            raise EngineRequestError(url, result.message, response.status_code)
        return result

    async def pause_generation(self, mode: PauseMode = "abort") -> None:
        await self._request("POST", "/pause_generation", {"mode": mode})

    async def continue_generation(self) -> None:
        await self._request("POST", "/continue_generation", {})

    async def abort_request(self, rid: str = "", abort_all: bool = False) -> None:
        if not rid and not abort_all:
            raise ValueError("give a rid or abort_all=True")
        await self._request("POST", "/abort_request", {"rid": rid, "abort_all": abort_all})

    async def flush_cache(self) -> bool:
        """True if flushed; False if the engine refused (requests running or waiting)."""
        try:
            await self._request("POST", "/flush_cache")
        except EngineRequestError as exc:
            if exc.status == 400:
                return False
            raise
        return True

    async def model_info(self) -> ModelInfo:
        url = self.base_url + "/model_info"
        payload = await self._json("GET", "/model_info")
        try:
            return ModelInfo.model_validate(payload)
        except ValidationError as exc:
            raise EngineProtocolError(url, f"malformed model_info: {exc}") from exc

    async def get_weights_by_name(self, name: str, truncate_size: int) -> list[Any]:
        """The parameter's first ``truncate_size`` entries, as the engine holds them now
        (SGLang's ``/get_weights_by_name``; a list, nested for a matrix). SGLang 0.5.23
        implements it for a few model classes only (llama, granite, opt, exaone4, gemma); for
        the others (Qwen3, Qwen3-MoE, ...) it answers 400 "Get parameter by name failed":
        :class:`EngineRequestError`, which callers treat as *unverifiable*."""
        url = self.base_url + "/get_weights_by_name"
        payload = await self._json(
            "POST", "/get_weights_by_name", {"name": name, "truncate_size": truncate_size}
        )
        if not isinstance(payload, list):
            raise EngineProtocolError(url, f"expected a list, got {str(payload)[:200]!r}")
        return payload

    async def input_logprobs(self, input_ids: list[int]) -> list[Any]:
        """The engine's logprob of each of ``input_ids`` given the tokens before it: SGLang's
        ``meta_info.input_token_logprobs`` (``[logprob | None, token_id, text | None]`` per
        token, the first one's logprob None) of a prefill-only ``/generate``
        (``max_new_tokens`` 0, ``logprob_start_len`` 0). These are ``log_softmax(logits)``
        whatever the sampling temperature (SGLang scales only output logprobs)."""
        url = self.base_url + "/generate"
        payload = await self._json(
            "POST",
            "/generate",
            {
                "input_ids": list(input_ids),
                "sampling_params": SamplingParams(max_new_tokens=0).to_wire(),
                "return_logprob": True,
                "logprob_start_len": 0,
                "rid": f"swerl-logprob-probe-{uuid.uuid4().hex}",
            },
        )
        meta = payload.get("meta_info") if isinstance(payload, dict) else None
        entries = meta.get("input_token_logprobs") if isinstance(meta, dict) else None
        if not isinstance(entries, list):
            raise EngineProtocolError(
                url, f"no meta_info.input_token_logprobs in {str(payload)[:200]!r}"
            )
        return entries

    async def tp_size(self) -> int:
        """The engine's tensor-parallel workers (``tp_size`` of ``/server_info``; 1 when the
        engine does not say): the ranks it takes in a weight-update group, each worker joining
        as ``rank_offset + tp_rank``. SGLang 0.5.23 deprecates ``/get_server_info`` (a warning
        per call); an engine without ``/server_info`` (404: older SGLang) is asked there."""
        path = "/server_info"
        try:
            payload = await self._json("GET", path)
        except EngineRequestError as exc:
            if exc.status != 404:
                raise
            path = "/get_server_info"
            payload = await self._json("GET", path)
        url = self.base_url + path
        value = payload.get("tp_size", 1) if isinstance(payload, dict) else 1
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise EngineProtocolError(url, f"tp_size must be a positive integer, got {value!r}")
        return value

    async def get_weight_version(self) -> str | None:
        """The engine's current weight version (from /model_info, as current SGLang reports it)."""
        return (await self.model_info()).weight_version

    async def health(self) -> bool:
        """True if ``GET /health`` answers 200; never raises for an unreachable engine."""
        try:
            response = await self._client.get(self.base_url + "/health")
        except httpx.HTTPError:
            return False
        return response.status_code == 200


def _cut(piece: GenerateResult, kept: int, stop: str) -> GenerateResult:
    """``piece`` ending after its ``kept`` first tokens, finished by the stop string ``stop``."""
    texts = piece.output_token_texts or ()
    top = piece.output_top_logprobs
    return replace(
        piece,
        text="".join(texts[:kept]),
        output_ids=piece.output_ids[:kept],
        output_logprobs=piece.output_logprobs[:kept],
        output_top_logprobs=None if top is None else top[:kept],
        output_token_texts=texts[:kept],
        finish_reason=FinishReason(type="stop", matched=stop),
    )


def _stitch(pieces: list[GenerateResult], latency_s: float) -> GenerateResult:
    """One answer from the pieces of a call interrupted by token-mode refreshes: the outputs
    concatenated, the last piece's finish reason, the first piece's prompt and cache figures."""
    if len(pieces) == 1:
        return pieces[0]
    first, last = pieces[0], pieces[-1]
    runs = version_runs([Piece(p.output_ids, p.weight_version) for p in pieces])
    output_ids = stitch_lists([p.output_ids for p in pieces]) or []
    logprobs = stitch_lists([p.output_logprobs for p in pieces]) or []
    engine_s = [p.engine_latency_s for p in pieces]
    return GenerateResult(
        rid=first.rid,
        text="".join(p.text for p in pieces),
        output_ids=output_ids,
        output_logprobs=logprobs,
        finish_reason=last.finish_reason,
        weight_version=runs[0][1],
        prompt_tokens=first.prompt_tokens,
        cached_tokens=first.cached_tokens,
        latency_s=latency_s,
        engine_latency_s=None if None in engine_s else sum(e or 0.0 for e in engine_s),
        output_top_logprobs=stitch_lists([p.output_top_logprobs for p in pieces]),
        version_runs=runs if len(runs) > 1 else (),
        continuations=len(pieces) - 1,
        scripted=any(p.scripted for p in pieces),
    )


def parse_generate_output(
    payload: Any,
    url: str,
    rid: str | None,
    return_logprob: bool,
    latency_s: float,
    top_logprobs_num: int = 0,
    prompt_len: int | None = None,
) -> GenerateResult:
    """Validate a non-streamed ``/generate`` answer and turn it into a :class:`GenerateResult`.

    A request aborted while still queued comes back without ``prompt_tokens`` (SGLang never
    looked at it): ``prompt_len``, the length of the ids sent, stands in for it then."""
    if not isinstance(payload, dict):
        raise EngineProtocolError(url, f"expected one JSON object, got {type(payload).__name__}")
    try:
        output = GenerateOutput.model_validate(payload)
    except ValidationError as exc:
        raise EngineProtocolError(url, f"malformed /generate answer: {exc}") from exc
    meta = output.meta_info
    if meta.finish_reason is None:
        raise EngineProtocolError(url, "finished answer without finish_reason")
    if rid is not None and meta.id != rid:
        raise EngineProtocolError(url, f"answer is for request {meta.id!r}, not {rid!r}")
    if meta.prompt_tokens is None and meta.finish_reason.type != "abort":
        # only an abort of a queued request answers without it
        raise EngineProtocolError(url, "meta_info.prompt_tokens is missing from a finished answer")
    output_ids = list(output.output_ids)
    logprobs: list[float] = []
    if return_logprob:
        output_ids, logprobs = _output_logprobs(meta.output_token_logprobs, output_ids, url)
    if meta.completion_tokens != len(output_ids) and meta.completion_tokens != len(output_ids) - 1:
        raise EngineProtocolError(
            url, f"completion_tokens={meta.completion_tokens} but {len(output_ids)} output ids"
        )
    top = (
        _parse_top_logprobs(meta.output_top_logprobs, len(output_ids), url)
        if top_logprobs_num
        else None
    )
    return GenerateResult(
        rid=meta.id,
        text=output.text,
        output_ids=output_ids,
        output_logprobs=logprobs,
        finish_reason=meta.finish_reason,
        weight_version=meta.weight_version,
        prompt_tokens=meta.prompt_tokens if meta.prompt_tokens is not None else prompt_len or 0,
        cached_tokens=meta.cached_tokens,
        latency_s=latency_s,
        engine_latency_s=meta.e2e_latency,
        output_top_logprobs=top,
        scripted=meta.scripted,
    )


def _output_logprobs(
    entries: list[list[Any]] | None, output_ids: list[int], url: str
) -> tuple[list[int], list[float]]:
    """``meta_info.output_token_logprobs`` (``[logprob, token_id, ...]`` per generated token) as
    the generated ids and their logprobs, checked against ``output_ids``."""
    if entries is None:
        raise EngineProtocolError(
            url, "return_logprob was set but output_token_logprobs is missing"
        )
    ids: list[int] = []
    logprobs: list[float] = []
    for i, entry in enumerate(entries):
        value, token = _logprob_and_token(entry[0], entry[1], "output_token_logprobs", i, url)
        logprobs.append(value)
        ids.append(token)
    # The logprob entries name every generated token; some SGLang versions leave the
    # matched stop token out of output_ids, never anything else.
    if output_ids != ids and output_ids != ids[:-1]:
        raise EngineProtocolError(
            url,
            f"output_ids ({len(output_ids)}) disagree with output_token_logprobs ({len(ids)})",
        )
    return ids, logprobs


def _logprob_and_token(value: Any, token: Any, field: str, i: int, url: str) -> tuple[float, int]:
    """One ``[logprob, token_id]`` pair of a logprob list: a number and an integer id."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise EngineProtocolError(url, f"{field}[{i}] has logprob {value!r}")
    if not isinstance(token, int) or isinstance(token, bool):
        raise EngineProtocolError(url, f"{field}[{i}] has token id {token!r}")
    return float(value), token


def _parse_top_logprobs(
    entries: list[list[list[Any]] | None] | None, n_tokens: int, url: str
) -> list[list[tuple[float, int]]]:
    """``meta_info.output_top_logprobs``: one list of ``[logprob, token_id, text]`` per token."""
    if entries is None:
        raise EngineProtocolError(
            url, "top_logprobs_num was set but output_top_logprobs is missing"
        )
    if len(entries) != n_tokens:
        raise EngineProtocolError(
            url, f"output_top_logprobs has {len(entries)} entries for {n_tokens} output tokens"
        )
    return [
        [
            _logprob_and_token(value, token, "output_top_logprobs", i, url)
            for value, token, _text in position or []
        ]
        for i, position in enumerate(entries)
    ]


def _error_text(response: httpx.Response) -> str:
    """The human-readable message of an error answer (SGLang or FastAPI shapes)."""
    try:
        body = response.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        return response.text[:500] or response.reason_phrase
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and "message" in error:
            return str(error["message"])
        if "message" in body:
            return str(body["message"])
        if "detail" in body:
            return json.dumps(body["detail"])[:500]
    return json.dumps(body)[:500]
