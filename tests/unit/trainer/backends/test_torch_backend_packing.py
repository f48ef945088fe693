"""Sequence packing in the torch backend: rows packed into lanes (position ids restarting per
row, block-diagonal causal attention) give the padded layout's logprobs, values and update."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.support.trajectory_records import record, turn
from trainer.backends import StepObjective, create_backend
from trainer.backends.torch_backend import TorchBackend
from trainer.config import TrainerConfig
from trainer.data import TrainBatch, build_batch

pytestmark = pytest.mark.slow  # two backends per model, forwards and a step each


def backend(model_dir: Path, lane_factor: float, **overrides) -> TorchBackend:
    config = TrainerConfig(model=str(model_dir), batch={"lane_factor": lane_factor}, **overrides)
    b = create_backend(config)
    assert isinstance(b, TorchBackend)
    return b


def uneven_batch() -> TrainBatch:
    """Two groups whose rows differ a lot in length (multi-turn and two-segment rows)."""
    records = []
    for i, (outs, group) in enumerate(
        [((9, 2), "a"), ((1,), "a"), ((3, 1), "a"), ((12,), "b"), ((2,), "b"), ((4, 4), "b")]
    ):
        turns = [turn([5, 6] if k else [], list(range(100 + i, 100 + i + n)), 0)
                 for k, n in enumerate(outs)]  # fmt: skip
        segments = [([3, 4, 5 + i], turns)]
        if i == 2:
            segments.append(([3, 4, 8, 9, 10], [turn([], [60, 61, 62], 0)]))
        records.append(record(f"r{i}", segments, reward=float(i % 2), group=group))
    return build_batch(records, trainer_version=0)[0]


@pytest.mark.parametrize("model", ["dense", "moe"])
def test_packed_forward_equals_the_padded_layout(
    model: str, tiny_model_dir: Path, tiny_moe_dir: Path
) -> None:
    model_dir = tiny_moe_dir if model == "moe" else tiny_model_dir
    batch = uneven_batch()
    packed, padded = backend(model_dir, 2.0), backend(model_dir, 0.0)
    lanes = [lane for m in packed._plan(batch) for lane in m.lanes]
    assert any(len(lane) > 1 for lane in lanes)  # rows really share a lane
    assert all(len(lane) == 1 for m in padded._plan(batch) for lane in m.lanes)
    a, b = packed.logprobs_and_values(batch), padded.logprobs_and_values(batch)
    mask = batch.action_mask
    assert a.values is not None and b.values is not None
    assert float((a.logprobs - b.logprobs)[mask].abs().max()) < 1e-5
    assert float((a.values - b.values)[mask].abs().max()) < 1e-5
    assert float((a.entropy - b.entropy)[mask].abs().max()) < 1e-5
    assert float(a.logprobs[mask].abs().min()) > 0  # real logprobs, not masked zeros


def test_a_packed_step_equals_a_padded_step(tiny_model_dir: Path) -> None:
    # Adam's eps = 1 makes the first update ~ lr * grad: the deltas compare the gradients
    sgd_like = {"lr": 1.0, "eps": 1.0, "grad_clip": 0.0}
    cfg = {"actor": sgd_like, "critic": {"optimizer": sgd_like, "updates_per_step": 1}}
    packed, padded = backend(tiny_model_dir, 2.0, **cfg), backend(tiny_model_dir, 0.0, **cfg)
    start = {n: p.detach().clone() for n, p in packed.actor.named_parameters()}
    batch = uneven_batch()
    m_packed = packed.train_step(batch, StepObjective(algorithm="grpo"))
    m_padded = padded.train_step(batch, StepObjective(algorithm="grpo"))
    assert m_packed["data/padding_fraction"] < m_padded["data/padding_fraction"]
    largest = 0.0
    for (name, p), q in zip(packed.actor.named_parameters(), padded.actor.parameters(),
                            strict=True):  # fmt: skip
        d_packed, d_padded = p.detach() - start[name], q.detach() - start[name]
        assert torch.allclose(d_packed, d_padded, atol=1e-6, rtol=1e-3), name
        largest = max(largest, float(d_packed.abs().max()))
    assert largest > 1e-4  # the step moved the weights
