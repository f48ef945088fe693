"""PyTorch's fused attention as the core attention of the local layer spec (no TransformerEngine).

megatron-core's local ``DotProductAttention`` computes the scores of every query against every
key of the sequence (``[lanes x heads, w, w]``), masks them with the dense block-diagonal causal
mask and takes a softmax: over a packed 7.6k-token lane that is most of a step on the CPU.
:class:`SdpaAttention` computes the same attention with
``torch.nn.functional.scaled_dot_product_attention`` once per packed row (a segment of a lane)
with ``is_causal=True``: the fused kernel (flash attention on the CPU and on CUDA) and only
the scores inside each row, which are the only ones the mask lets through. A dense boolean
mask over the whole lane would not take PyTorch's fused path, so the rows come in as
cumulative lengths (megatron's ``PackedSeqParams``, :func:`lane_segments`), not as a mask.

The layout: megatron's ``sbhd`` (``[w, lanes, heads, head_dim]``) with ``cu_seqlens`` over the
lanes laid end to end (lane 0's columns, then lane 1's ...; every lane boundary is a segment
boundary), or ``thd`` (``[tokens, heads, head_dim]``, the layout TransformerEngine takes).
Without packed-sequence params it is plain causal attention over each lane. Grouped-query
attention maps query head ``i`` to key/value group ``i // (heads / groups)``, as megatron's
``repeat_interleave`` does; the softmax scale is megatron's. What the local attention would do
differently is refused when the module is built: attention dropout, a sliding window, a
softmax other than the vanilla one, a mask type other than causal.

:func:`resolve_attention` picks the core attention of the builder
(:func:`trainer.backends.megatron.model.build_gpt`): ``"auto"`` is this module where
TransformerEngine is not importable and megatron's local attention where it is; context
parallel keeps its own (:mod:`trainer.backends.megatron.cp_attention`).
"""

from __future__ import annotations

import importlib.util
import itertools
from typing import Any, Literal

import torch
import torch.nn.functional as F
from megatron.core.packed_seq_params import PackedSeqParams
from megatron.core.transformer.dot_product_attention import DotProductAttention
from megatron.core.transformer.enums import AttnMaskType
from torch import Tensor

AttentionChoice = Literal["auto", "sdpa", "local"]
ATTENTION_CHOICES: tuple[AttentionChoice, ...] = ("auto", "sdpa", "local")


def transformer_engine_available() -> bool:
    """Whether TransformerEngine is importable in this environment."""
    return importlib.util.find_spec("transformer_engine") is not None


def resolve_attention(choice: AttentionChoice) -> Literal["sdpa", "local"]:
    """The core attention ``choice`` names: ``"auto"`` is ``"sdpa"`` without TransformerEngine,
    ``"local"`` (megatron's ``DotProductAttention``) with it."""
    if choice not in ATTENTION_CHOICES:
        raise ValueError(f"attention {choice!r} is not one of {ATTENTION_CHOICES}")
    if choice == "auto":
        return "local" if transformer_engine_available() else "sdpa"
    return choice


def lane_segments(position_ids: Tensor) -> PackedSeqParams:
    """The packed rows of ``[lanes, w]`` lanes as megatron packed-sequence params for
    :class:`SdpaAttention`: ``sbhd`` layout, ``cu_seqlens`` (int32) over the lanes laid end to
    end. A row starts where the positions restart at 0 and at every lane's first column: the
    rows of :func:`~trainer.backends.megatron.cp_layout.packed_attention_mask`."""
    starts = position_ids == 0
    starts[:, 0] = True
    flat = starts.reshape(-1).nonzero().flatten()
    total = flat.new_tensor([position_ids.numel()])
    cu = torch.cat([flat, total]).to(torch.int32)
    longest = int((cu[1:] - cu[:-1]).max())
    return PackedSeqParams(
        qkv_format="sbhd",
        cu_seqlens_q=cu,
        cu_seqlens_kv=cu,
        max_seqlen_q=longest,
        max_seqlen_kv=longest,
    )


def _segment_lengths(params: PackedSeqParams, tokens: int) -> list[int]:
    """The rows' lengths from ``params.cu_seqlens_q``, checked against ``tokens``."""
    cu = params.cu_seqlens_q
    if cu is None:
        raise ValueError("packed-sequence params without cu_seqlens_q: the rows are unknown")
    kv = params.cu_seqlens_kv
    if kv is not None and kv is not cu and not torch.equal(kv, cu):
        raise ValueError("cu_seqlens_kv differs from cu_seqlens_q: self-attention only")
    for padded in (params.cu_seqlens_q_padded, params.cu_seqlens_kv_padded):
        if padded is not None and not torch.equal(padded, cu):
            raise ValueError("padded cu_seqlens are not supported by the SDPA core attention")
    bounds = [int(b) for b in cu.tolist()]
    if bounds[0] != 0 or bounds[-1] != tokens:
        raise ValueError(
            f"cu_seqlens run from {bounds[0]} to {bounds[-1]}; the sequence holds {tokens} "
            "tokens (cu_seqlens must start at 0 and end at the token count)"
        )
    lengths = [b - a for a, b in itertools.pairwise(bounds)]
    if min(lengths) < 1:
        raise ValueError("cu_seqlens must increase strictly (an empty row)")
    return lengths


