"""PACT's primitives (PACT_SRPPO_SPEC "PACT") against the plain-loop references and closed forms.

``normalize_rewards``, ``first_action_values``, ``pact_advantages``, ``pact_credit``,
``tis_weights``, ``pact_is_weights`` / ``pact_critic_targets`` (four modes) and
``bce_value_loss``.
"""

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
    CRITIC_IS_MODES,
    ActionMask,
    bce_value_loss,
    first_action_values,
    normalize_rewards,
    pact_advantages,
    pact_credit,
    pact_critic_targets,
    pact_is_weights,
    skip_observation_gae,
    tis_weights,
)

SEEDS = range(8)


def _unit_rewards(b) -> torch.Tensor:
    """The batch's rewards mapped into [0, 1] by the reference (random_batch uses [-2, 2])."""
    return torch.tensor(ref.normalize_rewards(b.rewards.tolist(), -2.0, 2.0)).to(b.rewards)


def _assert_close(got: torch.Tensor, want: list, dtype: torch.dtype) -> None:
    torch.testing.assert_close(got.cpu(), torch.tensor(want, dtype=dtype), **tolerance(dtype))


# --- normalize_rewards ---


def test_normalize_rewards_maps_the_range_onto_the_unit_interval() -> None:
    rewards = torch.tensor([-1.0, 0.0, 3.0, 1.0], dtype=torch.float64)
    got = normalize_rewards(rewards, -1.0, 3.0)
    assert got.tolist() == [0.0, 0.25, 1.0, 0.5]
    assert got.tolist() == ref.normalize_rewards(rewards.tolist(), -1.0, 3.0)
    unit = torch.tensor([0.0, 0.3, 1.0])
    assert torch.equal(normalize_rewards(unit), unit)  # the default range is the identity


@pytest.mark.parametrize(
    ("rewards", "low", "high", "message"),
    [
        ([0.0, 1.5], 0.0, 1.0, "1 outside, e.g. 1.5 at row 1"),
        ([-0.1, 0.5, 2.0], 0.0, 1.0, "2 outside, e.g. -0.1"),
        ([0.5], 1.0, 1.0, "reward_max must be > reward_min"),
        ([0.5], 2.0, 1.0, "reward_max must be > reward_min"),
        ([0.5], 0.0, math.inf, "finite"),
    ],
)
def test_normalize_rewards_rejects_instead_of_clamping(rewards, low, high, message) -> None:
    with pytest.raises(ValueError, match=message):
        normalize_rewards(torch.tensor(rewards), low, high)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.floats(0, 1), min_size=1, max_size=8),
    st.floats(0.1, 10),
    st.floats(-5, 5),
)
def test_normalize_rewards_undoes_any_positive_affine_map(rewards, scale, shift) -> None:
    """App. C.1: a positive affine map of R with its range leaves R~ unchanged."""
    raw = torch.tensor(rewards, dtype=torch.float64)
    mapped = normalize_rewards(raw * scale + shift, shift, scale + shift)
    torch.testing.assert_close(mapped, raw, rtol=0, atol=1e-12)
    assert bool((mapped >= 0).all() and (mapped <= 1).all())


# --- first_action_values ---


@pytest.mark.parametrize("seed", SEEDS)
def test_first_action_values_read_u1_and_carry_its_gradient(seed: int) -> None:
    b = random_batch(seed)
    values = b.values.clone().requires_grad_()
    got = first_action_values(values, b.action_mask)
    mask = b.action_mask.tolist()
    want = [b.values.tolist()[i][ref.action_positions(row)[0]] for i, row in enumerate(mask)]
    assert got.tolist() == want
    got.sum().backward()
    for i, row in enumerate(mask):
        u1 = ref.action_positions(row)[0]
        assert values.grad[i].tolist() == [1.0 if t == u1 else 0.0 for t in range(len(row))]
    assert ActionMask(b.action_mask).first.tolist() == [ref.action_positions(r)[0] for r in mask]


