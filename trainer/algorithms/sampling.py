"""DAPO dynamic sampling as a batch filter.

DAPO re-draws prompts until every group in the batch is mixed (not all rewards equal), because a
group with identical rewards has zero GRPO advantage and contributes no gradient. Here that is a
pure function: it drops such groups and reports how many more groups the sampler must draw to
reach its target; the re-drawing itself belongs to the rollout side.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from trainer.algorithms.groups import group_all_equal, group_index
from trainer.algorithms.validation import require_group_ids, require_rewards, require_same_device


@dataclass(frozen=True)
class DynamicSamplingResult:
    """Outcome of :func:`dynamic_sampling_filter`.

    Attributes:
        kept: ``[K]`` long, indices of the rows of mixed groups (ascending).
        kept_groups: number of mixed groups kept.
        dropped_groups: number of groups dropped (all rewards equal, including groups of one).
        groups_to_draw: ``max(0, target_groups - kept_groups)``, groups still to sample.
    """

    kept: Tensor
    kept_groups: int
    dropped_groups: int
    groups_to_draw: int


def dynamic_sampling_filter(
    rewards: Tensor, group_ids: Tensor, target_groups: int, *, check: bool = True
) -> DynamicSamplingResult:
    """Drop every group whose rewards are all equal; report the shortfall to ``target_groups``."""
    if not isinstance(target_groups, int) or isinstance(target_groups, bool) or target_groups < 0:
        raise ValueError(f"target_groups must be a non-negative int, got {target_groups!r}")
    if check:
        require_rewards(rewards)
        require_group_ids(group_ids, rewards.shape[0])
        require_same_device(rewards=rewards, group_ids=group_ids)
    index = group_index(group_ids)
    constant = group_all_equal(rewards.detach(), index)
    kept = (~constant[index.inverse]).nonzero().squeeze(1)
    kept_groups = int((~constant).sum())
    return DynamicSamplingResult(
        kept=kept,
        kept_groups=kept_groups,
        dropped_groups=index.num_groups - kept_groups,
        groups_to_draw=max(0, target_groups - kept_groups),
    )
