"""An optional KL penalty towards a frozen reference policy (off by default).

Neither spec uses one (LI2SAO_SPEC "no KL term by default"; PACT_SRPPO_SPEC "no KL
**(choice)**"); users of GRPO-style recipes expect the option. The term follows GRPO
(DeepSeekMath, Eq. 3-4): the actor loss gains ``+ beta * D_KL(pi_theta || pi_ref)``, estimated
per action token with Schulman's ``k3`` estimator

    k3_t = exp(r_t) - r_t - 1,   r_t = log pi_ref(a_t | s_t) - log pi_theta(a_t | s_t),

which is non-negative, zero iff the two log-probabilities agree, and unbiased for the KL under
samples of ``pi_theta`` (approximately so under the behaviour policy's samples). ``r_t`` is
clamped to +-20 so that ``exp`` stays finite. The per-token terms are aggregated as the policy
loss's aggregations are (LI2SAO_SPEC Eq. 1, "seq-mean-token-mean": each trajectory's ``1/M_i``
mean over its action tokens -- all its segments' rows together -- then the mean over
trajectories; or "token-mean" over the batch); the caller picks which.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from trainer.algorithms.masks import ActionMask
from trainer.algorithms.policy_losses import (
    AGGREGATIONS,
    PPO_LOG_RATIO_LIMIT,
    Aggregation,
    _aggregate,
)
from trainer.algorithms.validation import require_same_shape


@dataclass(frozen=True)
class ReferenceKL:
    """``loss``: the aggregated ``k3`` (with gradient through ``logp``); ``mean_kl``: the
    detached mean of ``k3`` over all action tokens (the metric)."""

    loss: Tensor
    mean_kl: Tensor


def reference_kl(
    logp: Tensor,
    ref_logp: Tensor,
    action_mask: Tensor,
    trajectory_index: Tensor | None = None,
    aggregation: Aggregation = "seq-mean-token-mean",
) -> ReferenceKL:
    """``D_KL(pi_theta || pi_ref)`` of ``[N, T]`` logprobs by the ``k3`` estimator (module
    docstring); ``ref_logp`` carries no gradient, positions off ``action_mask`` count for
    nothing."""
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"aggregation must be one of {AGGREGATIONS}, got {aggregation!r}")
    require_same_shape(logp=logp, ref_logp=ref_logp, action_mask=action_mask)
    am = ActionMask.of(action_mask)
    weights = am.weights(logp.dtype)
    r = ((ref_logp.detach() - logp) * weights).clamp(-PPO_LOG_RATIO_LIMIT, PPO_LOG_RATIO_LIMIT)
    k3 = (torch.exp(r) - r - 1.0) * weights  # 0 off the action tokens (r = 0 there)
    ones = torch.ones((logp.shape[0], 1), dtype=logp.dtype, device=logp.device)
    loss = _aggregate(k3, ones, am, aggregation, trajectory_index)
    count = am.row_counts(logp.dtype).sum().clamp(min=1.0)
    return ReferenceKL(loss=loss, mean_kl=(k3.detach().sum() / count))
