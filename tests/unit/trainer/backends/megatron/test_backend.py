"""The megatron backend against the torch backend on the tiny dense model, fp32: the same
per-token logprobs, entropies and values, the same step (objective metrics, exported weights
after one AdamW step at lr 1e-2), the critic's frozen parts, the HF export, clear errors.

One megatron backend per check, all in this module: importing megatron-core costs seconds once
per process, a backend on the tiny model a fraction of that."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from tests.support.megatron_resume import EXTRA, assert_resumed
from tests.support.ranks import run_ranks
from tests.support.trajectory_records import record, turn
from tests.unit.trainer.backends.test_torch_backend import assert_stepped_alike
from trainer.backends import BackendError, StepObjective, create_backend
from trainer.backends.megatron.backend import MegatronBackend
from trainer.backends.torch_backend import PolicyScorer, TorchBackend
from trainer.checkpoint import CheckpointError
from trainer.config import TrainerConfig
from trainer.data import TrainBatch, build_batch, pack_inputs

pytestmark = pytest.mark.slow  # megatron-core's import and set-up take seconds

LR = 1e-2  # a large step: at lr 1e-6 a tolerance of 1e-5 would pass with no step at all


def make(model_dir: Path, name: str, **overrides) -> TorchBackend:
    config = TrainerConfig(model=str(model_dir), backend=name, **overrides)
    return create_backend(config)


def parity_batch(reference: TorchBackend, longer_first: int = 0) -> TrainBatch:
    """Six rows of different lengths in three groups (packed into shared lanes), rewards 1/0,
    behaviour logprobs the reference's (ratio 1); ``longer_first``: tokens added to the first
    row's prompt."""
    records = []
    for i in range(6):
        prompt = [3, 4, 5 + i] + [9 + i] * (2 * i + (longer_first if i == 0 else 0))
        turns = [turn([], [30 + i, 31, 32], 0), turn([6, 7], [40, 41 + i, 50 + i], 0)]
        records.append(record(f"r{i}", [(prompt, turns)], reward=float(i % 2), group=f"g{i // 2}"))
    batch, _ = build_batch(records, trainer_version=0)
    return replace(batch, behavior_logp=reference.logprobs_and_values(batch).logprobs)


def test_a_megatron_backend_is_created_by_name(tiny_model_dir: Path) -> None:
    b = make(tiny_model_dir, "megatron")
    assert isinstance(b, MegatronBackend) and b.version == 0
    names = {n for n, _ in b.actor.named_parameters()}
    assert "decoder.layers.0.self_attention.linear_qkv.weight" in names  # a real GPTModel


def test_named_weights_round_trip_the_checkpoint_bit_exactly(tiny_model_dir: Path) -> None:
    hf = load_file(tiny_model_dir / "model.safetensors")
    weights = dict(make(tiny_model_dir, "megatron").named_weights())
    assert weights.keys() == hf.keys()  # tied lm_head omitted, as in the file
    assert all(torch.equal(weights[name], hf[name]) for name in hf)


def test_logprobs_entropy_and_values_equal_the_torch_backend(tiny_model_dir: Path) -> None:
    torch_b = make(tiny_model_dir, "torch", batch={"lane_factor": 4.0})
    mega = make(tiny_model_dir, "megatron", batch={"lane_factor": 4.0})
    batch = parity_batch(torch_b)
    plan = mega._plan(batch)
    assert any(len(lane) > 1 for m in plan for lane in m.lanes)  # rows do share lanes
    want, got = torch_b.logprobs_and_values(batch), mega.logprobs_and_values(batch)
    mask = batch.action_mask
    assert int(mask.sum()) == 36
    assert float((want.logprobs - got.logprobs)[mask].abs().max()) < 1e-5
    assert float((want.entropy - got.entropy)[mask].abs().max()) < 1e-5
    assert want.values is not None and got.values is not None
    assert float((want.values - got.values)[mask].abs().max()) < 1e-5
    assert float(got.logprobs[mask].abs().min()) > 0 and float(got.values[mask].abs().min()) > 0
    assert not bool(got.logprobs[~mask].any())  # 0 off the action tokens