def test_first_action_value_skips_leading_observations() -> None:
    values = torch.tensor([[9.0, 9.0, 0.25, 0.5], [0.75, 9.0, 9.0, 9.0]])
    mask = torch.tensor([[0, 0, 1, 1], [1, 0, 0, 0]])
    assert first_action_values(values, mask).tolist() == [0.25, 0.75]


# --- pact_advantages and the credit of Theorem 1 ---


@on_devices_and_dtypes
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("gamma", [1.0, 0.9])
def test_pact_advantages_and_credit_match_reference(seed, dtype, device, gamma) -> None:
    b = random_batch(seed, dtype, device)
    rewards = _unit_rewards(b)
    x = (rewards.tolist(), b.old_values.tolist(), b.action_mask.tolist())
    _assert_close(
        pact_advantages(rewards, b.old_values, b.action_mask, gamma),
        ref.pact_advantages(*x, gamma),
        dtype,
    )
    _assert_close(
        pact_credit(rewards, b.old_values, b.action_mask, gamma), ref.pact_credit(*x, gamma), dtype
    )
    # lambda = 1 GAE of the LI2SAO reference (Eq. 6-7) is the same thing
    token_rewards = [
        [x[0][i] if t == ref.action_positions(row)[-1] else 0.0 for t in range(len(row))]
        for i, row in enumerate(x[2])
    ]
    gae, _ = ref.skip_observation_gae(token_rewards, x[1], x[2], gamma, [1.0] * len(x[0]))
    _assert_close(pact_advantages(rewards, b.old_values, b.action_mask, gamma), gae, dtype)
    # and the library's lambda = 1 GAE to the bit (pact_advantages skips its returns)
    lam_one, _ = skip_observation_gae(rewards, b.old_values, b.action_mask, gamma, 1.0)
    assert torch.equal(pact_advantages(rewards, b.old_values, b.action_mask, gamma), lam_one)


@pytest.mark.parametrize("seed", SEEDS)
def test_lambda_one_advantage_is_r_minus_v_and_credit_telescopes(seed: int) -> None:
    """Sec. 3.3: A_{u_j} = R - V(s_{u_j}); Completeness: sum_j C_{u_j} = R - V(s_{u_1})."""
    b = random_batch(seed)
    rewards, values, mask = _unit_rewards(b), b.old_values, b.action_mask
    adv = pact_advantages(rewards, values, mask)
    closed = torch.where(mask, rewards[:, None] - values, 0.0)
    torch.testing.assert_close(adv, closed, rtol=0, atol=1e-12)
    credit = pact_credit(rewards, values, mask)
    assert bool((credit[~mask] == 0).all())
    torch.testing.assert_close(
        credit.sum(dim=1), rewards - first_action_values(values, mask), rtol=0, atol=1e-12
    )
    # the credit of a span of action tokens (a turn) is the sum of its token credits: the
    # value difference across the span's ends (App. C.2.4), whatever lies between
    for i, row in enumerate(mask.tolist()):
        u = ref.action_positions(row)
        if len(u) >= 3:
            span = credit[i, u[0] : u[1] + 1].sum()
            torch.testing.assert_close(span, values[i, u[2]] - values[i, u[0]])


def test_pact_advantages_hand_example() -> None:
    values = torch.tensor([[0.2, 7.0, 0.6, 0.9], [0.5, 0.0, 0.0, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 0, 1, 1], [1, 0, 0, 0]])
    rewards = torch.tensor([1.0, 0.0], dtype=torch.float64)
    adv = pact_advantages(rewards, values, mask)
    torch.testing.assert_close(
        adv, torch.tensor([[0.8, 0, 0.4, 0.1], [-0.5, 0, 0, 0]], dtype=torch.float64)
    )
    credit = pact_credit(rewards, values, mask)
    torch.testing.assert_close(
        credit, torch.tensor([[0.4, 0, 0.3, 0.1], [-0.5, 0, 0, 0]], dtype=torch.float64)
    )


