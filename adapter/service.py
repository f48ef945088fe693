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

import redis.exceptions
from starlette.datastructures import Headers

from adapter.auth import AccessControl, bearer_token, new_trajectory_token, token_digest
from adapter.config import AdapterConfig, ToolParserName
from adapter.continuation import numeric_runs
from adapter.engines.sglang import GenerateResult, SamplingParams, SGLangClient
from adapter.errors import APIError
from adapter.messages import template_messages
from adapter.metrics import AdapterMetrics
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
from services.protocol import ID_RULE, Outcome, TrajectoryMeta, id_problem
from services.store import (
    TrajectoryExistsError,
    TrajectoryNotFoundError,
    TrajectoryStore,
)

log = logging.getLogger("adapter.service")


def open_store(config: AdapterConfig) -> TrajectoryStore:
    """The trajectory store on a blocking pool sized by the configuration."""
    return TrajectoryStore.from_url(
        config.redis_url,
        config.key_prefix,
        max_connections=config.redis_max_connections,
        pool_timeout_s=config.redis_pool_timeout_s,
    )


_STORE_ERRORS = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError)


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


class AdapterService:
    def __init__(
        self,
        config: AdapterConfig,
        renderer: Renderer,
        store: TrajectoryStore,
        clients: list[SGLangClient] | None = None,
    ) -> None:
        self.config = config
        self.renderer = renderer
        self.recorder = Recorder(renderer)
        self.metrics = AdapterMetrics()
        self.store = store
        self.parser: ToolParser = get_parser(config.tool_parser, renderer.chat_template)
        self.arguments_as_object = self.parser.name is ToolParserName.QWEN3_CODER
        self.model_name = config.served_model_name or renderer.model_dir.name
        self.access = AccessControl(
            worker_token=config.worker_token,
            admin_token=config.admin_token,
            untracked=config.untracked_completions,
        )
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
        self.trajectories: dict[str, TrajectoryRuntime] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._tokenize_threads = ThreadPoolExecutor(
            max_workers=config.tokenizer_threads, thread_name_prefix="adapter-tokenize"
        )
        self._tokenize_processes: TokenizerProcesses | None = None

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
                self.router.probe_loop(self.config.probe_interval_s, self.weights.readmit)
            )
        )
        self._tasks.append(asyncio.create_task(self._evict_loop()))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for runtime in list(self.trajectories.values()):
            try:
                await self._flush(runtime)
            except APIError:
                log.error("trajectory %s: unwritten turns lost at shutdown", runtime.trajectory_id)
        for engine in self.router.engines:
            await engine.client.close()
        await self.store.close_connection()
        if self._tokenize_processes is not None:
            if self.renderer.large_text_encoder == self._tokenize_processes.encode:
                self.renderer.large_text_encoder = None
            self._tokenize_processes.close()
            self._tokenize_processes = None
        self._tokenize_threads.shutdown(wait=False, cancel_futures=True)

    async def _evict_loop(self) -> None:
        """Drop in-memory state of trajectories idle for longer than the TTL (never closed)."""
        ttl = self.config.trajectory_idle_ttl_s
        while True:
            await asyncio.sleep(min(60.0, ttl))
            cutoff = time.monotonic() - ttl
            for tid, runtime in list(self.trajectories.items()):
                if not runtime.idle_since(cutoff):
                    continue
                try:
                    async with runtime.lock:
                        await self._flush(runtime)
                except APIError:
                    continue
                if runtime.idle_since(cutoff):  # no request came while it was written
                    self.trajectories.pop(tid, None)
                    self.router.forget(tid)
            self.metrics.open_trajectories.set(float(len(self.trajectories)))

    # -- trajectories --------------------------------------------------------------------------

    @staticmethod
    def validate_id(trajectory_id: str) -> None:
        if id_problem(trajectory_id) is not None:
            raise APIError(
                400,
                f"invalid trajectory id {trajectory_id[:80]!r}: {ID_RULE}",
                param="trajectory_id",
            )

    async def open_trajectory(self, meta: TrajectoryMeta) -> str:
        """Create the record; returns its bearer token (only its digest is stored)."""
        sample_index = self.router.placement_index(meta)
        token = new_trajectory_token()
        digest = token_digest(token)
        try:
            await self.store.open(meta, digest)
        except TrajectoryExistsError as exc:
            raise APIError(409, str(exc), code="trajectory_exists") from None
        except _STORE_ERRORS as exc:
            raise APIError(
                503, f"trajectory store unavailable: {exc}", code="store_unavailable"
            ) from None
        self.trajectories[meta.trajectory_id] = TrajectoryRuntime(
            meta.trajectory_id, token_digest=digest
        )
        self.router.place(meta.trajectory_id, sample_index)
        self.metrics.open_trajectories.set(float(len(self.trajectories)))
        return token

    async def authorize_trajectory(self, trajectory_id: str, headers: Headers) -> None:
        """In training mode a ``/t/<id>/`` call must carry that trajectory's token (401)."""
        if not self.access.training_mode:
            return
        if bearer_token(headers) is None:  # refused before anything is looked up
            self.access.require_trajectory(trajectory_id, headers, None, known=False)
        try:
            runtime = await self._runtime(trajectory_id)
        except APIError as exc:
            if exc.status != 404:
                raise
            # an unknown id looks like a wrong token: no oracle of which ids exist
            self.access.require_trajectory(trajectory_id, headers, None, known=False)
            raise
        self.access.require_trajectory(trajectory_id, headers, runtime.token_digest, known=True)

    async def _runtime(self, trajectory_id: str) -> TrajectoryRuntime:
        runtime = self.trajectories.get(trajectory_id)
        if runtime is not None:
            return runtime
        self.validate_id(trajectory_id)
        try:
            status = await self.store.status(trajectory_id)
            if status is None:
                if not self.config.auto_open_trajectories:
                    raise APIError(
                        404,
                        f"unknown trajectory {trajectory_id!r}: open it with POST /trajectories",
                        code="trajectory_not_found",
                    )
                with contextlib.suppress(TrajectoryExistsError):  # opened concurrently
                    await self.store.open(TrajectoryMeta(trajectory_id=trajectory_id))
                n_segments = 0
            elif status == "closed":
                raise APIError(
                    409, f"trajectory {trajectory_id!r} is closed", code="trajectory_closed"
                )
            else:
                n_segments = (await self.store.counters(trajectory_id)).get("segments", 0)
            digest = None if status is None else await self.store.token_digest(trajectory_id)
        except _STORE_ERRORS as exc:
            raise APIError(
                503, f"trajectory store unavailable: {exc}", code="store_unavailable"
            ) from None
        runtime = self.trajectories.get(trajectory_id)  # another request may have raced us
        if runtime is None:
            runtime = TrajectoryRuntime(trajectory_id, n_segments=n_segments, token_digest=digest)
            self.trajectories[trajectory_id] = runtime
            self.metrics.open_trajectories.set(float(len(self.trajectories)))
        return runtime

    async def _flush(self, runtime: TrajectoryRuntime) -> None:
        write = runtime.pending()
        if not write:
            return
        try:
            await self.store.append(runtime.trajectory_id, list(write.entries), write.counters)
        except _STORE_ERRORS as exc:
            self.metrics.store_errors.inc()
            log.warning(
                "trajectory %s: write-through failed (%d entries kept in memory): %s",
                runtime.trajectory_id,
                len(write.entries),
                exc,
            )
            raise APIError(
                503, f"trajectory store unavailable: {exc}", code="store_unavailable"
            ) from None
        runtime.written(write)

    async def close_trajectory(self, trajectory_id: str, outcome: Outcome | None) -> dict[str, Any]:
        self.validate_id(trajectory_id)
        runtime = self.trajectories.get(trajectory_id)
        try:
            if runtime is not None:
                async with runtime.lock:
                    await self._flush(runtime)
            status = await self.store.status(trajectory_id)
            if status is None:
                raise APIError(
                    404, f"unknown trajectory {trajectory_id!r}", code="trajectory_not_found"
                )
            kept = await self.store.close(trajectory_id, outcome)
            counters = await self.store.counters(trajectory_id)
        except _STORE_ERRORS as exc:
            raise APIError(
                503, f"trajectory store unavailable: {exc}", code="store_unavailable"
            ) from None
        self.trajectories.pop(trajectory_id, None)
        self.router.forget(trajectory_id)
        self.metrics.open_trajectories.set(float(len(self.trajectories)))
        return {
            "trajectory_id": trajectory_id,
            "status": "closed",
            "outcome": kept.model_dump(mode="json") if kept else None,
            "counters": counters,
        }

    async def get_trajectory(self, trajectory_id: str) -> tuple[dict[str, Any], list[bytes]]:
        """The record as JSON (plus its status) and its raw binary entries."""
        self.validate_id(trajectory_id)
        runtime = self.trajectories.get(trajectory_id)
        try:
            if runtime is not None and runtime.pending():
                async with runtime.lock:
                    await self._flush(runtime)
            record = await self.store.load(trajectory_id)
            status = await self.store.status(trajectory_id)
            raw = await self.store.raw_entries(trajectory_id)
        except TrajectoryNotFoundError:
            raise APIError(
                404, f"unknown trajectory {trajectory_id!r}", code="trajectory_not_found"
            ) from None
        except _STORE_ERRORS as exc:
            raise APIError(
                503, f"trajectory store unavailable: {exc}", code="store_unavailable"
            ) from None
        view = record.to_json()
        view["status"] = status
        view["n_turns"] = record.n_turns
        view["n_tokens"] = record.n_tokens
        return view, raw

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
                except (APIError, *_STORE_ERRORS):
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
        except (*_STORE_ERRORS, TimeoutError) as exc:
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
            try:
                reported = await engine.client.get_weight_version()
            except Exception as exc:  # a down engine is part of the answer, not an error
                reported = None
                engine.last_error = engine.last_error or str(exc)
            engines.append(
                {
                    "url": engine.url,
                    "healthy": engine.healthy,
                    "weight_version": reported,
                    "inflight": engine.inflight,
                    "trajectories": engine.assigned,
                    "last_error": engine.last_error or None,
                }
            )
        state = self.weights.state
        return {
            "current_version": state.version,
            "model_path": state.model_path,
            "refreshes": state.refreshes,
            "last_refresh": state.last_refresh or None,
            "gate_open": self.gate.is_open,
            "engines": engines,
        }
