"""The CLI's views: progress bar, table, detail."""

from __future__ import annotations

import time

from services.swerl_cli.render import BAR_WIDTH, detail, progress_bar, table, trajectory_line


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