@pytest.mark.parametrize("seed", range(12))
def test_credit_is_gae_lambda_zero_on_any_layout(seed: int) -> None:
    """The span-wise credit equals the TD residual of skip-observation GAE with lambda = 0,
    for outcome and per-token rewards, any gamma, rows that start with observations, rows with
    one action, and spans that end the row."""
    b = random_batch(seed)
    gen = torch.Generator().manual_seed(seed)
    dense = torch.randn(b.values.shape, generator=gen, dtype=b.values.dtype) * b.action_mask
    for rewards in (b.rewards, dense):
        for gamma in (1.0, 0.8, 0.0):
            want, _ = skip_observation_gae(rewards, b.values, b.action_mask, gamma, 0.0)
            got = pact_credit(rewards, b.values, b.action_mask, gamma)
            torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_pact_advantages_are_gae_lambda_one_for_per_token_rewards() -> None:
    b = random_batch(3)
    token_rewards = torch.where(b.action_mask, torch.rand(b.values.shape, dtype=b.values.dtype), 0)
    want, _ = skip_observation_gae(token_rewards, b.values, b.action_mask, 0.95, 1.0)
    torch.testing.assert_close(pact_advantages(token_rewards, b.values, b.action_mask, 0.95), want)


# --- tis_weights ---


@on_devices_and_dtypes
@pytest.mark.parametrize("seed", SEEDS)
def test_tis_weights_match_reference(seed: int, dtype: torch.dtype, device: str) -> None:
    b = random_batch(seed, dtype, device)
    got = tis_weights(b.logp, b.behavior_logp, b.action_mask)
    want = ref.tis_weights(b.logp.tolist(), b.behavior_logp.tolist(), b.action_mask.tolist(), 0, 2)
    _assert_close(got, want, dtype)
    assert not got.requires_grad
    got = tis_weights(b.logp, b.behavior_logp, b.action_mask, 0.5, 1.5)
    want = ref.tis_weights(
        b.logp.tolist(), b.behavior_logp.tolist(), b.action_mask.tolist(), 0.5, 1.5
    )
    _assert_close(got, want, dtype)


def test_tis_weights_hand_example_and_absent_old_logp() -> None:
    mu = torch.tensor([[0.0, 0.0, 0.0, 0.0]], dtype=torch.float64)
    old = torch.tensor([[math.log(3.0), 50.0, math.log(0.5), -100.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 0, 1, 1]])
    got = tis_weights(old, mu, mask)
    torch.testing.assert_close(
        got, torch.tensor([[2.0, 0.0, 0.5, math.exp(-20.0)]], dtype=torch.float64)
    )
    # old_logp absent means old = mu: every weight is exactly 1
    assert tis_weights(mu, mu, mask).tolist() == [[1.0, 0.0, 1.0, 1.0]]


# --- critic importance weights and targets ---


@on_devices_and_dtypes
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("mode", CRITIC_IS_MODES)
def test_critic_targets_match_reference(seed, dtype, device, mode) -> None:
    b = random_batch(seed, dtype, device)
    rewards = _unit_rewards(b)
    # new vs old: small steps (as after a few actor updates), so every mode keeps and rejects
    new = b.logp + 0.3 * (b.behavior_logp - b.logp)
    targets, keep = pact_critic_targets(rewards, new, b.logp, b.action_mask, mode)
    want_t, want_k = ref.pact_critic_targets(
        rewards.tolist(), new.tolist(), b.logp.tolist(), b.action_mask.tolist(), mode
    )
    _assert_close(targets, want_t, dtype)
    assert keep.tolist() == want_k
    assert keep.dtype == torch.bool and not targets.requires_grad
    weights = pact_is_weights(new, b.logp, b.action_mask, mode)
    want_w = ref.critic_is_weights(new.tolist(), b.logp.tolist(), b.action_mask.tolist(), mode)
    _assert_close(weights, want_w, dtype)
    # a narrower acceptance range
    _, keep = pact_critic_targets(rewards, new, b.logp, b.action_mask, mode, 0.8, 1.2)
    _, want_k = ref.pact_critic_targets(
        rewards.tolist(), new.tolist(), b.logp.tolist(), b.action_mask.tolist(), mode, 0.8, 1.2
    )
    assert keep.tolist() == want_k


