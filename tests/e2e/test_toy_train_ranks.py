"""``python -m trainer train`` under torchrun with two CPU ranks (``services.toy_train --nproc
2``): rank 0 drives the one loop -- one metrics row per step, one publish per version -- rank 1
follows its backend calls (FSDP2 over gloo), the checkpoint holds both ranks' shards, and it
restores in one process to exactly the weights rank 0 published."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from services.toy_train import toy_model_dir
from tests.support.paths import REPO_ROOT
from tests.support.training_runs import run_composer
from trainer.backends.torch_backend import TorchBackend
from trainer.checkpoint import read_manifest
from trainer.config import TrainerConfig

pytestmark = pytest.mark.slow

STEPS = 2


def test_two_ranks_train_as_one_driver_and_write_one_sharded_checkpoint(tmp_path: Path) -> None:
    run_dir = tmp_path / "toy"
    config = REPO_ROOT / "trainer" / "configs" / "toy_li2sao.yaml"
    args = ["--config", str(config), "--run-dir", str(run_dir), "--steps", str(STEPS)]
    run_composer("services.toy_train", [*args, "--nproc", "2"], tmp_path / "composer.log",
                 budget_s=420, env=dict(os.environ))  # fmt: skip
    log = (run_dir / "trainer.log").read_text()

    # one driver: each step once, one batch of rollouts per step
    rows = [json.loads(line) for line in (run_dir / "train" / "metrics.jsonl").open()]
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    assert [r["version"] for r in rows] == list(range(1, STEPS + 1))
    assert len(re.findall(r"rank 0 of 2: driving", log)) == 1
    assert len(re.findall(r"rank 1 of 2: following rank 0", log)) == 1
    # rank 1 made every backend call of the run: a train step, an export and the publish's
    # logprob probe (a forward) per step, the final checkpoint; then it was released
    calls = re.findall(r"rank 1: stop after (\d+) calls", log)
    assert calls == [str(3 * STEPS + 1)], log[-3000:]

    # the checkpoint of the final step: both ranks wrote their shards and RNG states
    ckpt = run_dir / "train" / "checkpoints" / f"step-{STEPS}"
    files = set(read_manifest(ckpt)["files"])
    assert {"rng-0.pt", "rng-1.pt"} <= files
    assert sum(name.endswith(".distcp") for name in files) == 2

    # restored in one process, the sharded actor is exactly what rank 0 published last
    backend = TorchBackend(TrainerConfig(model=str(toy_model_dir())))
    initial = {k: v.clone() for k, v in backend.named_weights()}  # views of the parameters
    backend.load(ckpt)
    assert backend.version == STEPS
    restored = dict(backend.named_weights())
    published = load_file(str(run_dir / "weights" / f"v{STEPS}" / "model.safetensors"))
    assert set(published) == set(restored)
    assert all(torch.equal(published[k], restored[k]) for k in published)
    assert any(not torch.equal(initial[k], restored[k]) for k in restored)  # it trained
