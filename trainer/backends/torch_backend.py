"""The ``torch`` backend: a transformers causal LM as actor, :class:`ValueModel` as critic.

One step (docs/trainer.md "One train step") runs the algorithm's step plan
(:mod:`trainer.algorithms.step_plans`, registered with the algorithm):

1. no-grad forward of actor and critic over every micro-batch: the recomputed logprobs (the
   train / rollout mismatch is measured on them; an ``old_logp`` phase hands them to the
   objective as the pre-update policy), the entropy, and ``V_old`` (a sigmoid head's logits);
2. per update, the objective (:func:`trainer.algorithms.compute_objective`) on the **whole
   batch**, with the logprobs and critic outputs as detached leaves: every normaliser
   (per-trajectory ``1/sum(m)``, group statistics, whitening, the ranking pairs) is global,
   and autograd gives the exact per-token gradients ``dL/dlogp`` and ``dL/dV``;
3. per micro-batch of the update's rows, forward with grad and backpropagate
   ``sum(logp * dL/dlogp)`` (the chain rule: the accumulated parameter gradient equals that of
   the whole-batch loss on those rows), clip, AdamW step. An ``actor`` phase takes one step per
   minibatch (the policy version advances by one per train step), a ``forward_actor`` phase
   scores the batch under the updated actor, a ``critic`` phase takes ``passes`` x minibatches
   critic steps; outputs of a moved model are recomputed (no grad) before its next step.

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
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from services.hf_weights import split_fused
from trainer.algorithms import (
    ALGORITHM_REGISTRY,
    ObjectiveBatch,
    ObjectiveResult,
    PlanPhase,
    Stage,
    compute_objective,
)
from trainer.algorithms.kl import reference_kl
from trainer.backends import torch_checkpoint
from trainer.backends.base import BackendError, ForwardResult, StepObjective
from trainer.backends.critic import ValueModel, freeze_attention
from trainer.backends.lr_schedule import lr_lambda
from trainer.backends.parallel import DataParallel, full_tensor, shard
from trainer.checkpoint import atomic_directory
from trainer.config import OptimizerConfig, TrainerConfig
from trainer.data import PackedInputs, TrainBatch, pack_inputs, plan_micro_batches

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


def _optimizer(params: list[nn.Parameter], config: OptimizerConfig) -> torch.optim.AdamW:
    return torch.optim.AdamW(
        params,
        lr=config.lr,
        betas=config.betas,
        eps=config.eps,
        weight_decay=config.weight_decay,
    )


def token_logprobs(
    logits: Tensor, tokens: Tensor, action_mask: Tensor, temperature: float, entropy: bool
) -> tuple[Tensor, Tensor]:
    """Logprobs of ``tokens`` under ``logits`` (``[..., vocab]``, scaled by 1 / ``temperature``)
    and the entropy (zeros unless ``entropy``), both float32, 0 where ``action_mask`` is
    False; any leading shape (``[n, t]`` per row, ``[m]`` for a set of tokens)."""
    logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    logp_all = torch.log_softmax(logits, dim=-1)
    logp = logp_all.gather(-1, tokens.clamp(min=0)[..., None]).squeeze(-1)
    logp = torch.where(action_mask, logp, torch.zeros_like(logp))
    ent = torch.zeros_like(logp)
    if entropy:
        ent = -(logp_all.exp() * logp_all).sum(-1)
        ent = torch.where(action_mask, ent, torch.zeros_like(ent))
    return logp, ent


class PolicyScorer(nn.Module):
    """The actor as one module: logits at given positions only (FSDP2 shards it as a root)."""

    def __init__(self, lm: nn.Module) -> None:
        super().__init__()
        self.lm = lm

    def forward(self, inputs: PackedInputs) -> Tensor:
        """``[n, t, vocab]`` logits of the hidden states ``inputs.index`` picks (packed lanes:
        :func:`trainer.data.pack_inputs`)."""
        body = getattr(self.lm, self.lm.base_model_prefix)
        hidden = body(
            input_ids=inputs.input_ids, position_ids=inputs.position_ids, use_cache=False
        ).last_hidden_state
        picked = hidden.reshape(-1, hidden.shape[-1])[inputs.index]
        return self.lm.get_output_embeddings()(picked)


@dataclass(frozen=True)
class _Micro:
    """Global row indices of one micro-batch and its lanes (positions in ``rows``, packed into
    one forward sequence each); ``real`` False: a pass that only keeps this rank's collectives
    in step with ranks that have more micro-batches (its output unused)."""

    rows: Tensor
    lanes: tuple[tuple[int, ...], ...] = ((0,),)
    real: bool = True

    def view(self, batch: TrainBatch) -> tuple[TrainBatch, PackedInputs]:
        """The micro-batch's rows of ``batch`` and their model inputs in lane layout."""
        mb = batch.select(self.rows)
        return mb, pack_inputs(mb, self.lanes)


