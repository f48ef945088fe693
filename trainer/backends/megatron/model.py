"""A megatron-core ``GPTModel`` built from the Hugging Face config of a Qwen3 model, dense or
MoE.

Qwen3 in Megatron terms (the local layer spec, no TransformerEngine): RMSNorm, grouped-query
attention with a fused QKV projection and per-head q/k RMSNorm, a SwiGLU MLP (fused gate/up
``linear_fc1``), RoPE with the config's theta, no linear biases, tied or untied embeddings.
Qwen3-MoE (``model_type: qwen3_moe``, Qwen3-30B-A3B's architecture): every MLP is Megatron's
``MoELayer`` with a ``TopKRouter`` and one local SwiGLU ``MLP`` per expert (``SequentialMLP``),
routed exactly as HF routes (:func:`moe_settings`).

Packed lanes (:func:`trainer.data.pack_inputs`): rows share a forward sequence with positions
restarting at 0 per row. Megatron's plain ``rope`` derives positions from the sequence index
only, so positions go in through its M-RoPE (``mrope``) with one section holding every rotary
frequency: with the same position ids on the three M-RoPE axes that is exactly 1-D RoPE at the
given per-token positions. Attention is block-diagonal causal (a token sees the earlier tokens
of its own row), the same view a packed row gets in the torch backend: without
TransformerEngine the core attention is PyTorch's fused SDPA once per row, the rows passed as
``cu_seqlens`` (:mod:`trainer.backends.megatron.sdpa_attention`); with megatron's local
attention (``attention="local"``) the mask is explicit and dense.
Under context parallel each rank runs the model on its slice of the lanes
(:class:`~trainer.backends.megatron.cp_layout.ShardedInputs`: its columns, its queries' mask
rows) with :class:`~trainer.backends.megatron.cp_attention.AllGatherContextAttention` as the
core attention of the local spec.

A MoE under tensor parallel runs with megatron's sequence parallel (its ``MoELayer`` refuses TP
without it in training): the lanes are padded to a multiple of TP columns, each TP rank holds
``w / TP`` of them between the layers (megatron's column- and row-parallel layers gather and
reduce-scatter the sequence, its allgather token dispatcher gathers the tokens over the TP
ranks, every rank computing its TP shard of every expert), the norms are
:class:`SequenceParallelRMSNorm` (torch's, marked ``sequence_parallel`` like megatron's fused
norms: their gradients are partial and summed over the TP ranks) and the decoder output is
gathered back to the whole lane before the heads (:func:`decoder_states`).
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

from trainer.backends.base import BackendError
from trainer.backends.critic import ValueModel
from trainer.backends.megatron.cp_layout import ShardedInputs, packed_attention_mask, pad_lanes
from trainer.data import PackedInputs

if TYPE_CHECKING:  # the module imports megatron-core: loaded where a model is built
    from trainer.backends.megatron.sdpa_attention import AttentionChoice

Inputs = PackedInputs | ShardedInputs  # a micro-batch's lanes, or one CP rank's part of them

SUPPORTED_MODEL_TYPES = ("qwen3", "qwen3_moe")


def _rope_theta(hf_config: Any) -> float:
    params = getattr(hf_config, "rope_parameters", None) or {}
    theta = params.get("rope_theta", getattr(hf_config, "rope_theta", None))
    if (params.get("rope_type") or "default") != "default":
        raise BackendError(f"rope scaling {params.get('rope_type')!r} is not supported yet")
    if theta is None:
        raise BackendError("the model config has no rope_theta")
    return float(theta)


def check_supported(hf_config: Any) -> None:
    """Raise :class:`BackendError` naming what this builder cannot express."""
    model_type = getattr(hf_config, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise BackendError(
            f"the megatron backend builds {SUPPORTED_MODEL_TYPES} models; got model_type "
            f"{model_type!r} (architectures {getattr(hf_config, 'architectures', None)})"
        )
    if getattr(hf_config, "attention_bias", False):
        raise BackendError("attention_bias=True is not supported by the megatron builder")
    if getattr(hf_config, "hidden_act", "silu") != "silu":
        raise BackendError(f"hidden_act {hf_config.hidden_act!r}: only silu (SwiGLU) is built")
    _rope_theta(hf_config)
    if is_moe(hf_config):
        _check_moe(hf_config)


def is_moe(hf_config: Any) -> bool:
    """Whether ``hf_config`` is a Qwen3-MoE (every MLP a sparse block of routed experts)."""
    return getattr(hf_config, "model_type", None) == "qwen3_moe"


def num_experts(hf_config: Any) -> int:
    explicit = getattr(hf_config, "num_experts", None)
    return int(explicit if explicit is not None else hf_config.num_local_experts)


def _check_moe(hf_config: Any) -> None:
    """The Qwen3-MoE routing the builder expresses: every layer sparse, softmax router with the
    top-k probabilities renormalised, no shared expert (see :func:`moe_settings`)."""
    layers = int(hf_config.num_hidden_layers)
    step = int(getattr(hf_config, "decoder_sparse_step", 1))
    dense = list(getattr(hf_config, "mlp_only_layers", None) or [])
    if step != 1 or dense:
        raise BackendError(
            f"MoE with dense layers (decoder_sparse_step={step}, mlp_only_layers={dense}) is "
            f"not built: every one of the {layers} layers must be sparse"
        )
    if not getattr(hf_config, "norm_topk_prob", True):
        raise BackendError(
            "norm_topk_prob=False (top-k probabilities not renormalised) is not built"
        )
    if getattr(hf_config, "shared_expert_intermediate_size", 0):
        raise BackendError("shared experts are not built in the megatron MoE")


def moe_settings(hf_config: Any) -> dict[str, Any]:
    """``TransformerConfig`` fields of a Qwen3-MoE: the HF routing exactly.

    HF's ``Qwen3MoeSparseMoeBlock`` takes ``softmax`` over all experts' logits, keeps the top k
    and renormalises them to sum to 1 (``norm_topk_prob``). Megatron's router with
    ``moe_router_pre_softmax=False`` takes the top k logits and a softmax over those k: the same
    weights (a softmax restricted to a subset is the renormalised full softmax). Routing runs in
    fp32, the load-balancing loss is off (``moe_router_load_balancing_type="none"``, coefficient
    0: the RL objective is the only loss), no capacity limit (``moe_expert_capacity_factor=None``:
    no token is dropped), experts one local ``SequentialMLP`` each (no grouped GEMM, no fusions).
    """
    if not is_moe(hf_config):
        # unused by a dense model; megatron refuses its default (allgather) beside the
        # variable_seq_lengths of pipeline parallel
        return {"moe_token_dispatcher_type": "alltoall"}
    return dict(
        num_moe_experts=num_experts(hf_config),
        moe_router_topk=int(hf_config.num_experts_per_tok),
        moe_ffn_hidden_size=int(hf_config.moe_intermediate_size),
        moe_router_score_function="softmax",
        moe_router_pre_softmax=False,
        moe_router_dtype="fp32",
        moe_router_load_balancing_type="none",
        moe_aux_loss_coeff=0.0,
        moe_z_loss_coeff=None,
        moe_expert_capacity_factor=None,
        moe_token_dispatcher_type="allgather",
        moe_grouped_gemm=False,
        moe_permute_fusion=False,
        moe_router_fusion=False,
        moe_shared_expert_intermediate_size=None,
    )


def head_dim(hf_config: Any) -> int:
    explicit = getattr(hf_config, "head_dim", None)
    return int(explicit or hf_config.hidden_size // hf_config.num_attention_heads)


def transformer_config(
    hf_config: Any, dtype: torch.dtype = torch.float32, recompute: bool = False
) -> Any:
    """Megatron's ``TransformerConfig`` for ``hf_config`` (fusions off, CPU initialisation);
    ``recompute``: full activation recompute, one layer per checkpoint (each layer keeps only
    its input and runs its forward again in the backward)."""
    from megatron.core import parallel_state
    from megatron.core.transformer import TransformerConfig

    check_supported(hf_config)
    dim = head_dim(hf_config)
    return TransformerConfig(
        num_layers=int(hf_config.num_hidden_layers),
        hidden_size=int(hf_config.hidden_size),
        num_attention_heads=int(hf_config.num_attention_heads),
        num_query_groups=int(hf_config.num_key_value_heads),
        kv_channels=dim,
        ffn_hidden_size=int(hf_config.intermediate_size),
        normalization="RMSNorm",
        layernorm_epsilon=float(hf_config.rms_norm_eps),
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=False,
        qk_layernorm=True,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        mrope_section=[dim // 2, 0, 0],  # every rotary frequency on M-RoPE's first axis
        tensor_model_parallel_size=parallel_state.get_tensor_model_parallel_world_size(),
        pipeline_model_parallel_size=parallel_state.get_pipeline_model_parallel_world_size(),
        expert_model_parallel_size=parallel_state.get_expert_model_parallel_world_size(),
        pipeline_dtype=dtype,
        # micro-batches differ in width: pipeline stages exchange activation shapes first
        variable_seq_lengths=parallel_state.get_pipeline_model_parallel_world_size() > 1,
        sequence_parallel=sequence_parallel(hf_config),
        use_cpu_initialization=True,
        perform_initialization=False,  # every weight is loaded from the HF checkpoint
        bias_activation_fusion=False,
        masked_softmax_fusion=False,
        persist_layer_norm=False,
        bias_dropout_fusion=False,
        apply_rope_fusion=False,
        gradient_accumulation_fusion=False,
        params_dtype=dtype,
        **moe_settings(hf_config),
        **(
            {
                "recompute_granularity": "full",
                "recompute_method": "uniform",
                "recompute_num_layers": 1,
            }
            if recompute
            else {}
        ),
    )


def sequence_parallel(hf_config: Any) -> bool:
    """Whether the model runs with megatron's sequence parallel: a MoE under tensor parallel
    (megatron's ``MoELayer`` refuses TP without it in training; dense models run without)."""
    from megatron.core import parallel_state

    tp = parallel_state.get_tensor_model_parallel_world_size()
    return is_moe(hf_config) and tp > 1


class SequenceParallelRMSNorm(nn.RMSNorm):
    """torch's ``RMSNorm`` as a megatron norm builder under sequence parallel (megatron's own
    torch wrapper refuses it, its fused ones need Apex or TransformerEngine): the weight is
    marked ``sequence_parallel`` as megatron's fused norms mark it, so the backend sums its
    gradient over the TP ranks (each rank normalises its own tokens, or its own heads' for
    the q/k norms)."""

    def __init__(self, config: Any, hidden_size: int, eps: float = 1e-5, **_: Any) -> None:
        super().__init__(hidden_size, eps=eps)
        self.weight.sequence_parallel = True  # type: ignore[attr-defined]


def _sequence_parallel_spec(spec: Any, config: Any) -> Any:
    """The block spec of ``spec``'s layers with :class:`SequenceParallelRMSNorm` for every
    norm (the layers' and the final one)."""
    from megatron.core.transformer.transformer_block import (
        TransformerBlockSubmodules,
        get_num_layers_to_build,
    )

    layer = spec.submodules
    layer.input_layernorm = layer.pre_mlp_layernorm = SequenceParallelRMSNorm
    attention = layer.self_attention.submodules
    attention.q_layernorm = attention.k_layernorm = SequenceParallelRMSNorm
    layers = get_num_layers_to_build(config)
    return TransformerBlockSubmodules(
        layer_specs=[spec] * layers, layer_norm=SequenceParallelRMSNorm
    )


def build_gpt(
    hf_config: Any,
    dtype: torch.dtype = torch.float32,
    recompute: bool = False,
    attention: AttentionChoice = "auto",
) -> nn.Module:
    """An (uninitialised) ``GPTModel`` of ``hf_config``'s shape, this pipeline stage's part
    (the embedding on the first stage, the final norm and output layer on the last, the
    stage's share of the layers; ``recompute``: :func:`transformer_config`'s); load weights with
    :func:`trainer.backends.megatron.convert.hf_to_megatron` (and
    :func:`~trainer.backends.megatron.convert.pipeline_stage`). ``attention``: the core
    attention (:func:`~trainer.backends.megatron.sdpa_attention.resolve_attention`; ``"auto"``
    is PyTorch's fused SDPA without TransformerEngine); context parallel keeps its own."""
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    from trainer.backends.megatron import cpu_compat
    from trainer.backends.megatron.sdpa_attention import SdpaAttention, resolve_attention

    config = transformer_config(hf_config, dtype, recompute)
    experts = num_experts(hf_config) if is_moe(hf_config) else None
    spec = get_gpt_layer_local_spec(
        num_experts=experts, moe_grouped_gemm=False, qk_layernorm=True, normalization="RMSNorm"
    )
    context_parallel = parallel_state.get_context_parallel_world_size() > 1
    if context_parallel:
        if experts is not None:
            raise BackendError("a MoE model under context parallel is not built yet")
        from trainer.backends.megatron.cp_attention import AllGatherContextAttention

        spec.submodules.self_attention.submodules.core_attention = AllGatherContextAttention
    sdpa = not context_parallel and resolve_attention(attention) == "sdpa"
    if sdpa:
        spec.submodules.self_attention.submodules.core_attention = SdpaAttention
    if config.sequence_parallel:
        spec = _sequence_parallel_spec(spec, config)
    with cpu_compat.building():
        model = GPTModel(
            config,
            spec,
            vocab_size=int(hf_config.vocab_size),
            max_sequence_length=int(hf_config.max_position_embeddings),
            pre_process=parallel_state.is_pipeline_first_stage(),
            post_process=parallel_state.is_pipeline_last_stage(),
            share_embeddings_and_output_weights=bool(hf_config.tie_word_embeddings),
            position_embedding_type="mrope",
            rotary_base=_rope_theta(hf_config),
        )
    model.packed_rows_as_segments = sdpa  # decoder_states: cu_seqlens, not a dense mask
    if getattr(model, "rotary_pos_emb", None) is not None:
        if context_parallel:
            # each CP rank passes its own columns' positions: no slicing of a whole-lane table
            model.rotary_pos_emb.cp_group = None
        rope_outside_autocast(model.rotary_pos_emb)
    return model


def layers_under_autocast(model: nn.Module, autocast: Callable[[], Any]) -> None:
    """Run every decoder layer's forward under ``autocast()`` (the backend's: bf16 or off).

    Megatron's activation recompute runs a checkpointed layer again in the backward, where the
    forward's autocast is not in effect (its ``CheckpointFunction`` does not record it, unlike
    ``torch.utils.checkpoint``): under ``precision: bf16`` the recomputed layer would compute
    in fp32 and the gradient would be of another function than the one the loss saw. Entering
    the same autocast inside each layer makes the forward and the recompute alike (a nested
    autocast of the same state changes nothing in the forward)."""
    for layer in model.decoder.layers:
        forward = layer.forward

        def under_autocast(*args: Any, _forward: Any = forward, **kwargs: Any) -> Any:
            with autocast():
                return _forward(*args, **kwargs)

        layer.forward = under_autocast


def rope_outside_autocast(rope: nn.Module) -> None:
    """Compute ``rope``'s rotary angles in fp32 under ``precision: bf16``, as HF's Qwen3 does.

    Megatron's M-RoPE takes ``inv_freq @ position_ids`` as a matrix product, which autocast
    runs in bfloat16: an angle of ``position x frequency`` keeps 8 bits, so past a few hundred
    positions it is off by radians (seen on an H200: the toy run's train / rollout logprob
    mismatch was 6.2 nats at most, 0.22 on average, against 0.03 / 0.0004 for the torch
    backend). The module's own ``forward`` is wrapped on this instance (nothing is patched in
    megatron-core, and its state dict is unchanged)."""
    forward = rope.forward
    kinds = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])

    @functools.wraps(forward)
    def fp32_forward(*args: Any, **kwargs: Any) -> Any:
        with contextlib.ExitStack() as stack:
            for kind in kinds:
                stack.enter_context(torch.autocast(device_type=kind, enabled=False))
            return forward(*args, **kwargs)

    rope.forward = fp32_forward  # type: ignore[method-assign]