class SdpaAttention(DotProductAttention):
    """Megatron's ``DotProductAttention`` interface over PyTorch's fused causal attention, one
    call per packed row (module docstring). Built by the layer spec in place of
    ``DotProductAttention``; same constructor, same (empty) state dict."""

    def __init__(self, config: Any, layer_number: int, attn_mask_type: Any, *args: Any,
                 **kwargs: Any) -> None:  # fmt: skip
        super().__init__(config, layer_number, attn_mask_type, *args, **kwargs)
        self._check_supported()
        # megatron divides its scale by the layer number under query-key layer scaling and its
        # softmax multiplies it back: the scores' net scale is the undivided one
        coeff = self.layer_number if self.config.apply_query_key_layer_scaling else 1
        self.scale = float(self.softmax_scale * coeff)
        self.groups = self.num_attention_heads_per_partition // self.num_query_groups_per_partition

    def _check_supported(self) -> None:
        refused = []
        if self.attention_dropout.p:
            refused.append(f"attention dropout {self.attention_dropout.p}")
        if self.scale_mask_softmax.window_size is not None:
            refused.append(f"a sliding window {self.scale_mask_softmax.window_size}")
        if self.config.softmax_type != "vanilla":
            refused.append(f"softmax_type {self.config.softmax_type!r}")
        if self.attn_mask_type != AttnMaskType.causal:
            refused.append(f"attn_mask_type {self.attn_mask_type}")
        if refused:
            raise ValueError(
                f"the SDPA core attention does not support {', '.join(refused)}: build the "
                "model with megatron's local attention (attention='local')"
            )

    def forward(  # type: ignore[override]
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        attention_mask: Tensor | None,
        attn_mask_type: Any = None,
        attention_bias: Tensor | None = None,
        packed_seq_params: PackedSeqParams | None = None,
    ) -> Tensor:
        """``[sq, b, hp]`` (``thd``: ``[t, hp]``) attention output of ``query`` ``[sq, b, np,
        hn]`` against ``key`` / ``value`` ``[sk, b, ng, hn]`` (``thd``: no ``b``)."""
        if attention_bias is not None:
            raise ValueError("attention bias is not supported by the SDPA core attention")
        if attention_mask is not None:
            raise ValueError(
                "the SDPA core attention takes the packed rows as packed_seq_params "
                "(trainer.backends.megatron.sdpa_attention.lane_segments), not a dense mask: "
                "a dense mask over a lane does not take PyTorch's fused path"
            )
        if packed_seq_params is None:
            return self._causal(query, key, value)
        if packed_seq_params.qkv_format == "thd":  # [t, h, d] -> [h, t, d]
            q, k, v = (x.transpose(0, 1).contiguous() for x in (query, key, value))
            out = self._segments(q, k, v, packed_seq_params)  # [np, t, hn]
            return out.transpose(0, 1).reshape(query.shape[0], -1)
        if packed_seq_params.qkv_format not in (None, "sbhd"):
            raise ValueError(f"qkv_format {packed_seq_params.qkv_format!r}: sbhd or thd only")
        s, b = query.shape[:2]
        if key.shape[0] != s:
            raise ValueError(f"{s} queries and {key.shape[0]} keys: self-attention only")

        def lanes_end_to_end(x: Tensor) -> Tensor:  # [s, b, h, d] -> [h, b * s, d]
            return x.permute(2, 1, 0, 3).reshape(x.shape[2], b * s, x.shape[3])

        q, k, v = map(lanes_end_to_end, (query, key, value))
        out = self._segments(q, k, v, packed_seq_params)  # [np, b * s, hn]
        return out.reshape(-1, b, s, out.shape[-1]).permute(2, 1, 0, 3).reshape(s, b, -1)

    def _attend(self, query: Tensor, key: Tensor, value: Tensor) -> Tensor:
        """Causal SDPA of ``[..., heads, s, d]`` queries against ``[..., groups, s, d]``."""
        out: Tensor = F.scaled_dot_product_attention(
            query, key, value, is_causal=True, scale=self.scale, enable_gqa=self.groups > 1
        )
        return out

    def _causal(self, query: Tensor, key: Tensor, value: Tensor) -> Tensor:
        """No packing: causal attention over each of the ``b`` sequences."""
        if key.shape[0] != query.shape[0]:
            raise ValueError(f"{query.shape[0]} queries, {key.shape[0]} keys: self-attention only")
        q, k, v = (x.permute(1, 2, 0, 3) for x in (query, key, value))  # [b, h, s, d]
        out = self._attend(q, k, v)  # [b, np, s, hn]
        return out.permute(2, 0, 1, 3).reshape(query.shape[0], query.shape[1], -1)

    def _segments(
        self, query: Tensor, key: Tensor, value: Tensor, params: PackedSeqParams
    ) -> Tensor:
        """``[np, t, hn]``: causal attention within each row of the ``[h, t, d]`` tokens (one
        view per row: the backward of ``split`` is one concatenation)."""
        lengths = _segment_lengths(params, query.shape[1])
        rows = zip(*(x.split(lengths, dim=1) for x in (query, key, value)), strict=True)
        return torch.cat([self._attend(*row) for row in rows], dim=1)
