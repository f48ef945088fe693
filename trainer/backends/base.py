"""The one interface every trainer backend implements (torch now; megatron later).

Everything above the engine (the async driver, weight publishing, the scoring tool) talks to a
backend only through :class:`TrainerBackend`:

* ``logprobs_and_values(batch)`` -- no-grad forward: per-token log-probabilities of the
  post-prompt tokens under the actor and critic values ``V(s_t)``, both ``[N, T]``;
* ``train_step(batch, objective)`` -- one optimisation step of actor and critic on a batch,
  in the order of the algorithm's step plan (:mod:`trainer.algorithms.step_plans`),
  returning float metrics;
* ``export_hf(dir)`` -- the actor as a Hugging Face directory (safetensors, config, tokenizer)
  that transformers and the engines' ``/update_weights_from_disk`` load;
* ``named_weights()`` -- the actor's tensors under their HF names (distributed weight sync);
* ``checkpoint_problem()`` -- why ``save`` / ``load`` cannot work with this layout (None
  when they can), asked before a run starts rather than at its first checkpoint;
* ``save(dir, extra)`` / ``load(dir) -> extra`` -- a full checkpoint: actor, critic, both
  optimisers, the policy version, the step counter and RNG states, plus the caller's own
  JSON state (the driver's readiness gate, data cursor);
* ``version`` -- the policy version of the actor's weights: one counter, advanced by one per
  actor update, saved in checkpoints and sent with every publish (nobody keeps another).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from torch import Tensor

from trainer.algorithms import (
    ALGORITHM_REGISTRY,
    PHASES,
    AlgorithmName,
    ObjectiveConfig,
    Phase,
)
from trainer.data import TrainBatch


class BackendError(RuntimeError):
    """A backend cannot do what was asked (bad model, bad checkpoint, bad batch)."""


@dataclass(frozen=True)
class StepObjective:
    """What one ``train_step`` optimises.

    Attributes:
        algorithm: the objective of :func:`trainer.algorithms.compute_objective`.
        phase: Li2SAO's phase (``bootstrap`` until the readiness gate switches).
        config: its hyper-parameters (value clip, DIS bounds, ...).
        update_actor: False for critic-only warm-up steps (LiSAO): the plan's actor phases
            are skipped.
        critic_updates: ``K`` critic passes on this batch; None means the backend's config.
    """

    algorithm: AlgorithmName = "li2sao"
    phase: Phase = "bootstrap"
    config: ObjectiveConfig = field(default_factory=ObjectiveConfig)
    update_actor: bool = True
    critic_updates: int | None = None

    def __post_init__(self) -> None:
        ALGORITHM_REGISTRY.get(self.algorithm)  # ValueError "unknown algorithm ...; known: ..."
        if self.phase not in PHASES:
            raise ValueError(f"unknown phase {self.phase!r}; expected one of {PHASES}")
        if self.critic_updates is not None and self.critic_updates < 0:
            raise ValueError(f"critic_updates must be >= 0, got {self.critic_updates}")


@dataclass(frozen=True)
class ForwardResult:
    """Per-token outputs ``[N, T]`` of a no-grad forward (0 off the action tokens).

    ``values`` is None for a backend without a critic.
    """

    logprobs: Tensor
    values: Tensor | None
    entropy: Tensor


@runtime_checkable
class TrainerBackend(Protocol):
    version: int

    def logprobs_and_values(self, batch: TrainBatch) -> ForwardResult: ...

    def train_step(self, batch: TrainBatch, objective: StepObjective) -> dict[str, float]: ...

    def export_hf(self, directory: str | Path) -> Path: ...

    def named_weights(self) -> Iterator[tuple[str, Tensor]]: ...

    def checkpoint_problem(self) -> str | None: ...

    def save(self, directory: str | Path, extra: Mapping[str, Any] | None = None) -> Path: ...

    def load(self, directory: str | Path) -> dict[str, Any]: ...
