"""The torch backend on the tiny Qwen3-MoE model: a real actor step, the critic's freezing rule
on a MoE (experts and router train), and the HF export in per-expert checkpoint names that
transformers and the reference engine load with the trainer's logprobs; an exact resume."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from services.reference_engine.model_runner import ModelRunner
from tests.support.trajectory_records import record, turn
from trainer.backends import StepObjective, create_backend
from trainer.backends.torch_backend import TorchBackend
from trainer.config import TrainerConfig
from trainer.data import TrainBatch, build_batch

pytestmark = pytest.mark.slow  # several MoE forwards and steps (~seconds)


def backend(model_dir: Path, **overrides) -> TorchBackend:
    b = create_backend(TrainerConfig(model=str(model_dir), **overrides))
    assert isinstance(b, TorchBackend)
    return b


def on_policy_batch(b: TorchBackend, rewards=(1.0, 0.0)) -> TrainBatch:
    """Rows in groups of two whose behaviour logprobs are the current policy's (ratio 1)."""
    records = [
        record(
            f"m{i}",
            [([3, 4, 5, 9], [turn([], [30 + i, 31, 32, 33], 0), turn([6, 7], [40, 41 + i], 0)])],
            reward=r,
            group=f"g{i // 2}",
        )
        for i, r in enumerate(rewards)
    ]
    batch, _ = build_batch(records, trainer_version=0)
    return replace(batch, behavior_logp=b.logprobs_and_values(batch).logprobs)


def test_actor_step_and_export_in_checkpoint_names(tiny_moe_dir: Path, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    b = backend(tiny_moe_dir, actor={"lr": 1e-3})
    batch = on_policy_batch(b)
    before = b.logprobs_and_values(batch).logprobs
    experts = b.actor.model.layers[0].mlp.experts.gate_up_proj.detach().clone()
    router = b.actor.model.layers[0].mlp.gate.weight.detach().clone()
    metrics = b.train_step(batch, StepObjective(algorithm="grpo"))
    gain = ((b.logprobs_and_values(batch).logprobs - before) * batch.action_mask).sum(dim=1)
    assert gain[0] > 0 > gain[1]  # reward 1 (advantage > 0) up, reward 0 down
    assert metrics["actor/grad_norm"] > 0 and b.version == 1
    assert not torch.equal(experts, b.actor.model.layers[0].mlp.experts.gate_up_proj)
    assert not torch.equal(router, b.actor.model.layers[0].mlp.gate.weight)

    out = b.export_hf(tmp_path / "export")
    exported = load_file(str(out / "model.safetensors"))
    assert set(exported) == set(load_file(str(tiny_moe_dir / "model.safetensors")))
    named = dict(b.named_weights())
    assert set(named) == set(exported)  # per-expert names, what SGLang and the files use
    assert all(torch.equal(named[k], exported[k]) for k in named)
    ids = torch.tensor([[3, 4, 5, 9, 30, 31, 32, 33, 6, 7]])
    loaded = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, b.actor.eval()(ids).logits)
    b.actor.train()

    # the reference engine, serving the original weights, takes the export as an update and
    # then reports the trainer's logprobs
    runner = ModelRunner(tiny_moe_dir)
    runner.apply_weights(runner.read_weights(str(out)))
    row = batch.select(torch.tensor([0]))
    length, prompt = int(row.seq_lengths[0]), int(row.prompt_lengths[0])
    tokens = row.input_ids[0, :length].tolist()
    _, logits = runner.prefill(tokens, None, prompt - 1)
    engine = torch.log_softmax(logits[:-1], dim=-1)
    engine = engine.gather(-1, torch.tensor(tokens[prompt:])[:, None]).squeeze(-1)
    trainer = b.logprobs_and_values(batch).logprobs[0, : length - prompt]
    mask = batch.action_mask[0, : length - prompt]
    assert float((engine - trainer)[mask].abs().max()) < 1e-5
    assert float((engine - before[0, : length - prompt])[mask].abs().max()) > 1e-4  # moved


def test_critic_freezes_attention_and_embeddings_and_trains_experts_and_router(
    tiny_moe_dir: Path,
) -> None:
    b = backend(tiny_moe_dir, critic={"optimizer": {"lr": 1e-3}, "updates_per_step": 2})
    batch = on_policy_batch(b)
    before = {n: p.detach().clone() for n, p in b.critic.named_parameters()}
    b.train_step(batch, StepObjective(algorithm="li2sao", phase="bootstrap"))
    changed = {n for n, p in b.critic.named_parameters() if not torch.equal(before[n], p)}
    frozen = set(b.frozen_critic_params)
    assert not changed & frozen
    assert "body.embed_tokens.weight" in frozen
    for layer in range(2):
        for part in ("q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight",
                     "q_norm.weight", "k_norm.weight"):  # fmt: skip
            assert f"body.layers.{layer}.self_attn.{part}" in frozen
        for part in ("mlp.experts.gate_up_proj", "mlp.experts.down_proj", "mlp.gate.weight",
                     "input_layernorm.weight", "post_attention_layernorm.weight"):  # fmt: skip
            assert f"body.layers.{layer}.{part}" in changed
    assert {"value_head.weight", "value_head.bias", "body.norm.weight"} <= changed


def test_save_load_resumes_the_moe_bit_exact(tiny_moe_dir: Path, tmp_path: Path) -> None:
    cfg = {"actor": {"lr": 1e-3}, "critic": {"optimizer": {"lr": 1e-3}}}
    a = backend(tiny_moe_dir, **cfg)
    batch = on_policy_batch(a)
    a.train_step(batch, StepObjective())
    a.save(tmp_path / "ckpt")
    m_a = a.train_step(batch, StepObjective())
    b = backend(tiny_moe_dir, **cfg, seed=3)  # another value-head init: load must replace it
    b.load(tmp_path / "ckpt")
    m_b = b.train_step(batch, StepObjective())
    assert m_a == m_b
    for left, right in ((a.actor, b.actor), (a.critic, b.critic)):
        for (name, p), q in zip(left.state_dict().items(), right.state_dict().values(),
                                strict=True):  # fmt: skip
            assert torch.equal(p, q), name
