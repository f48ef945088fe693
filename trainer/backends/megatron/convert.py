"""Hugging Face Qwen3 <-> megatron-core ``GPTModel`` weights (dense), with tensor parallelism.

Only reshuffling, no arithmetic, so the round trip is bit-exact. Per layer ``i``:

==========================================  ===============================================
HF (``model.layers.i.``)                    Megatron (``decoder.layers.i.``)
==========================================  ===============================================
``input_layernorm``                         ``input_layernorm``
``self_attn.{q,k,v}_proj``                  ``self_attention.linear_qkv``: per query group
                                            ``[its q heads; its k head; its v head]`` rows
``self_attn.o_proj``                        ``self_attention.linear_proj``
``self_attn.{q,k}_norm``                    ``self_attention.{q,k}_layernorm``
``post_attention_layernorm``                ``pre_mlp_layernorm``
``mlp.{gate,up}_proj``                      ``mlp.linear_fc1``: ``[gate; up]`` rows
``mlp.down_proj``                           ``mlp.linear_fc2``
==========================================  ===============================================

plus ``model.embed_tokens`` <-> ``embedding.word_embeddings``, ``model.norm`` <->
``decoder.final_layernorm`` and (untied) ``lm_head`` <-> ``output_layer``. Under tensor
parallelism rank ``r`` of ``tp`` holds query groups ``r*g/tp ...``, the ``r``-th chunk of the
gate and of the up rows, the ``r``-th column chunk of ``o_proj`` / ``down_proj`` and the
``r``-th vocabulary chunk of the embeddings and output layer; norms are replicated.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from trainer.backends.base import BackendError
from trainer.backends.megatron.model import head_dim

Weights = dict[str, Tensor]


def _shape(hf_config: Any) -> tuple[int, int, int]:
    heads, groups = int(hf_config.num_attention_heads), int(hf_config.num_key_value_heads)
    return heads, groups, head_dim(hf_config)


def check_tensor_parallel(hf_config: Any, tp: int) -> None:
    """Raise :class:`BackendError` when ``hf_config`` does not split over ``tp`` ranks."""
    heads, groups, _ = _shape(hf_config)
    for what, size in (
        ("num_key_value_heads", groups),
        ("num_attention_heads", heads),
        ("intermediate_size", int(hf_config.intermediate_size)),
        ("vocab_size", int(hf_config.vocab_size)),
    ):
        if size % tp:
            raise BackendError(f"{what}={size} does not split over tensor parallel size {tp}")


def _qkv(q: Tensor, k: Tensor, v: Tensor, hf_config: Any) -> Tensor:
    heads, groups, dim = _shape(hf_config)
    per = heads // groups
    hidden = q.shape[-1]
    q = q.reshape(groups, per * dim, hidden)
    k = k.reshape(groups, dim, hidden)
    v = v.reshape(groups, dim, hidden)
    return torch.cat([q, k, v], dim=1).reshape(-1, hidden)


def _split_qkv(qkv: Tensor, hf_config: Any) -> tuple[Tensor, Tensor, Tensor]:
    heads, groups, dim = _shape(hf_config)
    per = heads // groups
    hidden = qkv.shape[-1]
    q, k, v = qkv.reshape(groups, (per + 2) * dim, hidden).split([per * dim, dim, dim], dim=1)
    return q.reshape(-1, hidden), k.reshape(-1, hidden), v.reshape(-1, hidden)


def _get(hf: Mapping[str, Tensor], name: str) -> Tensor:
    if name not in hf:
        raise BackendError(f"HF weights lack {name!r} (not a dense Qwen3 checkpoint?)")
    return hf[name]


def _layer_to_megatron(
    hf: Mapping[str, Tensor], i: int, hf_config: Any, rank: int, tp: int
) -> Weights:
    src, dst = f"model.layers.{i}.", f"decoder.layers.{i}."
    q, k, v = (_get(hf, f"{src}self_attn.{x}_proj.weight") for x in "qkv")
    qkv = _qkv(q, k, v, hf_config).chunk(tp, dim=0)[rank]  # whole groups per rank
    gate = _get(hf, f"{src}mlp.gate_proj.weight").chunk(tp, dim=0)[rank]
    up = _get(hf, f"{src}mlp.up_proj.weight").chunk(tp, dim=0)[rank]
    return {
        f"{dst}input_layernorm.weight": _get(hf, f"{src}input_layernorm.weight"),
        f"{dst}self_attention.linear_qkv.weight": qkv,
        f"{dst}self_attention.linear_proj.weight": _get(hf, f"{src}self_attn.o_proj.weight").chunk(
            tp, dim=1
        )[rank],
        f"{dst}self_attention.q_layernorm.weight": _get(hf, f"{src}self_attn.q_norm.weight"),
        f"{dst}self_attention.k_layernorm.weight": _get(hf, f"{src}self_attn.k_norm.weight"),
        f"{dst}pre_mlp_layernorm.weight": _get(hf, f"{src}post_attention_layernorm.weight"),
        f"{dst}mlp.linear_fc1.weight": torch.cat([gate, up], dim=0),
        f"{dst}mlp.linear_fc2.weight": _get(hf, f"{src}mlp.down_proj.weight").chunk(tp, dim=1)[
            rank
        ],
    }


def hf_to_megatron(hf: Mapping[str, Tensor], hf_config: Any, rank: int = 0, tp: int = 1) -> Weights:
    """Tensor-parallel rank ``rank``'s Megatron weights of the HF state dict ``hf``."""
    check_tensor_parallel(hf_config, tp)
    out: Weights = {
        "embedding.word_embeddings.weight": _get(hf, "model.embed_tokens.weight").chunk(tp)[rank],
        "decoder.final_layernorm.weight": _get(hf, "model.norm.weight"),
    }
    if not hf_config.tie_word_embeddings:
        out["output_layer.weight"] = _get(hf, "lm_head.weight").chunk(tp)[rank]
    for i in range(int(hf_config.num_hidden_layers)):
        out.update(_layer_to_megatron(hf, i, hf_config, rank, tp))
    return {name: t.contiguous() for name, t in out.items()}


