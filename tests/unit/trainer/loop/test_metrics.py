"""Per-step files: JSONL lines, TensorBoard scalars, truncation when a run resumes."""

from __future__ import annotations

import json
from pathlib import Path

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from trainer.loop.metrics import MetricsLog, read_jsonl


def scalars(run: Path, tag: str) -> list[tuple[int, float]]:
    acc = EventAccumulator(str(run / "tensorboard"))
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars(tag)]


def test_resume_truncates_to_the_checkpoint_step(tmp_path: Path) -> None:
    log = MetricsLog(tmp_path, tensorboard=True, resume_step=None)
    for step in (1, 2, 3, 4):
        log.log(
            step, {"phase": "bootstrap", "reward/mean": step / 10}, {"trajectory_ids": [f"t{step}"]}
        )
    log.close()
    with (tmp_path / "metrics.jsonl").open("a") as f:
        f.write('{"step": 5, "reward/me')  # a line torn by a kill
    again = MetricsLog(tmp_path, tensorboard=True, resume_step=2)
    assert again.truncated == 2  # steps 3 and 4 (the torn line is not a step)
    again.log(3, {"phase": "single", "reward/mean": 0.9}, {"trajectory_ids": ["t3b"]})
    again.close()
    rows = read_jsonl(tmp_path / "metrics.jsonl")
    assert [(r["step"], r["reward/mean"]) for r in rows] == [(1, 0.1), (2, 0.2), (3, 0.9)]
    assert [b["trajectory_ids"] for b in read_jsonl(tmp_path / "batches.jsonl")] == [
        ["t1"],
        ["t2"],
        ["t3b"],
    ]
    # TensorBoard purges the redone steps: step 3 once, with the resumed value
    got = scalars(tmp_path, "reward/mean")
    assert [s for s, _ in got] == [1, 2, 3] and abs(got[-1][1] - 0.9) < 1e-6


def test_text_and_non_finite_values_stay_out_of_tensorboard(tmp_path: Path) -> None:
    log = MetricsLog(tmp_path, tensorboard=True, resume_step=None)
    log.log(1, {"phase": "single", "critic/explained_variance": float("nan"), "x": 1.0}, {})
    log.close()
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    assert acc.Tags()["scalars"] == ["x"]
    row = json.loads((tmp_path / "metrics.jsonl").read_text())
    assert row["phase"] == "single" and row["critic/explained_variance"] is None
