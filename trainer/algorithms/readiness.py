"""Critic readiness (Eq. 12-13) and the one-way switch from group sampling to single rollout.

:func:`readiness_statistics` reduces a batch to additive sufficient statistics, so data-parallel
ranks can sum them (``merge`` or an all-reduce of ``to_tensor()``) before the driver computes
the explained variance and the ranking accuracy. :class:`ReadinessGate` smooths both with an
EMA, counts consecutive ready steps after ``t_min`` and switches once, forever (section 4.2,
Algorithm 1).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any

import torch
from torch import Tensor

from trainer.algorithms.groups import cross_outcome_pairs, group_all_equal, group_index, group_mean
from trainer.algorithms.validation import (
    require_floating,
    require_group_ids,
    require_ndim,
    require_positive,
    require_rewards,
    require_same_device,
    require_same_shape,
    require_unit_interval,
)


@dataclass(frozen=True)
class ReadinessStats:
    """Additive statistics of one batch (or shard) over the members of mixed groups.

    With ``Z_i = R_i - mu_g`` and ``V_i`` the terminal value: the count of members, sums and
    sums of squares of ``Z`` and of the residual ``Z - V``, the number of cross-outcome pairs
    and of pairs ordered correctly (``V(i+) > V(i-)``, ties count as wrong).
    """

    count: int = 0
    sum_z: float = 0.0
    sumsq_z: float = 0.0
    sum_residual: float = 0.0
    sumsq_residual: float = 0.0
    pairs: int = 0
    correct_pairs: int = 0

    def merge(self, other: ReadinessStats) -> ReadinessStats:
        """Statistics of the union of two disjoint shards (field-wise sum)."""
        return ReadinessStats(
            **{f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)}
        )

    def to_tensor(self, device: torch.device | str | None = None) -> Tensor:
        """``[7]`` float64 tensor of the fields, for a SUM all-reduce across ranks."""
        return torch.tensor(
            [float(getattr(self, f.name)) for f in fields(self)], dtype=torch.float64, device=device
        )

    @classmethod
    def from_tensor(cls, tensor: Tensor) -> ReadinessStats:
        """Inverse of :meth:`to_tensor` (counts are rounded back to integers)."""
        values = tensor.detach().to("cpu", torch.float64).tolist()
        names = [f.name for f in fields(cls)]
        if len(values) != len(names):
            raise ValueError(f"expected {len(names)} statistics, got {len(values)}")
        ints = {"count", "pairs", "correct_pairs"}
        return cls(**{k: round(v) if k in ints else v for k, v in zip(names, values, strict=True)})

    @property
    def explained_variance(self) -> float | None:
        """Eq. 12: ``1 - Var[Z - V] / Var[Z]`` (population variances); None without mixed groups."""
        if self.count == 0:
            return None
        n = float(self.count)
        var_z = self.sumsq_z / n - (self.sum_z / n) ** 2
        if var_z <= 0.0:
            return None
        var_residual = max(self.sumsq_residual / n - (self.sum_residual / n) ** 2, 0.0)
        return 1.0 - var_residual / var_z  # Eq. 12 (LI2SAO_SPEC "Readiness gate")

    @property
    def ranking_accuracy(self) -> float | None:
        """Eq. 13: fraction of cross-outcome pairs with ``V(i+) > V(i-)``; None without pairs."""
        if self.pairs == 0:
            return None
        return self.correct_pairs / self.pairs  # Eq. 13


def readiness_statistics(
    terminal_values: Tensor, rewards: Tensor, group_ids: Tensor, *, check: bool = True
) -> ReadinessStats:
    """Sufficient statistics of Eq. 12-13 for one batch (float64, one host synchronisation)."""
    if check:
        require_floating("terminal_values", terminal_values)
        require_ndim("terminal_values", terminal_values, 1, "[N]")
        require_rewards(rewards)
        require_same_shape(terminal_values=terminal_values, rewards=rewards)
        require_group_ids(group_ids, rewards.shape[0])
        require_same_device(terminal_values=terminal_values, rewards=rewards, group_ids=group_ids)
    r = rewards.detach().to(torch.float64)
    v = terminal_values.detach().to(torch.float64)
    index = group_index(group_ids)
    mixed = ~group_all_equal(r, index)[index.inverse]
    z = torch.where(mixed, r - group_mean(r, index)[index.inverse], 0.0)  # Z_i = R_i - mu_g
    residual = torch.where(mixed, z - v, 0.0)
    hi, lo = cross_outcome_pairs(r, index)
    totals = torch.stack(
        (
            torch.count_nonzero(mixed).to(torch.float64),
            z.sum(),
            (z * z).sum(),
            residual.sum(),
            (residual * residual).sum(),
            torch.tensor(float(hi.shape[0]), dtype=torch.float64, device=r.device),
            torch.count_nonzero(v[hi] > v[lo]).to(torch.float64),
        )
    ).tolist()
    return ReadinessStats(
        count=round(totals[0]),
        sum_z=totals[1],
        sumsq_z=totals[2],
        sum_residual=totals[3],
        sumsq_residual=totals[4],
        pairs=round(totals[5]),
        correct_pairs=round(totals[6]),
    )


@dataclass(frozen=True)
class GateConfig:
    """Readiness-gate hyper-parameters (defaults: the paper's main configuration)."""

    beta: float = 0.9
    eta_e: float = 0.2
    eta_a: float = 0.65
    consecutive: int = 10
    t_min: int = 60
    t_max: int = 150


class ReadinessGate:
    """EMA readiness gate with a consecutive-steps counter and a ``t_max`` fallback.

    Per step ``k`` (Algorithm 1): the EMAs ``e_bar``, ``a_bar`` start at the first observed
    value and then follow ``x_bar = beta * x_bar + (1 - beta) * x``; a step without mixed groups
    keeps them and counts as not ready. ``counter`` grows by one when ``k >= t_min`` and
    ``e_bar > eta_e`` and ``a_bar > eta_a``, else drops to 0. The gate switches when
    ``counter >= consecutive`` or ``k >= t_max`` and then stays switched (``update`` keeps
    returning True and changes nothing). Steps must strictly increase.
    """

    STATE_VERSION = 1

    def __init__(
        self,
        beta: float = 0.9,
        eta_e: float = 0.2,
        eta_a: float = 0.65,
        consecutive: int = 10,
        t_min: int = 60,
        t_max: int = 150,
    ) -> None:
        if not isinstance(beta, (int, float)) or not 0 <= beta < 1:
            raise ValueError(f"beta must lie in [0, 1), got {beta!r}")
        if not isinstance(eta_e, (int, float)) or not math.isfinite(eta_e):
            raise ValueError(f"eta_e must be a finite number, got {eta_e!r}")
        require_unit_interval("eta_a", eta_a)
        for name, value in (("consecutive", consecutive), ("t_min", t_min), ("t_max", t_max)):
            if not isinstance(value, int) or isinstance(value, bool):
                raise ValueError(f"{name} must be an int, got {value!r}")
        require_positive("consecutive", consecutive)
        require_positive("t_min", t_min, allow_zero=True)
        if t_max < t_min:
            raise ValueError(f"t_max ({t_max}) must be >= t_min ({t_min})")
        self.config = GateConfig(beta, eta_e, eta_a, consecutive, t_min, t_max)
        self.e_bar: float | None = None
        self.a_bar: float | None = None
        self.counter = 0
        self.switched = False
        self.switch_step: int | None = None
        self.last_step: int | None = None

    def update(self, step: int, stats: ReadinessStats) -> bool:
        """Feed step ``step``'s (all-reduced) statistics; return True once switched."""
        if not isinstance(stats, ReadinessStats):
            raise ValueError(f"stats must be ReadinessStats, got {type(stats).__name__}")
        return self.observe(step, stats.explained_variance, stats.ranking_accuracy)

    def observe(self, step: int, e: float | None, a: float | None) -> bool:
        """:meth:`update` from the two values (``e_k``, ``a_k``; None: no mixed group), as a
        driver reads them from a backend's step metrics; return True once switched."""
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            raise ValueError(f"step must be a non-negative int, got {step!r}")
        if self.last_step is not None and step <= self.last_step:
            raise ValueError(f"steps must increase: got {step} after {self.last_step}")
        for name, value in (("e", e), ("a", a)):
            if value is not None and not (isinstance(value, (int, float)) and math.isfinite(value)):
                raise ValueError(f"{name} must be a finite number or None, got {value!r}")
        self.last_step = step
        if self.switched:
            return True
        cfg = self.config
        if e is None or a is None:
            ready = False  # no mixed group: keep the EMA, count as not ready
        else:
            self.e_bar = e if self.e_bar is None else cfg.beta * self.e_bar + (1 - cfg.beta) * e
            self.a_bar = a if self.a_bar is None else cfg.beta * self.a_bar + (1 - cfg.beta) * a
            ready = step >= cfg.t_min and self.e_bar > cfg.eta_e and self.a_bar > cfg.eta_a
        self.counter = self.counter + 1 if ready else 0
        if self.counter >= cfg.consecutive or step >= cfg.t_max:  # Algorithm 1: one-way switch
            self.switched = True
            self.switch_step = step
        return self.switched

    def state_dict(self) -> dict[str, Any]:
        """Trainer state to checkpoint (the switch must survive restarts)."""
        return {
            "version": self.STATE_VERSION,
            "e_bar": self.e_bar,
            "a_bar": self.a_bar,
            "counter": self.counter,
            "switched": self.switched,
            "switch_step": self.switch_step,
            "last_step": self.last_step,
            "config": asdict(self.config),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the state saved by :meth:`state_dict` (the hyper-parameters stay this gate's)."""
        expected = {"version", "e_bar", "a_bar", "counter", "switched", "switch_step", "last_step"}
        missing = expected - set(state)
        if missing:
            raise ValueError(f"gate state is missing {sorted(missing)}")
        if state["version"] != self.STATE_VERSION:
            raise ValueError(f"unsupported gate state version {state['version']!r}")
        if not isinstance(state["switched"], bool):
            raise ValueError("gate state 'switched' must be a bool")
        if not isinstance(state["counter"], int) or state["counter"] < 0:
            raise ValueError("gate state 'counter' must be a non-negative int")
        for key in ("e_bar", "a_bar"):
            if state[key] is not None and not isinstance(state[key], (int, float)):
                raise ValueError(f"gate state {key!r} must be a number or None")
        for key in ("switch_step", "last_step"):
            if state[key] is not None and not isinstance(state[key], int):
                raise ValueError(f"gate state {key!r} must be an int or None")
        if state["switched"] and state["switch_step"] is None:
            raise ValueError("gate state says switched but has no switch_step")
        self.e_bar = None if state["e_bar"] is None else float(state["e_bar"])
        self.a_bar = None if state["a_bar"] is None else float(state["a_bar"])
        self.counter = state["counter"]
        self.switched = state["switched"]
        self.switch_step = state["switch_step"]
        self.last_step = state["last_step"]
