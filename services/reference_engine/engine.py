"""The reference engine's scheduler: one worker thread that steps all running requests together.

The HTTP server (``reference_server``) never runs the model itself; it validates requests, hands
them to :class:`ReferenceEngine` and awaits their outputs, so the event loop never blocks. The
engine thread loops: apply control commands (abort, pause, continue, weight updates, cache
flush), admit waiting requests (prefill, reusing cached prefixes), then advance every running
request by one token with a batched decode step.

Control semantics follow SGLang 0.5.23 (its tokenizer manager and scheduler):

* A request sent while generation is paused, or while a weight update waits for or holds
  SGLang's writer lock (``TokenizerManager.model_update_lock``), is *held*: on SGLang it waits in
  the tokenizer manager (``is_pause_cond`` / the reader lock) and has not reached the scheduler,
  so ``/abort_request`` and ``abort_all`` do not see it (only its client leaving drops it) and it
  does not count as queued. It joins the scheduler's queue once the pause or the update is over.
* ``pause(in_place | retract)`` holds running requests where they are and queues new ones;
  ``continue`` resumes them. (``retract`` behaves like ``in_place`` here: there is no KV memory
  pressure to relieve; on SGLang retracted requests leave the running batch.)
* ``pause(abort)`` aborts everything running or queued (``finish_reason.type == "abort"``) and
  then holds new requests until ``continue``.
* A request aborted while queued (never prefilled) answers as SGLang's
  ``TokenizerManager._handle_abort_req`` does, without ``prompt_tokens`` or ``cached_tokens``;
  a running one finishes through the normal output (:mod:`services.reference_engine.outputs`).
* Weight updates and the weight-update session calls are *exclusive* operations
  (:meth:`ReferenceEngine.exclusive`): while not paused each waits, like SGLang's writer lock,
  for every request sent before it (running or queued) to finish, new ones being held; while
  paused it runs at once. A load records the weight version, then flushes the prefix cache if
  asked (``SchedulerWeightUpdaterManager.flush_cache_after_weight_update``): a flush refused
  because requests are running (or queued, when not paused in place) fails the call although
  the weights are loaded and the version recorded.
* Every finished output carries the weight version the scheduler holds when it finishes;
  streamed chunks and ``/model_info`` report the tokenizer manager's version
  (:attr:`ReferenceEngine.tokenizer_weight_version`), which only a *successful* update moves.
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
from services.reference_engine.outputs import (
    QUEUED_ABORT_MESSAGE,
    queued_abort_output,
    request_output,
)

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


FLUSH_BUSY_MESSAGE = (
    "Weights were updated, but the cache was not flushed because requests are still running or "
    "queued. Retract or finish them, then call /flush_cache."
)


class EngineStoppedError(RuntimeError):
    """The engine shut down before an exclusive operation ran."""


@dataclass(frozen=True)
class WeightUpdateResult:
    """What the scheduler answers for a load (``UpdateWeightFromDiskReqOutput`` and kin)."""

    success: bool
    message: str


@dataclass
class _Exclusive:
    """An operation SGLang runs under ``model_update_lock.writer_lock`` (or at once, paused)."""

    run: Callable[[], Any]
    future: Future[Any]
    writer: bool  # took the writer lock (sent while not paused): new requests are held


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
        self.weight_version = weight_version  # the scheduler's: what finished outputs carry
        # The tokenizer manager's (``/model_info``, streamed chunks): moved by successful
        # updates only (``_update_weight_version_if_provided``).
        self.tokenizer_weight_version = weight_version
        self.scripted = scripted
        self.original_logprobs = original_logprobs
        self.max_running = max_running
        self.max_batch = max_batch
        self.admit_per_step = admit_per_step
        self.prefix_cache = PrefixCache(max_tokens=prefix_cache_tokens)
        self._rng = random.Random(seed)
        self._cond = threading.Condition()
        self._commands: list[Callable[[], None]] = []
        self._held: deque[EngineRequest] = deque()  # not yet in the scheduler (see module doc)
        self._waiting: deque[EngineRequest] = deque()  # the scheduler's waiting queue
        self._running: list[EngineRequest] = []
        self._rids: set[str] = set()
        self._exclusive: deque[_Exclusive] = deque()
        self._writers = 0  # exclusive operations holding or waiting for the writer lock
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
        """The scheduler's running and waiting requests (held ones are not in it yet)."""
        with self._cond:
            return {"num_running_reqs": len(self._running), "num_waiting_reqs": len(self._waiting)}

    def num_held(self) -> int:
        with self._cond:
            return len(self._held)

    def submit(self, request: EngineRequest) -> None:
        """Queue a request (held while paused or behind a weight update); raises ValueError for
        a duplicate request id."""
        with self._cond:
            if request.rid in self._rids:
                raise ValueError(f"Duplicate request ID: {request.rid}")
            self._rids.add(request.rid)
            if self._paused is not None or self._writers:
                self._held.append(request)
            else:
                self._waiting.append(request)
            self._cond.notify_all()

    def set_weight_version(self, version: str) -> Future[None]:
        """The scheduler's side of SGLang's ``/update_weight_version``: finished outputs carry
        ``version`` from now on."""

        def record() -> None:
            self.weight_version = version

        return self._command(record)

    def abort(self, rid: str = "", abort_all: bool = False) -> Future[int]:
        """SGLang's ``AbortReq`` to the scheduler: queued and running requests (held ones have
        not reached it)."""
        return self._command(lambda: self._abort(rid, abort_all, "Aborted by /abort_request."))

    def cancel(self, rid: str) -> Future[int]:
        """The client of ``rid`` left: drop it wherever it is (held ones included)."""
        return self._command(lambda: self._cancel(rid))

    def pause(self, mode: PauseMode) -> Future[int]:
        return self._command(lambda: self._pause(mode))

    def resume(self) -> Future[None]:
        return self._command(self._resume)

    def flush_cache(self) -> Future[bool]:
        return self._command(self._flush_cache)

    def exclusive[T](self, operation: Callable[[], T]) -> Future[T]:
        """Run ``operation`` on the engine thread where SGLang would hold its tokenizer
        manager's ``model_update_lock.writer_lock``: once every request sent before it has
        finished (requests sent meanwhile are held), or at once while generation is paused
        (SGLang then takes no lock)."""
        future: Future[T] = Future()
        with self._cond:
            writer = self._paused is None
            if writer:
                self._writers += 1
            item = _Exclusive(operation, future, writer)
            self._commands.append(lambda: self._exclusive.append(item))
            self._cond.notify_all()
        return future

    def update_weights(
        self,
        tensors: dict[str, torch.Tensor],
        version: str | None,
        flush_cache: bool = True,
        loaded_message: str = "Succeeded to update model weights.",
        on_loaded: Callable[[], None] | None = None,
    ) -> Future[WeightUpdateResult]:
        """Load ``tensors`` as an exclusive operation (see :meth:`_load`)."""
        return self.exclusive(
            lambda: self._load(tensors, version, flush_cache, loaded_message, on_loaded)
        )

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
        return bool(self._running or self._exclusive or self._waiting)

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
                self._run_exclusive()
                continue
            try:
                self._step()
            except Exception:  # keep serving: fail the requests of this step, not the server
                logger.exception("engine step failed; aborting running requests")
                for request in list(self._running):
                    self._finish(request, {"type": "abort", "message": "internal engine error"})

    def _step(self) -> None:
        if self._exclusive and not self._running and not self._waiting:
            self._run_exclusive()  # the writer lock: every request sent before has finished
        admitted = 0
        while self._waiting and len(self._running) < self.max_running:
            if admitted >= self.admit_per_step:
                break
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
        """End a request that was prefilled (SGLang's batch output path)."""
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

    def _finish_queued(self, request: EngineRequest, message: str) -> None:
        """End a request aborted before its prefill (SGLang's ``AbortReq`` back to the
        tokenizer manager, answered by ``_handle_abort_req``)."""
        request.finish = {"type": "abort", "message": message}
        with self._cond:
            self._rids.discard(request.rid)
        request.sink(queued_abort_output(request, self.weight_version, self.scripted), True)

    def _output(self, request: EngineRequest) -> dict[str, Any]:
        finished = request.finish is not None
        version = self.weight_version if finished else self.tokenizer_weight_version
        return request_output(request, self.runner.tokenizer, version, self.scripted)

    def _take_waiting(self, match: Callable[[EngineRequest], bool]) -> list[EngineRequest]:
        with self._cond:
            taken = [r for r in self._waiting if match(r)]
            for request in taken:
                self._waiting.remove(request)
        return taken

    def _abort(self, rid: str, abort_all: bool, message: str) -> int:
        """``Scheduler.abort_request``: queued requests leave the queue and answer as queued
        aborts; running ones finish with an abort."""

        def match(request: EngineRequest) -> bool:
            return abort_all or request.rid == rid

        queued = self._take_waiting(match)
        for request in queued:
            self._finish_queued(request, QUEUED_ABORT_MESSAGE)
        running = [r for r in self._running if match(r)]
        for request in running:
            self._finish(request, {"type": "abort", "message": message})
        return len(queued) + len(running)

    def _cancel(self, rid: str) -> int:
        with self._cond:
            held = [r for r in self._held if r.rid == rid]
            for request in held:
                self._held.remove(request)
        for request in held:
            self._finish_queued(request, QUEUED_ABORT_MESSAGE)
        return len(held) + self._abort(rid, False, "Aborted by /abort_request.")

    def _pause(self, mode: PauseMode) -> int:
        if mode == "abort":
            self._abort("", True, "Aborted by /pause_generation (mode=abort).")
        with self._cond:
            self._paused = mode
        return len(self._running)

    def _resume(self) -> None:
        with self._cond:
            self._paused = None
        self._release_held()

    def _release_held(self) -> None:
        """Held requests reach the scheduler once neither a pause nor a writer holds them."""
        with self._cond:
            if self._paused is None and not self._writers:
                self._waiting.extend(self._held)
                self._held.clear()
                self._cond.notify_all()

    def _busy(self) -> bool:
        """Not ``Scheduler.is_fully_idle(ignore_waiting=_engine_paused)``: requests running, or
        queued unless the scheduler is paused (in place or retract; an abort-mode pause stays
        in the tokenizer manager)."""
        scheduler_paused = self._paused in ("in_place", "retract")
        return bool(self._running) or (bool(self._waiting) and not scheduler_paused)

    def _flush_cache(self) -> bool:
        """``Scheduler.flush_cache``: refused (False) while busy."""
        if self._busy():
            return False
        self.prefix_cache.clear()
        return True

    def _run_exclusive(self) -> None:
        while self._exclusive:
            item = self._exclusive.popleft()
            try:
                item.future.set_result(item.run())
            except Exception as exc:  # surfaced to the caller through the future
                item.future.set_exception(exc)
            if item.writer:
                with self._cond:
                    self._writers -= 1
        self._release_held()

    def _load(
        self,
        tensors: dict[str, torch.Tensor],
        version: str | None,
        flush_cache: bool,
        loaded_message: str,
        on_loaded: Callable[[], None] | None,
    ) -> WeightUpdateResult:
        """``SchedulerWeightUpdaterManager.update_weights_from_*``: load, then record the
        version, then flush; a refused flush fails the call with the weights loaded and the
        version recorded (``flush_cache_after_weight_update``)."""
        try:
            self.runner.apply_weights(tensors)
        except Exception as exc:
            return WeightUpdateResult(False, f"Failed to update weights: {exc}.")
        if on_loaded is not None:
            on_loaded()
        if version is not None:
            self.weight_version = version
        logger.info("weights updated; weight_version=%s", self.weight_version)
        if flush_cache and not self._flush_cache():
            return WeightUpdateResult(False, FLUSH_BUSY_MESSAGE)
        return WeightUpdateResult(True, loaded_message)

    def _fail_all(self, message: str) -> None:
        with self._cond:
            queued = list(self._held) + list(self._waiting)
            self._held.clear()
            self._waiting.clear()
        for request in queued:
            self._finish_queued(request, message)
        for request in list(self._running):
            self._finish(request, {"type": "abort", "message": message})
        for item in self._exclusive:
            item.future.set_exception(EngineStoppedError(message))
        self._exclusive.clear()
