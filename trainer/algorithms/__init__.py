"""Li2SAO, its baselines, PACT and SR-PPO as pure, vectorised torch functions.

Batch layout: padded ``[N, T]`` tensors, one row per segment holding the post-prompt
sequence (a trajectory with several segments has several rows; ``ObjectiveBatch.trajectory_index``
says which); ``action_mask`` is 1 on model-generated tokens; ``group_ids`` ``[N]`` long (same
prompt = same id); ``rewards`` ``[N]`` float; ``tokens`` hold ``-1`` past a trajectory's end.
Every function accepts float32 and float64 on any device and raises ``ValueError`` naming the
problem on bad input. See ``docs/algorithms.md`` for the equations and the choices made.

Algorithms, advantage estimators and policy losses are chosen by name from registries
(:mod:`.registry`): a new baseline is a module in :mod:`trainer.algorithms.baselines` that
registers itself.
"""

from trainer.algorithms.advantages import (
    AllReduce,
    adaptive_lambda,
    grpo_advantages,
    masked_moments,
    normalize_rewards,
    whiten,
)
from trainer.algorithms.components import ESTIMATORS, POLICY_LOSSES, Estimate
from trainer.algorithms.critic import (
    bce_value_loss,
    clipped_value_loss,
    group_residual_targets,
    terminal_ranking_loss,
)
from trainer.algorithms.divergence import divergence_mask, first_difference
from trainer.algorithms.gae import (
    discounted_returns,
    gae_advantages_and_returns,
    reverse_discounted_cumsum,
    skip_observation_gae,
)
from trainer.algorithms.masks import ActionMask, last_action_index
from trainer.algorithms.objectives import (
    ALGORITHM_REGISTRY,
    ALGORITHMS,
    PACT_POLICY_LOSSES,
    PHASES,
    STAGES,
    AlgorithmEntry,
    AlgorithmName,
    Composition,
    Estimator,
    ObjectiveBatch,
    ObjectiveConfig,
    ObjectiveRequest,
    ObjectiveResult,
    PactPolicyLoss,
    Phase,
    Stage,
    composed_objective,
    compute_objective,
    dapo_objective,
    grpo_objective,
    gspo_objective,
    li2sao_objective,
    lisao_objective,
    pact_objective,
    register_composed,
    srppo_objective,
)
from trainer.algorithms.pact import (
    CRITIC_IS_MODES,
    CriticIS,
    pact_advantages,
    pact_credit,
    pact_critic_targets,
    pact_is_weights,
    tis_weights,
)
from trainer.algorithms.policy_losses import (
    AGGREGATIONS,
    Aggregation,
    dis_policy_loss,
    gspo_policy_loss,
    ppo_clip_policy_loss,
)
from trainer.algorithms.positions import (
    first_action_values,
    terminal_reward_tokens,
    terminal_values,
)
from trainer.algorithms.readiness import (
    GateConfig,
    ReadinessGate,
    ReadinessStats,
    readiness_statistics,
)
from trainer.algorithms.registry import Registry
from trainer.algorithms.sampling import DynamicSamplingResult, dynamic_sampling_filter
from trainer.algorithms.srppo import srppo_advantages, srppo_passk_weights
from trainer.algorithms.staleness import (
    LagFilter,
    filter_by_lag,
    off_policy_token_ratio,
    policy_lag,
)
from trainer.algorithms.step_plans import (
    ACTOR_CRITIC,
    ACTOR_ONLY,
    FORWARD_ACTOR,
    OLD_LOGP,
    PACT_PLAN,
    PHASE_KINDS,
    SRPPO_PLAN,
    PlanPhase,
    StepPlan,
    actor_steps,
    critic_steps,
)
from trainer.algorithms.trajectories import Trajectories, trajectory_rows

from trainer.algorithms.baselines import import_baselines  # isort: skip (registers last)

import_baselines()

__all__ = [
    "ACTOR_CRITIC",
    "ACTOR_ONLY",
    "AGGREGATIONS",
    "ALGORITHMS",
    "ALGORITHM_REGISTRY",
    "CRITIC_IS_MODES",
    "ESTIMATORS",
    "FORWARD_ACTOR",
    "OLD_LOGP",
    "PACT_PLAN",
    "PACT_POLICY_LOSSES",
    "PHASES",
    "PHASE_KINDS",
    "POLICY_LOSSES",
    "SRPPO_PLAN",
    "STAGES",
    "ActionMask",
    "Aggregation",
    "AlgorithmEntry",
    "AlgorithmName",
    "AllReduce",
    "Composition",
    "CriticIS",
    "DynamicSamplingResult",
    "Estimate",
    "Estimator",
    "GateConfig",
    "LagFilter",
    "ObjectiveBatch",
    "ObjectiveConfig",
    "ObjectiveRequest",
    "ObjectiveResult",
    "PactPolicyLoss",
    "Phase",
    "PlanPhase",
    "ReadinessGate",
    "ReadinessStats",
    "Registry",
    "Stage",
    "StepPlan",
    "Trajectories",
    "actor_steps",
    "adaptive_lambda",
    "bce_value_loss",
    "clipped_value_loss",
    "composed_objective",
    "compute_objective",
    "critic_steps",
    "dapo_objective",
    "dis_policy_loss",
    "discounted_returns",
    "divergence_mask",
    "dynamic_sampling_filter",
    "filter_by_lag",
    "first_action_values",
    "first_difference",
    "gae_advantages_and_returns",
    "group_residual_targets",
    "grpo_advantages",
    "grpo_objective",
    "gspo_objective",
    "gspo_policy_loss",
    "last_action_index",
    "li2sao_objective",
    "lisao_objective",
    "masked_moments",
    "normalize_rewards",
    "off_policy_token_ratio",
    "pact_advantages",
    "pact_credit",
    "pact_critic_targets",
    "pact_is_weights",
    "pact_objective",
    "policy_lag",
    "ppo_clip_policy_loss",
    "readiness_statistics",
    "register_composed",
    "reverse_discounted_cumsum",
    "skip_observation_gae",
    "srppo_advantages",
    "srppo_objective",
    "srppo_passk_weights",
    "terminal_ranking_loss",
    "terminal_reward_tokens",
    "terminal_values",
    "tis_weights",
    "trajectory_rows",
    "whiten",
]
