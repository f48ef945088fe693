"""The evaluator service's Prometheus metrics: the registry, the service's hooks (a claimed
job's run, its end from a run report) on stub Redis sides, and the endpoint."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from services.api.claims import Claim
from services.api.schemas import JobState
from services.eval.metrics import EvalMetrics
from services.eval.serve import main as serve_main
from services.eval.service import EvalService
from services.eval.service_config import EvalServiceConfig
from services.metrics_server import start_metrics_server

REPORT = {
    "total_instances": 4, "resolved_instances": 2, "resolved_ids": ["a", "b"],
    "unresolved_ids": ["c"], "error_ids": [], "empty_patch_ids": ["d"], "incomplete_ids": [],
}  # fmt: skip


class StubSides:
    """Stands for the service's JobClaims and JobStore: every write is accepted."""

    def __init__(self) -> None:
        self.finished: list[JobState] = []

    def append_results(self, *args: Any, **kwargs: Any) -> bool:
        return True

    def heartbeat(self, *args: Any) -> JobState:
        return JobState.RUNNING

    def finish(self, job_id: str, holder: str, state: JobState, message: str) -> bool:
        self.finished.append(state)
        return True

    def log(self, *args: Any) -> None:
        pass


def _service() -> tuple[EvalService, StubSides]:
    service = EvalService(EvalServiceConfig(), redis.Redis(port=1))  # never connects
    sides = StubSides()
    service.claims = service.store = sides  # type: ignore[assignment]
    return service, sides


def test_a_finished_report_counts_instances_by_verdict_and_the_job_by_state(
    tmp_path: Path,
) -> None:
    service, sides = _service()
    (tmp_path / "model.j1.json").write_text(json.dumps(REPORT))
    log = tmp_path / "attempt-1.log"
    log.write_text("done\n")
    service._end("j1", 0, log, tmp_path, 30.0)
    assert sides.finished == [JobState.SUCCEEDED]
    m = service.metrics
    verdicts = {v: m.value("swerl_evaluator_instances_graded_total", verdict=v)
                for v in ("resolved", "unresolved", "empty_patch", "error")}  # fmt: skip
    assert verdicts == {"resolved": 2, "unresolved": 1, "empty_patch": 1, "error": 0}
    assert m.value("swerl_evaluator_jobs_finished_total", state="succeeded") == 1
    service._end("j2", 2, log, tmp_path / "missing", 30.0)  # bad input: no report
    assert m.value("swerl_evaluator_jobs_finished_total", state="failed") == 1


def test_a_claimed_job_is_counted_and_timed_even_when_it_raises() -> None:
    service, _ = _service()

    def broken(job: Claim) -> None:
        assert service.metrics.value("swerl_evaluator_jobs_running") == 1
        raise RuntimeError("boom")

    service._run_job = broken  # type: ignore[method-assign]
    with pytest.raises(RuntimeError):
        service.run_job(Claim(job_id="j1", attempt=1))
    m = service.metrics
    assert m.value("swerl_evaluator_jobs_claimed_total") == 1
    assert m.value("swerl_evaluator_jobs_running") == 0
    assert m.value("swerl_evaluator_grading_seconds_count") == 1


def test_the_endpoint_serves_the_evaluator_metrics() -> None:
    m = EvalMetrics()
    m.claimed()
    m.graded(["resolved", "resolved", "error"])
    server = start_metrics_server(m.registry, 0, "127.0.0.1")
    try:
        text = httpx.get(f"http://127.0.0.1:{server.port}/metrics", timeout=10).text
    finally:
        server.close()
    assert 'swerl_evaluator_instances_graded_total{verdict="resolved"} 2.0' in text
    assert "swerl_evaluator_jobs_running 1.0" in text


def test_the_flag_sets_the_port_and_zero_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert serve_main(["--metrics-port", "9302", "--print-config"]) == 0
    assert "metrics_port: 9302" in capsys.readouterr().out
    assert serve_main(["--metrics-port", "0", "--print-config"]) == 2
    assert "eval_service.metrics_port" in capsys.readouterr().err