def init_parallel(
    tensor_parallel: int = 1,
    seed: int = 0,
    pipeline_parallel: int = 1,
    expert_parallel: int = 1,
    device: torch.device | str = "cpu",
    context_parallel: int = 1,
) -> None:
    """``torch.distributed`` (world size 1 unless a launcher set ``WORLD_SIZE``; gloo, NCCL for
    several processes on CUDA),
    megatron's ``parallel_state`` with ``tensor_parallel`` x ``pipeline_parallel`` ranks per
    model replica (the rest is data parallel; ``expert_parallel`` ranks of it split a MoE's
    experts; ``context_parallel`` ranks of it split every sequence) and its model-parallel RNG
    streams from ``seed``; on the CPU ``device``, the
    compatibility layer (:mod:`trainer.backends.megatron.cpu_compat`) first."""
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

    from trainer.backends.megatron import cpu_compat

    try:
        if torch.device(device).type == "cuda":
            cpu_compat.claim_cuda()
        else:
            cpu_compat.install()
    except cpu_compat.CompatError as exc:
        raise BackendError(str(exc)) from exc
    if not dist.is_initialized():
        world_size = int(os.environ.get("WORLD_SIZE", "1"))
        if world_size == 1 and "MASTER_PORT" not in os.environ:
            # One process: an in-memory store, no TCP port to race another process for.
            dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        else:  # several processes (the trainer loop's ranks join theirs first: ranks.py)
            os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
            backend = "gloo"
            if torch.device(device).type == "cuda":  # NCCL: gloo has no CUDA all-gather
                torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
                backend = "nccl"
            dist.init_process_group(
                backend, rank=int(os.environ.get("RANK", "0")), world_size=world_size
            )
    world = dist.get_world_size()
    if world % (tensor_parallel * pipeline_parallel * context_parallel):
        raise BackendError(
            f"world size {world} is not a multiple of TP={tensor_parallel} x "
            f"PP={pipeline_parallel} x CP={context_parallel}"
        )
    if parallel_state.model_parallel_is_initialized():
        have = (
            parallel_state.get_tensor_model_parallel_world_size(),
            parallel_state.get_pipeline_model_parallel_world_size(),
            parallel_state.get_expert_model_parallel_world_size(),
            parallel_state.get_context_parallel_world_size(),
        )
        want = (tensor_parallel, pipeline_parallel, expert_parallel, context_parallel)
        if have != want:
            raise BackendError(
                f"megatron parallel_state is initialised with TP={have[0]}, PP={have[1]}, "
                f"EP={have[2]}, CP={have[3]}, asked for TP={tensor_parallel}, "
                f"PP={pipeline_parallel}, EP={expert_parallel}, CP={context_parallel}"
            )
    else:
        parallel_state.initialize_model_parallel(
            tensor_model_parallel_size=tensor_parallel,
            pipeline_model_parallel_size=pipeline_parallel,
            expert_model_parallel_size=expert_parallel,
            context_parallel_size=context_parallel,
        )
    model_parallel_cuda_manual_seed(seed)