def _hand_case() -> tuple[torch.Tensor, ...]:
    """Row 0: actions at 0, 2, 3 (an observation at 1) with c = 2, 0.5, 4; row 1: one action."""
    ln = math.log
    old = torch.zeros(2, 4, dtype=torch.float64)
    new = torch.tensor([[ln(2.0), 9.0, ln(0.5), ln(4.0)], [ln(7.0), 0, 0, 0]], dtype=torch.float64)
    mask = torch.tensor([[1, 0, 1, 1], [1, 0, 0, 0]])
    rewards = torch.tensor([0.5, 1.0], dtype=torch.float64)
    return rewards, new, old, mask


@pytest.mark.parametrize(
    ("mode", "weights", "kept"),
    [
        # W_{u_j} = c_{u_j}
        ("token", [[2.0, 0, 0.5, 4.0], [7.0, 0, 0, 0]], [[1, 0, 1, 1], [0, 0, 0, 0]]),
        # W = prod_{k >= j} c: 2 * 0.5 * 4 = 4, 0.5 * 4 = 2, 4
        ("product", [[4.0, 0, 2.0, 4.0], [7.0, 0, 0, 0]], [[1, 0, 1, 1], [0, 0, 0, 0]]),
        # W = 1 + sum_{k >= j} (c - 1): 1 + 1 - 0.5 + 3 = 4.5, 1 - 0.5 + 3 = 3.5, 4
        ("first_order", [[4.5, 0, 3.5, 4.0], [7.0, 0, 0, 0]], [[1, 0, 1, 1], [0, 0, 0, 0]]),
        ("none", [[1.0, 0, 1.0, 1.0], [1.0, 0, 0, 0]], [[1, 0, 1, 1], [1, 0, 0, 0]]),
    ],
)
def test_critic_target_modes_hand_built(mode, weights, kept) -> None:
    rewards, new, old, mask = _hand_case()
    targets, keep = pact_critic_targets(rewards, new, old, mask, mode)
    w = torch.tensor(weights, dtype=torch.float64)
    torch.testing.assert_close(pact_is_weights(new, old, mask, mode), w)
    torch.testing.assert_close(targets, w * rewards[:, None])  # y = W R
    assert keep.int().tolist() == kept  # 7 > 6 is rejected, except without IS


def test_acceptance_bounds_are_inclusive_and_first_order_rejects_negative_weights() -> None:
    mask = torch.tensor([[1, 1, 1]])
    old = torch.zeros(1, 3, dtype=torch.float64)
    rewards = torch.tensor([1.0], dtype=torch.float64)
    exact = torch.tensor([[0.0, 0.0, -2.0]], dtype=torch.float64)  # c = 1, 1, e^-2 (exactly)
    _, keep = pact_critic_targets(rewards, exact, old, mask, "token", 1.0, 6.0)
    assert keep.tolist() == [[True, True, False]]  # W = 1 = accept_low is kept
    _, keep = pact_critic_targets(rewards, exact, old, mask, "token", 0.5, 1.0)
    assert keep.tolist() == [[True, True, False]]  # W = 1 = accept_high is kept
    # first order with c = 0.1 everywhere: W = 1 - 0.9 * (actions from j on)
    drop = torch.full((1, 3), math.log(0.1), dtype=torch.float64)
    targets, keep = pact_critic_targets(rewards, drop, old, mask, "first_order")
    torch.testing.assert_close(targets, torch.tensor([[-1.7, -0.8, 0.1]], dtype=torch.float64))
    assert keep.tolist() == [[False, False, True]]  # W < 0 lies outside [0, 6]


