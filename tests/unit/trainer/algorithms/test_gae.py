"""Skip-observation GAE (Eq. 6-7) against the loop reference, and its closed forms."""

from __future__ import annotations

import random

import pytest
import torch

from tests.support import algorithm_reference as ref
from tests.support.algorithm_batches import (
    DTYPES,
    on_devices_and_dtypes,
    random_batch,
    tolerance,
)
from trainer.algorithms import (
    discounted_returns,
    gae_advantages_and_returns,
    reverse_discounted_cumsum,
    skip_observation_gae,
    terminal_reward_tokens,
)

SEEDS = range(12)


def _token_rewards(b, dense: bool, seed: int) -> torch.Tensor:
    """Terminal rewards, or random rewards on every action token (non-terminal rewards)."""
    if not dense:
        return terminal_reward_tokens(b.rewards, b.action_mask)
    gen = torch.Generator().manual_seed(seed)
    noise = torch.randn(b.action_mask.shape, generator=gen, dtype=torch.float64)
    return (noise.to(b.values.device, b.values.dtype)) * b.action_mask


@on_devices_and_dtypes
@pytest.mark.parametrize("seed", SEEDS)
def test_gae_matches_reference(seed: int, dtype: torch.dtype, device: str) -> None:
    b = random_batch(seed, dtype, device)
    rng = random.Random(seed)
    gamma = rng.choice([1.0, 0.97, 0.5, 0.0])
    per_row = rng.random() < 0.5
    n = b.rewards.shape[0]
    lam: float | torch.Tensor
    if per_row:
        lam = torch.rand(n, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
        lam[0] = 0.0
        lam = lam.to(device=device, dtype=dtype)
        lam_list = lam.tolist()
    else:
        lam = rng.choice([1.0, 0.95, 0.0])
        lam_list = [lam] * n
    rewards = _token_rewards(b, dense=seed % 2 == 1, seed=seed)
    adv, ret = skip_observation_gae(rewards, b.values, b.action_mask, gamma, lam)
    want_adv, want_ret = ref.skip_observation_gae(
        rewards.tolist(), b.values.tolist(), b.action_mask.tolist(), gamma, lam_list
    )
    assert adv.dtype == dtype and adv.device == b.values.device
    torch.testing.assert_close(adv.cpu(), torch.tensor(want_adv, dtype=dtype), **tolerance(dtype))
    torch.testing.assert_close(ret.cpu(), torch.tensor(want_ret, dtype=dtype), **tolerance(dtype))
    off = ~b.action_mask
    assert bool((adv[off] == 0).all()) and bool((ret[off] == 0).all())


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("seed", SEEDS)
def test_terminal_reward_closed_form(seed: int, dtype: torch.dtype) -> None:
    """gamma = lam = 1 and a terminal reward: G = R on every action token, A = R - V (A.2)."""
    b = random_batch(seed, dtype)
    adv, ret = skip_observation_gae(
        terminal_reward_tokens(b.rewards, b.action_mask), b.values, b.action_mask, 1.0, 1.0
    )
    mask = b.action_mask
    expected_ret = b.rewards[:, None].expand_as(mask)
    torch.testing.assert_close(ret[mask], expected_ret[mask], **tolerance(dtype))
    torch.testing.assert_close(adv[mask], (expected_ret - b.values)[mask], **tolerance(dtype))


@pytest.mark.parametrize("seed", range(6))
def test_joint_advantages_and_returns(seed: int) -> None:
    b = random_batch(seed)
    rewards = _token_rewards(b, dense=True, seed=seed)
    lam = torch.linspace(0, 1, b.rewards.shape[0], dtype=torch.float64)
    adv, ret = gae_advantages_and_returns(rewards, b.values, b.action_mask, 0.9, lam)
    torch.testing.assert_close(
        adv, skip_observation_gae(rewards, b.values, b.action_mask, 0.9, lam)[0]
    )
    torch.testing.assert_close(
        ret, skip_observation_gae(rewards, b.values, b.action_mask, 0.9, 1.0)[1]
    )
    outcome_adv, outcome_ret = gae_advantages_and_returns(
        b.rewards, b.values, b.action_mask, 0.9, lam
    )
    tokens = terminal_reward_tokens(b.rewards, b.action_mask)
    torch.testing.assert_close(
        outcome_adv, skip_observation_gae(tokens, b.values, b.action_mask, 0.9, lam)[0]
    )
    torch.testing.assert_close(
        outcome_ret, skip_observation_gae(tokens, b.values, b.action_mask, 0.9, 1.0)[1]
    )


def test_observations_are_skipped_by_hand() -> None:
    # row: a a o o a p  (p = padding);  V at actions 0.5, 0.25, 0.125; R = 1
    mask = torch.tensor([[1, 1, 0, 0, 1, 0]])
    values = torch.tensor([[0.5, 0.25, 9.0, 9.0, 0.125, 7.0]], dtype=torch.float64)
    rewards = torch.tensor([[0, 0, 0, 0, 1.0, 0]], dtype=torch.float64)
    adv, ret = skip_observation_gae(rewards, values, mask, gamma=1.0, lam=0.5)
    d2 = 1 - 0.125  # terminal: r - V
    d1 = 0.125 - 0.25  # V of the next *action*, not of the observation
    d0 = 0.25 - 0.5
    a2, a1 = d2, d1 + 0.5 * d2
    a0 = d0 + 0.5 * a1
    assert adv.tolist()[0] == pytest.approx([a0, a1, 0, 0, a2, 0])
    assert ret.tolist()[0] == pytest.approx([a0 + 0.5, a1 + 0.25, 0, 0, a2 + 0.125, 0])


@pytest.mark.parametrize("length", [1, 15, 16, 17, 255, 256, 257, 1000])
def test_reverse_scan_all_block_boundaries(length: int) -> None:
    gen = torch.Generator().manual_seed(length)
    x = torch.randn(5, length, generator=gen, dtype=torch.float64)
    c = torch.tensor([0.0, 1.0, 0.5, 0.99, 1e-3], dtype=torch.float64)
    want = torch.zeros_like(x)
    for i in range(5):
        running = 0.0
        for j in range(length - 1, -1, -1):
            running = float(x[i, j]) + float(c[i]) * running
            want[i, j] = running
    torch.testing.assert_close(reverse_discounted_cumsum(x, c), want)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("gamma", [1.0, 0.9, 0.0])
@pytest.mark.parametrize("seed", range(8))
def test_discounted_returns_are_the_lambda_one_returns(seed: int, gamma: float, dtype) -> None:
    """Eq. 36: with lambda = 1 the returns do not depend on V (dense and outcome rewards)."""
    b = random_batch(seed, dtype)
    n = b.rewards.shape[0]
    mask = b.action_mask.tolist()
    for rewards in (b.rewards, _token_rewards(b, dense=True, seed=seed)):
        dense = rewards if rewards.ndim == 2 else terminal_reward_tokens(rewards, b.action_mask)
        _, want = ref.skip_observation_gae(
            dense.tolist(), b.values.tolist(), mask, gamma, [1.0] * n
        )
        got = discounted_returns(rewards, b.action_mask, gamma)
        torch.testing.assert_close(got, torch.tensor(want, dtype=dtype), **tolerance(dtype))


@pytest.mark.parametrize("seed", range(8))
def test_outcome_rewards_equal_the_token_layout(seed: int) -> None:
    b = random_batch(seed)
    lam = torch.rand(b.rewards.shape[0], generator=torch.Generator().manual_seed(seed))
    lam = lam.to(torch.float64)
    outcome = skip_observation_gae(b.rewards, b.values, b.action_mask, 0.95, lam)
    tokens = terminal_reward_tokens(b.rewards, b.action_mask)
    layout = skip_observation_gae(tokens, b.values, b.action_mask, 0.95, lam)
    torch.testing.assert_close(outcome[0], layout[0])
    torch.testing.assert_close(outcome[1], layout[1])


def _long_batch(seed: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """140 rows x 400 positions (more rows than one GAE row chunk, rows longer than one scan
    level): random action/observation spans, observations first in some rows, padded tails,
    values of both signs."""
    rng = random.Random(seed)
    n, t = 140, 400
    rows: list[list[bool]] = []
    for _ in range(n):
        end, action, row = rng.randint(1, t), rng.random() < 0.7, []
        while len(row) < end:
            row.extend([action] * rng.randint(1, 40))
            action = not action
        row = row[:end] + [False] * (t - end)
        if not any(row):
            row[end - 1] = True
        rows.append(row)
    gen = torch.Generator().manual_seed(seed)
    values = torch.randn(n, t, generator=gen, dtype=torch.float64).to(dtype)
    return torch.tensor(rows), values


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("gamma", [1.0, 0.9])
@pytest.mark.parametrize("seed", range(2))
@pytest.mark.slow  # long batches through the loop reference
def test_chunked_gae_matches_reference_on_long_batches(seed: int, gamma: float, dtype) -> None:
    """The row-chunked, scratch-slot compaction and the lambda = 1 closed form against the loop,
    with per-row lambda (0 and 1 included), gamma < 1, dense and outcome rewards."""
    mask, values = _long_batch(seed, dtype)
    n = mask.shape[0]
    gen = torch.Generator().manual_seed(100 + seed)
    lam = torch.rand(n, generator=gen, dtype=torch.float64)
    lam[:3] = torch.tensor([0.0, 1.0, 1e-3], dtype=torch.float64)
    outcome = torch.randn(n, generator=gen, dtype=torch.float64).to(dtype)
    dense = (torch.randn(n, t := mask.shape[1], generator=gen, dtype=torch.float64) * mask).to(
        dtype
    )
    assert t == 400
    value_list, mask_list = values.tolist(), mask.tolist()
    for rewards in (outcome, dense):
        tokens = rewards if rewards.ndim == 2 else terminal_reward_tokens(rewards, mask)
        for trace in (lam.to(dtype), 1.0):
            lam_list = trace.tolist() if isinstance(trace, torch.Tensor) else [trace] * n
            want_adv, want_ret = ref.skip_observation_gae(
                tokens.tolist(), value_list, mask_list, gamma, lam_list
            )
            adv, ret = skip_observation_gae(rewards, values, mask, gamma, trace)
            tol = tolerance(dtype)
            torch.testing.assert_close(adv, torch.tensor(want_adv, dtype=dtype), **tol)
            torch.testing.assert_close(ret, torch.tensor(want_ret, dtype=dtype), **tol)
            # G is computed directly and A = G - V: the identity holds to one rounding
            torch.testing.assert_close(ret[mask], adv[mask] + values[mask], **tol)
            assert not adv[~mask].any() and not ret[~mask].any()


@pytest.mark.parametrize("lam", [0.7, 1.0])
def test_unchecked_rewards_off_the_actions_do_not_leak(lam: float) -> None:
    """With check=False, whatever per-token rewards hold on observations lands in the scratch
    slot (or is masked) and changes nothing."""
    mask, values = _long_batch(7, torch.float64)
    gen = torch.Generator().manual_seed(7)
    clean = torch.randn(mask.shape, generator=gen, dtype=torch.float64) * mask
    noisy = clean + 1e3 * torch.rand(mask.shape, generator=gen, dtype=torch.float64) * ~mask
    for gamma in (1.0, 0.8):
        got = skip_observation_gae(noisy, values, mask, gamma, lam, check=False)
        want = skip_observation_gae(clean, values, mask, gamma, lam)
        torch.testing.assert_close(got[0], want[0])
        torch.testing.assert_close(got[1], want[1])
