"""What every publisher returns and raises, and the adapter's admin routes as a client."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx
import torch
from torch import Tensor

from trainer.backends.base import TrainerBackend
from trainer.data import TrainBatch

log = logging.getLogger("trainer.publish")


class PublishError(RuntimeError):
    """A version was not published; the engines keep serving the previous one."""


@dataclass
class PublishResult:
    """One published version: where it is, how long each phase took, what the adapter said.

    ``timings`` (seconds): ``export`` (disk copy), ``transfer`` (broadcasts), ``refresh`` (the
    adapter's call, drain + load), ``gate_closed``, ``drain``, ``engine_load``, ``total``.
    """

    version: int
    transport: str
    model_path: str | None
    timings: dict[str, float]
    adapter: dict[str, Any] = field(default_factory=dict)
    pruned: list[str] = field(default_factory=list)
    bucket_s: list[float] = field(default_factory=list)


class Publisher(Protocol):
    def publish(self, backend: TrainerBackend) -> PublishResult | None: ...

    def newest_exported(self) -> int | None:
        """The highest version exported to disk (served or not); None when nothing is."""
        ...

    def close(self) -> None: ...


def publish_metrics(result: PublishResult) -> dict[str, float]:
    """A publish as step metrics (``publish/*``): its timings and, for a broadcast, the bucket
    count and the slowest and mean bucket's seconds (the trainer's side of each broadcast)."""
    metrics = dict(result.timings)
    if result.bucket_s:
        metrics["buckets"] = float(len(result.bucket_s))
        metrics["bucket_max"] = max(result.bucket_s)
        metrics["bucket_mean"] = sum(result.bucket_s) / len(result.bucket_s)
    return metrics


def adapter_timings(summary: dict[str, Any]) -> dict[str, float]:
    """The seconds of the adapter's refresh summary: gate closed (new requests wait), drain
    (``step`` mode: in-flight agent steps finish first), engine load, and in ``token`` mode the
    time in-flight requests were paused (interrupt + load + continue; 0 in ``step`` mode)."""
    gate_closed = float(summary.get("gate_closed_s", 0.0))
    return {
        "gate_closed": gate_closed,
        "drain": float(summary.get("drain_s", 0.0)),
        "engine_load": float(summary.get("load_s", 0.0)),
        "requests_paused": gate_closed if summary.get("mode") == "token" else 0.0,
    }


PROBE_TENSORS = 2  # one-dimensional tensors the engines' copies are spot-checked on
PROBE_VALUES = 8  # their first values


def weight_probes(named: Iterable[tuple[str, Tensor]]) -> list[dict[str, Any]]:
    """The spot check a refresh carries (adapter.weight_check): the first values of the first
    and last one-dimensional floating tensors by name (a model's norm weights, which SGLang
    holds whole on every tensor-parallel worker)."""
    flat = sorted(
        (name, tensor)
        for name, tensor in named
        if tensor.dim() == 1 and tensor.is_floating_point() and tensor.numel() > 0
    )
    chosen = flat if len(flat) <= PROBE_TENSORS else [flat[0], flat[-1]]
    return [
        {"name": name, "values": tensor.detach()[:PROBE_VALUES].float().cpu().tolist()}
        for name, tensor in chosen
    ]


LOGPROB_PROBE_TOKENS = 24  # the logprob probe's sequence (adapter.weight_check.LogprobProbe)
_GOLDEN = (math.sqrt(5.0) - 1.0) / 2.0


def probe_token_ids(
    vocab_size: int, excluded: Iterable[int] = (), count: int = LOGPROB_PROBE_TOKENS
) -> list[int]:
    """``count`` distinct token ids spread over ``[0, vocab_size)`` (a golden-ratio sequence:
    the same for every run of a model), none of them in ``excluded`` (special tokens)."""
    skip = {int(i) for i in excluded}
    free = vocab_size - len({i for i in skip if 0 <= i < vocab_size})
    count = min(count, free)
    ids: list[int] = []
    taken = set(skip)
    for index in range(count):
        token = int(((index + 1) * _GOLDEN) % 1.0 * vocab_size)
        while token in taken:
            token = (token + 1) % vocab_size
        taken.add(token)
        ids.append(token)
    return ids


def _probe_batch(input_ids: list[int], version: int) -> TrainBatch:
    """One row: token 0 the prompt, tokens 1.. the scored (post-prompt) ones."""
    length = len(input_ids)
    scored = length - 1
    return TrainBatch(
        input_ids=torch.tensor([input_ids], dtype=torch.long),
        seq_lengths=torch.tensor([length], dtype=torch.long),
        prompt_lengths=torch.tensor([1], dtype=torch.long),
        tokens=torch.tensor([input_ids[1:]], dtype=torch.long),
        action_mask=torch.ones((1, scored), dtype=torch.bool),
        behavior_logp=torch.zeros((1, scored), dtype=torch.float32),
        token_versions=torch.full((1, scored), version, dtype=torch.long),
        rewards=torch.zeros(1, dtype=torch.float32),
        group_ids=torch.zeros(1, dtype=torch.long),
        trajectory_index=torch.zeros(1, dtype=torch.long),
        segment_index=torch.zeros(1, dtype=torch.long),
        truncated=torch.zeros(1, dtype=torch.bool),
        trajectory_ids=("logprob-probe",),
    )


def logprob_probe(backend: TrainerBackend) -> dict[str, Any] | None:
    """The logprob probe a refresh carries (adapter.weight_check.LogprobProbe): a fixed
    sequence of ``LOGPROB_PROBE_TOKENS`` ids spread over the model's vocabulary (special and
    added tokens left out) and the actor's teacher-forced logprobs of tokens 1..L-1, from the
    backend's no-grad forward. Collective under data / tensor / pipeline parallelism (call it
    on every rank). None where it cannot be compared with an engine's: a backend that does not
    say its ``vocab_size``, a ``rollout_temperature`` other than 1 (the trainer's logprobs are
    then of ``logits / T``; SGLang's input-token logprobs never are), non-finite values."""
    vocab_size = getattr(backend, "vocab_size", None)
    config = getattr(backend, "config", None)
    temperature = float(getattr(config, "rollout_temperature", 1.0))
    if not isinstance(vocab_size, int) or vocab_size < 2 or temperature != 1.0:
        return None
    tokenizer = getattr(backend, "tokenizer", None)
    excluded: set[int] = set()
    if tokenizer is not None:
        excluded.update(int(i) for i in getattr(tokenizer, "all_special_ids", None) or ())
        excluded.update(int(i) for i in getattr(tokenizer, "added_tokens_decoder", None) or {})
        if hasattr(tokenizer, "__len__"):
            vocab_size = min(vocab_size, len(tokenizer))  # ids past the tokenizer: padding
    input_ids = probe_token_ids(vocab_size, excluded)
    if len(input_ids) < 2:
        return None
    result = backend.logprobs_and_values(_probe_batch(input_ids, backend.version))
    logprobs = result.logprobs[0, : len(input_ids) - 1].detach().float().cpu().tolist()
    if not all(math.isfinite(v) for v in logprobs):
        log.warning("logprob probe skipped: the actor's logprobs are not finite")
        return None
    return {"input_ids": input_ids, "logprobs": [min(v, 0.0) for v in logprobs]}


def served_already(
    served: dict[str, Any], version: int, checksum: str | None, model_path: str | None
) -> bool:
    """Whether the adapter (``GET /admin/versions``) serves ``version`` with these weights: the
    same ``weights_sha256`` or, where the adapter recorded none, the same ``model_path``. The
    same version with other weights is the adapter's to refuse (409)."""
    if int(served["current_version"]) != version:
        return False
    recorded = served.get("weights_sha256")
    if recorded is not None and checksum is not None:
        return bool(recorded == checksum)
    return model_path is not None and served.get("model_path") == model_path


def idempotent_result(
    version: int, transport: str, model_path: str | None, started: float, exported: float
) -> PublishResult:
    """The result of re-publishing the version already served: nothing moved."""
    timings = dict.fromkeys(("transfer", "refresh", "gate_closed", "drain"), 0.0)
    timings.update(engine_load=0.0, requests_paused=0.0, export=exported - started)
    timings["total"] = time.perf_counter() - started
    return PublishResult(version, transport, model_path, timings, {"idempotent": True})


class AdminClient:
    """The adapter's ``/admin`` routes; every refusal becomes a :class:`PublishError`."""

    def __init__(self, url: str, token: str, timeout_s: float) -> None:
        self.url = url
        self._http = httpx.Client(
            timeout=timeout_s, headers={"authorization": f"Bearer {token}"}, trust_env=False
        )

    def close(self) -> None:
        self._http.close()

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        try:
            response = self._http.request(method, self.url + path, json=body)
        except httpx.HTTPError as exc:
            raise PublishError(f"adapter {self.url}{path} unreachable: {exc}") from exc
        if response.status_code != 200:
            try:
                message = response.json()["error"]["message"]
            except (ValueError, KeyError, TypeError):
                message = response.text[:500]
            raise PublishError(
                f"adapter refused {method} {path} (HTTP {response.status_code}): {message}"
            )
        return response.json()

    def versions(self) -> dict[str, Any]:
        result: dict[str, Any] = self._call("GET", "/admin/versions")
        return result

    def refresh_from_disk(
        self,
        model_path: str,
        version: int,
        weights_sha256: str | None = None,
        probes: list[dict[str, Any]] | None = None,
        logprob_probe: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"model_path": model_path, "version": version}
        if weights_sha256 is not None:
            body["weights_sha256"] = weights_sha256
        if probes:
            body["probes"] = probes
        if logprob_probe is not None:
            body["logprob_probe"] = logprob_probe
        result: dict[str, Any] = self._call("POST", "/admin/weights", body)
        return result

    def init_group(self, body: dict[str, Any]) -> dict[str, Any]:
        result: dict[str, Any] = self._call("POST", "/admin/weights/group", body)
        return result

    def refresh_distributed(self, body: dict[str, Any]) -> dict[str, Any]:
        result: dict[str, Any] = self._call("POST", "/admin/weights/distributed", body)
        return result

    def served_versions(self) -> set[int]:
        """The adapter's current version and every version an engine reports."""
        view = self.versions()
        served = {int(view["current_version"])}
        for engine in view.get("engines", []):
            try:
                served.add(int(str(engine.get("weight_version")).strip()))
            except ValueError:
                continue
        return served
