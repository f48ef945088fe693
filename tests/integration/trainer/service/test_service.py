"""``python -m trainer serve`` against real Redis and the real job API process: train jobs
submitted over HTTP are claimed one at a time per group, run (the driver stand-in writes
metrics.jsonl and real checkpoints), report progress, end succeeded / failed / cancelled, and a
SIGKILLed service's job is resumed by the next service (attempt 2, ``--resume``, same
checkpoint dir); a lost lease stops the training process."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
import yaml

from services.api.claims import JobClaims
from services.api.schemas import JobKind, JobState
from services.processes import ManagedProcess
from tests.support.api_server import ApiServer
from tests.support.execution import wait_for
from trainer.loop.metrics import read_jsonl

TERMINAL = {"succeeded", "failed", "cancelled"}


def submit(http: httpx.Client, tmp: Path, name: str, **spec: Any) -> str:
    dataset = tmp / "ids.txt"
    dataset.write_text("p0\np1\np2\np3\n")
    body = {"model": str(tmp / "tiny"), "dataset": str(dataset), "steps": 5,
            "checkpoint_dir": str(tmp / f"ckpt-{name}"), **spec}  # fmt: skip
    got = http.post("/v1/jobs/train", json=body)
    assert got.status_code == 201, got.text
    return got.json()["id"]


def job(http: httpx.Client, job_id: str) -> dict[str, Any]:
    got = http.get(f"/v1/jobs/{job_id}")
    assert got.status_code == 200, got.text
    return got.json()


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def invocations(tmp: Path, job_id: str) -> list[dict[str, Any]]:
    return read_jsonl(tmp / "runs" / job_id / "invocations.jsonl")


def running_job(
    http: httpx.Client, tmp: Path, name: str, service: ManagedProcess
) -> tuple[str, int]:
    """A long job submitted and past its first step: its id and its training process's pid."""
    job_id = submit(http, tmp, name, steps=1000)
    wait_for(lambda: (job(http, job_id)["progress"]["current_step"] or 0) >= 1, 60,
             "the first step", service.log_tail)  # fmt: skip
    return job_id, invocations(tmp, job_id)[0]["pid"]


@pytest.mark.slow
def test_jobs_run_one_at_a_time_and_succeed_with_progress(
    api: ApiServer, start_service: Callable[..., ManagedProcess], tmp_path: Path
) -> None:
    with api.client() as http:
        first = submit(http, tmp_path, "a", steps=8)
        second = submit(
            http, tmp_path, "b", steps=2, batch={"prompts_per_step": 3, "samples_per_prompt": 1}
        )
        service = start_service(step_s=0.5)
        seen: list[dict[str, Any]] = []

        def first_done() -> bool:
            # the second job is read before the first: if the first is still running after
            # that read, the second must have been queued at it (one active train job per
            # group). Read the other way round, the first could end and the second start
            # between the two reads.
            b = job(http, second)
            a = job(http, first)
            if a["state"] == "running":
                seen.append(a["progress"])
                assert b["state"] == "queued", (a, b)
            return a["state"] in TERMINAL

        wait_for(first_done, 90, "the first job", service.log_tail)
        wait_for(lambda: job(http, second)["state"] in TERMINAL, 60, "the second job",
                 service.log_tail)  # fmt: skip
        a, b = job(http, first), job(http, second)
        logs = http.get(f"/v1/jobs/{first}/logs").json()["lines"]
    assert a["state"] == "succeeded" and b["state"] == "succeeded", (a, b, service.log_tail())
    assert a["attempt"] == 1 and a["message"] == "training finished"
    assert a["progress"] == {"done": 8, "total": 8, "current_step": 8, "phase": "single"}
    assert a["metrics"] == {"reward/mean": 1.0, "version": 8.0}
    assert any(0 < (p["current_step"] or 0) < 8 for p in seen), seen  # progress while running
    assert b["progress"]["current_step"] == 2
    run = yaml.safe_load((tmp_path / "runs" / first / "run.yaml").read_text())
    assert run["trainer"]["checkpoint"]["dir"] == str(tmp_path / "ckpt-a")
    assert run["train"]["bootstrap"] == {"prompts": 8, "group_size": 8}
    assert run["train"]["single"]["batch_size"] == 64
    run_b = yaml.safe_load((tmp_path / "runs" / second / "run.yaml").read_text())
    assert "bootstrap" not in run_b["train"] and run_b["train"]["single"]["batch_size"] == 3
    assert [i["resume"] for i in invocations(tmp_path, first)] == [False]
    assert any("attempt 1:" in line["message"] for line in logs)


@pytest.mark.slow
def test_cancel_stops_the_training_process(
    api: ApiServer, start_service: Callable[..., ManagedProcess], tmp_path: Path
) -> None:
    service = start_service(step_s=0.3)
    with api.client() as http:
        job_id, pid = running_job(http, tmp_path, "c", service)
        assert alive(pid)
        assert http.post(f"/v1/jobs/{job_id}/cancel").json()["state"] == "cancelling"
        wait_for(lambda: job(http, job_id)["state"] in TERMINAL, 30, "the cancel",
                 service.log_tail)  # fmt: skip
        got = job(http, job_id)
    assert got["state"] == "cancelled", got
    assert not alive(pid)
    assert service.running()  # the service goes on with the next job