def test_packed_lanes_see_what_a_row_sees_alone(tiny_model_dir: Path) -> None:
    mega = make(tiny_model_dir, "megatron")
    batch = parity_batch(make(tiny_model_dir, "torch"))
    with torch.no_grad():
        packed = mega.scorer(pack_inputs(batch, [(0, 1, 2), (3, 4), (5,)]))
        alone = mega.scorer(pack_inputs(batch, [(r,) for r in range(batch.num_rows)]))
    mask = batch.action_mask
    assert float((packed - alone)[mask].abs().max()) < 1e-5


def adam_parity(
    want: torch.Tensor, got: torch.Tensor, start: torch.Tensor, eps_tol: float = 1e-4
) -> None:
    """Equal within 1e-5, except where Adam's epsilon dominates: an element whose gradient is
    ~1e-8 moves by less than lr and its step amplifies float rounding of that gradient (few
    elements; they still agree within ``eps_tol``, by default 1e-4, 1% of the step)."""
    diff = (want - got).abs()
    eps_dominated = (want - start).abs() < 0.99 * LR
    assert float(torch.where(eps_dominated, 0.0, diff).max()) < 1e-5
    assert float(diff.max()) < eps_tol
    assert int((diff > 1e-5).sum()) <= max(1, diff.numel() // 1000)


def close_metrics(
    want: dict[str, float], got: dict[str, float], later: tuple[str, ...] = ()
) -> None:
    """Every metric within 1e-5 (relative above 1); ``later``: prefixes of metrics held to
    1e-4: computed after the actor moved (its weights agree to ~1e-5), or a float32 norm that
    is itself that far from its exact value."""
    assert want.keys() == got.keys() and "actor/grad_norm" in want and len(want) > 10
    for key, value in want.items():  # losses, grad norms, objective metrics
        tol = 1e-4 if key.startswith(later) else 1e-5
        assert abs(value - got[key]) <= tol * max(1.0, abs(value)), key


def test_one_step_equals_the_torch_backend(tiny_model_dir: Path) -> None:
    lrs = {"actor": {"lr": LR}, "critic": {"optimizer": {"lr": LR}}}
    torch_b = make(tiny_model_dir, "torch", **lrs)
    mega = make(tiny_model_dir, "megatron", **lrs)
    batch = parity_batch(torch_b)
    start = load_file(tiny_model_dir / "model.safetensors")
    objective = StepObjective(algorithm="li2sao", phase="bootstrap")
    want, got = torch_b.train_step(batch, objective), mega.train_step(batch, objective)
    assert mega.version == torch_b.version == 1
    close_metrics(want, got)
    torch_w, mega_w = dict(torch_b.named_weights()), dict(mega.named_weights())
    assert torch_w.keys() == mega_w.keys()
    moved = 0
    for name, tensor in torch_w.items():
        adam_parity(tensor, mega_w[name], start[name])
        moved += int((tensor - start[name]).abs().gt(0.5 * LR).sum())
    assert moved > 10_000  # the step did move the weights
    assert torch.allclose(torch_b.critic.value_head.weight, mega.critic.value_head.weight,
                          atol=1e-5, rtol=0)  # fmt: skip


def test_a_pact_step_with_a_sigmoid_critic_equals_the_torch_backend(tiny_model_dir: Path) -> None:
    # Adam's eps = 1 makes the first update ~ lr * grad: the weight deltas compare gradients
    sgd_like = {"lr": 1.0, "eps": 1.0, "grad_clip": 0.0}
    settings = {"algorithm": "pact", "actor": sgd_like,
                "critic": {"optimizer": sgd_like, "head": "sigmoid"}}  # fmt: skip
    torch_b = make(tiny_model_dir, "torch", **settings)
    mega = make(tiny_model_dir, "megatron", **settings)
    batch = parity_batch(torch_b)
    start = load_file(tiny_model_dir / "model.safetensors")
    objective = StepObjective(algorithm="pact", phase="bootstrap")
    head_before = mega.critic.value_head.weight.detach().clone()
    want, got = torch_b.train_step(batch, objective), mega.train_step(batch, objective)
    close_metrics(want, got, later=("critic/",))  # PACT's critic sees the updated actor
    largest = 0.0
    torch_w = dict(torch_b.named_weights())
    for name, tensor in mega.named_weights():
        d_torch, d_mega = torch_w[name] - start[name], tensor - start[name]
        assert torch.allclose(d_mega, d_torch, atol=3e-7, rtol=1e-3), name
        largest = max(largest, float(d_torch.abs().max()))
    assert largest > 1e-4  # the step moved the weights
    head = (torch_b.critic.value_head.weight, mega.critic.value_head.weight)
    assert torch.allclose(*head, atol=1e-6, rtol=1e-3) and not torch.equal(head[1], head_before)


def test_critic_attention_and_embeddings_stay_frozen(tiny_model_dir: Path) -> None:
    mega = make(tiny_model_dir, "megatron", critic={"optimizer": {"lr": 1e-3}})
    batch = parity_batch(make(tiny_model_dir, "torch"))
    before = {n: p.detach().clone() for n, p in mega.critic.named_parameters()}
    mega.train_step(batch, StepObjective(algorithm="li2sao", phase="bootstrap"))
    changed = {n for n, p in mega.critic.named_parameters() if not torch.equal(before[n], p)}
    frozen = set(mega.frozen_critic_params)
    assert "body.embedding.word_embeddings.weight" in frozen
    assert "body.decoder.layers.0.self_attention.linear_qkv.weight" in frozen
    assert "body.decoder.layers.1.self_attention.q_layernorm.weight" in frozen
    assert not changed & frozen
    assert {"value_head.weight", "body.decoder.layers.0.mlp.linear_fc1.weight"} <= changed
    assert "body.decoder.layers.1.input_layernorm.weight" in changed


def test_the_export_loads_in_transformers_with_the_same_logprobs(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    mega = make(tiny_model_dir, "megatron", actor={"lr": LR}, kl_coef=0.1)
    batch = parity_batch(make(tiny_model_dir, "torch"))
    metrics = mega.train_step(batch, StepObjective(algorithm="grpo"))
    assert abs(metrics["actor/kl_ref"]) < 1e-6  # the reference is the initial actor
    assert mega.train_step(batch, StepObjective(algorithm="grpo"))["actor/kl_ref"] > 1e-4
    out = mega.export_hf(tmp_path / "export")
    assert (out / "tokenizer.json").is_file() and (out / "swerl_export.json").is_file()
    lm = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    inputs = pack_inputs(batch, [(r,) for r in range(batch.num_rows)])
    with torch.no_grad():
        want = torch.log_softmax(PolicyScorer(lm)(inputs), -1)
        got = torch.log_softmax(mega.scorer(inputs), -1)
    assert float((want - got)[batch.action_mask].abs().max()) < 1e-5
    exported = load_file(out / "model.safetensors")
    original = load_file(tiny_model_dir / "model.safetensors")
    assert not torch.equal(exported["model.norm.weight"], original["model.norm.weight"])


def test_unsupported_models_and_settings_are_named(
    tiny_model_dir: Path, tiny_moe_dir: Path
) -> None:
    with pytest.raises(BackendError, match="num_key_value_heads=1 does not split over tensor"):
        make(tiny_model_dir, "megatron", megatron={"tensor_parallel": 2})
    sharded = {"expert_parallel": 2, "distributed_optimizer": True}
    with pytest.raises(BackendError, match=r"distributed optimizer .* not built with expert"):
        make(tiny_moe_dir, "megatron", megatron=sharded)
    if not torch.cuda.is_available():
        with pytest.raises(BackendError, match="device cuda requested but CUDA is not avail"):
            make(tiny_model_dir, "megatron", device="cuda")
    with pytest.raises(BackendError, match="a MoE model under context parallel is not built"):
        make(tiny_moe_dir, "megatron", megatron={"context_parallel": 2})
    with pytest.raises(BackendError, match=r"world size 1 is not a multiple of .* x CP=2"):
        make(tiny_model_dir, "megatron", megatron={"context_parallel": 2})
    alone = make(tiny_model_dir, "megatron", megatron={"distributed_optimizer": True})
    assert isinstance(alone.actor_optimizer, torch.optim.AdamW)  # one process: nothing to shard


def recompute_parity(model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Full recompute (one layer per checkpoint) in actor and critic: every layer's forward
    runs again in the backward, and the step is the plain step (metrics, actor and critic)."""
    from megatron.core.tensor_parallel import random as megatron_random

    lrs = {"actor": {"lr": LR}, "critic": {"optimizer": {"lr": LR}}}
    plain = make(model_dir, "megatron", **lrs)
    recomputed = make(model_dir, "megatron", activation_checkpointing=True, **lrs)
    start = {n: p.detach().clone() for n, p in plain.critic.named_parameters()}
    batch = parity_batch(plain)
    real, runs = megatron_random.CheckpointFunction.backward, []

    def counted(ctx, *grads):
        runs.append(1)
        return real(ctx, *grads)

    monkeypatch.setattr(megatron_random.CheckpointFunction, "backward", staticmethod(counted))
    objective = StepObjective(algorithm="li2sao", phase="bootstrap")
    want = plain.train_step(batch, objective)
    assert not runs  # the plain backend keeps its activations
    got = recomputed.train_step(batch, objective)
    # actor and critic each recompute every layer (the critic's embeddings are frozen: without
    # embeddings_require_grad its checkpoints had no backward and its MLPs no gradient)
    assert len(runs) >= 2 * plain.hf_config.num_hidden_layers
    close_metrics(want, got)
    assert_stepped_alike(plain, recomputed, start)


def test_activation_recompute_takes_the_same_step(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    recompute_parity(tiny_model_dir, monkeypatch)


def test_bf16_activation_recompute_recomputes_in_bf16(tiny_model_dir: Path) -> None:
    """Under ``precision: bf16`` (torch's CPU autocast here; the config keeps bf16 for GPUs,
    so only that check is bypassed) a recomputed layer runs under the forward's autocast:
    megatron's checkpoint does not carry it into the backward, where the layer would compute
    in fp32 and the gradient be of another function. The step equals the plain bf16 step."""
    lrs = {"actor": {"lr": LR}, "critic": {"optimizer": {"lr": LR}}}

    def bf16(**overrides: object) -> TorchBackend:
        config = TrainerConfig(model=str(tiny_model_dir), backend="megatron", **lrs, **overrides)
        return create_backend(config.model_copy(update={"precision": "bf16"}))

    plain, recomputed = bf16(), bf16(activation_checkpointing=True)
    start = {n: p.detach().clone() for n, p in plain.critic.named_parameters()}
    batch = parity_batch(plain)
    objective = StepObjective(algorithm="li2sao", phase="bootstrap")
    want, got = plain.train_step(batch, objective), recomputed.train_step(batch, objective)
    norms = [k for k in want if "grad_norm" in k]  # an fp32 recompute: off by ~1e-4
    assert "actor/grad_norm" in norms and any(k.startswith("critic/") for k in norms)
    for key in norms:
        assert abs(want[key] - got[key]) <= 1e-6 * max(1.0, abs(want[key])), key
    close_metrics(want, got)
    assert_stepped_alike(plain, recomputed, start)


def test_save_load_continues_with_the_identical_next_step(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    lrs = {"actor": {"lr": 1e-3}, "critic": {"optimizer": {"lr": 1e-3}}}
    first = make(tiny_model_dir, "megatron", **lrs)
    batch = parity_batch(make(tiny_model_dir, "torch"))
    objective = StepObjective(algorithm="li2sao", phase="bootstrap")
    first.train_step(batch, objective)  # AdamW states and the schedule have moved
    first.save(tmp_path / "ckpt", extra={"gate": {"open": True}})
    want = first.train_step(batch, objective)
    resumed = make(tiny_model_dir, "megatron", **lrs)
    assert resumed.load(tmp_path / "ckpt") == {"gate": {"open": True}}
    assert resumed.version == 1 and resumed.steps == 1
    got = resumed.train_step(batch, objective)
    assert got == want  # every metric, bit for bit
    mine, theirs = dict(first.named_weights()), dict(resumed.named_weights())
    assert all(torch.equal(mine[n], theirs[n]) for n in mine)
    with pytest.raises(CheckpointError, match="a 'megatron' checkpoint, not torch"):
        make(tiny_model_dir, "torch").load(tmp_path / "ckpt")


def gqa_model_dir(tiny_model_dir: Path, directory: Path, tied: bool = False) -> Path:
    """A tiny Qwen3 (or, from the tiny MoE, Qwen3-MoE) with 2 key/value heads (TP=2 needs
    whole groups per rank) and untied embeddings (the output layer splits too; ``tied``: tied,
    as the tiny models'), random weights, the tiny model's tokenizer."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(tiny_model_dir)
    config.num_attention_heads, config.num_key_value_heads, config.head_dim = 4, 2, 16
    config.tie_word_embeddings = tied
    torch.manual_seed(3)
    AutoModelForCausalLM.from_config(config).save_pretrained(directory)
    for item in tiny_model_dir.iterdir():
        if item.name.startswith(("tokenizer", "special_tokens_map", "chat_template")):
            (directory / item.name).write_bytes(item.read_bytes())
    return directory


def check_two_replicas(got: dict, model: Path, scored: TrainBatch, **settings: object) -> None:
    """A TP or PP x DP=2 run against one process: both ranks of a replica on the same rows,
    the replicas splitting the groups, outputs within 1e-5, weights gathered bit-exactly, the
    one-process step, the value head (on every rank that applies it) and an exact resume."""
    replicas: dict[int, list[int]] = {}  # DP rank -> its global ranks (megatron's layout)
    for rank, (_, dp_rank, dp_size) in enumerate(got["coords"]):
        assert dp_size == 2
        replicas.setdefault(dp_rank, []).append(rank)
    assert sorted(replicas) == [0, 1]
    rows = {}
    for dp_rank, ranks in replicas.items():
        assert sorted(got["coords"][r][0] for r in ranks) == [0, 1]  # TP ranks or PP stages
        shares = [got["rows_by_rank"][r] for r in ranks]
        assert shares[0] == shares[1] and shares[0]  # a replica's ranks: the same rows
        rows[dp_rank] = shares[0]
    assert sorted(rows[0] + rows[1]) == list(range(scored.num_rows))  # split by replica
    check_like_one_process(got, model, scored, **settings)


def check_like_one_process(
    got: dict, model: Path, scored: TrainBatch, rough: tuple[str, ...] = (), **settings: object
) -> TorchBackend:
    """A parallel run's outputs (1e-5), gathered weights (bit-exact), step (metrics 1e-5,
    ``rough`` ones 1e-4; weights as in the one-process parity), value head and resume against
    one process; the one-process backend after its step."""
    one = make(model, "megatron", **settings)
    want, mask = one.logprobs_and_values(scored), scored.action_mask
    for part in ("logprobs", "values", "entropy"):
        diff = (getattr(got["forward"], part) - getattr(want, part))[mask].abs()
        assert float(diff.max()) < 1e-5, part
    hf = load_file(model / "model.safetensors")
    assert all(torch.equal(got["weights"][n], hf[n]) for n in hf)  # gathered bit-exactly
    one = make(model, "megatron", actor={"lr": LR}, critic={"optimizer": {"lr": LR}}, **settings)
    metrics = one.train_step(scored, StepObjective(algorithm="li2sao", phase="bootstrap"))
    planned = ("data/micro_batches", "data/padding_fraction")  # this rank's own plan
    want_metrics, got_metrics = (
        {k: v for k, v in m.items() if k not in planned} for m in (metrics, got["metrics"])
    )
    close_metrics(want_metrics, got_metrics, later=rough)
    for name, tensor in one.named_weights():
        adam_parity(tensor, got["stepped"][name], hf[name])
    head = one.critic.value_head.weight
    assert any(torch.allclose(h, head, atol=1e-5, rtol=0) for h in got["value_heads"][-1:])
    assert_resumed(got["resume"])
    return one


@pytest.mark.slow  # four processes import megatron-core
def test_tensor_or_pipeline_times_data_parallel_four_ranks_equal_one(
    tiny_model_dir: Path, tiny_moe_dir: Path, tmp_path: Path
) -> None:
    """TP=2 x DP=2 (the 2-KV-head variant), PP=2 x DP=2 (the tiny model, one layer per
    stage) and CP=2 x DP=2 (the 2-KV-head variant) over the same four processes: two
    replicas of two model-parallel (or CP) ranks, each replica its share of the groups; then
    TP=2 x CP=2 and TP=2 x PP=2 (with a KL reference; and tied), one replica; then a MoE
    under TP=2 x DP=2 (sequence parallel); the same outputs, step and weights as one
    process."""
    from tests.support.megatron_2d_worker import KL
    from tests.support.megatron_pp_worker import BATCH as PP_BATCH

    model = gqa_model_dir(tiny_model_dir, tmp_path / "gqa")
    batch = parity_batch(make(model, "megatron"))
    torch.save(batch, tmp_path / "batch.pt")
    tiny_batch = parity_batch(make(tiny_model_dir, "megatron", batch=PP_BATCH))
    torch.save(tiny_batch, tmp_path / "tiny_batch.pt")
    tied = gqa_model_dir(tiny_model_dir, tmp_path / "gqa-tied", tied=True)
    tied_batch = parity_batch(make(tied, "megatron"))
    torch.save(tied_batch, tmp_path / "tied_batch.pt")
    out = tmp_path / "2d.pt"
    args = [str(model), str(tmp_path / "batch.pt"), str(out), str(tmp_path / "ckpt")]
    args += [str(tiny_model_dir), str(tmp_path / "tiny_batch.pt")]
    args += [str(tied), str(tmp_path / "tied_batch.pt")]
    moe = gqa_model_dir(tiny_moe_dir, tmp_path / "moe-gqa", tied=True)
    moe_batch = parity_batch(make(moe, "megatron"))
    torch.save(moe_batch, tmp_path / "moe_batch.pt")
    args += [str(moe), str(tmp_path / "moe_batch.pt")]
    run_ranks("tests.support.megatron_2d_worker", args, world=4)
    four = torch.load(out, weights_only=False)
    check_two_replicas(four["tp"], model, batch)
    check_two_replicas(four["pp"], tiny_model_dir, tiny_batch, batch=PP_BATCH)
    check_two_replicas(four["cp"], model, batch)  # CP=2 x DP=2: replicas of two CP ranks
    tp_cp = four["tp_cp"]  # TP=2 x CP=2: one replica, megatron's order (TP ranks adjacent)
    assert tp_cp["tp_cp"] == [(0, 0), (1, 0), (0, 1), (1, 1)]
    assert [dp_size for _, _, dp_size in tp_cp["coords"]] == [1] * 4
    check_like_one_process(tp_cp, model, batch)
    for layout in ("tp", "pp"):
        check_distributed_optimizer(four[layout], four[f"{layout}_zero"])
    check_tensor_and_pipeline(four["tp_pp"], model, batch, kl_coef=KL)
    # tied: the first stage's embedding shard and the last stage's copy of it, per TP rank;
    # the actor's grad norm to 1e-4 (torch's float32 norm of this model's embedding gradient
    # is itself 3e-5 off its float64 value; every weight agrees as elsewhere)
    check_tensor_and_pipeline(four["tp_pp_tied"], tied, tied_batch, rough=("actor/grad_norm",))
    # a MoE under TP=2 x DP=2: attention and every expert split over the TP ranks, router and
    # norms whole (sequence parallel: their gradients summed over the TP ranks); tied, so the
    # actor's grad norm to 1e-4 as above
    shard = four["tp_moe"]["shapes"][1]
    expert = "decoder.layers.1.mlp.experts.local_experts.3."
    assert shard[f"{expert}linear_fc1.weight"] == (64, 64)  # its half of gate and of up
    assert shard[f"{expert}linear_fc2.weight"] == (64, 32)
    assert shard["decoder.layers.1.mlp.router.weight"] == (4, 64)
    check_two_replicas(four["tp_moe"], moe, moe_batch, rough=("actor/grad_norm",))


def check_tensor_and_pipeline(
    got: dict, model: Path, scored: TrainBatch, rough: tuple[str, ...] = (), **settings: object
) -> None:
    """TP=2 x PP=2 on four ranks (one replica; megatron's order: the TP ranks of stage 0, then
    of stage 1) against one process; with a KL reference (``kl_coef`` in ``settings``) the
    second step too, whose KL term is not 0 (the reference's logprobs pipelined like the
    actor's)."""
    from tests.support.megatron_pp_worker import BATCH as PP_BATCH

    assert got["tp_pp"] == [(0, 0), (1, 0), (0, 1), (1, 1)]
    assert [dp_size for _, _, dp_size in got["coords"]] == [1] * 4
    first, last = got["shapes"][1], got["shapes"][3]  # TP rank 1 of each stage
    assert first["embedding.word_embeddings.weight"] == (1024, 64)  # half the vocabulary
    assert first["decoder.layers.0.self_attention.linear_qkv.weight"] == (64, 64)  # one group
    assert "output_layer.weight" not in first and "decoder.final_layernorm.weight" in last
    assert (
        last["output_layer.weight"] == (1024, 64) and "embedding.word_embeddings.weight" not in last
    )
    assert not any(n.startswith("decoder.layers.1.") for n in (*first, *last))  # a layer each
    one = check_like_one_process(got, model, scored, batch=PP_BATCH, rough=rough, **settings)
    if "kl_coef" not in settings:
        return
    assert got["metrics"]["actor/kl_ref"] == 0.0  # the reference is the initial actor
    again = one.train_step(scored, StepObjective(algorithm="li2sao", phase="bootstrap"))
    assert again["actor/kl_ref"] > 1e-4
    planned = ("data/micro_batches", "data/padding_fraction")
    want = {k: v for k, v in again.items() if k not in planned}
    second = {k: v for k, v in got["resume"]["metrics"][0].items() if k not in planned}
    close_metrics(want, second, later=("",))  # after one step at lr 1e-2 (weights ~1e-5)


def check_distributed_optimizer(plain: dict, zero: dict) -> None:
    """The distributed optimizer under TP or PP x DP=2: the plain layout's step bit for bit
    (metrics and weights) and an exact resume, each rank holding part of its shard's AdamW
    states, its replica partner the rest (exp_avg and exp_avg_sq: twice the shard's size)."""
    assert zero["metrics"] == plain["metrics"]
    assert all(torch.equal(zero["stepped"][n], plain["stepped"][n]) for n in plain["stepped"])
    assert_resumed(zero["resume"])
    for rank, (held, local) in enumerate(plain["state_shares"]):
        assert held == 2 * local, rank  # plain: every rank keeps all its shard's states
    partners: dict[int, list[int]] = {}  # model-parallel rank -> its replicas' global ranks
    for rank, (model_rank, _, _) in enumerate(zero["coords"]):
        partners.setdefault(model_rank, []).append(rank)
    for ranks in partners.values():
        assert len(ranks) == 2
        held = [zero["state_shares"][r][0] for r in ranks]
        local = zero["state_shares"][ranks[0]][1]
        assert sum(held) == 2 * local and all(0 < h < 2 * local for h in held), held


def test_tensor_and_data_parallel_two_ranks_equal_one(tiny_model_dir: Path, tmp_path: Path) -> None:
    model = gqa_model_dir(tiny_model_dir, tmp_path / "gqa")
    one = make(model, "megatron")
    batch = parity_batch(one)
    torch.save(batch, tmp_path / "batch.pt")
    out, export = tmp_path / "tp.pt", tmp_path / "export"
    args = [str(model), str(tmp_path / "batch.pt"), str(out), str(export)]
    run_ranks("tests.support.megatron_tp_worker", args)
    two = torch.load(out, weights_only=False)
    assert two["shard"]["decoder.layers.0.self_attention.linear_qkv.weight"] == (64, 64)  # half
    assert two["shard"]["output_layer.weight"] == (1024, 64)  # half the vocabulary
    want, mask = one.logprobs_and_values(batch), batch.action_mask
    untied = make(model, "torch").logprobs_and_values(batch)  # HF lm_head = output_layer
    assert float((untied.logprobs - want.logprobs)[mask].abs().max()) < 1e-5
    for part in ("logprobs", "values", "entropy"):
        diff = (getattr(two["forward"], part) - getattr(want, part))[mask].abs()
        assert float(diff.max()) < 1e-5, part
    hf = load_file(model / "model.safetensors")
    assert "lm_head.weight" in hf and two["weights"].keys() == hf.keys()
    assert all(torch.equal(two["weights"][n], hf[n]) for n in hf)  # gathered bit-exactly
    exported = load_file(export / "model.safetensors")
    assert exported.keys() == hf.keys() and all(torch.equal(exported[n], hf[n]) for n in hf)
    # one step: the same losses, grad norms (over both ranks' shards) and weights
    one = make(model, "megatron", actor={"lr": LR}, critic={"optimizer": {"lr": LR}})
    metrics = one.train_step(batch, StepObjective(algorithm="li2sao", phase="bootstrap"))
    for key in ("actor/loss", "critic/loss", "actor/grad_norm", "critic/grad_norm_pass1"):
        assert abs(two["metrics"][key] - metrics[key]) <= 1e-5 * max(1.0, abs(metrics[key])), key
    for name, tensor in one.named_weights():
        adam_parity(tensor, two["stepped"][name], hf[name])
    assert torch.allclose(two["value_head"], one.critic.value_head.weight, atol=1e-5, rtol=0)
    # checkpoints under TP=2: a fresh TP=2 backend resumes with the identical next step
    assert two["checkpoint_problem"] is None and two["dp"]["checkpoint_problem"] is None
    assert_resumed(two["resume"])
    refused = two["dp"]["layout_refused"]  # the TP=2 checkpoint under TP=1: named, not loaded
    assert "saved under tensor_parallel=2 pipeline_parallel=1 expert_parallel=1" in refused
    assert "this trainer runs tensor_parallel=1" in refused
    # the same pair as TP=1 x DP=2: each rank scores and trains its groups, the sums are whole
    dp = two["dp"]
    assert dp["world"] == 2
    for part in ("logprobs", "values", "entropy"):
        diff = (getattr(dp["forward"], part) - getattr(want, part))[mask].abs()
        assert float(diff.max()) < 1e-5, part
    close_metrics(metrics, dp["metrics"])
    for name, tensor in one.named_weights():
        adam_parity(tensor, dp["stepped"][name], hf[name])
    assert torch.allclose(dp["value_head"], one.critic.value_head.weight, atol=1e-5, rtol=0)
    assert_resumed(dp["resume"])
    # the distributed optimizer (ZeRO-1): the replicated step bit for bit, each rank holding
    # part of the AdamW states (exp_avg and exp_avg_sq: twice the actor's size in all)
    zero = dp["zero"]
    assert zero["metrics"] == dp["metrics"]
    assert all(torch.equal(zero["stepped"][n], dp["stepped"][n]) for n in dp["stepped"])
    shares = zero["state_shares"]
    assert sum(shares) == 2 * zero["actor_numel"] and all(0 < s < sum(shares) for s in shares)
    assert_resumed(zero["resume"])
    assert "optimizer_shards=2" in zero["plain_refused"]  # the states are sharded: refused
    # the data-parallel checkpoint loads into one process (replicas share their keys)
    alone = make(model, "megatron", actor={"lr": LR}, critic={"optimizer": {"lr": LR}})
    assert alone.load(f"{export}-dp-ckpt") == EXTRA and alone.steps == 1
    resumed = alone.train_step(batch, StepObjective(algorithm="li2sao", phase="bootstrap"))
    close_metrics(dp["resume"]["metrics"][0], resumed)


def test_rotary_angles_stay_fp32_under_bf16_autocast(tiny_model_dir: Path) -> None:
    """``precision: bf16`` autocasts the forwards; megatron's M-RoPE angles are a matrix
    product that autocast would take to bfloat16 (radians off past a few hundred positions;
    on a GPU a 6-nat train / rollout mismatch). The backend keeps them fp32, as HF does."""
    from trainer.backends.megatron.model import rope_outside_autocast

    rope = make(tiny_model_dir, "megatron").actor.rotary_pos_emb
    positions = torch.arange(4096)[None, None, :].expand(3, 1, -1)
    section = rope.inv_freq.numel()
    want = rope(positions, [section, 0, 0])
    with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
        got = rope(positions, [section, 0, 0])
    assert got.dtype == torch.float32 and torch.equal(got, want)
    unwrapped = type(rope).forward.__get__(rope)  # megatron's own forward, without the wrapper
    with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
        bf16 = unwrapped(positions, [section, 0, 0])
    assert float((bf16.float() - want).abs().max()) > 1.0  # what the wrapper prevents
    rope_outside_autocast(rope)  # twice: still the fp32 angles
    with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
        assert torch.equal(rope(positions, [section, 0, 0]), want)
