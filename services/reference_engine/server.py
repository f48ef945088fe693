"""Reference inference engine: SGLang's native HTTP protocol on a transformers model (CPU, fp32).

``python -m services.reference_engine.server --model DIR --port P [--script FILE]``

It exists so that the SGLang client and everything above it (adapter, recorder, trainer
recomputation) run against the real wire format on a machine without a GPU. Endpoints and
fields follow SGLang's ``http_server.py`` / ``io_struct.py``:

========================================  ===================================================
``POST|PUT /generate``                    ``input_ids`` (list or batch) or ``text``,
                                          ``sampling_params``, ``return_logprob``,
                                          ``logprob_start_len``, ``top_logprobs_num``
                                          (``meta_info.output_top_logprobs``),
                                          ``return_text_in_logprobs``, ``rid``,
                                          ``stream`` (SSE ``data: {...}`` chunks with
                                          cumulative output, then ``data: [DONE]``)
``POST /update_weights_from_disk``        ``{model_path, weight_version, abort_all_requests,
                                          flush_cache}`` -> ``{success, message,
                                          num_paused_requests}``, 200 or 400
``POST /init_weights_update_group``       ``{master_address, master_port, rank_offset,
                                          world_size, group_name, backend}`` -> ``{success,
                                          message}`` (joins a gloo/nccl broadcast group)
``POST /update_weights_from_distributed``  ``{names, dtypes, shapes, group_name, flush_cache,
                                          weight_version}`` -> ``{success, message}``; see
                                          :mod:`services.reference_engine.distributed_weights`
``POST /pause_generation``                ``{mode: abort | in_place | retract}``
``POST /continue_generation``             ``{}``
``POST /abort_request``                   ``{rid, abort_all}`` -> empty 200
``GET|POST /flush_cache``                 text; 400 while requests are running or waiting
``GET /model_info``, ``/get_model_info``  includes ``weight_version``
``GET /health``, ``/health_generate``     200 or 503
``GET /get_weight_version``               ``{weight_version}`` (older SGLang; current SGLang
                                          reports it in ``/model_info`` only)
``GET /get_load``                         running / waiting request counts
========================================  ===================================================

Errors: body shape errors -> 422 (FastAPI validation, as in SGLang); semantic errors (empty or
out-of-vocabulary ids, prompt too long, bad sampling values) -> 400 ``{"error": {"message"}}``.

Deliberate deviations (documented, none affects fields swerl reads):

* Logprobs are SGLang's default: ``log_softmax(logits / temperature)`` before top-k/top-p
  filtering (raw ``log_softmax(logits)`` for greedy requests, or always with
  ``--return-original-logprob`` / ``SGLANG_RETURN_ORIGINAL_LOGPROB=1``). Input logprobs are raw.
* Unknown ``sampling_params`` keys are a 400 (SGLang fails with a server error); penalties,
  ``n > 1``, ``min_new_tokens`` and constrained decoding (``json_schema``, ``regex``, ``ebnf``:
  there is no grammar backend) are refused with a 400 naming the field unless neutral.
* ``stream`` with a batch is refused (400); ``abort_request`` matches the rid exactly (SGLang
  also aborts rids that start with it); ``retract`` pauses like ``in_place``.

**Scripted mode** (``--script FILE``, see :mod:`services.reference_engine.script`): outputs are
replayed from a script instead of sampled, with the loaded model's real logprobs. It is test
machinery; ``/model_info`` says ``"scripted": true`` and every ``meta_info`` carries
``"scripted": true``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from http import HTTPStatus
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import ValidationError

from services.protocol.sglang import (
    IGNORED_SAMPLING_FIELDS,
    NEUTRAL_SAMPLING_DEFAULTS,
    AbortRequest,
    GenerateRequest,
    InitWeightsUpdateGroupRequest,
    PauseGenerationRequest,
    SamplingParams,
    UpdateWeightsFromDiskRequest,
    UpdateWeightsFromDistributedRequest,
)
from services.reference_engine.distributed_weights import (
    DistributedReceiver,
    DistributedUpdateError,
)
from services.reference_engine.engine import EngineRequest, ReferenceEngine
from services.reference_engine.model_runner import ModelRunner, WeightLoadError
from services.reference_engine.script import ScriptBook, ScriptError

logger = logging.getLogger("services.reference_engine.server")

HEALTH_CHECK_TIMEOUT_S = 20.0
DISCONNECT_POLL_S = 1.0
FLUSH_CACHE_TEXT = (
    "Cache flushed.\nPlease check backend logs for more details. "
    "(When there are running or waiting requests, the operation will not be performed.)\n"
)


@dataclass
class ServerState:
    engine: ReferenceEngine
    runner: ModelRunner
    model_path: str
    script: ScriptBook | None
    receiver: DistributedReceiver | None = None


def error_response(message: str, status: int = HTTPStatus.BAD_REQUEST) -> JSONResponse:
    """SGLang's error shape for a request it rejects."""
    return JSONResponse({"error": {"message": message}}, status_code=status)


