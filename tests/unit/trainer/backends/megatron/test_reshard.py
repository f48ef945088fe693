"""Resharding megatron checkpoints across model-parallel layouts (``python -m trainer reshard``).

The tensor rules against :mod:`trainer.backends.megatron.convert` (the layout the backend
builds) bit for bit; checkpoint round trips (one process); a TP=2 checkpoint resharded to TP=1
and a PP=2 one to PP=1 continue in one process with the parallel run's next step, a TP=1 one
resharded to TP=2 continues in two processes with the one-process next step; bad input refused
by name."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from trainer.backends import StepObjective, create_backend
from trainer.backends.megatron import convert
from trainer.backends.megatron.backend import MegatronBackend
from trainer.backends.megatron.reshard_rules import (
    Layout,
    ReshardError,
    Shape,
    merge,
    merge_tensor_parallel,
    split,
    split_tensor_parallel,
)
from trainer.config import TrainerConfig


def hf_config(moe: bool = False, tied: bool = False) -> SimpleNamespace:
    """A small Qwen3(-MoE) shape: 8 heads in 4 query groups, 4 layers, 4 experts."""
    return SimpleNamespace(
        model_type="qwen3_moe" if moe else "qwen3",
        num_attention_heads=8,
        num_key_value_heads=4,
        head_dim=4,
        hidden_size=16,
        intermediate_size=24,
        moe_intermediate_size=8,
        num_experts=4,
        vocab_size=32,
        num_hidden_layers=4,
        tie_word_embeddings=tied,
    )


def hf_weights(config: SimpleNamespace) -> dict[str, torch.Tensor]:
    """Random HF weights of ``config``'s shape (every element distinct)."""
    g = torch.Generator().manual_seed(0)
    h, d = config.hidden_size, config.head_dim
    shapes = {"model.embed_tokens.weight": (config.vocab_size, h), "model.norm.weight": (h,)}
    if not config.tie_word_embeddings:
        shapes["lm_head.weight"] = (config.vocab_size, h)
    for i in range(config.num_hidden_layers):
        p = f"model.layers.{i}."
        shapes |= {
            f"{p}input_layernorm.weight": (h,),
            f"{p}post_attention_layernorm.weight": (h,),
            f"{p}self_attn.q_proj.weight": (config.num_attention_heads * d, h),
            f"{p}self_attn.k_proj.weight": (config.num_key_value_heads * d, h),
            f"{p}self_attn.v_proj.weight": (config.num_key_value_heads * d, h),
            f"{p}self_attn.o_proj.weight": (h, config.num_attention_heads * d),
            f"{p}self_attn.q_norm.weight": (d,),
            f"{p}self_attn.k_norm.weight": (d,),
        }
        mlps = [f"{p}mlp."]
        ffn = config.intermediate_size
        if config.model_type == "qwen3_moe":
            shapes[f"{p}mlp.gate.weight"] = (config.num_experts, h)
            mlps = [f"{p}mlp.experts.{e}." for e in range(config.num_experts)]
            ffn = config.moe_intermediate_size
        for m in mlps:
            shapes |= {
                f"{m}gate_proj.weight": (ffn, h),
                f"{m}up_proj.weight": (ffn, h),
                f"{m}down_proj.weight": (h, ffn),
            }
    return {name: torch.randn(shape, generator=g) for name, shape in shapes.items()}


