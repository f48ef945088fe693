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

Each algorithm is registered by name in :data:`ALGORITHM_REGISTRY`, with the step plan the
trainer runs for it (:mod:`trainer.algorithms.step_plans`); the critic-free baselines
are compositions of a registered estimator and policy loss (:mod:`trainer.algorithms.components`,
:func:`register_composed`), so a new baseline is a module that registers itself (modules in
:mod:`trainer.algorithms.baselines` are imported with the package). Rows are segments: group
statistics, the ``1/sum(m)`` weight and the readiness statistics count trajectories
(``ObjectiveBatch.trajectory_index``).

PACT and SR-PPO follow PACT_SRPPO_SPEC (rewards normalised to ``[0, 1]`` first). The batch is
validated once when it is built; the objective then calls the primitives with
``check=False``. Advantages and returns are computed from ``old_values`` (the critic frozen once
per batch), so they are identical across the ``K`` critic passes of one batch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor

from trainer.algorithms.advantages import AllReduce
from trainer.algorithms.components import (
    ESTIMATORS,
    POLICY_LOSSES,
    Estimate,
    normalized_rewards,
    require_critic,
)
from trainer.algorithms.critic import (
    bce_value_loss,
    clipped_value_loss,
    group_residual_targets,
    terminal_ranking_loss,
    value_loss_terms,
)
from trainer.algorithms.divergence import divergence_mask
from trainer.algorithms.gae import discounted_returns
from trainer.algorithms.groups import group_all_equal
from trainer.algorithms.masks import ActionMask
from trainer.algorithms.objective_types import (
    ALGORITHMS,
    DEFAULT_CONFIG,
    PACT_POLICY_LOSSES,
    PHASES,
    STAGES,
    AlgorithmName,
    Estimator,
    ObjectiveBatch,
    ObjectiveConfig,
    ObjectiveResult,
    PactPolicyLoss,
    Phase,
    Stage,
)
from trainer.algorithms.pact import (
    mean_abs_credit,
    pact_is_weights,
    targets_from_weights,
    tis_weights,
)
from trainer.algorithms.policy_losses import Aggregation
from trainer.algorithms.positions import first_action_values, terminal_values
from trainer.algorithms.readiness import ReadinessStats, readiness_statistics
from trainer.algorithms.registry import Registry
from trainer.algorithms.srppo import srppo_passk_weights
from trainer.algorithms.staleness import off_policy_token_ratio, policy_lag
from trainer.algorithms.step_plans import (
    ACTOR_CRITIC,
    ACTOR_ONLY,
    PACT_PLAN,
    SRPPO_PLAN,
    StepPlan,
)

__all__ = [
    "ALGORITHMS",
    "ALGORITHM_REGISTRY",
    "DEFAULT_CONFIG",
    "PACT_POLICY_LOSSES",
    "PHASES",
    "STAGES",
    "AlgorithmEntry",
    "AlgorithmName",
    "Composition",
    "Estimator",
    "ObjectiveBatch",
    "ObjectiveConfig",
    "ObjectiveRequest",
    "ObjectiveResult",
    "PactPolicyLoss",
    "Phase",
    "Stage",
    "composed_objective",
    "compute_objective",
    "dapo_objective",
    "grpo_objective",
    "gspo_objective",
    "li2sao_objective",
    "lisao_objective",
    "pact_objective",
    "register_composed",
    "srppo_objective",
]

PASSK_HARD_BELOW = 3 / 8
"""SR-PPO difficulty bins on ``q^`` (sec. 5.5 bins 8 rollouts: hard <= 2, easy >= 6 correct)."""
PASSK_EASY_FROM = 6 / 8


@dataclass(frozen=True)
class ObjectiveRequest:
    """What ``compute_objective`` passes to a registered algorithm besides the batch."""

    phase: Phase = "bootstrap"
    stage: Stage = "actor"
    config: ObjectiveConfig = DEFAULT_CONFIG
    all_reduce: AllReduce | None = None


