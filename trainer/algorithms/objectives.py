"""Objective layer: one function per algorithm, batch in, losses and metrics out.

``compute_objective(name, batch, phase=..., config=...)`` returns an :class:`ObjectiveResult`
with the actor loss, the critic loss (None for critic-free baselines), float metrics, the
advantage estimator used and, for the Li2SAO bootstrap, the readiness statistics to all-reduce
and feed to the :class:`~trainer.algorithms.readiness.ReadinessGate`.

=========  ======================  =====================  ====================================
name       advantage               policy loss            critic
=========  ======================  =====================  ====================================
grpo       GRPO (Eq. 2)            PPO clip (Eq. 1)       none
dapo       GRPO (Eq. 2)            PPO clip, token-mean   none (dynamic sampling: see sampling)
gspo       GRPO (Eq. 2)            GSPO sequence clip     none
lisao      whitened GAE (6-7)      DIS (Eq. 8-9)          clipped loss on returns (Eq. 5)
li2sao     GRPO if largest group   DIS (Eq. 8-9)          bootstrap: Eq. 10 on centred,
           > 1, else whitened GAE                         divergence-masked targets + alpha *
                                                          Eq. 11; switched: Eq. 5
pact       GAE lambda = 1 (R - V)  TIS x DIS or PPO clip  separate stage after the actor
                                   on old_logp            steps: BCE on W R, IS-accepted tokens
srppo      w^ (R - V), w^ = Pass   PPO clip               BCE + MSE on y = R, sigmoid head
           @k weight k(1-q^)^(k-1)
=========  ======================  =====================  ====================================

PACT and SR-PPO follow PACT_SRPPO_SPEC (rewards normalised to ``[0, 1]`` first). The batch is
validated once when it is built; the objective then calls the primitives with
``check=False``. Advantages and returns are computed from ``old_values`` (the critic frozen once
per batch), so they are identical across the ``K`` critic passes of one batch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal, get_args

import torch
from torch import Tensor

from trainer.algorithms.advantages import (
    AllReduce,
    adaptive_lambda,
    grpo_advantages,
    normalize_rewards,
    whiten,
)
from trainer.algorithms.critic import (
    bce_value_loss,
    clipped_value_loss,
    group_residual_targets,
    terminal_ranking_loss,
    value_loss_terms,
)
from trainer.algorithms.divergence import divergence_mask
from trainer.algorithms.gae import discounted_returns, gae_advantages_and_returns
from trainer.algorithms.groups import GroupIndex, group_all_equal, group_index
from trainer.algorithms.masks import ActionMask
from trainer.algorithms.pact import (
    CRITIC_IS_MODES,
    CriticIS,
    mean_abs_credit,
    pact_advantages,
    pact_is_weights,
    targets_from_weights,
    tis_weights,
)
from trainer.algorithms.policy_losses import (
    AGGREGATIONS,
    Aggregation,
    dis_policy_loss,
    gspo_policy_loss,
    ppo_clip_policy_loss,
)
from trainer.algorithms.positions import first_action_values, terminal_values
from trainer.algorithms.readiness import ReadinessStats, readiness_statistics
from trainer.algorithms.srppo import srppo_advantages, srppo_passk_weights
from trainer.algorithms.staleness import off_policy_token_ratio, policy_lag
from trainer.algorithms.validation import (
    require_floating,
    require_group_ids,
    require_positive,
    require_rewards,
    require_same_device,
    require_same_shape,
    require_tokens,
    require_unit_interval,
)

AlgorithmName = Literal["grpo", "dapo", "gspo", "lisao", "li2sao", "pact", "srppo"]
ALGORITHMS: tuple[str, ...] = get_args(AlgorithmName)
Phase = Literal["bootstrap", "switched"]
PHASES: tuple[str, ...] = get_args(Phase)
Stage = Literal["actor", "critic"]
STAGES: tuple[str, ...] = get_args(Stage)
Estimator = Literal["grpo", "gae"]
PactPolicyLoss = Literal["dis", "ppo"]
PACT_POLICY_LOSSES: tuple[str, ...] = get_args(PactPolicyLoss)
PASSK_HARD_BELOW = 3 / 8
"""SR-PPO difficulty bins on ``q^`` (sec. 5.5 bins 8 rollouts: hard <= 2, easy >= 6 correct)."""
PASSK_EASY_FROM = 6 / 8


@dataclass(frozen=True)
class ObjectiveConfig:
    """Hyper-parameters of every objective (defaults: LI2SAO_SPEC and PACT_SRPPO_SPEC).

    ``aggregation`` None means the algorithm's own default: ``token-mean`` for DAPO (its
    token-level loss), ``seq-mean-token-mean`` (Eq. 1) for the others. GSPO always averages
    per sequence. ``gamma``, ``dis_low/high``, ``ppo_eps_low/high`` and ``whiten_eps`` are
    shared with PACT and SR-PPO; the fields after ``whiten_eps`` are theirs.
    """

    grpo_eps: float = 1e-6
    ppo_eps_low: float = 0.2
    ppo_eps_high: float = 0.28
    gspo_eps_low: float = 3e-4
    gspo_eps_high: float = 4e-4
    dis_low: float = 0.7
    dis_high: float = 6.0
    aggregation: Aggregation | None = None
    gamma: float = 1.0
    lambda_alpha: float = 1.5
    value_clip: float = 0.2
    alpha_rank: float = 0.1
    rank_margin: float = 0.1
    whiten_eps: float = 1e-8
    reward_min: float = 0.0
    reward_max: float = 1.0
    pact_policy_loss: PactPolicyLoss = "dis"
    tis_low: float = 0.0
    tis_high: float = 2.0
    pact_critic_is: CriticIS = "token"
    pact_is_low: float = 0.0
    pact_is_high: float = 6.0
    pact_whiten: bool = False
    srppo_k: float = 4.0
    srppo_bce_coef: float = 1.0
    srppo_mse_coef: float = 1.0

    def __post_init__(self) -> None:
        for name in ("grpo_eps", "ppo_eps_low", "ppo_eps_high", "gspo_eps_low", "gspo_eps_high"):
            require_positive(name, getattr(self, name), allow_zero=True)
        for name in ("dis_low", "value_clip", "alpha_rank", "rank_margin", "whiten_eps"):
            require_positive(name, getattr(self, name), allow_zero=True)
        require_positive("dis_high", self.dis_high)
        require_positive("lambda_alpha", self.lambda_alpha)
        require_unit_interval("gamma", self.gamma)
        if not self.dis_low < self.dis_high:
            raise ValueError(f"dis_low must be < dis_high, got {self.dis_low}, {self.dis_high}")
        if self.aggregation is not None and self.aggregation not in AGGREGATIONS:
            raise ValueError(f"aggregation must be one of {AGGREGATIONS} or None")
        self._check_pact_srppo()

    def _check_pact_srppo(self) -> None:
        for name in ("reward_min", "reward_max"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"{name} must be a number, got {value!r}")
            if not math.isfinite(value):
                raise ValueError(f"{name} must be finite, got {value!r}")
        if not self.reward_max > self.reward_min:
            raise ValueError(
                f"reward_max must be > reward_min, got {self.reward_min}, {self.reward_max}"
            )
        if self.pact_policy_loss not in PACT_POLICY_LOSSES:
            raise ValueError(f"pact_policy_loss must be one of {PACT_POLICY_LOSSES}")
        if self.pact_critic_is not in CRITIC_IS_MODES:
            raise ValueError(f"pact_critic_is must be one of {CRITIC_IS_MODES}")
        for low, high in (("tis_low", "tis_high"), ("pact_is_low", "pact_is_high")):
            require_positive(low, getattr(self, low), allow_zero=True)
            require_positive(high, getattr(self, high))
            if not getattr(self, low) < getattr(self, high):
                raise ValueError(f"{low} must be < {high}")
        if not isinstance(self.pact_whiten, bool):
            raise ValueError(f"pact_whiten must be a bool, got {self.pact_whiten!r}")
        require_positive("srppo_k", self.srppo_k)
        if self.srppo_k < 1:
            raise ValueError(f"srppo_k must be >= 1, got {self.srppo_k}")
        require_positive("srppo_bce_coef", self.srppo_bce_coef, allow_zero=True)
        require_positive("srppo_mse_coef", self.srppo_mse_coef, allow_zero=True)
        if self.srppo_bce_coef == 0 and self.srppo_mse_coef == 0:
            raise ValueError("srppo_bce_coef and srppo_mse_coef are both 0 (no critic loss)")


DEFAULT_CONFIG = ObjectiveConfig()


@dataclass(frozen=True)
class ObjectiveBatch:
    """One training batch in the padded ``[N, T]`` layout (one row per trajectory).

    Attributes:
        tokens: ``[N, T]`` integer post-prompt token ids, ``-1`` past each trajectory's end.
        action_mask: ``[N, T]`` 1 on model-generated tokens (stored as bool after validation).
        group_ids: ``[N]`` non-negative integer prompt-group ids.
        rewards: ``[N]`` float outcome rewards.
        behavior_logp: ``[N, T]`` log-probabilities recorded by the rollout engine.
        logp: ``[N, T]`` log-probabilities of the current policy (with gradient).
        values: ``[N, T]`` critic values ``V(s_t)`` (with gradient); needed by lisao/li2sao.
            With ``value_logits`` it is set to ``sigmoid(value_logits)`` (give one, not both).
        old_values: ``[N, T]`` critic values frozen once per batch; defaults to
            ``values.detach()`` (right for the first critic pass of a batch).
        token_versions: optional ``[N, T]`` integer policy version of each token.
        trainer_version: the trainer's policy version; required with ``token_versions``.
        old_logp: optional ``[N, T]`` log-probabilities recomputed by the trainer under the
            pre-update policy (no gradient); PACT's actor ratio and TIS use it (absent: the
            behaviour log-probabilities).
        value_logits: optional ``[N, T]`` raw outputs ``z_t`` of a sigmoid value head (with
            gradient); PACT's critic stage and SR-PPO need them (BCE on logits).
    """

    tokens: Tensor
    action_mask: Tensor
    group_ids: Tensor
    rewards: Tensor
    behavior_logp: Tensor
    logp: Tensor
    values: Tensor | None = None
    old_values: Tensor | None = None
    token_versions: Tensor | None = None
    trainer_version: int | None = None
    old_logp: Tensor | None = None
    value_logits: Tensor | None = None
    mask: ActionMask = field(init=False, repr=False, compare=False)
    groups: GroupIndex = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        action_mask = ActionMask(self.action_mask)
        mask = action_mask.mask
        require_tokens(self.tokens, mask)
        require_rewards(self.rewards)
        require_group_ids(self.group_ids, self.rewards.shape[0])
        if self.rewards.shape[0] != mask.shape[0]:
            raise ValueError(
                f"shape mismatch: rewards has {self.rewards.shape[0]} entries, "
                f"action_mask has {mask.shape[0]} rows"
            )
        floats = {"logp": self.logp, "behavior_logp": self.behavior_logp}
        if self.old_logp is not None:
            floats["old_logp"] = self.old_logp
        if self.value_logits is not None:
            if self.values is not None:
                raise ValueError(
                    "give values or value_logits, not both (values := sigmoid(value_logits))"
                )
            floats["value_logits"] = self.value_logits
        elif self.old_values is not None and self.values is None:
            raise ValueError("old_values given without values")
        if self.values is not None:
            floats["values"] = self.values
        if self.old_values is not None:
            floats["old_values"] = self.old_values
        for name, tensor in floats.items():
            require_floating(name, tensor)
        require_same_shape(action_mask=mask, **floats)
        require_same_device(
            tokens=self.tokens, group_ids=self.group_ids, rewards=self.rewards, **floats
        )
        if (self.token_versions is None) != (self.trainer_version is None):
            raise ValueError("token_versions and trainer_version must be given together")
        if self.token_versions is not None and self.trainer_version is not None:
            policy_lag(self.trainer_version, self.token_versions, action_mask)  # validates both
        object.__setattr__(self, "action_mask", mask)
        object.__setattr__(self, "mask", action_mask)
        if self.value_logits is not None:
            object.__setattr__(self, "values", torch.sigmoid(self.value_logits))
        if self.values is not None and self.old_values is None:
            object.__setattr__(self, "old_values", self.values.detach())
        object.__setattr__(self, "groups", group_index(self.group_ids))

    @property
    def largest_group_size(self) -> int:
        """Size of the largest prompt group in the batch (decides Li2SAO's estimator)."""
        return int(self.groups.counts.max())


@dataclass(frozen=True)
class ObjectiveResult:
    """What an objective returns.

    Attributes:
        actor_loss: scalar to minimise for the policy, or None (PACT's critic stage).
        critic_loss: scalar to minimise for the critic, or None (critic-free baselines and
            PACT's actor stage).
        metrics: float metrics of this batch (local to this rank).
        estimator: the actor's advantage estimator, ``"grpo"`` or ``"gae"``.
        readiness: Li2SAO bootstrap only: statistics to merge across ranks and feed to the gate.
    """

    actor_loss: Tensor | None
    critic_loss: Tensor | None
    metrics: dict[str, float]
    estimator: Estimator
    readiness: ReadinessStats | None = None


def _to_floats(metrics: dict[str, Tensor | float]) -> dict[str, float]:
    """Convert tensor metrics to floats with a single host synchronisation."""
    names = [k for k, v in metrics.items() if isinstance(v, Tensor)]
    out = {k: float(v) for k, v in metrics.items() if not isinstance(v, Tensor)}
    if names:
        stacked = torch.stack([metrics[k].detach().to(torch.float64).reshape(()) for k in names])
        out.update(zip(names, stacked.tolist(), strict=True))
    return out


def _batch_metrics(batch: ObjectiveBatch) -> dict[str, Tensor | float]:
    constant = group_all_equal(batch.rewards.detach(), batch.groups)
    metrics: dict[str, Tensor | float] = {
        "batch/trajectories": float(batch.rewards.shape[0]),
        "batch/groups": float(batch.groups.num_groups),
        "batch/largest_group": batch.groups.counts.max(),
        "batch/mixed_group_frac": (~constant).to(torch.float64).mean(),
        "batch/reward_mean": batch.rewards.detach().mean(),
        "batch/action_tokens": batch.mask.total(torch.float64),
    }
    if batch.token_versions is not None and batch.trainer_version is not None:
        version, versions = batch.trainer_version, batch.token_versions
        lags = policy_lag(version, versions, batch.mask, check=False)
        metrics["staleness/mean_lag"] = lags.to(torch.float64).mean()
        metrics["staleness/off_policy_token_ratio"] = off_policy_token_ratio(
            version, versions, batch.mask, check=False
        )
    return metrics


def _advantage_metrics(adv: Tensor, am: ActionMask) -> dict[str, Tensor | float]:
    """Mean and (population) std of the advantages over action tokens."""
    with torch.no_grad():
        if adv.ndim == 1:  # one value per row, weighted by the row's action tokens
            weights = am.row_counts(adv.dtype)
            total, first, second = weights.sum(), (adv * weights).sum(), (adv * adv * weights).sum()
        else:  # 0 off the action tokens already
            total = am.total(adv.dtype)
            first, second = adv.sum(), (adv * adv).sum()
        mean = first / total
        var = (second / total - mean * mean).clamp(min=0)
    return {"actor/adv_mean": mean, "actor/adv_std": var.sqrt()}


def _prefixed(prefix: str, metrics: dict[str, Tensor]) -> dict[str, Tensor | float]:
    return {f"{prefix}/{k}": v for k, v in metrics.items()}


def _require_critic(batch: ObjectiveBatch, algorithm: str) -> tuple[Tensor, Tensor]:
    if batch.values is None or batch.old_values is None:
        raise ValueError(f"{algorithm} needs batch.values (the critic's [N, T] outputs)")
    return batch.values, batch.old_values


def _group_policy_objective(
    batch: ObjectiveBatch, config: ObjectiveConfig, algorithm: str
) -> ObjectiveResult:
    """GRPO / DAPO / GSPO: group advantage, no critic."""
    adv = grpo_advantages(batch.rewards, batch.group_ids, config.grpo_eps, check=False)
    if algorithm == "gspo":
        loss, policy_metrics = gspo_policy_loss(
            batch.logp,
            batch.behavior_logp,
            adv,
            batch.mask,
            config.gspo_eps_low,
            config.gspo_eps_high,
            check=False,
        )
    else:
        default = "token-mean" if algorithm == "dapo" else "seq-mean-token-mean"
        loss, policy_metrics = ppo_clip_policy_loss(
            batch.logp,
            batch.behavior_logp,
            adv,
            batch.mask,
            config.ppo_eps_low,
            config.ppo_eps_high,
            config.aggregation or default,
            check=False,
        )
    metrics = _batch_metrics(batch)
    metrics.update(_prefixed("actor", policy_metrics))
    metrics.update(_advantage_metrics(adv, batch.mask))
    metrics["actor/loss"] = loss.detach()
    metrics["actor/estimator_is_grpo"] = 1.0
    return ObjectiveResult(loss, None, _to_floats(metrics), "grpo")


def grpo_objective(
    batch: ObjectiveBatch, config: ObjectiveConfig = DEFAULT_CONFIG
) -> ObjectiveResult:
    """GRPO baseline: group advantage (Eq. 2) + PPO clip (Eq. 1), no critic."""
    return _group_policy_objective(batch, config, "grpo")


def dapo_objective(
    batch: ObjectiveBatch, config: ObjectiveConfig = DEFAULT_CONFIG
) -> ObjectiveResult:
    """DAPO baseline: GRPO with clip-higher and token-mean loss; filter the batch first with
    :func:`trainer.algorithms.sampling.dynamic_sampling_filter`."""
    return _group_policy_objective(batch, config, "dapo")


def gspo_objective(
    batch: ObjectiveBatch, config: ObjectiveConfig = DEFAULT_CONFIG
) -> ObjectiveResult:
    """GSPO baseline: group advantage + sequence-level ratio and clipping."""
    return _group_policy_objective(batch, config, "gspo")


def _critic_explained_variance(returns: Tensor, values: Tensor, am: ActionMask) -> Tensor:
    """``1 - Var(G - V) / Var(G)`` over action tokens (section 3.2's critic diagnostic)."""
    with torch.no_grad():
        count = am.total(torch.float64)
        residual = (returns - values) * am.weights(values.dtype)  # returns are 0 off actions

        def variance(x: Tensor) -> Tensor:
            mean = x.sum().to(torch.float64) / count
            return (x * x).sum().to(torch.float64) / count - mean * mean

        var_g = variance(returns)
        return torch.where(var_g > 0, 1 - variance(residual) / var_g.clamp(min=1e-300), torch.nan)


def _outcome_explained_variance(rewards: Tensor, am: ActionMask, residual_var: Tensor) -> Tensor:
    """``1 - Var(G - V) / Var(G)`` over action tokens for ``G = R`` on every action token:
    ``Var(G)`` from the ``[N]`` rewards weighted by the rows' action counts."""
    with torch.no_grad():
        counts = am.row_counts(torch.float64)
        r = rewards.to(torch.float64)
        count = counts.sum()
        mean = (r * counts).sum() / count
        var_g = (r * r * counts).sum() / count - mean * mean
        return torch.where(var_g > 0, 1 - residual_var / var_g.clamp(min=1e-300), torch.nan)


def _gae_actor_and_returns(
    batch: ObjectiveBatch, old_values: Tensor, config: ObjectiveConfig, all_reduce: AllReduce | None
) -> tuple[Tensor, Tensor]:
    """Whitened adaptive-trace GAE advantages and lambda = 1 returns (LI2SAO_SPEC, after switch).

    The outcome rewards ``[N]`` sit on each row's last action token (``r_{u_M} = R``).
    """
    mask = batch.mask
    rewards = batch.rewards.to(old_values.dtype)
    lam = adaptive_lambda(mask, config.lambda_alpha, dtype=old_values.dtype, check=False)
    adv, returns = gae_advantages_and_returns(
        rewards, old_values, mask, config.gamma, lam, check=False
    )
    adv = whiten(adv, mask, config.whiten_eps, all_reduce=all_reduce, check=False)
    return adv, returns


def _dis(
    batch: ObjectiveBatch, adv: Tensor, config: ObjectiveConfig
) -> tuple[Tensor, dict[str, Tensor]]:
    return dis_policy_loss(
        batch.logp,
        batch.behavior_logp,
        adv,
        batch.mask,
        config.dis_low,
        config.dis_high,
        config.aggregation or "seq-mean-token-mean",
        check=False,
    )


def lisao_objective(
    batch: ObjectiveBatch,
    config: ObjectiveConfig = DEFAULT_CONFIG,
    *,
    all_reduce: AllReduce | None = None,
) -> ObjectiveResult:
    """LiSAO baseline: whitened skip-observation GAE + DIS; critic on absolute returns (Eq. 5).

    The 10 critic-only warm-up steps are the trainer's business (it skips the actor step).
    """
    values, old_values = _require_critic(batch, "lisao")
    adv, returns = _gae_actor_and_returns(batch, old_values, config, all_reduce)
    actor_loss, policy_metrics = _dis(batch, adv, config)
    critic_loss = clipped_value_loss(
        values, old_values, returns, batch.mask, config.value_clip, check=False
    )
    metrics = _batch_metrics(batch)
    metrics.update(_prefixed("actor", policy_metrics))
    metrics.update(_advantage_metrics(adv, batch.mask))
    metrics["actor/loss"] = actor_loss.detach()
    metrics["actor/estimator_is_grpo"] = 0.0
    metrics["critic/loss"] = critic_loss.detach()
    metrics["critic/explained_variance"] = _critic_explained_variance(
        returns, old_values, batch.mask
    )
    return ObjectiveResult(actor_loss, critic_loss, _to_floats(metrics), "gae")


def li2sao_objective(
    batch: ObjectiveBatch,
    phase: Phase,
    config: ObjectiveConfig = DEFAULT_CONFIG,
    *,
    all_reduce: AllReduce | None = None,
) -> ObjectiveResult:
    """Li2SAO: estimator from the batch, critic objective from the phase.

    Actor (appendix F.3): GRPO advantage (Eq. 2, no whitening) when the largest group of the
    batch has more than one member, else whitened adaptive-trace GAE; DIS in both cases.

    Critic: ``phase="bootstrap"``: ``L_res + alpha_rank * L_rank`` (section 4.1) with targets
    ``G - mu_g`` (lambda = 1 returns), mask = action tokens at/after the divergence point of
    members of mixed groups, and the terminal ranking loss; the result also carries the
    readiness statistics of the batch. ``phase="switched"``: the clipped loss on absolute
    returns over all action tokens (Eq. 5), no centring, no ranking.
    """
    if phase not in PHASES:
        raise ValueError(f"phase must be one of {PHASES}, got {phase!r}")
    values, old_values = _require_critic(batch, "li2sao")
    mask = batch.mask
    estimator: Estimator = "grpo" if batch.largest_group_size > 1 else "gae"
    if estimator == "grpo":
        adv = grpo_advantages(batch.rewards, batch.group_ids, config.grpo_eps, check=False)
        rewards = batch.rewards.to(old_values.dtype)
        returns = discounted_returns(rewards, mask, config.gamma, check=False)  # lambda = 1
    else:
        adv, returns = _gae_actor_and_returns(batch, old_values, config, all_reduce)
    actor_loss, policy_metrics = _dis(batch, adv, config)
    metrics = _batch_metrics(batch)
    metrics.update(_prefixed("actor", policy_metrics))
    metrics.update(_advantage_metrics(adv, mask))
    metrics["actor/loss"] = actor_loss.detach()
    metrics["actor/estimator_is_grpo"] = 1.0 if estimator == "grpo" else 0.0
    readiness: ReadinessStats | None = None
    if phase == "bootstrap":
        # targets are read only under the critic mask (action tokens), so no masking pass here
        targets, keep = group_residual_targets(returns, batch.rewards, batch.group_ids, check=False)
        critic_mask = divergence_mask(
            batch.tokens, mask, batch.rewards, batch.group_ids, check=False
        )
        dropped = (~keep).nonzero().squeeze(1)  # members of groups with equal rewards
        critic_mask.index_fill_(0, dropped, False)  # touches those rows only
        residual = clipped_value_loss(
            values, old_values, targets, critic_mask, config.value_clip, check=False
        )
        final_values = terminal_values(values, mask, check=False)
        ranking = terminal_ranking_loss(
            final_values, batch.rewards, batch.group_ids, config.rank_margin, check=False
        )
        critic_loss = residual + config.alpha_rank * ranking  # section 4.1: L_res + a L_rank
        readiness = readiness_statistics(
            final_values.detach(), batch.rewards, batch.group_ids, check=False
        )
        metrics["critic/residual_loss"] = residual.detach()
        metrics["critic/rank_loss"] = ranking.detach()
        metrics["critic/mask_frac"] = torch.count_nonzero(critic_mask).to(
            torch.float64
        ) / mask.total(torch.float64)
        metrics["critic/kept_frac"] = keep.to(torch.float64).mean()
        if readiness.explained_variance is not None:
            metrics["readiness/explained_variance"] = readiness.explained_variance
        if readiness.ranking_accuracy is not None:
            metrics["readiness/ranking_accuracy"] = readiness.ranking_accuracy
    else:
        critic_loss = clipped_value_loss(
            values, old_values, returns, mask, config.value_clip, check=False
        )  # Eq. 5 with the clipped form of Eq. 10
        metrics["critic/explained_variance"] = _critic_explained_variance(returns, old_values, mask)
    metrics["critic/loss"] = critic_loss.detach()
    return ObjectiveResult(actor_loss, critic_loss, _to_floats(metrics), estimator, readiness)


def _pact_srppo_inputs(
    batch: ObjectiveBatch, config: ObjectiveConfig, algorithm: str
) -> tuple[Tensor, Tensor]:
    """``(R~, V_old)``: the rewards normalised to ``[0, 1]`` (a ValueError outside the
    configured range) in the critic's dtype, and the frozen critic values."""
    _, old_values = _require_critic(batch, algorithm)
    rewards = normalize_rewards(batch.rewards, config.reward_min, config.reward_max)
    return rewards.to(old_values.dtype), old_values


def _require_logits(batch: ObjectiveBatch, what: str) -> Tensor:
    if batch.value_logits is None:
        raise ValueError(f"{what} needs batch.value_logits (the sigmoid head's [N, T] logits)")
    return batch.value_logits


def _masked_mean(x: Tensor, weights: Tensor, count: Tensor) -> Tensor:
    """Mean of ``x`` over the entries with weight 1 (``count`` of them), float64."""
    with torch.no_grad():
        return torch.dot(x.reshape(-1), weights.reshape(-1)).to(torch.float64) / count


def _value_gap(rewards: Tensor, old_values: Tensor, am: ActionMask) -> Tensor:
    """``Delta_+-`` (PACT sec. 5.3): mean ``V`` over the action tokens of ``R = 1`` rows minus
    that of ``R = 0`` rows; NaN when either kind is missing."""
    with torch.no_grad():
        counts = am.row_counts(torch.float64)
        sums = torch.linalg.vecdot(old_values, am.weights(old_values.dtype), dim=1)
        sums = sums.to(torch.float64)
        ones, zeros = rewards == 1, rewards == 0
        mean_one = (sums * ones).sum() / (counts * ones).sum()
        return mean_one - (sums * zeros).sum() / (counts * zeros).sum()


def _calibration_metrics(rewards: Tensor, old_values: Tensor, am: ActionMask) -> dict[str, Tensor]:
    """Critic calibration on the action tokens (PACT sec. 5.3): BCE and MSE of ``V_old``
    against ``R`` in ``[0, 1]``, and :func:`_value_gap`.

    ``R`` is constant along a row, so both losses follow from per-row sums of ``V``, ``V^2``,
    ``log V`` and ``log(1 - V)`` (``V`` clamped into ``(0, 1)`` for the logs).
    """
    with torch.no_grad():
        weights = am.weights(old_values.dtype)
        counts = am.row_counts(torch.float64)

        def row_sums(x: Tensor) -> Tensor:
            return torch.linalg.vecdot(x, weights, dim=1).to(torch.float64)

        v = old_values.clamp(1e-7, 1 - 1e-7)
        r = rewards.to(torch.float64)
        first, second = row_sums(old_values), row_sums(old_values.square())
        log_v = row_sums(v.log())
        log_not_v = row_sums(v.neg_().add_(1.0).log_())  # v is ours (the clamp's copy)
        count = counts.sum()
        squares = second - 2 * r * first + r * r * counts  # sum_t (V - R)^2 per row
        return {
            "critic/bce": -(r * log_v + (1 - r) * log_not_v).sum() / count,
            "critic/mse": squares.sum().clamp(min=0.0) / count,
            "critic/value_gap": _value_gap(rewards, old_values, am),
        }


def _pact_actor(
    batch: ObjectiveBatch, config: ObjectiveConfig, all_reduce: AllReduce | None
) -> ObjectiveResult:
    rewards, old_values = _pact_srppo_inputs(batch, config, "pact")
    mask = batch.mask
    adv = pact_advantages(rewards, old_values, mask, config.gamma, check=False)  # sec. 3.3
    if config.pact_whiten:
        adv = whiten(adv, mask, config.whiten_eps, all_reduce=all_reduce, check=False)
    old = batch.old_logp if batch.old_logp is not None else batch.behavior_logp
    tis = tis_weights(old, batch.behavior_logp, mask, config.tis_low, config.tis_high, check=False)
    # sec. 5.1: l_t = w_t f(rho_t) A_t with w_t >= 0 a constant = the loss on advantages w_t A_t
    weighted = adv * tis
    aggregation = config.aggregation or "seq-mean-token-mean"
    if config.pact_policy_loss == "dis":  # math: DIS on rho = exp(logp - old)
        loss, policy_metrics = dis_policy_loss(
            batch.logp, old, weighted, mask, config.dis_low, config.dis_high, aggregation,
            check=False,
        )  # fmt: skip
    else:  # coding: PPO clip on rho = exp(logp - old)
        loss, policy_metrics = ppo_clip_policy_loss(
            batch.logp, old, weighted, mask, config.ppo_eps_low, config.ppo_eps_high,
            aggregation, check=False,
        )  # fmt: skip
    weights = mask.weights(tis.dtype)
    count = mask.total(torch.float64)
    with torch.no_grad():
        capped = tis >= config.tis_high
        if config.tis_low > 0:  # (tis_low = 0 is never reached: exp of a clamped log-ratio)
            capped |= (tis <= config.tis_low) & mask.mask
    metrics = _batch_metrics(batch)
    metrics.update(_prefixed("actor", policy_metrics))
    metrics.update(_advantage_metrics(adv, mask))
    metrics["actor/loss"] = loss.detach()
    metrics["actor/estimator_is_grpo"] = 0.0
    metrics["actor/tis_mean"] = _masked_mean(tis, weights, count)
    metrics["actor/tis_capped_frac"] = torch.count_nonzero(capped).to(torch.float64) / count
    # Thm. 1 / App. E.2: mean |C| of the TD-residual credit
    metrics["critic/mean_abs_credit"] = mean_abs_credit(rewards, old_values, mask, config.gamma)
    if config.gamma == 1.0 and not config.pact_whiten:
        # G = R and A = G - V_old: the residual's variance is the advantages' (computed above)
        residual_var = metrics["actor/adv_std"] ** 2  # type: ignore[operator]
        metrics["critic/explained_variance"] = _outcome_explained_variance(
            rewards, mask, residual_var
        )
    else:
        returns = discounted_returns(rewards, mask, config.gamma, check=False)  # lambda = 1
        metrics["critic/explained_variance"] = _critic_explained_variance(returns, old_values, mask)
    return ObjectiveResult(loss, None, _to_floats(metrics), "gae")


def _pact_critic(batch: ObjectiveBatch, config: ObjectiveConfig) -> ObjectiveResult:
    rewards, old_values = _pact_srppo_inputs(batch, config, "pact")
    logits = _require_logits(batch, "the pact critic stage")
    mask = batch.mask
    old = batch.old_logp if batch.old_logp is not None else batch.behavior_logp
    mode = config.pact_critic_is
    # batch.logp holds the updated actor's log-probs (new_t): read detached
    is_weights = pact_is_weights(batch.logp, old, mask, mode, check=False)  # sec. 4.3 step 4
    targets, keep = targets_from_weights(
        rewards, is_weights, mask, mode, config.pact_is_low, config.pact_is_high
    )
    critic_loss = bce_value_loss(logits, targets, keep, 1.0, 0.0, check=False)  # step 5
    count = mask.total(torch.float64)
    kept = torch.count_nonzero(keep).to(torch.float64)
    metrics = _batch_metrics(batch)
    metrics["critic/loss"] = critic_loss.detach()
    metrics["critic/is_reject_frac"] = 1.0 - kept / count
    metrics["critic/is_weight_mean"] = _masked_mean(
        is_weights, keep.view(torch.uint8).to(is_weights.dtype), kept
    )
    returns = discounted_returns(rewards, mask, config.gamma, check=False)  # lambda = 1: G
    metrics["critic/explained_variance"] = _critic_explained_variance(returns, old_values, mask)
    metrics.update(_calibration_metrics(rewards, old_values, mask))
    return ObjectiveResult(None, critic_loss, _to_floats(metrics), "gae")


def pact_objective(
    batch: ObjectiveBatch,
    stage: Stage,
    config: ObjectiveConfig = DEFAULT_CONFIG,
    *,
    all_reduce: AllReduce | None = None,
) -> ObjectiveResult:
    """PACT (PACT_SRPPO_SPEC "PACT"): one stage of the Actor-then-Critic iteration.

    ``stage="actor"`` (every actor minibatch step): ``A = R - V_old`` (GAE, lambda = 1, from
    ``batch.old_values``; no whitening unless ``pact_whiten``), TIS ``w = clip(exp(old - mu),
    tis_low, tis_high)``, and DIS (``pact_policy_loss="dis"``) or PPO clip (``"ppo"``) on
    ``rho = exp(logp - old)`` with advantages ``w A``; ``critic_loss`` is None.
    ``old`` is ``batch.old_logp``, else ``batch.behavior_logp``.

    ``stage="critic"`` (after all actor steps and one forward of the updated actor):
    ``batch.logp`` holds the updated actor's log-probs ``new`` (read detached),
    ``batch.value_logits`` the critic's logits; targets ``W R`` with ``W`` by
    ``pact_critic_is`` on ``c = exp(new - old)``, tokens with ``W`` outside
    ``[pact_is_low, pact_is_high]`` dropped, BCE on the logits; ``actor_loss`` is None.
    """
    if stage == "actor":
        return _pact_actor(batch, config, all_reduce)
    if stage == "critic":
        return _pact_critic(batch, config)
    raise ValueError(f"stage must be one of {STAGES}, got {stage!r}")


def srppo_objective(
    batch: ObjectiveBatch, config: ObjectiveConfig = DEFAULT_CONFIG
) -> ObjectiveResult:
    """SR-PPO (PACT_SRPPO_SPEC "SR-PPO"): Pass@k-weighted Monte Carlo advantages, PPO clip.

    Actor: ``A = w^ (R - V_old)``, ``w^ = k (1 - clamp(V_old(s_{u_1}), 0, 1))^(k - 1)`` with
    ``k = srppo_k``; PPO clip on ``rho = exp(logp - behavior_logp)``. Critic (same batch,
    standard order): ``bce_value_loss`` with ``srppo_bce_coef`` / ``srppo_mse_coef`` on the
    Pass@1 target ``y = R`` at every action token; needs ``batch.value_logits``.
    """
    rewards, old_values = _pact_srppo_inputs(batch, config, "srppo")
    logits = _require_logits(batch, "srppo")
    values = batch.values  # sigmoid(value_logits), with its graph
    mask = batch.mask
    k = config.srppo_k
    adv = srppo_advantages(rewards, old_values, mask, k, config.gamma, check=False)  # sec. 4.2
    actor_loss, policy_metrics = ppo_clip_policy_loss(
        batch.logp, batch.behavior_logp, adv, mask, config.ppo_eps_low, config.ppo_eps_high,
        config.aggregation or "seq-mean-token-mean", check=False,
    )  # fmt: skip
    returns = rewards[:, None] * mask.weights(rewards.dtype)  # sec. 4.3: Pass@1 target y = R
    # sec. 4.3: a BCE + b MSE (= bce_value_loss; the two terms are also the critic's metrics)
    bce, mse, count = value_loss_terms(logits, returns, mask, values)
    critic_loss = (config.srppo_bce_coef * bce + config.srppo_mse_coef * mse) / count
    q_hat = first_action_values(old_values, mask, check=False).clamp(0.0, 1.0)
    passk = srppo_passk_weights(q_hat, k, check=False)
    metrics = _batch_metrics(batch)
    metrics.update(_prefixed("actor", policy_metrics))
    metrics.update(_advantage_metrics(adv, mask))
    metrics["actor/loss"] = actor_loss.detach()
    metrics["actor/estimator_is_grpo"] = 0.0
    metrics["actor/passk_weight_mean"] = passk.mean()
    metrics["actor/passk_weight_min"] = passk.min()
    metrics["actor/passk_weight_max"] = passk.max()
    total = passk.sum()
    hard, easy = q_hat < PASSK_HARD_BELOW, q_hat >= PASSK_EASY_FROM
    for name, rows in (("hard", hard), ("medium", ~hard & ~easy), ("easy", easy)):
        metrics[f"actor/passk_share_{name}"] = (passk * rows).sum() / total  # NaN if total 0
    metrics["critic/loss"] = critic_loss.detach()
    metrics["critic/explained_variance"] = _critic_explained_variance(returns, old_values, mask)
    metrics["critic/bce"] = bce.detach() / count
    metrics["critic/mse"] = mse.detach() / count
    metrics["critic/value_gap"] = _value_gap(rewards, old_values, mask)
    return ObjectiveResult(actor_loss, critic_loss, _to_floats(metrics), "gae")


def compute_objective(
    algorithm: AlgorithmName,
    batch: ObjectiveBatch,
    *,
    phase: Phase = "bootstrap",
    stage: Stage = "actor",
    config: ObjectiveConfig = DEFAULT_CONFIG,
    all_reduce: AllReduce | None = None,
) -> ObjectiveResult:
    """Dispatch on the algorithm name; ``phase`` matters only for ``li2sao``, ``stage`` only
    for ``pact`` (every other algorithm has one stage: ``"actor"``).

    ``all_reduce`` sums a small tensor across data-parallel ranks; it is used to whiten GAE
    advantages with global statistics (identity when None).
    """
    if not isinstance(batch, ObjectiveBatch):
        raise ValueError(f"batch must be an ObjectiveBatch, got {type(batch).__name__}")
    if stage not in STAGES:
        raise ValueError(f"stage must be one of {STAGES}, got {stage!r}")
    if algorithm == "pact":
        return pact_objective(batch, stage, config, all_reduce=all_reduce)
    if stage != "actor" and algorithm in ALGORITHMS:
        raise ValueError(f"stage={stage!r} exists only for pact, not {algorithm!r}")
    if algorithm == "srppo":
        return srppo_objective(batch, config)
    if algorithm in ("grpo", "dapo", "gspo"):
        return _group_policy_objective(batch, config, algorithm)
    if algorithm == "lisao":
        return lisao_objective(batch, config, all_reduce=all_reduce)
    if algorithm == "li2sao":
        return li2sao_objective(batch, phase, config, all_reduce=all_reduce)
    raise ValueError(f"unknown algorithm {algorithm!r}; expected one of {ALGORITHMS}")
