"""Two gloo ranks with FSDP2 take the same step as one process on the same global batch, and
resume exactly from the sharded checkpoint they write."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.support.dp_checkpoint_worker import EXTRA
from tests.support.dp_worker import run
from tests.support.ranks import run_ranks
from tests.support.trajectory_records import record, turn
from trainer.backends.torch_backend import TorchBackend
from trainer.checkpoint import CheckpointError, read_manifest
from trainer.config import TrainerConfig
from trainer.data import build_batch

pytestmark = pytest.mark.slow  # two gloo ranks in their own processes (minutes on 2 cores)


def global_batch(model_dir: Path):
    records = [
        record(
            f"t{i}",
            [
                (
                    [3, 4, 5][: 1 + i % 3],
                    [turn([], [30 + i, 31] * (1 + i % 4), 0), turn([6, 7], [40, 41 + i], 0)],
                )
            ],
            reward=float(i % 2),
            group=f"g{i // 2}",
        )
        for i in range(8)
    ]
    batch, _ = build_batch(records, trainer_version=0)
    logp = TorchBackend(TrainerConfig(model=str(model_dir))).logprobs_and_values(batch).logprobs
    return replace(batch, behavior_logp=logp - 0.05 * batch.action_mask)  # ratios near 1


def test_two_rank_fsdp_step_equals_one_process(tiny_model_dir: Path, tmp_path: Path) -> None:
    batch = global_batch(tiny_model_dir)
    torch.save(batch, tmp_path / "batch.pt")
    args = [str(tiny_model_dir), str(tmp_path / "batch.pt"), str(tmp_path / "dp.pt")]
    run_ranks("tests.support.dp_worker", [*args, str(tmp_path / "export")])
    two = torch.load(tmp_path / "dp.pt", weights_only=False)
    one = run(str(tiny_model_dir), str(tmp_path / "batch.pt"))
    # forward: each rank scored its own groups, the sum is the whole batch
    assert torch.allclose(two["logprobs"], one["logprobs"], atol=1e-6, rtol=0)
    assert torch.allclose(two["values"], one["values"], atol=1e-6, rtol=0)
    for key in ("actor/loss", "critic/loss", "critic/loss_pass1", "batch/trajectories"):
        assert abs(two["metrics"][key] - one["metrics"][key]) < 1e-6, key
    start = TorchBackend(TrainerConfig(model=str(tiny_model_dir)))
    initial = dict(start.named_weights())
    initial_critic = start.critic.state_dict()
    largest = 0.0
    for part, init in (("actor", initial), ("critic", initial_critic)):
        assert set(two[part]) == set(one[part])
        for name, weight in one[part].items():
            d_one, d_two = weight - init[name], two[part][name] - init[name]
            assert torch.allclose(d_two, d_one, atol=3e-7, rtol=1e-3), (part, name)
            largest = max(largest, float(d_one.abs().max()))
    assert largest > 1e-4  # the step moved the weights
    # the sharded actor exports whole: the files hold exactly the gathered weights
    exported = load_file(str(tmp_path / "export" / "model.safetensors"))
    assert set(exported) == set(two["actor"])
    assert all(torch.equal(exported[k], two["actor"][k]) for k in exported)


def test_two_rank_sharded_checkpoint_resumes_exactly(tiny_model_dir: Path, tmp_path: Path) -> None:
    torch.save(global_batch(tiny_model_dir), tmp_path / "batch.pt")
    ckpt = tmp_path / "ckpt"
    run_ranks(
        "tests.support.dp_checkpoint_worker",
        [str(tiny_model_dir), str(tmp_path / "batch.pt"), str(ckpt), str(tmp_path)],
    )
    for rank in range(2):
        out = torch.load(tmp_path / f"rank-{rank}.pt", weights_only=False)
        assert out["extra"] == EXTRA and out["counters"] == (1, 1)
        draws_saved, draws_loaded = out["draws"]
        assert draws_saved == draws_loaded  # torch, Python and numpy RNG restored
        saved, resumed = out["metrics"]
        for key in ("actor/loss", "critic/loss", "critic/loss_pass1", "actor/grad_norm"):
            assert abs(saved[key] - resumed[key]) <= 1e-7, (rank, key)
        assert saved["actor/loss"] != 0.0
        for part in ("actor", "critic"):
            a, b = (w[part] for w in out["weights"])
            assert set(a) == set(b)
            assert all(torch.equal(a[k], b[k]) for k in a), (rank, part)
    # every rank wrote its own shards, each about half of the state
    manifest = read_manifest(ckpt)
    assert manifest["world_size"] == 2
    shards = {n: e["bytes"] for n, e in manifest["files"].items() if n.endswith(".distcp")}
    assert set(shards) == {"dcp/__0_0.distcp", "dcp/__1_0.distcp"}
    assert all(size < 0.75 * sum(shards.values()) for size in shards.values()), shards
    assert {"rng-0.pt", "rng-1.pt", "trainer.pt", "dcp/.metadata"} <= set(manifest["files"])
    # one process loads the two-rank checkpoint (DCP reshards): the weights at the save
    one = TorchBackend(TrainerConfig(model=str(tiny_model_dir)))
    assert one.load(ckpt) == EXTRA
    at_save = torch.load(tmp_path / "rank-0.pt", weights_only=False)["at_save"]
    assert all(torch.equal(w, at_save["actor"][k]) for k, w in one.named_weights())
    assert all(torch.equal(w, at_save["critic"][k]) for k, w in one.critic.state_dict().items())
    (ckpt / "dcp" / "__1_0.distcp").unlink()  # a rank's shard lost
    with pytest.raises(CheckpointError, match=r"part dcp/__1_0\.distcp is missing"):
        one.load(ckpt)
