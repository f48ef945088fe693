"""Residual targets, clipped value loss (Eq. 10) and ranking loss (Eq. 11) vs the references."""

from __future__ import annotations

import pytest
import torch

from tests.support import algorithm_reference as ref
from tests.support.algorithm_batches import (
    on_devices_and_dtypes,
    random_batch,
    tolerance,
)
from trainer.algorithms import (
    clipped_value_loss,
    group_residual_targets,
    skip_observation_gae,
    terminal_ranking_loss,
    terminal_reward_tokens,
    terminal_values,
)
from trainer.algorithms.critic import value_loss_terms

SEEDS = range(12)


@on_devices_and_dtypes
@pytest.mark.parametrize("seed", SEEDS)
def test_residual_targets_match_reference(seed: int, dtype: torch.dtype, device: str) -> None:
    b = random_batch(seed, dtype, device)
    _, returns = skip_observation_gae(
        terminal_reward_tokens(b.rewards, b.action_mask), b.values, b.action_mask, 1.0, 1.0
    )
    targets, keep = group_residual_targets(returns, b.rewards, b.group_ids, b.action_mask)
    want, want_keep = ref.residual_targets(
        returns.tolist(), b.rewards.tolist(), b.group_ids.tolist(), b.action_mask.tolist()
    )
    torch.testing.assert_close(targets.cpu(), torch.tensor(want, dtype=dtype), **tolerance(dtype))
    assert keep.tolist() == want_keep


def test_residual_targets_hand_example() -> None:
    returns = torch.tensor([[1.0, 1.0], [0.0, 0.0], [0.0, 0.0], [2.0, 2.0], [2.0, 2.0]])
    rewards = torch.tensor([1.0, 0.0, 0.0, 2.0, 2.0])
    groups = torch.tensor([3, 3, 3, 8, 8])
    mask = torch.tensor([[1, 0], [1, 1], [0, 1], [1, 1], [1, 1]])
    targets, keep = group_residual_targets(returns, rewards, groups, mask)
    third = 1 / 3
    expected = [[1 - third, 0], [-third, -third], [0, -third], [0, 0], [0, 0]]
    torch.testing.assert_close(targets, torch.tensor(expected))
    assert keep.tolist() == [True, True, True, False, False]


@on_devices_and_dtypes
@pytest.mark.parametrize("seed", SEEDS)
def test_clipped_value_loss_matches_reference(seed: int, dtype: torch.dtype, device: str) -> None:
    b = random_batch(seed, dtype, device)
    gen = torch.Generator().manual_seed(seed)
    targets = torch.randn(b.values.shape, generator=gen, dtype=torch.float64).to(b.values)
    subset = b.action_mask & (torch.rand(b.values.shape, generator=gen) < 0.6).to(device)
    values = b.values.clone().requires_grad_()
    loss = clipped_value_loss(values, b.old_values, targets, subset, eps_v=0.2)
    loss.backward()
    want, want_grad = ref.clipped_value_loss(
        b.values.tolist(), b.old_values.tolist(), targets.tolist(), subset.tolist(), 0.2
    )
    tol = tolerance(dtype)
    assert loss.item() == pytest.approx(want, rel=tol["rtol"] * 10, abs=tol["atol"] * 10)
    torch.testing.assert_close(values.grad.cpu(), torch.tensor(want_grad, dtype=dtype), **tol)


def test_clipped_value_loss_empty_mask_is_zero_with_graph() -> None:
    values = torch.randn(2, 3, requires_grad=True)
    loss = clipped_value_loss(values, values.detach(), torch.zeros(2, 3), torch.zeros(2, 3))
    loss.backward()
    assert loss.item() == 0.0
    assert values.grad is not None and float(values.grad.abs().sum()) == 0.0


def test_clipped_value_loss_hand_example() -> None:
    values = torch.tensor([[1.0, 0.0]], requires_grad=True)
    old = torch.tensor([[0.5, 0.0]])
    targets = torch.tensor([[0.0, 1.0]])
    loss = clipped_value_loss(values, old, targets, torch.tensor([[1, 1]]), eps_v=0.2)
    # token 0: V 1.0 -> V_bar 0.7; max(1.0, 0.49) = 1.0; token 1: V = V_old, (0 - 1)^2 = 1
    assert loss.item() == pytest.approx(1.0)
    loss.backward()
    assert values.grad[0].tolist() == pytest.approx([1.0, -1.0])


@on_devices_and_dtypes
@pytest.mark.parametrize("seed", SEEDS)
def test_ranking_loss_matches_reference(seed: int, dtype: torch.dtype, device: str) -> None:
    b = random_batch(seed, dtype, device)
    final = terminal_values(b.values, b.action_mask).detach().requires_grad_()
    loss = terminal_ranking_loss(final, b.rewards, b.group_ids, margin=0.1)
    want = ref.ranking_loss(final.tolist(), b.rewards.tolist(), b.group_ids.tolist(), 0.1)
    tol = tolerance(dtype)
    assert loss.item() == pytest.approx(want, rel=tol["rtol"] * 10, abs=tol["atol"] * 10)
    loss.backward()
    assert final.grad is not None


def test_ranking_loss_hand_example_and_no_pair() -> None:
    final = torch.tensor([0.3, 0.25, 0.0, 5.0], requires_grad=True)
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0])
    groups = torch.tensor([0, 0, 0, 1])
    loss = terminal_ranking_loss(final, rewards, groups, margin=0.1)
    # pairs (0, 1): relu(0.1 - 0.3 + 0.25) = 0.05; (0, 2): relu(0.1 - 0.3 + 0) = 0
    assert loss.item() == pytest.approx(0.025)
    none = terminal_ranking_loss(final, rewards, torch.arange(4), margin=0.1)
    none.backward()
    assert none.item() == 0.0 and final.grad is not None


def test_terminal_values_reads_last_action_token() -> None:
    values = torch.arange(12.0).reshape(2, 6)
    mask = torch.tensor([[1, 1, 0, 1, 0, 0], [0, 1, 0, 0, 0, 1]])
    assert terminal_values(values, mask).tolist() == [3.0, 11.0]
    rewards = terminal_reward_tokens(torch.tensor([2.0, -1.0]), mask)
    assert rewards.tolist() == [[0, 0, 0, 2.0, 0, 0], [0, 0, 0, 0, 0, -1.0]]


@pytest.mark.parametrize("seed", range(4))
def test_value_loss_terms_with_one_target_per_row_equal_the_token_form(seed: int) -> None:
    """SR-PPO's ``y = R`` given as ``[N]`` targets: the same BCE and MSE sums and gradients as
    the ``[N, T]`` targets ``R`` on every action token."""
    b = random_batch(seed, torch.float64)
    mask = b.action_mask
    y = torch.rand(mask.shape[0], generator=torch.Generator().manual_seed(seed), dtype=b.logp.dtype)
    grads = []
    terms = []
    for targets in (y, y[:, None] * mask):
        z = b.old_values.clone().requires_grad_()
        bce, mse, count = value_loss_terms(z, targets, mask)
        (bce + 2 * mse).backward()
        terms.append((bce.item(), mse.item(), count.item()))
        grads.append(z.grad)
    assert terms[0] == pytest.approx(terms[1], rel=1e-12, abs=1e-12)
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-12, atol=1e-12)
    assert bool((grads[0][~mask] == 0).all())  # nothing off the mask
