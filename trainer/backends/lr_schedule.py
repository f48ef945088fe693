"""The learning-rate multiplier of each optimizer step (OptimizerConfig).

``lr_multiplier(config, n)`` is the factor on ``config.lr`` for optimizer step ``n`` (0 is the
first step, as ``torch.optim.lr_scheduler.LambdaLR`` counts): a linear warm-up
``(n + 1) / warmup_steps`` over the first ``warmup_steps`` steps, then

- ``constant``: 1;
- ``linear``: from 1 down to ``min_lr_ratio`` over ``decay_steps`` steps, then the floor;
- ``cosine``: ``floor + (1 - floor) * (1 + cos(pi * t / decay_steps)) / 2``, then the floor.

A pure function of the config and the step, so a resumed run (the scheduler's step count is
checkpointed) continues on the same curve.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from trainer.config import OptimizerConfig


def lr_multiplier(config: OptimizerConfig, step: int) -> float:
    """The factor on ``config.lr`` for optimizer step ``step`` (0-based)."""
    if step < 0:
        raise ValueError(f"optimizer step must be >= 0, got {step}")
    if step < config.warmup_steps:
        return (step + 1) / config.warmup_steps
    if config.schedule == "constant":
        return 1.0
    progress = min(1.0, (step - config.warmup_steps) / config.decay_steps)
    floor = config.min_lr_ratio
    if config.schedule == "linear":
        return 1.0 - (1.0 - floor) * progress
    return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


def lr_lambda(config: OptimizerConfig) -> Callable[[int], float]:
    """``lr_multiplier`` bound to ``config``, for ``LambdaLR``."""
    return lambda step: lr_multiplier(config, step)
