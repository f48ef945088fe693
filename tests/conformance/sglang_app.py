"""SGLang's own HTTP server, in this process, on the CPU: the conformance tier's engine.

:func:`import_sglang` imports ``sglang.srt.entrypoints.http_server`` once (about 9 s) and gathers
the parts of SGLang the harness uses. :class:`SGLangEngine` then assembles, per test, what
``sglang serve`` assembles on a GPU machine, minus the GPU:

* SGLang's FastAPI ``app`` with its real routes, body parsing into SGLang's ``io_struct``
  types, the ``/generate`` contract check, response encoding and status codes; driven without
  a socket through ``httpx.ASGITransport`` (:meth:`SGLangEngine.client` is swerl's
  ``SGLangClient`` over it);
* SGLang's real ``TokenizerManager`` (built by SGLang's ``init_tokenizer_manager`` from a real
  ``ServerArgs`` published as SGLang's launcher does) in ``_global_state``: tokenization,
  request states, the pause condition and the model-update lock, abort handling,
  ``meta_info`` assembly, the weight-update calls;
* SGLang's real ``DetokenizerManager`` in a thread (text, stop trimming);
* a stand-in for the scheduler process, :class:`tests.conformance.cpu_scheduler.CPUScheduler`,
  speaking SGLang's ZMQ messages and built from SGLang's scheduler parts where they run on a
  CPU, over the tiny model.

The manager is a subclass of SGLang's that changes one thing: its output loop is started
without signal handlers and without SGLang's "kill the process tree" on an error (that would
end the test run); an error there fails the test instead.

The import sets the event loop policy to uvloop, a root log handler, warning filters and some
cache environment variables: :func:`import_sglang` puts them back as they were, so the rest of
the suite runs as before (SGLang's code runs on asyncio's default loop here).
"""

from __future__ import annotations

import asyncio
import copy
import logging
import os
import threading
import time
import types
import warnings
from collections.abc import Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import torch
import torch.distributed as dist
import zmq

from adapter.engines.sglang import SGLangClient
from services.reference_engine.model_runner import ModelRunner
from tests.conformance.cpu_scheduler import CPUScheduler, SchedulerOptions

SGLANG_VERSION = "0.5.23"
BASE_URL = "http://sglang"
SCENARIO_TIMEOUT_S = 180.0

_MODULES: types.SimpleNamespace | None = None
IMPORT_SECONDS: float | None = None


