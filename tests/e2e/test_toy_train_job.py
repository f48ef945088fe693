"""``make demo``'s training stage: the toy run submitted as a train job through the job API
(``python -m services.toy_train_job``) with the ``swerl`` CLI, executed by a trainer service
running the real ``python -m trainer train`` against the whole local stack, followed with
``swerl status --watch`` to its end."""

from __future__ import annotations

import json
import os
import re
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from services.swerl_cli.client import ApiClient
from services.toy_train_job import start_job_services, start_trainer_service
from tests.support.paths import REPO_ROOT
from tests.support.toy_jobs import toy_job_stack
from tests.support.training_runs import run_composer
from trainer.checkpoint import latest_checkpoint

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


def wait_for(check: Callable[[], object], budget_s: float, what: str, log_dir: Path) -> object:
    deadline = time.monotonic() + budget_s
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.5)
    logs = {p.name: p.read_text()[-1500:] for p in log_dir.rglob("*.log")}
    pytest.fail(f"no {what} within {budget_s:.0f} s: {logs}")


def test_a_sigkilled_trainer_services_job_resumes_from_its_checkpoint_on_the_next_one(
    tmp_path: Path,
) -> None:
    """The real driver under the trainer service: SIGKILL the service once the run has a
    checkpoint after step 2; its training process dies with it (PR_SET_PDEATHSIG), the lease
    runs out, a second trainer service claims the job (attempt 2) and runs it with --resume
    from the checkpoint to the end."""
    with toy_job_stack(tmp_path, 5, {"checkpoint_every": 2}) as toy:
        stack, run_dir, checkpoints = toy.stack, toy.run_dir, toy.checkpoints
        url = start_job_services(stack, run_dir, toy.base, toy.redis_url, toy.env, toy.token)
        api = ApiClient(url, toy.token)
        job_id = api.submit("train", toy.spec, None)["id"]
        wait_for(lambda: latest_checkpoint(checkpoints), 300, "checkpoint", run_dir)
        first = stack.procs["trainer-service"]
        os.kill(first.pid, signal.SIGKILL)
        first.popen.wait(timeout=30)
        start_trainer_service(stack, "trainer-service-2", run_dir, toy.redis_url, toy.env)

        def ended() -> dict | None:
            job = api.job(job_id)
            return job if job["state"] in ("succeeded", "failed", "cancelled") else None

        job = wait_for(ended, 400, "end of the job", run_dir)
        api.close()
    assert isinstance(job, dict)
    assert job["state"] == "succeeded", job
    assert job["attempt"] == 2 and job["progress"]["current_step"] == 5
    job_dir = run_dir / "jobs" / job_id
    resumed = (job_dir / "attempt-2.log").read_text()
    assert re.search(r"resumed from \S+step-(2|4): step (2|4)", resumed), resumed[-3000:]
    rows = [json.loads(line) for line in (job_dir / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["step"] == 5 and {r["step"] for r in rows} == set(range(1, 6))
    assert (checkpoints / "step-5").is_dir() or (checkpoints / "step-4").is_dir()
