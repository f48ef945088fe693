"""The reference engine's side of SGLang's distributed weight update, over torch.distributed.

``POST /init_weights_update_group {master_address, master_port, rank_offset, world_size,
group_name, backend}`` joins a broadcast group whose rank 0 is the trainer. SGLang joins it
with every tensor-parallel worker, worker ``t`` as rank ``rank_offset + t``, and each worker
receives every broadcast; the reference engine computes in one process, and with
``--tp-size N`` (reported as ``tp_size`` by ``/get_server_info``, as SGLang does) it takes the
same N ranks (N members of the group, each receiving every tensor, the first one's copy
applied), so the trainer's and the adapter's rank arithmetic is tested as on SGLang.
``POST /update_weights_from_distributed {names, dtypes, shapes, group_name, flush_cache,
abort_all_requests, weight_version}`` receives one bucket: a broadcast per tensor, in the order
of ``names``, then loads the bucket into the model between decode steps. Both answer
``{success, message}`` with 200 or 400, as SGLang does.

Differences from SGLang, on purpose (SGLang applies each bucket as it arrives, so a failure
midway leaves it half-updated):

* a bucket is *received in full before it is checked*: a name the model does not have, a wrong
  shape or a non-finite tensor costs no hung collective on the trainer (every broadcast of the
  bucket still completes);
* buckets are **staged** and applied together, atomically between decode steps, by the call that
  carries ``weight_version`` (swerl's adapter sends it with a version's last bucket only). A
  failed bucket discards what was staged and makes every later bucket of the same version fail
  too, up to and including the one with ``weight_version``: nothing of that version is applied
  and the engine keeps serving its old weights under its old version.

Malformed requests (lists of different lengths, an unknown group) are refused before any
broadcast is joined.
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


class DistributedUpdateError(ValueError):
    """A distributed weight update that cannot be applied (HTTP 400 with this message)."""


@dataclass
class DistributedReceiver:
    """The groups this engine belongs to, and receiving buckets over them."""

    runner: ModelRunner
    timeout_s: float = GROUP_TIMEOUT_S
    tp_size: int = 1  # group ranks this engine takes (SGLang: one per tensor-parallel worker)
    groups: dict[str, list[WeightGroup]] = field(default_factory=dict)
    staged: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)  # group -> why this version failed
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
            self.staged.pop(request.group_name, None)
            self.failed.pop(request.group_name, None)
        last = request.rank_offset + self.tp_size - 1
        ranks = str(request.rank_offset) if last == request.rank_offset else (
            f"{request.rank_offset}-{last}"
        )  # fmt: skip
        return f"Succeeded to initialize custom process group (rank {ranks})."

    def receive(
        self, request: UpdateWeightsFromDistributedRequest
    ) -> dict[str, torch.Tensor] | None:
        """Receive one bucket (blocking); the whole version to apply once it is complete.

        Returns None while the version's buckets are being staged; raises
        DistributedUpdateError for a bucket that does not fit (the version is then dropped).
        """
        received = self._receive_bucket(request)
        group = request.group_name
        commit = request.weight_version is not None
        with self._lock:
            earlier = self.failed.get(group)
            if commit:
                self.failed.pop(group, None)
            if earlier is not None:
                raise DistributedUpdateError(f"an earlier bucket of this version failed: {earlier}")
            try:
                self._check(received)
            except DistributedUpdateError as exc:
                self.staged.pop(group, None)
                if not commit:
                    self.failed[group] = str(exc)
                raise
            staged = self.staged.setdefault(group, {})
            staged.update(received)
            if not commit:
                return None
            return self.staged.pop(group)

    def _receive_bucket(
        self, request: UpdateWeightsFromDistributedRequest
    ) -> dict[str, torch.Tensor]:
        names, dtypes, shapes = request.names, request.dtypes, request.shapes
        if not names:
            raise DistributedUpdateError("names is empty: a bucket needs at least one tensor")
        if not len(names) == len(dtypes) == len(shapes):
            raise DistributedUpdateError(
                f"names, dtypes and shapes differ in length ({len(names)}, {len(dtypes)}, "
                f"{len(shapes)})"
            )
        with self._lock:
            group = self.groups.get(request.group_name)
        if not group:
            raise DistributedUpdateError(
                f"no weight update group {request.group_name!r}: call /init_weights_update_group"
            )
        try:
            parsed = [parse_dtype(d) for d in dtypes]
        except ValueError as exc:
            raise DistributedUpdateError(str(exc)) from exc
        if any(d < 0 for shape in shapes for d in shape):
            raise DistributedUpdateError(f"negative dimension in shapes {shapes}")
        # Receive everything the trainer sends for this bucket before judging it, so that a
        # mismatch never leaves the trainer's broadcasts waiting for this rank.
        received: dict[str, torch.Tensor] = {}
        for name, dtype, shape in zip(names, parsed, shapes, strict=True):
            # every worker's rank receives the tensor (as SGLang's TP workers do); the first
            # worker's copy is applied
            copies = [torch.empty(shape, dtype=dtype) for _ in group]
            pending = [member.broadcast_async(t) for member, t in zip(group, copies, strict=True)]
            for work in pending:
                work.wait()
            received[name] = copies[0]
        return received

    def _check(self, tensors: dict[str, torch.Tensor]) -> None:
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
        if problems:
            raise DistributedUpdateError(
                "weights not applied (the old ones keep serving): " + "; ".join(problems[:5])
            )