def _grad(loss: Tensor | None, leaf: Tensor | None) -> Tensor | None:
    """``dloss/dleaf`` (zeros when the loss does not depend on it, e.g. an empty critic mask);
    None when there is no loss."""
    if loss is None or leaf is None:
        return None
    if not loss.requires_grad:
        return torch.zeros_like(leaf)
    grad = torch.autograd.grad(loss, leaf, allow_unused=True)[0]
    return torch.zeros_like(leaf) if grad is None else grad


@dataclass
class _StepState:
    """What the phases of one train step share (all ``[N, T]`` tensors cover the batch)."""

    batch: TrainBatch
    objective: StepObjective
    micro: list[_Micro]
    first: ForwardResult  # the pre-update actor's logprobs, the critic's raw outputs (V_old)
    metrics: dict[str, float]
    logp: Tensor = field(init=False)  # latest actor logprobs (refreshed per minibatch)
    critic_out: Tensor | None = field(init=False)  # latest raw critic outputs
    old_logp: Tensor | None = None  # set by an old_logp phase
    new_logp: Tensor | None = None  # set by a forward_actor phase
    critic_grad: Tensor | None = None  # the first actor-stage evaluation's dL/d(critic out)
    critic_stepped: bool = False
    evaluated: set[str] = field(default_factory=set)  # stages whose metrics are in
    ref_logp: Tensor | None = None  # the frozen reference model's logprobs (kl_coef > 0)

    def __post_init__(self) -> None:
        self.logp = self.first.logprobs
        self.critic_out = self.first.values


class _PhaseTimer:
    """Wall seconds per phase kind (``time/<kind>_s``) and for the whole step."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.start = time.perf_counter()
        self.seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start

    def metrics(self) -> dict[str, float]:
        out = {f"time/{name}_s": seconds for name, seconds in self.seconds.items()}
        out["time/step_s"] = time.perf_counter() - self.start
        return out


def _layers(module: nn.Module) -> nn.ModuleList:
    layers = getattr(module, "layers", None)
    if not isinstance(layers, nn.ModuleList):
        raise BackendError(f"{type(module).__name__} has no 'layers' list to shard with FSDP2")
    return layers


def _fingerprint(*modules: nn.Module) -> str:
    """Hash of every parameter's name, shape and dtype: checkpoints of another model differ."""
    return state_fingerprint(module.state_dict() for module in modules)


def state_fingerprint(states: Iterable[Mapping[str, Any]]) -> str:
    """:func:`_fingerprint` of modules given by their state dicts, in order (what the
    checkpoint resharding computes for a layout it writes)."""
    digest = hashlib.sha256()
    for state in states:
        for name, tensor in state.items():
            if not isinstance(tensor, Tensor):
                continue  # Megatron modules' ``_extra_state`` entries (None)
            digest.update(f"{name}:{tuple(tensor.shape)}:{tensor.dtype};".encode())
    return digest.hexdigest()