def decoder_states(model: nn.Module, inputs: Inputs) -> Tensor:
    """``[width, lanes, hidden]`` output of this pipeline stage's layers on the ``[lanes,
    width]`` packed inputs: the first stage embeds the tokens, a later one starts from the
    input tensor megatron's schedule set (``model.set_input_tensor``); on the last stage the
    output is normed by the final layernorm. Under context parallel ``inputs`` is this CP
    rank's part (:class:`~trainer.backends.megatron.cp_layout.ShardedInputs`): the output is
    its ``w / cp`` columns, the rotary angles those of its explicit positions."""
    ids, positions = inputs.input_ids, inputs.position_ids
    width = ids.shape[1]
    split = bool(model.config.sequence_parallel) and isinstance(inputs, PackedInputs)
    if split:  # a multiple of 2 x TP columns (so of TP), the tail out of every token's view
        from megatron.core import parallel_state

        ids, positions = pad_lanes(inputs, parallel_state.get_tensor_model_parallel_world_size())
    segments = None
    if isinstance(inputs, ShardedInputs):  # this CP rank's columns, its queries' mask rows
        mask = inputs.attention_mask
    elif getattr(model, "packed_rows_as_segments", False):  # the SDPA core attention's rows
        from trainer.backends.megatron.sdpa_attention import lane_segments

        mask, segments = None, lane_segments(positions)
    else:
        mask = packed_attention_mask(positions)
    embedded = None
    if model.pre_process:
        # [w, lanes, h]; under sequence parallel this TP rank's w / TP columns
        embedded = model.embedding(input_ids=ids, position_ids=positions)
    rotary = model.rotary_pos_emb(positions[None].expand(3, -1, -1), model.mrope_section)
    out = model.decoder(
        hidden_states=embedded,
        attention_mask=mask,
        rotary_pos_emb=rotary,
        packed_seq_params=segments,
    )
    if not split:
        return out
    from megatron.core.tensor_parallel import gather_from_sequence_parallel_region

    # the whole lane on every TP rank; the heads downstream are replicated (the same loss on
    # every rank), so the backward keeps this rank's columns of the gradient (no sum)
    whole = gather_from_sequence_parallel_region(out, tensor_parallel_output_grad=False)
    return whole[:width]


