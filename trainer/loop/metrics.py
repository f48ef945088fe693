"""Per-step metrics: one JSON line per step (``metrics.jsonl``), the trained trajectory ids
(``batches.jsonl``), and TensorBoard scalars (``tensorboard/``).

A resumed run first truncates both files to the checkpoint's step (the steps after it are
redone, so no step appears twice) and opens TensorBoard with ``purge_step`` for the same reason.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

METRICS_FILE = "metrics.jsonl"
BATCHES_FILE = "batches.jsonl"
TENSORBOARD_DIR = "tensorboard"


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The complete lines of a JSONL file (a torn last line of a killed run is skipped)."""
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:
            continue
    return rows


def truncate_steps(path: Path, last_step: int) -> int:
    """Keep the lines with ``step <= last_step``; returns how many were removed."""
    rows = read_jsonl(path)
    kept = [r for r in rows if int(r.get("step", 0)) <= last_step]
    if path.exists():
        path.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in kept))
    return len(rows) - len(kept)


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


class MetricsLog:
    """Writes the run's per-step files (see the module docstring)."""

    def __init__(self, run_dir: str | Path, *, tensorboard: bool, resume_step: int | None) -> None:
        self.dir = Path(run_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.metrics_path = self.dir / METRICS_FILE
        self.batches_path = self.dir / BATCHES_FILE
        last = resume_step if resume_step is not None else 0
        self.truncated = truncate_steps(self.metrics_path, last)
        truncate_steps(self.batches_path, last)
        self.writer = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(str(self.dir / TENSORBOARD_DIR), purge_step=last + 1)

    def log(self, step: int, metrics: dict[str, Any], batch: dict[str, Any]) -> None:
        # NaN / inf (a metric undefined on this batch) are null: strict JSON readers parse it
        clean = {
            k: None if isinstance(v, float) and not _finite(v) else v for k, v in metrics.items()
        }
        row = {"step": step, **clean}
        with self.metrics_path.open("a") as f:
            f.write(json.dumps(row, sort_keys=True) + "\n")
        with self.batches_path.open("a") as f:
            f.write(json.dumps({"step": step, **batch}, sort_keys=True) + "\n")
        if self.writer is not None:
            for key, value in metrics.items():
                if _finite(value):
                    self.writer.add_scalar(key, float(value), step)
            self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
