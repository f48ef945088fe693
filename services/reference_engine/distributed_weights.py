"""The reference engine's side of SGLang's distributed weight update, over torch.distributed.

``POST /init_weights_update_group {master_address, master_port, rank_offset, world_size,
group_name, backend}`` joins a broadcast group whose rank 0 is the trainer. SGLang joins it
with every tensor-parallel worker, worker ``t`` as rank ``rank_offset + t``, and each worker
receives every broadcast; the reference engine computes in one process, and with
``--tp-size N`` (reported as ``tp_size`` by ``/server_info``, as SGLang does) it takes the
same N ranks (N members of the group, each receiving every tensor, the first one's copy
applied), so the trainer's and the adapter's rank arithmetic is tested as on SGLang.
``POST /destroy_weights_update_group {group_name}`` leaves it (SGLang's
``WeightUpdater.destroy_weights_update_group`` and its messages).

``POST /update_weights_from_distributed {names, dtypes, shapes, group_name, flush_cache,
abort_all_requests, weight_version}`` carries one bucket and, as on SGLang 0.5.23
(``SchedulerWeightUpdaterManager.update_weights_from_distributed``), is refused outside a
``/begin_weight_update`` ... ``/end_weight_update`` session before anything is received
(:mod:`services.reference_engine.weight_session`). Inside one, each call receives its bucket
(a broadcast per tensor, in the order of ``names``) and **loads it at once**, between decode
steps: buckets apply one by one, and the call that carries ``weight_version`` records the
version (then flushes the prefix cache if ``flush_cache``, which fails the call when requests
are running: :data:`services.reference_engine.engine.FLUSH_BUSY_MESSAGE`). A bucket that fails
leaves the buckets before it applied: a half-updated model under the old version, which the
trainer must discard by sending a whole version again (SGLang's message says so). Answers are
``{success, message}`` with 200 or 400, as SGLang's.

Kept from before, compatible with SGLang (which also receives a bucket before loading it): a
bucket is *received in full before it is checked*, so a bucket that does not fit (a name the
model does not have, a wrong shape, a non-finite value) still completes every broadcast and the
trainer is never left waiting; then nothing of *that* bucket is loaded. Differences from
SGLang, on purpose: SGLang's Qwen3 loader logs a warning for an unknown name and loads the rest,
and loads a bucket tensor by tensor (a wrong shape midway leaves its first tensors loaded); the
reference engine refuses the whole bucket. Malformed requests (lists of different lengths,
which SGLang's ``zip`` would silently truncate) are refused before any broadcast is joined, as
are an unknown group or dtype (SGLang fails those before its broadcast too).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field

import torch

from services.protocol.sglang import (
    InitWeightsUpdateGroupRequest,
    UpdateWeightsFromDistributedRequest,
)
from services.reference_engine.model_runner import ModelRunner
from services.weight_group import WeightGroup, open_group, parse_dtype

logger = logging.getLogger(__name__)

GROUP_TIMEOUT_S = 600.0


RECEIVE_FAILED = "Failed to receive weights: {}"
LOAD_FAILED = (
    "Failed to update parameter online: {}. The full weights of the ModelRunner are partially "
    "updated. Please discard the whole weights."
)
GROUP_DESTROYED = "Succeeded to destroy custom process group."
GROUP_MISSING = "The group to be destroyed does not exist."


class DistributedUpdateError(ValueError):
    """A distributed weight update that cannot be applied (HTTP 400 with this message)."""


@dataclass
class DistributedReceiver:
    """The groups this engine belongs to, and receiving buckets over them."""

    runner: ModelRunner
    timeout_s: float = GROUP_TIMEOUT_S
    tp_size: int = 1  # group ranks this engine takes (SGLang: one per tensor-parallel worker)
    groups: dict[str, list[WeightGroup]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def init_group(self, request: InitWeightsUpdateGroupRequest) -> str:
        """Join the group (blocking until the trainer and every other engine have joined)."""
        if request.rank_offset + self.tp_size > request.world_size:
            raise DistributedUpdateError(
                f"rank_offset {request.rank_offset} + tp_size {self.tp_size} exceeds world_size "
                f"{request.world_size}"
            )
        if request.backend != "gloo":
            raise DistributedUpdateError(
                f"backend {request.backend!r}: the reference engine runs on the CPU, use gloo"
            )
        members: list[WeightGroup | None] = [None] * self.tp_size
        errors: list[BaseException] = []

        def join(worker: int) -> None:  # the rendezvous blocks: every worker in its thread
            try:
                members[worker] = open_group(
                    master_address=request.master_address,
                    master_port=request.master_port,
                    rank=request.rank_offset + worker,
                    world_size=request.world_size,
                    group_name=request.group_name,
                    backend=request.backend,
                    timeout_s=self.timeout_s,
                )
            except Exception as exc:  # rendezvous failures come as several torch error types
                errors.append(exc)

        threads = [threading.Thread(target=join, args=(w,)) for w in range(self.tp_size)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if errors or any(m is None for m in members):
            raise DistributedUpdateError(f"Failed to init process group: {errors[:1]}")
        with self._lock:
            # a re-init replaces the old membership
            self.groups[request.group_name] = [m for m in members if m is not None]
        last = request.rank_offset + self.tp_size - 1
        ranks = str(request.rank_offset) if last == request.rank_offset else (
            f"{request.rank_offset}-{last}"
        )  # fmt: skip
        return f"Succeeded to initialize custom process group (rank {ranks})."

    def destroy_group(self, group_name: str) -> str:
        """Leave ``group_name`` (SGLang's ``destroy_weights_update_group``); raises
        DistributedUpdateError with SGLang's message when this engine is not in it."""
        with self._lock:
            members = self.groups.pop(group_name, None)
        if members is None:
            raise DistributedUpdateError(GROUP_MISSING)
        for member in members:
            destroy = getattr(member, "destroy", None)
            if callable(destroy):
                destroy()
        return GROUP_DESTROYED

    def receive(self, request: UpdateWeightsFromDistributedRequest) -> dict[str, torch.Tensor]:
        """Receive one bucket in full (blocking), then check that the model can load it.

        Raises DistributedUpdateError with SGLang's "Failed to receive weights: ..." for a
        request or broadcast that fails, and its "Failed to update parameter online: ..." for a
        bucket that does not fit (every broadcast of it completed all the same).
        """
        received = self._receive_bucket(request)
        problems = self._problems(received)
        if problems:
            raise DistributedUpdateError(LOAD_FAILED.format("; ".join(problems[:5])))
        return received

    def _group_for(self, request: UpdateWeightsFromDistributedRequest) -> list[WeightGroup]:
        """The members of the request's group, once the request is well formed."""
        names, dtypes, shapes = request.names, request.dtypes, request.shapes
        if not len(names) == len(dtypes) == len(shapes):
            raise DistributedUpdateError(
                RECEIVE_FAILED.format(
                    f"names, dtypes and shapes differ in length ({len(names)}, {len(dtypes)}, "
                    f"{len(shapes)})"
                )
            )
        with self._lock:
            group = self.groups.get(request.group_name)
        if not group:
            raise DistributedUpdateError(
                RECEIVE_FAILED.format(
                    f"no weight update group {request.group_name!r} (groups: {sorted(self.groups)})"
                    ": call /init_weights_update_group first"
                )
            )
        if any(d < 0 for shape in shapes for d in shape):
            raise DistributedUpdateError(RECEIVE_FAILED.format(f"negative dimension in {shapes}"))
        return group

    def _receive_bucket(
        self, request: UpdateWeightsFromDistributedRequest
    ) -> dict[str, torch.Tensor]:
        group = self._group_for(request)
        try:
            parsed = [parse_dtype(d) for d in request.dtypes]
        except ValueError as exc:
            raise DistributedUpdateError(RECEIVE_FAILED.format(exc)) from exc
        # Receive everything the trainer sends for this bucket before judging it, so that a
        # mismatch never leaves the trainer's broadcasts waiting for this rank.
        received: dict[str, torch.Tensor] = {}
        try:
            for name, dtype, shape in zip(request.names, parsed, request.shapes, strict=True):
                # every worker's rank receives the tensor (as SGLang's TP workers do); the
                # first worker's copy is applied
                copies = [torch.empty(shape, dtype=dtype) for _ in group]
                pending = [m.broadcast_async(t) for m, t in zip(group, copies, strict=True)]
                for work in pending:
                    work.wait()
                received[name] = copies[0]
        except Exception as exc:  # a broken broadcast (peer gone, timeout)
            raise DistributedUpdateError(
                RECEIVE_FAILED.format(f"{type(exc).__name__}: {exc}")
            ) from exc
        return received

    def _problems(self, tensors: dict[str, torch.Tensor]) -> list[str]:
        expected = self.runner.weight_shapes()
        problems: list[str] = []
        for name, tensor in tensors.items():
            if name not in expected:
                problems.append(f"unknown parameter {name!r}")
            elif tuple(tensor.shape) != expected[name]:
                problems.append(
                    f"{name} has shape {list(tensor.shape)}, the model's is {list(expected[name])}"
                )
            elif not torch.isfinite(tensor).all():
                problems.append(f"{name} has non-finite values")
        return problems