def import_sglang() -> types.SimpleNamespace:
    """SGLang's HTTP server module and the parts the harness uses (imported once)."""
    global _MODULES, IMPORT_SECONDS
    if _MODULES is not None:
        return _MODULES
    policy = asyncio.get_event_loop_policy()
    environ = dict(os.environ)
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    filters = list(warnings.filters)
    started = time.perf_counter()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import sglang
            from sglang.srt.disaggregation.utils import DisaggregationMode
            from sglang.srt.entrypoints import http_server
            from sglang.srt.entrypoints.engine import init_tokenizer_manager
            from sglang.srt.managers import io_struct
            from sglang.srt.managers.detokenizer_manager import DetokenizerManager
            from sglang.srt.managers.schedule_batch import FINISH_ABORT, FINISH_LENGTH, Req
            from sglang.srt.managers.scheduler import _make_abort_req
            from sglang.srt.managers.scheduler_components.flush_wrapper import (
                SchedulerFlushWrapper,
            )
            from sglang.srt.managers.scheduler_components.output_streamer import (
                DEFAULT_FORCE_STREAM_INTERVAL,
                _GenerationStreamAccumulator,
            )
            from sglang.srt.managers.scheduler_components.weight_updater import (
                SchedulerWeightUpdaterManager,
            )
            from sglang.srt.managers.tokenizer_manager import ServerStatus, TokenizerManager
            from sglang.srt.model_executor.model_runner_components.weight_exporter import (
                WeightExporter,
            )
            from sglang.srt.model_executor.model_runner_components.weight_updater import (
                WeightUpdater,
            )
            from sglang.srt.models.registry import ModelRegistry
            from sglang.srt.runtime_context import get_context, publish
            from sglang.srt.server_args import PortArgs, ServerArgs
            from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
            from sglang.srt.utils.hf_transformers_utils import get_tokenizer
            from sglang.srt.utils.msgspec_utils import msgspec_to_builtins
            from sglang.srt.utils.network import get_zmq_socket
            from sglang.srt.utils.weight_versions import (
                compute_weight_version_spans,
                record_weight_version_events,
            )
    finally:
        IMPORT_SECONDS = time.perf_counter() - started
        asyncio.set_event_loop_policy(policy)
        os.environ.clear()
        os.environ.update(environ)
        root.handlers[:] = handlers
        root.setLevel(level)
        warnings.filters[:] = filters
    if sglang.__version__ != SGLANG_VERSION:
        raise RuntimeError(
            f"sglang {sglang.__version__} is installed, the tier is written for {SGLANG_VERSION}"
            " (docs/sglang-conformance.md: bumping the version)"
        )
    _MODULES = types.SimpleNamespace(
        version=sglang.__version__,
        http_server=http_server,
        app=http_server.app,
        io=io_struct,
        init_tokenizer_manager=init_tokenizer_manager,
        TokenizerManager=TokenizerManager,
        ServerStatus=ServerStatus,
        DetokenizerManager=DetokenizerManager,
        Req=Req,
        FINISH_ABORT=FINISH_ABORT,
        FINISH_LENGTH=FINISH_LENGTH,
        make_abort_req=_make_abort_req,
        SchedulerFlushWrapper=SchedulerFlushWrapper,
        SchedulerWeightUpdaterManager=SchedulerWeightUpdaterManager,
        WeightUpdater=WeightUpdater,
        WeightExporter=WeightExporter,
        GenerationStreamAccumulator=_GenerationStreamAccumulator,
        DEFAULT_FORCE_STREAM_INTERVAL=DEFAULT_FORCE_STREAM_INTERVAL,
        SpeculativeAlgorithm=SpeculativeAlgorithm,
        DisaggregationMode=DisaggregationMode,
        ModelRegistry=ModelRegistry,
        get_context=get_context,
        publish=publish,
        PortArgs=PortArgs,
        ServerArgs=ServerArgs,
        get_tokenizer=get_tokenizer,
        msgspec_to_builtins=msgspec_to_builtins,
        get_zmq_socket=get_zmq_socket,
        sock_send=io_struct.sock_send,
        sock_recv=io_struct.sock_recv,
        compute_weight_version_spans=compute_weight_version_spans,
        record_weight_version_events=record_weight_version_events,
    )
    return _MODULES


def _cpu_weight_updater_class(sg: types.SimpleNamespace) -> type:
    """SGLang's ``WeightUpdater`` with its disk load replaced (SGLang's model loader builds
    SGLang's model classes, which need GPU kernels); its process group, broadcast receive,
    bucket load and session hooks are SGLang's."""

    class CPUWeightUpdater(sg.WeightUpdater):  # type: ignore[misc, name-defined]
        def update_weights_from_disk(
            self,
            model_path: str,
            load_format: str | None,
            weight_name_filter: Any = None,
            recapture_cuda_graph: bool = False,
        ) -> tuple[bool, str]:
            # the stand-in scheduler reads the checkpoint and loads it into the model view
            return self.get_model_runner().load_from_disk(model_path, load_format)

    return CPUWeightUpdater


@dataclass
class EngineOptions:
    """One engine of the tier: the model directory and the stand-in scheduler's knobs."""

    model_dir: Path
    weight_version: str = "0"
    max_running_requests: int = 8
    step_delay_s: float = 0.0
    seed: int = 0
    server_args: dict[str, Any] = field(default_factory=dict)  # more ServerArgs fields


