"""Advantage estimators and policy losses by name: the parts an algorithm is composed of.

An estimator maps ``(batch, config, all_reduce)`` to an :class:`Estimate` (advantages ``[N]``
or ``[N, T]``, and the lambda = 1 critic returns when it computes them anyway); a policy loss
maps ``(batch, reference_logp, advantages, config, aggregation)`` to ``(loss, metrics)`` with
the ratio ``exp(logp - reference_logp)``. Both read the batch's trajectory index, so a
trajectory with several rows (segments) counts once. Register a new one with
``@ESTIMATORS.register("name")`` / ``@POLICY_LOSSES.register("name")`` in its own module.

=========  ============================================================================
estimator  advantages
=========  ============================================================================
grpo       Eq. 2 per trajectory: ``(R - mu_g) / (sigma_g + eps)``, groups of trajectories
gae        whitened skip-observation GAE with the adaptive trace (Eq. 6-7); returns too
li2sao     ``grpo`` when the largest group has > 1 trajectory, else ``gae`` (app. F.3)
pact       ``R~ - V_old`` (GAE lambda = 1), whitened only with ``pact_whiten``
srppo      ``w^ (R~ - V_old)``, ``w^`` the Pass@k weight of ``V_old(s_{u_1})``
=========  ============================================================================

Policy losses: ``ppo_clip`` (Eq. 1), ``dis`` (Eq. 8-9), ``gspo`` (sequence ratio; ignores the
aggregation: always the sequence mean of token means).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch import Tensor

from trainer.algorithms.advantages import (
    AllReduce,
    adaptive_lambda,
    grpo_advantages,
    normalize_rewards,
    whiten,
)
from trainer.algorithms.gae import gae_advantages_and_returns
from trainer.algorithms.objective_types import ObjectiveBatch, ObjectiveConfig
from trainer.algorithms.pact import pact_advantages
from trainer.algorithms.policy_losses import (
    Aggregation,
    dis_policy_loss,
    gspo_policy_loss,
    ppo_clip_policy_loss,
)
from trainer.algorithms.registry import Registry
from trainer.algorithms.srppo import srppo_advantages


@dataclass(frozen=True)
class Estimate:
    """What an estimator returns.

    Attributes:
        advantages: ``[N]`` (one per row) or ``[N, T]`` (0 off the action tokens).
        returns: ``[N, T]`` lambda = 1 critic targets when the estimator computed them, else None.
        estimator: the name reported in ``ObjectiveResult.estimator`` (``li2sao`` reports the
            one it picked).
    """

    advantages: Tensor
    returns: Tensor | None
    estimator: str


EstimatorFn = Callable[[ObjectiveBatch, ObjectiveConfig, "AllReduce | None"], Estimate]
PolicyLossFn = Callable[
    [ObjectiveBatch, Tensor, Tensor, ObjectiveConfig, Aggregation], tuple[Tensor, dict[str, Tensor]]
]
ESTIMATORS: Registry[EstimatorFn] = Registry("advantage estimator")
POLICY_LOSSES: Registry[PolicyLossFn] = Registry("policy loss")


def require_critic(batch: ObjectiveBatch, who: str) -> tuple[Tensor, Tensor]:
    """``(values, old_values)``, or a ValueError naming ``who`` needs them."""
    if batch.values is None or batch.old_values is None:
        raise ValueError(f"{who} needs batch.values (the critic's [N, T] outputs)")
    return batch.values, batch.old_values


def normalized_rewards(batch: ObjectiveBatch, config: ObjectiveConfig, like: Tensor) -> Tensor:
    """PACT / SR-PPO's ``R~`` in ``[0, 1]`` (a ValueError outside the configured range), in
    ``like``'s dtype."""
    rewards = normalize_rewards(batch.rewards, config.reward_min, config.reward_max)
    return rewards.to(like.dtype)


@ESTIMATORS.register("grpo")
def grpo_estimate(
    batch: ObjectiveBatch, config: ObjectiveConfig, all_reduce: AllReduce | None = None
) -> Estimate:
    """Eq. 2 on the trajectories (group sizes, mean and sigma count trajectories), written on
    each of a trajectory's rows."""
    trajectories = batch.trajectories
    adv = grpo_advantages(
        trajectories.rewards, trajectories.group_ids, config.grpo_eps, check=False
    )
    return Estimate(trajectories.to_rows(adv), None, "grpo")


