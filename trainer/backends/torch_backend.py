"""The ``torch`` backend: a transformers causal LM as actor, :class:`ValueModel` as critic.

One step (docs/trainer.md "One train step"):

1. no-grad forward of actor and critic over every micro-batch: the recomputed logprobs (the
   train / rollout mismatch is measured on them), the entropy, and ``V_old``;
2. the objective (:func:`trainer.algorithms.compute_objective`) on the **whole batch**, with
   the logprobs and values as detached leaves: every normaliser (per-trajectory ``1/sum(m)``,
   group statistics, whitening, the ranking pairs) is global, and autograd gives the exact
   per-token gradients ``dL/dlogp`` and ``dL/dV``;
3. per micro-batch, forward with grad and backpropagate ``sum(logp * dL/dlogp)`` (the chain
   rule: the accumulated parameter gradient equals that of the whole-batch loss), clip, AdamW
   step; the policy version advances by one;
4. ``K`` critic passes the same way; passes after the first recompute ``V`` (no grad) and the
   critic loss against the frozen ``V_old``.

With ``torch.distributed`` initialised, FSDP2 shards both models over the ranks and each rank
trains its share of the groups (:mod:`trainer.backends.parallel`).

fp32 everywhere by default; ``precision="bf16"`` autocasts the forwards to bfloat16 on the GPU
while the parameters and AdamW states (the master weights) stay float32.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import shutil
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from trainer.algorithms import compute_objective
from trainer.backends import torch_checkpoint
from trainer.backends.base import BackendError, ForwardResult, StepObjective
from trainer.backends.critic import ValueModel, freeze_attention
from trainer.backends.parallel import DataParallel, full_tensor, shard
from trainer.checkpoint import atomic_directory
from trainer.config import OptimizerConfig, TrainerConfig
from trainer.data import TrainBatch, plan_micro_batches

CRITIC_ALGORITHMS = frozenset({"lisao", "li2sao"})
# Files of a HF model directory that describe the tokenizer and chat template (copied verbatim).
TOKENIZER_FILES = ("tokenizer", "special_tokens_map", "vocab", "merges", "added_tokens",
                   "chat_template")  # fmt: skip
EXPORT_STAMP = "swerl_export.json"


def _load_models(model_dir: Path) -> tuple[nn.Module, nn.Module, Any]:
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoTokenizer

    if not (model_dir / "config.json").is_file():
        raise BackendError(f"{model_dir} is not a Hugging Face model directory (no config.json)")
    try:
        config = AutoConfig.from_pretrained(model_dir)
    except (ValueError, KeyError, OSError) as exc:
        raise BackendError(f"cannot read the model config in {model_dir}: {exc}") from exc
    archs = list(getattr(config, "architectures", None) or [])
    if not any(a.endswith("ForCausalLM") for a in archs):
        raise BackendError(
            f"{model_dir}: unsupported model architecture {archs or config.model_type!r} "
            "(the torch backend trains *ForCausalLM models)"
        )
    try:
        actor = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        body = AutoModel.from_pretrained(model_dir, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
    except (ValueError, KeyError, OSError) as exc:
        raise BackendError(f"cannot load the model in {model_dir}: {exc}") from exc
    return actor, body, tokenizer


def _warmup(config: OptimizerConfig) -> Callable[[int], float]:
    steps = config.warmup_steps
    return lambda step: min(1.0, (step + 1) / steps) if steps else 1.0


def _optimizer(params: list[nn.Parameter], config: OptimizerConfig) -> torch.optim.AdamW:
    return torch.optim.AdamW(
        params,
        lr=config.lr,
        betas=config.betas,
        eps=config.eps,
        weight_decay=config.weight_decay,
    )


def _positions(mb: TrainBatch) -> Tensor:
    """``[n, t]`` full-sequence index of the hidden state that predicts post-prompt token t."""
    t = mb.tokens.shape[1]
    pos = mb.prompt_lengths[:, None] - 1 + torch.arange(t, device=mb.tokens.device)
    return pos.clamp(max=mb.input_ids.shape[1] - 1)


class PolicyScorer(nn.Module):
    """The actor as one module: logits at given positions only (FSDP2 shards it as a root)."""

    def __init__(self, lm: nn.Module) -> None:
        super().__init__()
        self.lm = lm

    def forward(self, input_ids: Tensor, positions: Tensor) -> Tensor:
        body = getattr(self.lm, self.lm.base_model_prefix)
        hidden = body(input_ids=input_ids, use_cache=False).last_hidden_state
        picked = hidden.gather(1, positions[..., None].expand(-1, -1, hidden.shape[-1]))
        return self.lm.get_output_embeddings()(picked)


@dataclass(frozen=True)
class _Micro:
    """Global row indices of one micro-batch; ``real`` False: a pass that only keeps this
    rank's collectives in step with ranks that have more micro-batches (its output unused)."""

    rows: Tensor
    real: bool = True


