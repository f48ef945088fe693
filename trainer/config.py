"""Settings of the trainer engine (section ``trainer`` of the swerl configuration).

Loaded with :func:`load_trainer_config` (:func:`services.config.load_config` with
``section="trainer"``): defaults < YAML < ``SWERL_TRAINER__*`` environment < explicit
overrides. Defaults are LI2SAO_SPEC's: actor lr 1e-6, critic lr 5e-6, ``K = 2`` critic updates
per batch, value clip 0.2 (``objective.value_clip``), maximum policy lag 4. See
docs/trainer.md for what each key does.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from services.config import StrictModel, load_config, register_section
from trainer.algorithms import ALGORITHMS, ObjectiveConfig

SECTION = "trainer"


class OptimizerConfig(StrictModel):
    """AdamW with global grad-norm clipping, a linear warm-up of the learning rate and then a
    flat, linear or cosine schedule (trainer/backends/lr_schedule.py). Steps count optimizer
    steps: ``actor_minibatches`` per train step for the actor, ``K x minibatches`` for the
    critic."""

    lr: float = Field(gt=0, description="peak learning rate")
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = Field(default=1e-8, gt=0)
    weight_decay: float = Field(default=0.0, ge=0)
    grad_clip: float = Field(default=1.0, ge=0, description="max global grad norm; 0 = off")
    warmup_steps: int = Field(default=0, ge=0, description="linear warm-up from lr/warmup")
    schedule: Literal["constant", "linear", "cosine"] = Field(
        default="constant", description="the lr after the warm-up: flat, or decayed to a floor"
    )
    decay_steps: int = Field(
        default=0, ge=0, description="optimizer steps after the warm-up to reach the floor"
    )
    min_lr_ratio: float = Field(
        default=0.0, ge=0, le=1, description="the floor of a decay, as a fraction of lr"
    )

    @field_validator("betas")
    @classmethod
    def _betas_in_unit_interval(cls, betas: tuple[float, float]) -> tuple[float, float]:
        if not all(0.0 <= b < 1.0 for b in betas):
            raise ValueError(f"betas must lie in [0, 1), got {betas}")
        return betas

    @model_validator(mode="after")
    def _decay_has_a_length(self) -> OptimizerConfig:
        if self.schedule != "constant" and self.decay_steps == 0:
            raise ValueError(f"schedule {self.schedule!r} needs decay_steps > 0")
        if self.schedule == "constant" and (self.decay_steps or self.min_lr_ratio):
            raise ValueError("decay_steps and min_lr_ratio only apply to schedule linear or cosine")
        return self


class CriticConfig(StrictModel):
    """The critic: a copy of the policy with a scalar value head and frozen attention."""

    optimizer: OptimizerConfig = OptimizerConfig(lr=5e-6)
    updates_per_step: int = Field(default=2, ge=0, description="K critic passes per batch")
    head: Literal["linear", "sigmoid"] = Field(
        default="linear", description="linear value (Li2SAO) or sigmoid of a logit (PACT)"
    )
    head_init_std: float = Field(default=0.02, ge=0, description="std of the head's weights")


class BatchConfig(StrictModel):
    """Turning trajectory records into padded batches and micro-batches."""

    max_seq_len: int = Field(default=32768, ge=2, description="prompt + post-prompt tokens")
    overlong: Literal["drop", "error"] = Field(
        default="drop", description="a segment longer than max_seq_len: drop it, or fail"
    )
    max_policy_lag: int = Field(default=4, ge=0, description="drop trajectories lagging more")
    micro_batch_tokens: int = Field(
        default=16384, ge=1, description="padded tokens (lanes x length) per micro-batch"
    )
    lane_factor: float = Field(
        default=2.0,
        ge=0,
        description="sequence packing: rows share lanes of at most this many times the "
        "micro-batch's longest row (0: one row per lane, no packing)",
    )

    @field_validator("lane_factor")
    @classmethod
    def _zero_or_at_least_one(cls, value: float) -> float:
        if 0 < value < 1:
            raise ValueError(f"lane_factor must be 0 (no packing) or >= 1, got {value}")
        return value


class CheckpointConfig(StrictModel):
    """Where checkpoints go and how many stay (``trainer.checkpoint.save_and_prune``)."""

    dir: str = Field(default="", description="root of the step-N checkpoint directories")
    keep_last: int = Field(default=3, ge=1, description="complete checkpoints kept (newest)")


class MegatronConfig(StrictModel):
    """Settings of the ``megatron`` backend only (trainer.backends.megatron)."""

    tensor_parallel: int = Field(
        default=1, ge=1, description="tensor-parallel ranks (the processes of one model replica)"
    )
    expert_parallel: int = Field(
        default=1,
        ge=1,
        description="expert-parallel ranks of a MoE (EP = world, TP = PP = 1)",
    )
    pipeline_parallel: int = Field(
        default=1,
        ge=1,
        description="pipeline stages (dense models; the world is TP x PP x data parallel)",
    )
    context_parallel: int = Field(
        default=1,
        ge=1,
        description=(
            "context-parallel ranks: each holds a slice of every sequence, keys and values "
            "all-gathered per layer (dense models, PP = EP = 1; TP x CP x DP divides the world)"
        ),
    )
    distributed_optimizer: bool = Field(
        default=False,
        description=(
            "shard the AdamW states over the data-parallel ranks (ZeRO-1: torch's "
            "ZeroRedundancyOptimizer; data parallel only, a no-op in one process)"
        ),
    )

    @model_validator(mode="after")
    def _context_parallel_alone(self) -> MegatronConfig:
        if self.context_parallel > 1:
            for name in ("pipeline_parallel", "expert_parallel"):
                if getattr(self, name) > 1:
                    raise ValueError(
                        f"context_parallel {self.context_parallel} with {name} "
                        f"{getattr(self, name)} is not built in the megatron backend yet"
                    )
        return self


class TrainerConfig(StrictModel):
    """Everything the trainer engine needs."""

    backend: Literal["torch", "megatron"] = "torch"
    model: str = Field(default="", description="HF model directory (actor and critic init)")
    algorithm: str = Field(default="li2sao", description=f"one of {', '.join(ALGORITHMS)}")
    objective: ObjectiveConfig = Field(
        default_factory=ObjectiveConfig, description="trainer.algorithms.ObjectiveConfig"
    )
    actor: OptimizerConfig = OptimizerConfig(lr=1e-6)
    critic: CriticConfig = CriticConfig()
    batch: BatchConfig = BatchConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()
    megatron: MegatronConfig = MegatronConfig()
    device: str = Field(default="cpu", description="cpu, cuda or cuda:N")
    precision: Literal["fp32", "bf16"] = Field(
        default="fp32", description="bf16: autocast compute with fp32 master weights (GPU)"
    )
    rollout_temperature: float = Field(
        default=1.0, gt=0, description="temperature the engines scaled logits by"
    )
    actor_minibatches: int = Field(
        default=1, ge=1, description="actor optimizer steps per batch (its minibatches)"
    )
    phase_timings: bool = Field(
        default=False, description="add time/* seconds per step phase to the step metrics"
    )
    activation_checkpointing: bool = False
    kl_coef: float = Field(
        default=0.0,
        ge=0,
        description="beta of an optional KL penalty to the frozen initial model "
        "(trainer.algorithms.kl; 0 = off, no reference model loaded)",
    )
    seed: int = Field(default=0, ge=0)

    @field_validator("algorithm")
    @classmethod
    def _known_algorithm(cls, name: str) -> str:
        from trainer.algorithms.objectives import ALGORITHM_REGISTRY  # registered baselines too

        ALGORITHM_REGISTRY.get(name)  # ValueError "unknown algorithm ...; known: ..."
        return name

    @field_validator("device")
    @classmethod
    def _known_device(cls, device: str) -> str:
        kind = device.split(":", 1)[0]
        if kind not in ("cpu", "cuda"):
            raise ValueError(f"device must be cpu, cuda or cuda:N, got {device!r}")
        return device

    @model_validator(mode="after")
    def _head_fits_the_algorithm(self) -> TrainerConfig:
        from trainer.algorithms.objectives import ALGORITHM_REGISTRY

        head = ALGORITHM_REGISTRY.get(self.algorithm).plan.value_head
        if head is not None and head != self.critic.head:
            raise ValueError(
                f"algorithm {self.algorithm!r} needs critic.head: {head} "
                f"(got {self.critic.head}; a run does not switch head type)"
            )
        return self

    @model_validator(mode="after")
    def _bf16_needs_gpu(self) -> TrainerConfig:
        if self.precision == "bf16" and not self.device.startswith("cuda"):
            raise ValueError("precision bf16 is the GPU path; on the CPU use fp32")
        return self


register_section(SECTION, TrainerConfig)


def load_trainer_config(
    path: str | Path | None = None,
    *,
    overrides: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> TrainerConfig:
    """The ``trainer`` section from YAML / ``SWERL_TRAINER__*`` / overrides, validated."""
    return load_config(
        TrainerConfig, section=SECTION, path=path, overrides=overrides, environ=environ
    )
