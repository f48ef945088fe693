"""The rollout job runner with a real manager dispatch loop and a simulated worker process: a
job whose runner died (its lease expired) is taken over and finished by another runner."""

from __future__ import annotations

import time

import pytest
import redis

from services.api.claims import JobClaims
from services.api.config import ApiConfig, RunnerConfig
from services.api.runner import GROUP, RolloutJobRunner
from services.api.schemas import JobKind, JobState
from services.api.store import JobStore
from tests.support.execution import (  # noqa: F401 (fixtures)
    QUEUE_CFG,
    Procs,
    procs,
    queue,
    wait_for,
    wait_nodes,
)

pytestmark = pytest.mark.slow


def test_a_dead_runners_job_is_taken_over(redis_url: str, procs: Procs, queue) -> None:  # noqa: F811
    procs.worker(redis_url, "node-a", slots=2)
    wait_nodes(queue, {"node-a"}, procs)
    client = redis.Redis.from_url(redis_url)
    store, claims = JobStore(client), JobClaims(client)
    spec = {"instance_ids": ["x.sleep100.reward1"], "n_samples": 2}
    job_id = store.submit(JobKind.ROLLOUT, spec, "alice").job_id
    # A runner claims the job and dies at once (no heartbeat: its lease runs out).
    assert claims.claim(JobKind.ROLLOUT, GROUP, "dead-runner", ttl_s=0.5, max_active=8)
    time.sleep(0.6)
    runner_cfg = RunnerConfig(concurrency=1, poll_interval_s=0.1, lease_ttl_s=5, dispatcher=True)
    runner = RolloutJobRunner(ApiConfig(redis_url=redis_url, runner=runner_cfg, queue=QUEUE_CFG))
    runner.start()
    try:

        def finished() -> bool:
            job = store.get(job_id)
            return job is not None and job.state.terminal

        wait_for(finished, 30, "the job to finish", procs.logs)
    finally:
        runner.stop()
    job = store.get(job_id)
    assert job is not None and job.state is JobState.SUCCEEDED and job.attempt == 2
    rows, total = store.results(job_id, 0, 10)
    assert total == 2 and [r["reward"] for r in rows] == [1.0, 1.0]
    assert job.metrics["resolved_rate"] == 1.0
    assert not claims.finish(job_id, "dead-runner", JobState.FAILED, "too late")
    client.close()


class BrokenManager:
    """Stands in for the rollout manager's progress call, which fails unexpectedly."""

    def __init__(self, real: object) -> None:
        self.real = real

    def __getattr__(self, name: str) -> object:
        return getattr(self.real, name)

    def progress(self, batch_id: str) -> object:
        raise RuntimeError(f"progress of {batch_id} is broken")


def test_an_unexpected_error_fails_the_job_not_the_runner(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    store = JobStore(client)
    runner_cfg = RunnerConfig(concurrency=1, poll_interval_s=0.05, lease_ttl_s=5)
    runner = RolloutJobRunner(ApiConfig(redis_url=redis_url, runner=runner_cfg, queue=QUEUE_CFG))
    runner.manager = BrokenManager(runner.manager)  # type: ignore[assignment]
    first = store.submit(JobKind.ROLLOUT, {"instance_ids": ["a"]}, "alice").job_id
    second = store.submit(JobKind.ROLLOUT, {"instance_ids": ["b"]}, "alice").job_id
    runner.start()
    try:

        def both_failed() -> bool:
            jobs = [store.get(first), store.get(second)]
            return all(j is not None and j.state is JobState.FAILED for j in jobs)

        wait_for(both_failed, 20, "both jobs to fail")  # the thread lived on to the second
    finally:
        runner.stop()
    job = store.get(first)
    assert job is not None and "RuntimeError: progress of" in job.message
    assert store.logs(first, 0, 10)[0][-1].level == "ERROR"
    client.close()


def test_a_stopping_runner_gives_its_job_back(redis_url: str, procs: Procs, queue) -> None:  # noqa: F811
    procs.worker(redis_url, "node-a", slots=1)
    wait_nodes(queue, {"node-a"}, procs)
    client = redis.Redis.from_url(redis_url)
    store = JobStore(client)
    job_id = store.submit(JobKind.ROLLOUT, {"instance_ids": ["long.sleep60000"]}, "alice").job_id
    runner_cfg = RunnerConfig(concurrency=1, poll_interval_s=0.1, lease_ttl_s=5, dispatcher=True)
    runner = RolloutJobRunner(ApiConfig(redis_url=redis_url, runner=runner_cfg, queue=QUEUE_CFG))
    runner.start()
    try:

        def running() -> bool:
            job = store.get(job_id)
            return job is not None and job.state is JobState.RUNNING and job.progress.total == 1

        wait_for(running, 20, "the job to run", procs.logs)
    finally:
        runner.stop()
    job = store.get(job_id)
    assert job is not None and job.state is JobState.QUEUED
    assert job.message == "runner stopped: queued"
    claim = JobClaims(client).claim(JobKind.ROLLOUT, GROUP, "next-runner", ttl_s=5, max_active=8)
    assert claim is not None and (claim.job_id, claim.attempt) == (job_id, 2)
    client.close()
