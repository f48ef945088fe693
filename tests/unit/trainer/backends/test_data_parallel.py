"""Two gloo ranks with FSDP2 take the same step as one process on the same global batch."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from services.processes import free_port
from tests.support.dp_worker import run
from tests.support.engines import REPO_ROOT
from tests.support.trajectory_records import record, turn
from trainer.backends.torch_backend import TorchBackend
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
    port = str(free_port())
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.support.dp_worker",
                str(rank),
                "2",
                port,
                str(tiny_model_dir),
                str(tmp_path / "batch.pt"),
                str(tmp_path / "dp.pt"),
                str(tmp_path / "export"),
            ],
            cwd=REPO_ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for rank in range(2)
    ]
    outputs = [p.communicate(timeout=300)[0].decode(errors="replace") for p in procs]
    assert all(p.returncode == 0 for p in procs), "\n".join(o[-3000:] for o in outputs)
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
