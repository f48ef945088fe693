"""The torch backend on the tiny model: engine parity, a real step, frozen critic attention,
HF export round trip through transformers and the reference engine, exact resume."""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from torch import Tensor

from tests.support.recorded_conversations import record_conversations, update_engine_weights
from tests.support.trajectory_records import record, turn
from trainer.algorithms import ObjectiveBatch, compute_objective
from trainer.backends import StepObjective, create_backend
from trainer.backends.torch_backend import TorchBackend
from trainer.config import TrainerConfig
from trainer.data import TrainBatch, build_batch


def backend(model_dir: Path, **overrides) -> TorchBackend:
    b = create_backend(TrainerConfig(model=str(model_dir), **overrides))
    assert isinstance(b, TorchBackend)
    return b


def generated_tokens(records) -> list[int]:
    return [i for r in records for s in r.segments for t in s.turns for i in t.output_ids]


@pytest.mark.slow  # records conversations on a served engine
def test_recomputed_logprobs_match_the_engine_on_recorded_trajectories(
    tiny_model_dir: Path, engine_url: str
) -> None:
    records = record_conversations(engine_url, tiny_model_dir, n=3, turns=2)
    batch, report = build_batch(records, trainer_version=0)
    assert report.rows >= 3 and report.trajectories == 3
    # the action mask covers exactly the generated tokens, in order
    assert batch.tokens[batch.action_mask].tolist() == generated_tokens(records)
    fwd = backend(tiny_model_dir).logprobs_and_values(batch)
    diff = (fwd.logprobs - batch.behavior_logp)[batch.action_mask].abs()
    assert int(batch.action_mask.sum()) >= 12
    assert float(diff.max()) < 1e-5
    assert fwd.values is not None and fwd.values.shape == batch.tokens.shape


@pytest.mark.slow  # records conversations on a served engine
def test_logprobs_match_an_engine_sampling_at_another_temperature(
    tiny_model_dir: Path, engine_url: str
) -> None:
    records = record_conversations(engine_url, tiny_model_dir, n=2, tag="warm", temperature=0.7)
    batch, _ = build_batch(records, trainer_version=0)
    mask = batch.action_mask
    scaled = backend(tiny_model_dir, rollout_temperature=0.7).logprobs_and_values(batch)
    assert float((scaled.logprobs - batch.behavior_logp)[mask].abs().max()) < 1e-5
    plain = backend(tiny_model_dir).logprobs_and_values(batch)  # the wrong temperature
    assert float((plain.logprobs - batch.behavior_logp)[mask].abs().max()) > 1e-3


def constructed_batch(b: TorchBackend, rewards=(1.0, 0.0)) -> TrainBatch:
    """Rows in groups of two whose behaviour logprobs are the current policy's (ratio 1)."""
    records = [
        record(
            f"c{i}",
            [([3, 4, 5], [turn([], [30 + i, 31, 32], 0), turn([6, 7], [40, 41 + i], 0)])],
            reward=r,
            group=f"g{i // 2}",
        )
        for i, r in enumerate(rewards)
    ]
    batch, _ = build_batch(records, trainer_version=0)
    logp = b.logprobs_and_values(batch).logprobs
    return replace(batch, behavior_logp=logp)


def grpo_actor_loss(b: TorchBackend, batch: TrainBatch) -> float:
    fwd = b.logprobs_and_values(batch)
    ob = ObjectiveBatch(batch.tokens, batch.action_mask, batch.group_ids, batch.rewards,
                        batch.behavior_logp, fwd.logprobs)  # fmt: skip
    return float(compute_objective("grpo", ob).actor_loss)


def test_a_step_raises_the_logprob_of_positive_advantage_tokens(tiny_model_dir: Path) -> None:
    b = backend(tiny_model_dir, actor={"lr": 1e-3})
    batch = constructed_batch(b)
    before = b.logprobs_and_values(batch).logprobs
    weights = {n: p.detach().clone() for n, p in b.actor.named_parameters()}
    loss_before = grpo_actor_loss(b, batch)
    metrics = b.train_step(batch, StepObjective(algorithm="grpo"))
    after = b.logprobs_and_values(batch).logprobs
    mask = batch.action_mask
    gain = ((after - before) * mask).sum(dim=1)
    assert gain[0] > 0 > gain[1]  # reward 1 (advantage > 0) up, reward 0 down
    assert grpo_actor_loss(b, batch) < loss_before
    assert any(not torch.equal(weights[n], p) for n, p in b.actor.named_parameters())
    assert b.version == 1 and metrics["trainer/version"] == 1.0
    assert metrics["actor/grad_norm"] > 0
    assert metrics["mismatch/max_abs_logprob_diff"] == 0.0  # behaviour = recomputed here