class TorchBackend:
    """Actor + critic in one process per rank (CPU or GPU); see the module docstring."""

    backend_name = "torch"  # recorded in checkpoints (a checkpoint loads into its own kind)

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
        self.reference = self._reference_model() if config.kl_coef > 0 else None
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
            if self.reference is not None:
                ref = self.reference.lm
                shard(self.reference, _layers(getattr(ref, ref.base_model_prefix)))
        self._init_optimizers()
        self.version = 0
        self.steps = 0
        pad = self.tokenizer.pad_token_id
        self.pad_id = int(pad if pad is not None else 0)
        self.vocab_size = int(actor.config.vocab_size)

    def _init_optimizers(self) -> None:
        """AdamW and the lr schedule (lr_schedule.py) of the actor and the critic's trainable
        parameters."""
        config = self.config
        self.actor_optimizer = _optimizer(list(self.actor.parameters()), config.actor)
        trainable = [p for p in self.critic.parameters() if p.requires_grad]
        self.critic_optimizer = _optimizer(trainable, config.critic.optimizer)
        self._init_schedulers()

    def _init_schedulers(self) -> None:
        """The lr schedules (lr_schedule.py) of both optimisers."""
        config = self.config
        self.actor_scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.actor_optimizer, lr_lambda(config.actor)
        )
        self.critic_scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.critic_optimizer, lr_lambda(config.critic.optimizer)
        )

    def _reference_model(self) -> PolicyScorer:
        """The frozen reference policy of the KL term: the initial weights of ``model_dir``
        (not checkpointed: a resumed run reloads it from the same directory)."""
        from transformers import AutoModelForCausalLM

        lm = AutoModelForCausalLM.from_pretrained(self.model_dir, dtype=torch.float32)
        lm.requires_grad_(False)
        return PolicyScorer(lm.to(self.device).eval())

    # ------------------------------------------------------------------ forwards

    def _autocast(self) -> contextlib.AbstractContextManager[Any]:
        if self.config.precision == "bf16":
            return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def _actor_logprobs(
        self,
        mb: TrainBatch,
        inputs: PackedInputs,
        entropy: bool = False,
        scorer: PolicyScorer | None = None,
    ) -> tuple[Tensor, Tensor]:
        """``[n, t]`` logprobs of the post-prompt tokens (0 off actions), and the entropy;
        ``scorer``: another policy than the actor (the KL term's reference)."""
        with self._autocast():
            logits = (scorer or self.scorer)(inputs)
        return self._token_logprobs(mb, logits, entropy)

    def _token_logprobs(
        self, mb: TrainBatch, logits: Tensor, entropy: bool
    ) -> tuple[Tensor, Tensor]:
        """``[n, t]`` logprobs of ``mb``'s post-prompt tokens under ``logits`` ``[n, t, vocab]``
        (0 off actions), and the entropy (0 unless ``entropy``)."""
        temperature = self.config.rollout_temperature
        return token_logprobs(logits, mb.tokens, mb.action_mask, temperature, entropy)

    def _actor_logp(self, mb: TrainBatch, inputs: PackedInputs) -> Tensor:
        return self._actor_logprobs(mb, inputs)[0]

    def _critic_values(self, mb: TrainBatch, inputs: PackedInputs, raw: bool = False) -> Tensor:
        """``[n, t]`` critic values (0 off actions); ``raw``: a sigmoid head's logits."""
        with self._autocast():
            values = self.critic(inputs, raw=raw)
        return torch.where(mb.action_mask, values, torch.zeros_like(values))

    def _critic_raw(self, mb: TrainBatch, inputs: PackedInputs) -> Tensor:
        return self._critic_values(mb, inputs, raw=True)

    def _plan(self, batch: TrainBatch) -> list[_Micro]:
        """This rank's micro-batches (global row indices), as many on every rank."""
        micro, self._padding_fraction = self._plan_rows(batch, self.dp.rows(batch))
        return micro

    def _plan_rows(self, batch: TrainBatch, rows: list[int]) -> tuple[list[_Micro], float]:
        """Micro-batches of ``rows`` (this rank's), padded with unused passes to as many as
        the rank with the most; and their padding fraction."""
        micro: list[_Micro] = []
        padding = 0.0
        if rows:
            cfg = self.config.batch
            plan = plan_micro_batches(
                batch.select(rows), cfg.micro_batch_tokens, lane_factor=cfg.lane_factor
            )
            padding = plan.padding_fraction
            index = torch.tensor(rows, dtype=torch.long)
            for part, lanes in zip(plan.micro_batches, plan.lanes, strict=True):
                at = {row: i for i, row in enumerate(part)}
                local = tuple(tuple(at[row] for row in lane) for lane in lanes)
                micro.append(_Micro(index[list(part)], local))
        for _ in range(self.dp.max_int(len(micro)) - len(micro)):
            micro.append(_Micro(torch.zeros(1, dtype=torch.long), real=False))
        return micro, padding

    @torch.no_grad()
    def _forward(
        self, batch: TrainBatch, plan: list[_Micro], actor: bool, critic: bool, raw: bool = False
    ) -> ForwardResult:
        """Outputs of the rows in ``plan`` (every rank's rows after the sum; 0 elsewhere);
        ``raw``: the critic's raw outputs (a sigmoid head's logits) as ``values``."""
        shape = tuple(batch.tokens.shape)

        def zeros() -> Tensor:
            return torch.zeros(shape, dtype=torch.float32, device=batch.tokens.device)

        logps, ents = zeros(), zeros()
        values = zeros() if critic else None
        for m in plan:
            mb, inputs = m.view(batch)
            rows = m.rows.to(batch.tokens.device)
            width = mb.tokens.shape[1]
            if actor:
                logp, ent = self._actor_logprobs(mb, inputs, entropy=True)
                if m.real:
                    logps[rows, :width] = logp
                    ents[rows, :width] = ent
            if values is not None:
                value = self._critic_values(mb, inputs, raw=raw)
                if m.real:
                    values[rows, :width] = value
        for tensor in (logps, ents, values):
            if tensor is not None:
                self.dp.sum(tensor)  # each row is non-zero on exactly one rank
        return ForwardResult(logprobs=logps, values=values, entropy=ents)

    @torch.no_grad()
    def _reference_logprobs(self, batch: TrainBatch, plan: list[_Micro]) -> Tensor:
        """``[N, T]`` logprobs of the frozen reference model (every rank's rows after the sum)."""
        assert self.reference is not None
        out = torch.zeros(tuple(batch.tokens.shape), dtype=torch.float32, device=self.device)
        for m in plan:
            mb, inputs = m.view(batch)
            logp, _ = self._actor_logprobs(mb, inputs, scorer=self.reference)
            if m.real:
                out[m.rows.to(out.device), : logp.shape[1]] = logp
        self.dp.sum(out)
        return out

    def logprobs_and_values(self, batch: TrainBatch) -> ForwardResult:
        """No-grad forward of actor and critic over ``batch`` (micro-batched)."""
        batch = batch.to(self.device)
        return self._forward(batch, self._plan(batch), actor=True, critic=True)

    # ------------------------------------------------------------------ training

    def _backprop(
        self,
        batch: TrainBatch,
        plan: list[_Micro],
        grad: Tensor,
        forward: Callable[[TrainBatch, PackedInputs], Tensor],
    ) -> None:
        """Accumulate ``d/dtheta sum(out * grad)`` over the micro-batches."""
        for m in plan:
            out = forward(*m.view(batch))
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

    # ------------------------------------------------------------------ step plans

    def train_step(self, batch: TrainBatch, objective: StepObjective) -> dict[str, float]:
        """One step on ``batch``: the phases of the algorithm's step plan, in order
        (:mod:`trainer.algorithms.step_plans`; Li2SAO: one actor update, ``K`` critic passes;
        PACT: actor minibatch steps, a forward of the updated actor, the critic stage).
        Returns float metrics."""
        if not isinstance(objective, StepObjective):
            raise BackendError(f"objective must be a StepObjective, got {type(objective).__name__}")
        plan = ALGORITHM_REGISTRY.get(objective.algorithm).plan
        if plan.value_head is not None and plan.value_head != self.config.critic.head:
            raise BackendError(
                f"algorithm {objective.algorithm!r} needs critic.head={plan.value_head!r}; this "
                f"backend's critic has a {self.config.critic.head!r} head (a run does not "
                "switch head type)"
            )
        batch = batch.to(self.device)
        timer = _PhaseTimer(self.device)
        with timer("forward"):  # the pre-update actor's logprobs, V_old
            micro = self._plan(batch)
            first = self._forward(batch, micro, actor=True, critic=plan.uses_critic, raw=True)
        state = _StepState(batch, objective, micro, first, self._first_metrics(batch, micro, first))
        if self.reference is not None:
            with timer("reference"):
                state.ref_logp = self._reference_logprobs(batch, micro)
        for phase in plan.phases:
            with timer(phase.kind):
                self._run_phase(state, phase)
        self.steps += 1
        metrics = state.metrics
        metrics["trainer/version"] = float(self.version)
        metrics["trainer/steps"] = float(self.steps)
        if self.config.phase_timings:
            metrics.update(timer.metrics())
        return metrics

    def _first_metrics(
        self, batch: TrainBatch, micro: list[_Micro], first: ForwardResult
    ) -> dict[str, float]:
        return {
            "data/micro_batches": float(len(micro)),
            "data/padding_fraction": self._padding_fraction,
            "actor/entropy": float(first.entropy[batch.action_mask].mean()),
            **self._mismatch(batch, first.logprobs),
        }

    def _run_phase(self, state: _StepState, phase: PlanPhase) -> None:
        if phase.kind == "old_logp":
            # the step's first forward scored the batch under the pre-update actor
            state.old_logp = state.first.logprobs
        elif phase.kind == "actor":
            if state.objective.update_actor:  # False: LiSAO's critic-only warm-up
                self._actor_phase(state, phase)
        elif phase.kind == "forward_actor":
            fwd = self._forward(state.batch, state.micro, actor=True, critic=False)
            state.new_logp = fwd.logprobs
        else:
            self._critic_phase(state, phase)

    def _minibatches(self, state: _StepState, count: int | None) -> list[list[_Micro]]:
        """This rank's rows in ``count`` minibatches (None: ``actor_minibatches``) of whole
        groups, in plan order; minibatch ``j`` of every rank together is global minibatch j."""
        n = count if count is not None else self.config.actor_minibatches
        if n == 1:
            return [state.micro]
        groups: dict[int, list[int]] = {}
        group_ids = state.batch.group_ids.tolist()
        for m in state.micro:
            for row in m.rows.tolist() if m.real else []:
                groups.setdefault(group_ids[row], []).append(row)
        members = list(groups.values())
        size, extra = divmod(len(members), n)
        minis, start = [], 0
        for j in range(n):
            stop = start + size + (1 if j < extra else 0)
            rows = sorted(r for group in members[start:stop] for r in group)
            minis.append(self._plan_rows(state.batch, rows)[0])
            start = stop
        return minis

    def _refresh(
        self, batch: TrainBatch, mini: list[_Micro], current: Tensor, actor: bool
    ) -> Tensor:
        """``current`` with the rows of ``mini`` (every rank's) replaced by the model's outputs
        now: the actor's logprobs, or the critic's raw outputs."""
        fwd = self._forward(batch, mini, actor=actor, critic=not actor, raw=True)
        fresh = fwd.logprobs if actor else fwd.values
        assert fresh is not None
        hit = torch.zeros(batch.num_rows, dtype=torch.float32, device=current.device)
        for m in mini:
            if m.real:
                hit[m.rows.to(current.device)] = 1.0
        self.dp.sum(hit)
        return torch.where(hit[:, None] > 0, fresh, current)

    def _objective_batch(
        self, state: _StepState, logp: Tensor, critic_out: Tensor | None
    ) -> ObjectiveBatch:
        """The objective's view: ``critic_out`` are values (linear head) or logits (sigmoid
        head), ``old_values`` the step's first critic forward (``V_old``)."""
        old = state.first.values
        critic: dict[str, Tensor] = {}
        if critic_out is not None and old is not None:
            if self.config.critic.head == "sigmoid":
                critic = {"value_logits": critic_out, "old_values": torch.sigmoid(old)}
            else:
                critic = {"values": critic_out, "old_values": old}
        return state.batch.objective_batch(
            logp, trainer_version=self.version, old_logp=state.old_logp, **critic
        )

    def _evaluate(
        self, state: _StepState, stage: Stage, logp: Tensor, want_actor: bool, want_critic: bool
    ) -> tuple[ObjectiveResult, Tensor | None, Tensor | None]:
        """The objective's ``stage`` on the whole batch (global normalisers) with detached
        leaves; returns it and the per-token gradients ``dL/dlogp`` and ``dL/d(critic out)``.
        The first evaluation of each stage contributes the objective's metrics."""
        logp_leaf = logp.clone().requires_grad_(want_actor)
        out = state.critic_out
        out_leaf = None if out is None else out.clone().requires_grad_(want_critic)
        objective = state.objective
        try:
            result = compute_objective(
                objective.algorithm,
                self._objective_batch(state, logp_leaf, out_leaf),
                phase=objective.phase,
                stage=stage,
                config=objective.config,
            )
        except ValueError as exc:
            raise BackendError(f"objective rejected the batch: {exc}") from exc
        actor_loss = result.actor_loss
        if want_actor and actor_loss is not None and state.ref_logp is not None:
            kl = reference_kl(
                logp_leaf,
                state.ref_logp,
                state.batch.action_mask,
                state.batch.trajectory_index,
                objective.config.aggregation or "seq-mean-token-mean",
            )
            actor_loss = actor_loss + self.config.kl_coef * kl.loss
            if stage not in state.evaluated:
                state.metrics["actor/kl_ref"] = float(kl.mean_kl)
                state.metrics["actor/kl_loss"] = float(kl.loss.detach())
        if stage not in state.evaluated:
            state.evaluated.add(stage)
            state.metrics.update(result.metrics)
        actor_grad = _grad(actor_loss, logp_leaf) if want_actor else None
        critic_grad = _grad(result.critic_loss, out_leaf) if want_critic else None
        return result, actor_grad, critic_grad

    def _actor_phase(self, state: _StepState, phase: PlanPhase) -> None:
        """One actor optimizer step per minibatch. Each backpropagates the whole-batch loss's
        gradient on its own rows (their logprobs refreshed after the first step), so the
        minibatch gradients of an unchanged actor would sum to the whole-batch gradient."""
        params = list(self.actor.parameters())
        norms: list[float] = []
        lr = self.actor_optimizer.param_groups[0]["lr"]  # this step's (warm-up scaled) lr
        for j, mini in enumerate(self._minibatches(state, phase.minibatches)):
            if not mini:
                continue  # no rows on any rank
            if norms:  # the actor moved: this minibatch's rows under the current actor
                state.logp = self._refresh(state.batch, mini, state.logp, actor=True)
            first = "actor" not in state.evaluated
            result, grad, critic_grad = self._evaluate(
                state, "actor", state.logp, want_actor=True, want_critic=first
            )
            if first:
                state.critic_grad = critic_grad  # the standard-order critic's first pass
            if result.actor_loss is None or grad is None:
                return  # a stage without an actor loss never steps the actor optimizer
            if norms:
                state.metrics[f"actor/loss_mb{j}"] = float(result.actor_loss.detach())
            self._backprop(state.batch, mini, grad, self._actor_logp)
            norms.append(
                self._clip_and_step(
                    params, self.actor_optimizer, self.actor_scheduler, self.config.actor.grad_clip
                )
            )
        if norms:
            state.metrics["actor/grad_norm"] = max(norms)
            if len(norms) > 1:
                state.metrics.update({f"actor/grad_norm_mb{j}": v for j, v in enumerate(norms)})
            state.metrics["actor/optimizer_steps"] = float(len(norms))
            state.metrics["actor/lr"] = lr
            self.version += 1

    def _critic_phase(self, state: _StepState, phase: PlanPhase) -> None:
        """``passes`` x minibatches critic optimizer steps on the loss of ``phase.stage``:
        ``"actor"`` at the pre-update logprobs (standard order), ``"critic"`` at the updated
        actor's (PACT; the plan guarantees a ``forward_actor`` ran)."""
        passes = phase.passes
        if passes is None:
            passes = state.objective.critic_updates
            passes = self.config.critic.updates_per_step if passes is None else passes
        logp = state.first.logprobs if phase.stage == "actor" else state.new_logp
        if passes == 0 or logp is None or state.critic_out is None:
            return
        params = [p for p in self.critic.parameters() if p.requires_grad]
        minis = [m for m in self._minibatches(state, phase.minibatches) if m]
        lr = self.critic_optimizer.param_groups[0]["lr"]  # this phase's first step's lr
        for k in range(passes):
            for j, mini in enumerate(minis):
                label = f"pass{k}" if len(minis) == 1 else f"pass{k}_mb{j}"
                grad = self._critic_grad(state, phase.stage, logp, mini, label)
                if grad is None:
                    return  # this stage has no critic loss
                self._backprop(state.batch, mini, grad, self._critic_raw)
                state.metrics[f"critic/grad_norm_{label}"] = self._clip_and_step(
                    params,
                    self.critic_optimizer,
                    self.critic_scheduler,
                    self.config.critic.optimizer.grad_clip,
                )
                state.critic_stepped = True
        state.metrics["critic/lr"] = lr

    def _critic_grad(
        self, state: _StepState, stage: Stage, logp: Tensor, mini: list[_Micro], label: str
    ) -> Tensor | None:
        """``dL/d(critic out)`` for the next critic step (None: the stage has no critic loss);
        the critic's outputs on ``mini`` are recomputed once the critic has moved."""
        if state.critic_stepped:
            assert state.critic_out is not None
            state.critic_out = self._refresh(state.batch, mini, state.critic_out, actor=False)
        elif stage == "actor" and "actor" in state.evaluated:
            return state.critic_grad  # from the actor step's evaluation (same inputs)
        repeat = stage in state.evaluated
        result, _, grad = self._evaluate(state, stage, logp, want_actor=False, want_critic=True)
        if result.critic_loss is None:
            return None
        if repeat:
            state.metrics[f"critic/loss_{label}"] = float(result.critic_loss.detach())
        return grad

    # ------------------------------------------------------------------ weights out

    def _gathered_state(self) -> Iterator[tuple[str, Tensor]]:
        """The actor's tensors under the model's own names (tied aliases once), whole."""
        seen: set[int] = set()
        for name, tensor in self.actor.state_dict(keep_vars=True).items():
            if id(tensor) in seen:  # a tied alias (lm_head.weight of tied embeddings)
                continue
            seen.add(id(tensor))
            yield name, full_tensor(tensor.detach())

    def named_weights(self) -> Iterator[tuple[str, Tensor]]:
        """The actor's tensors under their HF checkpoint names (tied aliases once), whole and
        detached: a MoE's fused experts come out one matrix per expert
        (``mlp.experts.{e}.gate_proj.weight``, ...), the names SGLang and the files use.

        Under data parallel every rank must iterate (each tensor is gathered collectively).
        """
        for name, tensor in self._gathered_state():
            yield from split_fused(name, tensor)

    def export_hf(self, directory: str | Path) -> Path:
        """Write the actor as a HF model directory (safetensors, config, tokenizer), atomically."""
        # The model's own names: save_pretrained writes them under the checkpoint names.
        weights = dict(self._gathered_state())  # collective under data parallel
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

    def checkpoint_problem(self) -> str | None:
        """Why :meth:`save` would fail (never: every layout checkpoints)."""
        return None

    def checkpoint_scope(self, part: str = "model") -> str:
        """This rank's key prefix in a checkpoint for ``part`` (``model`` or ``optimizer``):
        none, FSDP2's DTensors are global tensors (:mod:`trainer.backends.torch_checkpoint` on
        model-parallel scopes)."""
        return ""

    def checkpoint_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        """The optimiser whose state a checkpoint holds for ``optimizer``: itself."""
        return optimizer

    def checkpoint_parallel(self) -> dict[str, int]:
        """The model-parallel layout a checkpoint must be loaded into: none (DCP reshards the
        FSDP2 shards to any data-parallel world size)."""
        return {}

    def backend_rng_state(self) -> dict[str, Any]:
        """RNG states of the backend's own beyond torch / CUDA / Python / numpy: none."""
        return {}

    def set_backend_rng_state(self, state: Mapping[str, Any]) -> None:
        """Put back what :meth:`backend_rng_state` returned (nothing here)."""

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
