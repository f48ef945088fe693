"""Find and read a run's ``metrics.jsonl`` strictly: every problem names the file and line."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from trainer.loop.metrics import METRICS_FILE


class ReportError(ValueError):
    """The run directory or its metrics cannot be reported (the message says where and why)."""


def find_metrics(run_dir: str | Path) -> Path:
    """``RUN_DIR/metrics.jsonl`` (the driver's ``train.run_dir``) or ``RUN_DIR/train/metrics.jsonl``
    (a ``services.toy_train`` / ``make demo`` run directory)."""
    root = Path(run_dir)
    if not root.is_dir():
        raise ReportError(f"{root}: no such run directory")
    for path in (root / METRICS_FILE, root / "train" / METRICS_FILE):
        if path.is_file():
            return path
    raise ReportError(
        f"{root}: no {METRICS_FILE} (looked for {root / METRICS_FILE} and "
        f"{root / 'train' / METRICS_FILE})"
    )


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def parse_rows(text: str, path: Path) -> tuple[list[dict[str, Any]], bool]:
    """The rows of a metrics file, and whether a torn last line was skipped.

    Each line must be a JSON object with an integer ``step`` > 0, steps strictly increasing.
    The one tolerated defect is a last line without its newline that does not parse: the run
    is still writing it (the driver appends one line per step)."""
    lines = text.split("\n")
    torn = False
    if lines and lines[-1] == "":
        lines.pop()
    elif lines:  # no trailing newline: the last line may be half-written
        try:
            json.loads(lines[-1])
        except ValueError:
            lines.pop()
            torn = True
    rows: list[dict[str, Any]] = []
    for number, line in enumerate(lines, start=1):
        where = f"{path}:{number}"
        if not line.strip():
            raise ReportError(f"{where}: empty line")
        try:
            row = json.loads(line)
        except ValueError as exc:
            raise ReportError(f"{where}: not valid JSON ({exc})") from None
        if not isinstance(row, dict):
            raise ReportError(f"{where}: a metrics line must be a JSON object, got {line[:60]!r}")
        step = row.get("step")
        if not isinstance(step, int) or isinstance(step, bool) or step < 1:
            raise ReportError(f"{where}: 'step' must be an integer >= 1, got {step!r}")
        if rows and step <= rows[-1]["step"]:
            raise ReportError(f"{where}: step {step} does not follow step {rows[-1]['step']}")
        for key, value in row.items():
            if not (value is None or isinstance(value, str) or _number(value)):
                raise ReportError(f"{where}: {key!r} must be a number or null, got {value!r}")
        reward = row.get("reward/mean")
        if not _number(reward) or not math.isfinite(reward):
            raise ReportError(f"{where}: 'reward/mean' must be a finite number, got {reward!r}")
        rows.append(row)
    if not rows:
        raise ReportError(f"{path}: no complete metrics line (the run has not finished a step)")
    return rows, torn


def load_rows(path: Path) -> tuple[list[dict[str, Any]], bool]:
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ReportError(f"{path}: cannot read ({exc})") from None
    return parse_rows(text, path)