def _layers(module: nn.Module) -> nn.ModuleList:
    layers = getattr(module, "layers", None)
    if not isinstance(layers, nn.ModuleList):
        raise BackendError(f"{type(module).__name__} has no 'layers' list to shard with FSDP2")
    return layers


def _fingerprint(*modules: nn.Module) -> str:
    """Hash of every parameter's name, shape and dtype: checkpoints of another model differ."""
    digest = hashlib.sha256()
    for module in modules:
        for name, tensor in module.state_dict().items():
            digest.update(f"{name}:{tuple(tensor.shape)}:{tensor.dtype};".encode())
    return digest.hexdigest()


class TorchBackend:
    """Actor + critic in one process per rank (CPU or GPU); see the module docstring."""

    def __init__(self, config: TrainerConfig, model_dir: str | Path | None = None) -> None:
        source = model_dir if model_dir is not None else config.model
        if not source:
            raise BackendError("no model directory: set trainer.model or pass model_dir")
        self.model_dir = Path(source).resolve()
        self.config = config
        self.device = torch.device(config.device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise BackendError(f"device {config.device} requested but CUDA is not available")
        torch.manual_seed(config.seed)
        actor, body, self.tokenizer = _load_models(self.model_dir)
        hidden = int(actor.config.hidden_size)
        generator = torch.Generator().manual_seed(config.seed)
        critic = ValueModel(
            body, hidden, config.critic.head, config.critic.head_init_std, generator
        )
        try:
            self.frozen_critic_params = freeze_attention(critic)
        except ValueError as exc:
            raise BackendError(str(exc)) from exc
        self.actor = actor.to(self.device)
        self.critic = critic.to(self.device)
        self.scorer = PolicyScorer(self.actor)
        if config.activation_checkpointing:
            self.actor.gradient_checkpointing_enable()
            self.critic.body.gradient_checkpointing_enable()
        self.actor.train()
        self.critic.train()
        self.fingerprint = _fingerprint(self.actor, self.critic)
        self.dp = DataParallel.current()
        if self.dp.enabled:
            shard(self.scorer, _layers(getattr(self.actor, self.actor.base_model_prefix)))
            shard(self.critic, _layers(self.critic.body))
        self.actor_optimizer = _optimizer(list(self.actor.parameters()), config.actor)
        trainable = [p for p in self.critic.parameters() if p.requires_grad]
        self.critic_optimizer = _optimizer(trainable, config.critic.optimizer)
        self.actor_scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.actor_optimizer, _warmup(config.actor)
        )
        self.critic_scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.critic_optimizer, _warmup(config.critic.optimizer)
        )
        self.version = 0
        self.steps = 0
        pad = self.tokenizer.pad_token_id
        self.pad_id = int(pad if pad is not None else 0)
        self.vocab_size = int(actor.config.vocab_size)

    # ------------------------------------------------------------------ forwards

    def _autocast(self) -> contextlib.AbstractContextManager[Any]:
        if self.config.precision == "bf16":
            return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def _actor_logprobs(self, mb: TrainBatch, entropy: bool = False) -> tuple[Tensor, Tensor]:
        """``[n, t]`` logprobs of the post-prompt tokens (0 off actions), and the entropy."""
        with self._autocast():
            logits = self.scorer(mb.input_ids, _positions(mb))
        logits = logits.float()
        if self.config.rollout_temperature != 1.0:
            logits = logits / self.config.rollout_temperature
        logp_all = torch.log_softmax(logits, dim=-1)
        logp = logp_all.gather(-1, mb.tokens.clamp(min=0)[..., None]).squeeze(-1)
        logp = torch.where(mb.action_mask, logp, torch.zeros_like(logp))
        ent = torch.zeros_like(logp)
        if entropy:
            ent = -(logp_all.exp() * logp_all).sum(-1)
            ent = torch.where(mb.action_mask, ent, torch.zeros_like(ent))
        return logp, ent

    def _critic_values(self, mb: TrainBatch) -> Tensor:
        with self._autocast():
            values = self.critic(mb.input_ids, _positions(mb))
        return torch.where(mb.action_mask, values, torch.zeros_like(values))

    def _plan(self, batch: TrainBatch) -> list[_Micro]:
        """This rank's micro-batches (global row indices), as many on every rank."""
        mine = self.dp.rows(batch)
        micro: list[_Micro] = []
        self._padding_fraction = 0.0
        if mine:
            plan = plan_micro_batches(batch.select(mine), self.config.batch.micro_batch_tokens)
            self._padding_fraction = plan.padding_fraction
            index = torch.tensor(mine, dtype=torch.long)
            micro = [_Micro(index[list(rows)]) for rows in plan.micro_batches]
        for _ in range(self.dp.max_int(len(micro)) - len(micro)):
            micro.append(_Micro(torch.zeros(1, dtype=torch.long), real=False))
        return micro

    @torch.no_grad()
    def _forward(
        self, batch: TrainBatch, plan: list[_Micro], actor: bool, critic: bool
    ) -> ForwardResult:
        shape = tuple(batch.tokens.shape)

        def zeros() -> Tensor:
            return torch.zeros(shape, dtype=torch.float32, device=batch.tokens.device)

        logps, ents = zeros(), zeros()
        values = zeros() if critic else None
        for m in plan:
            mb = batch.select(m.rows)
            rows = m.rows.to(batch.tokens.device)
            width = mb.tokens.shape[1]
            if actor:
                logp, ent = self._actor_logprobs(mb, entropy=True)
                if m.real:
                    logps[rows, :width] = logp
                    ents[rows, :width] = ent
            if values is not None:
                value = self._critic_values(mb)
                if m.real:
                    values[rows, :width] = value
        for tensor in (logps, ents, values):
            if tensor is not None:
                self.dp.sum(tensor)  # each row is non-zero on exactly one rank
        return ForwardResult(logprobs=logps, values=values, entropy=ents)

    def logprobs_and_values(self, batch: TrainBatch) -> ForwardResult:
        """No-grad forward of actor and critic over ``batch`` (micro-batched)."""
        batch = batch.to(self.device)
        return self._forward(batch, self._plan(batch), actor=True, critic=True)

    # ------------------------------------------------------------------ training

    def _objective(
        self,
        batch: TrainBatch,
        objective: StepObjective,
        logp: Tensor,
        values: Tensor | None,
        old_values: Tensor | None,
    ) -> Any:
        ob = batch.objective_batch(logp, values, old_values, trainer_version=self.version)
        return compute_objective(
            objective.algorithm, ob, phase=objective.phase, config=objective.config
        )

    def _backprop(
        self,
        batch: TrainBatch,
        plan: list[_Micro],
        grad: Tensor,
        forward: Callable[[TrainBatch], Tensor],
    ) -> None:
        """Accumulate ``d/dtheta sum(out * grad)`` over the micro-batches."""
        for m in plan:
            mb = batch.select(m.rows)
            out = forward(mb)
            g = grad.index_select(0, m.rows.to(grad.device))[:, : out.shape[1]]
            if not m.real:
                g = torch.zeros_like(g)
            (out * g).sum().backward()

    @staticmethod
    def _clip_and_step(
        params: list[nn.Parameter],
        optimizer: torch.optim.Optimizer,
        scheduler: torch.optim.lr_scheduler.LRScheduler,
        max_norm: float,
    ) -> float:
        norm = nn.utils.clip_grad_norm_(params, max_norm if max_norm > 0 else float("inf"))
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        return float(full_tensor(norm))

    def _mismatch(self, batch: TrainBatch, logp: Tensor) -> dict[str, float]:
        """|recomputed - behaviour| on action tokens sampled by the trainer's own version."""
        same = batch.action_mask & (batch.token_versions == self.version)
        count = int(same.sum())
        if not count:
            return {"mismatch/tokens": 0.0}
        diff = (logp - batch.behavior_logp).abs()[same]
        return {
            "mismatch/tokens": float(count),
            "mismatch/max_abs_logprob_diff": float(diff.max()),
            "mismatch/mean_abs_logprob_diff": float(diff.mean()),
        }

    def train_step(self, batch: TrainBatch, objective: StepObjective) -> dict[str, float]:
        """One actor update and ``K`` critic updates on ``batch``; returns float metrics."""
        if not isinstance(objective, StepObjective):
            raise BackendError(f"objective must be a StepObjective, got {type(objective).__name__}")
        batch = batch.to(self.device)
        plan = self._plan(batch)
        use_critic = objective.algorithm in CRITIC_ALGORITHMS
        first = self._forward(batch, plan, actor=True, critic=use_critic)
        mask = batch.action_mask
        metrics: dict[str, float] = {
            "data/micro_batches": float(len(plan)),
            "data/padding_fraction": self._padding_fraction,
            "actor/entropy": float(first.entropy[mask].mean()),
            **self._mismatch(batch, first.logprobs),
        }
        logp_leaf = first.logprobs.clone().requires_grad_(True)
        values_leaf = None if first.values is None else first.values.clone().requires_grad_(True)
        try:
            result = self._objective(batch, objective, logp_leaf, values_leaf, first.values)
        except ValueError as exc:
            raise BackendError(f"objective rejected the batch: {exc}") from exc
        metrics.update(result.metrics)
        leaves = [logp_leaf] + ([values_leaf] if result.critic_loss is not None else [])
        losses = [result.actor_loss] + (
            [result.critic_loss] if result.critic_loss is not None else []
        )
        grads = [
            torch.autograd.grad(loss, leaf, allow_unused=True)[0]
            for loss, leaf in zip(losses, leaves, strict=True)
        ]
        if objective.update_actor:
            self._backprop(batch, plan, grads[0], lambda mb: self._actor_logprobs(mb)[0])
            metrics["actor/grad_norm"] = self._clip_and_step(
                list(self.actor.parameters()),
                self.actor_optimizer,
                self.actor_scheduler,
                self.config.actor.grad_clip,
            )
            metrics["actor/lr"] = self.actor_optimizer.param_groups[0]["lr"]
            self.version += 1
        passes = objective.critic_updates
        passes = self.config.critic.updates_per_step if passes is None else passes
        if result.critic_loss is not None and passes > 0:
            assert first.values is not None
            metrics.update(self._critic_passes(batch, objective, plan, first, grads[1], passes))
        self.steps += 1
        metrics["trainer/version"] = float(self.version)
        metrics["trainer/steps"] = float(self.steps)
        return metrics

    def _critic_passes(
        self,
        batch: TrainBatch,
        objective: StepObjective,
        plan: list[_Micro],
        first: ForwardResult,
        grad: Tensor | None,
        passes: int,
    ) -> dict[str, float]:
        params = [p for p in self.critic.parameters() if p.requires_grad]
        metrics: dict[str, float] = {}
        for k in range(passes):
            if k > 0:
                now = self._forward(batch, plan, actor=False, critic=True).values
                assert now is not None
                leaf = now.clone().requires_grad_(True)
                result = self._objective(batch, objective, first.logprobs, leaf, first.values)
                assert result.critic_loss is not None
                metrics[f"critic/loss_pass{k}"] = float(result.critic_loss.detach())
                grad = torch.autograd.grad(result.critic_loss, leaf, allow_unused=True)[0]
            if grad is None:  # the loss does not depend on the values (e.g. empty critic mask)
                grad = torch.zeros_like(first.logprobs)
            self._backprop(batch, plan, grad, self._critic_values)
            metrics[f"critic/grad_norm_pass{k}"] = self._clip_and_step(
                params,
                self.critic_optimizer,
                self.critic_scheduler,
                self.config.critic.optimizer.grad_clip,
            )
        metrics["critic/lr"] = self.critic_optimizer.param_groups[0]["lr"]
        return metrics

    # ------------------------------------------------------------------ weights out

    def named_weights(self) -> Iterator[tuple[str, Tensor]]:
        """The actor's tensors under their HF names (tied aliases once), whole and detached.

        Under data parallel every rank must iterate (each tensor is gathered collectively).
        """
        seen: set[int] = set()
        for name, tensor in self.actor.state_dict(keep_vars=True).items():
            if id(tensor) in seen:  # a tied alias (lm_head.weight of tied embeddings)
                continue
            seen.add(id(tensor))
            yield name, full_tensor(tensor.detach())

    def export_hf(self, directory: str | Path) -> Path:
        """Write the actor as a HF model directory (safetensors, config, tokenizer), atomically."""
        weights = dict(self.named_weights())  # collective under data parallel
        if self.dp.rank != 0:
            dist.barrier()
            return Path(directory).resolve()
        with atomic_directory(directory) as staging:
            self.actor.save_pretrained(staging, state_dict=weights)
            for item in self.model_dir.iterdir():
                if item.is_file() and item.name.startswith(TOKENIZER_FILES):
                    shutil.copy2(item, staging / item.name)
            stamp = {
                "policy_version": self.version,
                "steps": self.steps,
                "source": str(self.model_dir),
            }
            (staging / EXPORT_STAMP).write_text(json.dumps(stamp, indent=2) + "\n")
        if self.dp.enabled:
            dist.barrier()
        return Path(directory).resolve()

    # ------------------------------------------------------------------ checkpoints

    def save(self, directory: str | Path, extra: Mapping[str, Any] | None = None) -> Path:
        """Full checkpoint: actor, critic, both optimisers and schedulers, version, steps, RNG
        states, and the caller's JSON-serialisable ``extra`` state (returned by :meth:`load`).

        Sharded with torch.distributed.checkpoint; under data parallel every rank calls it and
        writes its own shards (:mod:`trainer.backends.torch_checkpoint`).
        """
        return torch_checkpoint.save(self, directory, extra)

    def load(self, directory: str | Path) -> dict[str, Any]:
        """Restore a checkpoint written by :meth:`save` (checked before anything changes)."""
        return torch_checkpoint.load(self, directory)
