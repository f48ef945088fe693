"""kill -9 at random points of a trainer that checkpoints after every step: the newest
complete checkpoint always loads, verifies and resumes the loop where it stopped; parameters
saved without optimiser state come back without it."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.support.engines import REPO_ROOT
from tests.unit.trainer.backends.test_torch_backend import constructed_batch
from trainer.backends import StepObjective
from trainer.backends.torch_backend import TorchBackend
from trainer.checkpoint import latest_checkpoint, read_manifest
from trainer.config import TrainerConfig

KEEP = 2


def run_until_killed(model_dir: Path, root: Path, delay: float) -> list[str]:
    """Start the saving loop, let it save once, wait ``delay`` s, SIGKILL it; its output."""
    args = [str(model_dir), str(root), str(KEEP)]
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.support.checkpoint_saver", *args],
        cwd=REPO_ROOT,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: list[str] = []
    try:
        assert child.stdout is not None
        while not lines or not lines[-1].startswith("SAVED"):
            line = child.stdout.readline()
            assert line, "the saving loop died:\n" + "".join(lines)
            lines.append(line)
        time.sleep(delay)
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.kill()
        child.wait(timeout=30)
    assert child.returncode == -signal.SIGKILL, "".join(lines)
    return [line.strip() for line in lines if line.startswith(("RESUMED", "SAVED"))]


@pytest.mark.slow  # starts and kills a training subprocess several times
def test_kill_9_anywhere_in_a_saving_loop_leaves_the_newest_checkpoint_loadable(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    root = tmp_path / "checkpoints"
    delays = random.Random(10)
    loader = TorchBackend(TrainerConfig(model=str(tiny_model_dir), actor={"lr": 1e-3}))
    newest = 0
    for kill in range(4):
        events = run_until_killed(tiny_model_dir, root, delays.uniform(0.0, 1.5))
        if kill:  # the loop resumed from the checkpoint the previous round verified
            assert events[0] == f"RESUMED {newest}", events
        latest = latest_checkpoint(root)
        assert latest is not None
        steps = int(latest.name.removeprefix("step-"))
        read_manifest(latest)  # every file present, every checksum equal
        assert loader.load(latest) == {"cursor": steps}
        assert (loader.steps, loader.version) == (steps, steps)
        assert steps > newest  # the loop made progress and none of it was lost
        newest = steps
        kept = sorted(p.name for p in root.iterdir() if p.name.startswith("step-"))
        assert latest.name in kept and len(kept) <= KEEP + 1  # killed before its pruning
        leftovers = sorted(p.name for p in root.iterdir() if p.name.startswith("."))
        print(f"kill {kill}: newest step-{steps}, kept {kept}, leftovers {leftovers}")


def test_a_parameter_without_optimizer_state_is_restored_without_it(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """A parameter no gradient reached before the save (a MoE expert no token was routed to, a
    pipeline stage's unused value head) has no AdamW state: the checkpoint still loads (a fresh
    optimiser's template has state for every parameter), that parameter comes back without
    state, and the next step equals the saved run's."""
    config = {"actor": {"lr": 1e-3}, "critic": {"optimizer": {"lr": 1e-3}}}
    a = TorchBackend(TrainerConfig(model=str(tiny_model_dir), **config))
    batch = constructed_batch(a)
    a.train_step(batch, StepObjective())
    names = dict(a.actor.named_parameters())
    unreached = "model.layers.0.mlp.up_proj.weight"
    a.actor_optimizer.state.pop(names[unreached])  # as if no gradient had reached it
    a.save(tmp_path / "ckpt")
    want = a.train_step(batch, StepObjective())
    b = TorchBackend(TrainerConfig(model=str(tiny_model_dir), **config))
    b.load(tmp_path / "ckpt")
    stateful = {n for n, p in b.actor.named_parameters() if p in b.actor_optimizer.state}
    assert unreached not in stateful and len(stateful) == len(names) - 1
    assert b.train_step(batch, StepObjective()) == want
    assert all(torch.equal(p, names[n]) for n, p in b.actor.named_parameters())
