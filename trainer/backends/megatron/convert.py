"""Hugging Face Qwen3 / Qwen3-MoE <-> megatron-core ``GPTModel`` weights, with tensor and
expert parallelism.

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
MoE: ``mlp.gate`` (the router)              ``mlp.router``
MoE: ``mlp.experts.e.{gate,up}_proj``       ``mlp.experts.local_experts.j.linear_fc1``:
                                            ``[gate; up]`` rows
MoE: ``mlp.experts.e.down_proj``            ``mlp.experts.local_experts.j.linear_fc2``
==========================================  ===============================================

plus ``model.embed_tokens`` <-> ``embedding.word_embeddings``, ``model.norm`` <->
``decoder.final_layernorm`` and (untied) ``lm_head`` <-> ``output_layer``. Under tensor
parallelism rank ``r`` of ``tp`` holds query groups ``r*g/tp ...``, the ``r``-th chunk of the
gate and of the up rows, the ``r``-th column chunk of ``o_proj`` / ``down_proj`` and the
``r``-th vocabulary chunk of the embeddings and output layer; norms are replicated. Under
expert parallelism (``ep`` ranks) rank ``q`` holds experts ``q*E/ep ... (q+1)*E/ep - 1`` as its
local experts ``j = 0, 1, ...`` (:func:`merge_expert_parallel` renumbers them back); the router
and everything outside the experts are replicated.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from trainer.backends.base import BackendError
from trainer.backends.megatron.model import head_dim, is_moe, num_experts

Weights = dict[str, Tensor]


def _shape(hf_config: Any) -> tuple[int, int, int]:
    heads, groups = int(hf_config.num_attention_heads), int(hf_config.num_key_value_heads)
    return heads, groups, head_dim(hf_config)


def check_tensor_parallel(hf_config: Any, tp: int) -> None:
    """Raise :class:`BackendError` when ``hf_config`` does not split over ``tp`` ranks."""
    heads, groups, _ = _shape(hf_config)
    sizes = [
        ("num_key_value_heads", groups),
        ("num_attention_heads", heads),
        ("intermediate_size", int(hf_config.intermediate_size)),
        ("vocab_size", int(hf_config.vocab_size)),
    ]
    if is_moe(hf_config):
        sizes.append(("moe_intermediate_size", int(hf_config.moe_intermediate_size)))
    for what, size in sizes:
        if size % tp:
            raise BackendError(f"{what}={size} does not split over tensor parallel size {tp}")


def check_expert_parallel(hf_config: Any, ep: int) -> None:
    """Raise :class:`BackendError` when ``hf_config``'s experts do not split over ``ep`` ranks
    (a dense model takes only ``ep=1``)."""
    if ep == 1:
        return
    if not is_moe(hf_config):
        raise BackendError(f"expert parallel size {ep} needs a MoE model")
    if num_experts(hf_config) % ep:
        raise BackendError(
            f"num_experts={num_experts(hf_config)} does not split over expert parallel size {ep}"
        )


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
    hf: Mapping[str, Tensor], i: int, hf_config: Any, rank: int, tp: int, ep_rank: int, ep: int
) -> Weights:
    src, dst = f"model.layers.{i}.", f"decoder.layers.{i}."
    q, k, v = (_get(hf, f"{src}self_attn.{x}_proj.weight") for x in "qkv")
    qkv = _qkv(q, k, v, hf_config).chunk(tp, dim=0)[rank]  # whole groups per rank
    out = {
        f"{dst}input_layernorm.weight": _get(hf, f"{src}input_layernorm.weight"),
        f"{dst}self_attention.linear_qkv.weight": qkv,
        f"{dst}self_attention.linear_proj.weight": _get(hf, f"{src}self_attn.o_proj.weight").chunk(
            tp, dim=1
        )[rank],
        f"{dst}self_attention.q_layernorm.weight": _get(hf, f"{src}self_attn.q_norm.weight"),
        f"{dst}self_attention.k_layernorm.weight": _get(hf, f"{src}self_attn.k_norm.weight"),
        f"{dst}pre_mlp_layernorm.weight": _get(hf, f"{src}post_attention_layernorm.weight"),
    }
    if not is_moe(hf_config):
        out.update(_mlp_to_megatron(hf, f"{src}mlp.", f"{dst}mlp.", rank, tp))
        return out
    out[f"{dst}mlp.router.weight"] = _get(hf, f"{src}mlp.gate.weight")
    for local, expert in enumerate(_local_experts(hf_config, ep_rank, ep)):
        out.update(
            _mlp_to_megatron(
                hf,
                f"{src}mlp.experts.{expert}.",
                f"{dst}mlp.experts.local_experts.{local}.",
                rank,
                tp,
            )
        )
    return out


def _mlp_to_megatron(hf: Mapping[str, Tensor], src: str, dst: str, rank: int, tp: int) -> Weights:
    """One SwiGLU MLP (dense, or one expert): ``[gate; up]`` rows of this rank, its columns of
    ``down``."""
    gate = _get(hf, f"{src}gate_proj.weight").chunk(tp, dim=0)[rank]
    up = _get(hf, f"{src}up_proj.weight").chunk(tp, dim=0)[rank]
    return {
        f"{dst}linear_fc1.weight": torch.cat([gate, up], dim=0),
        f"{dst}linear_fc2.weight": _get(hf, f"{src}down_proj.weight").chunk(tp, dim=1)[rank],
    }


def _local_experts(hf_config: Any, ep_rank: int, ep: int) -> range:
    """The global expert indices expert-parallel rank ``ep_rank`` of ``ep`` holds (Megatron's
    contiguous split: rank ``r`` holds experts ``r*E/ep ... (r+1)*E/ep - 1``)."""
    per = num_experts(hf_config) // ep
    return range(ep_rank * per, (ep_rank + 1) * per)


def hf_to_megatron(
    hf: Mapping[str, Tensor],
    hf_config: Any,
    rank: int = 0,
    tp: int = 1,
    ep_rank: int = 0,
    ep: int = 1,
) -> Weights:
    """Tensor-parallel rank ``rank``'s (and, for a MoE, expert-parallel rank ``ep_rank``'s)
    Megatron weights of the HF state dict ``hf``."""
    check_tensor_parallel(hf_config, tp)
    check_expert_parallel(hf_config, ep)
    out: Weights = {
        "embedding.word_embeddings.weight": _get(hf, "model.embed_tokens.weight").chunk(tp)[rank],
        "decoder.final_layernorm.weight": _get(hf, "model.norm.weight"),
    }
    if not hf_config.tie_word_embeddings:
        out["output_layer.weight"] = _get(hf, "lm_head.weight").chunk(tp)[rank]
    for i in range(int(hf_config.num_hidden_layers)):
        out.update(_layer_to_megatron(hf, i, hf_config, rank, tp, ep_rank, ep))
    return {name: t.contiguous() for name, t in out.items()}


def _layer_to_hf(shards: Sequence[Mapping[str, Tensor]], i: int, hf_config: Any) -> Weights:
    src, dst = f"decoder.layers.{i}.", f"model.layers.{i}."

    def cat(name: str, dim: int) -> Tensor:
        return torch.cat([s[f"{src}{name}"] for s in shards], dim=dim)

    q, k, v = _split_qkv(cat("self_attention.linear_qkv.weight", 0), hf_config)
    first = shards[0]
    out = {
        f"{dst}input_layernorm.weight": first[f"{src}input_layernorm.weight"],
        f"{dst}self_attn.q_proj.weight": q,
        f"{dst}self_attn.k_proj.weight": k,
        f"{dst}self_attn.v_proj.weight": v,
        f"{dst}self_attn.o_proj.weight": cat("self_attention.linear_proj.weight", 1),
        f"{dst}self_attn.q_norm.weight": first[f"{src}self_attention.q_layernorm.weight"],
        f"{dst}self_attn.k_norm.weight": first[f"{src}self_attention.k_layernorm.weight"],
        f"{dst}post_attention_layernorm.weight": first[f"{src}pre_mlp_layernorm.weight"],
    }
    if not is_moe(hf_config):
        out.update(_mlp_to_hf(shards, f"{src}mlp.", f"{dst}mlp."))
        return out
    out[f"{dst}mlp.gate.weight"] = first[f"{src}mlp.router.weight"]
    for e in range(num_experts(hf_config)):
        local = f"{src}mlp.experts.local_experts.{e}."
        out.update(_mlp_to_hf(shards, local, f"{dst}mlp.experts.{e}."))
    return out


def _mlp_to_hf(shards: Sequence[Mapping[str, Tensor]], src: str, dst: str) -> Weights:
    halves = [s[f"{src}linear_fc1.weight"].chunk(2, dim=0) for s in shards]
    return {
        f"{dst}gate_proj.weight": torch.cat([h[0] for h in halves], dim=0),
        f"{dst}up_proj.weight": torch.cat([h[1] for h in halves], dim=0),
        f"{dst}down_proj.weight": torch.cat([s[f"{src}linear_fc2.weight"] for s in shards], dim=1),
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


def merge_expert_parallel(ep_shards: Sequence[Mapping[str, Tensor]], hf_config: Any) -> Weights:
    """One tensor-parallel rank's weights with every expert, from its expert-parallel ranks'
    (``ep_shards[r]`` being EP rank ``r``'s): local expert ``j`` of rank ``r`` is global expert
    ``r*E/ep + j``; the tensors outside the experts are replicated (rank 0's are taken)."""
    if not ep_shards:
        raise BackendError("no Megatron expert-parallel shards to merge")
    check_expert_parallel(hf_config, len(ep_shards))
    marker = ".mlp.experts.local_experts."
    out: Weights = {}
    for ep_rank, shard in enumerate(ep_shards):
        experts = _local_experts(hf_config, ep_rank, len(ep_shards))
        for name, tensor in shard.items():
            if marker not in name:
                if ep_rank == 0:
                    out[name] = tensor
                continue
            head, tail = name.split(marker)
            local, rest = tail.split(".", 1)
            out[f"{head}{marker}{experts[int(local)]}.{rest}"] = tensor
    return out


def _stage_layers(hf_config: Any, pp_rank: int, pp: int) -> range:
    layers = int(hf_config.num_hidden_layers)
    if layers % pp:
        raise BackendError(
            f"num_hidden_layers={layers} does not split over pipeline parallel size {pp}"
        )
    per = layers // pp
    return range(pp_rank * per, (pp_rank + 1) * per)


def pipeline_stage(weights: Mapping[str, Tensor], hf_config: Any, pp_rank: int, pp: int) -> Weights:
    """Pipeline stage ``pp_rank`` of ``pp``'s share of whole-model Megatron ``weights``: its
    layers (global layer ``pp_rank*L/pp + j`` becomes the stage's ``decoder.layers.j``, the
    even split megatron builds), the embedding on the first stage, the final norm and the
    output layer on the last (with tied embeddings the last stage's ``output_layer`` is a copy
    of the word embeddings, which megatron keeps equal)."""
    layers = _stage_layers(hf_config, pp_rank, pp)
    first, last = pp_rank == 0, pp_rank == pp - 1
    out: Weights = {}
    for name, tensor in weights.items():
        if name.startswith("decoder.layers."):
            index, rest = name[len("decoder.layers.") :].split(".", 1)
            if int(index) in layers:
                out[f"decoder.layers.{int(index) - layers.start}.{rest}"] = tensor
        else:
            tail = name.startswith("decoder.final_layernorm") or name == "output_layer.weight"
            if (first and name.startswith("embedding.")) or (last and tail):
                out[name] = tensor
    if last and not first and hf_config.tie_word_embeddings:
        out["output_layer.weight"] = weights["embedding.word_embeddings.weight"]
    return out


def merge_pipeline_stages(stages: Sequence[Mapping[str, Tensor]], hf_config: Any) -> Weights:
    """Whole-model Megatron weights from every pipeline stage's (``stages[s]`` being stage
    ``s``'s): the inverse of :func:`pipeline_stage` (a tied output layer is dropped)."""
    if not stages:
        raise BackendError("no Megatron pipeline stages to merge")
    pp = len(stages)
    out: Weights = {}
    for s, stage in enumerate(stages):
        layers = _stage_layers(hf_config, s, pp)
        for name, tensor in stage.items():
            if name.startswith("decoder.layers."):
                index, rest = name[len("decoder.layers.") :].split(".", 1)
                out[f"decoder.layers.{layers.start + int(index)}.{rest}"] = tensor
            elif name == "output_layer.weight" and hf_config.tie_word_embeddings:
                continue
            else:
                out[name] = tensor
    return out


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
