"""``python -m trainer report``: summary numbers on a hand-written run with a switch, the PNG,
and bad input (exit 2 with the file and line, never a traceback)."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from trainer.report.cli import main
from trainer.report.load import ReportError, find_metrics, parse_rows
from trainer.report.summary import rolling_mean, summarize

# 8 steps: bootstrap 1-3, the gate switches after step 3, draining 4, single 5-8.
REWARDS = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8]
LAG_MEAN = [0.0, 1.0, 2.0, 1.0, 1.0, 0.0, 0.0, 0.0]
LAG_MAX = [0.0, 1.0, 3.0, 1.0, 2.0, 0.0, 0.0, 0.0]
STEP_TIME = [2.0, 2.0, 2.0, 4.0, 2.0, 2.0, 2.0, 2.0]
PHASES = ["bootstrap"] * 3 + ["draining"] + ["single"] * 4


def rows_with_switch() -> list[dict]:
    rows = []
    for i in range(8):
        step = i + 1
        row = {
            "step": step,
            "phase": PHASES[i],
            "reward/mean": REWARDS[i],
            "lag/mean": LAG_MEAN[i],
            "lag/max": LAG_MAX[i],
            "lag/off_policy_token_ratio": 0.5 if LAG_MAX[i] > 1 else 0.0,
            "time/step": STEP_TIME[i],
            "time/wait_rollouts": STEP_TIME[i] - 1.5,
            "time/build": 0.1,
            "time/train": 1.3,
            "time/publish": 0.1,
            "mismatch/mean_abs_logprob_diff": 0.01 if LAG_MAX[i] == 0 else None,
            "gate/switched": float(step >= 3),
        }
        if step <= 3:
            row["readiness/explained_variance"] = 0.2 * step
            row["readiness/ranking_accuracy"] = 0.6 + 0.1 * step
        if step >= 3:
            row["gate/switch_step"] = 3.0
        rows.append(row)
    return rows


def write_run(tmp_path: Path, rows: list[dict], sub: str = "") -> Path:
    run = tmp_path / "run"
    (run / sub).mkdir(parents=True, exist_ok=True)
    text = "".join(json.dumps(r) + "\n" for r in rows)
    (run / sub / "metrics.jsonl").write_text(text)
    return run


def test_summary_numbers_of_a_run_with_a_switch() -> None:
    s = summarize(rows_with_switch())
    assert s.steps == 8 and (s.first_step, s.last_step) == (1, 8)
    assert s.reward_first == pytest.approx(0.3)  # (0.1 + ... + 0.5) / 5
    assert s.reward_last == pytest.approx(0.6)  # (0.4 + ... + 0.8) / 5
    assert s.switch_step == 3
    assert s.lag_before.steps == 3 and s.lag_before.mean == pytest.approx(1.0)
    assert s.lag_before.max == 3.0
    assert s.lag_after is not None and s.lag_after.steps == 5
    assert s.lag_after.mean == pytest.approx(0.4) and s.lag_after.max == 2.0
    assert s.step_time_mean == pytest.approx(2.25)  # (7 * 2 + 4) / 8
    assert s.time_parts["wait_rollouts"] == pytest.approx(0.75)
    assert s.phases == {"bootstrap": 3, "draining": 1, "single": 4}


def test_summary_without_a_switch_covers_the_whole_run() -> None:
    rows = [
        {"step": n, "phase": "groups", "reward/mean": 0.5, "lag/mean": float(n % 2)}
        for n in range(1, 5)
    ]
    s = summarize(rows, edge=2)
    assert s.switch_step is None and s.lag_after is None
    assert s.lag_before.steps == 4 and s.lag_before.mean == pytest.approx(0.5)
    assert s.step_time_mean is None and s.time_parts == {}


def test_rolling_mean_is_trailing() -> None:
    assert rolling_mean([1.0, 3.0, 5.0, 7.0], 2) == [1.0, 2.0, 4.0, 6.0]
    with pytest.raises(ValueError):
        rolling_mean([1.0], 0)


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG signature"
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_report_writes_png_and_summary(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    run = write_run(tmp_path, rows_with_switch())
    assert main([str(run)]) == 0
    out = capsys.readouterr().out
    png = run / "report.png"
    width, height = png_size(png)
    assert (width, height) == (1040, 880)  # 13 x 11 inches at 80 dpi
    assert 20_000 < png.stat().st_size < 2_000_000
    text = (run / "report.txt").read_text()
    assert text in out
    assert "steps: 8" in text
    assert "reward: first 5 steps 0.300, last 5 steps 0.600" in text
    assert "switch: after step 3" in text
    assert "before the switch (steps <= 3): mean 1.00, max 3 (3 steps)" in text
    assert "after the switch (steps > 3): mean 0.40, max 2 (5 steps)" in text
    assert "step time: mean 2.250 s" in text
    assert text.rstrip().endswith("26.7 steps/minute")  # 60 / 2.25


def test_report_of_a_toy_run_dir_and_output_option(tmp_path: Path) -> None:
    rows = [{"step": n, "phase": "groups", "reward/mean": 0.25} for n in range(1, 4)]
    run = write_run(tmp_path, rows, sub="train")  # services.toy_train's layout
    assert find_metrics(run) == run / "train" / "metrics.jsonl"
    out = tmp_path / "elsewhere" / "dash.png"
    assert main([str(run), "--output", str(out)]) == 0
    png_size(out)
    assert "switch: no switch" in (run / "report.txt").read_text()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", "no complete metrics line"),
        ('{"step": 1, "reward/mean": 0.1}\n{"step": 2, "rew\n', "metrics.jsonl:2: not valid JSON"),
        ('{"step": 1, "reward/mean": 0.1}\n\n{"step": 3, "reward/mean": 0.1}\n', ":2: empty line"),
        ('[1, 2]\n', ":1: a metrics line must be a JSON object"),
        ('{"reward/mean": 0.1}\n', ":1: 'step' must be an integer >= 1"),
        ('{"step": 2, "reward/mean": 0.1}\n{"step": 2, "reward/mean": 0.1}\n',
         ":2: step 2 does not follow"),
        ('{"step": 1, "reward/mean": null}\n', ":1: 'reward/mean' must be a finite number"),
        ('{"step": 1, "reward/mean": 0.1, "lag/mean": [1]}\n', ":1: 'lag/mean' must be a number"),
    ],
)  # fmt: skip
def test_bad_metrics_exit_2_naming_file_and_line(
    tmp_path: Path, capsys: pytest.CaptureFixture, text: str, expected: str
) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text(text)
    assert main([str(run)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {run / 'metrics.jsonl'}")
    assert expected in err
    assert not (run / "report.png").exists()


def test_a_half_written_last_line_is_skipped(tmp_path: Path) -> None:
    text = '{"step": 1, "reward/mean": 0.5}\n{"step": 2, "reward/m'
    rows, torn = parse_rows(text, Path("m.jsonl"))
    assert torn and [r["step"] for r in rows] == [1]
    rows, torn = parse_rows('{"step": 1, "reward/mean": 0.5}', Path("m.jsonl"))
    assert not torn and len(rows) == 1  # complete, only the newline is missing
    with pytest.raises(ReportError, match=r"m\.jsonl: no complete metrics line"):
        parse_rows('{"step": 1', Path("m.jsonl"))


def test_missing_run_dir_and_missing_metrics(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main([str(tmp_path / "nope")]) == 2
    assert f"{tmp_path / 'nope'}: no such run directory" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main([str(tmp_path / "empty")]) == 2
    assert "no metrics.jsonl" in capsys.readouterr().err


def test_command_line_help_and_errors_without_traceback(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "trainer", "report"]
    shown = subprocess.run([*cmd, "--help"], capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0
    assert "RUN_DIR/report.txt" in shown.stdout and "exit status" in shown.stdout
    bad = subprocess.run([*cmd, str(tmp_path / "nope")], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "no such run directory" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_the_held_out_evaluations_are_in_the_summary_and_the_dashboard(tmp_path: Path) -> None:
    run = write_run(tmp_path, rows_with_switch(), sub="train")
    evals = [
        {"step": 4, "eval/reward_mean": 0.25, "eval/pass_at_n": 0.5},
        {"step": 8, "eval/reward_mean": None, "eval/pass_at_n": None},  # all aborted: no score
    ]
    (run / "train" / "eval.jsonl").write_text("".join(json.dumps(e) + "\n" for e in evals))
    assert main([str(run)]) == 0
    text = (run / "report.txt").read_text()
    assert (
        "held-out eval (reward mean): step 4 0.250 (pass@n 0.500), step 8 n/a (pass@n n/a)" in text
    )
    without = write_run(tmp_path / "other", rows_with_switch())
    assert main([str(without)]) == 0
    assert "held-out" not in (without / "report.txt").read_text()
    assert summarize(rows_with_switch(), 5, evals).evals == [
        (4, 0.25, 0.5, None, None),
        (8, None, None, None, None),
    ]