@dataclass(frozen=True)
class AlgorithmEntry:
    """A registered algorithm: its objective, the stages it has (``"actor"``, and
    ``"critic"`` for an algorithm with a separate critic stage such as PACT) and the step plan
    the trainer runs for it (:mod:`trainer.algorithms.step_plans`)."""

    objective: Callable[[ObjectiveBatch, ObjectiveRequest], ObjectiveResult]
    stages: tuple[str, ...] = ("actor",)
    plan: StepPlan = ACTOR_ONLY

    def __post_init__(self) -> None:
        for phase in self.plan.phases:
            if phase.stage not in self.stages:
                raise ValueError(f"the step plan uses stage {phase.stage!r}, not in {self.stages}")


ALGORITHM_REGISTRY: Registry[AlgorithmEntry] = Registry("algorithm")


def _to_floats(metrics: dict[str, Tensor | float]) -> dict[str, float]:
    """Convert tensor metrics to floats with a single host synchronisation."""
    names = [k for k, v in metrics.items() if isinstance(v, Tensor)]
    out = {k: float(v) for k, v in metrics.items() if not isinstance(v, Tensor)}
    if names:
        stacked = torch.stack([metrics[k].detach().to(torch.float64).reshape(()) for k in names])
        out.update(zip(names, stacked.tolist(), strict=True))
    return out


