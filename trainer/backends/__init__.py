"""Trainer backends behind one interface (:class:`TrainerBackend`); ``create_backend`` picks one.

``torch``: transformers actor + critic, AdamW, micro-batching
(:mod:`trainer.backends.torch_backend`). ``megatron``: megatron-core ``GPTModel`` actor and
critic on the same step engine (:mod:`trainer.backends.megatron`; dense and MoE Qwen3, tensor,
pipeline, expert or data parallel, checkpoints in each layout).
"""

from __future__ import annotations

from pathlib import Path

from trainer.backends.base import (
    BackendError,
    ForwardResult,
    StepObjective,
    TrainerBackend,
)
from trainer.config import TrainerConfig


def create_backend(config: TrainerConfig, model_dir: str | Path | None = None) -> TrainerBackend:
    """The backend ``config.backend`` names, initialised from ``model_dir`` (or config.model)."""
    if config.backend == "torch":
        from trainer.backends.torch_backend import TorchBackend

        return TorchBackend(config, model_dir)
    if config.backend == "megatron":
        from trainer.backends.megatron.backend import MegatronBackend

        return MegatronBackend(config, model_dir)
    raise BackendError(f"unknown trainer backend {config.backend!r}")


__all__ = [
    "BackendError",
    "ForwardResult",
    "StepObjective",
    "TrainerBackend",
    "create_backend",
]
