"""A trainer that saves a checkpoint after every step, forever: ``python -m
tests.support.checkpoint_saver MODEL_DIR ROOT KEEP`` (the kill -9 test shoots it).

It resumes from the newest complete checkpoint under ROOT when there is one (printing
``RESUMED <steps>``), then loops: one train step, ``save_and_prune`` into ``ROOT/step-<steps>``
with the data cursor ``{"cursor": steps}`` as extra state, print ``SAVED <steps>``.
"""

from __future__ import annotations

import sys
from dataclasses import replace

from tests.support.trajectory_records import record, turn
from trainer.backends import StepObjective
from trainer.backends.torch_backend import TorchBackend
from trainer.checkpoint import latest_checkpoint, save_and_prune
from trainer.config import TrainerConfig
from trainer.data import build_batch


def main() -> int:
    model_dir, root, keep = sys.argv[1], sys.argv[2], int(sys.argv[3])
    backend = TorchBackend(TrainerConfig(model=model_dir, actor={"lr": 1e-3}))
    latest = latest_checkpoint(root)
    if latest is not None:
        extra = backend.load(latest)
        assert extra == {"cursor": backend.steps}, (extra, backend.steps)
        print(f"RESUMED {backend.steps}", flush=True)
    records = [
        record(f"t{i}", [([3, 4], [turn([], [30 + i, 31], 0)])], reward=float(i), group="g")
        for i in range(2)
    ]
    batch, _ = build_batch(records, trainer_version=0)
    batch = replace(batch, behavior_logp=backend.logprobs_and_values(batch).logprobs)
    while True:
        backend.train_step(batch, StepObjective())
        save_and_prune(backend, root, keep, extra={"cursor": backend.steps})
        print(f"SAVED {backend.steps}", flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