def test_critic_attention_and_embeddings_stay_bit_identical(tiny_model_dir: Path) -> None:
    b = backend(tiny_model_dir, critic={"optimizer": {"lr": 1e-3}, "updates_per_step": 2})
    batch = constructed_batch(b)
    before = {n: p.detach().clone() for n, p in b.critic.named_parameters()}
    metrics = b.train_step(batch, StepObjective(algorithm="li2sao", phase="bootstrap"))
    assert metrics["critic/grad_norm_pass0"] > 0 and "critic/loss_pass1" in metrics
    changed = {n for n, p in b.critic.named_parameters() if not torch.equal(before[n], p)}
    frozen = set(b.frozen_critic_params)
    assert frozen and not changed & frozen
    assert any("self_attn.q_norm" in n for n in frozen) and "body.embed_tokens.weight" in frozen
    assert {"value_head.weight", "value_head.bias"} <= changed
    for layer in range(2):
        assert f"body.layers.{layer}.mlp.gate_proj.weight" in changed
        assert f"body.layers.{layer}.input_layernorm.weight" in changed


def test_warm_up_steps_leave_the_actor_and_critic_free_algorithms_the_critic(
    tiny_model_dir: Path,
) -> None:
    b = backend(tiny_model_dir, critic={"optimizer": {"lr": 1e-3}})
    batch = constructed_batch(b)
    actor = {n: p.detach().clone() for n, p in b.actor.named_parameters()}
    head = b.critic.value_head.weight.detach().clone()
    metrics = b.train_step(batch, StepObjective(algorithm="lisao", update_actor=False))
    assert b.version == 0 and "actor/grad_norm" not in metrics
    assert all(torch.equal(actor[n], p) for n, p in b.actor.named_parameters())
    assert not torch.equal(head, b.critic.value_head.weight)
    head = b.critic.value_head.weight.detach().clone()
    metrics = b.train_step(batch, StepObjective(algorithm="grpo"))
    assert b.version == 1 and "critic/lr" not in metrics
    assert torch.equal(head, b.critic.value_head.weight)


def test_micro_batching_accumulates_the_whole_batch_gradient(tiny_model_dir: Path) -> None:
    # Adam's eps = 1 makes the first update ~ lr * grad: the weight deltas compare the gradients
    # (with a small eps, elements whose gradient is ~0 would move by +-lr on rounding noise)
    sgd_like = {"lr": 1.0, "eps": 1.0, "grad_clip": 0.0}
    cfg = {"actor": sgd_like, "critic": {"optimizer": sgd_like, "updates_per_step": 1}}
    one = backend(tiny_model_dir, **cfg)
    many = backend(tiny_model_dir, **cfg, batch={"micro_batch_tokens": 1})
    start = {n: p.detach().clone() for n, p in one.actor.named_parameters()}
    start.update({f"critic.{n}": p.detach().clone() for n, p in one.critic.named_parameters()})
    batch = constructed_batch(one, rewards=(1.0, 0.0, 0.0, 1.0))
    m_one = one.train_step(batch, StepObjective())
    m_many = many.train_step(batch, StepObjective())
    assert (m_one["data/micro_batches"], m_many["data/micro_batches"]) == (1.0, 2.0)
    pairs = []
    for prefix, a, b in (("", one.actor, many.actor), ("critic.", one.critic, many.critic)):
        for (n, p), q in zip(a.named_parameters(), b.parameters(), strict=True):
            pairs.append((prefix + n, p, q))
    largest = 0.0
    for name, p, q in pairs:
        d_one, d_many = p.detach() - start[name], q.detach() - start[name]
        assert torch.allclose(d_one, d_many, atol=3e-7, rtol=1e-3), name  # fp32 ulp of ~1
        largest = max(largest, float(d_one.abs().max()))
    assert largest > 1e-4  # the step moved the weights