def pick(hidden: Tensor, inputs: Inputs) -> Tensor:
    """``[rows * T, hidden]``: the positions ``inputs.index`` picks of ``[w, lanes, h]``
    (under context parallel ``[m, hidden]``: this rank's owned tokens)."""
    flat = hidden.transpose(0, 1).reshape(-1, hidden.shape[-1])
    return flat[inputs.index.reshape(-1)]


def hidden_states(model: nn.Module, inputs: Inputs) -> Tensor:
    """``[rows * T, hidden]`` final (normed) hidden states at the positions ``inputs.index``
    picks, from the ``[lanes, width]`` packed inputs (the whole model on this rank)."""
    return pick(decoder_states(model, inputs), inputs)


def output_logits(model: nn.Module, hidden: Tensor) -> Tensor:
    """Full-vocabulary logits of ``hidden`` ``[m, h]`` (gathered across tensor-parallel ranks)."""
    weight = (
        model.shared_embedding_or_output_weight()
        if model.share_embeddings_and_output_weights
        else None
    )
    if model.config.sequence_parallel:
        # the output layer would gather a sequence; ``hidden`` is whole on every TP rank: the
        # column-parallel product without sequence parallel (no bias), gathered over the vocab
        from megatron.core.tensor_parallel import (
            copy_to_tensor_model_parallel_region,
            gather_from_tensor_model_parallel_region,
        )

        shard = weight if weight is not None else model.output_layer.weight
        local = F.linear(copy_to_tensor_model_parallel_region(hidden), shard)
        return gather_from_tensor_model_parallel_region(local)
    logits, _ = model.output_layer(hidden[:, None], weight=weight, runtime_gather_output=True)
    return logits[:, 0]


