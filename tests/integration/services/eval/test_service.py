"""``python -m services.eval serve`` against real Redis and the real job API process: eval jobs
submitted over HTTP are claimed, graded by the evaluation script on the mini set (bwrap
sandboxes), report progress and end with the run report as results and metrics; cancel stops
the grading; an infrastructure failure fails the job and is never counted as unresolved; a bad
spec is a 422 naming the field, a bad file fails the job with the reason."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from services.processes import ManagedProcess, launch
from tests.support.api_server import ApiServer, start_api
from tests.support.execution import wait_for
from tests.support.paths import REPO_ROOT

TERMINAL = {"succeeded", "failed", "cancelled"}


@pytest.fixture
def api(redis_url: str, tmp_path: Path) -> Iterator[ApiServer]:
    server = start_api(redis_url, tmp_path)
    yield server
    server.stop()


@pytest.fixture
def start_service(redis_url: str, tmp_path: Path) -> Iterator[Callable[..., ManagedProcess]]:
    """``start_service(**settings)``: an evaluator service (bwrap, 2 workers, 3 s lease) with
    ``settings`` over its ``eval_service`` section; job dirs under ``tmp_path/runs``."""
    started: list[ManagedProcess] = []

    def start(**settings: Any) -> ManagedProcess:
        n = len(started)
        section = {"backend": "bwrap", "workers": 2, "lease_ttl_s": 3.0,
                   "poll_interval_s": 0.2, "stop_grace_s": 20.0, **settings}  # fmt: skip
        path = tmp_path / f"evaluator{n}.yaml"
        path.write_text(yaml.safe_dump({"eval_service": section}))
        argv = [sys.executable, "-m", "services.eval", "serve", "--config", str(path)]
        argv += ["--redis", redis_url, "--runs-dir", str(tmp_path / "runs")]
        proc = launch(f"evaluator-{n}", argv, tmp_path / f"evaluator{n}.log",
                      env={"PYTHONDONTWRITEBYTECODE": "1"}, cwd=REPO_ROOT,
                      grace_s=30)  # fmt: skip
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.stop()


def submit(http: httpx.Client, **spec: Any) -> str:
    got = http.post("/v1/jobs/eval", json=spec)
    assert got.status_code == 201, got.text
    return got.json()["id"]


def job(http: httpx.Client, job_id: str) -> dict[str, Any]:
    got = http.get(f"/v1/jobs/{job_id}")
    assert got.status_code == 200, got.text
    return got.json()


def finished(
    http: httpx.Client, job_id: str, service: ManagedProcess, timeout: float = 300
) -> dict[str, Any]:
    wait_for(lambda: job(http, job_id)["state"] in TERMINAL, timeout, f"job {job_id}",
             service.log_tail)  # fmt: skip
    return job(http, job_id)


def results(http: httpx.Client, job_id: str) -> list[dict[str, Any]]:
    return http.get(f"/v1/jobs/{job_id}/results?limit=100").json()["results"]


@pytest.mark.slow
def test_gold_eval_job_resolves_everything(
    api: ApiServer,
    start_service: Callable[..., ManagedProcess],
    mini_set: Path,
    tmp_path: Path,
) -> None:
    service = start_service()
    with api.client() as http:
        job_id = submit(http, predictions="gold", dataset=str(mini_set))
        seen: list[dict[str, Any]] = []

        def done() -> bool:
            got = job(http, job_id)
            if got["state"] == "running":
                seen.append(got["progress"])
            return got["state"] in TERMINAL

        wait_for(done, 300, "the gold job", service.log_tail)
        got, rows = job(http, job_id), results(http, job_id)
        logs = [line["message"] for line in http.get(f"/v1/jobs/{job_id}/logs").json()["lines"]]
    assert got["state"] == "succeeded", (got, service.log_tail())
    assert got["message"].startswith("resolved 9/9 (100.0%)"), got["message"]
    assert got["progress"] == {"done": 9, "total": 9, "current_step": None, "phase": "graded"}
    assert any(p["phase"] == "grading" and p["total"] == 9 for p in seen), seen
    metrics = got["metrics"]
    assert metrics["resolved_rate"] == 1.0
    assert (metrics["total_instances"], metrics["resolved_instances"]) == (9, 9)
    assert metrics["error_instances"] == 0 and metrics["infra_error_instances"] == 0
    assert len(rows) == 9 and {r["status"] for r in rows} == {"resolved"}
    # the hardened pass (on by default): gold resolves under both gradings, nothing flagged
    assert "hardened 9/9" in got["message"], got["message"]
    assert (metrics["hardened_resolved_rate"], metrics["tampered_instances"]) == (1.0, 0.0)
    assert all(r["hardened_resolved"] is True and r["tamper"] == [] for r in rows), rows
    report = json.loads((tmp_path / "runs" / job_id / f"gold.{job_id}.json").read_text())
    assert sorted(r["instance_id"] for r in rows) == report["resolved_ids"]
    assert any(f"--run-id {job_id}" in line for line in logs), logs


@pytest.mark.slow
def test_cancel_stops_the_grading_and_the_service_takes_the_next_job(
    api: ApiServer,
    start_service: Callable[..., ManagedProcess],
    mini_set: Path,
    tmp_path: Path,
) -> None:
    service = start_service(workers=1)
    with api.client() as http:
        job_id = submit(http, predictions="gold", dataset=str(mini_set))
        wait_for(lambda: job(http, job_id)["progress"]["phase"] == "grading", 120,
                 "grading to start", service.log_tail)  # fmt: skip
        assert http.post(f"/v1/jobs/{job_id}/cancel").json()["state"] == "cancelling"
        got = finished(http, job_id, service, 60)
        assert got["state"] == "cancelled", got
        assert got["progress"]["done"] < 9  # stopped before the end
        assert results(http, job_id) == []  # no report: nothing is claimed as graded
        script_log = (tmp_path / "runs" / job_id / "attempt-1.log").read_text()
        assert "interrupted: finished instances are kept" in script_log  # sandboxes removed
        nxt = submit(http, predictions="gold", dataset=str(mini_set), max_instances=1)
        after = finished(http, nxt, service)
    assert after["state"] == "succeeded", after
    assert after["metrics"]["resolved_rate"] == 1.0 and after["metrics"]["total_instances"] == 1


@pytest.mark.slow
def test_an_infrastructure_failure_fails_the_job_and_is_not_unresolved(
    api: ApiServer,
    start_service: Callable[..., ManagedProcess],
    mini_set: Path,
) -> None:
    service = start_service(image_namespace="nowhere")  # no such images: sandboxes fail
    with api.client() as http:
        job_id = submit(http, predictions="gold", dataset=str(mini_set),
                        instance_ids=["swerl__spanlib-1", "swerl__strkit-1"])  # fmt: skip
        got = finished(http, job_id, service)
        rows = results(http, job_id)
    assert got["state"] == "failed", got
    head = "infrastructure failure (not graded as wrong answers): swerl__spanlib-1, swerl__strkit-1"
    assert got["message"].startswith(head), got["message"]
    assert got["metrics"]["unresolved_instances"] == 0
    assert got["metrics"]["infra_error_instances"] == 2
    assert [(r["instance_id"], r["status"], r["infra_failure"]) for r in rows] == [
        ("swerl__spanlib-1", "error", True),
        ("swerl__strkit-1", "error", True),
    ]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"dataset": "d"}, "body.predictions"),  # neither checkpoint nor predictions
        ({"dataset": "d", "checkpoint": "c", "predictions": "gold"}, "body.predictions"),
        ({"dataset": "d", "predictions": "gold", "n_samples": 2}, "body.n_samples"),
        ({"dataset": "d", "predictions": "gold", "instance_ids": ["a b"]}, "body.instance_ids.0"),
        ({"dataset": "d", "predictions": "gold", "max_instance": 2}, "body.max_instance"),
    ],
)
def test_bad_eval_specs_are_422_naming_the_field(
    api: ApiServer, body: dict[str, Any], field: str
) -> None:
    with api.client() as http:
        got = http.post("/v1/jobs/eval", json=body)
    assert got.status_code == 422, got.text
    assert got.json()["error"]["field"] == field


def test_a_missing_dataset_fails_the_job_naming_the_file(
    api: ApiServer, start_service: Callable[..., ManagedProcess], tmp_path: Path
) -> None:
    service = start_service()
    missing = tmp_path / "no-such.jsonl"
    with api.client() as http:
        job_id = submit(http, predictions="gold", dataset=str(missing))
        got = finished(http, job_id, service, 60)
    assert got["state"] == "failed", got
    assert got["message"].startswith("bad input: ") and str(missing) in got["message"], got
    assert got["metrics"] == {}
