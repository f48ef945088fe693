"""The lr multiplier per optimizer step: warm-up, then flat, linear or cosine decay to a floor."""

from __future__ import annotations

import itertools
import math

import pytest
from pydantic import ValidationError

from trainer.backends.lr_schedule import lr_lambda, lr_multiplier
from trainer.config import OptimizerConfig


def opt(**kw: object) -> OptimizerConfig:
    return OptimizerConfig(lr=1e-3, **kw)


def test_constant_is_flat_after_a_linear_warm_up() -> None:
    cfg = opt(warmup_steps=4)
    assert [lr_multiplier(cfg, n) for n in range(6)] == pytest.approx(
        [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    )
    assert [lr_multiplier(opt(), n) for n in (0, 1, 1000)] == [1.0, 1.0, 1.0]


def test_linear_decays_to_the_floor_and_stays() -> None:
    cfg = opt(schedule="linear", decay_steps=4, min_lr_ratio=0.2)
    # 1 -> 0.2 in 4 equal steps of 0.2, then the floor
    assert [lr_multiplier(cfg, n) for n in range(7)] == pytest.approx(
        [1.0, 0.8, 0.6, 0.4, 0.2, 0.2, 0.2]
    )


def test_cosine_hits_its_closed_form_points() -> None:
    cfg = opt(schedule="cosine", decay_steps=8, min_lr_ratio=0.1, warmup_steps=2)
    values = [lr_multiplier(cfg, n) for n in range(14)]
    assert values[:2] == pytest.approx([0.5, 1.0])  # warm-up
    assert values[2] == pytest.approx(1.0)  # the decay starts at the peak
    assert values[2 + 4] == pytest.approx(0.55)  # halfway: (1 + floor) / 2
    # a quarter of the way: floor + (1 - floor) (1 + cos(pi/4)) / 2
    assert values[2 + 2] == pytest.approx(0.1 + 0.9 * (1 + math.sqrt(0.5)) / 2)
    assert values[10:] == pytest.approx([0.1] * 4)  # the floor from the end of the decay on
    decay = values[2:11]
    assert all(a > b for a, b in itertools.pairwise(decay))  # strictly decreasing


def test_zero_floor_reaches_zero_and_the_lambda_matches() -> None:
    cfg = opt(schedule="cosine", decay_steps=3)
    assert lr_multiplier(cfg, 3) == pytest.approx(0.0, abs=1e-12)
    f = lr_lambda(cfg)
    assert [f(n) for n in range(5)] == [lr_multiplier(cfg, n) for n in range(5)]


def test_negative_step_is_an_error() -> None:
    with pytest.raises(ValueError, match="optimizer step"):
        lr_multiplier(opt(), -1)


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"schedule": "cosine"}, "needs decay_steps > 0"),
        ({"schedule": "linear", "decay_steps": 0}, "needs decay_steps > 0"),
        ({"decay_steps": 5}, "only apply to schedule linear or cosine"),
        ({"min_lr_ratio": 0.1}, "only apply to schedule linear or cosine"),
        ({"schedule": "cosine", "decay_steps": 5, "min_lr_ratio": 1.5}, "less than or equal"),
        ({"schedule": "step", "decay_steps": 5}, "schedule"),
    ],
)
def test_bad_schedules_are_clear_errors(kw: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        opt(**kw)