def _batch_metrics(batch: ObjectiveBatch) -> dict[str, Tensor | float]:
    trajectories = batch.trajectories
    rewards = trajectories.rewards.detach()
    constant = group_all_equal(rewards, batch.groups)
    metrics: dict[str, Tensor | float] = {
        "batch/trajectories": float(trajectories.count),
        "batch/rows": float(batch.rewards.shape[0]),
        "batch/groups": float(batch.groups.num_groups),
        "batch/largest_group": batch.groups.counts.max(),
        "batch/mixed_group_frac": (~constant).to(torch.float64).mean(),
        "batch/reward_mean": rewards.mean(),
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
            flat = adv.reshape(-1)
            first, second = flat.sum(), torch.dot(flat, flat)  # (one pass each)
        mean = first / total
        var = (second / total - mean * mean).clamp(min=0)
    return {"actor/adv_mean": mean, "actor/adv_std": var.sqrt()}


def _prefixed(prefix: str, metrics: dict[str, Tensor]) -> dict[str, Tensor | float]:
    return {f"{prefix}/{k}": v for k, v in metrics.items()}


def _actor_metrics(
    batch: ObjectiveBatch,
    estimate: Estimate,
    loss: Tensor,
    policy_metrics: dict[str, Tensor],
) -> dict[str, Tensor | float]:
    """The batch, policy-loss and advantage metrics every actor objective reports."""
    metrics = _batch_metrics(batch)
    metrics.update(_prefixed("actor", policy_metrics))
    metrics.update(_advantage_metrics(estimate.advantages, batch.mask))
    metrics["actor/loss"] = loss.detach()
    metrics["actor/estimator_is_grpo"] = 1.0 if estimate.estimator == "grpo" else 0.0
    return metrics


def _policy_loss(
    name: str,
    batch: ObjectiveBatch,
    advantages: Tensor,
    config: ObjectiveConfig,
    default_aggregation: Aggregation = "seq-mean-token-mean",
    reference_logp: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """The registered policy loss ``name`` with the ratio against ``reference_logp``
    (default: the behaviour log-probabilities) and the configured aggregation."""
    reference = batch.behavior_logp if reference_logp is None else reference_logp
    aggregation = config.aggregation or default_aggregation
    return POLICY_LOSSES.get(name)(batch, reference, advantages, config, aggregation)


@dataclass(frozen=True)
class Composition:
    """A critic-free algorithm: a registered estimator and policy loss, and the aggregation
    used when ``ObjectiveConfig.aggregation`` is None."""

    estimator: str
    policy_loss: str
    aggregation: Aggregation = "seq-mean-token-mean"


def composed_objective(
    batch: ObjectiveBatch,
    composition: Composition,
    config: ObjectiveConfig = DEFAULT_CONFIG,
    all_reduce: AllReduce | None = None,
) -> ObjectiveResult:
    """Advantages from the registered estimator, loss from the registered policy loss, no
    critic (GRPO, DAPO, GSPO and any baseline registered with :func:`register_composed`)."""
    estimate = ESTIMATORS.get(composition.estimator)(batch, config, all_reduce)
    loss, policy_metrics = _policy_loss(
        composition.policy_loss, batch, estimate.advantages, config, composition.aggregation
    )
    metrics = _actor_metrics(batch, estimate, loss, policy_metrics)
    return ObjectiveResult(loss, None, _to_floats(metrics), estimate.estimator)


def register_composed(
    name: str,
    estimator: str,
    policy_loss: str,
    aggregation: Aggregation = "seq-mean-token-mean",
    *,
    replace: bool = False,
) -> Composition:
    """Register the critic-free algorithm ``name`` = ``estimator`` + ``policy_loss``.

    The estimator and loss are looked up when the objective runs, so they may be registered
    after the algorithm; an unknown name is then an error listing the known ones.
    """
    composition = Composition(estimator, policy_loss, aggregation)

    def objective(batch: ObjectiveBatch, request: ObjectiveRequest) -> ObjectiveResult:
        return composed_objective(batch, composition, request.config, request.all_reduce)

    ALGORITHM_REGISTRY.register(name, replace=replace)(AlgorithmEntry(objective))
    return composition


GRPO = register_composed("grpo", "grpo", "ppo_clip")  # Eq. 2 + Eq. 1
DAPO = register_composed("dapo", "grpo", "ppo_clip", "token-mean")  # clip-higher, token-mean
GSPO = register_composed("gspo", "grpo", "gspo")  # sequence-level ratio and clipping


def grpo_objective(
    batch: ObjectiveBatch, config: ObjectiveConfig = DEFAULT_CONFIG
) -> ObjectiveResult:
    """GRPO baseline: group advantage (Eq. 2) + PPO clip (Eq. 1), no critic."""
    return composed_objective(batch, GRPO, config)


def dapo_objective(
    batch: ObjectiveBatch, config: ObjectiveConfig = DEFAULT_CONFIG
) -> ObjectiveResult:
    """DAPO baseline: GRPO with clip-higher and token-mean loss; filter the batch first with
    :func:`trainer.algorithms.sampling.dynamic_sampling_filter`."""
    return composed_objective(batch, DAPO, config)


def gspo_objective(
    batch: ObjectiveBatch, config: ObjectiveConfig = DEFAULT_CONFIG
) -> ObjectiveResult:
    """GSPO baseline: group advantage + sequence-level ratio and clipping."""
    return composed_objective(batch, GSPO, config)


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


def _outcome_explained_variance(rewards: Tensor, counts: Tensor, residual_var: Tensor) -> Tensor:
    """``1 - Var(G - V) / Var(G)`` over action tokens for ``G = R`` on every action token:
    ``Var(G)`` from the ``[N]`` rewards weighted by the rows' action counts (float64)."""
    with torch.no_grad():
        r = rewards.to(torch.float64)
        count = counts.sum()
        mean = (r * counts).sum() / count
        var_g = (r * r * counts).sum() / count - mean * mean
        return torch.where(var_g > 0, 1 - residual_var / var_g.clamp(min=1e-300), torch.nan)


def lisao_objective(
    batch: ObjectiveBatch,
    config: ObjectiveConfig = DEFAULT_CONFIG,
    *,
    all_reduce: AllReduce | None = None,
) -> ObjectiveResult:
    """LiSAO baseline: whitened skip-observation GAE + DIS; critic on absolute returns (Eq. 5).

    The 10 critic-only warm-up steps are the trainer's business (it skips the actor step).
    """
    values, old_values = require_critic(batch, "lisao")
    estimate = ESTIMATORS.get("gae")(batch, config, all_reduce)
    assert estimate.returns is not None
    actor_loss, policy_metrics = _policy_loss("dis", batch, estimate.advantages, config)
    critic_loss = clipped_value_loss(
        values, old_values, estimate.returns, batch.mask, config.value_clip, check=False
    )  # Eq. 5
    metrics = _actor_metrics(batch, estimate, actor_loss, policy_metrics)
    metrics["critic/loss"] = critic_loss.detach()
    metrics["critic/explained_variance"] = _critic_explained_variance(
        estimate.returns, old_values, batch.mask
    )
    return ObjectiveResult(actor_loss, critic_loss, _to_floats(metrics), "gae")


def _bootstrap_critic(
    batch: ObjectiveBatch,
    returns: Tensor,
    config: ObjectiveConfig,
    metrics: dict[str, Tensor | float],
) -> tuple[Tensor, ReadinessStats]:
    """Li2SAO's bootstrap critic (section 4.1): ``L_res + alpha_rank * L_rank`` on centred,
    divergence-masked targets, and the readiness statistics; adds its metrics to ``metrics``.

    ``mu_g``, the ranking pairs and the readiness statistics are over trajectories: a
    trajectory's terminal value ``V(s_{i,T_i})`` is the one on its last row (last segment).
    """
    values, old_values = require_critic(batch, "li2sao")
    mask, trajectories = batch.mask, batch.trajectories
    # targets are read only under the critic mask (action tokens), so no masking pass here
    targets, keep = group_residual_targets(
        returns, batch.rewards, batch.group_ids, check=False,
        trajectory_index=trajectories.row_index,
    )  # fmt: skip
    critic_mask = divergence_mask(batch.tokens, mask, batch.rewards, batch.group_ids, check=False)
    dropped = (~keep).nonzero().squeeze(1)  # members of groups with equal rewards
    critic_mask.index_fill_(0, dropped, False)  # touches those rows only
    residual = clipped_value_loss(
        values, old_values, targets, critic_mask, config.value_clip, check=False
    )  # Eq. 10
    final_values = trajectories.last(terminal_values(values, mask, check=False))
    rewards, group_ids = trajectories.rewards, trajectories.group_ids
    ranking = terminal_ranking_loss(
        final_values, rewards, group_ids, config.rank_margin, check=False
    )  # Eq. 11
    critic_loss = residual + config.alpha_rank * ranking  # section 4.1: L_res + a L_rank
    readiness = readiness_statistics(final_values.detach(), rewards, group_ids, check=False)
    metrics["critic/residual_loss"] = residual.detach()
    metrics["critic/rank_loss"] = ranking.detach()
    metrics["critic/mask_frac"] = torch.count_nonzero(critic_mask).to(torch.float64) / mask.total(
        torch.float64
    )
    metrics["critic/kept_frac"] = keep.to(torch.float64).mean()
    if readiness.explained_variance is not None:
        metrics["readiness/explained_variance"] = readiness.explained_variance
    if readiness.ranking_accuracy is not None:
        metrics["readiness/ranking_accuracy"] = readiness.ranking_accuracy
    return critic_loss, readiness


def li2sao_objective(
    batch: ObjectiveBatch,
    phase: Phase,
    config: ObjectiveConfig = DEFAULT_CONFIG,
    *,
    all_reduce: AllReduce | None = None,
) -> ObjectiveResult:
    """Li2SAO: estimator from the batch, critic objective from the phase.

    Actor (appendix F.3): GRPO advantage (Eq. 2, no whitening) when the largest group of the
    batch has more than one trajectory, else whitened adaptive-trace GAE; DIS in both cases.

    Critic: ``phase="bootstrap"``: ``L_res + alpha_rank * L_rank`` (section 4.1) with targets
    ``G - mu_g`` (lambda = 1 returns), mask = action tokens at/after the divergence point of
    members of mixed groups, and the terminal ranking loss; the result also carries the
    readiness statistics of the batch. ``phase="switched"``: the clipped loss on absolute
    returns over all action tokens (Eq. 5), no centring, no ranking.
    """
    if phase not in PHASES:
        raise ValueError(f"phase must be one of {PHASES}, got {phase!r}")
    values, old_values = require_critic(batch, "li2sao")
    mask = batch.mask
    estimate = ESTIMATORS.get("li2sao")(batch, config, all_reduce)
    returns = estimate.returns
    if returns is None:  # GRPO: lambda = 1 returns for the critic
        rewards = batch.rewards.to(old_values.dtype)
        returns = discounted_returns(rewards, mask, config.gamma, check=False)
    actor_loss, policy_metrics = _policy_loss("dis", batch, estimate.advantages, config)
    metrics = _actor_metrics(batch, estimate, actor_loss, policy_metrics)
    readiness: ReadinessStats | None = None
    if phase == "bootstrap":
        critic_loss, readiness = _bootstrap_critic(batch, returns, config, metrics)
    else:
        critic_loss = clipped_value_loss(
            values, old_values, returns, mask, config.value_clip, check=False
        )  # Eq. 5 with the clipped form of Eq. 10
        metrics["critic/explained_variance"] = _critic_explained_variance(returns, old_values, mask)
    metrics["critic/loss"] = critic_loss.detach()
    return ObjectiveResult(
        actor_loss, critic_loss, _to_floats(metrics), estimate.estimator, readiness
    )


def _require_logits(batch: ObjectiveBatch, what: str) -> Tensor:
    if batch.value_logits is None:
        raise ValueError(f"{what} needs batch.value_logits (the sigmoid head's [N, T] logits)")
    return batch.value_logits


def _masked_mean(x: Tensor, weights: Tensor, count: Tensor) -> Tensor:
    """Mean of ``x`` over the entries with weight 1 (``count`` of them), float64."""
    with torch.no_grad():
        return torch.dot(x.reshape(-1), weights.reshape(-1)).to(torch.float64) / count


class _RowMoments(NamedTuple):
    """Per-row sums over the action tokens, float64: their count, ``sum V`` and ``sum V^2``."""

    counts: Tensor
    first: Tensor
    second: Tensor

    @classmethod
    def of(cls, values: Tensor, am: ActionMask) -> _RowMoments:
        with torch.no_grad():
            masked = values * am.weights(values.dtype)
            first = masked.sum(dim=1).to(torch.float64)
            second = masked.mul_(values).sum(dim=1).to(torch.float64)
            return cls(am.row_counts(torch.float64), first, second)


def _outcome_critic_explained_variance(rewards: Tensor, moments: _RowMoments) -> Tensor:
    """:func:`_critic_explained_variance` for ``G = R`` on every action token (an outcome
    reward, ``gamma = 1``) from the rows' moments: ``sum_t (R_i - V_t)^2 = n_i R_i^2 -
    2 R_i sum V + sum V^2`` per row, no further ``[N, T]`` pass."""
    with torch.no_grad():
        r = rewards.to(torch.float64)
        counts, first, second = moments
        count = counts.sum()
        mean = (r * counts - first).sum() / count
        residual_var = (r * r * counts - 2 * r * first + second).sum() / count - mean * mean
        return _outcome_explained_variance(rewards, counts, residual_var)


def _value_gap(rewards: Tensor, moments: _RowMoments) -> Tensor:
    """``Delta_+-`` (PACT sec. 5.3): mean ``V`` over the action tokens of ``R = 1`` rows minus
    that of ``R = 0`` rows, from the rows' moments of ``V_old``; NaN when either kind is
    missing."""
    with torch.no_grad():
        counts, sums = moments.counts, moments.first
        ones, zeros = rewards == 1, rewards == 0
        mean_one = (sums * ones).sum() / (counts * ones).sum()
        return mean_one - (sums * zeros).sum() / (counts * zeros).sum()


def _calibration_metrics(
    rewards: Tensor, old_values: Tensor, am: ActionMask, moments: _RowMoments
) -> dict[str, Tensor]:
    """Critic calibration on the action tokens (PACT sec. 5.3): BCE and MSE of ``V_old``
    against ``R`` in ``[0, 1]``, and :func:`_value_gap`.

    ``R`` is constant along a row, so both losses follow from per-row sums of ``V``, ``V^2``,
    ``log V`` and ``log(1 - V)`` (``V`` clamped into ``(0, 1)`` for the logs).
    """
    with torch.no_grad():
        weights = am.weights(old_values.dtype)

        def row_sums(x: Tensor) -> Tensor:
            return torch.linalg.vecdot(x, weights, dim=1).to(torch.float64)

        v = old_values.clamp(1e-7, 1 - 1e-7)
        r = rewards.to(torch.float64)
        counts, first, second = moments
        log_v = row_sums(v.log())
        log_not_v = row_sums(v.neg_().add_(1.0).log_())  # v is ours (the clamp's copy)
        count = counts.sum()
        squares = second - 2 * r * first + r * r * counts  # sum_t (V - R)^2 per row
        return {
            "critic/bce": -(r * log_v + (1 - r) * log_not_v).sum() / count,
            "critic/mse": squares.sum().clamp(min=0.0) / count,
            "critic/value_gap": _value_gap(rewards, moments),
        }


def _pact_actor(
    batch: ObjectiveBatch, config: ObjectiveConfig, all_reduce: AllReduce | None
) -> ObjectiveResult:
    _, old_values = require_critic(batch, "pact")
    rewards = normalized_rewards(batch, config, old_values)
    mask = batch.mask
    estimate = ESTIMATORS.get("pact")(batch, config, all_reduce)  # sec. 3.3
    old = batch.old_logp if batch.old_logp is not None else batch.behavior_logp
    tis = tis_weights(old, batch.behavior_logp, mask, config.tis_low, config.tis_high, check=False)
    # sec. 5.1: l_t = w_t f(rho_t) A_t with w_t >= 0 a constant = the loss on advantages w_t A_t;
    # math: DIS, coding: PPO clip, both on rho = exp(logp - old)
    name = "dis" if config.pact_policy_loss == "dis" else "ppo_clip"
    loss, policy_metrics = _policy_loss(
        name, batch, estimate.advantages * tis, config, reference_logp=old
    )
    weights = mask.weights(tis.dtype)
    count = mask.total(torch.float64)
    with torch.no_grad():
        capped = tis >= config.tis_high
        if config.tis_low > 0:  # (tis_low = 0 is never reached: exp of a clamped log-ratio)
            capped |= (tis <= config.tis_low) & mask.mask
    metrics = _actor_metrics(batch, estimate, loss, policy_metrics)
    metrics["actor/tis_mean"] = _masked_mean(tis, weights, count)
    metrics["actor/tis_capped_frac"] = torch.count_nonzero(capped).to(torch.float64) / count
    # Thm. 1 / App. E.2: mean |C| of the TD-residual credit
    metrics["critic/mean_abs_credit"] = mean_abs_credit(rewards, old_values, mask, config.gamma)
    if config.gamma == 1.0 and not config.pact_whiten:
        # G = R and A = G - V_old: the residual's variance is the advantages' (computed above)
        residual_var = metrics["actor/adv_std"] ** 2  # type: ignore[operator]
        metrics["critic/explained_variance"] = _outcome_explained_variance(
            rewards, mask.row_counts(torch.float64), residual_var
        )
    else:
        returns = discounted_returns(rewards, mask, config.gamma, check=False)  # lambda = 1
        metrics["critic/explained_variance"] = _critic_explained_variance(returns, old_values, mask)
    return ObjectiveResult(loss, None, _to_floats(metrics), "gae")


def _pact_critic(batch: ObjectiveBatch, config: ObjectiveConfig) -> ObjectiveResult:
    _, old_values = require_critic(batch, "pact")
    rewards = normalized_rewards(batch, config, old_values)
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
    moments = _RowMoments.of(old_values, mask)
    if config.gamma == 1.0:  # lambda = 1: G = R on every action token
        metrics["critic/explained_variance"] = _outcome_critic_explained_variance(rewards, moments)
    else:
        returns = discounted_returns(rewards, mask, config.gamma, check=False)  # lambda = 1: G
        ev = _critic_explained_variance(returns, old_values, mask)
        metrics["critic/explained_variance"] = ev
    metrics.update(_calibration_metrics(rewards, old_values, mask, moments))
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
    _, old_values = require_critic(batch, "srppo")
    rewards = normalized_rewards(batch, config, old_values)
    logits = _require_logits(batch, "srppo")
    values = batch.values  # sigmoid(value_logits), with its graph
    mask = batch.mask
    estimate = ESTIMATORS.get("srppo")(batch, config, None)  # sec. 4.2
    actor_loss, policy_metrics = _policy_loss("ppo_clip", batch, estimate.advantages, config)
    # sec. 4.3: a BCE + b MSE (= bce_value_loss; the two terms are also the critic's metrics)
    # on the Pass@1 target y = R, one per row
    bce, mse, count = value_loss_terms(logits, rewards.to(logits.dtype), mask, values)
    critic_loss = (config.srppo_bce_coef * bce + config.srppo_mse_coef * mse) / count
    q_hat = first_action_values(old_values, mask, check=False).clamp(0.0, 1.0)
    passk = srppo_passk_weights(q_hat, config.srppo_k, check=False)
    metrics = _actor_metrics(batch, estimate, actor_loss, policy_metrics)
    metrics["actor/passk_weight_mean"] = passk.mean()
    metrics["actor/passk_weight_min"] = passk.min()
    metrics["actor/passk_weight_max"] = passk.max()
    total = passk.sum()
    hard, easy = q_hat < PASSK_HARD_BELOW, q_hat >= PASSK_EASY_FROM
    for name, rows in (("hard", hard), ("medium", ~hard & ~easy), ("easy", easy)):
        metrics[f"actor/passk_share_{name}"] = (passk * rows).sum() / total  # NaN if total 0
    metrics["critic/loss"] = critic_loss.detach()
    moments = _RowMoments.of(old_values, mask)  # the targets y = R: explained variance of R
    metrics["critic/explained_variance"] = _outcome_critic_explained_variance(rewards, moments)
    metrics["critic/bce"] = bce.detach() / count
    metrics["critic/mse"] = mse.detach() / count
    metrics["critic/value_gap"] = _value_gap(rewards, moments)
    return ObjectiveResult(actor_loss, critic_loss, _to_floats(metrics), "gae")


def _li2sao(batch: ObjectiveBatch, request: ObjectiveRequest) -> ObjectiveResult:
    return li2sao_objective(batch, request.phase, request.config, all_reduce=request.all_reduce)


def _lisao(batch: ObjectiveBatch, request: ObjectiveRequest) -> ObjectiveResult:
    return lisao_objective(batch, request.config, all_reduce=request.all_reduce)


def _pact(batch: ObjectiveBatch, request: ObjectiveRequest) -> ObjectiveResult:
    return pact_objective(batch, request.stage, request.config, all_reduce=request.all_reduce)


def _srppo(batch: ObjectiveBatch, request: ObjectiveRequest) -> ObjectiveResult:
    return srppo_objective(batch, request.config)


ALGORITHM_REGISTRY.register("lisao")(AlgorithmEntry(_lisao, plan=ACTOR_CRITIC))
ALGORITHM_REGISTRY.register("li2sao")(AlgorithmEntry(_li2sao, plan=ACTOR_CRITIC))
ALGORITHM_REGISTRY.register("pact")(AlgorithmEntry(_pact, STAGES, PACT_PLAN))
ALGORITHM_REGISTRY.register("srppo")(AlgorithmEntry(_srppo, plan=SRPPO_PLAN))


def compute_objective(
    algorithm: AlgorithmName | str,
    batch: ObjectiveBatch,
    *,
    phase: Phase = "bootstrap",
    stage: Stage = "actor",
    config: ObjectiveConfig = DEFAULT_CONFIG,
    all_reduce: AllReduce | None = None,
) -> ObjectiveResult:
    """The registered algorithm ``algorithm`` on ``batch`` (:data:`ALGORITHM_REGISTRY`; an
    unknown name is a ValueError listing the known ones). ``phase`` matters only for
    ``li2sao``, ``stage`` only for algorithms with a critic stage (``pact``); every other
    algorithm has one stage, ``"actor"``.

    ``all_reduce`` sums a small tensor across data-parallel ranks; it is used to whiten GAE
    advantages with global statistics (identity when None).
    """
    if not isinstance(batch, ObjectiveBatch):
        raise ValueError(f"batch must be an ObjectiveBatch, got {type(batch).__name__}")
    if stage not in STAGES:
        raise ValueError(f"stage must be one of {STAGES}, got {stage!r}")
    entry = ALGORITHM_REGISTRY.get(algorithm)
    if stage not in entry.stages:
        owners = [
            n for n in ALGORITHM_REGISTRY.names() if stage in ALGORITHM_REGISTRY.get(n).stages
        ]
        raise ValueError(f"stage={stage!r} exists only for {', '.join(owners)}, not {algorithm!r}")
    return entry.objective(batch, ObjectiveRequest(phase, stage, config, all_reduce))
