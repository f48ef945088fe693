"""SR-PPO's primitives (PACT_SRPPO_SPEC "SR-PPO"): Pass@k weights and advantages."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support import algorithm_reference as ref
from tests.support.algorithm_batches import (
    on_devices_and_dtypes,
    random_batch,
    tolerance,
)
from trainer.algorithms import (
    pact_advantages,
    skip_observation_gae,
    srppo_advantages,
    srppo_passk_weights,
)


def _unit_rewards(b) -> torch.Tensor:
    return torch.tensor(ref.normalize_rewards(b.rewards.tolist(), -2.0, 2.0)).to(b.rewards)


def _sigmoid_values(b) -> torch.Tensor:
    """Critic values in (0, 1), as a sigmoid head gives them."""
    return torch.sigmoid(b.old_values)


@on_devices_and_dtypes
@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("k", [1.0, 2.0, 4.0, 2.5])
def test_srppo_advantages_match_reference(seed: int, dtype, device: str, k: float) -> None:
    b = random_batch(seed, dtype, device)
    rewards = _unit_rewards(b)
    for values in (_sigmoid_values(b), b.old_values):  # raw values leave [0, 1]: q^ is clamped
        got = srppo_advantages(rewards, values, b.action_mask, k)
        want = ref.srppo_advantages(rewards.tolist(), values.tolist(), b.action_mask.tolist(), k)
        torch.testing.assert_close(got.cpu(), torch.tensor(want, dtype=dtype), **tolerance(dtype))
        assert not got.requires_grad
    got = srppo_advantages(rewards, _sigmoid_values(b), b.action_mask, k, gamma=0.9)
    want = ref.srppo_advantages(
        rewards.tolist(), _sigmoid_values(b).tolist(), b.action_mask.tolist(), k, 0.9
    )
    torch.testing.assert_close(got.cpu(), torch.tensor(want, dtype=dtype), **tolerance(dtype))


@pytest.mark.parametrize("seed", range(6))
def test_k_one_gives_the_plain_monte_carlo_advantage(seed: int) -> None:
    b = random_batch(seed)
    rewards, values = _unit_rewards(b), _sigmoid_values(b)
    assert torch.equal(srppo_passk_weights(values[:, 0], 1.0), torch.ones(values.shape[0]).double())
    torch.testing.assert_close(
        srppo_advantages(rewards, values, b.action_mask, 1.0),
        pact_advantages(rewards, values, b.action_mask),
        rtol=0,
        atol=0,
    )


def test_passk_weight_closed_forms_and_limits() -> None:
    v = torch.tensor([0.0, 0.5, 1.0, -0.3, 1.7, 0.25], dtype=torch.float64)
    # k (1 - q)^(k - 1) with q clamped to [0, 1]
    torch.testing.assert_close(
        srppo_passk_weights(v, 4.0),
        torch.tensor([4.0, 0.5, 0.0, 4.0, 0.0, 4 * 0.75**3], dtype=torch.float64),
    )
    torch.testing.assert_close(
        srppo_passk_weights(v, 2.0),
        torch.tensor([2.0, 1.0, 0.0, 2.0, 0.0, 1.5], dtype=torch.float64),
    )
    assert srppo_passk_weights(v, 1.0).tolist() == [1.0] * 6  # 0^0 = 1 at q = 1
    want = [ref.passk_weight(x, 3.5) for x in v.tolist()]
    torch.testing.assert_close(srppo_passk_weights(v, 3.5), torch.tensor(want, dtype=torch.float64))


@pytest.mark.parametrize("k", [1.0, 1.5, 2.0, 4.0, 8.0])
def test_passk_weight_integrates_to_one(k: float) -> None:
    """int_0^1 k (1 - q)^(k - 1) dq = 1: a uniform q^ keeps the mean step size."""
    q = torch.linspace(0, 1, 200_001, dtype=torch.float64)
    w = srppo_passk_weights(q, k)
    assert torch.trapezoid(w, q).item() == pytest.approx(1.0, abs=1e-6)


@settings(max_examples=80, deadline=None)
@given(st.floats(-1, 2), st.floats(-1, 2), st.floats(1, 16))
def test_passk_weight_is_monotone_in_the_value(v1: float, v2: float, k: float) -> None:
    """Harder prompts (lower q^) never get less weight; strictly less once q^ differs, k > 1."""
    lo, hi = sorted((v1, v2))
    w = srppo_passk_weights(torch.tensor([lo, hi], dtype=torch.float64), k)
    assert w[0] >= w[1]
    assert w[1] >= 0 and w[0] <= k
    qlo, qhi = min(max(lo, 0), 1), min(max(hi, 0), 1)
    if k > 1 and qhi - qlo > 1e-6:
        assert w[0] > w[1]


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10_000), st.floats(1, 8))
def test_srppo_advantage_is_the_row_weight_times_lambda_one_gae(seed: int, k: float) -> None:
    b = random_batch(seed)
    rewards, values = _unit_rewards(b), _sigmoid_values(b)
    mc, _ = skip_observation_gae(rewards, values, b.action_mask, 1.0, 1.0)
    u1 = [ref.action_positions(row)[0] for row in b.action_mask.tolist()]
    w = srppo_passk_weights(values[torch.arange(len(u1)), torch.tensor(u1)], k)
    torch.testing.assert_close(srppo_advantages(rewards, values, b.action_mask, k), w[:, None] * mc)


def test_all_zero_rewards_give_minus_weighted_values() -> None:
    values = torch.tensor([[0.2, 0.9, 0.4], [0.5, 0.5, 0.5]], dtype=torch.float64)
    mask = torch.tensor([[0, 1, 1], [1, 0, 0]])
    rewards = torch.zeros(2, dtype=torch.float64)
    adv = srppo_advantages(rewards, values, mask, 2.0)
    # row 0: q^ = V(s_{u_1}) = 0.9 (the leading observation is prompt), w = 2 * 0.1 = 0.2
    want = torch.tensor([[0.0, -0.2 * 0.9, -0.2 * 0.4], [-0.5, 0.0, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(adv, want)


def test_single_token_responses() -> None:
    values = torch.tensor([[0.25], [0.75]], dtype=torch.float64)
    mask = torch.ones(2, 1)
    adv = srppo_advantages(torch.tensor([1.0, 0.0], dtype=torch.float64), values, mask, 3.0)
    w = [3 * 0.75**2, 3 * 0.25**2]
    torch.testing.assert_close(
        adv, torch.tensor([[w[0] * 0.75], [w[1] * -0.75]], dtype=torch.float64)
    )


def test_lemma_gradient_is_exact_on_an_enumerated_tree() -> None:
    """grad J_k = E[w_k(s_0) sum_t grad log pi (R - V(s_t))] on a tabular two-step policy.

    Trajectory ``[a1, o, a2]`` (mask ``[1, 0, 1]``): ``a1 ~ pi_1``, the observation ``o``
    depends stochastically on ``a1``, ``a2 ~ pi_2(. | a1, o)``, ``R(a1, o, a2) in {0, 1}``.
    Every trajectory is a row weighted by its probability; the values are the exact
    ``q(s)``. The surrogate built from ``srppo_advantages`` must have the gradient of
    ``J_k = 1 - (1 - q(s_0))^k``.
    """
    k = 3.0
    gen = torch.Generator().manual_seed(7)
    theta1 = torch.randn(2, generator=gen, dtype=torch.float64, requires_grad=True)
    theta2 = torch.randn(2, 2, 2, generator=gen, dtype=torch.float64, requires_grad=True)
    p_obs = torch.tensor([[0.3, 0.7], [0.8, 0.2]], dtype=torch.float64)  # P(o | a1)
    reward = torch.randint(0, 2, (2, 2, 2), generator=gen).to(torch.float64)
    reward[0, 0, 0], reward[1, 1, 1] = 1.0, 0.0  # neither all 0 nor all 1

    def q_root(t1: torch.Tensor, t2: torch.Tensor) -> torch.Tensor:
        pi1, pi2 = t1.softmax(0), t2.softmax(-1)
        q_state = (pi2 * reward).sum(-1)  # q(a1, o)
        return (pi1 * (p_obs * q_state).sum(-1)).sum()

    grad_j = torch.autograd.grad(1 - (1 - q_root(theta1, theta2)) ** k, (theta1, theta2))

    pi1, pi2 = theta1.log_softmax(0), theta2.log_softmax(-1)
    rows = [(a1, o, a2) for a1 in range(2) for o in range(2) for a2 in range(2)]
    with torch.no_grad():
        q_state = (pi2.exp() * reward).sum(-1)
        root = q_root(theta1, theta2)
        prob = torch.stack([pi1[a].exp() * p_obs[a, o] * pi2[a, o, b].exp() for a, o, b in rows])
        values = torch.stack([torch.stack([root, root, q_state[a, o]]) for a, o, _ in rows])
        rewards = torch.stack([reward[a, o, b] for a, o, b in rows])
    logp = torch.stack(
        [
            torch.stack([pi1[a], torch.zeros((), dtype=torch.float64), pi2[a, o, b]])
            for a, o, b in rows
        ]
    )
    mask = torch.tensor([[1, 0, 1]] * len(rows))
    adv = srppo_advantages(rewards, values, mask, k)
    surrogate = (prob[:, None] * logp * adv).sum()
    grad_s = torch.autograd.grad(surrogate, (theta1, theta2), retain_graph=True)
    for got, want in zip(grad_s, grad_j, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    assert math.isfinite(float(root)) and 0 < float(root) < 1
    # and the Pass@1 surrogate (k = 1) has the gradient of q itself
    adv1 = srppo_advantages(rewards, values, mask, 1.0)
    grad_1 = torch.autograd.grad((prob[:, None] * logp * adv1).sum(), (theta1, theta2))
    grad_q = torch.autograd.grad(q_root(theta1, theta2), (theta1, theta2))
    for got, want in zip(grad_1, grad_q, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