# ---------------------------------------------------------------------------- validation


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
        sink=_no_sink,
        return_logprob=return_logprob,
        logprob_start_len=logprob_start_len,
        top_logprobs_num=top_logprobs_num,
        return_text_in_logprobs=body.return_text_in_logprobs,
        stream=body.stream,
        forced=forced,
    )


def _no_sink(output: dict[str, Any], finished: bool) -> None:
    raise RuntimeError("request submitted without an output sink")


# ---------------------------------------------------------------------------- running


def _attach_queue(request: EngineRequest) -> asyncio.Queue[tuple[dict[str, Any], bool]]:
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[dict[str, Any], bool]] = asyncio.Queue()

    def sink(output: dict[str, Any], finished: bool) -> None:
        loop.call_soon_threadsafe(queue.put_nowait, (output, finished))

    request.sink = sink
    return queue


async def _run_to_end(state: ServerState, request: EngineRequest, http: Request) -> dict[str, Any]:
    queue = _attach_queue(request)
    state.engine.submit(request)
    aborted = False
    while True:
        try:
            output, finished = await asyncio.wait_for(queue.get(), timeout=DISCONNECT_POLL_S)
        except TimeoutError:
            if not aborted and await http.is_disconnected():
                logger.info("client disconnected; aborting %s", request.rid)
                state.engine.abort(request.rid)
                aborted = True
            continue
        if finished:
            return output


async def _stream(state: ServerState, request: EngineRequest) -> AsyncIterator[bytes]:
    queue = _attach_queue(request)
    state.engine.submit(request)
    finished = False
    try:
        while not finished:
            output, finished = await queue.get()
            yield b"data: " + json.dumps(output).encode() + b"\n\n"
        yield b"data: [DONE]\n\n"
    finally:
        if not finished:
            state.engine.abort(request.rid)


# ---------------------------------------------------------------------------- app


