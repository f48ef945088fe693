"""Save -> load -> the identical next step, run inside the megatron parallel workers.

:func:`resume_check` is called on every rank of a layout (TP, PP, EP or data parallel): the
backend saves a checkpoint (every rank writes its shard), draws from every RNG and takes a
step; a fresh backend of the same layout, built with another seed, loads the checkpoint, draws
and takes the same step. The result (the same on every rank) holds both runs' metrics, draws,
whole HF weights after the step, the extra state and counters the fresh backend got back, and
whether every rank's local actor and critic tensors ended equal.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from trainer.backends import StepObjective
from trainer.backends.megatron.backend import MegatronBackend

EXTRA = {"gate": {"ready": True, "window": [0.5, 0.25]}, "cursor": {"batch": 3}}
OTHER_SEED = 7  # the fresh backend's: its value head and RNG streams start elsewhere


def draws() -> list[float]:
    """One draw from each RNG a step could use: torch, Python, numpy, megatron's tracker."""
    from megatron.core.tensor_parallel.random import get_cuda_rng_tracker

    with get_cuda_rng_tracker().fork():
        tracked = float(torch.rand(()))
    return [float(torch.rand(())), random.random(), float(np.random.rand()), tracked]


def snapshot(b: MegatronBackend) -> dict[str, torch.Tensor]:
    """The actor's whole HF weights, copied (without model parallel ``named_weights`` yields
    the live parameters, which the next step changes in place)."""
    return {name: tensor.clone() for name, tensor in b.named_weights()}


def _local(b: MegatronBackend) -> dict[str, torch.Tensor]:
    tensors = {f"actor.{n}": p.detach().clone() for n, p in b.actor.named_parameters()}
    tensors.update({f"critic.{n}": p.detach().clone() for n, p in b.critic.named_parameters()})
    return tensors


def resume_check(
    backend: MegatronBackend,
    make: Callable[[int], MegatronBackend],
    batch: Any,
    directory: str | Path,
) -> dict[str, Any]:
    """See the module docstring; ``make(seed)`` builds a backend of the same layout."""
    objective = StepObjective(algorithm="li2sao", phase="bootstrap")
    backend.save(directory, extra=EXTRA)
    draws_a = draws()
    metrics_a = backend.train_step(batch, objective)
    after_a, local_a = snapshot(backend), _local(backend)
    fresh = make(OTHER_SEED)
    extra = fresh.load(directory)
    counters = (fresh.version, fresh.steps)
    draws_b = draws()
    metrics_b = fresh.train_step(batch, objective)
    after_b, local_b = snapshot(fresh), _local(fresh)
    same = local_a.keys() == local_b.keys() and all(
        torch.equal(local_a[k], local_b[k]) for k in local_a
    )
    every: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(every, same)
    return {
        "metrics": (metrics_a, metrics_b),
        "draws": (draws_a, draws_b),
        "weights": (after_a, after_b),
        "extra": extra,
        "counters": counters,
        "local_equal": every,
    }


def assert_resumed(result: dict[str, Any], saved_steps: int = 1) -> None:
    """The checks on a :func:`resume_check` result: the resumed step is the saved run's next
    step bit for bit (metrics, every RNG, whole weights, every rank's local tensors)."""
    (want, got), (draws_a, draws_b) = result["metrics"], result["draws"]
    assert got == want  # every metric, bit for bit
    assert draws_a == draws_b  # torch, Python, numpy and megatron's tracker streams restored
    after_a, after_b = result["weights"]
    assert after_a.keys() == after_b.keys()
    assert all(torch.equal(after_a[n], after_b[n]) for n in after_a)
    assert result["local_equal"] == [True] * len(result["local_equal"])
    assert result["extra"] == EXTRA
    assert result["counters"] == (saved_steps, saved_steps)
