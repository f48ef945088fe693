"""Rows -> trajectories: a trajectory with several segments has several rows.

Group statistics (GRPO's group sizes, mean and sigma, Eq. 2), the per-trajectory ``1/sum(m)``
weight of Eq. 1 and the readiness gate's statistics (Eq. 12-13) count trajectories, not rows
(issue 10, "Rows vs trajectories"). :func:`trajectory_rows` maps the rows of a batch to their
trajectories once; the objectives compute per-trajectory quantities on ``[K]`` tensors and
broadcast them back to the rows with ``inverse``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from trainer.algorithms.validation import require_ndim


@dataclass(frozen=True)
class Trajectories:
    """The trajectories of a batch of ``N`` rows.

    Attributes:
        inverse: ``[N]`` long, the dense trajectory index (``0..K-1``) of each row.
        last_row: ``[K]`` long, each trajectory's last row (its last segment: rows of one
            trajectory are in segment order, as :func:`trainer.data.build_batch` makes them).
        rewards: ``[K]`` the trajectories' outcome rewards.
        group_ids: ``[K]`` the trajectories' group ids.
        one_row_each: True when every row is its own trajectory (``inverse`` is ``0..N-1``).
    """

    inverse: Tensor
    last_row: Tensor
    rewards: Tensor
    group_ids: Tensor
    one_row_each: bool

    @property
    def count(self) -> int:
        return int(self.rewards.shape[0])

    @property
    def row_index(self) -> Tensor | None:
        """What the policy losses take as ``trajectory_index``: None when rows are trajectories."""
        return None if self.one_row_each else self.inverse

    def to_rows(self, per_trajectory: Tensor) -> Tensor:
        """``[K, ...]`` -> ``[N, ...]``: each row gets its trajectory's value."""
        return per_trajectory if self.one_row_each else per_trajectory[self.inverse]

    def last(self, per_row: Tensor) -> Tensor:
        """``[N, ...]`` -> ``[K, ...]``: each trajectory's value on its last row."""
        return per_row if self.one_row_each else per_row[self.last_row]


def trajectory_rows(
    trajectory_index: Tensor | None, rewards: Tensor, group_ids: Tensor
) -> Trajectories:
    """Index the trajectories of ``N`` rows; ``trajectory_index`` None: one row each.

    ``trajectory_index`` is ``[N]`` non-negative integers (any ids: equal ids = same
    trajectory). Rows of one trajectory must share its reward and group id (a ValueError
    otherwise: the segments of one trajectory have one outcome and one prompt).
    """
    n = rewards.shape[0]
    if trajectory_index is None:
        inverse = torch.arange(n, device=rewards.device)
        return Trajectories(inverse, inverse, rewards, group_ids, True)
    require_ndim("trajectory_index", trajectory_index, 1, "[N]")
    if trajectory_index.dtype == torch.bool or trajectory_index.is_floating_point():
        raise ValueError(f"trajectory_index must be integer, got {trajectory_index.dtype}")
    if trajectory_index.shape[0] != n:
        raise ValueError(
            f"shape mismatch: trajectory_index has {trajectory_index.shape[0]} entries, "
            f"rewards has {n}"
        )
    if trajectory_index.device != rewards.device:
        raise ValueError("trajectory_index must be on the rewards' device")
    if n and bool((trajectory_index < 0).any()):
        raise ValueError("trajectory_index must be non-negative")
    _, inverse = torch.unique(trajectory_index, return_inverse=True)
    k = int(inverse.max()) + 1 if n else 0
    if k == n:  # every row its own trajectory: keep the row order (no permutation)
        rows = torch.arange(n, device=rewards.device)
        return Trajectories(rows, rows, rewards, group_ids, True)
    rows = torch.arange(n, device=rewards.device)
    last_row = torch.full((k,), -1, dtype=torch.long, device=rewards.device)
    last_row = last_row.scatter_reduce(0, inverse, rows, reduce="amax", include_self=False)
    traj_rewards, traj_groups = rewards[last_row], group_ids[last_row]
    if not torch.equal(traj_rewards[inverse], rewards):
        raise ValueError("rows of one trajectory must share its reward")
    if not torch.equal(traj_groups[inverse], group_ids):
        raise ValueError("rows of one trajectory must share its group id")
    return Trajectories(inverse, last_row, traj_rewards, traj_groups, False)


def require_dense_trajectory_index(trajectory_index: Tensor, like: Tensor) -> None:
    """A ValueError unless ``trajectory_index`` is ``[N]`` integers covering ``0..K-1``
    (``N`` = rows of ``like``, on its device): the form the pure functions take."""
    n = like.shape[0]
    if trajectory_index.dtype == torch.bool or trajectory_index.is_floating_point():
        raise ValueError(f"trajectory_index must be integer, got {trajectory_index.dtype}")
    if tuple(trajectory_index.shape) != (n,):
        raise ValueError(
            f"shape mismatch: trajectory_index{tuple(trajectory_index.shape)} vs {n} rows"
        )
    if trajectory_index.device != like.device:
        raise ValueError("trajectory_index must be on the same device as the batch")
    if n == 0:
        return
    if bool((trajectory_index < 0).any()) or bool((trajectory_index >= n).any()):
        raise ValueError("trajectory_index must be dense: 0..K-1")
    present = torch.zeros(n, dtype=torch.bool, device=trajectory_index.device)
    present[trajectory_index] = True
    if not bool(present[: int(trajectory_index.max()) + 1].all()):
        raise ValueError("trajectory_index must be dense: 0..K-1")


def per_trajectory_sum(per_row: Tensor, trajectories: Tensor, count: int) -> Tensor:
    """``[N]`` -> ``[K]``: the sum over each trajectory's rows (``trajectories`` dense)."""
    return per_row.new_zeros(count).index_add_(0, trajectories, per_row)
