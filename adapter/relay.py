"""The adapter in relay mode: chat completions answered by an OpenAI-compatible upstream
(``adapter.upstream``), recorded as text turns.

What stays as in the engine mode (:mod:`adapter.service`): the trajectory lifecycle and its
security boundary (:mod:`adapter.lifecycle`: ``POST /trajectories`` with the worker token, a
bearer token per trajectory on ``/t/<id>/v1``), the request validation
(:func:`adapter.openai_schema.parse_chat_request`), streaming, the trajectory store. What
differs:

* the request goes to ``POST {upstream.url}/chat/completions`` as OpenAI JSON -- the messages
  and tools as the agent sent them, the sampling fields the adapter supports, ``model`` the
  upstream's, ``stream`` off (the adapter streams the answer itself) -- with the upstream's API
  key from ``upstream.api_key_env``; the sandbox never sees the key or the upstream's address;
* the answer's message (content, tool calls) comes back to the agent as the upstream gave it;
* each turn is a :class:`services.protocol.TextTurn`: the messages new since the previous turn,
  the answer, usage and timing. No token ids, no logprobs: the trainer refuses such records;
  ``logprobs`` requests are refused (400);
* an unreachable or failing upstream (connection error, timeout, 5xx, 429, a malformed answer)
  is an infrastructure failure: 503 to the agent, the trajectory marked ``infra_failure`` (so
  the rollout is aborted, never scored as a wrong answer); a 4xx the upstream gives to the
  request itself comes back to the agent as a 400 with the upstream's message.

There are no weights to refresh: the admin weight routes answer 409.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from typing import Any

import httpx

from adapter.config import AdapterConfig, UpstreamConfig
from adapter.errors import APIError
from adapter.lifecycle import STORE_ERRORS, TrajectoryLifecycle
from adapter.openai_schema import (
    ChatCompletionRequest,
    assistant_message,
    completion_id,
    parse_chat_request,
    tool_call_id,
    usage,
)
from adapter.runtime import TrajectoryRuntime
from adapter.service import ChatOutcome
from services.protocol import TextTurn
from services.store import TrajectoryStore

log = logging.getLogger("adapter.relay")

# The request fields forwarded as they are (the rest are swerl's or refused by the schema).
FORWARDED = ("tools", "tool_choice", "temperature", "top_p", "stop", "seed", "response_format")
DEFAULT_MAX_BODY_BYTES = 64 << 20
FINISH_REASONS = {"stop", "length", "tool_calls", "content_filter"}


class UpstreamUnavailableError(Exception):
    """The upstream could not answer (its fault or the network's, not the request's)."""


class UpstreamClient:
    """``POST /chat/completions`` on the upstream, one JSON answer per call."""

    def __init__(self, config: UpstreamConfig, environ: dict[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        headers = {}
        if config.api_key_env:
            key = env.get(config.api_key_env)
            if not key:
                raise ValueError(f"upstream.api_key_env: ${config.api_key_env} is not set")
            headers["authorization"] = f"Bearer {key}"
        self.base_url = config.url
        self.model = config.model
        self.http = httpx.AsyncClient(
            base_url=config.url,
            headers=headers,
            timeout=httpx.Timeout(config.timeout_s, connect=min(10.0, config.timeout_s)),
            limits=httpx.Limits(max_connections=config.max_connections),
        )

    async def close(self) -> None:
        await self.http.aclose()

    async def complete(self, body: dict[str, Any]) -> dict[str, Any]:
        """The upstream's answer (a JSON object); APIError 400 for a request it refused,
        :class:`UpstreamUnavailableError` for everything that is not the request's fault."""
        try:
            response = await self.http.post("/chat/completions", json=body)
        except httpx.HTTPError as exc:
            raise UpstreamUnavailableError(f"{type(exc).__name__}: {exc}") from None
        text = response.text[:500]
        if response.status_code == 429 or response.status_code >= 500:
            raise UpstreamUnavailableError(f"HTTP {response.status_code}: {text}")
        if response.status_code >= 400:
            status = response.status_code
            message = f"the upstream refused the request (HTTP {status}): {text}"
            raise APIError(400, message, code="upstream_rejected")
        try:
            answer = response.json()
        except ValueError:
            raise UpstreamUnavailableError(f"the answer is not JSON: {text}") from None
        if not isinstance(answer, dict):
            raise UpstreamUnavailableError(f"the answer is not a JSON object: {text}")
        return answer

    async def health(self) -> bool:
        """Whether the endpoint answers HTTP at all (``GET /models``; any status counts: not
        every endpoint serves that route)."""
        try:
            await self.http.get("/models", timeout=5.0)
        except httpx.HTTPError:
            return False
        return True


