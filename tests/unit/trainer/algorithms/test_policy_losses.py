"""DIS, PPO clip and GSPO: values and gradients against the references (autograd)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest
import torch

from tests.support import algorithm_reference as ref
from tests.support.algorithm_batches import (
    on_devices_and_dtypes,
    random_batch,
    tolerance,
)
from trainer.algorithms import (
    dis_policy_loss,
    grpo_advantages,
    gspo_policy_loss,
    ppo_clip_policy_loss,
)

SEEDS = range(10)
AGGREGATIONS = ["seq-mean-token-mean", "token-mean"]


def _advantages(b, per_token: bool) -> torch.Tensor:
    if not per_token:
        return torch.randn(b.rewards.shape, generator=torch.Generator().manual_seed(1)).to(
            b.rewards
        )
    gen = torch.Generator().manual_seed(2)
    return torch.randn(b.logp.shape, generator=gen, dtype=torch.float64).to(b.logp)


def _expand(adv: torch.Tensor, like: torch.Tensor) -> list[list[float]]:
    return (adv[:, None].expand_as(like) if adv.ndim == 1 else adv).tolist()


def _check_against_reference(
    loss_fn: Callable[..., tuple[torch.Tensor, dict[str, torch.Tensor]]],
    reference: Callable[..., tuple[Any, ...]],
    b: Any,
    adv: torch.Tensor,
    bounds: tuple[float, float],
    aggregation: str,
) -> tuple[dict[str, torch.Tensor], list[Any]]:
    """Loss and d loss / d logp of ``loss_fn`` equal the list ``reference``'s; returns the
    library's metrics and what the reference returns after ``(loss, grad)``."""
    logp = b.logp.clone().requires_grad_()
    loss, metrics = loss_fn(logp, b.behavior_logp, adv, b.action_mask, *bounds, aggregation)
    loss.backward()
    want, want_grad, *rest = reference(
        b.logp.tolist(), b.behavior_logp.tolist(), _expand(adv, b.logp), b.action_mask.tolist(),
        *bounds, aggregation,
    )  # fmt: skip
    tol = tolerance(b.logp.dtype)
    assert loss.item() == pytest.approx(want, rel=tol["rtol"] * 10, abs=tol["atol"] * 10)
    torch.testing.assert_close(logp.grad.cpu(), torch.tensor(want_grad, dtype=b.logp.dtype), **tol)
    return metrics, rest


@on_devices_and_dtypes
@pytest.mark.parametrize("aggregation", AGGREGATIONS)
@pytest.mark.parametrize("seed", SEEDS)
def test_dis_matches_reference(seed: int, aggregation: str, dtype: torch.dtype, device: str):
    b = random_batch(seed, dtype, device)
    adv = _advantages(b, per_token=seed % 2 == 0)
    metrics, _ = _check_against_reference(
        dis_policy_loss, ref.dis_loss, b, adv, (0.7, 1.6), aggregation
    )
    rho = (b.logp - b.behavior_logp).exp()[b.action_mask]
    assert float(metrics["masked_low_frac"]) == pytest.approx(float((rho <= 0.7).double().mean()))
    assert float(metrics["masked_high_frac"]) == pytest.approx(float((rho >= 1.6).double().mean()))
    assert float(metrics["rho_abs_dev_mean"]) == pytest.approx(
        float((rho - 1).abs().double().mean()), rel=1e-5
    )


def test_dis_gradient_is_a_times_drho_inside_and_zero_outside() -> None:
    """Closed form: d(-J)/d logp_t = -w_t A_t rho_t inside (low, high), exactly 0 outside."""
    log_ratio = torch.log(torch.tensor([[0.5, 0.9, 1.2, 7.0, 3.0, 0.69]], dtype=torch.float64))
    behavior = torch.zeros_like(log_ratio)
    logp = log_ratio.clone().requires_grad_()
    adv = torch.tensor([[2.0, -1.0, 3.0, 4.0, 0.5, 1.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 1, 1, 0]])
    loss, _ = dis_policy_loss(logp, behavior, adv, mask, low=0.7, high=6.0)
    loss.backward()
    rho = [0.5, 0.9, 1.2, 7.0, 3.0]
    inside = [False, True, True, False, True]
    expected = [
        -(a * r) / 5 if ok else 0.0
        for a, r, ok in zip(adv[0, :5].tolist(), rho, inside, strict=True)
    ]
    assert logp.grad[0, :5].tolist() == pytest.approx(expected)
    assert logp.grad[0, 5].item() == 0.0  # observation / padding position
    assert logp.grad[0, 0].item() == 0.0 and logp.grad[0, 3].item() == 0.0
    assert loss.item() == pytest.approx(-(0.9 * -1.0 + 1.2 * 3.0 + 3.0 * 0.5) / 5)