class SGLangEngine:
    """``async with SGLangEngine(options) as engine:`` -- SGLang's server in this process."""

    def __init__(self, options: EngineOptions) -> None:
        self.options = options
        self.sg = import_sglang()
        self.http: httpx.AsyncClient | None = None
        self.scheduler: CPUScheduler | None = None
        self.tokenizer_manager: Any = None
        self._detok_stop = threading.Event()
        self._detok_thread: threading.Thread | None = None
        self._detok_error: BaseException | None = None
        self._own_default_group = False
        self._clients: list[SGLangClient] = []

    # ------------------------------------------------------------------ life cycle

    async def __aenter__(self) -> SGLangEngine:
        sg = self.sg
        options = self.options
        if not dist.is_initialized():
            # SGLang's scheduler processes have a default group (their TP world): its weight
            # code asserts one and barriers on it. One rank, gloo, in-memory store.
            dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
            self._own_default_group = True
        server_args = sg.ServerArgs(
            model_path=str(options.model_dir),
            device="cpu",
            weight_version=options.weight_version,
            **options.server_args,
        )
        sg.publish(server_args, role="tokenizer")  # what SGLang's launcher does first
        port_args = sg.PortArgs.init_new(server_args)
        manager_class = _safe_manager_class(sg)
        manager, template_manager = sg.init_tokenizer_manager(
            server_args, port_args, TokenizerManagerClass=manager_class
        )
        runner = ModelRunner(options.model_dir)
        scheduler_info = {
            "max_req_input_len": runner.context_length - 1,
            "max_total_num_tokens": runner.context_length,
            "startup_time": {},
        }
        manager.max_req_input_len = scheduler_info["max_req_input_len"]
        manager.set_startup_time(scheduler_info["startup_time"])
        self.tokenizer_manager = manager
        model_cls, _ = sg.ModelRegistry.resolve_model_cls(
            list(manager.model_config.hf_config.architectures)
        )
        modules = types.SimpleNamespace(
            **vars(sg),
            port_args=port_args,
            tokenizer_manager_model_config=manager.model_config,
            initial_weight_version=options.weight_version,
            model_cls=model_cls,
            get_scheduler_tokenizer=lambda: copy.deepcopy(manager.tokenizer),
            make_weight_updater=lambda **kw: _make_weight_updater(sg, **kw),
            make_stream_accumulator=lambda **kw: _make_accumulator(sg, **kw),
        )
        self._start_detokenizer(server_args, port_args)
        self.scheduler = CPUScheduler(
            modules,
            runner,
            SchedulerOptions(
                max_running_requests=options.max_running_requests,
                step_delay_s=options.step_delay_s,
                seed=options.seed,
            ),
        )
        self.scheduler.start()
        manager.server_status = sg.ServerStatus.Up  # the launcher's step after warm-up
        sg.http_server.set_global_state(
            sg.http_server._GlobalState(
                tokenizer_manager=manager,
                template_manager=template_manager,
                scheduler_info=scheduler_info,
            )
        )
        self.http = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=sg.app), base_url=BASE_URL, timeout=300
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        for client in self._clients:
            await client.close()
        if self.http is not None:
            await self.http.aclose()
        if self.scheduler is not None:
            self.scheduler.stop()
        self._detok_stop.set()
        if self._detok_thread is not None:
            self._detok_thread.join(timeout=30)
        manager = self.tokenizer_manager
        if manager is not None:
            for task in list(manager.asyncio_tasks):
                task.cancel()
            manager.recv_from_detokenizer.close(linger=0)
            manager.send_to_scheduler.close(linger=0)
        self.sg.http_server.set_global_state(None)
        if self._own_default_group and dist.is_initialized():
            dist.destroy_process_group()
        errors = [
            e
            for e in (
                getattr(manager, "loop_error", None),
                self.scheduler.error if self.scheduler else None,
                self._detok_error,
            )
            if e is not None
        ]
        if torch.cuda.is_initialized():  # the tier must run SGLang's code without CUDA
            errors.append(RuntimeError("SGLang's code initialised CUDA"))
        if errors and exc[0] is None:
            raise RuntimeError(f"the SGLang harness failed: {errors!r}") from errors[0]

    def _start_detokenizer(self, server_args: Any, port_args: Any) -> None:
        sg = self.sg
        ready = threading.Event()

        def run() -> None:
            try:
                manager = sg.DetokenizerManager(server_args, port_args)
            except BaseException as exc:
                self._detok_error = exc
                ready.set()
                return
            ready.set()
            poller = zmq.Poller()
            poller.register(manager.recv_from_scheduler, zmq.POLLIN)
            try:
                while not self._detok_stop.is_set():
                    if poller.poll(20):
                        # DetokenizerManager.event_loop, one message at a time
                        message = sg.sock_recv(manager.recv_from_scheduler)
                        output = manager._request_dispatcher(message)
                        if output is not None:
                            sg.sock_send(manager.send_to_tokenizer, output)
            except BaseException as exc:
                self._detok_error = exc
            finally:
                manager.recv_from_scheduler.close(linger=0)
                manager.send_to_tokenizer.close(linger=0)

        self._detok_thread = threading.Thread(target=run, name="sglang-detokenizer", daemon=True)
        self._detok_thread.start()
        ready.wait(60)
        if self._detok_error is not None:
            raise RuntimeError("SGLang's DetokenizerManager did not start") from self._detok_error

    # ------------------------------------------------------------------ use

    def client(self, **kwargs: Any) -> SGLangClient:
        """swerl's engine client, talking to SGLang's app in-process."""
        assert self.http is not None
        client = SGLangClient(BASE_URL, client=self.http, **kwargs)
        self._clients.append(client)
        return client

    @property
    def url(self) -> str:
        return BASE_URL

    def weights(self, name: str) -> torch.Tensor:
        """The served value of a tensor (checkpoint name), read from the stand-in's model."""
        assert self.scheduler is not None
        tensor = self.scheduler.runner.weight_by_name(name)
        assert tensor is not None, name
        return tensor.detach().clone()

    @property
    def scheduler_version(self) -> str | None:
        """The weight version SGLang's scheduler process holds (its outputs carry it)."""
        assert self.scheduler is not None
        return self.scheduler.version

    async def wait_until(self, running: int = 0, waiting: int = 0, timeout: float = 60) -> None:
        """Wait until the scheduler holds at least ``running`` / ``waiting`` requests."""
        assert self.scheduler is not None
        deadline = time.monotonic() + timeout
        while True:
            now_running, now_waiting = self.scheduler.counts()
            if now_running >= running and now_waiting >= waiting:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"scheduler holds {now_running} running, {now_waiting} waiting; wanted "
                    f">= {running}, >= {waiting}"
                )
            await asyncio.sleep(0.01)