def assert_stepped_alike(plain: TorchBackend, recomputed: TorchBackend, start: dict) -> None:
    """After the same step with and without activation recompute: every actor and critic
    tensor within 1e-6, and every critic MLP tensor moved from ``start`` (the critic's)."""
    for model in ("actor", "critic"):
        mine = dict(getattr(recomputed, model).named_parameters())
        for name, tensor in getattr(plain, model).named_parameters():
            assert torch.allclose(tensor, mine[name], atol=1e-6, rtol=0), (model, name)
    mlp = [n for n in start if ".mlp." in n]
    critic = dict(recomputed.critic.named_parameters())
    assert mlp and all(float((critic[n] - start[n]).abs().max()) > 0 for n in mlp)


def test_activation_checkpointing_takes_the_same_step(tiny_model_dir: Path) -> None:
    """HF activation checkpointing in actor and critic body: the same step, and the critic's
    MLPs still train (its embeddings are frozen: a checkpointed layer whose inputs need no
    gradient would give its parameters none)."""
    cfg = {"actor": {"lr": 1e-2}, "critic": {"optimizer": {"lr": 1e-2}}}
    plain = backend(tiny_model_dir, **cfg)
    recomputed = backend(tiny_model_dir, **cfg, activation_checkpointing=True)
    assert (
        recomputed.critic.body.is_gradient_checkpointing
        and not plain.actor.is_gradient_checkpointing
    )
    start = {n: p.detach().clone() for n, p in plain.critic.named_parameters()}
    batch = constructed_batch(plain, rewards=(1.0, 0.0, 0.0, 1.0))
    want, got = (
        plain.train_step(batch, StepObjective()),
        recomputed.train_step(batch, StepObjective()),
    )
    for key, value in want.items():
        assert abs(value - got[key]) <= 1e-5 * max(1.0, abs(value)), key
    assert_stepped_alike(plain, recomputed, start)


@pytest.mark.slow  # exports, reloads and serves the model
def test_export_loads_in_transformers_and_the_engine_with_equal_logprobs(
    tiny_model_dir: Path, engine_url: str, tmp_path: Path
) -> None:
    from transformers import AutoModelForCausalLM

    b = backend(tiny_model_dir, actor={"lr": 1e-3})
    b.train_step(constructed_batch(b), StepObjective(algorithm="grpo"))
    out = b.export_hf(tmp_path / "export")
    # transformers: identical logits
    loaded = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    ids = torch.tensor([[3, 4, 5, 30, 31, 32, 6, 7]])
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, b.actor.eval()(ids).logits)
    b.actor.train()
    # named_weights is exactly what was exported
    exported = load_file(str(out / "model.safetensors"))
    named = dict(b.named_weights())
    assert set(named) == set(exported)
    assert all(torch.equal(named[k], exported[k]) for k in named)
    # the reference engine loads it and samples with the trainer's logprobs
    update_engine_weights(engine_url, out, version=1)
    try:
        records = record_conversations(engine_url, tiny_model_dir, n=2, version=1, tag="v1")
        batch, _ = build_batch(records, trainer_version=1)
        fwd = b.logprobs_and_values(batch)
        diff = (fwd.logprobs - batch.behavior_logp)[batch.action_mask].abs()
        assert float(diff.max()) < 1e-5
        fresh = backend(tiny_model_dir).logprobs_and_values(batch).logprobs
        assert float((fresh - fwd.logprobs)[batch.action_mask].abs().max()) > 1e-4  # it moved
    finally:
        update_engine_weights(engine_url, tiny_model_dir, version=2)


def rng_draws() -> list[float]:
    """One draw from each RNG a step could use (torch, Python, numpy)."""
    return [float(torch.rand(())), random.random(), float(np.random.rand())]


def whole_state(b: TorchBackend) -> dict[str, Tensor]:
    models = {"actor": b.actor, "critic": b.critic}
    return {f"{m}.{k}": v.detach().clone() for m, mod in models.items()
            for k, v in mod.state_dict().items()}  # fmt: skip


def assert_same_state(a: dict[str, Tensor], b: dict[str, Tensor]) -> None:
    assert set(a) == set(b)
    for name, tensor in a.items():
        assert torch.equal(tensor, b[name]), name


