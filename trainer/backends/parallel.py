"""Data parallelism of the torch backend: which rows a rank trains, and sharding with FSDP2.

Every rank receives the same global batch. Rows are assigned by **group** (a group never spans
ranks: the objective pairs its members), groups longest first to the rank with the fewest
tokens so far. Each rank forwards its rows; the per-token outputs are summed across ranks
(each row is non-zero on exactly one rank), so every rank computes the same whole-batch
objective and backpropagates its own rows' share of the gradient. FSDP2 (``fully_shard``)
shards parameters, gradients and AdamW states; its reduce-scatter sums gradients (divide
factor 1), so the update equals the single-process update on the global batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from trainer.data import TrainBatch


@dataclass(frozen=True)
class DataParallel:
    """This process's place in the data-parallel group (``world == 1``: no distribution)."""

    rank: int = 0
    world: int = 1
    group: Any = None  # the process group of the data-parallel ranks (None: the whole world)

    @classmethod
    def current(cls) -> DataParallel:
        if dist.is_available() and dist.is_initialized():
            return cls(dist.get_rank(), dist.get_world_size())
        return cls()

    @classmethod
    def of_group(cls, group: Any) -> DataParallel:
        """This process's place in ``group`` (e.g. megatron's data-parallel group, whose ranks
        each hold a whole model replica of several tensor-parallel ranks)."""
        return cls(dist.get_rank(group), dist.get_world_size(group), group)

    @property
    def enabled(self) -> bool:
        return self.world > 1

    def rows(self, batch: TrainBatch) -> list[int]:
        """The batch rows this rank trains (whole groups, token-balanced, deterministic)."""
        if not self.enabled:
            return list(range(batch.num_rows))
        lengths = batch.seq_lengths.tolist()
        groups: dict[int, list[int]] = {}
        for row, group in enumerate(batch.group_ids.tolist()):
            groups.setdefault(group, []).append(row)
        load = [0] * self.world
        mine: list[int] = []
        order = sorted(groups.items(), key=lambda kv: (-sum(lengths[r] for r in kv[1]), kv[0]))
        for _, rows in order:
            target = min(range(self.world), key=lambda k: (load[k], k))
            load[target] += sum(lengths[r] for r in rows)
            if target == self.rank:
                mine.extend(rows)
        return sorted(mine)

    def sum(self, tensor: Tensor) -> Tensor:
        """Sum over ranks, in place (identity without distribution)."""
        if self.enabled:
            dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=self.group)
        return tensor

    def max_int(self, value: int) -> int:
        if not self.enabled:
            return value
        t = torch.tensor([value], dtype=torch.long)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.group)
        return int(t.item())


def shard(model: nn.Module, layers: nn.ModuleList) -> None:
    """FSDP2 over ``layers`` (one unit each) and the rest of ``model``; gradients summed."""
    from torch.distributed.fsdp import fully_shard

    for layer in layers:
        fully_shard(layer)
    fully_shard(model)
    for module in (*layers, model):
        module.set_gradient_divide_factor(1.0)  # type: ignore[operator]
        module.set_force_sum_reduction_for_comms(True)  # type: ignore[operator]  # gloo: SUM


def full_tensor(tensor: Tensor) -> Tensor:
    """The whole tensor of a (possibly sharded) parameter; a collective for DTensors."""
    full = getattr(tensor, "full_tensor", None)
    return full() if callable(full) else tensor