def module_order(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``weights`` in a ``GPTModel``'s order: embedding, the layers, final norm, output."""

    def rank(name: str) -> tuple[int, int]:
        if name.startswith("decoder.layers."):
            return 1, int(name.split(".")[2])
        return (0 if name.startswith("embedding.") else 2 if "final" in name else 3), 0

    return {name: weights[name] for name in sorted(weights, key=rank)}


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("tp", [2, 4])
def test_tensor_parallel_split_is_convert_s_layout_and_merges_back(tp: int) -> None:
    config = hf_config()
    hf = hf_weights(config)
    whole = convert.hf_to_megatron(hf, config)
    ranks = [convert.hf_to_megatron(hf, config, r, tp) for r in range(tp)]
    assert all(
        same(got, want) for got, want in zip(split_tensor_parallel(whole, tp), ranks, strict=True)
    )
    assert same(merge_tensor_parallel(ranks), whole)
    swapped = merge_tensor_parallel([ranks[1], ranks[0], *ranks[2:]])  # a wrong order: caught
    assert not same(swapped, whole)


@pytest.mark.parametrize("tied", [False, True])
def test_pipeline_stages_are_convert_s_and_merge_back(tied: bool) -> None:
    config = hf_config(tied=tied)
    shape = Shape(4, 0, tied)
    whole = module_order(convert.hf_to_megatron(hf_weights(config), config))
    layout = Layout(tp=2, pp=2)
    ranks = split(whole, layout, shape)
    for (t, p, _), entries in ranks.items():
        stage = convert.pipeline_stage(whole, config, p, 2)
        want = split_tensor_parallel(stage, 2)[t]
        assert same(entries, want), (t, p)
    assert same(merge(ranks, layout, shape), whole)
    assert list(merge(ranks, layout, shape)) == list(whole)  # the whole model's order back


def test_experts_split_over_expert_parallel_ranks_as_convert_does() -> None:
    config = hf_config(moe=True)
    shape = Shape(4, 4, False)
    hf = hf_weights(config)
    whole = module_order(convert.hf_to_megatron(hf, config))
    layout = Layout(ep=2)
    ranks = split(whole, layout, shape)
    for e in range(2):
        assert same(ranks[(0, 0, e)], convert.hf_to_megatron(hf, config, 0, 1, e, 2))
    assert same(merge(ranks, layout, shape), whole)
    assert list(merge(ranks, layout, shape)) == list(whole)


def test_optimizer_states_split_like_their_parameters_and_step_is_replicated() -> None:
    config = hf_config()
    whole = convert.hf_to_megatron(hf_weights(config), config)
    states = {
        name: {"step": torch.tensor(3.0), "exp_avg": t * 2, "exp_avg_sq": t.abs()}
        for name, t in whole.items()
    }
    ranks = split(states, Layout(tp=2, pp=2), Shape(4), optimizer=True)
    weights = split(whole, Layout(tp=2, pp=2), Shape(4))
    for coords, entries in ranks.items():
        for name, state in entries.items():
            assert torch.equal(state["exp_avg"], weights[coords][name] * 2)
            assert float(state["step"]) == 3.0
    back = merge(ranks, Layout(tp=2, pp=2), Shape(4))
    assert all(same(back[n], states[n]) for n in states)


def test_value_head_lives_on_the_last_stage() -> None:
    shape = Shape(2)
    whole = {"body.decoder.layers.0.input_layernorm.weight": torch.ones(2)}
    whole |= {"body.decoder.layers.1.input_layernorm.weight": torch.ones(2)}
    whole["value_head.weight"] = torch.arange(2.0)
    stages = split(whole, Layout(pp=2), shape)
    assert all("value_head.weight" in s for s in stages.values())  # the weights: every stage
    states = split(whole, Layout(pp=2), shape, optimizer=True)
    assert "value_head.weight" not in states[(0, 0, 0)] and "value_head.weight" in states[(0, 1, 0)]
    stale = {**stages[(0, 0, 0)], "value_head.weight": torch.zeros(2)}  # never trained there
    merged = merge({(0, 0, 0): stale, (0, 1, 0): stages[(0, 1, 0)]}, Layout(pp=2), shape)
    assert torch.equal(merged["value_head.weight"], torch.arange(2.0))  # the last stage's


def test_layouts_a_model_cannot_take_are_refused() -> None:
    with pytest.raises(ReshardError, match="positive integer"):
        Layout(tp=0)
    with pytest.raises(ReshardError, match="num_hidden_layers=4 does not split over pipeline"):
        Shape(4).check(Layout(pp=3))
    with pytest.raises(ReshardError, match="needs a MoE model"):
        Shape(4).check(Layout(ep=2))
    with pytest.raises(ReshardError, match=r"no tensor-parallel rule for 'decoder\.x\.bias'"):
        split_tensor_parallel({"decoder.x.bias": torch.zeros(2)}, 2)


# ---------------------------------------------------------------------- whole checkpoints

LR = 1e-3  # tests.support.megatron_reshard_worker's


def one_process(model: Path, **settings: object) -> MegatronBackend:
    lrs = {"actor": {"lr": LR}, "critic": {"optimizer": {"lr": LR}}}
    config = TrainerConfig(model=str(model), backend="megatron", **lrs, **settings)
    backend = create_backend(config)
    assert isinstance(backend, MegatronBackend)
    return backend


def objective() -> StepObjective:
    return StepObjective(algorithm="li2sao", phase="bootstrap")


@pytest.fixture(scope="module")
def saved(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A one-process checkpoint of the 2-KV-head model after a step, with the next step."""
    from tests.unit.trainer.backends.megatron.test_backend import gqa_model_dir, parity_batch

    root = tmp_path_factory.mktemp("reshard")
    model = gqa_model_dir(tiny_model_dir, root / "gqa")
    backend = one_process(model)
    batch = parity_batch(backend)
    backend.train_step(batch, objective())
    backend.save(root / "tp1", extra={"cursor": 1})
    want = backend.train_step(batch, objective())
    weights = {n: t.clone() for n, t in backend.named_weights()}
    return {"root": root, "model": model, "batch": batch, "metrics": want, "weights": weights}


def assert_same_checkpoint(a: Path, b: Path) -> None:
    """Every tensor, entry order and parameter group of two checkpoints equal, bit for bit."""
    from trainer.backends.megatron.reshard import read

    one, two = read(a), read(b)
    assert one.layout == two.layout and one.manifest["fingerprint"] == two.manifest["fingerprint"]
    for unit in ("actor", "critic"):
        for coords, entries in one.models[unit].items():
            other = two.models[unit][coords]
            assert list(entries) == list(other)
            tensors = [k for k, v in entries.items() if isinstance(v, torch.Tensor)]
            assert all(torch.equal(entries[k], other[k]) for k in tensors)
        assert one.groups[unit] == two.groups[unit]
        for coords, states in one.states[unit].items():
            assert states.keys() == two.states[unit][coords].keys()
            assert all(same(states[k], two.states[unit][coords][k]) for k in states)


@pytest.mark.slow  # megatron-core's import and set-up take seconds
def test_round_trips_through_other_layouts_are_bit_exact_and_load(saved: dict) -> None:
    from trainer.backends.megatron.reshard import read, reshard

    root = saved["root"]
    for name, layout in (("tp2", Layout(tp=2)), ("tp2pp2", Layout(tp=2, pp=2))):
        written = reshard(root / "tp1", root / name, layout)
        manifest = json.loads((written / "manifest.json").read_text())
        assert manifest["parallel"] == {
            "tensor_parallel": layout.tp,
            "pipeline_parallel": layout.pp,
            "expert_parallel": 1,
        }
        assert manifest["world_size"] == layout.size and manifest["steps"] == 1
        assert manifest["resharded_from"]["parallel"]["tensor_parallel"] == 1
        assert sorted(p for p in manifest["files"] if p.startswith("rng-")) == [
            f"rng-{r}.pt" for r in range(layout.size)
        ]
        shards = read(written).models["actor"]
        qkv = "decoder.layers.0.self_attention.linear_qkv.weight"
        assert shards[(1, 0, 0)][qkv].shape[0] == 64  # half the 2-group fused rows
        reshard(written, root / f"{name}-back", Layout())
        assert_same_checkpoint(root / "tp1", root / f"{name}-back")
    resumed = one_process(saved["model"])
    assert resumed.load(root / "tp2pp2-back") == {"cursor": 1}
    assert resumed.train_step(saved["batch"], objective()) == saved["metrics"]  # bit for bit


@pytest.mark.slow
def test_bad_checkpoints_and_layouts_are_refused_by_name(saved: dict, tmp_path: Path) -> None:
    import shutil

    from trainer.backends.megatron.reshard import reshard
    from trainer.checkpoint import CheckpointError

    root = saved["root"]
    with pytest.raises(ReshardError, match="num_key_value_heads=2 does not split over tensor"):
        reshard(root / "tp1", tmp_path / "tp4", Layout(tp=4))
    with pytest.raises(ReshardError, match="needs a MoE model"):
        reshard(root / "tp1", tmp_path / "ep2", Layout(ep=2))
    assert not (tmp_path / "tp4").exists() and not (tmp_path / "ep2").exists()

    def tampered(name: str, **changes: object) -> Path:
        copy = tmp_path / name
        shutil.copytree(root / "tp1", copy)
        manifest = json.loads((copy / "manifest.json").read_text())
        (copy / "manifest.json").write_text(json.dumps({**manifest, **changes}))
        return copy

    cases = [
        (tampered("torch", backend="torch"), "torch-backend checkpoint: it needs no resharding"),
        (tampered("bad", parallel={"tensor_parallel": 0}), "corrupt manifest.*'parallel'"),
        (tampered("odd", parallel={"sequence_parallel": 2}), "unknown parallel layout keys"),
        (tampered("zero", parallel={"optimizer_shards": 2}), "distributed_optimizer"),
        (tampered("other", fingerprint="0" * 64), "do not give the fingerprint"),
    ]
    for path, message in cases:
        with pytest.raises(ReshardError, match=message):
            reshard(path, tmp_path / "out", Layout(tp=2))
    broken = tampered("broken")
    (broken / "manifest.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="corrupt manifest"):
        reshard(broken, tmp_path / "out", Layout(tp=2))
    flipped = tampered("flipped")
    shard = flipped / "dcp" / "__0_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one byte of a tensor changed
    shard.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="checksum mismatch"):
        reshard(flipped, tmp_path / "out", Layout(tp=2))
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_the_command_line_tool(
    saved: dict, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from trainer.__main__ import main

    src = str(saved["root"] / "tp1")
    with pytest.raises(SystemExit) as exited:
        main(
            ["reshard", "--checkpoint", src, "--out", str(tmp_path / "x"), "--tp", "0", "--pp", "1"]
        )
    assert exited.value.code == 2 and "positive integer" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exited:
        main(["reshard", "--checkpoint", src, "--out", src, "--tp", "2", "--pp", "1"])
    assert exited.value.code == 2 and "exists" in capsys.readouterr().err
    args = ["reshard", "--checkpoint", src, "--out", str(tmp_path / "y"), "--pp", "1"]
    assert main([*args, "--tp", "4"]) == 1
    assert "error: num_key_value_heads=2" in capsys.readouterr().err
    assert main([*args, "--tp", "2"]) == 0
    manifest = json.loads((tmp_path / "y" / "manifest.json").read_text())
    assert manifest["parallel"]["tensor_parallel"] == 2 and manifest["world_size"] == 2


@pytest.mark.slow  # two processes import megatron-core
def test_resharded_checkpoints_continue_the_other_layout_s_run(
    saved: dict, tiny_model_dir: Path
) -> None:
    """TP=2 -> TP=1 and PP=2 -> PP=1 (the parallel run's next step in one process) and TP=1
    -> TP=2 (the one-process next step in two), one process pair for the three."""
    from tests.support.megatron_pp_worker import BATCH as PP_BATCH
    from tests.support.ranks import run_ranks
    from tests.unit.trainer.backends.megatron.test_backend import parity_batch
    from trainer.backends.megatron.reshard import reshard

    root = saved["root"] / "pair"
    root.mkdir()
    reshard(saved["root"] / "tp1", root / "tp1-as-tp2", Layout(tp=2))
    torch.save(saved["batch"], root / "batch.pt")
    tiny_batch = parity_batch(one_process(tiny_model_dir, batch=PP_BATCH))
    torch.save(tiny_batch, root / "tiny_batch.pt")
    out = root / "out.pt"
    args = [str(saved["model"]), str(tiny_model_dir), str(root / "batch.pt")]
    args += [str(root / "tiny_batch.pt"), str(root), str(out)]
    run_ranks("tests.support.megatron_reshard_worker", args)
    got = torch.load(out, weights_only=False)
    continues(got["from_tp1"], saved["metrics"], saved["weights"])  # TP=1 -> TP=2
    reshard(root / "tp2", root / "tp2-as-tp1", Layout())
    alone = one_process(saved["model"])
    assert alone.load(root / "tp2-as-tp1") == {"cursor": 1}
    step = {"metrics": alone.train_step(saved["batch"], objective())}
    continues(step | {"weights": dict(alone.named_weights())}, **got["tp2"])  # TP=2 -> TP=1
    reshard(root / "pp2", root / "pp2-as-pp1", Layout())
    alone = one_process(tiny_model_dir, batch=PP_BATCH)
    assert alone.load(root / "pp2-as-pp1") == {"cursor": 1}
    step = {"metrics": alone.train_step(tiny_batch, objective())}
    continues(step | {"weights": dict(alone.named_weights())}, **got["pp2"])  # PP=2 -> PP=1


def continues(run: dict, metrics: dict, weights: dict) -> None:
    """``run``'s step is the expected next step: every metric and weight within 1e-6, grad
    norms within 1e-5 (summed over the tensor-parallel shards in another order: 5e-6 seen)."""
    planned = ("data/micro_batches", "data/padding_fraction")  # each layout's own plan
    want = {k: v for k, v in metrics.items() if k not in planned}
    got = {k: v for k, v in run["metrics"].items() if k not in planned}
    assert want.keys() == got.keys() and len(want) > 10
    for key, value in want.items():
        tol = 1e-5 if "grad_norm" in key else 1e-6
        assert abs(value - got[key]) <= tol * max(1.0, abs(value)), (key, value, got[key])
    assert weights.keys() == run["weights"].keys()
    for name, tensor in weights.items():
        diff = float((tensor - run["weights"][name]).abs().max())
        assert diff <= 1e-6, (name, diff)


@pytest.mark.slow
def test_another_layout_s_checkpoint_is_refused_naming_the_reshard_command(
    saved: dict, tmp_path: Path
) -> None:
    import shutil

    from trainer.backends.megatron.reshard import reshard
    from trainer.checkpoint import CheckpointError

    other = reshard(saved["root"] / "tp1", tmp_path / "tp2", Layout(tp=2))
    backend = one_process(saved["model"])
    with pytest.raises(CheckpointError) as refused:
        backend.load(other)
    message = str(refused.value)
    assert "saved under tensor_parallel=2 pipeline_parallel=1 expert_parallel=1" in message
    assert f"python -m trainer reshard --checkpoint {other} --out NEW_DIR --tp 1 --pp 1," in message
    zero = tmp_path / "zero"
    shutil.copytree(saved["root"] / "tp1", zero)
    manifest = json.loads((zero / "manifest.json").read_text())
    manifest["parallel"]["optimizer_shards"] = 2
    (zero / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match="sharded AdamW states are not resharded"):
        backend.load(zero)
    assert backend.steps == 0  # refused before anything changed


@pytest.mark.slow
def test_a_moe_checkpoint_round_trips_through_expert_parallel(
    tiny_moe_dir: Path, tmp_path: Path
) -> None:
    """EP=1 -> EP=2 (each rank half the experts, renumbered) -> EP=1: the same checkpoint."""
    from tests.unit.trainer.backends.megatron.test_backend import parity_batch
    from trainer.backends.megatron.reshard import read, reshard

    backend = one_process(tiny_moe_dir)
    backend.train_step(parity_batch(backend), objective())
    backend.save(tmp_path / "ep1")
    reshard(tmp_path / "ep1", tmp_path / "ep2", Layout(ep=2))
    halves = read(tmp_path / "ep2").models["actor"]
    experts = {
        n.split("local_experts.")[1].split(".")[0]
        for n in halves[(0, 0, 1)]
        if "local_experts" in n
    }
    assert experts == {"0", "1"}  # of the tiny MoE's four
    reshard(tmp_path / "ep2", tmp_path / "back", Layout())
    assert_same_checkpoint(tmp_path / "ep1", tmp_path / "back")