@pytest.mark.parametrize(
    ("mode", "kept"),
    [
        ("token", [0, 0, 0, 1]),  # e^30 -> e^20 > 6; e^-80 -> e^-20 in range
        ("product", [1, 0, 1, 1]),  # log-sums -20, -50, -80: all tiny weights, kept
        ("first_order", [0, 0, 0, 1]),  # ~2 e^20, ~e^20, ~e^-20
        ("none", [1, 0, 1, 1]),
    ],
)
def test_extreme_log_ratios_give_finite_targets(mode: str, kept: list[int]) -> None:
    mask = torch.tensor([[1, 0, 1, 1]])
    old = torch.zeros(1, 4)
    new = torch.tensor([[30.0, 1e30, 30.0, -80.0]])  # an absurd observation entry too
    targets, keep = pact_critic_targets(torch.tensor([1.0]), new, old, mask, mode)
    assert bool(torch.isfinite(targets).all())
    assert targets[0, 1] == 0
    assert keep.int().tolist() == [kept]


# --- bce_value_loss ---


@on_devices_and_dtypes
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize(("a", "b_coef"), [(1.0, 0.0), (1.0, 1.0), (0.5, 2.0), (0.0, 1.0)])
def test_bce_value_loss_matches_reference(seed, dtype, device, a, b_coef) -> None:
    b = random_batch(seed, dtype, device)
    gen = torch.Generator().manual_seed(seed)
    logits = (2 * torch.randn(b.values.shape, generator=gen, dtype=torch.float64)).to(b.values)
    targets = (2 * torch.rand(b.values.shape, generator=gen, dtype=torch.float64)).to(b.values)
    subset = b.action_mask & (torch.rand(b.values.shape, generator=gen) < 0.7).to(device)
    z = logits.clone().requires_grad_()
    loss = bce_value_loss(z, targets, subset, a, b_coef)
    loss.backward()
    want, want_grad = ref.bce_value_loss(
        logits.tolist(), targets.tolist(), subset.tolist(), a, b_coef
    )
    rel = 1e-5 if dtype == torch.float32 else 1e-10
    assert loss.item() == pytest.approx(want, rel=rel, abs=rel)
    torch.testing.assert_close(
        z.grad.cpu(), torch.tensor(want_grad, dtype=dtype), **tolerance(dtype)
    )


def test_bce_closed_forms() -> None:
    z = torch.tensor([[0.0, 2.0, -1.0]], dtype=torch.float64, requires_grad=True)
    y = torch.tensor([[0.5, 2.0, 0.0]], dtype=torch.float64)
    loss = bce_value_loss(z, y, torch.ones(1, 3))
    softplus2, softplus_m1 = math.log1p(math.exp(2.0)), math.log1p(math.exp(-1.0))
    # ln 2 - 0; softplus(2) - 4 (negative: y > 1 is allowed); -log(1 - sigmoid(-1))
    want = (math.log(2.0) + softplus2 - 4.0 + softplus_m1) / 3
    assert loss.item() == pytest.approx(want, rel=1e-12)
    assert softplus2 - 4.0 < 0
    loss.backward()
    sig = [0.5, 1 / (1 + math.exp(-2.0)), 1 / (1 + math.exp(1.0))]
    want_grad = [(s - t) / 3 for s, t in zip(sig, [0.5, 2.0, 0.0], strict=True)]
    torch.testing.assert_close(z.grad, torch.tensor([want_grad], dtype=torch.float64))
    # for y in [0, 1]: softplus(z) - y z == -y log V - (1 - y) log(1 - V)
    zs = torch.linspace(-6, 6, 25, dtype=torch.float64)[None]
    ys = torch.linspace(0, 1, 25, dtype=torch.float64)[None]
    v = torch.sigmoid(zs)
    direct = (-(ys * v.log()) - (1 - ys) * (1 - v).log()).mean()
    torch.testing.assert_close(bce_value_loss(zs, ys, torch.ones_like(zs)), direct)


