"""The sandbox worker's Prometheus metrics: the registry, the worker's hooks (a task taking and
leaving a slot, a heartbeat) on a stub queue, and the endpoint serving them."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import httpx
import pytest

from sandbox_worker.__main__ import main as worker_main
from sandbox_worker.config import WorkerConfig
from sandbox_worker.metrics import HANDED_BACK, SANDBOX_START, WorkerMetrics
from sandbox_worker.runner import SHUTDOWN, RunContext
from sandbox_worker.worker import Worker
from services.metrics_server import start_metrics_server
from services.protocol.tasks import RolloutTask, TaskResult
from services.protocol.trajectory import Outcome, OutcomeStatus
from services.queue.entries import task_payload


@dataclass
class StubQueue:
    """The few WorkerQueue calls one task and one heartbeat make."""

    results: list[TaskResult] = field(default_factory=list)
    requeued: list[str] = field(default_factory=list)

    def start(self, task_id: str, entry: str, node: str) -> str:
        return "running"

    def complete(self, result: TaskResult, entry: str) -> str:
        self.results.append(result)
        return "final"

    def requeue(self, task_id: str, entry: str, node: str, reason: str, kind: str) -> str:
        self.requeued.append(task_id)
        return "requeued"

    def heartbeat(self, node: str, fields: object, entries: object, batches: object) -> tuple:
        return False, []


@dataclass
class StubRunner:
    outcome: Outcome
    shutdown: bool = False  # the task is stopped by a shutdown while it runs

    def run(self, task: RolloutTask, ctx: RunContext) -> Outcome:
        if self.shutdown:
            ctx.cancel.cancel(SHUTDOWN)
        return self.outcome


def _entry(n: int) -> tuple[str, dict[bytes, bytes]]:
    task = RolloutTask(task_id=f"t{n}", batch_id="b1", group_id="g1",
                       instance_id="swerl__spanlib-1")  # fmt: skip
    fields = {b"task_id": task.task_id.encode(), b"attempt": b"1",
              b"payload": task_payload(task).encode()}  # fmt: skip
    return f"1-{n}", fields


def _run_one(worker: Worker, n: int) -> None:
    """One task through the worker's own path: read -> slot -> runner -> report."""
    worker._handle(*_entry(n))
    assert worker.metrics.value("swerl_worker_busy_slots") == 1
    worker._run_task(worker._jobs.get())


def _worker(runner: StubRunner, queue: StubQueue, slots: int = 3) -> Worker:
    cfg = WorkerConfig(node="n1", slots=slots, backend="simulated")
    return Worker(cfg, runner, queue=queue)  # type: ignore[arg-type]


def test_a_finished_task_moves_the_counters_by_outcome() -> None:
    outcome = Outcome(status=OutcomeStatus.COMPLETED, reward=1.0,
                      durations={SANDBOX_START: 2.0, "conversation": 30.0})  # fmt: skip
    queue = StubQueue()
    worker = _worker(StubRunner(outcome), queue)
    m = worker.metrics
    assert m.value("swerl_worker_slots") == 3
    _run_one(worker, 1)
    _run_one(worker, 2)
    assert len(queue.results) == 2
    assert m.value("swerl_worker_trajectories_started_total") == 2
    assert m.value("swerl_worker_trajectories_finished_total", outcome="completed") == 2
    assert m.value("swerl_worker_busy_slots") == 0
    assert m.value("swerl_worker_trajectory_seconds_count", outcome="completed") == 2
    assert m.value("swerl_worker_sandbox_start_seconds_count") == 2
    assert m.value("swerl_worker_sandbox_start_seconds_sum") == 4.0


def test_aborted_and_handed_back_tasks_are_told_apart() -> None:
    aborted = Outcome(status=OutcomeStatus.ABORTED, abort_reason="sandbox creation failed")
    worker = _worker(StubRunner(aborted), StubQueue())
    _run_one(worker, 1)
    assert worker.metrics.value("swerl_worker_trajectories_finished_total",
                                outcome="aborted") == 1  # fmt: skip
    assert worker.metrics.value("swerl_worker_sandbox_start_seconds_count") == 0
    queue = StubQueue()
    stopped = _worker(StubRunner(aborted, shutdown=True), queue)
    _run_one(stopped, 2)
    assert queue.requeued == ["t2"] and queue.results == []
    m = stopped.metrics
    assert m.value("swerl_worker_trajectories_finished_total", outcome=HANDED_BACK) == 1
    assert m.value("swerl_worker_trajectories_finished_total", outcome="aborted") == 0


def test_a_runner_that_raises_counts_as_aborted() -> None:
    class Broken(StubRunner):
        def run(self, task: RolloutTask, ctx: RunContext) -> Outcome:
            raise RuntimeError("boom")

    worker = _worker(Broken(Outcome(status=OutcomeStatus.ERROR, reward=0.0)), StubQueue())
    _run_one(worker, 1)
    assert worker.metrics.value("swerl_worker_trajectories_finished_total",
                                outcome="aborted") == 1  # fmt: skip
    assert worker.metrics.value("swerl_worker_busy_slots") == 0


def test_a_heartbeat_sets_its_time_and_age() -> None:
    worker = _worker(StubRunner(Outcome(status=OutcomeStatus.ERROR, reward=0.0)), StubQueue())
    assert math.isnan(worker.metrics.value("swerl_worker_heartbeat_age_seconds"))
    worker._beat()
    assert worker.metrics.value("swerl_worker_last_heartbeat_timestamp_seconds") > 0
    assert 0 <= worker.metrics.value("swerl_worker_heartbeat_age_seconds") < 60


def test_the_registry_is_the_workers_own() -> None:
    one, two = WorkerMetrics(), WorkerMetrics()
    one.started()
    assert (one.value("swerl_worker_busy_slots"), two.value("swerl_worker_busy_slots")) == (1, 0)


def test_the_endpoint_serves_the_worker_metrics() -> None:
    m = WorkerMetrics()
    m.set_slots(4)
    m.started()
    m.finished("timeout", 12.0, {})
    server = start_metrics_server(m.registry, 0, "127.0.0.1")
    try:
        text = httpx.get(f"http://127.0.0.1:{server.port}/metrics", timeout=10).text
    finally:
        server.close()
    assert "swerl_worker_slots 4.0" in text
    assert 'swerl_worker_trajectories_finished_total{outcome="timeout"} 1.0' in text


def test_the_flag_sets_the_port_and_zero_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert worker_main(["--metrics-port", "9303", "--print-config"]) == 0
    assert "metrics_port: 9303" in capsys.readouterr().out
    assert worker_main(["--metrics-port", "0", "--print-config"]) == 2
    assert "worker.metrics_port" in capsys.readouterr().err