def _make_weight_updater(
    sg: types.SimpleNamespace, *, model_config: Any, get_model: Any, scheduler: Any
) -> Any:
    return _cpu_weight_updater_class(sg)(
        tp_rank=0,
        device="cpu",
        gpu_id=0,
        model_config=model_config,
        custom_weight_loaders={},
        get_model=get_model,
        update_model_fields=lambda *args, **kwargs: None,
        recapture_cuda_graph=lambda: None,
        get_model_runner=lambda: scheduler,
    )


def _make_accumulator(
    sg: types.SimpleNamespace, *, return_logprob: bool, current_weight_version: str | None
) -> Any:
    """``SchedulerOutputStreamer._stream_output_generation``'s accumulator, as the scheduler of
    a plain text model (no speculative decoding, no disaggregation) builds it."""
    return sg.GenerationStreamAccumulator(
        return_logprob=return_logprob,
        return_hidden_states=False,
        return_routed_experts=False,
        return_indexer_topk=False,
        spec_algorithm=sg.SpeculativeAlgorithm.NONE,
        disaggregation_mode=sg.DisaggregationMode.NULL,
        default_stream_interval=1,
        default_force_stream_interval=sg.DEFAULT_FORCE_STREAM_INTERVAL,
        get_cached_tokens_details=lambda req: None,
        is_request_level_customized_info_key=lambda key: False,
        rust_server_mode=False,
        current_weight_version=current_weight_version,
    )


def _safe_manager_class(sg: types.SimpleNamespace) -> type:
    """SGLang's TokenizerManager whose output loop neither installs signal handlers nor kills
    the process on an error (the loop itself, ``handle_loop``, is SGLang's)."""

    class CPUTokenizerManager(sg.TokenizerManager):  # type: ignore[misc, name-defined]
        loop_error: BaseException | None = None

        def auto_create_handle_loop(self) -> None:
            if self.event_loop is not None:
                return
            loop = asyncio.get_running_loop()

            async def guarded() -> None:
                try:
                    await self.handle_loop()
                except asyncio.CancelledError:
                    raise
                except BaseException as exc:  # surfaced by SGLangEngine.__aexit__
                    logging.getLogger(__name__).exception("TokenizerManager.handle_loop failed")
                    self.loop_error = exc

            self.asyncio_tasks.add(loop.create_task(guarded()))
            self.event_loop = loop

    return CPUTokenizerManager


def checkpoint(model_dir: Path) -> dict[str, torch.Tensor]:
    """The tensors of a checkpoint directory, by name."""
    from safetensors.torch import load_file

    tensors: dict[str, torch.Tensor] = {}
    for file in sorted(model_dir.glob("*.safetensors")):
        tensors.update(load_file(str(file)))
    return tensors


def run(scenario: Coroutine[Any, Any, Any], timeout: float = SCENARIO_TIMEOUT_S) -> Any:
    """Run one test scenario on a fresh event loop (SGLang's manager binds to the loop it
    first runs on: one engine per scenario), bounded: a hang fails the test, not the run."""
    return asyncio.run(asyncio.wait_for(scenario, timeout))
