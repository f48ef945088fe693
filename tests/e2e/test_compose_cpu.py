"""End to end: compose.yaml's ``cpu`` profile comes up under the private dockerd and serves a
rollout job submitted through the HTTP API with the ``swerl`` CLI; ``down -v`` leaves nothing.

Every service runs from the one image ``deploy/cpu_image.py`` makes from the set-up environment
(docker import, cached by content hash; no registry). The sandbox worker runs in a container
and starts the sandboxes on the host's engine through the mounted socket. The engine is the
reference engine in **SCRIPTED mode** (test machinery: it replays the mini instance's gold
solution), so the trajectory earns reward 1 only if every hop works: API -> job runner ->
manager -> worker -> sandbox with the OpenHands agent server -> relay -> adapter -> engine ->
patch -> grading in a fresh sandbox -> result back to the API. Run once per suite (CI budget).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.compose_project import ComposeProject
from tests.support.deploy_scripts import load
from tests.support.docker import build_task_images, ensure_dockerd
from tests.support.paths import REPO_ROOT

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.timeout(1800)]

cpu_image = load("cpu_image")
SERVICES = {"redis", "api", "manager", "adapter", "reference-engine", "sandbox-worker", "evaluator"}
INSTANCE = "swerl__spanlib-1"
HEALTHY_TIMEOUT_S = 600.0
EVAL_JOBS: list[str] = []  # eval jobs that succeeded: their reports must outlive down -v
JOB_TIMEOUT_S = 900.0


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ComposeProject]:
    ensure_dockerd()
    build_task_images()  # cached
    inputs = cpu_image.Inputs.from_environment()
    tag = cpu_image.build(inputs)  # cached by content hash: seconds unless the env changed
    cpu_image.prune(inputs, log=lambda _: None)  # keep one runtime (gigabytes), not one per env
    work = tmp_path_factory.mktemp("compose")
    proj = ComposeProject.create(work, cpu_image.compose_env(inputs, tag), cpu_image.write_env)
    try:
        proj.up()
        proj.wait_healthy(SERVICES, HEALTHY_TIMEOUT_S)
        yield proj
    finally:
        logs = proj.logs(tail=200)
        (work / "compose.log").write_text(logs)
        down = proj.down()
        left = proj.leftovers()
        proj.remove_state_dir()
        assert down.returncode == 0, down.stderr
        assert left == [], f"left after down -v: {left}"
        # down -v deletes Redis's volume only: the evaluator's reports stay on the host
        reports = sorted(Path(proj.values["SWERL_EVAL_RUNS_DIR"]).glob("*/*.json"))
        assert reports or not EVAL_JOBS, "the eval reports went with down -v"


def swerl(project: ComposeProject, *args: str, timeout_s: float = 60.0) -> str:
    cmd = [sys.executable, "-m", "services.swerl_cli", "--api", project.api_url, "--json", *args]
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO_ROOT, timeout=timeout_s)
    assert res.returncode == 0, f"{' '.join(args)} -> {res.returncode}\n{res.stderr[-3000:]}"
    return res.stdout


def test_every_cpu_service_is_healthy_from_one_image(project: ComposeProject) -> None:
    status = project.containers()
    assert set(status) == SERVICES
    assert all(s == "healthy" for s in status.values()), status
    ready = httpx.get(f"{project.api_url}/readyz", timeout=10)
    assert ready.status_code == 200


def test_a_rollout_job_through_the_api_finishes_with_reward(project: ComposeProject) -> None:
    submitted = swerl(
        project, "submit", "rollout", "--instances", INSTANCE, "--samples", "1",
        "--max-steps", "8", "--wait", timeout_s=JOB_TIMEOUT_S,
    )  # fmt: skip
    job_id = json.loads(submitted[: submitted.index("\n}") + 2])["id"]
    job = json.loads(swerl(project, "status", job_id))
    assert job["state"] == "succeeded", (job, project.logs())
    assert job["progress"]["done"] == job["progress"]["total"] == 1
    assert job["metrics"]["mean_reward"] == 1.0
    rows = [json.loads(line) for line in swerl(project, "results", job_id).splitlines()]
    assert len(rows) == 1
    (row,) = rows
    assert (row["instance_id"], row["status"], row["reward"]) == (INSTANCE, "completed", 1.0)
    assert row["node"] == project.node  # the containerised worker of this project ran it
    assert row["patch"] and row["n_turns"] > 0 and row["n_tokens"] > 0
    # The adapter in its container recorded the token data into the project's Redis.
    record = httpx.get(
        f"{project.api_url}/v1/jobs/{job_id}/trajectories/{row['trajectory_id']}", timeout=30
    )
    assert record.status_code == 200, record.text
    turns = [t for seg in record.json()["segments"] for t in seg["turns"]]
    assert turns and all(len(t["output_ids"]) == len(t["output_logprobs"]) > 0 for t in turns)


def test_an_eval_job_through_the_api_is_graded_by_the_evaluator(project: ComposeProject) -> None:
    """The containerised evaluator claims the eval job and grades the gold patch in a sandbox
    of the host's engine (the state directory the same path inside and out)."""
    submitted = swerl(
        project, "submit", "eval", "--dataset", "/datasets/instances.jsonl", "--predictions",
        "gold", "--instances", INSTANCE, "--wait", timeout_s=JOB_TIMEOUT_S,
    )  # fmt: skip
    job_id = json.loads(submitted[: submitted.index("\n}") + 2])["id"]
    job = json.loads(swerl(project, "status", job_id))
    assert job["state"] == "succeeded", (job, project.compose("logs", "evaluator").stdout[-3000:])
    assert job["metrics"]["resolved_rate"] == 1.0, job["metrics"]
    rows = [json.loads(line) for line in swerl(project, "results", job_id).splitlines()]
    assert [(r["instance_id"], r["status"]) for r in rows] == [(INSTANCE, "resolved")]
    # the report is written to a host directory (SWERL_EVAL_RUNS_DIR), not into the container
    report_dir = Path(project.values["SWERL_EVAL_RUNS_DIR"]) / job_id
    assert sorted(report_dir.glob("*.json")), sorted(report_dir.iterdir())
    EVAL_JOBS.append(job_id)


def test_the_sandboxes_ran_on_the_host_engine_and_are_gone(project: ComposeProject) -> None:
    """The worker's sandboxes were containers of the host's engine, labelled with its node,
    and none is left after the job (their tmpfs quotas are unmounted too)."""
    worker_log = project.compose("logs", "--no-color", "sandbox-worker").stdout
    assert f"node={project.node}" in worker_log
    assert project.sandbox_leftovers() == []  # no sandbox, no quota mount left behind
    assert Path(project.state_dir).is_dir()
