"""The ``megatron`` backend: megatron-core ``GPTModel`` actor and critic behind the one interface.

The models differ from the torch backend's, the step engine does not: :class:`MegatronBackend`
reuses :class:`~trainer.backends.torch_backend.TorchBackend`'s micro-batch planning, no-grad
forwards, step-plan phases (:mod:`trainer.algorithms.step_plans`), whole-batch objective with
per-token gradients, backpropagation, clipping and AdamW, and replaces what touches the
models: building them (:mod:`trainer.backends.megatron.model`, weights converted from the HF
checkpoint by :mod:`trainer.backends.megatron.convert`), the HF export and
``named_weights`` (converted back). Checkpoints are the torch backend's
(:mod:`trainer.backends.torch_checkpoint`) over the Megatron modules, each model-parallel
rank's shard under its coordinates. The actor is a
``GPTModel``; the critic a second one with the linear/sigmoid value head, attention and
embeddings frozen like the torch critic's.

Parallelism: megatron's ``parallel_state`` over gloo; tensor parallel ranks compute the same
per-token outputs (logits gathered over the vocabulary) and the same objective; the q/k
layernorm gradients are summed over the TP ranks and the clipped grad norm spans every rank's
shards (:func:`sum_partial_grads`, :func:`tp_grad_norm`). With TP=1 the world is data parallel:
the torch backend's row split by group, gradients summed over the ranks before clipping.
Qwen3-MoE models run in one process, under expert parallel, data parallel (the experts
replicated) or tensor parallel (x DP): every expert split over the TP ranks like a dense MLP,
with megatron's sequence parallel, whose norm and router gradients are partial per rank and
summed over the TP ranks with the q/k norms' (the Megatron MoE layer,
:mod:`trainer.backends.megatron.model`). With
``pipeline_parallel`` > 1 (dense; PP x DP or TP x PP x DP ranks) every rank holds one stage
(under TP its TP shard of it); the no-grad forwards (the KL reference's too) and the backward
of a step run through megatron's 1F1B schedule (:mod:`trainer.backends.megatron.pipeline`,
activations sent between the same TP rank of adjacent stages), tied embedding gradients are
summed between the first and last stage, the grad norm spans the model-parallel group
(:func:`pipeline_grad_norm`), and the weights are gathered over TP within every stage, then
from every stage. With ``expert_parallel`` >
1 (a MoE, EP = world, TP=PP=1) every rank holds its share of the experts and scores the whole
batch (megatron's allgather dispatcher moves the tokens); the experts are gathered for the
weights out, and a step divides the experts' gradients by EP
(:func:`expert_parallel_grad_norm`). With ``context_parallel`` > 1 (dense, PP=EP=1) every
CP rank holds a slice of every lane (:mod:`trainer.backends.megatron.cp_layout`), attention
gathers the keys and values (:mod:`trainer.backends.megatron.cp_attention`), each token is
scored on the rank that holds it and the per-token outputs are summed over the CP group (the
objective is the whole batch's on every rank), and the gradients are summed over the
data-parallel-with-CP group. Tensor, pipeline or context parallel combine with data parallel
(TP x DP, PP x DP, TP x PP x DP, CP x DP, TP x CP x DP: replicas over megatron's
data-parallel group). Expert parallel with another kind, context parallel with PP or EP,
MoE under pipeline or context parallel, Megatron's own DistributedOptimizer
(``megatron.distributed_optimizer`` is ZeRO-1 with torch's ZeroRedundancyOptimizer over the
data-parallel group, also under TP x DP and PP x DP; not under EP) are not built yet and
raise :class:`BackendError`. A checkpoint loads into the model-parallel layout that saved it;
``python -m trainer reshard`` (:mod:`trainer.backends.megatron.reshard`) rewrites it for
another. ``precision: bf16`` (GPU) autocasts the forwards as the torch backend does,
parameters and AdamW states fp32: megatron's linear layers are ``custom_fwd`` / ``custom_bwd``
for CUDA, so their backward runs under the forward's autocast state. Under pipeline parallel
every stage's forward and the last stage's heads run under the same autocast, and the stages
exchange the fp32 residual stream (what one process passes between the same two layers).
``activation_checkpointing`` is Megatron's full recompute, one layer per checkpoint, in actor
and critic (the critic's embedding output made to require grad: its embeddings are frozen).
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from trainer.backends import torch_checkpoint
from trainer.backends.base import BackendError, ForwardResult
from trainer.backends.critic import freeze_attention
from trainer.backends.megatron.cp_layout import ShardedInputs
from trainer.backends.parallel import DataParallel
from trainer.backends.torch_backend import (
    EXPORT_STAMP,
    TOKENIZER_FILES,
    TorchBackend,
    _fingerprint,
    token_logprobs,
)
from trainer.checkpoint import atomic_directory
from trainer.config import TrainerConfig
from trainer.data import PackedInputs, TrainBatch

if TYPE_CHECKING:
    from trainer.backends.megatron.pipeline import Head
    from trainer.backends.megatron.sdpa_attention import AttentionChoice

# Files of the source model directory copied into an export beside the weights.
CONFIG_FILES = ("config.json", "generation_config.json")


def _read_source(model_dir: Path) -> tuple[Any, Any, dict[str, Tensor]]:
    """HF config, tokenizer and float32 state dict (checkpoint names) of ``model_dir``."""
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoTokenizer

    if not (model_dir / "config.json").is_file():
        raise BackendError(f"{model_dir} is not a Hugging Face model directory (no config.json)")
    try:
        hf_config = AutoConfig.from_pretrained(model_dir)
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
    except (ValueError, KeyError, OSError) as exc:
        raise BackendError(f"cannot read the model in {model_dir}: {exc}") from exc
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise BackendError(f"{model_dir} has no *.safetensors weights")
    weights: dict[str, Tensor] = {}
    for file in files:
        weights.update({k: v.float() for k, v in load_file(file).items()})
    return hf_config, tokenizer, weights


def tp_grad_norm(params: list[nn.Parameter]) -> Tensor:
    """L2 norm of the gradients of ``params`` over all tensor-parallel ranks (a collective when
    TP > 1): Megatron's rule, duplicates of a replicated parameter count on TP rank 0 only.
    Each rank's part is torch's ``get_total_norm`` (at TP=1: the torch backend's figure)."""
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import param_is_not_tensor_parallel_duplicate

    grads = [
        p.grad for p in params if p.grad is not None and param_is_not_tensor_parallel_duplicate(p)
    ]
    local = torch.nn.utils.get_total_norm(grads) if grads else torch.zeros(())
    if parallel_state.get_tensor_model_parallel_world_size() <= 1:
        return local.float().cpu()
    square = local.float().cpu().pow(2)
    dist.all_reduce(square, group=parallel_state.get_tensor_model_parallel_group())
    return square.sqrt()


def expert_parallel_grad_norm(params: list[nn.Parameter], experts: set[int]) -> Tensor:
    """L2 norm of the gradients of ``params`` over the expert-parallel ranks (a collective):
    the replicated parameters (identical on every rank) count once, the ``experts`` (each rank
    its own) are summed over the ranks."""
    from megatron.core import parallel_state

    def square(chosen: list[Tensor]) -> Tensor:
        norm = torch.nn.utils.get_total_norm(chosen) if chosen else torch.zeros(())
        return norm.float().cpu().pow(2)

    grads = [p for p in params if p.grad is not None]
    own = square([p.grad for p in grads if id(p) in experts])
    dist.all_reduce(own, group=parallel_state.get_expert_model_parallel_group())
    return (square([p.grad for p in grads if id(p) not in experts]) + own).sqrt()


def _position(items: list[Any], item: Any) -> int:
    """Index of ``item`` (by identity) in ``items``."""
    return next(i for i, x in enumerate(items) if x is item)


def pipeline_grad_norm(params: list[nn.Parameter], skip: set[int]) -> Tensor:
    """L2 norm of the gradients of ``params`` over the pipeline stages and, under TP x PP, the
    tensor-parallel ranks of each (a collective over megatron's model-parallel group): each
    stage's own parameters summed in squares, a TP-replicated one counted on TP rank 0 only
    (:func:`tp_grad_norm`'s rule), ``skip`` (the last stage's copy of tied word embeddings,
    whose gradient equals the first stage's) left out."""
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import param_is_not_tensor_parallel_duplicate

    grads = [
        p.grad
        for p in params
        if p.grad is not None and id(p) not in skip and param_is_not_tensor_parallel_duplicate(p)
    ]
    square = (torch.nn.utils.get_total_norm(grads) if grads else torch.zeros(())).float()
    square = square.cpu().pow(2)
    dist.all_reduce(square, group=parallel_state.get_model_parallel_group())
    return square.sqrt()


def sum_partial_grads(params: list[nn.Parameter], partial: set[int]) -> None:
    """Sum over the tensor-parallel ranks the gradients of replicated parameters that each rank
    sees only part of: the q/k layernorms, applied per head to the rank's own heads, and under
    sequence parallel the norms and the MoE router, applied to the rank's own tokens (what
    Megatron's ``finalize_model_grads`` does for them)."""
    from megatron.core import parallel_state

    if parallel_state.get_tensor_model_parallel_world_size() <= 1:
        return
    group = parallel_state.get_tensor_model_parallel_group()
    for p in params:
        if id(p) in partial and p.grad is not None:
            dist.all_reduce(p.grad, group=group)


class MegatronBackend(TorchBackend):
    """Actor + critic as megatron-core models; see the module docstring."""

    backend_name = "megatron"
    # the models' core attention (trainer.backends.megatron.sdpa_attention.resolve_attention):
    # "auto" is PyTorch's fused SDPA per packed row where TransformerEngine is not importable
    attention: AttentionChoice = "auto"

    def __init__(self, config: TrainerConfig, model_dir: str | Path | None = None) -> None:
        from trainer.backends.megatron import convert
        from trainer.backends.megatron.model import check_supported, init_parallel, is_moe

        source = model_dir if model_dir is not None else config.model
        if not source:
            raise BackendError("no model directory: set trainer.model or pass model_dir")
        self.model_dir = Path(source).resolve()
        self.config = config
        self.device = torch.device(config.device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise BackendError(f"device {config.device} requested but CUDA is not available")
        hf_config, self.tokenizer, hf_weights = _read_source(self.model_dir)
        check_supported(hf_config)
        tp, cp = config.megatron.tensor_parallel, config.megatron.context_parallel
        self._check_context_parallel(hf_config, cp)
        convert.check_tensor_parallel(hf_config, tp)
        pp = config.megatron.pipeline_parallel
        if pp > 1 and is_moe(hf_config):
            raise BackendError("a MoE model under pipeline parallel is not built yet")
        ep = config.megatron.expert_parallel
        convert.check_expert_parallel(hf_config, ep)
        if config.megatron.distributed_optimizer and ep > 1:
            raise BackendError(
                "the distributed optimizer shards over data-parallel ranks: it is not built "
                "with expert parallel yet (the EP ranks hold different experts and share no "
                "data-parallel group)"
            )
        if ep > 1 and (tp > 1 or pp > 1):
            raise BackendError(
                "expert parallel with tensor or pipeline parallel is not built in the megatron "
                "backend yet"
            )
        init_parallel(tp, config.seed, pp, ep, self.device, cp)
        self.hf_config = hf_config
        self.pp, self.ep, self.cp = pp, ep, cp
        self._check_world(tp, pp, ep, cp)
        torch.manual_seed(config.seed)
        self.tp_rank = self._tp_rank()
        weights = convert.hf_to_megatron(
            hf_weights, hf_config, self.tp_rank, tp, self._ep_rank(), ep
        )
        if pp > 1:
            weights = convert.pipeline_stage(weights, hf_config, self._pp_rank(), pp)
        self._build_models(weights)
        self._last_shard: tuple[PackedInputs, ShardedInputs] | None = None
        self.fingerprint = self._layout_fingerprint()
        self.dp = self._data_parallel(tp, pp, ep, cp)
        self._init_optimizers()
        self.version = 0
        self.steps = 0
        pad = self.tokenizer.pad_token_id
        self.pad_id = int(pad if pad is not None else 0)
        self.vocab_size = int(hf_config.vocab_size)

    def _build_models(self, weights: dict[str, Tensor]) -> None:
        """Actor, critic (attention and embeddings frozen) and, with a KL term, the frozen
        reference policy, each a ``GPTModel`` holding this rank's ``weights``."""
        from trainer.backends.megatron import convert
        from trainer.backends.megatron.model import (
            MegatronScorer,
            MegatronValueModel,
            build_gpt,
            embeddings_require_grad,
            layers_under_autocast,
        )

        config, hf_config = self.config, self.hf_config

        def gpt(recompute: bool = config.activation_checkpointing) -> nn.Module:
            model = build_gpt(hf_config, recompute=recompute, attention=self.attention)
            convert.load_into(model, weights)
            if recompute:  # the recomputed layer must compute what its forward computed
                layers_under_autocast(model, self._autocast)
            return model.to(self.device)

        self.actor = gpt()
        generator = torch.Generator().manual_seed(config.seed)  # the torch critic's head init
        head, std = config.critic.head, config.critic.head_init_std
        body = gpt()
        if config.activation_checkpointing:
            embeddings_require_grad(body)  # frozen embeddings, recomputed trainable layers
        critic = MegatronValueModel(body, int(hf_config.hidden_size), head, std, generator)
        try:
            self.frozen_critic_params = freeze_attention(critic)
        except ValueError as exc:
            raise BackendError(str(exc)) from exc
        self.critic = critic.to(self.device)
        self.scorer = MegatronScorer(self.actor)
        self.reference = None
        if config.kl_coef > 0:
            self.reference = MegatronScorer(gpt(False).requires_grad_(False).eval())
        self.actor.train()
        self.critic.train()
        self.expert_params = {
            id(p)
            for model in (self.actor, self.critic)
            for name, p in model.named_parameters()
            if ".mlp.experts." in name
        }
        self.partial_grads = {
            id(p)
            for model in (self.actor, self.critic)
            for name, p in model.named_parameters()
            if "q_layernorm" in name
            or "k_layernorm" in name
            or getattr(p, "sequence_parallel", False)  # norms and router: own tokens only
        }

    @staticmethod
    def _check_context_parallel(hf_config: Any, cp: int) -> None:
        """Context parallel is built for dense models (PP=EP=1: the config refuses them)."""
        from trainer.backends.megatron.model import is_moe

        if cp > 1 and is_moe(hf_config):
            raise BackendError("a MoE model under context parallel is not built yet")

    @staticmethod
    def _data_parallel(tp: int, pp: int, ep: int, cp: int = 1) -> DataParallel:
        """The data-parallel ranks: the world at TP=PP=EP=CP=1; megatron's data-parallel group
        under TP, PP or CP (each member a replica of TP ranks, PP stages or CP ranks, which
        hold the same rows); none under EP (its ranks hold the same rows, the world is one
        replica)."""
        from megatron.core import parallel_state

        if tp == pp == ep == cp == 1:
            return DataParallel.current()
        if ep == 1:  # replicas of TP ranks, PP stages or CP ranks
            return DataParallel.of_group(parallel_state.get_data_parallel_group())
        return DataParallel()

    @staticmethod
    def _check_world(tp: int, pp: int = 1, ep: int = 1, cp: int = 1) -> None:
        world = dist.get_world_size()
        if tp > 1 and world % tp:
            raise BackendError(f"world size {world} is not a multiple of TP={tp}")
        if pp > 1 and world % pp:
            raise BackendError(f"world size {world} is not a multiple of PP={pp}")
        if cp > 1 and world % cp:
            raise BackendError(f"world size {world} is not a multiple of CP={cp}")
        if ep > 1 and world != ep:
            raise BackendError(
                f"world size {world} with EP={ep}: expert and data parallel together are not "
                "built in the megatron backend yet (EP = world)"
            )

    @staticmethod
    def _tp_rank() -> int:
        from megatron.core import parallel_state

        return int(parallel_state.get_tensor_model_parallel_rank())

    @staticmethod
    def _ep_rank() -> int:
        from megatron.core import parallel_state

        return int(parallel_state.get_expert_model_parallel_rank())

    @staticmethod
    def _pp_rank() -> int:
        from megatron.core import parallel_state

        return int(parallel_state.get_pipeline_model_parallel_rank())

    # ------------------------------------------------------------------ pipeline parallel

    @torch.no_grad()
    def _forward(  # type: ignore[override]
        self, batch: TrainBatch, plan: list[Any], actor: bool, critic: bool, raw: bool = False
    ) -> ForwardResult:
        """The torch backend's no-grad forwards; under pipeline parallel through megatron's
        1F1B schedule (:mod:`trainer.backends.megatron.pipeline`), the last stage's outputs
        summed onto every stage (so every stage evaluates the same objective)."""
        if self.pp == 1:
            result = super()._forward(batch, plan, actor, critic, raw)
            for tensor in (result.logprobs, result.values, result.entropy):
                self._context_sum(tensor)
            return result
        views = [m.view(batch) for m in plan]
        shape = tuple(batch.tokens.shape)
        logp = ent = torch.zeros(shape, dtype=torch.float32, device=self.device)
        if actor:
            logp, ent = self._pipeline_logprobs(batch, plan, views, self.scorer, entropy=True)
        values = None
        if critic:
            head = self._critic_head(raw)

            def masked(mb: TrainBatch, out: Tensor) -> list[Tensor]:
                return [torch.where(mb.action_mask, out, torch.zeros_like(out))]

            body = self.critic.body
            values = self._pipeline_outputs(batch, plan, views, body, head, masked, 1)[0]
        return ForwardResult(logprobs=logp, values=values, entropy=ent)

    def _pipeline_logprobs(
        self,
        batch: TrainBatch,
        plan: list[Any],
        views: list[tuple[TrainBatch, PackedInputs]],
        scorer: Any,
        entropy: bool = False,
    ) -> tuple[Tensor, Tensor]:
        """``[N, T]`` logprobs and entropies (0 unless ``entropy``) of ``scorer`` (the actor
        or the KL reference, a :class:`~trainer.backends.megatron.model.MegatronScorer` of
        this stage) through the pipeline, whole on every stage and replica."""

        def logprobs(mb: TrainBatch, logits: Tensor) -> list[Tensor]:
            return list(self._token_logprobs(mb, logits, entropy=entropy))

        model, head = scorer.model, self._autocast_head(scorer.head)
        logp, ent = self._pipeline_outputs(batch, plan, views, model, head, logprobs, 2)
        return logp, ent

    def _pipeline_outputs(
        self,
        batch: TrainBatch,
        plan: list[Any],
        views: list[tuple[TrainBatch, PackedInputs]],
        model: nn.Module,
        head: Any,
        fill: Any,
        count: int,
    ) -> list[Tensor]:
        """Run ``plan``'s micro-batches (``views``) through megatron's 1F1B schedule
        (:mod:`trainer.backends.megatron.pipeline`, forward only) over this stage of
        ``model``; on the last stage ``fill(mb, head_output)`` gives a micro-batch's ``count``
        ``[n, t]`` outputs, written at its rows of ``[N, T]`` tensors (the other stages write
        none); the tensors are summed over the pipeline group (the last stage's outputs onto
        every stage), then over the data-parallel replicas."""
        from megatron.core import parallel_state

        from trainer.backends.megatron.pipeline import pipeline_forward

        outputs = pipeline_forward(model, [v[1] for v in views], head, self._autocast)
        shape = tuple(batch.tokens.shape)
        out = [torch.zeros(shape, dtype=torch.float32, device=self.device) for _ in range(count)]
        for i, (m, (mb, _)) in enumerate(zip(plan, views, strict=True)):
            if not outputs or not m.real:  # not the last stage: zeros to the sum
                continue
            rows, width = m.rows.to(self.device), mb.tokens.shape[1]
            for tensor, part in zip(out, fill(mb, outputs[i]), strict=True):
                tensor[rows, :width] = part
        for tensor in out:
            dist.all_reduce(tensor, group=parallel_state.get_pipeline_model_parallel_group())
            self.dp.sum(tensor)
        return out

    # ------------------------------------------------------------------ context parallel

    def _context_sum(self, tensor: Tensor | None) -> None:
        """Sum ``tensor`` over the CP group in place: each token's output is non-zero on the
        one CP rank that holds it, so every rank gets the whole batch's."""
        if self.cp > 1 and tensor is not None:
            from megatron.core import parallel_state

            dist.all_reduce(tensor, group=parallel_state.get_context_parallel_group())

    def _shard(self, inputs: PackedInputs) -> ShardedInputs:
        """This CP rank's part of ``inputs`` (the last micro-batch's kept: the actor and the
        critic of one forward share it)."""
        from trainer.backends.megatron.cp_layout import shard_inputs

        last = self._last_shard
        if last is not None and last[0] is inputs:
            return last[1]
        from megatron.core import parallel_state

        shard = shard_inputs(inputs, self.cp, parallel_state.get_context_parallel_rank())
        self._last_shard = (inputs, shard)
        return shard

    def _actor_logprobs(  # type: ignore[override]
        self,
        mb: TrainBatch,
        inputs: PackedInputs,
        entropy: bool = False,
        scorer: Any = None,
    ) -> tuple[Tensor, Tensor]:
        """The torch backend's; under context parallel the logits of this CP rank's tokens
        only: ``[n, t]`` logprobs and entropies, 0 at the other ranks' tokens."""
        if self.cp == 1:
            return super()._actor_logprobs(mb, inputs, entropy, scorer)
        from trainer.backends.megatron.cp_layout import scatter_owned

        shard = self._shard(inputs)
        with self._autocast():
            logits = (scorer or self.scorer)(shard)  # [m, vocab]
        owned = shard.owned
        temperature = self.config.rollout_temperature
        logp, ent = token_logprobs(
            logits, mb.tokens[owned], mb.action_mask[owned], temperature, entropy
        )
        return scatter_owned(logp, owned), scatter_owned(ent, owned)

    def _critic_values(self, mb: TrainBatch, inputs: PackedInputs, raw: bool = False) -> Tensor:
        """The torch backend's; under context parallel the values of this CP rank's tokens
        only (0 at the other ranks')."""
        if self.cp == 1:
            return super()._critic_values(mb, inputs, raw)
        from trainer.backends.megatron.cp_layout import scatter_owned

        shard = self._shard(inputs)
        with self._autocast():
            values = scatter_owned(self.critic(shard, raw=raw), shard.owned)
        return torch.where(mb.action_mask, values, torch.zeros_like(values))

    @torch.no_grad()
    def _reference_logprobs(self, batch: TrainBatch, plan: list[Any]) -> Tensor:
        """The torch backend's; under pipeline parallel through the reference's stages like
        the actor's logprobs; under context parallel summed over the CP group."""
        if self.pp > 1:
            assert self.reference is not None
            views = [m.view(batch) for m in plan]
            return self._pipeline_logprobs(batch, plan, views, self.reference)[0]
        out = super()._reference_logprobs(batch, plan)
        self._context_sum(out)
        return out

    def _sum_gradient_shares(self, params: list[nn.Parameter]) -> None:
        """Sum the gradients over the data-parallel ranks, with the CP ranks of each replica
        under context parallel: each backpropagated its own rows' (tokens') share."""
        if self.cp > 1:
            from megatron.core import parallel_state

            group = parallel_state.get_data_parallel_group(with_context_parallel=True)
        elif self.dp.enabled:
            group = self.dp.group  # None: the world
        else:
            return
        for p in params:
            if p.grad is not None:
                dist.all_reduce(p.grad, group=group)

    # ------------------------------------------------------------------ pipeline heads

    def _autocast_head(self, head: Head) -> Head:
        """``head`` run under the forwards' autocast (``precision: bf16``), as the PP=1
        forwards run the model's last part: what follows it (logprobs, masks) runs outside."""

        def autocast_head(hidden: Tensor, inputs: Any) -> Tensor:
            with self._autocast():
                return head(hidden, inputs)

        return autocast_head

    def _critic_head(self, raw: bool) -> Head:
        critic = self.critic

        def head(hidden: Tensor, inputs: Any) -> Tensor:
            return critic.head(hidden, inputs, raw)

        return self._autocast_head(head)

    def _backprop(  # type: ignore[override]
        self, batch: TrainBatch, plan: list[Any], grad: Tensor, forward: Any
    ) -> None:
        """The torch backend's ``d/dtheta sum(out * grad)`` over the micro-batches; under
        pipeline parallel through megatron's 1F1B schedule (forward and backward), ``forward``
        naming the model: the actor's logprobs or the critic's raw outputs."""
        if self.pp == 1:
            return super()._backprop(batch, plan, grad, forward)
        from trainer.backends.megatron.pipeline import pipeline_backward

        views = [m.view(batch) for m in plan]
        grads = []
        for m, (mb, _) in zip(plan, views, strict=True):
            g = grad.index_select(0, m.rows.to(grad.device))[:, : mb.tokens.shape[1]]
            grads.append(g if m.real else torch.zeros_like(g))
        inputs = [v[1] for v in views]
        if forward == self._actor_logp:
            masks = [mb for mb, _ in views]
            logits = self._autocast_head(self.scorer.head)

            def logp_head(hidden: Tensor, packed: Any) -> Tensor:
                mb = masks[_position(inputs, packed)]
                return self._token_logprobs(mb, logits(hidden, packed), False)[0]

            pipeline_backward(self.actor, inputs, logp_head, grads, self._autocast)
        elif forward == self._critic_raw:
            masks = [mb for mb, _ in views]
            raw_values = self._critic_head(raw=True)

            def value_head(hidden: Tensor, packed: Any) -> Tensor:
                mb = masks[_position(inputs, packed)]
                out = raw_values(hidden, packed)
                return torch.where(mb.action_mask, out, torch.zeros_like(out))

            pipeline_backward(self.critic.body, inputs, value_head, grads, self._autocast)
        else:
            raise BackendError(f"no pipeline-parallel backward for {forward}")
        self._sum_tied_embedding_grads()
        return None

    def _tied_copy(self) -> set[int]:
        """The last stage's output layer when it is a copy of the first stage's embeddings."""
        from megatron.core import parallel_state

        if self.hf_config.tie_word_embeddings and not parallel_state.is_pipeline_first_stage():
            return {id(self.actor.shared_embedding_or_output_weight())}
        return set()

    def _sum_tied_embedding_grads(self) -> None:
        """With tied embeddings the first stage's word embeddings and the last stage's output
        layer are one HF tensor: sum their gradients over the two (megatron's embedding
        group), as one process accumulates both uses into one gradient."""
        from megatron.core import parallel_state

        if not self.hf_config.tie_word_embeddings:
            return
        weight = self.actor.shared_embedding_or_output_weight()
        if not weight.requires_grad:
            return
        if weight.grad is None:
            weight.grad = torch.zeros_like(weight)
        dist.all_reduce(weight.grad, group=parallel_state.get_embedding_group())

    def _clip_and_step(  # type: ignore[override]
        self,
        params: list[nn.Parameter],
        optimizer: torch.optim.Optimizer,
        scheduler: torch.optim.lr_scheduler.LRScheduler,
        max_norm: float,
    ) -> float:
        """The torch backend's clip-and-step with the global grad norm over tensor-parallel
        shards: each sharded parameter counts on its rank, a replicated one (norms, the value
        head) once; the clip coefficient is torch's ``max_norm / (norm + 1e-6)``, at most 1."""
        self._sum_gradient_shares(params)
        sum_partial_grads(params, self.partial_grads)
        if self.ep > 1:
            # Every EP rank scored the whole batch and its tokens reached every expert's owner:
            # an expert's gradient is the sum of the EP ranks' identical copies of it
            for p in params:
                if id(p) in self.expert_params and p.grad is not None:
                    p.grad.div_(self.ep)
            norm = expert_parallel_grad_norm(params, self.expert_params)
        elif self.pp > 1:
            norm = pipeline_grad_norm(params, self._tied_copy())
        else:
            norm = tp_grad_norm(params)
        if max_norm > 0:
            coef = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
            for p in params:
                if p.grad is not None:
                    p.grad.mul_(coef.to(p.grad.device))
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        return float(norm)

    # ------------------------------------------------------------------ weights out

    def _megatron_state(self) -> dict[str, Tensor]:
        """This rank's actor parameters under Megatron names, detached."""
        return {name: p.detach() for name, p in self.actor.named_parameters()}

    def _gathered_state(self) -> Iterator[tuple[str, Tensor]]:
        """The actor's tensors under HF checkpoint names, whole (gathered over TP ranks)."""
        from megatron.core import parallel_state

        from trainer.backends.megatron import convert

        local = {k: v.to("cpu") for k, v in self._megatron_state().items()}
        tp = self.config.megatron.tensor_parallel
        shards: list[dict[str, Tensor]] = [local]
        if tp > 1:  # this stage's TP shards (this replica's TP ranks), rank r's at r
            shards = [None] * tp  # type: ignore[list-item]
            group = parallel_state.get_tensor_model_parallel_group()
            dist.all_gather_object(shards, local, group=group)
        if self.pp > 1:  # every stage's TP shards (this replica's), then each TP rank's whole
            stages: list[Any] = [None] * self.pp
            group = parallel_state.get_pipeline_model_parallel_group()
            dist.all_gather_object(stages, shards, group=group)
            shards = [
                convert.merge_pipeline_stages([stage[r] for stage in stages], self.hf_config)
                for r in range(tp)
            ]
        elif self.ep > 1:  # the expert-parallel group is the world: every rank's experts
            ranks: list[Any] = [None] * self.ep
            dist.all_gather_object(ranks, local)
            shards = [convert.merge_expert_parallel(ranks, self.hf_config)]
        yield from convert.megatron_to_hf(shards, self.hf_config).items()

    def named_weights(self) -> Iterator[tuple[str, Tensor]]:
        """The actor's tensors under their HF checkpoint names (tied ``lm_head`` omitted),
        whole and detached; every tensor-parallel rank must iterate (one gather)."""
        yield from self._gathered_state()

    def export_hf(self, directory: str | Path) -> Path:
        """Write the actor as a HF model directory (safetensors, config, tokenizer), atomically
        (rank 0 writes; every rank calls)."""
        from safetensors.torch import save_file

        weights = dict(self._gathered_state())
        target = Path(directory).resolve()
        if dist.get_rank() == 0:
            with atomic_directory(directory) as staging:
                save_file(weights, str(staging / "model.safetensors"), metadata={"format": "pt"})
                for item in self.model_dir.iterdir():
                    name = item.name
                    if item.is_file() and (
                        name in CONFIG_FILES or name.startswith(TOKENIZER_FILES)
                    ):
                        shutil.copy2(item, staging / name)
                stamp = {
                    "policy_version": self.version,
                    "steps": self.steps,
                    "source": str(self.model_dir),
                    "backend": "megatron",
                }
                (staging / EXPORT_STAMP).write_text(json.dumps(stamp, indent=2) + "\n")
        if dist.get_world_size() > 1:
            dist.barrier()
        return target

    # ------------------------------------------------------------------ checkpoints

    def save(self, directory: str | Path, extra: Mapping[str, Any] | None = None) -> Path:
        """Full checkpoint in the torch backend's layout (:mod:`trainer.backends.torch_checkpoint`:
        DCP shards of actor, critic and both AdamW states under Megatron names, schedulers, RNG
        states with megatron's model-parallel tracker, manifest). Every rank calls it; under
        tensor, pipeline or expert parallel each rank's shard is keyed by its coordinates."""
        return torch_checkpoint.save(self, directory, extra)

    def load(self, directory: str | Path) -> dict[str, Any]:
        """Restore a checkpoint written by :meth:`save` into the same model-parallel layout
        (checked, with the files' checksums, before anything changes)."""
        return torch_checkpoint.load(self, directory)

    def _model_parallel(self) -> bool:
        return self.config.megatron.tensor_parallel * self.pp * self.ep > 1

    def _zero(self) -> bool:
        """Whether the AdamW states are sharded over the data-parallel ranks."""
        return self.config.megatron.distributed_optimizer and self.dp.enabled

    def checkpoint_scope(self, part: str = "model") -> str:
        """``tp<r>-pp<r>-ep<r>``, this rank's coordinates, under model parallel (each rank's
        tensors are its own shard); none otherwise (data-parallel replicas share keys). The
        optimiser states under the distributed optimiser: ``dp<r>`` (each rank's shard)."""
        scope = ""
        if self._model_parallel():
            scope = f"tp{self.tp_rank}-pp{self._pp_rank()}-ep{self._ep_rank()}"
        if part == "optimizer" and self._zero():
            scope = "-".join(filter(None, (scope, f"dp{self.dp.rank}")))
        return scope

    def checkpoint_parallel(self) -> dict[str, int]:
        """TP, PP and EP (and the data-parallel ranks the optimiser states are sharded over):
        a checkpoint loads into the layout it was saved from."""
        layout = {
            "tensor_parallel": self.config.megatron.tensor_parallel,
            "pipeline_parallel": self.pp,
            "expert_parallel": self.ep,
        }
        if self._zero():
            layout["optimizer_shards"] = self.dp.world
        return layout

    def checkpoint_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        """Under the distributed optimiser this rank's local AdamW (its shard of the states)."""
        from torch.distributed.optim import ZeroRedundancyOptimizer

        return optimizer.optim if isinstance(optimizer, ZeroRedundancyOptimizer) else optimizer

    def _init_optimizers(self) -> None:
        """The torch backend's AdamW and schedules; with ``megatron.distributed_optimizer``
        under data parallel each AdamW is torch's ``ZeroRedundancyOptimizer`` (ZeRO-1) over the
        data-parallel group (the world, or under TP / PP megatron's group of the replicas of
        this rank's shard or stage): every rank keeps the states of its share of the
        parameters, updates that share from the summed gradients and broadcasts it to the
        group, so the step is the replicated one."""
        if not self._zero():
            super()._init_optimizers()
            return
        from torch.distributed.optim import ZeroRedundancyOptimizer

        config = self.config

        def zero(params: list[nn.Parameter], cfg: Any) -> torch.optim.Optimizer:
            return ZeroRedundancyOptimizer(
                params,
                optimizer_class=torch.optim.AdamW,
                process_group=self.dp.group,
                lr=cfg.lr,
                betas=cfg.betas,
                eps=cfg.eps,
                weight_decay=cfg.weight_decay,
            )

        self.actor_optimizer = zero(list(self.actor.parameters()), config.actor)
        trainable = [p for p in self.critic.parameters() if p.requires_grad]
        self.critic_optimizer = zero(trainable, config.critic.optimizer)
        self._init_schedulers()

    def backend_rng_state(self) -> dict[str, Any]:
        """Megatron's model-parallel RNG streams (the tracker dropout forks)."""
        from megatron.core.tensor_parallel.random import get_cuda_rng_tracker

        states = get_cuda_rng_tracker().get_states()
        return {"megatron_tracker": {k: v for k, v in states.items() if isinstance(v, Tensor)}}

    def set_backend_rng_state(self, state: Mapping[str, Any]) -> None:
        from megatron.core.tensor_parallel.random import get_cuda_rng_tracker

        saved = state.get("megatron_tracker")
        if saved:
            tracker = get_cuda_rng_tracker()
            tracker.set_states({**tracker.get_states(), **saved})

    def _layout_fingerprint(self) -> str:
        """The checkpoint fingerprint of the whole model-parallel layout: every rank's
        coordinates and parameter names / shapes (a collective under model parallel; pipeline
        stages and expert ranks hold different parameters)."""
        local = _fingerprint(self.actor, self.critic)
        if not self._model_parallel():
            return local
        ranks: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(ranks, (self.checkpoint_scope(), local))
        digest = hashlib.sha256()
        for scope, fingerprint in sorted(set(ranks)):
            digest.update(f"{scope}:{fingerprint};".encode())
        return digest.hexdigest()