def test_bce_minimiser_is_the_mean_target_even_above_one() -> None:
    """App. C.6: d/dz sum (softplus(z) - y z) = 0 at sigmoid(z) = mean y, for W R > 1 too."""
    targets = torch.tensor([[0.0, 2.4, 0.0, 0.0]], dtype=torch.float64)  # mean 0.6
    z = torch.full((1, 4), math.log(0.6 / 0.4), dtype=torch.float64, requires_grad=True)
    bce_value_loss(z, targets, torch.ones(1, 4)).backward()
    assert z.grad.sum().item() == pytest.approx(0.0, abs=1e-15)
    z_off = torch.full((1, 4), 0.0, dtype=torch.float64, requires_grad=True)
    bce_value_loss(z_off, targets, torch.ones(1, 4)).backward()
    assert z_off.grad.sum().item() < 0  # sigmoid(0) = 0.5 < 0.6: push the logit up


def test_bce_empty_mask_is_zero_with_the_graph_attached() -> None:
    z = torch.randn(2, 3, requires_grad=True)
    loss = bce_value_loss(z, torch.full((2, 3), 3.0), torch.zeros(2, 3, dtype=torch.bool))
    assert loss.item() == 0.0 and loss.requires_grad
    loss.backward()
    assert torch.equal(z.grad, torch.zeros(2, 3))


def test_bce_gradcheck_float64() -> None:
    gen = torch.Generator().manual_seed(0)
    z = torch.randn(3, 5, generator=gen, dtype=torch.float64, requires_grad=True)
    y = 1.5 * torch.rand(3, 5, generator=gen, dtype=torch.float64)
    mask = torch.rand(3, 5, generator=gen) < 0.6
    assert torch.autograd.gradcheck(lambda x: bce_value_loss(x, y, mask, 1.0, 1.0), (z,))
    assert torch.autograd.gradgradcheck(lambda x: bce_value_loss(x, y, mask, 1.0, 1.0), (z,))


@settings(max_examples=80, deadline=None)
@given(st.floats(-30, 30), st.floats(0, 6), st.floats(0, 3), st.floats(0, 3))
def test_bce_gradient_closed_form_property(z: float, y: float, a: float, b: float) -> None:
    """d/dz [a (softplus(z) - y z) + b (sigmoid(z) - y)^2] = a (s - y) + 2 b (s - y) s (1 - s)."""
    if a == 0 and b == 0:
        return
    logit = torch.tensor([[z]], dtype=torch.float64, requires_grad=True)
    bce_value_loss(
        logit, torch.tensor([[y]], dtype=torch.float64), torch.ones(1, 1), a, b
    ).backward()
    s = 1 / (1 + math.exp(-z))
    assert logit.grad.item() == pytest.approx(
        a * (s - y) + 2 * b * (s - y) * s * (1 - s), abs=1e-12
    )


# --- observation tokens are never read ---


@pytest.mark.parametrize("seed", range(4))
def test_observation_entries_never_reach_a_value_ratio_advantage_or_loss(seed: int) -> None:
    b = random_batch(seed)
    mask, rewards = b.action_mask, _unit_rewards(b)
    gen = torch.Generator().manual_seed(seed)

    def garbage(x: torch.Tensor) -> torch.Tensor:
        noise = 1e4 * torch.randn(x.shape, generator=gen, dtype=x.dtype)
        return torch.where(mask, x, noise)

    v, lp, mu = b.values, b.logp, b.behavior_logp
    v2, lp2, mu2 = garbage(v), garbage(lp), garbage(mu)
    for fn in (pact_advantages, pact_credit):
        assert torch.equal(fn(rewards, v, mask), fn(rewards, v2, mask))
    assert torch.equal(tis_weights(lp, mu, mask), tis_weights(lp2, mu2, mask))
    for mode in CRITIC_IS_MODES:
        got = pact_critic_targets(rewards, lp, mu, mask, mode)
        want = pact_critic_targets(rewards, lp2, mu2, mask, mode)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    targets = rewards[:, None] * mask
    z, z2 = v.clone().requires_grad_(), v2.clone().requires_grad_()
    loss = bce_value_loss(z, targets, mask, 1.0, 1.0)
    loss2 = bce_value_loss(z2, targets, mask, 1.0, 1.0)
    assert loss.item() == pytest.approx(loss2.item(), rel=1e-14)
    (loss + loss2).backward()
    assert torch.equal(z.grad, z2.grad) and bool((z2.grad[~mask] == 0).all())
