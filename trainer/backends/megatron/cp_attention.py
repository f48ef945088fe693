"""All-gather context parallel attention: the core attention of the local layer spec at CP > 1.

Each CP rank holds a slice of every lane (:mod:`trainer.backends.megatron.cp_layout`): its
queries, keys and values are those of its own tokens (projected, q/k-normed and rotated at
their explicit positions by megatron's ``SelfAttention``). :class:`AllGatherContextAttention`
all-gathers the keys and values of the CP group back into lane order
(:class:`GatherSequence`; its backward reduce-scatters the gradients, so each rank gets the
sum over all ranks' queries for its own keys and values) and then runs megatron's own local
``DotProductAttention`` on the local queries against every key, with the mask rows of the
local queries (``[lanes, 1, w / cp, w]``): the same scores, mask and softmax as at CP = 1, row
for row. Grouped-query attention gathers the ``ng`` key/value groups before megatron repeats
them to the query heads.

This is "all-gather CP" (Llama 3's long-context training): one gather of K and V per layer,
memory ``O(w)`` for them and ``O(w^2 / cp)`` for the scores, no ring of partial softmaxes
(TransformerEngine's ring attention overlaps the K/V exchange with compute; it is not
available on the CPU or without TE).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from megatron.core import parallel_state
from megatron.core.transformer.dot_product_attention import DotProductAttention
from torch import Tensor

from trainer.backends.megatron.cp_layout import gather_sequence, local_columns


class GatherSequence(torch.autograd.Function):
    """Forward: every CP rank's ``[s / cp, ...]`` slice gathered into the lane-ordered
    ``[s, ...]`` sequence. Backward: the gradient's slices reduce-scattered (summed over the
    ranks, each rank keeping its own)."""

    @staticmethod
    def forward(ctx: Any, local: Tensor, group: Any) -> Tensor:  # type: ignore[override]
        ctx.group = group
        cp = dist.get_world_size(group)
        parts = [torch.empty_like(local) for _ in range(cp)]
        dist.all_gather(parts, local.contiguous(), group=group)
        return gather_sequence(parts, dim=0)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:  # type: ignore[override]
        group = ctx.group
        cp = dist.get_world_size(group)
        width = grad.shape[0]
        parts = [
            grad.index_select(0, local_columns(width, cp, r, grad.device)).contiguous()
            for r in range(cp)
        ]
        out = torch.empty_like(parts[0])
        dist.reduce_scatter(out, parts, group=group)
        return out, None


def gather_keys(local: Tensor, group: Any = None) -> Tensor:
    """``local`` ``[s / cp, ...]`` gathered over the CP ``group`` (megatron's by default),
    autograd-correct (:class:`GatherSequence`)."""
    if group is None:
        group = parallel_state.get_context_parallel_group()
    if dist.get_world_size(group) == 1:
        return local
    out: Tensor = GatherSequence.apply(local, group)
    return out


class AllGatherContextAttention(DotProductAttention):
    """Megatron's local ``DotProductAttention`` over the local queries and the CP group's
    gathered keys and values (module docstring). Built by the layer spec in place of
    ``DotProductAttention`` when CP > 1; the ``TransformerConfig`` keeps
    ``context_parallel_size = 1`` (the layers see a sequence of local tokens)."""

    def forward(  # type: ignore[override]
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        attention_mask: Tensor | None,
        attn_mask_type: Any = None,
        attention_bias: Tensor | None = None,
        packed_seq_params: Any = None,
    ) -> Tensor:
        if attention_mask is None:
            raise ValueError("context-parallel attention needs the explicit packed mask")
        key, value = gather_keys(key), gather_keys(value)
        if attention_mask.shape[-2:] != (query.shape[0], key.shape[0]):
            raise ValueError(
                f"mask {tuple(attention_mask.shape)} does not cover {query.shape[0]} local "
                f"queries x {key.shape[0]} keys"
            )
        out: Tensor = super().forward(
            query, key, value, attention_mask, attn_mask_type, attention_bias, packed_seq_params
        )
        return out
