"""The objective layer's types: its hyper-parameters, its batch and its result.

:class:`ObjectiveBatch` is the padded ``[N, T]`` layout of :mod:`trainer.algorithms`, one row
per segment; ``trajectory_index`` says which rows belong to one trajectory (default: each row
is one), so group statistics count trajectories (:mod:`trainer.algorithms.trajectories`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal, get_args

import torch
from torch import Tensor

from trainer.algorithms.groups import GroupIndex, group_index
from trainer.algorithms.masks import ActionMask
from trainer.algorithms.pact import CRITIC_IS_MODES, CriticIS
from trainer.algorithms.policy_losses import AGGREGATIONS, Aggregation
from trainer.algorithms.readiness import ReadinessStats
from trainer.algorithms.staleness import policy_lag
from trainer.algorithms.trajectories import Trajectories, trajectory_rows
from trainer.algorithms.validation import (
    require_floating,
    require_group_ids,
    require_positive,
    require_rewards,
    require_rewards_per_row,
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
    """One training batch in the padded ``[N, T]`` layout (one row per segment).

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
        trajectory_index: optional ``[N]`` integer trajectory id of each row (rows of one
            trajectory share its reward and group id and are in segment order); None: every
            row is a trajectory. Group sizes, GRPO's mean and sigma, the ``1/sum(m)`` weight
            of Eq. 1 and the readiness statistics count trajectories.
        trajectories: derived: the rows -> trajectories map.
        groups: derived: the groups of the trajectories (sizes count trajectories).
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
    trajectory_index: Tensor | None = None
    mask: ActionMask = field(init=False, repr=False, compare=False)
    trajectories: Trajectories = field(init=False, repr=False, compare=False)
    groups: GroupIndex = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        action_mask = ActionMask(self.action_mask)
        mask = action_mask.mask
        require_tokens(self.tokens, mask)
        require_rewards(self.rewards)
        require_group_ids(self.group_ids, self.rewards.shape[0])
        require_rewards_per_row(self.rewards, mask.shape[0])
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
        trajectories = trajectory_rows(self.trajectory_index, self.rewards, self.group_ids)
        object.__setattr__(self, "trajectories", trajectories)
        object.__setattr__(self, "groups", group_index(trajectories.group_ids))

    @property
    def largest_group_size(self) -> int:
        """Trajectories in the largest prompt group of the batch (decides Li2SAO's estimator)."""
        return int(self.groups.counts.max())


@dataclass(frozen=True)
class ObjectiveResult:
    """What an objective returns.

    Attributes:
        actor_loss: scalar to minimise for the policy, or None (PACT's critic stage).
        critic_loss: scalar to minimise for the critic, or None (critic-free baselines and
            PACT's actor stage).
        metrics: float metrics of this batch (local to this rank).
        estimator: the actor's advantage estimator (built-ins: ``"grpo"`` or ``"gae"``).
        readiness: Li2SAO bootstrap only: statistics to merge across ranks and feed to the gate.
    """

    actor_loss: Tensor | None
    critic_loss: Tensor | None
    metrics: dict[str, float]
    estimator: Estimator | str
    readiness: ReadinessStats | None = None
