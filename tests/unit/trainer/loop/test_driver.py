"""The driver refuses a backend that cannot checkpoint before its first step, not at its
first checkpoint (the hook any backend with an uncheckpointable layout answers)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from trainer.checkpoint import CheckpointError
from trainer.config import TrainerConfig
from trainer.loop.config import TrainConfig
from trainer.loop.driver import LoopParts, TrainLoop


class NoCheckpoints:
    version = 0

    def checkpoint_problem(self) -> str:
        return "checkpoints of this layout are not built yet"

    def __getattr__(self, name: str) -> Any:  # nothing else may be touched before the refusal
        raise AssertionError(f"the driver used backend.{name} before refusing")


def test_a_backend_that_cannot_checkpoint_is_refused_before_the_first_step(
    tmp_path: Path,
) -> None:
    train = TrainConfig(run_dir=str(tmp_path / "run"), steps=3, publish=False,
                        dataset={"instance_ids": ["a", "b"]})  # fmt: skip
    parts = LoopParts(NoCheckpoints(), manager=None, store=None)  # type: ignore[arg-type]
    with pytest.raises(CheckpointError, match="this run cannot checkpoint: checkpoints of this"):
        TrainLoop(train, TrainerConfig(model="unused"), parts, resume=False)
    assert not (tmp_path / "run").exists()  # nothing written
