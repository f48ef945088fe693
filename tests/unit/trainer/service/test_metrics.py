"""The trainer service's Prometheus metrics: the registry, the service's hooks (a claimed job,
its lease heartbeats reading the run's step, its end) on stub Redis sides, and the endpoint."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from services.api.claims import Claim
from services.api.schemas import JobState
from services.metrics_server import start_metrics_server
from trainer.loop.metrics import METRICS_FILE
from trainer.service.cli import main as serve_main
from trainer.service.config import TrainerServiceConfig
from trainer.service.metrics import TrainerServiceMetrics
from trainer.service.service import TrainerService


class StubClaims:
    def finish(self, job_id: str, holder: str, state: JobState, message: str) -> bool:
        return True


class StubStore:
    def log(self, *args: Any) -> None:
        pass


def _service() -> TrainerService:
    service = TrainerService(TrainerServiceConfig(), redis.Redis(port=1))  # never connects
    service.claims, service.store = StubClaims(), StubStore()  # type: ignore[assignment]
    return service


def test_heartbeats_publish_the_running_jobs_step_until_it_ends(tmp_path: Path) -> None:
    service = _service()
    m = service.metrics
    steps_seen: list[float] = []

    def run(job: Claim) -> None:  # stands for the training process: the lease reads its step
        for step in (1, 2, 3):
            with open(tmp_path / METRICS_FILE, "a") as f:
                f.write(json.dumps({"step": step, "phase": "train"}) + "\n")
            service._progress(tmp_path, steps=10)
            steps_seen.append(m.value("swerl_trainer_service_step"))
        assert m.value("swerl_trainer_service_jobs_running") == 1
        assert 0 <= m.value("swerl_trainer_service_heartbeat_age_seconds") < 60
        service.finish(job.job_id, JobState.SUCCEEDED, "training finished")

    service._run_job = run  # type: ignore[method-assign]
    service.run_job(Claim(job_id="j1", attempt=1))
    assert steps_seen == [1, 2, 3]
    assert m.value("swerl_trainer_service_jobs_claimed_total") == 1
    assert m.value("swerl_trainer_service_jobs_finished_total", state="succeeded") == 1
    assert m.value("swerl_trainer_service_jobs_running") == 0
    assert math.isnan(m.value("swerl_trainer_service_step"))  # no job runs
    assert math.isnan(m.value("swerl_trainer_service_heartbeat_age_seconds"))


def test_a_job_that_raises_still_leaves_its_slot() -> None:
    service = _service()

    def broken(job: Claim) -> None:
        raise RuntimeError("boom")

    service._run_job = broken  # type: ignore[method-assign]
    with pytest.raises(RuntimeError):
        service.run_job(Claim(job_id="j1", attempt=1))
    assert service.metrics.value("swerl_trainer_service_jobs_running") == 0


def test_the_endpoint_serves_the_trainer_service_metrics() -> None:
    m = TrainerServiceMetrics()
    m.claimed()
    m.heartbeat(42)
    m.finished("cancelled")
    server = start_metrics_server(m.registry, 0, "127.0.0.1")
    try:
        text = httpx.get(f"http://127.0.0.1:{server.port}/metrics", timeout=10).text
    finally:
        server.close()
    assert "swerl_trainer_service_step 42.0" in text
    assert 'swerl_trainer_service_jobs_finished_total{state="cancelled"} 1.0' in text


def test_the_flag_sets_the_port_and_zero_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert serve_main(["--metrics-port", "9304", "--print-config"]) == 0
    assert "metrics_port: 9304" in capsys.readouterr().out
    assert serve_main(["--metrics-port", "0", "--print-config"]) == 2
    assert "trainer_service.metrics_port" in capsys.readouterr().err