def create_app(state: ServerState) -> FastAPI:
    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        state.engine.start()
        try:
            yield
        finally:
            state.engine.stop()

    app = FastAPI(title="swerl reference engine (SGLang protocol)", lifespan=lifespan)
    app.state.server = state

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200 if state.engine.alive else 503)

    @app.get("/health_generate")
    async def health_generate(http: Request) -> Response:
        if not state.engine.alive:
            return Response(status_code=503)
        if state.engine.load()["num_running_reqs"] and state.engine.paused is None:
            return Response(status_code=200)
        probe = EngineRequest(
            rid=f"HEALTH_CHECK_{uuid.uuid4().hex}",
            prompt=[0],
            sampling=SamplingParams(max_new_tokens=1, temperature=0.0),
            sink=_no_sink,
        )
        try:
            await asyncio.wait_for(_run_to_end(state, probe, http), HEALTH_CHECK_TIMEOUT_S)
        except TimeoutError:
            state.engine.abort(probe.rid)
            return Response(status_code=503)
        return Response(status_code=200)

    def model_info() -> dict[str, Any]:
        config = state.runner.config
        return {
            "model_path": state.model_path,
            "tokenizer_path": state.model_path,
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": state.engine.weight_version,
            "has_image_understanding": False,
            "has_audio_understanding": False,
            "model_type": getattr(config, "model_type", None),
            "architectures": getattr(config, "architectures", None),
            "engine": "swerl-reference-scripted" if state.script else "swerl-reference",
            "scripted": state.script is not None,
            "script_path": state.script.path if state.script else None,
            "context_length": state.runner.context_length,
            "vocab_size": state.runner.vocab_size,
        }

    @app.get("/model_info")
    async def get_model_info_new() -> dict[str, Any]:
        return model_info()

    @app.get("/get_model_info")
    async def get_model_info_old() -> dict[str, Any]:
        return model_info()

    @app.get("/get_weight_version")
    @app.get("/weight_version")
    async def weight_version() -> dict[str, Any]:
        return {"weight_version": state.engine.weight_version}

    @app.get("/get_load")
    async def get_load() -> list[dict[str, Any]]:
        load = state.engine.load()
        return [
            {
                "dp_rank": 0,
                "num_reqs": load["num_running_reqs"] + load["num_waiting_reqs"],
                "num_waiting_reqs": load["num_waiting_reqs"],
                "ts_tic": time.perf_counter(),
            }
        ]

    @app.get("/server_info")
    @app.get("/get_server_info")
    async def server_info() -> dict[str, Any]:
        return {
            **model_info(),
            "paused": state.engine.paused,
            "steps": state.engine.steps,
            "decoded_tokens": state.engine.decoded_tokens,
            "prefix_cache_entries": len(state.engine.prefix_cache),
            **state.engine.load(),
        }

    @app.api_route("/generate", methods=["POST", "PUT"], response_model=None)
    async def generate(
        body: GenerateRequest, http: Request
    ) -> Response | dict[str, Any] | list[Any]:
        try:
            requests = build_requests(body, state)
        except ValueError as exc:
            return error_response(str(exc))
        if body.stream:
            try:
                stream = _stream(state, requests[0])
                first = await anext(stream)
            except ValueError as exc:
                return error_response(str(exc))

            async def chained() -> AsyncIterator[bytes]:
                yield first
                async for chunk in stream:
                    yield chunk

            return StreamingResponse(chained(), media_type="text/event-stream")
        # JSONResponse directly: FastAPI's generic encoder walks every logprob entry.
        try:
            if not body.is_batch:
                return JSONResponse(await _run_to_end(state, requests[0], http))
            tasks = []
            for request in requests:
                tasks.append(asyncio.ensure_future(_run_to_end(state, request, http)))
                await asyncio.sleep(0)
            return JSONResponse(list(await asyncio.gather(*tasks)))
        except ValueError as exc:  # duplicate rid
            return error_response(str(exc))

    @app.post("/update_weights_from_disk")
    async def update_weights_from_disk(body: UpdateWeightsFromDiskRequest) -> JSONResponse:
        if body.load_format not in (None, "auto", "safetensors"):
            content = {
                "success": False,
                "message": f"load_format {body.load_format!r} is not supported",
                "num_paused_requests": 0,
            }
            return JSONResponse(content, status_code=HTTPStatus.BAD_REQUEST)
        started = time.perf_counter()
        try:
            tensors = await asyncio.to_thread(state.runner.read_weights, body.model_path)
        except WeightLoadError as exc:
            content = {"success": False, "message": str(exc), "num_paused_requests": 0}
            return JSONResponse(content, status_code=HTTPStatus.BAD_REQUEST)
        future = state.engine.update_weights(
            tensors, body.weight_version, body.abort_all_requests, body.flush_cache
        )
        success, message, paused = await asyncio.wrap_future(future)
        logger.info(
            "update_weights_from_disk %s -> %s (%.3f s): %s",
            body.model_path,
            state.engine.weight_version,
            time.perf_counter() - started,
            message,
        )
        content = {"success": success, "message": message, "num_paused_requests": paused}
        return JSONResponse(content, status_code=200 if success else HTTPStatus.BAD_REQUEST)

    add_distributed_weight_routes(app, state)

    @app.post("/pause_generation")
    async def pause_generation(body: PauseGenerationRequest) -> JSONResponse:
        await asyncio.wrap_future(state.engine.pause(body.mode))
        return JSONResponse({"message": "Generation paused successfully.", "status": "ok"})

    @app.post("/continue_generation")
    async def continue_generation(http: Request) -> JSONResponse:
        raw = await http.body()
        if raw.strip():
            try:
                parsed = json.loads(raw)
            except json.JSONDecodeError:
                parsed = None
            if not isinstance(parsed, dict):
                return JSONResponse(
                    {"detail": "continue_generation takes a JSON object body"}, status_code=422
                )
        await asyncio.wrap_future(state.engine.resume())
        return JSONResponse({"message": "Generation continued successfully.", "status": "ok"})

    @app.post("/abort_request")
    async def abort_request(body: AbortRequest) -> Response:
        await asyncio.wrap_future(state.engine.abort(body.rid, body.abort_all))
        return Response(status_code=200)

    @app.api_route("/flush_cache", methods=["GET", "POST"])
    async def flush_cache() -> Response:
        ok = await asyncio.wrap_future(state.engine.flush_cache())
        return Response(content=FLUSH_CACHE_TEXT, status_code=200 if ok else 400)

    return app


def _group_result(success: bool, message: str) -> JSONResponse:
    content = {"success": success, "message": message}
    return JSONResponse(content, status_code=200 if success else HTTPStatus.BAD_REQUEST)