@pytest.mark.slow  # saves and reloads checkpoints, three backends
def test_save_load_resumes_bit_exact(tiny_model_dir: Path, tmp_path: Path) -> None:
    actor = {"lr": 1e-3, "schedule": "cosine", "decay_steps": 3}  # lr 1 -> 0.75 -> 0.25 x
    cfg = {"actor": actor, "critic": {"optimizer": {"lr": 1e-3, "warmup_steps": 3}}}
    a = backend(tiny_model_dir, **cfg)
    first, second = constructed_batch(a), constructed_batch(a, rewards=(0.0, 1.0))
    m_first = a.train_step(first, StepObjective())
    after_first = whole_state(a)
    a.save(tmp_path / "ckpt", extra={"gate": {"counter": 3}, "cursor": "batch-7"})
    draws_a = rng_draws()
    m_a = a.train_step(second, StepObjective())
    b = backend(tiny_model_dir, **cfg, seed=7)  # another value-head init: load must replace it
    extra = b.load(tmp_path / "ckpt")
    assert (b.version, b.steps) == (1, 1)
    assert extra == {"gate": {"counter": 3}, "cursor": "batch-7"}
    assert rng_draws() == draws_a  # torch, Python and numpy RNG states restored
    m_b = b.train_step(second, StepObjective())
    assert abs(m_a["actor/loss"] - m_b["actor/loss"]) <= 1e-7
    assert m_a == m_b
    assert_same_state(whole_state(a), whole_state(b))
    # a checkpoint saved before the first step resumes as a fresh trainer: as ``a`` took its
    # first step (Adam's step count included: DCP's zero-lr initialisation step would change
    # the bias correction if the save initialised the optimiser states)
    c = backend(tiny_model_dir, **cfg)
    c.save(tmp_path / "fresh")
    c.train_step(second, StepObjective())  # state the load must undo
    assert c.load(tmp_path / "fresh") == {} and (c.version, c.steps) == (0, 0)
    assert c.train_step(first, StepObjective()) == m_first
    assert_same_state(whole_state(c), after_first)


def test_bad_checkpoints_and_models_give_clear_errors(tiny_model_dir: Path, tmp_path: Path) -> None:
    import json
    import shutil

    from trainer.backends import BackendError
    from trainer.checkpoint import CheckpointError

    b = backend(tiny_model_dir)
    with pytest.raises(BackendError, match="not JSON-serialisable"):
        b.save(tmp_path / "ckpt", extra={"tensor": torch.zeros(1)})
    ckpt = b.save(tmp_path / "ckpt")
    (ckpt / "dcp" / "__0_0.distcp").write_bytes(b"garbage")
    with pytest.raises(CheckpointError, match=r"checksum mismatch in dcp/__0_0\.distcp"):
        b.load(ckpt)
    ckpt = b.save(tmp_path / "ckpt")
    (ckpt / "rng-0.pt").unlink()
    with pytest.raises(CheckpointError, match=r"part rng-0\.pt is missing"):
        b.load(ckpt)
    ckpt = b.save(tmp_path / "ckpt")
    manifest = json.loads((ckpt / "manifest.json").read_text())
    (ckpt / "manifest.json").write_text(json.dumps({**manifest, "layout": "torch-files-0"}))
    with pytest.raises(CheckpointError, match="checkpoint layout 'torch-files-0'"):
        b.load(ckpt)
    entry = manifest["files"]["trainer.pt"]
    manifest["files"]["trainer.pt"] = {**entry, "sha256": "0" * 64}
    (ckpt / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match=r"checksum mismatch in trainer\.pt"):
        b.load(ckpt)
    (ckpt / "manifest.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="corrupt manifest"):
        b.load(ckpt)
    with pytest.raises(CheckpointError, match=r"manifest\.json is missing"):
        b.load(tmp_path)
    # a checkpoint of another model (different shapes)
    other = tmp_path / "other-model"
    shutil.copytree(tiny_model_dir, other)
    config = json.loads((other / "config.json").read_text())
    config["intermediate_size"] = 96
    (other / "config.json").write_text(json.dumps(config))
    from transformers import AutoConfig, AutoModelForCausalLM

    AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(other)).save_pretrained(other)
    ckpt = backend(other).save(tmp_path / "other-ckpt")
    with pytest.raises(CheckpointError, match="checkpoint of another model"):
        b.load(ckpt)
    # an architecture the backend does not train
    config["architectures"] = ["Qwen3ForSequenceClassification"]
    (other / "config.json").write_text(json.dumps(config))
    with pytest.raises(BackendError, match="unsupported model architecture"):
        backend(other)
    with pytest.raises(BackendError, match="not a Hugging Face model directory"):
        backend(tmp_path / "nowhere")
