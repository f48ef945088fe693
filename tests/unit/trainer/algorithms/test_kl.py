"""The optional KL term to a reference policy: k3 per token, aggregated like the policy loss."""

from __future__ import annotations

import math

import pytest
import torch

from trainer.algorithms.kl import reference_kl


def k3(logp: float, ref: float) -> float:
    r = ref - logp
    return math.exp(r) - r - 1.0


def test_k3_per_token_and_the_two_aggregations() -> None:
    # rows 0 and 1 are one trajectory (two segments), row 2 another; off-mask entries are junk
    logp = torch.tensor([[-1.0, -2.0, -9.0], [-0.5, -7.0, -7.0], [-3.0, -1.0, -0.2]])
    ref = torch.tensor([[-1.5, -1.0, 3.0], [-0.5, 5.0, 5.0], [-2.0, -1.0, -0.9]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1]], dtype=torch.bool)
    traj = torch.tensor([0, 0, 1])
    t0 = [k3(-1.0, -1.5), k3(-2.0, -1.0), k3(-0.5, -0.5)]
    t1 = [k3(-3.0, -2.0), k3(-1.0, -1.0), k3(-0.2, -0.9)]
    out = reference_kl(logp, ref, mask, traj)
    assert out.loss.item() == pytest.approx((sum(t0) / 3 + sum(t1) / 3) / 2, rel=1e-6)
    assert out.mean_kl.item() == pytest.approx((sum(t0) + sum(t1)) / 6, rel=1e-6)
    tokens = reference_kl(logp, ref, mask, traj, aggregation="token-mean")
    assert tokens.loss.item() == pytest.approx((sum(t0) + sum(t1)) / 6, rel=1e-6)
    rows = reference_kl(logp, ref, mask)  # no trajectory index: every row a trajectory
    want = (sum(t0[:2]) / 2 + t0[2] + sum(t1) / 3) / 3
    assert rows.loss.item() == pytest.approx(want, rel=1e-6)


def test_zero_at_the_reference_non_negative_and_gradient_of_k3() -> None:
    gen = torch.Generator().manual_seed(0)
    ref = -torch.rand(4, 6, generator=gen) * 3
    mask = torch.rand(4, 6, generator=gen) > 0.3
    assert reference_kl(ref.clone(), ref, mask).loss.item() == 0.0
    logp = (ref + torch.randn(4, 6, generator=gen)).requires_grad_(True)
    out = reference_kl(logp, ref, mask, aggregation="token-mean")
    assert out.loss.item() > 0
    out.loss.backward()
    # d/dlogp (e^r - r - 1) with r = ref - logp is 1 - e^r; the token mean divides by the count
    want = torch.where(mask, 1 - torch.exp(ref - logp.detach()), 0.0) / mask.sum()
    assert logp.grad is not None and torch.allclose(logp.grad, want, atol=1e-7)


def test_huge_log_ratios_stay_finite_and_bad_input_is_named() -> None:
    logp = torch.tensor([[-200.0, -1.0]])
    ref = torch.tensor([[0.0, -1.0]])
    mask = torch.ones(1, 2, dtype=torch.bool)
    assert math.isfinite(reference_kl(logp, ref, mask).loss.item())
    with pytest.raises(ValueError, match="aggregation"):
        reference_kl(logp, ref, mask, aggregation="sum")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="shape"):
        reference_kl(logp, ref[:, :1], mask)
