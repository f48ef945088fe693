"""What the trainer service reads of a running job: the last complete metrics line, and the
progress and metrics summary made of it."""

from __future__ import annotations

import json
from pathlib import Path

from services.api.schemas import Progress
from trainer.service.service import last_metrics, progress_of


def test_the_last_complete_line_counts(tmp_path: Path) -> None:
    assert last_metrics(tmp_path) is None  # no metrics.jsonl yet
    rows = [{"step": 1, "phase": "bootstrap"}, {"step": 2, "phase": "single"}]
    text = "".join(json.dumps(r) + "\n" for r in rows) + '{"step": 3, "pha'  # torn by a kill
    (tmp_path / "metrics.jsonl").write_text(text)
    assert last_metrics(tmp_path) == rows[1]


def test_progress_and_the_reward_summary() -> None:
    assert progress_of(None, 9) == (Progress(done=0, total=9, phase="starting"), {})
    row = {"step": 4, "phase": "draining", "reward/mean": 0.25, "reward/mean_single": 0.5,
           "version": 4, "actor/loss": 1.5, "ok": True}  # fmt: skip
    progress, metrics = progress_of(row, 9)
    assert progress == Progress(done=4, total=9, current_step=4, phase="draining")
    assert metrics == {"reward/mean": 0.25, "reward/mean_single": 0.5, "version": 4.0}
