"""Policy lag, off-policy token ratio, the lag filter and DAPO's dynamic-sampling filter."""

from __future__ import annotations

import pytest
import torch

from tests.support import algorithm_reference as ref
from tests.support.algorithm_batches import DEVICES, random_batch
from trainer.algorithms import (
    dynamic_sampling_filter,
    filter_by_lag,
    off_policy_token_ratio,
    policy_lag,
)

SEEDS = range(12)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("seed", SEEDS)
def test_lag_and_ratio_match_reference(seed: int, device: str) -> None:
    b = random_batch(seed, device=device)
    v, versions, mask = b.trainer_version, b.token_versions, b.action_mask
    lags = policy_lag(v, versions, mask)
    assert lags.tolist() == ref.policy_lag(v, versions.tolist(), mask.tolist())
    ratio = off_policy_token_ratio(v, versions, mask)
    assert float(ratio) == pytest.approx(ref.off_policy_ratio(v, versions.tolist(), mask.tolist()))
    for limit in range(0, v + 1):
        result = filter_by_lag(v, versions, mask, limit)
        expected = [i for i, lag in enumerate(lags.tolist()) if lag <= limit]
        assert result.kept.tolist() == expected
        assert result.dropped == len(lags) - len(expected)


def test_oldest_action_token_decides_and_observations_are_ignored() -> None:
    versions = torch.tensor([[5, 4, 0, 5], [3, 3, 3, 3]])
    mask = torch.tensor([[1, 1, 0, 1], [1, 0, 0, 1]])  # version 0 sits on an observation
    assert policy_lag(5, versions, mask).tolist() == [1, 2]
    # tokens with lag > 1: row 1's two action tokens only
    assert float(off_policy_token_ratio(5, versions, mask)) == pytest.approx(2 / 5)
    result = filter_by_lag(5, versions, mask, max_policy_lag=1)
    assert result.kept.tolist() == [0] and result.dropped == 1


def test_lag_rejects_future_versions() -> None:
    with pytest.raises(ValueError, match="future"):
        policy_lag(2, torch.tensor([[3, 1]]), torch.tensor([[1, 1]]))
    with pytest.raises(ValueError, match="max_policy_lag"):
        filter_by_lag(2, torch.tensor([[1, 1]]), torch.tensor([[1, 1]]), -1)


def test_dynamic_sampling_drops_constant_groups() -> None:
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.5])
    groups = torch.tensor([3, 3, 8, 8, 1, 1, 6])
    result = dynamic_sampling_filter(rewards, groups, target_groups=4)
    assert result.kept.tolist() == [0, 1]
    assert (result.kept_groups, result.dropped_groups, result.groups_to_draw) == (1, 3, 3)
    enough = dynamic_sampling_filter(rewards, groups, target_groups=1)
    assert enough.groups_to_draw == 0


@pytest.mark.parametrize("seed", SEEDS)
def test_dynamic_sampling_matches_definition(seed: int) -> None:
    b = random_batch(seed)
    result = dynamic_sampling_filter(b.rewards, b.group_ids, target_groups=10)
    r, g = b.rewards.tolist(), b.group_ids.tolist()
    mixed = {x for x in set(g) if len({r[i] for i in range(len(g)) if g[i] == x}) > 1}
    assert result.kept.tolist() == [i for i in range(len(g)) if g[i] in mixed]
    assert result.kept_groups == len(mixed)
    assert result.dropped_groups == len(set(g)) - len(mixed)
    assert result.groups_to_draw == max(0, 10 - len(mixed))
