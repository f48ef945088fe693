"""Reference inference engine: SGLang's native HTTP protocol on a transformers model (CPU, fp32).

``python -m services.reference_engine.server --model DIR --port P [--script FILE]``

It exists so that the SGLang client and everything above it (adapter, recorder, trainer
recomputation) run against the real wire format on a machine without a GPU. Endpoints and
fields follow SGLang's ``http_server.py`` / ``io_struct.py``:

==========================================  =================================================
``POST|PUT /generate``                      ``input_ids`` (list or batch) or ``text``,
                                            ``sampling_params``, ``return_logprob``,
                                            ``logprob_start_len``, ``top_logprobs_num``
                                            (``meta_info.output_top_logprobs``),
                                            ``return_text_in_logprobs``, ``rid``,
                                            ``stream`` (SSE ``data: {...}`` chunks with
                                            cumulative output, then ``data: [DONE]``)
``POST /update_weights_from_disk``          ``{model_path, weight_version,
                                            abort_all_requests, flush_cache}`` ->
                                            ``{success, message, num_paused_requests}``,
                                            200 or 400 (no session needed)
``POST /init_weights_update_group``         ``{master_address, master_port, rank_offset,
                                            world_size, group_name, backend}`` ->
                                            ``{success, message}`` (joins a gloo broadcast
                                            group)
``POST /destroy_weights_update_group``      ``{group_name}`` -> ``{success, message}``
``POST /begin_weight_update``               ``{selector}`` -> ``{success, message}``; opens
                                            the session distributed updates need
``POST /end_weight_update``                 ``{}`` -> ``{success, message}``
``POST /update_weights_from_distributed``   ``{names, dtypes, shapes, group_name,
                                            flush_cache, weight_version}`` -> ``{success,
                                            message}``; one bucket, loaded at once; see
                                            :mod:`services.reference_engine.distributed_weights`
``GET|POST /get_weights_by_name``           ``{name, truncate_size}`` -> a JSON list, or 400
                                            for architectures SGLang does not implement it
                                            for (``--get-weights-by-name``)
``POST /pause_generation``                  ``{mode: abort | in_place | retract}``
``POST /continue_generation``               ``{}``
``POST /abort_request``                     ``{rid, abort_all}`` -> empty 200
``GET|POST /flush_cache``                   ``?timeout=S``; text; 400 "Flush cache failed."
                                            while requests are running (or queued, unless
                                            paused in place)
``GET /model_info``, ``/get_model_info``    includes ``weight_version``
``GET /health``, ``/health_generate``       200 or 503
``GET /get_weight_version``                 ``{weight_version}`` (older SGLang; current
                                            SGLang reports it in ``/model_info`` only)
``GET /get_load``                           running / waiting request counts
``GET /server_info``, ``/get_server_info``  includes ``tp_size`` (the latter deprecated in
                                            SGLang 0.5.23, served by both)
==========================================  =================================================

A weight load with ``flush_cache`` (the default) while requests are running or queued answers
400 "Weights were updated, but the cache was not flushed ..." with the weights loaded and the
version recorded, as SGLang 0.5.23 does (:mod:`services.reference_engine.engine`).

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
  also aborts rids that start with it); ``retract`` pauses like ``in_place`` (so a weight load
  with ``flush_cache`` during a ``retract`` pause fails as busy, where SGLang, whose retracted
  requests leave the running batch, flushes).
* A running request that is aborted says which call aborted it in ``finish_reason.message``
  (SGLang: ``"Aborted"`` with ``status_code`` and ``err_type``); a queued one says SGLang's
  ``"Abort in waiting queue"``.

Layout: this module holds the command line and :func:`create_app`, which assembles the routers of
:mod:`services.reference_engine.routes` (generate, weights, control, info) around a
:class:`~services.reference_engine.state.ServerState` injected as a dependency; request
validation lives in :mod:`services.reference_engine.generate_requests`.

**Scripted mode** (``--script FILE``, see :mod:`services.reference_engine.script`): outputs are
replayed from a script instead of sampled, with the loaded model's real logprobs. It is test
machinery; ``/model_info`` says ``"scripted": true`` and every ``meta_info`` carries
``"scripted": true``.
"""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI

from services.reference_engine.distributed_weights import DistributedReceiver
from services.reference_engine.engine import ReferenceEngine
from services.reference_engine.model_runner import ModelRunner
from services.reference_engine.routes import control, generate, info, weights
from services.reference_engine.script import ScriptBook, ScriptError
from services.reference_engine.state import ServerState

__all__ = ["ServerState", "build_state", "create_app", "main", "parse_args"]

logger = logging.getLogger("services.reference_engine.server")


def create_app(state: ServerState) -> FastAPI:
    """The engine's FastAPI application around ``state`` (the engine loop runs with the app)."""

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        state.engine.start()
        try:
            yield
        finally:
            state.engine.stop()

    app = FastAPI(title="swerl reference engine (SGLang protocol)", lifespan=lifespan)
    app.state.server = state
    if state.receiver is None:
        state.receiver = DistributedReceiver(state.runner, tp_size=state.tp_size)
    for module in (info, generate, weights, control):
        app.include_router(module.router)
    return app


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
        engine=engine,
        runner=runner,
        model_path=str(model_dir.resolve()),
        script=script,
        tp_size=args.tp_size,
        get_weights_by_name=args.get_weights_by_name,
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
    parser.add_argument("--port", type=int, required=True, help="port to listen on")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (127.0.0.1)")
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
        "--tp-size",
        type=int,
        default=1,
        help="ranks this engine takes in a weight-update group, reported as tp_size by "
        "/get_server_info: SGLang joins it with every tensor-parallel worker; the reference "
        "engine computes in one process and only takes the same ranks (1)",
    )
    parser.add_argument(
        "--get-weights-by-name",
        choices=("sglang", "always"),
        default="sglang",
        help="sglang (default): /get_weights_by_name answers only for the architectures whose "
        "SGLang 0.5.23 model class implements it (llama, granite, opt, exaone4, gemma2 "
        "embedding and their subclasses) and fails for the rest (Qwen3, ...), as SGLang does; "
        "always: answer for any model (tests that read weights back)",
    )
    parser.add_argument(
        "--seed", type=int, default=None, help="seed for requests without sampling_seed"
    )
    parser.add_argument(
        "--max-running-requests",
        type=int,
        default=64,
        help="requests admitted at once; more wait in a queue (64)",
    )
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
    parser.add_argument(
        "--log-level",
        default="info",
        help="uvicorn log level: critical, error, warning, info, debug",
    )
    args = parser.parse_args(argv)
    if not 0 < args.port < 65536:
        parser.error(f"--port must be in 1..65535, got {args.port}")
    if args.tp_size < 1:
        parser.error(f"--tp-size must be >= 1, got {args.tp_size}")
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
