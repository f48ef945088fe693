"""The stand-in for SGLang's scheduler process: SGLang's messages in, SGLang's messages out, the
tiny model on the CPU in between (docs/sglang-conformance.md says which part is whose).

SGLang's scheduler cannot run without a GPU (its model runner, memory pools and attention
kernels are CUDA code), so this thread takes its place behind SGLang's real
``TokenizerManager``: it receives what the manager sends over the same ZMQ sockets, in SGLang's
own msgpack encoding (``TokenizedGenerateReqInput``, ``AbortReq``, pause/continue, flush and
weight-update requests) and answers with SGLang's own structures. Whatever of SGLang's
scheduler runs on a CPU is used as it is:

* each request is SGLang's ``Req`` (``schedule_batch.py``): its finish checks (stop strings,
  stop tokens, length, ``to_finish`` for aborts), output ids and logprob lists;
* outputs are built by SGLang's ``_GenerationStreamAccumulator`` (``output_streamer.py``) into
  ``BatchTokenIDOutput`` for SGLang's real ``DetokenizerManager`` (run by the harness);
* a request aborted while queued is answered by SGLang's ``_make_abort_req``;
* ``/flush_cache`` goes through SGLang's ``SchedulerFlushWrapper``;
* every weight request goes to SGLang's ``SchedulerWeightUpdaterManager`` (sessions, one bucket
  at a time, version recording, the flush after an update) and, below it, SGLang's
  ``WeightUpdater`` (the process group of ``init_custom_process_group``, the broadcast receive,
  the load of a received bucket); ``/get_weights_by_name`` goes through SGLang's
  ``WeightExporter`` over the SGLang model class that SGLang's registry picks for the model's
  architecture.

What is this module's own: the loop (admit, prefill, one decode step for all running requests,
stream), mirroring ``Scheduler.abort_request`` / ``pause_generation`` / ``continue_generation``
/ ``is_fully_idle``; the forward passes and sampling (swerl's reference engine
``ModelRunner``, float32); the model view under SGLang's weight code (loads tensors into that
model by checkpoint name); ``update_weights_from_disk``'s file reading; the weight version,
which SGLang's scheduler keeps in its own process (here: in this object, apart from the
tokenizer manager's). There is no prefix cache (``cached_tokens`` is 0).
"""

from __future__ import annotations

import dataclasses
import logging
import random
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

import msgspec
import torch
import zmq

from services.reference_engine.model_runner import ModelRunner, SamplingState

logger = logging.getLogger(__name__)

POLL_IDLE_MS = 20


def _replace_slots_init(cls: type, **fields: Any) -> Any:
    """An instance of the slots dataclass ``cls`` with ``fields`` set, without its
    ``__post_init__`` (SchedulerWeightUpdaterManager's reads the TP group of a GPU scheduler)."""
    obj = object.__new__(cls)
    for field in dataclasses.fields(cls):
        if field.name in fields:
            value = fields[field.name]
        elif field.default is not dataclasses.MISSING:
            value = field.default
        elif field.default_factory is not dataclasses.MISSING:
            value = field.default_factory()
        else:
            raise TypeError(f"{cls.__name__}.{field.name} needs a value")
        object.__setattr__(obj, field.name, value)
    return obj


class ModelView(torch.nn.Module):
    """The model as SGLang's weight code sees it (``get_model()``): SGLang's ``load_weights``
    contract (an iterable of ``(name, tensor)``, applied one by one) over the reference
    runner's model, and SGLang's model class of the architecture for the methods only some
    classes have (``get_weights_by_name``: llama, granite, opt, exaone4, embedding_gemma2)."""

    def __init__(self, runner: ModelRunner, sglang_cls: type) -> None:
        super().__init__()
        self.inner = runner.model
        self._runner = runner
        self._sglang_cls = sglang_cls

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        shapes = self._runner.weight_shapes()
        for name, tensor in weights:  # one by one, as SGLang's models load
            if name not in shapes:
                raise KeyError(f"{name} is not a parameter of {self._sglang_cls.__name__}")
            if tuple(tensor.shape) != shapes[name]:
                raise ValueError(
                    f"{name} has shape {list(tensor.shape)}, the parameter's is "
                    f"{list(shapes[name])}"
                )
            self._runner.apply_weights({name: tensor})

    def __getattr__(self, name: str) -> Any:
        if name == "get_weights_by_name":
            if callable(getattr(self._sglang_cls, name, None)):
                return self._weights_by_name
            raise AttributeError(f"'{self._sglang_cls.__name__}' object has no attribute {name!r}")
        return super().__getattr__(name)

    def _weights_by_name(self, name: str, truncate_size: int = 100, tp_size: int = 1) -> Any:
        tensor = self._runner.weight_by_name(name)
        if tensor is None:
            return None
        return tensor.detach().float()[:truncate_size].tolist()


