"""A rollout job end to end: the ``swerl`` CLI -> the job API (its job runner) -> the rollout
manager (``python -m services.manager``) -> a sandbox worker (``python -m sandbox_worker``,
the SIMULATED runner: no sandbox, the instance id sets duration and reward) -> results back
through the API. All real processes over one real Redis."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest

from tests.support.api_server import TOKENS, ApiServer, start_api
from tests.support.execution import (  # noqa: F401 (fixtures)
    HEARTBEAT_TTL_S,
    Procs,
    procs,
    queue,
    wait_for,
    wait_nodes,
)
from tests.support.paths import REPO_ROOT

pytestmark = pytest.mark.slow


@pytest.fixture
def stack(redis_url: str, procs: Procs, queue) -> Iterator[ApiServer]:  # noqa: F811
    env = {"SWERL_API__RUNNER__POLL_INTERVAL_S": "0.2",
           "SWERL_API__QUEUE__HEARTBEAT_TTL_S": str(HEARTBEAT_TTL_S)}  # fmt: skip
    api = start_api(redis_url, procs.tmp, runner_threads=2, env=env)
    procs.manager(redis_url)
    procs.worker(redis_url, "node-a", slots=4)
    wait_nodes(queue, {"node-a"}, procs)
    yield api
    api.stop()


def swerl(api: ApiServer, *argv: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "services.swerl_cli", "--api", api.url, *argv]
    env = {"SWERL_API_TOKEN": TOKENS["alice"][0], "PATH": "/usr/bin:/bin"}
    return subprocess.run(cmd, capture_output=True, text=True, cwd=REPO_ROOT, env=env, timeout=120)


def test_rollout_job_through_api_manager_and_worker(stack: ApiServer, procs: Procs) -> None:  # noqa: F811
    done = swerl(stack, "submit", "rollout", "--instances",
                 "t1.sleep200.reward1,t2.sleep200.reward0", "--samples", "2", "--wait")  # fmt: skip
    assert done.returncode == 0, done.stderr + procs.logs()
    job_id = done.stdout.split()[0]
    assert "4/4 succeeded" in done.stdout and "completed 4" in done.stdout
    with stack.client("viewer") as http:
        job = http.get(f"/v1/jobs/{job_id}").json()
        rows = http.get(f"/v1/jobs/{job_id}/results").json()["results"]
    assert job["state"] == "succeeded" and job["attempt"] == 1
    assert job["metrics"] == {"n_completed": 4.0, "mean_reward": 0.5, "resolved_rate": 0.5}
    rewards = sorted((r["instance_id"], r["sample_index"], r["reward"]) for r in rows)
    assert rewards == [
        ("t1.sleep200.reward1", 0, 1.0),
        ("t1.sleep200.reward1", 1, 1.0),
        ("t2.sleep200.reward0", 0, 0.0),
        ("t2.sleep200.reward0", 1, 0.0),
    ]
    assert {r["node"] for r in rows} == {"node-a"}
    assert len({r["trajectory_id"] for r in rows}) == 4


def test_cancel_stops_a_running_rollout(stack: ApiServer, procs: Procs) -> None:  # noqa: F811
    sub = swerl(stack, "submit", "rollout", "--instances", "slow.sleep60000")
    job_id = sub.stdout.split()[0]
    with stack.client("alice") as http:

        def running() -> bool:
            job = http.get(f"/v1/jobs/{job_id}").json()
            return job["progress"]["total"] == 1 and job["state"] == "running"

        wait_for(running, 30, "the job to run", procs.logs)
        assert swerl(stack, "cancel", job_id).returncode == 0
        watched = swerl(stack, "status", job_id, "--watch")
        assert watched.returncode == 6, watched.stdout + procs.logs()
        job = http.get(f"/v1/jobs/{job_id}").json()
        assert job["state"] == "cancelled" and job["finished_at"] - job["created_at"] < 30
        logs = [ln["message"] for ln in http.get(f"/v1/jobs/{job_id}/logs").json()["lines"]]
    assert any(m.startswith("cancelled: 1 unfinished tasks stopped") for m in logs), logs