@ESTIMATORS.register("gae")
def gae_estimate(
    batch: ObjectiveBatch, config: ObjectiveConfig, all_reduce: AllReduce | None = None
) -> Estimate:
    """Whitened adaptive-trace GAE advantages and lambda = 1 returns (LI2SAO_SPEC, after the
    switch); the outcome rewards ``[N]`` sit on each row's last action token."""
    _, old_values = require_critic(batch, "the gae estimator")
    mask = batch.mask
    rewards = batch.rewards.to(old_values.dtype)
    lam = adaptive_lambda(mask, config.lambda_alpha, dtype=old_values.dtype, check=False)
    adv, returns = gae_advantages_and_returns(
        rewards, old_values, mask, config.gamma, lam, check=False
    )  # Eq. 6-7
    adv = whiten(adv, mask, config.whiten_eps, all_reduce=all_reduce, check=False)
    return Estimate(adv, returns, "gae")


@ESTIMATORS.register("li2sao")
def li2sao_estimate(
    batch: ObjectiveBatch, config: ObjectiveConfig, all_reduce: AllReduce | None = None
) -> Estimate:
    """Appendix F.3: GRPO when the largest group has more than one trajectory, else GAE."""
    name = "grpo" if batch.largest_group_size > 1 else "gae"
    return ESTIMATORS.get(name)(batch, config, all_reduce)


@ESTIMATORS.register("pact")
def pact_estimate(
    batch: ObjectiveBatch, config: ObjectiveConfig, all_reduce: AllReduce | None = None
) -> Estimate:
    """PACT sec. 3.3: ``A = R~ - V_old`` per action token (GAE, lambda = 1)."""
    _, old_values = require_critic(batch, "pact")
    rewards = normalized_rewards(batch, config, old_values)
    adv = pact_advantages(rewards, old_values, batch.mask, config.gamma, check=False)
    if config.pact_whiten:
        adv = whiten(adv, batch.mask, config.whiten_eps, all_reduce=all_reduce, check=False)
    return Estimate(adv, None, "gae")


@ESTIMATORS.register("srppo")
def srppo_estimate(
    batch: ObjectiveBatch, config: ObjectiveConfig, all_reduce: AllReduce | None = None
) -> Estimate:
    """SR-PPO sec. 4.2: ``A = w^ (R~ - V_old)`` with ``w^`` the Pass@k weight."""
    _, old_values = require_critic(batch, "srppo")
    rewards = normalized_rewards(batch, config, old_values)
    adv = srppo_advantages(
        rewards, old_values, batch.mask, config.srppo_k, config.gamma, check=False
    )
    return Estimate(adv, None, "gae")


def _ratio_loss(
    loss: Callable[..., tuple[Tensor, dict[str, Tensor]]],
    bounds: Callable[[ObjectiveConfig], tuple[float, float]],
    *,
    aggregated: bool = True,
) -> PolicyLossFn:
    """A registry entry for ``loss(logp, reference_logp, advantages, mask, low, high,
    [aggregation,] trajectory_index=...)`` with its two bounds read from the config."""

    def entry(
        batch: ObjectiveBatch,
        reference_logp: Tensor,
        advantages: Tensor,
        config: ObjectiveConfig,
        aggregation: Aggregation,
    ) -> tuple[Tensor, dict[str, Tensor]]:
        low, high = bounds(config)
        extra = (aggregation,) if aggregated else ()
        return loss(
            batch.logp, reference_logp, advantages, batch.mask, low, high, *extra,
            trajectory_index=batch.trajectories.row_index, check=False,
        )  # fmt: skip

    return entry


POLICY_LOSSES.register("ppo_clip")(
    _ratio_loss(ppo_clip_policy_loss, lambda c: (c.ppo_eps_low, c.ppo_eps_high))
)
POLICY_LOSSES.register("dis")(_ratio_loss(dis_policy_loss, lambda c: (c.dis_low, c.dis_high)))
POLICY_LOSSES.register("gspo")(  # GSPO ignores the aggregation (sequence mean of token means)
    _ratio_loss(gspo_policy_loss, lambda c: (c.gspo_eps_low, c.gspo_eps_high), aggregated=False)
)
