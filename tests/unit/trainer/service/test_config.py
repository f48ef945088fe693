"""The trainer service's settings: a node's place in a multi-node group is checked at start-up,
from the file, the environment (compose's SWERL_TRAINER_SERVICE__NODE_RANK) and the flags."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from trainer.service.cli import main
from trainer.service.config import TrainerServiceConfig


def test_a_node_rank_must_lie_inside_the_group() -> None:
    assert TrainerServiceConfig().nnodes == 1 and TrainerServiceConfig().node_rank == 0
    assert TrainerServiceConfig(nnodes=4, node_rank=3).node_rank == 3
    with pytest.raises(ValidationError, match="node_rank 4 must be < nnodes 4"):
        TrainerServiceConfig(nnodes=4, node_rank=4)
    with pytest.raises(ValidationError, match="node_rank 1 must be < nnodes 1"):
        TrainerServiceConfig(node_rank=1)  # a follower of a one-node group
    for bad in ({"nnodes": 0}, {"node_rank": -1}):
        with pytest.raises(ValidationError):
            TrainerServiceConfig(**bad)


def test_serve_exits_2_on_a_rank_outside_the_group(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SWERL_TRAINER_SERVICE__NNODES", "2")
    assert main(["--node-rank", "2", "--redis", "redis://127.0.0.1:1/0"]) == 2
    assert "node_rank 2 must be < nnodes 2" in capsys.readouterr().err
    out = main(["--node-rank", "1", "--print-config"])
    printed = capsys.readouterr().out
    assert out == 0 and "nnodes: 2" in printed and "node_rank: 1" in printed