class _WeightExporterShim:
    """What SGLang's ``WeightExporter.get_weights_by_name`` reads of its exporter."""

    tp_size = 1

    def __init__(self, view: ModelView, exporter_class: type) -> None:
        self._view = view
        self._exporter_class = exporter_class

    def get_model(self) -> ModelView:
        return self._view

    def _weight_export_unsupported_reason(self) -> str | None:
        return self._exporter_class._weight_export_unsupported_reason(self)  # type: ignore[no-any-return]


@dataclasses.dataclass
class SchedulerOptions:
    max_running_requests: int = 8
    step_delay_s: float = 0.0  # test knob: slows every decode step (to catch requests running)
    seed: int = 0


class CPUScheduler:
    """The scheduler thread; ``start()`` connects it to the manager's sockets."""

    def __init__(self, sglang: Any, runner: ModelRunner, options: SchedulerOptions) -> None:
        self.sg = sglang  # the SGLang modules (harness.SGLangModules)
        self.runner = runner
        self.options = options
        self.model_config = sglang.tokenizer_manager_model_config
        self.version: str | None = sglang.initial_weight_version
        self.waiting: list[Any] = []
        self.running: list[Any] = []
        self.paused = False
        self.stop_event = threading.Event()
        self.ready = threading.Event()
        self.error: BaseException | None = None
        self.step_count = 0
        self._rng = random.Random(options.seed)
        self._thread = threading.Thread(target=self._main, name="sglang-cpu-scheduler", daemon=True)
        self._lock = threading.Lock()
        self.view = ModelView(runner, sglang.model_cls)
        self._exporter = _WeightExporterShim(self.view, sglang.WeightExporter)

    # -------------------------------------------------------------- public (any thread)

    def start(self) -> None:
        self._thread.start()
        if not self.ready.wait(30):
            raise RuntimeError("the CPU scheduler did not start")
        if self.error is not None:
            raise RuntimeError("the CPU scheduler failed to start") from self.error

    def stop(self) -> None:
        self.stop_event.set()
        self._thread.join(timeout=30)

    def counts(self) -> tuple[int, int]:
        """(running, waiting) requests, as SGLang's scheduler would count them."""
        with self._lock:
            return len(self.running), len(self.waiting)

    # -------------------------------------------------------------- thread

    def _main(self) -> None:
        sg = self.sg
        context = zmq.Context(1)
        try:
            self.recv = sg.get_zmq_socket(
                context, zmq.PULL, sg.port_args.scheduler_input_ipc_name, False
            )
            self.send_to_tokenizer = sg.get_zmq_socket(
                context, zmq.PUSH, sg.port_args.tokenizer_ipc_name, False
            )
            self.send_to_detokenizer = sg.get_zmq_socket(
                context, zmq.PUSH, sg.port_args.detokenizer_ipc_name, False
            )
            self.tokenizer = sg.get_scheduler_tokenizer()
            self._init_sglang_parts()
        except BaseException as exc:
            self.error = exc
            self.ready.set()
            context.destroy(linger=0)
            return
        self.ready.set()
        poller = zmq.Poller()
        poller.register(self.recv, zmq.POLLIN)
        try:
            while not self.stop_event.is_set():
                timeout = 0 if self._can_step() else POLL_IDLE_MS
                while poller.poll(timeout):
                    message = sg.sock_recv(self.recv)
                    try:
                        self._dispatch(message)
                    except Exception as exc:  # SGLang's scheduler would die; the test fails
                        logger.exception("CPU scheduler: %s failed", type(message).__name__)
                        self.error = self.error or exc
                    timeout = 0
                self.flush_wrapper.check_pending()
                if self._can_step():
                    self._step()
        except BaseException as exc:  # reported by the harness at teardown
            logger.exception("CPU scheduler failed")
            self.error = exc
        finally:
            for name in list(self.weight_updater_low._model_update_group):
                self.weight_updater_low.destroy_weights_update_group(name)
            context.destroy(linger=0)

    def _init_sglang_parts(self) -> None:
        sg = self.sg
        scheduler = self

        class _Runner:
            """SGLang's model runner as the weight-update manager addresses it."""

            weight_updater = None  # set below

        self.weight_updater_low = sg.make_weight_updater(
            model_config=self.model_config,
            get_model=lambda: self.view,
            scheduler=self,
        )
        _Runner.weight_updater = self.weight_updater_low
        runner = _Runner()

        class _TpWorker:
            """SGLang's TpModelWorker as the weight-update manager addresses it."""

            model_runner = runner

            @staticmethod
            def weight_update_runners() -> list[tuple[str, Any]]:
                return [("target", runner)]

            @staticmethod
            def init_weights_update_group(recv_req: Any) -> tuple[bool, str]:
                return scheduler.weight_updater_low.init_weights_update_group(
                    recv_req.master_address,
                    recv_req.master_port,
                    recv_req.rank_offset,
                    recv_req.world_size,
                    recv_req.group_name,
                    recv_req.backend,
                )

            @staticmethod
            def destroy_weights_update_group(recv_req: Any) -> tuple[bool, str]:
                return scheduler.weight_updater_low.destroy_weights_update_group(
                    recv_req.group_name
                )

            @staticmethod
            def get_weights_by_name(recv_req: Any) -> Any:
                return sg.WeightExporter.get_weights_by_name(
                    scheduler._exporter, recv_req.name, recv_req.truncate_size
                )

        self.weight_updater = _replace_slots_init(
            sg.SchedulerWeightUpdaterManager,
            tp_worker=_TpWorker(),
            draft_worker=None,
            memory_saver_adapter=None,
            flush_cache=self.flush_cache,
            is_fully_idle=self.is_fully_idle,
            scheduler=self,
            tp_cpu_group=torch.distributed.group.WORLD,
        )
        self.flush_wrapper = sg.SchedulerFlushWrapper(
            flush_cache=self.flush_cache,
            is_fully_idle=self.is_fully_idle,
            send_output=lambda output, _req: self._send_to_tokenizer(output),
        )
        wu = self.weight_updater
        io = sg.io
        self._handlers: dict[type, Callable[[Any], Any]] = {
            io.TokenizedGenerateReqInput: self.handle_generate_request,
            io.AbortReq: self.abort_request,
            io.FlushCacheReqInput: self.flush_wrapper.handle,
            io.GetInternalStateReq: self.get_internal_state,
            io.PauseGenerationReqInput: self.pause_generation,
            io.ContinueGenerationReqInput: self.continue_generation,
            io.UpdateWeightFromDiskReqInput: wu.update_weights_from_disk,
            io.InitWeightsUpdateGroupReqInput: wu.init_weights_update_group,
            io.DestroyWeightsUpdateGroupReqInput: wu.destroy_weights_update_group,
            io.BeginWeightUpdateReqInput: wu.begin_weight_update,
            io.EndWeightUpdateReqInput: wu.end_weight_update,
            io.UpdateWeightsFromDistributedReqInput: wu.update_weights_from_distributed,
            io.GetWeightsByNameReqInput: wu.get_weights_by_name,
            io.UpdateWeightVersionReqInput: self.handle_update_weight_version,
        }

    def _send_to_tokenizer(self, obj: Any) -> None:
        self.sg.sock_send(self.send_to_tokenizer, obj)

    def _dispatch(self, recv_req: Any) -> None:
        handler = self._handlers.get(type(recv_req))
        if handler is None:
            logger.warning("CPU scheduler ignores %s", type(recv_req).__name__)
            return
        output = handler(recv_req)
        if output is not None:
            self._send_to_tokenizer(output)

    # -------------------------------------------------------------- SGLang's handlers

    def handle_generate_request(self, recv_req: Any) -> None:
        """``Scheduler._handle_generate_request`` for a plain text-model request."""
        recv_req.unwrap_pickle_fields()
        req = self.sg.Req(
            recv_req.rid,
            recv_req.input_text,
            recv_req.input_ids,
            recv_req.sampling_params,
            return_logprob=recv_req.return_logprob,
            top_logprobs_num=recv_req.top_logprobs_num,
            token_ids_logprob=recv_req.token_ids_logprob,
            stream=recv_req.stream,
            eos_token_ids=self.model_config.hf_eos_token_id,
            vocab_size=self.model_config.vocab_size,
            http_worker_ipc=recv_req.http_worker_ipc,
            time_stats=recv_req.time_stats,
        )
        req.tokenizer = self.tokenizer
        if req.sampling_params.max_new_tokens is None:
            req.sampling_params.max_new_tokens = self.runner.context_length - len(
                req.origin_input_ids
            )
        if recv_req.logprob_start_len == -1:
            # SGLang: with return_logprob and no start, output logprobs only
            req.logprob_start_len = len(req.origin_input_ids) if recv_req.return_logprob else -1
        else:
            req.logprob_start_len = recv_req.logprob_start_len
        with self._lock:
            self.waiting.append(req)

    def abort_request(self, recv_req: Any) -> None:
        """``Scheduler.abort_request``: a queued request is popped and answered with an
        ``AbortReq`` (no output, no prompt_tokens); a running one gets ``to_finish`` and
        finishes with its next decode step."""
        with self._lock:
            queued = [
                r for r in self.waiting if recv_req.abort_all or r.rid.startswith(recv_req.rid)
            ]
            for req in queued:
                self.waiting.remove(req)
        for req in queued:
            abort = self.sg.make_abort_req(req, finished_reason=recv_req.finished_reason)
            spans = self.sg.compute_weight_version_spans(
                req.weight_version_events,
                current_version=self.version,
                num_output_tokens=len(req.output_ids),
            )
            self._send_to_tokenizer(msgspec.structs.replace(abort, weight_versions=spans))
        for req in list(self.running):
            if not req.finished() and (recv_req.abort_all or req.rid.startswith(recv_req.rid)):
                if recv_req.abort_message:
                    req.to_finish = self.sg.FINISH_ABORT(recv_req.abort_message, 503)
                else:
                    req.to_finish = self.sg.FINISH_ABORT()

    def pause_generation(self, recv_req: Any) -> None:
        """``Scheduler.pause_generation`` (``abort`` never reaches the scheduler: the
        tokenizer manager aborts everything itself). ``retract`` puts the running requests
        back in the queue; they are prefilled again, output included, after continue."""
        assert recv_req.mode in ("in_place", "retract")
        self.paused = True
        if recv_req.mode == "retract":
            with self._lock:
                retracted = [r for r in self.running if not r.finished()]
                self.running = []
                for req in retracted:
                    req.kv_state = None
                    req.retraction_count += 1
                self.waiting = retracted + self.waiting

    def continue_generation(self, recv_req: Any) -> None:
        self.paused = False

    def get_internal_state(self, recv_req: Any) -> Any:
        sg = self.sg
        state = sg.get_context().resolved_server_args_dict()
        state.pop("custom_sigquit_handler", None)
        state["weight_version"] = self.version
        return sg.io.GetInternalStateReqOutput(internal_state=sg.msgspec_to_builtins(state))

    def handle_update_weight_version(self, recv_req: Any) -> Any:
        self.record_weight_version_change(recv_req.new_version)
        return self.sg.io.UpdateWeightVersionReqOutput()

    # -------------------------------------------------------------- what SGLang's parts call

    def record_weight_version_change(self, new_version: str | None) -> None:
        """``Scheduler.record_weight_version_change``: the scheduler's own version (its
        process's config), and a version event on every live request with output."""
        if new_version is None or new_version == self.version:
            return
        old = self.version
        self.version = new_version
        with self._lock:
            live = [*self.running, *self.waiting]
        self.sg.record_weight_version_events(live, old_version=old)

    def is_fully_idle(self, for_health_check: bool = False, ignore_waiting: bool = False) -> bool:
        with self._lock:
            idle = not self.running
            if not ignore_waiting:
                idle = idle and not self.waiting
        return idle

    def flush_cache(self, empty_cache: bool = True) -> bool:
        """``Scheduler.flush_cache``: refused while requests run (or wait, unless paused)."""
        if self.is_fully_idle(ignore_waiting=self.paused):
            return True  # nothing cached: the stand-in keeps no prefix cache
        logger.warning("Cache not flushed because there are pending requests.")
        return False

    def load_from_disk(self, model_path: str, load_format: str | None) -> tuple[bool, str]:
        """The stand-in for SGLang's model loader: read the checkpoint's tensors, load them."""
        try:
            tensors = self.runner.read_weights(model_path)
        except Exception as exc:
            return False, f"Failed to get weights iterator: {exc}."
        try:
            self.view.load_weights(tensors.items())
        except Exception as exc:
            return False, f"Failed to update weights: {exc}.\nRolling back to original weights."
        return True, "Succeeded to update model weights."

    # -------------------------------------------------------------- the loop

    def _can_step(self) -> bool:
        return not self.paused and bool(self.running or self.waiting)

    def _step(self) -> None:
        admitted: list[Any] = []
        with self._lock:
            while self.waiting and len(self.running) < self.options.max_running_requests:
                req = self.waiting.pop(0)
                self.running.append(req)
                admitted.append(req)
        for req in admitted:
            self._prefill(req)
        if self.options.step_delay_s:
            time.sleep(self.options.step_delay_s)
        self._decode()
        self.step_count += 1

    def _sampling_state(self, req: Any) -> SamplingState:
        params = req.sampling_params
        generator = torch.Generator()
        seed = params.sampling_seed
        generator.manual_seed(seed if seed is not None else self._rng.getrandbits(63))
        top_k = params.top_k if params.top_k < self.runner.vocab_size else -1
        return SamplingState(
            temperature=params.temperature,
            top_p=params.top_p,
            top_k=top_k,
            min_p=params.min_p,
            greedy=params.top_k == 1,
            generator=generator,
        )

    def _prefill(self, req: Any) -> None:
        prompt = list(req.origin_input_ids)
        tokens = prompt + list(req.output_ids)  # a retracted request re-prefills its output
        start = req.logprob_start_len
        want_input = req.return_logprob and 0 <= start < len(prompt) and not req.output_ids
        logits_from = max(start - 1, 0) if want_input else len(tokens) - 1
        kv, logits = self.runner.prefill(tokens, None, logits_from)
        req.kv_state = kv
        req.next_logits = logits[-1]
        if not hasattr(req, "sampling_state"):
            req.sampling_state = self._sampling_state(req)
        if req.return_logprob and req.logprob.input_token_logprobs_val is None:
            values: list[float | None] = []
            ids: list[int] = []
            if want_input:
                logprobs = torch.log_softmax(logits, dim=-1)
                for position in range(start, len(prompt)):
                    ids.append(prompt[position])
                    if position == 0:
                        values.append(None)
                    else:
                        row = logprobs[position - 1 - logits_from]
                        values.append(float(row[prompt[position]]))
            req.logprob.input_token_logprobs_val = values
            req.logprob.input_token_logprobs_idx = ids
            req.logprob.input_top_logprobs_val = [None] * len(values)
            req.logprob.input_top_logprobs_idx = [None] * len(values)

    def _decode(self) -> None:
        with self._lock:
            batch = list(self.running)
        if not batch:
            return
        states = [r.sampling_state for r in batch]
        logits = torch.stack([r.next_logits for r in batch])
        reported = ModelRunner.reported_logprobs_batch(logits, states, False)
        tokens = ModelRunner.choose_batch(logits, reported, states, False, [None] * len(batch))
        for row, req in enumerate(batch):
            token = tokens[row]
            req.output_ids.append(token)
            if req.return_logprob:
                req.logprob.output_token_logprobs_val.append(float(reported[row, token]))
                req.logprob.output_token_logprobs_idx.append(token)
                k = req.logprob.top_logprobs_num
                if k:
                    top = torch.topk(reported[row], min(k, reported.shape[-1]))
                    req.logprob.output_top_logprobs_val.append(top.values.tolist())
                    req.logprob.output_top_logprobs_idx.append(top.indices.tolist())
            req.update_finish_state()
            if not req.finished() and len(req.origin_input_ids) + len(req.output_ids) >= (
                self.runner.context_length
            ):
                req.finished_reason = self.sg.FINISH_LENGTH(length=len(req.output_ids))
        self._stream(batch)
        finished = [r for r in batch if r.finished()]
        continuing = [r for r in batch if not r.finished()]
        with self._lock:
            for req in finished:
                self.running.remove(req)
                req.kv_state = req.next_logits = None
        if continuing:
            results = self.runner.decode([(r.kv_state, r.output_ids[-1]) for r in continuing])
            for req, (kv, next_logits) in zip(continuing, results, strict=True):
                req.kv_state, req.next_logits = kv, next_logits

    def _stream(self, reqs: list[Any]) -> None:
        """``SchedulerOutputStreamer._stream_output_generation``: SGLang's accumulator decides
        what to send (every finished request; a streamed one at its interval) and builds the
        ``BatchTokenIDOutput`` for the detokenizer."""
        acc = self.sg.make_stream_accumulator(
            return_logprob=any(r.return_logprob for r in reqs), current_weight_version=self.version
        )
        for req in reqs:
            if req.finished() and req.finished_output:
                continue
            acc.accept(req=req)
        payload = acc.to_payload(dp_rank=0, is_idle_batch=False)
        if payload is not None:
            self.sg.sock_send(self.send_to_detokenizer, payload)
