"""A two-node trainer group on real Redis and the real job API: the leader (node rank 0) waits
for its follower before claiming, the follower runs the same run config with its own command,
a cancel stops both nodes' processes, a crashing follower fails the job at once, and a
follower refuses what it must not run (an invalid run config, a rank another node holds)."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from services.api.store import JobStore
from services.processes import ManagedProcess
from tests.integration.trainer.service.test_service import (
    TERMINAL,
    alive,
    invocations,
    job,
    submit,
)
from tests.support.api_server import ApiServer
from tests.support.execution import wait_for
from trainer.loop.metrics import read_jsonl
from trainer.service.config import TrainerServiceConfig
from trainer.service.follower import TrainerFollower
from trainer.service.nodes import Assignment, NodeDirectory

FOLLOWER_ENV = {"SWERL_STANDIN_ROLE": "follower"}


def follower_runs(tmp: Path, job_id: str) -> list[dict[str, Any]]:
    path = tmp / "runs" / job_id / "invocations-follower.jsonl"
    return read_jsonl(path) if path.is_file() else []


def messages(http: httpx.Client, job_id: str) -> list[str]:
    return [x["message"] for x in http.get(f"/v1/jobs/{job_id}/logs").json()["lines"]]


@pytest.mark.slow
def test_the_leader_waits_for_its_follower_then_both_nodes_run_the_job(
    api: ApiServer, start_service: Callable[..., ManagedProcess], tmp_path: Path
) -> None:
    leader = start_service(nodes=(2, 0))
    with api.client() as http:
        job_id = submit(http, tmp_path, "n", steps=4)
        wait_for(lambda: "waiting for follower nodes [1]" in leader.log_tail(), 30,
                 "the leader to wait", leader.log_tail)  # fmt: skip
        time.sleep(1.0)  # five poll intervals: a leader that does not wait has claimed by now
        assert job(http, job_id)["state"] == "queued"
        follower = start_service(nodes=(2, 1), env=FOLLOWER_ENV)
        wait_for(lambda: job(http, job_id)["state"] in TERMINAL, 60, "the job",
                 lambda: leader.log_tail() + follower.log_tail())  # fmt: skip
        got, lines = job(http, job_id), messages(http, job_id)
        wait_for(lambda: any("node 1: training exited with 0" in m for m in messages(http, job_id)),
                 20, "the follower's exit", follower.log_tail)  # fmt: skip
    assert got["state"] == "succeeded", (got, leader.log_tail())
    run_dir = tmp_path / "runs" / job_id
    # the follower ran the leader's run config, once, with its own command line
    (mine,) = follower_runs(tmp_path, job_id)
    assert mine["config"] == str(run_dir / "run.node1.yaml") and mine["resume"] is False
    assert (run_dir / "run.node1.yaml").read_text() == (run_dir / "run.yaml").read_text()
    assert (run_dir / "attempt-1.node1.log").is_file()
    assert len(invocations(tmp_path, job_id)) == 1  # and the leader its own, once
    rows = read_jsonl(run_dir / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3, 4]  # only rank 0 writes metrics
    assert any("assigned to the group's 2 nodes" in m for m in lines)
    assert any(m.startswith("attempt 1: node 1 (") for m in lines)
    assert leader.running() and follower.running()


@pytest.mark.slow
def test_a_cancel_stops_the_followers_process_too(
    api: ApiServer, start_service: Callable[..., ManagedProcess], tmp_path: Path
) -> None:
    leader = start_service(nodes=(2, 0))
    follower = start_service(nodes=(2, 1), env=FOLLOWER_ENV)
    with api.client() as http:
        job_id = submit(http, tmp_path, "c", steps=1000)
        runs = wait_for(lambda: follower_runs(tmp_path, job_id), 60, "the follower's process",
                        follower.log_tail)  # fmt: skip
        pid = runs[0]["pid"]  # type: ignore[index]
        assert alive(pid)
        assert http.post(f"/v1/jobs/{job_id}/cancel").json()["state"] == "cancelling"
        wait_for(lambda: not alive(pid), 30, "the follower's process to stop", follower.log_tail)
        wait_for(lambda: any("assignment ended" in m for m in messages(http, job_id)), 20,
                 "the follower's log line", follower.log_tail)  # fmt: skip
        got = job(http, job_id)
    assert got["state"] == "cancelled", got
    assert leader.running() and follower.running()  # both serve the next job


@pytest.mark.slow
def test_a_crashing_follower_fails_the_job_at_once(
    api: ApiServer, start_service: Callable[..., ManagedProcess], tmp_path: Path
) -> None:
    leader = start_service(nodes=(2, 0))
    start_service(nodes=(2, 1), env={**FOLLOWER_ENV, "SWERL_STANDIN_EXIT": "3"})
    with api.client() as http:
        job_id = submit(http, tmp_path, "x", steps=1000)  # the leader's part would run ~5 min
        wait_for(lambda: job(http, job_id)["state"] in TERMINAL, 30, "the job to fail",
                 leader.log_tail)  # fmt: skip
        got = job(http, job_id)
    assert got["state"] == "failed", got
    assert got["message"].startswith("a follower node failed: node 1 exited with 3"), got
    # on a loaded machine the follower can fail the job before the leader's process started;
    # a leader process that starts anyway (late) must stop too
    time.sleep(3.0)
    leads = invocations(tmp_path, job_id)
    assert len(leads) <= 1, leads
    for lead in leads:
        wait_for(lambda lead=lead: not alive(lead["pid"]), 10, "the leader's process to stop")


@pytest.mark.slow
def test_a_lost_follower_node_requeues_the_job_and_it_resumes_when_the_node_is_back(
    api: ApiServer, start_service: Callable[..., ManagedProcess], tmp_path: Path
) -> None:
    leader = start_service(nodes=(2, 0))
    first = start_service(nodes=(2, 1), env=FOLLOWER_ENV)
    steps = 20
    with api.client() as http:
        job_id = submit(http, tmp_path, "lost", steps=steps)
        wait_for(lambda: (job(http, job_id)["progress"]["current_step"] or 0) >= 3, 60,
                 "step 3", leader.log_tail)  # fmt: skip
        (lead,) = invocations(tmp_path, job_id)
        os.kill(first.pid, signal.SIGKILL)  # the node's service dies; its process with it
        first.popen.wait(timeout=10)
        # its presence expires (3 s): the leader stops its own process, the job waits in line
        wait_for(lambda: job(http, job_id)["state"] == "queued", 30, "the requeue",
                 leader.log_tail)  # fmt: skip
        assert "follower node(s) [1] lost" in job(http, job_id)["message"]
        wait_for(lambda: not alive(lead["pid"]), 10, "the leader's process to stop")
        time.sleep(1.0)  # without its follower the leader must not claim it again
        assert job(http, job_id)["state"] == "queued"
        start_service(nodes=(2, 1), env=FOLLOWER_ENV)  # the node is back
        wait_for(lambda: job(http, job_id)["state"] in TERMINAL, 60, "the resumed job",
                 leader.log_tail)  # fmt: skip
        got = job(http, job_id)
    assert got["state"] == "succeeded" and got["attempt"] == 2, got
    runs = invocations(tmp_path, job_id)
    assert [r["resume"] for r in runs] == [False, True] and runs[1]["start_step"] >= 3
    assert [r["resume"] for r in follower_runs(tmp_path, job_id)] == [False, True]
    rows = read_jsonl(tmp_path / "runs" / job_id / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(1, steps + 1))  # each step once


@pytest.fixture
def client(redis_url: str) -> Iterator[redis.Redis]:
    c = redis.Redis.from_url(redis_url)
    yield c
    c.close()


def follower(tmp_path: Path, client: redis.Redis) -> TrainerFollower:
    cfg = TrainerServiceConfig(nnodes=2, node_rank=1, runs_dir=str(tmp_path / "runs"),
                               command=["/bin/false"], poll_interval_s=0.1)  # fmt: skip
    return TrainerFollower(cfg, client)


def test_a_follower_refuses_an_invalid_run_config_and_reports_it(
    tmp_path: Path, client: redis.Redis
) -> None:
    node = follower(tmp_path, client)
    bad = Assignment(job_id="job-bad", attempt=1, config="train: {steps: -1}\n")
    NodeDirectory(client, "swerl:api:", "default").assign(bad, ttl_s=30)
    node.poll_once()
    assert node.done == ("job-bad", 1)  # handled once, not retried every poll
    lines = [line.message for line in JobStore(client, "swerl:api:").logs("job-bad", 0, 10)[0]]
    assert any("node 1: the run config is invalid here" in m and "train" in m for m in lines)
    # the leader sees the failure through the exit records
    assert NodeDirectory(client, "swerl:api:", "default").failed_followers("job-bad", 1) == {1: 127}
    assert not (tmp_path / "runs" / "job-bad" / "attempt-1.node1.log").exists()  # nothing ran


def test_a_follower_does_not_run_while_another_node_holds_its_rank(
    tmp_path: Path, client: redis.Redis
) -> None:
    nodes = NodeDirectory(client, "swerl:api:", "default")
    assert nodes.announce(1, "the-other-node", ttl_s=30) is None
    nodes.assign(Assignment(job_id="job-1", attempt=1, config="train: {}\n"), ttl_s=30)
    node = follower(tmp_path, client)
    node.poll_once()
    assert node.done is None and not (tmp_path / "runs").exists()
    assert "is held by the-other-node" in (node.status or "")
