"""The reference engine's scheduler: one worker thread that steps all running requests together.

The HTTP server (``reference_server``) never runs the model itself; it validates requests, hands
them to :class:`ReferenceEngine` and awaits their outputs, so the event loop never blocks. The
engine thread loops: apply control commands (abort, pause, continue, weight updates, cache
flush), admit waiting requests (prefill, reusing cached prefixes), then advance every running
request by one token with a batched decode step.

Control semantics follow SGLang:

* ``pause(in_place | retract)`` holds running requests where they are and queues new ones;
  ``continue`` resumes them. (``retract`` behaves like ``in_place`` here: there is no KV memory
  pressure to relieve.)
* ``pause(abort)`` aborts everything running or waiting (``finish_reason.type == "abort"``) and
  then holds new requests until ``continue``.
* ``update_weights`` while not paused waits for the running requests to finish (new ones wait),
  like SGLang's writer lock; while paused it applies at once; ``abort_all_requests`` aborts
  first. Every output carries the weight version that was current when it was produced.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import torch

from services.protocol.sglang import PauseMode, SamplingParams
from services.reference_engine.model_runner import KVState, ModelRunner, PrefixCache, SamplingState

logger = logging.getLogger(__name__)

# Called on the engine thread with (output dict, finished); must not block.
OutputSink = Callable[[dict[str, Any], bool], None]


@dataclass(eq=False)  # identity semantics: requests are compared and removed by object
class EngineRequest:
    """One validated generate request as the engine runs it."""

    rid: str
    prompt: list[int]
    sampling: SamplingParams
    sink: OutputSink
    return_logprob: bool = False
    logprob_start_len: int = -1
    top_logprobs_num: int = 0
    return_text_in_logprobs: bool = False
    stream: bool = False
    forced: tuple[int, ...] | None = None
    created: float = field(default_factory=time.time)
    # Runtime state, owned by the engine thread.
    state: SamplingState | None = None
    kv: KVState | None = None
    next_logits: torch.Tensor | None = None
    output_ids: list[int] = field(default_factory=list)
    output_logprobs: list[float] = field(default_factory=list)
    output_top: list[list[list[Any]]] = field(default_factory=list)
    input_logprobs: list[list[Any]] = field(default_factory=list)
    cached_tokens: int = 0
    finish: dict[str, Any] | None = None


@dataclass
class _WeightUpdate:
    tensors: dict[str, torch.Tensor]
    version: str | None
    future: Future[tuple[bool, str, int]]
    flush_cache: bool = True


class ReferenceEngine:
    """Thread-safe front of the engine thread."""

    def __init__(
        self,
        runner: ModelRunner,
        weight_version: str = "default",
        scripted: bool = False,
        original_logprobs: bool = False,
        max_running: int = 64,
        max_batch: int = 32,
        admit_per_step: int = 4,
        prefix_cache_tokens: int = 131072,
        seed: int | None = None,
    ) -> None:
        self.runner = runner
        self.weight_version = weight_version
        self.scripted = scripted
        self.original_logprobs = original_logprobs
        self.max_running = max_running
        self.max_batch = max_batch
        self.admit_per_step = admit_per_step
        self.prefix_cache = PrefixCache(max_tokens=prefix_cache_tokens)
        self._rng = random.Random(seed)
        self._cond = threading.Condition()
        self._commands: list[Callable[[], None]] = []
        self._waiting: deque[EngineRequest] = deque()
        self._running: list[EngineRequest] = []
        self._rids: set[str] = set()
        self._updates: deque[_WeightUpdate] = deque()
        self._paused: PauseMode | None = None
        self._stopping = False
        self.steps = 0
        self.decoded_tokens = 0
        self._thread = threading.Thread(target=self._loop, name="reference-engine", daemon=True)

    # ------------------------------------------------------------------ public, any thread

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._thread.join(timeout=10)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    @property
    def paused(self) -> PauseMode | None:
        return self._paused

    def load(self) -> dict[str, int]:
        with self._cond:
            return {"num_running_reqs": len(self._running), "num_waiting_reqs": len(self._waiting)}

    def submit(self, request: EngineRequest) -> None:
        """Queue a request; raises ValueError for a duplicate request id."""
        with self._cond:
            if request.rid in self._rids:
                raise ValueError(f"Duplicate request ID: {request.rid}")
            self._rids.add(request.rid)
            self._waiting.append(request)
            self._cond.notify_all()

    def abort(self, rid: str = "", abort_all: bool = False) -> Future[int]:
        return self._command(lambda: self._abort(rid, abort_all, "Aborted by /abort_request."))

    def pause(self, mode: PauseMode) -> Future[int]:
        return self._command(lambda: self._pause(mode))

    def resume(self) -> Future[None]:
        return self._command(self._resume)

    def flush_cache(self) -> Future[bool]:
        return self._command(self._flush_cache)

    def update_weights(
        self,
        tensors: dict[str, torch.Tensor],
        version: str | None,
        abort_all: bool,
        flush_cache: bool = True,
    ) -> Future[tuple[bool, str, int]]:
        """Apply new weights once no request is running (at once if paused)."""
        result: Future[tuple[bool, str, int]] = Future()
        update = _WeightUpdate(tensors, version, result, flush_cache)

        def enqueue() -> None:
            if abort_all:
                self._abort("", True, "Aborted for a weight update (abort_all_requests).")
            self._updates.append(update)

        with self._cond:
            self._commands.append(enqueue)
            self._cond.notify_all()
        return result

    # ------------------------------------------------------------------ engine thread

    def _command[T](self, fn: Callable[[], T]) -> Future[T]:
        future: Future[T] = Future()

        def run() -> None:
            try:
                future.set_result(fn())
            except Exception as exc:  # surfaced to the caller through the future
                future.set_exception(exc)

        with self._cond:
            self._commands.append(run)
            self._cond.notify_all()
        return future

    def _has_work(self) -> bool:
        if self._stopping or self._commands:
            return True
        if self._paused is not None:
            return False
        return bool(self._running or self._updates or self._waiting)

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._has_work():
                    self._cond.wait()
                if self._stopping:
                    self._fail_all("The engine is shutting down.")
                    return
                commands, self._commands = self._commands, []
            for command in commands:
                command()
            if self._paused is not None:
                self._apply_updates()
                continue
            try:
                self._step()
            except Exception:  # keep serving: fail the requests of this step, not the server
                logger.exception("engine step failed; aborting running requests")
                for request in list(self._running):
                    self._finish(request, {"type": "abort", "message": "internal engine error"})

    def _step(self) -> None:
        if self._updates and not self._running:
            self._apply_updates()
        admitted = 0
        while (
            not self._updates
            and self._waiting
            and len(self._running) < self.max_running
            and admitted < self.admit_per_step
        ):
            with self._cond:
                request = self._waiting.popleft()
            try:
                self._admit(request)
            except Exception as exc:  # the request fails, the engine keeps serving
                logger.exception("prefill of %s failed", request.rid)
                self._finish(request, {"type": "abort", "message": f"prefill failed: {exc}"})
            admitted += 1
        if self._running:
            self._decode_running()
            self.steps += 1

    def _admit(self, request: EngineRequest) -> None:
        params = request.sampling
        generator = torch.Generator()
        seed = (
            params.sampling_seed if params.sampling_seed is not None else self._rng.getrandbits(63)
        )
        generator.manual_seed(seed)
        request.state = SamplingState(
            temperature=params.temperature,
            top_p=params.top_p,
            top_k=params.top_k,
            min_p=params.min_p,
            greedy=params.is_greedy,
            generator=generator,
        )
        prompt = request.prompt
        start = request.logprob_start_len if request.return_logprob else -1
        # With input logprobs requested, logits are needed from the row before logprob_start_len.
        logits_from = max(start - 1, 0) if 0 <= start < len(prompt) else len(prompt) - 1
        hit, prefix = self.prefix_cache.lookup(prompt, logits_from)
        request.cached_tokens = hit
        kv, logits = self.runner.prefill(prompt, prefix, logits_from)
        if request.return_logprob:
            request.input_logprobs = self._input_logprobs(prompt, start, logits, logits_from)
        request.kv = kv
        request.next_logits = logits[-1]
        self._running.append(request)
        if params.max_new_tokens == 0:
            self._finish(request, {"type": "length", "length": 0})

    @staticmethod
    def _input_logprobs(
        prompt: list[int], start: int, logits: torch.Tensor, logits_from: int
    ) -> list[list[Any]]:
        if not 0 <= start < len(prompt):
            return [[None, prompt[-1], None]]
        logprobs = torch.log_softmax(logits, dim=-1)
        entries: list[list[Any]] = []
        for position in range(start, len(prompt)):
            if position == 0:
                entries.append([None, prompt[0], None])
            else:
                row = logprobs[position - 1 - logits_from]
                entries.append([float(row[prompt[position]].item()), prompt[position], None])
        return entries

    def _decode_running(self) -> None:
        running = list(self._running)
        states: list[SamplingState] = [r.state for r in running]  # type: ignore[misc]
        logits = torch.stack([r.next_logits for r in running])  # type: ignore[misc]
        reported = ModelRunner.reported_logprobs_batch(logits, states, self.original_logprobs)
        forced = [r.forced[len(r.output_ids)] if r.forced is not None else None for r in running]
        tokens = ModelRunner.choose_batch(logits, reported, states, self.original_logprobs, forced)
        values = reported[torch.arange(len(running)), torch.tensor(tokens)].tolist()
        continuing: list[tuple[EngineRequest, int]] = []
        for row, request in enumerate(running):
            self._record(request, tokens[row], values[row], reported[row])
            if request.finish is None:
                continuing.append((request, tokens[row]))
        # Stable order by length: unchanged batches keep their rows and decode in place.
        continuing.sort(key=lambda item: item[0].kv.length if item[0].kv else 0)
        for start in range(0, len(continuing), self.max_batch):
            chunk = continuing[start : start + self.max_batch]
            results = self.runner.decode([(req.kv, token) for req, token in chunk])  # type: ignore[misc]
            for (request, _), (kv, next_logits) in zip(chunk, results, strict=True):
                request.kv = kv
                request.next_logits = next_logits
        self.decoded_tokens += len(continuing)

    def _record(
        self, request: EngineRequest, token: int, logprob: float, logprobs: torch.Tensor
    ) -> None:
        """Record a request's next token, and finish the request if it stops there."""
        request.output_ids.append(token)
        request.output_logprobs.append(logprob)
        if request.return_logprob and request.top_logprobs_num > 0:
            top = torch.topk(logprobs, min(request.top_logprobs_num, logprobs.shape[-1]))
            request.output_top.append(
                [
                    [float(v), int(i), None]
                    for v, i in zip(top.values.tolist(), top.indices.tolist(), strict=True)
                ]
            )
        finish = self._finish_reason(request, token)
        if finish is not None:
            self._finish(request, finish)
        elif request.stream:
            request.sink(self._output(request), False)

    def _finish_reason(self, request: EngineRequest, token: int) -> dict[str, Any] | None:
        params = request.sampling
        if not params.ignore_eos and token in self.runner.eos_token_ids:
            return {"type": "stop", "matched": token}
        if params.stop_token_ids and token in params.stop_token_ids:
            return {"type": "stop", "matched": token}
        stops = params.stop_strings()
        if stops:
            text = self.runner.tokenizer.decode(
                request.output_ids, skip_special_tokens=params.skip_special_tokens
            )
            for stop in stops:
                if stop in text:
                    return {"type": "stop", "matched": stop}
        if request.forced is not None and len(request.output_ids) >= len(request.forced):
            return {"type": "stop", "matched": token}
        if len(request.output_ids) >= params.max_new_tokens:
            return {"type": "length", "length": params.max_new_tokens}
        if len(request.prompt) + len(request.output_ids) >= self.runner.context_length:
            return {"type": "length", "length": len(request.output_ids)}
        return None

    def _finish(self, request: EngineRequest, finish: dict[str, Any]) -> None:
        request.finish = finish
        if request in self._running:
            self._running.remove(request)
        if finish["type"] != "abort" and request.kv is not None:
            self.prefix_cache.insert(request.prompt + request.output_ids, request.kv)
        request.kv = None
        request.next_logits = None
        with self._cond:
            self._rids.discard(request.rid)
        request.sink(self._output(request), True)

    def _output(self, request: EngineRequest) -> dict[str, Any]:
        params = request.sampling
        finish = request.finish
        text_ids = request.output_ids
        # SGLang leaves a matched stop token out of the text (not out of output_ids).
        trim_token = finish is not None and finish["type"] == "stop" and not params.no_stop_trim
        if trim_token and isinstance(finish.get("matched"), int) and text_ids:  # type: ignore[union-attr]
            text_ids = text_ids[:-1]
        text = self.runner.tokenizer.decode(
            text_ids, skip_special_tokens=params.skip_special_tokens
        )
        if (
            finish is not None
            and isinstance(finish.get("matched"), str)
            and not params.no_stop_trim
        ):
            position = text.find(finish["matched"])
            if position != -1:
                text = text[:position]
        meta: dict[str, Any] = {
            "id": request.rid,
            "finish_reason": finish,
            "prompt_tokens": len(request.prompt),
            "weight_version": self.weight_version,
            "total_retractions": 0,
            "completion_tokens": len(request.output_ids),
            "cached_tokens": request.cached_tokens,
        }
        if self.scripted:
            meta["scripted"] = True
        if request.return_logprob:
            texts = self._token_texts(request) if request.return_text_in_logprobs else None
            meta["input_token_logprobs"] = request.input_logprobs
            meta["output_token_logprobs"] = [
                [lp, tok, texts[i] if texts else None]
                for i, (lp, tok) in enumerate(
                    zip(request.output_logprobs, request.output_ids, strict=True)
                )
            ]
            if request.top_logprobs_num > 0:
                meta["input_top_logprobs"] = [None] * len(request.input_logprobs)
                meta["output_top_logprobs"] = (
                    [
                        [[lp, tok, self.runner.tokenizer.decode([tok])] for lp, tok, _ in row]
                        for row in request.output_top
                    ]
                    if request.return_text_in_logprobs
                    else request.output_top
                )
        if finish is not None:
            meta["e2e_latency"] = time.time() - request.created
        return {"text": text, "output_ids": list(request.output_ids), "meta_info": meta}

    def _token_texts(self, request: EngineRequest) -> list[str]:
        return [self.runner.tokenizer.decode([t]) for t in request.output_ids]

    def _abort(self, rid: str, abort_all: bool, message: str) -> int:
        with self._cond:
            waiting = [r for r in self._waiting if abort_all or r.rid == rid]
            for request in waiting:
                self._waiting.remove(request)
        victims = waiting + [r for r in self._running if abort_all or r.rid == rid]
        for request in victims:
            self._finish(request, {"type": "abort", "message": message})
        return len(victims)

    def _pause(self, mode: PauseMode) -> int:
        if mode == "abort":
            self._abort("", True, "Aborted by /pause_generation (mode=abort).")
        self._paused = mode
        return len(self._running)

    def _resume(self) -> None:
        self._paused = None

    def _flush_cache(self) -> bool:
        if self._running or self._waiting:
            return False
        self.prefix_cache.clear()
        return True

    def _apply_updates(self) -> None:
        while self._updates:
            update = self._updates.popleft()
            try:
                self.runner.apply_weights(update.tensors)
            except Exception as exc:
                update.future.set_result((False, f"Failed to apply weights: {exc}", 0))
                continue
            if update.flush_cache:
                self.prefix_cache.clear()
            if update.version is not None:
                self.weight_version = update.version
            held = len(self._running) if self._paused is not None else 0
            logger.info("weights updated; weight_version=%s", self.weight_version)
            update.future.set_result((True, "Succeeded to update model weights.", held))

    def _fail_all(self, message: str) -> None:
        with self._cond:
            waiting = list(self._waiting)
            self._waiting.clear()
        for request in waiting + list(self._running):
            self._finish(request, {"type": "abort", "message": message})
        for update in self._updates:
            update.future.set_result((False, message, 0))
        self._updates.clear()
