"""What PACT's importance-weighted critic targets estimate, checked exactly on an enumerated tree.

Trajectory ``[a1, o, a2]`` (action mask ``[1, 0, 1]``): ``a1 ~ pi(. | root)``, a stochastic
observation ``o ~ P(. | a1)``, ``a2 ~ pi(. | a1, o)``, reward ``R(a1, o, a2) in [0, 1]``.
The batch holds every trajectory once, weighted by its probability under the old policy (the
one that produced the rollouts). PACT_SRPPO_SPEC "Exact semantics":

* ``"product"``: ``E_old[prod_{k >= j} c_k R | s_{u_j}] = V^new(s_{u_j})``;
* ``"token"``: ``E_old[c_{u_j} R | s_{u_j}] = sum_a pi_new(a | s) Q^old(s, a)`` (one step under
  the new policy, then the old one);
* ``"first_order"``: ``E_old[R (1 + sum_{k >= j} (c_k - 1))]`` is the sum of the one-step
  corrections: at the root, ``token(root) + E_old[V^new(s_{u_2})] - V^old(root)``;
* ``"none"``: ``V^old``.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from trainer.algorithms import pact_critic_targets

A = 3  # actions per step
N_OBS = 2  # observations


def _tree(seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)

    def policy(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, A, generator=gen, dtype=torch.float64).softmax(-1)

    old1, new1 = policy(), policy()
    old2, new2 = policy(A, N_OBS), policy(A, N_OBS)
    p_obs = torch.rand(A, N_OBS, generator=gen, dtype=torch.float64)
    p_obs = p_obs / p_obs.sum(-1, keepdim=True)
    reward = torch.rand(A, N_OBS, A, generator=gen, dtype=torch.float64)
    return {"old1": old1, "new1": new1, "old2": old2, "new2": new2, "obs": p_obs, "R": reward}


@pytest.mark.parametrize("seed", range(5))
def test_each_target_mode_estimates_what_the_spec_says(seed: int) -> None:
    t = _tree(seed)
    rows = list(itertools.product(range(A), range(N_OBS), range(A)))
    old_logp = torch.tensor(
        [[t["old1"][a].log(), 0.0, t["old2"][a, o, b].log()] for a, o, b in rows],
        dtype=torch.float64,
    )
    new_logp = torch.tensor(
        [[t["new1"][a].log(), 0.0, t["new2"][a, o, b].log()] for a, o, b in rows],
        dtype=torch.float64,
    )
    rewards = torch.tensor([t["R"][a, o, b] for a, o, b in rows], dtype=torch.float64)
    prob = torch.tensor(
        [t["old1"][a] * t["obs"][a, o] * t["old2"][a, o, b] for a, o, b in rows],
        dtype=torch.float64,
    )
    mask = torch.tensor([[1, 0, 1]] * len(rows))

    # exact values by enumeration
    v_old2 = (t["old2"] * t["R"]).sum(-1)  # V^old(a1, o)
    v_new2 = (t["new2"] * t["R"]).sum(-1)  # V^new(a1, o)
    q_old1 = (t["obs"] * v_old2).sum(-1)  # Q^old(root, a1)
    v_old_root = (t["old1"] * q_old1).sum()
    v_new_root = (t["new1"] * (t["obs"] * v_new2).sum(-1)).sum()
    one_step_root = (t["new1"] * q_old1).sum()

    def root_mean(mode: str) -> torch.Tensor:
        targets, _ = pact_critic_targets(rewards, new_logp, old_logp, mask, mode, 0.0, 1e9)
        return (prob * targets[:, 0]).sum()

    def second_state_means(mode: str) -> torch.Tensor:
        """``E_old[y_{u_2} | a1, o]`` for every ``(a1, o)``."""
        targets, _ = pact_critic_targets(rewards, new_logp, old_logp, mask, mode, 0.0, 1e9)
        cond = torch.tensor([t["old2"][a, o, b] for a, o, b in rows], dtype=torch.float64)
        return (cond * targets[:, 2]).view(A, N_OBS, A).sum(-1)

    torch.testing.assert_close(root_mean("product"), v_new_root)
    torch.testing.assert_close(root_mean("token"), one_step_root)
    torch.testing.assert_close(root_mean("none"), v_old_root)
    e_old_v_new2 = (t["old1"][:, None] * t["obs"] * v_new2).sum()
    torch.testing.assert_close(root_mean("first_order"), one_step_root + e_old_v_new2 - v_old_root)
    # at the last action every IS mode but "none" is the full new-policy value
    for mode in ("product", "token", "first_order"):
        torch.testing.assert_close(second_state_means(mode), v_new2)
    torch.testing.assert_close(second_state_means("none"), v_old2)
    # the modes really differ here (the checks above are not vacuous)
    assert abs(float(v_new_root - one_step_root)) > 1e-3
    assert abs(float(v_new_root - v_old_root)) > 1e-3
