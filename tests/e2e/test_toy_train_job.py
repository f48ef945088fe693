"""``make demo``'s training stage: the toy run submitted as a train job through the job API
(``python -m services.toy_train_job``) with the ``swerl`` CLI, executed by a trainer service
running the real ``python -m trainer train`` against the whole local stack, followed with
``swerl status --watch`` to its end."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
import yaml

from tests.support.paths import REPO_ROOT
from tests.support.training_runs import run_composer

pytestmark = pytest.mark.slow

STEPS = 3


def test_the_demo_run_goes_through_the_job_api_and_the_cli(tmp_path: Path) -> None:
    run_dir = tmp_path / "toy"
    log = tmp_path / "composer.log"
    config = REPO_ROOT / "trainer" / "configs" / "toy_li2sao.yaml"
    args = ["--config", str(config), "--run-dir", str(run_dir), "--steps", str(STEPS)]
    run_composer("services.toy_train_job", args, log, budget_s=420, env=dict(os.environ))
    out = log.read_text()

    job = json.loads((run_dir / "job.json").read_text())  # what `swerl --json status` showed
    assert (job["kind"], job["state"], job["submitted_by"]) == ("train", "succeeded", "demo")
    assert job["progress"]["current_step"] == STEPS
    job_dir = run_dir / "jobs" / job["id"]
    assert (run_dir / "train").resolve() == job_dir.resolve()

    # the trainer service ran the real driver on base + spec: the file's run, 3 steps
    run = yaml.safe_load((job_dir / "run.yaml").read_text())
    assert run["train"]["steps"] == STEPS and run["train"]["run_id"] == job["id"]
    assert run["trainer"]["model"] == job["spec"]["model"]
    rows = [json.loads(line) for line in (job_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    assert all(r["phase"] == "bootstrap" for r in rows)
    # the job's metrics summary is the run's last step, as the trainer wrote it
    assert job["metrics"]["reward/mean"] == pytest.approx(rows[-1]["reward/mean"])
    assert (run_dir / "checkpoints" / f"step-{STEPS}").is_dir()
    assert (run_dir / "weights" / f"v{STEPS}").is_dir()  # published to the engines

    # the user's view: the CLI commands, a progress line per step, the final state
    assert re.search(r"^\$ swerl submit train --model .* --steps 3 ", out, re.M)
    assert f"$ swerl status {job['id']} --watch" in out
    for step in range(1, STEPS + 1):
        assert re.search(rf"\] {step}/{STEPS} (running|succeeded) bootstrap reward \d", out)
    assert "--token" not in out  # the token travels in the environment, never on a line
    assert re.search(r"state\s+succeeded", out)