@pytest.mark.slow
def test_bad_spec_and_failed_run_fail_the_job_with_the_reason(
    api: ApiServer, start_service: Callable[..., ManagedProcess], tmp_path: Path
) -> None:
    service = start_service()
    with api.client() as http:
        # an unknown algorithm never reaches the service: the API refuses it, naming the field
        unknown = http.post("/v1/jobs/train", json={"model": "m", "dataset": "d", "steps": 1,
                                                    "algorithm": "nosuch"})  # fmt: skip
        missing = submit(http, tmp_path, "m", dataset=str(tmp_path / "nope.txt"))
        no_ckpt = submit(http, tmp_path, "r", resume=True)  # --resume with nothing to resume
        for job_id in (missing, no_ckpt):
            wait_for(lambda j=job_id: job(http, j)["state"] in TERMINAL, 60, job_id,
                     service.log_tail)  # fmt: skip
        got = {j: job(http, j) for j in (missing, no_ckpt)}
        logs = [x["message"] for x in http.get(f"/v1/jobs/{no_ckpt}/logs").json()["lines"]]
    assert unknown.status_code == 422, unknown.text
    assert unknown.json()["error"]["field"] == "body.algorithm"
    assert "unknown algorithm 'nosuch'" in unknown.json()["error"]["message"]
    assert {g["state"] for g in got.values()} == {"failed"}
    nope = str(tmp_path / "nope.txt")
    assert f"spec.dataset {nope!r} is neither a dataset mixture" in got[missing]["message"]
    assert got[no_ckpt]["message"].startswith("training exited with 1:")
    assert "--resume: no complete checkpoint" in got[no_ckpt]["message"]
    assert any(line.startswith("attempt 1:") and line.endswith(" --resume") for line in logs)
    assert service.running()


@pytest.mark.slow
def test_sigkilled_service_job_resumes_on_the_next_service(
    api: ApiServer, start_service: Callable[..., ManagedProcess], tmp_path: Path
) -> None:
    steps = 12
    first = start_service(step_s=0.3)
    with api.client() as http:
        job_id = submit(http, tmp_path, "k", steps=steps)
        wait_for(lambda: (job(http, job_id)["progress"]["current_step"] or 0) >= 3, 60,
                 "step 3", first.log_tail)  # fmt: skip
        pid = invocations(tmp_path, job_id)[0]["pid"]
        os.kill(first.pid, signal.SIGKILL)  # the service only, not its process group
        first.popen.wait(timeout=10)
        wait_for(lambda: not alive(pid), 10, "the orphaned training process to stop")
        assert job(http, job_id)["state"] == "running"  # until the lease runs out
        second = start_service(step_s=0.3)
        wait_for(lambda: job(http, job_id)["state"] in TERMINAL, 90, "the resumed job",
                 second.log_tail)  # fmt: skip
        got = job(http, job_id)
    assert got["state"] == "succeeded", (got, second.log_tail())
    assert got["attempt"] == 2 and got["progress"]["current_step"] == steps
    runs = invocations(tmp_path, job_id)
    assert [i["resume"] for i in runs] == [False, True]
    assert runs[1]["start_step"] >= 3  # from the checkpoint, not from scratch
    run = yaml.safe_load(Path(runs[1]["config"]).read_text())
    assert run["trainer"]["checkpoint"]["dir"] == str(tmp_path / "ckpt-k")
    rows = read_jsonl(tmp_path / "runs" / job_id / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(1, steps + 1))  # each step once
    assert json.loads((tmp_path / "ckpt-k" / f"step-{steps}" / "manifest.json").read_text())


@pytest.mark.slow
def test_a_lost_lease_stops_the_process_and_leaves_the_job_to_its_new_holder(
    api: ApiServer, start_service: Callable[..., ManagedProcess], tmp_path: Path, redis_url: str
) -> None:
    service = start_service(step_s=0.3)
    with api.client() as http:
        job_id, pid = running_job(http, tmp_path, "l", service)
        os.kill(service.pid, signal.SIGSTOP)  # the service stops heartbeating; its process runs
        try:
            thief = JobClaims(rclient := redis.Redis.from_url(redis_url))
            wait_for(lambda: thief.claim(JobKind.TRAIN, "default", "thief", 60), 30,
                     "the lease to run out")  # fmt: skip
        finally:
            os.kill(service.pid, signal.SIGCONT)
        wait_for(lambda: not alive(pid), 20, "the training process to stop", service.log_tail)
        got = job(http, job_id)
    assert got["state"] == "running" and got["attempt"] == 2  # the new holder's, untouched
    assert thief.heartbeat(job_id, "thief", 60) == JobState.RUNNING
    rclient.close()
    assert "lost the lease of job" in service.log()
    assert service.running()


@pytest.mark.slow
def test_a_stopped_service_gives_its_job_back(
    api: ApiServer, start_service: Callable[..., ManagedProcess], tmp_path: Path
) -> None:
    service = start_service(step_s=0.3)
    with api.client() as http:
        job_id, pid = running_job(http, tmp_path, "s", service)
        os.kill(service.pid, signal.SIGTERM)
        assert service.popen.wait(timeout=30) == 0
        got = job(http, job_id)
    assert not alive(pid)
    assert got["state"] == "queued" and got["message"] == "trainer service stopped: queued again"


@pytest.mark.slow
def test_a_command_that_cannot_run_fails_the_job(
    api: ApiServer, start_service: Callable[..., ManagedProcess], tmp_path: Path
) -> None:
    missing = tmp_path / "no-such-trainer"
    service = start_service(command=[str(missing)])
    with api.client() as http:
        job_id = submit(http, tmp_path, "x")
        wait_for(lambda: job(http, job_id)["state"] in TERMINAL, 60, "the job", service.log_tail)
        got = job(http, job_id)
    assert got["state"] == "failed"
    assert got["message"] == f"cannot start {missing}: No such file or directory"
    assert service.running()
