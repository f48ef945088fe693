"""The adapter's request handling: chat completions with recording, and trajectory lifecycle.

One :class:`AdapterService` per process ties the parts together -- renderer, recorder, tool
parser, store, router, refresh gate -- and keeps the in-memory state of open trajectories.
HTTP concerns (routes, status codes, SSE framing) live in :mod:`adapter.app`.

Per trajectory, requests are serialised by a lock (an agent makes one call at a time; a second
concurrent call waits its turn rather than racing the record). A request changes the record only
after the engine answered: a rejected or failed request leaves it as it was. Completed turns are
written through to Redis at once; if Redis is unreachable they are kept in memory, counted in
``swerl_adapter_store_errors_total``, and written with the next turn or at close.

Rendering and tokenising run off the event loop, in a small thread pool (``tokenizer_threads``;
the fast tokenizer releases the GIL while it encodes), and texts longer than
:data:`adapter.rendering.PROCESS_MIN_CHARS` characters in tokenizer processes
(``tokenizer_processes``, :mod:`adapter.tokenize_worker`), so one huge prompt never stalls
``/health`` or the other trajectories; a prompt too long for the context window is refused before
it is tokenised (:meth:`adapter.rendering.Renderer.encode_prompt`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from adapter.config import AdapterConfig, ToolParserName
from adapter.continuation import numeric_runs
from adapter.engines.sglang import GenerateResult, SamplingParams, SGLangClient
from adapter.errors import APIError
from adapter.lifecycle import STORE_ERRORS, TrajectoryLifecycle
from adapter.messages import template_messages
from adapter.openai_schema import (
    ChatCompletionRequest,
    ChatMessage,
    assistant_message,
    completion_id,
    parse_chat_request,
    tool_call_id,
    usage,
)
from adapter.recorder import Recorder, TurnPlan, TurnResult
from adapter.rendering import ContextLengthError, Renderer
from adapter.routing import Engine, NoEngineAvailableError, Router
from adapter.runtime import TrajectoryRuntime
from adapter.tokenize_worker import TokenizerProcesses, TokenizerWorkerError
from adapter.tool_parsers import ToolParser, get_parser
from adapter.weights import RefreshGate, WeightCoordinator
from services.protocol import TrajectoryMeta
from services.store import (
    TrajectoryStore,
)

log = logging.getLogger("adapter.service")


@dataclass(frozen=True)
class ChatOutcome:
    """What the app needs to answer one chat completion."""

    cid: str
    model: str
    message: dict[str, Any]
    finish_reason: str
    usage: dict[str, Any]
    stream: bool
    include_usage: bool
    headers: dict[str, str]
    logprobs: dict[str, Any] | None = None  # OpenAI ``choices[0].logprobs`` when asked for


class AdapterService(TrajectoryLifecycle):
    def __init__(
        self,
        config: AdapterConfig,
        renderer: Renderer,
        store: TrajectoryStore,
        clients: list[SGLangClient] | None = None,
    ) -> None:
        super().__init__(config, store)
        self.renderer = renderer
        self.recorder = Recorder(renderer)
        self.parser: ToolParser = get_parser(config.tool_parser, renderer.chat_template)
        self.arguments_as_object = self.parser.name is ToolParserName.QWEN3_CODER
        self.model_name = config.served_model_name or renderer.model_dir.name
        clients = clients or [
            SGLangClient(
                url,
                timeout=config.engine_timeout_s,
                connect_timeout=config.engine_connect_timeout_s,
                max_connections=config.engine_max_connections,
            )
            for url in config.engines
        ]
        self.router = Router(
            engines=[Engine(url=c.base_url, client=c) for c in clients],
            metrics=self.metrics,
            attempts=config.engine_attempts,
            outage_wait_s=config.engine_outage_wait_s,
            placement=config.placement,
        )
        self.gate = RefreshGate()
        self.weights = WeightCoordinator(
            self.router,
            self.gate,
            self.metrics,
            initial_version=config.initial_weight_version,
            drain_timeout_s=config.refresh_drain_timeout_s,
            check_model_path=config.check_model_path,
            mode=config.refresh_mode,
        )
        self._tasks: list[asyncio.Task[None]] = []
        self._tokenize_threads = ThreadPoolExecutor(
            max_workers=config.tokenizer_threads, thread_name_prefix="adapter-tokenize"
        )
        self._tokenize_processes: TokenizerProcesses | None = None

    # -- placement: a trajectory stays on its engine (KV-cache reuse) -----------------------
    def _placement(self, meta: TrajectoryMeta) -> Any:
        return self.router.placement_index(meta)

    def _place(self, trajectory_id: str, placement: Any) -> None:
        self.router.place(trajectory_id, placement)

    def _forget(self, trajectory_id: str) -> None:
        self.router.forget(trajectory_id)

    @property
    def context_length(self) -> int:
        return self.renderer.context_length

    @property
    def max_body_bytes(self) -> int:
        """Largest request body: ``max_body_bytes``, else 4x the most text that can fit the
        context window (JSON escapes, tool schemas, history a template drops) plus 1 MiB."""
        if self.config.max_body_bytes is not None:
            return self.config.max_body_bytes
        fits = self.renderer.context_length * self.renderer.bytes_per_token
        return int(4 * fits) + (1 << 20)

    # -- lifecycle -----------------------------------------------------------------------------

    async def start(self) -> None:
        tokenizer_json = self.renderer.tokenizer_json()
        if self.config.tokenizer_processes > 0 and tokenizer_json is not None:
            # The processes start with the first long text (most adapters of the test suite
            # never see one); start-up costs that request about a second.
            processes = TokenizerProcesses(tokenizer_json, self.config.tokenizer_processes)
            self._tokenize_processes = processes
            self.renderer.large_text_encoder = processes.encode
        await self.weights.discover()
        self._tasks.append(
            asyncio.create_task(
                self.router.probe_loop(
                    self.config.probe_interval_s, self.weights.readmit, self.weights.audit
                )
            )
        )
        self._tasks.append(asyncio.create_task(self._evict_loop()))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self._flush_all()
        for engine in self.router.engines:
            await engine.client.close()
        await self.store.close_connection()
        if self._tokenize_processes is not None:
            if self.renderer.large_text_encoder == self._tokenize_processes.encode:
                self.renderer.large_text_encoder = None
            self._tokenize_processes.close()
            self._tokenize_processes = None
        self._tokenize_threads.shutdown(wait=False, cancel_futures=True)

    # -- chat completions ----------------------------------------------------------------------

    def _sampling(self, request: ChatCompletionRequest, prompt_len: int) -> SamplingParams:
        context = self.renderer.context_length
        if prompt_len >= context:
            raise ContextLengthError(f"the prompt is {prompt_len} tokens", context)
        budget = context - prompt_len
        wanted = request.requested_max_tokens() or self.config.default_max_tokens
        params: dict[str, Any] = {"max_new_tokens": min(wanted, budget)}
        if request.temperature is not None:
            params["temperature"] = request.temperature
        if request.top_p is not None:
            params["top_p"] = request.top_p
        if request.top_k is not None:
            params["top_k"] = request.top_k
        if request.ignore_eos:
            params["ignore_eos"] = True
        if request.stop:
            params["stop"] = request.stop
        if request.seed is not None:
            params["sampling_seed"] = request.seed
        if request.response_format is not None:
            params["json_schema"] = request.response_format.engine_json_schema()
        return SamplingParams(**params)

    def _answer(
        self, request: ChatCompletionRequest, output_ids: list[int], finish: Any
    ) -> tuple[dict[str, Any], str]:
        text = self.renderer.decode(output_ids)
        matched = getattr(finish, "matched", None)
        if finish.type == "stop" and isinstance(matched, str):
            cut = text.rfind(matched)
            if cut >= 0:
                text = text[:cut]  # OpenAI semantics: the stop string is not part of the content
        calls: list[dict[str, Any]] = []
        content: str | None = text
        if request.parse_tools_enabled():
            tools = [t.model_dump(exclude_none=True) for t in request.tools or []]
            parsed = self.parser.parse(text, tools)
            content = parsed.content
            calls = [
                {
                    "id": tool_call_id(),
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments_json()},
                }
                for c in parsed.tool_calls
            ]
        if calls:
            reason = "tool_calls"
        elif finish.type == "length":
            reason = "length"
        else:
            reason = "stop"
        if content is None and not calls:
            content = ""
        return assistant_message(content, calls), reason

    async def _off_loop[T](self, fn: Callable[..., T], *args: Any) -> T:
        """Run CPU-heavy ``fn`` (rendering, tokenising) in the tokenizer thread pool."""
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._tokenize_threads, functools.partial(fn, *args))
        except TokenizerWorkerError as exc:
            raise APIError(503, str(exc), code="tokenizer_unavailable") from None

    def _untracked_plan(
        self, tmsgs: list[dict[str, Any]], tools: list[dict[str, Any]] | None
    ) -> TurnPlan:
        ids = self.renderer.encode_prompt(self.renderer.render(tmsgs, tools, True))
        return TurnPlan(ids, [], ids, None, 0, [], tmsgs, tools)

    async def chat(self, trajectory_id: str | None, body: Any) -> ChatOutcome:
        request = parse_chat_request(body, tracked=trajectory_id is not None)
        tmsgs = template_messages(request.messages, self.arguments_as_object)
        tools = [t.model_dump(exclude_none=True) for t in request.tools] if request.tools else None
        if trajectory_id is None:
            plan = await self._off_loop(self._untracked_plan, tmsgs, tools)
            return await self._generate_and_answer(request, None, plan)
        runtime = await self._runtime(trajectory_id)
        async with runtime.lock:
            runtime.touch()
            # Planning reads the trajectory's state and changes nothing; the lock keeps the
            # state as it is until this request committed or failed.
            plan = await self._off_loop(
                self.recorder.plan,
                runtime.state,
                request.messages,
                tmsgs,
                tools,
                runtime.n_segments,
            )
            return await self._generate_and_answer(request, runtime, plan)

    async def _generate_and_answer(
        self,
        request: ChatCompletionRequest,
        runtime: TrajectoryRuntime | None,
        plan: TurnPlan,
    ) -> ChatOutcome:
        sampling = self._sampling(request, len(plan.input_ids))
        started_at = time.time()
        result, engine, waited = await self._generate(request, runtime, plan, sampling)
        version = self.weights.version_of(result.weight_version)
        runs = numeric_runs(result.version_runs, self.weights.version_of)
        message, reason = self._answer(request, result.output_ids, result.finish_reason)
        if runtime is not None:
            turn = TurnResult(
                output_ids=result.output_ids,
                output_logprobs=result.output_logprobs,
                weight_version=version,
                version_runs=runs,
                finish_reason=result.finish_reason.type,
                engine=engine.url,
                started_at=started_at,
                latency_s=result.latency_s,
                queue_wait_s=waited,
                cached_tokens=result.cached_tokens,
                scripted=result.scripted,
            )
            await self._record(runtime, plan, turn, message)
        self.metrics.prompt_tokens.inc(len(plan.input_ids))
        self.metrics.generated_tokens.inc(len(result.output_ids))
        self.metrics.observation_tokens.inc(len(plan.observation_ids))
        headers = {"x-swerl-weight-version": str(version), "x-swerl-engine": engine.url}
        if runtime is not None:
            headers["x-swerl-segment"] = str(plan.segment_index)
        return ChatOutcome(
            cid=completion_id(),
            model=request.model or self.model_name,
            message=message,
            finish_reason=reason,
            usage=usage(len(plan.input_ids), len(result.output_ids), result.cached_tokens),
            stream=bool(request.stream),
            include_usage=bool(request.stream_options and request.stream_options.include_usage),
            headers=headers,
            logprobs=self._logprobs(result) if request.logprobs else None,
        )

    async def _generate(
        self,
        request: ChatCompletionRequest,
        runtime: TrajectoryRuntime | None,
        plan: TurnPlan,
        sampling: SamplingParams,
    ) -> tuple[GenerateResult, Engine, float]:
        """One generate call through the refresh gate; returns the answer, the engine that gave
        it and the seconds waited at the gate. No engine: the trajectory records the failure."""
        tid = runtime.trajectory_id if runtime else None
        rid = f"{tid or 'untracked'}-{uuid.uuid4().hex[:12]}"
        try:
            async with self.gate.slot() as waited:
                if waited > 0.001:
                    self.metrics.gate_wait.observe(waited)
                result, engine = await self.router.generate(
                    tid, plan.input_ids, sampling, rid, request.top_logprobs_num
                )
        except APIError as exc:
            if sampling.json_schema is not None and "json_schema" in exc.message:
                # The engine refused the constraint the request's response_format asked for.
                exc.param = "response_format"
                exc.message = f"response_format: {exc.message}"
            raise
        except NoEngineAvailableError as exc:
            message = f"no inference engine could serve the request: {exc}"
            if runtime is not None:
                try:
                    await self._flush(runtime)
                    await self.store.mark_infra_failure(runtime.trajectory_id, message[:500])
                except (APIError, *STORE_ERRORS):
                    log.error("trajectory %s: could not record infra failure", tid)
            raise APIError(503, message, code="engine_unavailable") from None
        return result, engine, waited

    async def _record(
        self,
        runtime: TrajectoryRuntime,
        plan: TurnPlan,
        turn: TurnResult,
        message: dict[str, Any],
    ) -> None:
        """Commit the answered turn into the trajectory and write it through to the store."""
        committed = self.recorder.commit(
            runtime.state, plan, turn, ChatMessage.model_validate(message)
        )
        runtime.apply(plan, committed)
        if plan.new_segment:
            self.metrics.segments.labels(reason=str(plan.reason)).inc()
        with contextlib.suppress(APIError):  # kept in memory; retried next turn / at close
            await self._flush(runtime)

    def _logprobs(self, result: GenerateResult) -> dict[str, Any]:
        """OpenAI ``logprobs`` from what was recorded: every generated token (the stop token
        and tool-call markup included) with its behaviour logprob, and the engine's top
        alternatives when ``top_logprobs`` asked for them."""

        def entry(token_id: int, logprob: float) -> dict[str, Any]:
            text = self.renderer.token_text(token_id)
            return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}

        top = result.output_top_logprobs
        content = []
        for i, (token_id, logprob) in enumerate(
            zip(result.output_ids, result.output_logprobs, strict=True)
        ):
            item = entry(token_id, logprob)
            item["top_logprobs"] = [entry(t, lp) for lp, t in top[i]] if top else []
            content.append(item)
        return {"content": content, "refusal": None}

    # -- views ---------------------------------------------------------------------------------

    def health(self) -> dict[str, Any]:
        healthy = self.router.healthy()
        return {
            "status": "ok" if healthy else "degraded",
            "engines": {e.url: e.healthy for e in self.router.engines},
            "weight_version": self.weights.state.version,
            "gate_open": self.gate.is_open,
        }

    async def readiness(self, timeout_s: float = 2.0) -> dict[str, Any]:
        """``/readyz``: ready to take new trajectories -- Redis answers and an engine serves.

        Liveness (``/health``) does not depend on Redis: turns are buffered through an outage.
        """
        try:
            redis_ok = await asyncio.wait_for(self.store.ping(), timeout=timeout_s)
            redis_error = None
        except (*STORE_ERRORS, TimeoutError) as exc:
            redis_ok, redis_error = False, f"{type(exc).__name__}: {exc}"
        engines = len(self.router.healthy())
        ready = redis_ok and engines > 0
        return {
            "status": "ready" if ready else "not_ready",
            "redis": "ok" if redis_ok else "unavailable",
            "redis_error": redis_error,
            "engines_in_rotation": engines,
            "engines_total": len(self.router.engines),
        }

    async def versions(self) -> dict[str, Any]:
        engines = []
        for engine in self.router.engines:
            reported: str | None = None
            tp_size: int | None = None
            try:
                reported = await engine.client.get_weight_version()
                tp_size = await engine.client.tp_size()
            except Exception as exc:  # a down engine is part of the answer, not an error
                engine.last_error = engine.last_error or str(exc)
            engines.append(
                {
                    "url": engine.url,
                    "healthy": engine.healthy,
                    "weight_version": reported,
                    "tp_size": tp_size,
                    "inflight": engine.inflight,
                    "trajectories": engine.assigned,
                    "last_error": engine.last_error or None,
                }
            )
        state = self.weights.state
        return {
            "current_version": state.version,
            "model_path": state.model_path,
            "weights_sha256": state.weights_sha256,
            "refreshes": state.refreshes,
            "last_refresh": state.last_refresh or None,
            "gate_open": self.gate.is_open,
            "engines": engines,
        }