def _layer_to_hf(shards: Sequence[Mapping[str, Tensor]], i: int, hf_config: Any) -> Weights:
    src, dst = f"decoder.layers.{i}.", f"model.layers.{i}."

    def cat(name: str, dim: int) -> Tensor:
        return torch.cat([s[f"{src}{name}"] for s in shards], dim=dim)

    q, k, v = _split_qkv(cat("self_attention.linear_qkv.weight", 0), hf_config)
    halves = [s[f"{src}mlp.linear_fc1.weight"].chunk(2, dim=0) for s in shards]
    first = shards[0]
    return {
        f"{dst}input_layernorm.weight": first[f"{src}input_layernorm.weight"],
        f"{dst}self_attn.q_proj.weight": q,
        f"{dst}self_attn.k_proj.weight": k,
        f"{dst}self_attn.v_proj.weight": v,
        f"{dst}self_attn.o_proj.weight": cat("self_attention.linear_proj.weight", 1),
        f"{dst}self_attn.q_norm.weight": first[f"{src}self_attention.q_layernorm.weight"],
        f"{dst}self_attn.k_norm.weight": first[f"{src}self_attention.k_layernorm.weight"],
        f"{dst}post_attention_layernorm.weight": first[f"{src}pre_mlp_layernorm.weight"],
        f"{dst}mlp.gate_proj.weight": torch.cat([h[0] for h in halves], dim=0),
        f"{dst}mlp.up_proj.weight": torch.cat([h[1] for h in halves], dim=0),
        f"{dst}mlp.down_proj.weight": cat("mlp.linear_fc2.weight", 1),
    }


def megatron_to_hf(shards: Sequence[Mapping[str, Tensor]], hf_config: Any) -> Weights:
    """HF state dict (checkpoint names, tied ``lm_head`` omitted) of the Megatron weights of
    every tensor-parallel rank, ``shards[r]`` being rank ``r``'s."""
    if not shards:
        raise BackendError("no Megatron weight shards to convert")
    check_tensor_parallel(hf_config, len(shards))
    out: Weights = {
        "model.embed_tokens.weight": torch.cat(
            [s["embedding.word_embeddings.weight"] for s in shards]
        ),
    }
    for i in range(int(hf_config.num_hidden_layers)):
        out.update(_layer_to_hf(shards, i, hf_config))
    out["model.norm.weight"] = shards[0]["decoder.final_layernorm.weight"]
    if not hf_config.tie_word_embeddings:
        out["lm_head.weight"] = torch.cat([s["output_layer.weight"] for s in shards])
    return {name: t.contiguous() for name, t in out.items()}


def load_into(model: torch.nn.Module, weights: Mapping[str, Tensor]) -> None:
    """Copy ``weights`` (Megatron names) into ``model``; every parameter must be given."""
    params = dict(model.named_parameters())
    missing = sorted(set(params) - set(weights))
    unexpected = sorted(set(weights) - set(params))
    if missing or unexpected:
        raise BackendError(
            f"Megatron weights do not fit the model: missing {missing}, unexpected {unexpected}"
        )
    with torch.no_grad():
        for name, param in params.items():
            src = weights[name]
            if tuple(src.shape) != tuple(param.shape):
                raise BackendError(
                    f"{name}: shape {tuple(src.shape)} does not fit the model's "
                    f"{tuple(param.shape)}"
                )
            param.copy_(src)