def upstream_body(request: ChatCompletionRequest, model: str, max_tokens: int) -> dict[str, Any]:
    """The OpenAI request the upstream gets for ``request``."""
    body: dict[str, Any] = {
        "model": model,
        "messages": [m.model_dump(exclude_none=True) for m in request.messages],
        "max_tokens": request.requested_max_tokens() or max_tokens,
        "stream": False,
    }
    for name in FORWARDED:
        value = getattr(request, name)
        if value is not None:
            body[name] = (
                [v.model_dump(exclude_none=True) for v in value]
                if name == "tools"
                else value.model_dump(exclude_none=True)
                if hasattr(value, "model_dump")
                else value
            )
    return body


def parse_answer(answer: dict[str, Any]) -> tuple[dict[str, Any], str, dict[str, int]]:
    """``(assistant message, finish reason, usage)`` of an upstream answer; a malformed answer
    is :class:`UpstreamUnavailableError` (the upstream's fault, not the agent's)."""
    choices = answer.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise UpstreamUnavailableError("the answer has no choices[0]")
    message = choices[0].get("message")
    if not isinstance(message, dict):
        raise UpstreamUnavailableError("the answer has no choices[0].message")
    content = message.get("content")
    if content is not None and not isinstance(content, str):
        raise UpstreamUnavailableError("choices[0].message.content is not a string")
    calls = []
    for call in message.get("tool_calls") or []:
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise UpstreamUnavailableError("a tool call of the answer has no function name")
        arguments = function.get("arguments", "{}")
        if not isinstance(arguments, str):
            raise UpstreamUnavailableError("a tool call's arguments are not a JSON string")
        calls.append({"id": str(call.get("id") or tool_call_id()), "type": "function",
                      "function": {"name": function["name"], "arguments": arguments}})  # fmt: skip
    reason = str(choices[0].get("finish_reason") or "stop")
    if reason not in FINISH_REASONS:
        reason = "stop"
    if calls:
        reason = "tool_calls"
    raw_usage = answer.get("usage") if isinstance(answer.get("usage"), dict) else {}
    counts = {
        k: int(raw_usage[k])
        for k in ("prompt_tokens", "completion_tokens")
        if isinstance(raw_usage.get(k), int) and not isinstance(raw_usage.get(k), bool)
    }
    return assistant_message(content if content is not None or calls else "", calls), reason, counts


def _canonical(message: dict[str, Any]) -> dict[str, Any]:
    """``message`` as a request carries it back (unset fields left out, as the schema dumps)."""
    return {k: v for k, v in message.items() if v is not None}


class NoWeights:
    """Relay mode serves an upstream's model: nothing to refresh."""

    refreshing = False

    async def refresh(
        self,
        model_path: str,
        version: int,
        weights_sha256: str | None = None,
        probes: tuple[Any, ...] = (),
        logprob_probe: Any = None,
    ) -> dict[str, Any]:
        raise APIError(
            409, "relay mode: the adapter serves an upstream endpoint, it has no weights",
            code="relay_mode",
        )  # fmt: skip


