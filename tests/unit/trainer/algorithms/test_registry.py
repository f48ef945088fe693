"""Algorithms, estimators and policy losses are chosen by name: a registered one is used by
``compute_objective`` without an edit there, and an unknown name lists the known ones."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from trainer.algorithms import (
    ALGORITHM_REGISTRY,
    ESTIMATORS,
    POLICY_LOSSES,
    Estimate,
    ObjectiveBatch,
    Registry,
    compute_objective,
    register_composed,
)
from trainer.algorithms.baselines import import_baselines

# two rows (trajectories) of one group; action tokens: 2 in row 0, 1 in row 1
TOKENS = torch.tensor([[1, 2, 3], [4, 5, -1]])
MASK = torch.tensor([[True, False, True], [True, False, False]])
REWARDS = torch.tensor([1.0, 0.0])
GROUPS = torch.tensor([0, 0])


def _batch(logp_shift: float = 0.0) -> ObjectiveBatch:
    behavior = torch.tensor([[-0.5, -0.1, -0.2], [-0.3, -0.4, 0.0]])
    logp = (behavior + logp_shift * MASK).requires_grad_()
    return ObjectiveBatch(TOKENS, MASK, GROUPS, REWARDS, behavior, logp)


@pytest.fixture
def registered() -> Iterator[list[tuple[Registry, str]]]:
    """Names registered by a test, removed afterwards (the registries are global)."""
    added: list[tuple[Registry, str]] = []
    yield added
    for registry, name in added:
        registry.unregister(name)


def test_a_registered_estimator_is_used_by_compute_objective(registered) -> None:
    @ESTIMATORS.register("test_reward_as_advantage")
    def reward_as_advantage(batch, config, all_reduce=None) -> Estimate:
        return Estimate(batch.rewards * 3.0, None, "test_reward_as_advantage")

    registered.append((ESTIMATORS, "test_reward_as_advantage"))
    register_composed("test_baseline", "test_reward_as_advantage", "ppo_clip")
    registered.append((ALGORITHM_REGISTRY, "test_baseline"))
    result = compute_objective("test_baseline", _batch())
    # rho = 1 everywhere: J = mean_i A_i = (3 + 0) / 2, loss = -J
    assert float(result.actor_loss.detach()) == pytest.approx(-1.5)
    assert result.estimator == "test_reward_as_advantage"
    assert result.critic_loss is None


def test_a_registered_policy_loss_is_used_by_compute_objective(registered) -> None:
    @POLICY_LOSSES.register("test_linear")
    def linear(batch, reference_logp, advantages, config, aggregation):
        # -sum_t m_t (logp_t - ref_t) A_i: a surrogate with the policy gradient at rho = 1
        diff = (batch.logp - reference_logp) * batch.action_mask
        per_row = diff.sum(dim=1) * advantages
        return -per_row.sum(), {"rows": torch.tensor(float(per_row.shape[0]))}

    registered.append((POLICY_LOSSES, "test_linear"))
    register_composed("test_linear_grpo", "grpo", "test_linear")
    registered.append((ALGORITHM_REGISTRY, "test_linear_grpo"))
    result = compute_objective("test_linear_grpo", _batch(logp_shift=0.25))
    # GRPO on R = (1, 0): A = (+-0.5) / (sqrt(0.5) + 1e-6); row 0 has 2 shifted tokens,
    # row 1 one: J = 0.25 * (2 a - a) = 0.25 a
    a = 0.5 / (0.5**0.5 + 1e-6)
    assert float(result.actor_loss.detach()) == pytest.approx(-0.25 * a, rel=1e-6)
    assert result.metrics["actor/rows"] == 2.0
    assert result.estimator == "grpo"


def test_an_unknown_algorithm_lists_the_known_ones() -> None:
    with pytest.raises(ValueError) as error:
        compute_objective("ppo", _batch())  # type: ignore[arg-type]
    message = str(error.value)
    assert "unknown algorithm 'ppo'" in message
    for name in ("dapo", "grpo", "gspo", "li2sao", "lisao", "pact", "srppo"):
        assert name in message


def test_an_unknown_estimator_or_loss_of_a_composition_lists_the_known_ones(registered) -> None:
    register_composed("test_missing_parts", "nope", "ppo_clip")
    registered.append((ALGORITHM_REGISTRY, "test_missing_parts"))
    with pytest.raises(ValueError, match=r"unknown advantage estimator 'nope'; known: gae, grpo"):
        compute_objective("test_missing_parts", _batch())
    register_composed("test_missing_loss", "grpo", "nope")
    registered.append((ALGORITHM_REGISTRY, "test_missing_loss"))
    with pytest.raises(ValueError, match=r"unknown policy loss 'nope'; known: dis, gspo, ppo_clip"):
        compute_objective("test_missing_loss", _batch())


def test_a_name_cannot_be_registered_twice_by_accident() -> None:
    with pytest.raises(ValueError, match="already registered"):
        register_composed("grpo", "grpo", "dis")
    with pytest.raises(ValueError, match="non-empty string"):
        ESTIMATORS.register("")
    assert compute_objective("grpo", _batch()).estimator == "grpo"  # unchanged


def test_a_baselines_package_registers_its_modules_on_import(
    tmp_path, monkeypatch, registered
) -> None:
    package = tmp_path / "test_extra_baselines"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "constant.py").write_text(
        "from trainer.algorithms import ESTIMATORS, Estimate, register_composed\n"
        "\n"
        "@ESTIMATORS.register('test_constant')\n"
        "def constant(batch, config, all_reduce=None):\n"
        "    return Estimate(batch.rewards * 0 - 1.0, None, 'test_constant')\n"
        "\n"
        "register_composed('test_constant', 'test_constant', 'dis')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert import_baselines("test_extra_baselines") == ["constant"]
    registered += [(ESTIMATORS, "test_constant"), (ALGORITHM_REGISTRY, "test_constant")]
    # DIS at rho = 1 with A = -1 on every row: J = -1, loss = 1
    assert float(compute_objective("test_constant", _batch()).actor_loss.detach()) == 1.0