def test_dis_survives_huge_log_ratios_off_and_on_actions() -> None:
    logp = torch.tensor([[0.0, 800.0, -900.0, 1000.0]], requires_grad=True)
    behavior = torch.zeros(1, 4)
    mask = torch.tensor([[1, 1, 1, 0]])
    loss, metrics = dis_policy_loss(logp, behavior, torch.ones(1), mask)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(logp.grad).all()
    assert float(metrics["masked_high_frac"]) == pytest.approx(1 / 3)
    assert float(metrics["masked_low_frac"]) == pytest.approx(1 / 3)


def _row_signed(b) -> torch.Tensor:
    """Per-token advantages of one sign per row (the outcome layout of SR-PPO's ``w (R - V)``),
    one row all zero: the PPO loss's per-row-bounds path."""
    magnitude = _advantages(b, per_token=True).abs() * b.action_mask
    signs = torch.where(torch.arange(b.logp.shape[0]) % 2 == 0, 1.0, -1.0).to(b.logp)
    signs[-1] = 0.0
    return magnitude * signs[:, None]


@on_devices_and_dtypes
@pytest.mark.parametrize("aggregation", AGGREGATIONS)
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("layout", ["row", "token", "row-signed tokens"])
def test_ppo_matches_reference(
    seed: int, aggregation: str, dtype: torch.dtype, device: str, layout: str
) -> None:
    b = random_batch(seed, dtype, device)
    adv = _row_signed(b) if layout == "row-signed tokens" else _advantages(b, layout == "token")
    metrics, [clip_frac] = _check_against_reference(
        ppo_clip_policy_loss, ref.ppo_loss, b, adv, (0.2, 0.28), aggregation
    )
    assert float(metrics["clip_frac"]) == pytest.approx(clip_frac)
    assert float(metrics["clip_frac_low"]) + float(metrics["clip_frac_high"]) == pytest.approx(
        clip_frac
    )


@on_devices_and_dtypes
@pytest.mark.parametrize("seed", SEEDS)
def test_gspo_matches_reference(seed: int, dtype: torch.dtype, device: str) -> None:
    b = random_batch(seed, dtype, device)
    # small log-ratio noise so that some sequences fall inside the narrow clip range
    behavior = b.logp + 1e-4 * (b.behavior_logp - b.logp)
    adv = _advantages(b, per_token=seed % 2 == 1)
    logp = b.logp.clone().requires_grad_()
    loss, metrics = gspo_policy_loss(logp, behavior, adv, b.action_mask, 3e-4, 4e-4)
    loss.backward()
    want, want_grad = ref.gspo_loss(
        b.logp.tolist(), behavior.tolist(), _expand(adv, b.logp), b.action_mask.tolist(), 3e-4, 4e-4
    )
    tol = tolerance(dtype)
    assert loss.item() == pytest.approx(want, rel=tol["rtol"] * 10, abs=tol["atol"] * 10)
    torch.testing.assert_close(logp.grad.cpu(), torch.tensor(want_grad, dtype=dtype), **tol)
    assert 0.0 <= float(metrics["clip_frac"]) <= 1.0


@pytest.mark.parametrize("seed", range(6))
def test_gspo_equals_sequence_level_formula(seed: int) -> None:
    """With [N] advantages GSPO-token equals the sequence-level objective (value and grad)."""
    b = random_batch(seed)
    behavior = b.logp + 3e-4 * torch.randn_like(b.logp)
    adv = grpo_advantages(b.rewards, b.group_ids) + 0.1
    mask = b.action_mask
    logp = b.logp.clone().requires_grad_()
    loss, _ = gspo_policy_loss(logp, behavior, adv, mask)
    loss.backward()
    seq = b.logp.clone().requires_grad_()
    s = (((seq - behavior) * mask).sum(1) / mask.sum(1)).exp()
    direct = -torch.minimum(s * adv, s.clamp(1 - 3e-4, 1 + 4e-4) * adv).mean()
    direct.backward()
    torch.testing.assert_close(loss, direct)
    torch.testing.assert_close(logp.grad, seq.grad)


def test_ppo_clip_hand_example() -> None:
    rho = [1.5, 0.5, 1.1, 0.7]
    logp = torch.tensor([[math.log(r) for r in rho]], dtype=torch.float64, requires_grad=True)
    adv = torch.tensor([[1.0, -1.0, 1.0, 1.0]], dtype=torch.float64)
    loss, metrics = ppo_clip_policy_loss(
        logp, torch.zeros_like(logp), adv, torch.ones(1, 4), eps_low=0.2, eps_high=0.28
    )
    loss.backward()
    # token 0 clipped at 1.28, token 1 clipped at 0.8 (A < 0), tokens 2-3 unclipped
    assert loss.item() == pytest.approx(-(1.28 - 0.8 + 1.1 + 0.7) / 4)
    assert logp.grad.tolist()[0] == pytest.approx([0.0, 0.0, -1.1 / 4, -0.7 / 4])
    assert float(metrics["clip_frac_high"]) == pytest.approx(0.25)
    assert float(metrics["clip_frac_low"]) == pytest.approx(0.25)