def add_distributed_weight_routes(app: FastAPI, state: ServerState) -> None:
    """SGLang's ``/init_weights_update_group`` and ``/update_weights_from_distributed``."""
    if state.receiver is None:
        state.receiver = DistributedReceiver(state.runner)
    receiver = state.receiver

    @app.post("/init_weights_update_group")
    async def init_weights_update_group(body: InitWeightsUpdateGroupRequest) -> JSONResponse:
        try:
            message = await asyncio.to_thread(receiver.init_group, body)
        except DistributedUpdateError as exc:
            return _group_result(False, str(exc))
        return _group_result(True, message)

    @app.post("/update_weights_from_distributed")
    async def update_weights_from_distributed(
        body: UpdateWeightsFromDistributedRequest,
    ) -> JSONResponse:
        started = time.perf_counter()
        try:
            tensors = await asyncio.to_thread(receiver.receive, body)
        except DistributedUpdateError as exc:
            return _group_result(False, str(exc))
        except Exception as exc:  # a broken broadcast (peer gone, timeout)
            return _group_result(False, f"broadcast failed: {type(exc).__name__}: {exc}")
        if tensors is None:
            return _group_result(True, f"Staged {len(body.names)} tensors (no weight_version).")
        future = state.engine.update_weights(
            tensors, body.weight_version, body.abort_all_requests, body.flush_cache
        )
        success, message, _ = await asyncio.wrap_future(future)
        logger.info(
            "update_weights_from_distributed %d tensors -> %s (%.3f s): %s",
            len(tensors),
            state.engine.weight_version,
            time.perf_counter() - started,
            message,
        )
        return _group_result(success, message)


# ---------------------------------------------------------------------------- CLI


def build_state(args: argparse.Namespace) -> ServerState:
    model_dir = Path(args.model)
    if not (model_dir / "config.json").is_file():
        raise SystemExit(f"--model {args.model}: no config.json there (not a model directory)")
    runner = ModelRunner(model_dir, threads=args.threads)
    if args.context_length is not None:
        if args.context_length < 2:
            raise SystemExit("--context-length must be >= 2")
        runner.context_length = args.context_length
    script = None
    if args.script is not None:
        eos = runner.tokenizer.convert_tokens_to_ids("<|im_end|>")
        if not isinstance(eos, int) or eos < 0:
            eos = min(runner.eos_token_ids)
        try:
            script = ScriptBook.load(args.script, runner.tokenizer, eos, runner.vocab_size)
        except ScriptError as exc:
            raise SystemExit(str(exc)) from exc
    original = args.return_original_logprob or os.environ.get(
        "SGLANG_RETURN_ORIGINAL_LOGPROB", ""
    ).lower() in ("1", "true", "yes")
    engine = ReferenceEngine(
        runner,
        weight_version=args.weight_version,
        scripted=script is not None,
        original_logprobs=original,
        max_running=args.max_running_requests,
        max_batch=args.max_batch,
        prefix_cache_tokens=args.prefix_cache_tokens,
        seed=args.seed,
    )
    return ServerState(
        engine=engine, runner=runner, model_path=str(model_dir.resolve()), script=script
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m services.reference_engine.server",
        description=(
            "Reference inference engine speaking SGLang's native HTTP protocol on a transformers "
            "model (CPU, float32). With --script it runs in SCRIPTED MODE (test machinery): "
            "outputs are replayed from the script file, logprobs are the model's real ones."
        ),
    )
    parser.add_argument("--model", required=True, help="Hugging Face model directory")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument(
        "--script",
        default=None,
        help=(
            "SCRIPTED MODE: JSONL of assistant outputs to replay"
            " (see services.reference_engine.script)"
        ),
    )
    parser.add_argument("--weight-version", default="default", help="initial weight_version")
    parser.add_argument(
        "--context-length", type=int, default=None, help="override the context length"
    )
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument(
        "--seed", type=int, default=None, help="seed for requests without sampling_seed"
    )
    parser.add_argument("--max-running-requests", type=int, default=64)
    parser.add_argument(
        "--max-batch", type=int, default=32, help="requests per batched decode step"
    )
    parser.add_argument(
        "--prefix-cache-tokens", type=int, default=131072, help="prefix KV cache budget (0 = off)"
    )
    parser.add_argument(
        "--return-original-logprob",
        action="store_true",
        help="report log_softmax(logits) without temperature (SGLANG_RETURN_ORIGINAL_LOGPROB)",
    )
    parser.add_argument("--log-level", default="info")
    args = parser.parse_args(argv)
    if not 0 < args.port < 65536:
        parser.error(f"--port must be in 1..65535, got {args.port}")
    if args.max_running_requests < 1 or args.max_batch < 1:
        parser.error("--max-running-requests and --max-batch must be >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    import uvicorn

    args = parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    state = build_state(args)
    if state.script is not None:
        logger.warning(
            "SCRIPTED MODE: replaying %d scripts from %s (test machinery, not a policy)",
            len(state.script.scripts),
            state.script.path,
        )
    logger.info(
        "reference engine: model=%s vocab=%d context=%d weight_version=%s",
        state.model_path,
        state.runner.vocab_size,
        state.runner.context_length,
        state.engine.weight_version,
    )
    uvicorn.run(
        create_app(state),
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        access_log=False,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
