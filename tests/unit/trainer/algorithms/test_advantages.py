"""GRPO advantages (Eq. 2), the adaptive trace and masked whitening against the references."""

from __future__ import annotations

import math

import pytest
import torch

from tests.support import algorithm_reference as ref
from tests.support.algorithm_batches import (
    DTYPES,
    on_devices_and_dtypes,
    random_batch,
    tolerance,
)
from trainer.algorithms import adaptive_lambda, grpo_advantages, masked_moments, whiten

SEEDS = range(12)


@on_devices_and_dtypes
@pytest.mark.parametrize("seed", SEEDS)
def test_grpo_matches_reference(seed: int, dtype: torch.dtype, device: str) -> None:
    b = random_batch(seed, dtype, device)
    got = grpo_advantages(b.rewards, b.group_ids)
    want = ref.grpo_advantages(b.rewards.tolist(), b.group_ids.tolist())
    assert got.dtype == dtype and got.device == b.rewards.device
    torch.testing.assert_close(got.cpu(), torch.tensor(want, dtype=dtype), **tolerance(dtype))


@pytest.mark.parametrize("seed", SEEDS)
def test_grpo_group_sums_to_zero(seed: int) -> None:
    b = random_batch(seed, torch.float64)
    adv = grpo_advantages(b.rewards, b.group_ids)
    for gid in b.group_ids.unique():
        assert abs(float(adv[b.group_ids == gid].sum())) < 1e-9


def test_grpo_hand_example_unbiased_std() -> None:
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 5.0, 3.0], dtype=torch.float64)
    groups = torch.tensor([4, 4, 4, 4, 9, 9])
    adv = grpo_advantages(rewards, groups, eps=0.0)
    # group 4: mean 0.25, unbiased std sqrt((0.5625 + 3 * 0.0625) / 3) = 0.5
    assert adv[:4].tolist() == pytest.approx([1.5, -0.5, -0.5, -0.5])
    # group 9: mean 4, unbiased std sqrt(2)
    assert adv[4:].tolist() == pytest.approx([1 / math.sqrt(2), -1 / math.sqrt(2)])


def test_grpo_equal_rewards_and_singletons_are_exactly_zero() -> None:
    rewards = torch.tensor([0.1, 0.1, 0.1, 0.7, 0.3], dtype=torch.float32)
    groups = torch.tensor([0, 0, 0, 1, 2])
    adv = grpo_advantages(rewards, groups)
    assert adv.tolist() == [0.0, 0.0, 0.0, 0.0, 0.0]
    assert not torch.isnan(adv).any()


@pytest.mark.parametrize("seed", SEEDS)
def test_adaptive_lambda_matches_reference(seed: int) -> None:
    b = random_batch(seed)
    for alpha in (1.5, 0.4, 3.0):
        got = adaptive_lambda(b.action_mask, alpha, dtype=torch.float64)
        want = ref.adaptive_lambda(b.action_mask.tolist(), alpha)
        torch.testing.assert_close(got, torch.tensor(want, dtype=torch.float64))


def test_adaptive_lambda_values() -> None:
    mask = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 1]])
    got = adaptive_lambda(mask, alpha=1.5, dtype=torch.float64)
    # M = 1: 1 - 1/1.5 = 1/3; M = 2: 1 - 1/3; M = 4: 1 - 1/6
    assert got.tolist() == pytest.approx([1 / 3, 2 / 3, 5 / 6])
    assert adaptive_lambda(mask, alpha=0.5).tolist() == pytest.approx([0.0, 0.0, 0.5])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("seed", SEEDS)
def test_whiten_matches_reference(seed: int, dtype: torch.dtype) -> None:
    b = random_batch(seed, dtype)
    got = whiten(b.values, b.action_mask)
    want = ref.whiten(b.values.tolist(), b.action_mask.tolist())
    torch.testing.assert_close(got, torch.tensor(want, dtype=dtype), **tolerance(dtype))
    picked = got[b.action_mask].double()
    assert abs(float(picked.mean())) < 1e-5
    assert float(picked.std(unbiased=False)) == pytest.approx(1.0, abs=1e-4)


def test_whiten_with_all_reduce_uses_global_moments() -> None:
    b = random_batch(3)
    half = b.values.shape[0] // 2
    shards = [(b.values[:half], b.action_mask[:half]), (b.values[half:], b.action_mask[half:])]
    total = sum(masked_moments(v, m) for v, m in shards)
    pieces = [whiten(v, m, all_reduce=lambda _t: total) for v, m in shards]
    torch.testing.assert_close(torch.cat(pieces), whiten(b.values, b.action_mask))
