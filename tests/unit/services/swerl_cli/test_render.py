"""The CLI's views: progress bar, table, detail, a trajectory's progress line."""

from __future__ import annotations

import time

from services.swerl_cli.render import (
    BAR_WIDTH,
    detail,
    duration,
    progress_bar,
    progress_line,
    table,
    trajectory_line,
)


def job(**over: object) -> dict:
    base = {
        "id": "rollout-1",
        "kind": "rollout",
        "state": "running",
        "spec": {"steps": 10},
        "submitted_by": "alice",
        "created_at": time.time() - 125,
        "attempt": 1,
        "progress": {"done": 3, "total": 4, "phase": "rollout"},
        "metrics": {},
        "message": "",
    }
    return {**base, **over}  # fmt: skip


def test_progress_bar_fills_by_fraction() -> None:
    bar = progress_bar(job())
    filled = round(0.75 * BAR_WIDTH)
    assert bar == f"[{'#' * filled}{'-' * (BAR_WIDTH - filled)}] 3/4 running rollout"


def test_train_progress_counts_steps() -> None:
    train = job(kind="train", progress={"current_step": 5, "phase": "critic"})
    assert progress_bar(train).endswith("5/10 running critic")


def test_progress_shows_the_mean_reward_when_the_job_reports_one() -> None:
    train = job(kind="train", progress={"current_step": 5, "phase": "bootstrap"},
                metrics={"reward/mean": 0.4375, "version": 5.0})  # fmt: skip
    assert progress_bar(train).endswith("5/10 running bootstrap reward 0.438")
    assert "reward" not in progress_bar(job(metrics={"reward/mean": "n/a"}))


def test_table_and_detail() -> None:
    text = table([job(), job(id="train-2", kind="train", progress={})])
    lines = text.splitlines()
    assert lines[0].split() == ["JOB", "KIND", "STATE", "PROGRESS", "BY", "SUBMITTED"]
    assert lines[1].split()[:5] == ["rollout-1", "rollout", "running", "3/4", "alice"]
    assert "2m ago" in lines[1] and lines[2].split()[3] == "-"
    assert table([]) == "no jobs"
    shown = detail(job(metrics={"mean_reward": 0.5}, message="claimed by r"))
    assert "metrics    mean_reward=0.5" in shown and "message    claimed by r" in shown


def test_trajectory_counts_are_shown_for_rollout_jobs_only() -> None:
    counts = {"total": 5, "graded": 3, "resolved": 2, "aborted": 2}
    line = trajectory_line(job(trajectories=counts))
    assert "5 total" in line and "3 graded (2 resolved)" in line and "2 failed" in line
    assert "3 graded (2 resolved)" in detail(job(trajectories=counts))
    assert trajectory_line(job()) == ""


def progress_event(**over: object) -> dict:
    base = {
        "trajectory_id": "rollout-1:0:1.a1",
        "instance_id": "swerl__spanlib-1",
        "sample_index": 1,
        "attempt": 1,
        "phase": "agent",
        "turn": 12,
        "tokens": 34567,
        "elapsed_s": 450.0,
        "current_tool": "terminal",
        "status": None,
        "ts": 1.0,
    }
    return {**base, **over}  # fmt: skip


def test_a_progress_line_names_the_sample_turn_tokens_elapsed_and_tool() -> None:
    line = progress_line(progress_event())
    assert line.startswith("swerl__spanlib-1 #1 ")
    for part in ("agent", "turn 12", "34,567 tokens", "7m30s", "running terminal"):
        assert part in line
    assert "attempt" not in line


def test_a_progress_line_says_how_a_trajectory_ended_and_which_attempt() -> None:
    line = progress_line(progress_event(phase="done", status="completed", attempt=2))
    assert "(attempt 2)" in line and line.endswith("completed") and "running" not in line
    assert "running" not in progress_line(progress_event(current_tool=None))


def test_durations_read_as_hours_minutes_seconds() -> None:
    assert [duration(s) for s in (0, 45, 60, 450, 3600, 3725)] == [
        "0s", "45s", "1m00s", "7m30s", "1h00m", "1h02m"]  # fmt: skip
