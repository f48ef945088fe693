"""Monte-Carlo check of Proposition 1 (Eq. 15) through the library's critic-target pipeline.

Toy two-step process per trajectory, serialised as ``[a1, obs, a2]`` with action mask
``[1, 0, 1]``: the first action is 1 with probability ``q``; the environment appends an
observation token; the second action is 1 with probability ``x[a1]`` and the outcome reward is
that second action. Hence ``V(s_2) = x[a1]`` at the state before ``a2`` and
``p = V(s_0) = q x[1] + (1 - q) x[0]``. Groups of ``n`` independent trajectories go through
``skip_observation_gae`` (lambda = 1 returns) and ``group_residual_targets``; on mixed groups
(``keep``) the mean centred target at a state must match
``F*(s) = (n - 1)(V(s) - p) / (n [1 - V p^(n-1) - (1 - V)(1 - p)^(n-1)])``.
"""

from __future__ import annotations

import pytest
import torch

from trainer.algorithms import (
    group_residual_targets,
    skip_observation_gae,
    terminal_reward_tokens,
)

N_GROUP = 4
GROUPS = 60_000
Q = 0.4
X = (0.2, 0.7)
P = Q * X[1] + (1 - Q) * X[0]


def f_star(v: float, p: float = P, n: int = N_GROUP) -> float:
    """Eq. 15."""
    return (n - 1) * (v - p) / (n * (1 - v * p ** (n - 1) - (1 - v) * (1 - p) ** (n - 1)))


def _sample() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1234)
    rows = GROUPS * N_GROUP
    a1 = (torch.rand(rows, generator=gen, dtype=torch.float64) < Q).long()
    success = torch.tensor(X, dtype=torch.float64)[a1]
    a2 = (torch.rand(rows, generator=gen, dtype=torch.float64) < success).long()
    tokens = torch.stack((a1, torch.full_like(a1, 5), a2), dim=1)
    return tokens, a1, a2.to(torch.float64)


@pytest.mark.slow  # Monte-Carlo estimate
def test_mean_centred_target_on_mixed_groups_matches_f_star() -> None:
    tokens, a1, rewards = _sample()
    rows = tokens.shape[0]
    mask = torch.tensor([[1, 0, 1]]).expand(rows, 3)
    group_ids = torch.arange(rows) // N_GROUP
    values = torch.randn(rows, 3, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    _, returns = skip_observation_gae(
        terminal_reward_tokens(rewards, mask), values, mask, gamma=1.0, lam=1.0
    )
    targets, keep = group_residual_targets(returns, rewards, group_ids, mask)
    for branch in (0, 1):
        picked = targets[keep & (a1 == branch), 2]  # the state before a2 has V = X[branch]
        stderr = float(picked.std()) / picked.numel() ** 0.5
        assert abs(float(picked.mean()) - f_star(X[branch])) < 4 * stderr
        # and the unconditioned mean (n-1)/n (V - p) is rejected: the mixed-group
        # conditioning of Eq. 15 is what the pipeline implements
        naive = (N_GROUP - 1) / N_GROUP * (X[branch] - P)
        assert abs(float(picked.mean()) - naive) > 6 * stderr
    root = targets[keep, 0]  # the root state: F*(s_0) = 0 for every p
    assert abs(float(root.mean())) < 4 * float(root.std()) / root.numel() ** 0.5


def test_f_star_closed_form_values() -> None:
    """Sanity of the formula used above (hand-computed for n = 4, p = 0.4)."""
    assert abs(P - 0.4) < 1e-12
    assert f_star(0.7) == pytest.approx(0.9 / (4 * 0.8904), rel=1e-9)
    assert f_star(0.2) == pytest.approx(-0.6 / (4 * 0.8144), rel=1e-9)
    assert f_star(P) == pytest.approx(0.0)
