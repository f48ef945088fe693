"""Distributed transport: SGLang's ``init_weights_update_group`` / ``update_weights_from_
distributed`` protocol, coordinated by the adapter, with bucketed broadcasts from rank 0.

Once (and again after a failure): rank 0 hosts a rendezvous store, asks the adapter to make
every engine in rotation join (``POST /admin/weights/group``, engine ``i`` at rank ``1 + i``)
and joins as rank 0. Per version: the actor's ``named_weights()`` are cut into buckets of about
``bucket_mb``; rank 0 sends the buckets' names, dtypes and shapes to the adapter (``POST
/admin/weights/distributed``), which closes its gate, drains, and calls every engine's
``update_weights_from_distributed`` bucket by bucket while rank 0 broadcasts the same tensors in
the same order. The adapter answers once every engine has loaded (or refused) the version.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch

from services.weight_group import WeightGroup, dtype_name, join_group, open_store
from trainer.backends.base import TrainerBackend
from trainer.publish.base import (
    AdminClient,
    PublishError,
    PublishResult,
    adapter_timings,
    idempotent_result,
    logprob_probe,
    served_already,
    weight_probes,
)
from trainer.publish.config import PublishConfig
from trainer.publish.versions import (
    export_version,
    exported_versions,
    prune_versions,
    weights_checksum,
)

# After the adapter answered while broadcasts are still running, how long to wait for them
# (an answer that says the broadcast was abandoned, or a refusal, drops the group at once).
ABANDON_WAIT_S = 2.0


@dataclass
class Bucket:
    tensors: list[tuple[str, torch.Tensor]]

    def spec(self) -> dict[str, Any]:
        return {
            "names": [name for name, _ in self.tensors],
            "dtypes": [dtype_name(t.dtype) for _, t in self.tensors],
            "shapes": [list(t.shape) for _, t in self.tensors],
        }


def make_buckets(weights: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int) -> list[Bucket]:
    """Consecutive tensors grouped up to ``bucket_bytes`` (a larger tensor is a bucket alone)."""
    buckets: list[Bucket] = []
    current: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, tensor in weights:
        nbytes = tensor.numel() * tensor.element_size()
        if current and size + nbytes > bucket_bytes:
            buckets.append(Bucket(current))
            current, size = [], 0
        current.append((name, tensor))
        size += nbytes
    if current:
        buckets.append(Bucket(current))
    return buckets


class _Call:
    """An adapter call running in a thread while this thread broadcasts."""

    def __init__(self, fn: Callable[[], dict[str, Any]]) -> None:
        self.result: dict[str, Any] | None = None
        self.error: BaseException | None = None
        self.done = threading.Event()

        def run() -> None:
            try:
                self.result = fn()
            except BaseException as exc:  # handed to the caller
                self.error = exc
            finally:
                self.done.set()

        threading.Thread(target=run, name="publish-admin-call", daemon=True).start()

    def wait(self) -> dict[str, Any]:
        self.done.wait()
        if self.error is not None:
            raise self.error
        assert self.result is not None
        return self.result


class DistributedPublisher:
    """Broadcasts each version to the engines through the adapter's coordination."""

    def __init__(self, config: PublishConfig, rank: int = 0, device: str = "cpu") -> None:
        self.config = config
        self.dist = config.distributed
        self.rank = rank
        self.device = torch.device("cuda" if self.dist.backend == "nccl" else device)
        self.admin = AdminClient(config.adapter_url, config.admin_token, config.timeout_s)
        self.group: WeightGroup | None = None

    def close(self) -> None:
        self._drop_group()
        self.admin.close()

    def _drop_group(self) -> None:
        """Leave the broadcast group (destroyed, so the next publish forms it again under the
        same name: torch refuses a name twice in one process)."""
        if self.group is not None:
            self.group.destroy()
        self.group = None

    def newest_exported(self) -> int | None:
        """Broadcast versions leave no directory; with ``export_to_disk`` each leaves one."""
        found = exported_versions(self.config.weights_dir) if self.dist.export_to_disk else []
        return found[-1] if found else None

    def _connect(self) -> WeightGroup:
        engines = [e for e in self.admin.versions()["engines"] if e.get("healthy")]
        if not engines:
            raise PublishError("no engine in rotation to broadcast to")
        # one rank per tensor-parallel worker of each engine (SGLang: rank_offset + tp_rank)
        world_size = 1 + sum(int(e.get("tp_size") or 1) for e in engines)
        store = open_store(
            self.dist.master_address, self.dist.master_port, 0, world_size, self.dist.timeout_s
        )
        body = {
            "master_address": self.dist.master_address,
            "master_port": store.port,
            "world_size": world_size,
            "group_name": self.dist.group_name,
            "backend": self.dist.backend,
        }
        call = _Call(lambda: self.admin.init_group(body))
        joined: list[WeightGroup] = []

        def join() -> None:
            joined.append(
                join_group(
                    store,
                    rank=0,
                    world_size=world_size,
                    group_name=self.dist.group_name,
                    backend=self.dist.backend,
                    timeout_s=self.dist.timeout_s,
                )
            )

        joiner = threading.Thread(target=join, name="publish-group-join", daemon=True)
        joiner.start()
        call.wait()  # raises PublishError if the adapter or an engine refused
        joiner.join(self.dist.timeout_s)
        if not joined:
            raise PublishError(f"the broadcast group of {world_size} did not form")
        return joined[0]

    def publish(self, backend: TrainerBackend) -> PublishResult | None:
        started = time.perf_counter()
        version = backend.version
        weights = list(backend.named_weights())  # collective under data parallel
        probe = logprob_probe(backend)  # collective too
        if self.rank != 0:
            return None
        model_path = checksum = None
        if self.dist.export_to_disk:
            exported_dir = export_version(backend, self.config.weights_dir, version)
            model_path, checksum = str(exported_dir), weights_checksum(exported_dir)
        exported = time.perf_counter()
        served = self.admin.versions()
        if checksum is not None and served_already(served, version, checksum, model_path):
            # A trainer resumed from its last published checkpoint: the same weights are
            # served already (no broadcast: nobody would join it).
            return idempotent_result(version, "distributed", model_path, started, exported)
        current = int(served["current_version"])
        if version <= current:  # refuse before anyone joins a broadcast
            same = " with other weights" if version == current and checksum is not None else ""
            raise PublishError(
                f"version must increase: the adapter serves {current}{same}, got {version}"
                + ("" if checksum is not None else " (without export_to_disk the weights of "
                   "a served version cannot be compared: it is never sent again)")
            )  # fmt: skip
        group = self.group if self.group is not None else self._connect()
        self.group = group
        bucket_bytes = int(self.dist.bucket_mb * 1024 * 1024)
        buckets = make_buckets(
            ((n, t.detach().to(self.device).contiguous()) for n, t in weights), bucket_bytes
        )
        body = {
            "version": version,
            "group_name": self.dist.group_name,
            "buckets": [b.spec() for b in buckets],
            "model_path": model_path,
        }
        if checksum is not None:
            body["weights_sha256"] = checksum
        body["probes"] = weight_probes(weights)
        if probe is not None:
            body["logprob_probe"] = probe
        call = _Call(lambda: self.admin.refresh_distributed(body))
        transfer_started = time.perf_counter()
        bucket_s = self._broadcast(group, buckets, call, version)
        transferred = time.perf_counter()
        summary = call.wait()
        pruned = []
        if self.dist.export_to_disk:
            pruned = prune_versions(
                self.config.weights_dir, self.config.keep_last, self.admin.served_versions()
            )
        timings = {
            "export": exported - started,
            "transfer": transferred - transfer_started,
            "refresh": time.perf_counter() - transfer_started,
            **adapter_timings(summary),
            "total": time.perf_counter() - started,
        }
        pruned_paths = [str(p) for p in pruned]
        return PublishResult(
            version, "distributed", model_path, timings, summary, pruned_paths, bucket_s
        )

    def _broadcast(
        self, group: WeightGroup, buckets: list[Bucket], call: _Call, version: int
    ) -> list[float]:
        """Broadcast every bucket in order while the adapter's ``call`` drives the engines;
        returns the seconds per bucket. The adapter stops a version at the first bucket an
        engine refuses (no engine receives a later one, so a later broadcast of this rank can
        never complete): once it has answered with a refusal, or with ``broadcast_abandoned``
        (it loaded the version from its disk copy instead), the group is dropped at once and
        formed again with the next version. A failed broadcast drops it too."""
        bucket_s: list[float] = []

        def broadcast_all() -> dict[str, Any]:
            for bucket in buckets:
                t0 = time.perf_counter()
                for _, tensor in bucket.tensors:
                    group.broadcast(tensor)
                bucket_s.append(time.perf_counter() - t0)
            return {}

        sender = _Call(broadcast_all)
        while not sender.done.wait(0.05):
            if not call.done.is_set():
                continue
            abandoned = call.error is not None or bool(
                (call.result or {}).get("broadcast_abandoned")
            )
            if abandoned or not sender.done.wait(ABANDON_WAIT_S):
                # the engines stopped receiving: this rank's pending broadcast never completes
                self._drop_group()
                if call.error is not None:
                    raise call.error
                return bucket_s
        try:
            sender.wait()
        except Exception as exc:
            # The engines left the group (an abandoned version) or a peer is gone: the
            # adapter's answer says which (its call is bounded by the admin timeout).
            self._drop_group()
            call.done.wait()
            if call.error is not None:
                raise call.error from exc  # the adapter's reason says more
            if (call.result or {}).get("broadcast_abandoned"):
                return bucket_s
            raise PublishError(f"broadcast of version {version} failed: {exc}") from exc
        return bucket_s