class MegatronScorer(nn.Module):
    """The actor: logits ``[n, t, vocab]`` of the post-prompt positions (packed lanes; under
    context parallel ``[m, vocab]``, this rank's owned tokens)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, inputs: Inputs) -> Tensor:
        return self.head(decoder_states(self.model, inputs), inputs)

    def head(self, hidden: Tensor, inputs: Inputs) -> Tensor:
        """Logits ``[n, t, vocab]`` from the last stage's ``[w, lanes, h]`` decoder output."""
        logits = output_logits(self.model, pick(hidden, inputs))
        return logits.reshape(*inputs.index.shape, -1)


class MegatronValueModel(ValueModel):
    """The critic: a ``GPTModel`` body (its output layer unused and frozen) with the value
    head of :class:`trainer.backends.critic.ValueModel` (same initialisation)."""

    def __init__(
        self,
        model: nn.Module,
        hidden_size: int,
        head: Literal["linear", "sigmoid"] = "linear",
        init_std: float = 0.02,
        generator: torch.Generator | None = None,
    ) -> None:
        super().__init__(model, hidden_size, head, init_std, generator)
        output = getattr(model, "output_layer", None)
        for param in output.parameters() if output is not None else ():
            param.requires_grad_(False)  # the critic has no vocabulary head

    def forward(self, inputs: Inputs, raw: bool = False) -> Tensor:
        """``[n, t]`` float32 values (``raw``: a sigmoid head's logits; ``[m]`` under
        context parallel, this rank's owned tokens)."""
        return self.head(decoder_states(self.body, inputs), inputs, raw)

    def head(self, hidden: Tensor, inputs: Inputs, raw: bool = False) -> Tensor:
        """Values ``[n, t]`` from the last stage's ``[w, lanes, h]`` decoder output."""
        picked = pick(hidden, inputs)
        out = self.value_head(picked).squeeze(-1).float().reshape(inputs.index.shape)
        return torch.sigmoid(out) if self.head_kind == "sigmoid" and not raw else out


def embeddings_require_grad(model: nn.Module) -> None:
    """Make the embedding output of ``model`` (its first pipeline stage) require grad while
    gradients are on. Activation recompute checkpoints each layer through an autograd
    function whose output needs a gradient only if one of its inputs does: with frozen
    embeddings (the critic) none would, and the recomputed layers' trainable MLPs would get
    no gradient. (What HF's ``enable_input_require_grads`` does for the same reason.)"""
    embedding = getattr(model, "embedding", None)
    if embedding is None:  # a later stage: the schedule's received activations need grads
        return

    def needs_grad(module: nn.Module, args: Any, output: Tensor) -> Tensor:
        if torch.is_grad_enabled() and not output.requires_grad:
            return output.requires_grad_(True)
        return output

    embedding.register_forward_hook(needs_grad)