class RelayService(TrajectoryLifecycle):
    """The adapter's service in relay mode (see the module docstring)."""

    def __init__(
        self, config: AdapterConfig, store: TrajectoryStore, client: UpstreamClient | None = None
    ) -> None:
        if config.upstream is None:
            raise ValueError("RelayService needs adapter.upstream")
        super().__init__(config, store)
        self.upstream = client or UpstreamClient(config.upstream)
        self.model_name = config.served_model_name or config.upstream.model
        self.weights = NoWeights()
        self.router = None  # no engines to broadcast to
        self.renderer = None
        # per open trajectory: the conversation recorded so far (requests' messages + answers)
        self._conversations: dict[str, list[dict[str, Any]]] = {}
        self._evictor: asyncio.Task[None] | None = None

    @property
    def context_length(self) -> int | None:
        return self.config.context_length

    @property
    def max_body_bytes(self) -> int:
        return self.config.max_body_bytes or DEFAULT_MAX_BODY_BYTES

    async def start(self) -> None:
        log.info("relay mode: completions from %s (model %s)", self.upstream.base_url,
                 self.upstream.model)  # fmt: skip
        self._evictor = asyncio.create_task(self._evict_loop())

    async def stop(self) -> None:
        if self._evictor is not None:
            self._evictor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._evictor
        await self._flush_all()
        await self.upstream.close()
        await self.store.close_connection()

    def _forget(self, trajectory_id: str) -> None:
        self._conversations.pop(trajectory_id, None)

    # -- chat completions ----------------------------------------------------------------------
    async def chat(self, trajectory_id: str | None, body: Any) -> ChatOutcome:
        request = parse_chat_request(body, tracked=trajectory_id is not None)
        if request.logprobs or request.top_logprobs:
            raise APIError(400, "relay mode records no logprobs: the upstream's are not "
                           "behaviour logprobs swerl can check", param="logprobs")  # fmt: skip
        upstream = upstream_body(request, self.upstream.model, self.config.default_max_tokens)
        if trajectory_id is None:
            message, reason, counts, _, _ = await self._complete(upstream, None)
            return self._outcome(request, message, reason, counts, {})
        runtime = await self._runtime(trajectory_id)
        async with runtime.lock:
            runtime.touch()
            message, reason, counts, started, latency = await self._complete(upstream, runtime)
            await self._record(runtime, upstream["messages"], message, reason, counts,
                               started, latency)  # fmt: skip
        return self._outcome(request, message, reason, counts, {"x-swerl-mode": "relay"})

    async def _complete(
        self, body: dict[str, Any], runtime: TrajectoryRuntime | None
    ) -> tuple[dict[str, Any], str, dict[str, int], float, float]:
        started, t0 = time.time(), time.monotonic()
        try:
            answer = await self.upstream.complete(body)
            message, reason, counts = parse_answer(answer)
        except UpstreamUnavailableError as exc:
            text = f"the upstream endpoint could not answer: {exc}"
            if runtime is not None:
                try:
                    await self._flush(runtime)
                    await self.store.mark_infra_failure(runtime.trajectory_id, text[:500])
                except (APIError, *STORE_ERRORS):
                    log.error("trajectory %s: could not record infra failure",
                              runtime.trajectory_id)  # fmt: skip
            raise APIError(503, text, code="upstream_unavailable") from None
        return message, reason, counts, started, time.monotonic() - t0

    async def _record(
        self,
        runtime: TrajectoryRuntime,
        messages: list[dict[str, Any]],
        message: dict[str, Any],
        reason: str,
        counts: dict[str, int],
        started: float,
        latency: float,
    ) -> None:
        tid = runtime.trajectory_id
        seen = self._conversations.get(tid)
        extends = seen is not None and messages[: len(seen)] == seen
        new = messages[len(seen) :] if extends and seen is not None else messages
        turn = TextTurn(messages=new, response=message, finish_reason=reason,
                        history_reset=not extends and seen is not None,
                        model=self.upstream.model, engine=self.upstream.base_url,
                        started_at=started, latency_s=latency, usage=counts)  # fmt: skip
        counters = {"turns": 1, "text_turns": 1,
                    "generated_tokens": counts.get("completion_tokens", 0)}  # fmt: skip
        if turn.history_reset:
            counters["history_resets"] = 1
        runtime.add_entries([turn.to_bytes()], counters)
        self._conversations[tid] = [*messages, _canonical(message)]
        with contextlib.suppress(APIError):  # kept in memory; retried next turn / at close
            await self._flush(runtime)

    def _outcome(
        self,
        request: ChatCompletionRequest,
        message: dict[str, Any],
        reason: str,
        counts: dict[str, int],
        headers: dict[str, str],
    ) -> ChatOutcome:
        prompt, completion = counts.get("prompt_tokens", 0), counts.get("completion_tokens", 0)
        return ChatOutcome(
            cid=completion_id(),
            model=request.model or self.model_name,
            message=message,
            finish_reason=reason,
            usage=usage(prompt, completion),
            stream=bool(request.stream),
            include_usage=bool(request.stream_options and request.stream_options.include_usage),
            headers=headers,
        )

    # -- views ---------------------------------------------------------------------------------
    def health(self) -> dict[str, Any]:
        return {"status": "ok", "mode": "relay", "upstream": self.upstream.base_url}

    async def readiness(self, timeout_s: float = 2.0) -> dict[str, Any]:
        try:
            redis_ok, redis_error = await self.store.ping(), None
        except STORE_ERRORS as exc:
            redis_ok, redis_error = False, f"{type(exc).__name__}: {exc}"
        upstream_ok = await self.upstream.health()
        return {
            "status": "ready" if redis_ok and upstream_ok else "not_ready",
            "mode": "relay",
            "redis": "ok" if redis_ok else "unavailable",
            "redis_error": redis_error,
            "upstream": "ok" if upstream_ok else "unavailable",
        }

    async def versions(self) -> dict[str, Any]:
        return {"mode": "relay", "upstream": self.upstream.base_url, "model": self.model_name}
