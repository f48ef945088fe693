"""A train job across two "nodes": two trainer services of one group on this machine (node rank
0, the leader, and node rank 1, a follower; the runs dir shared as on a cluster), each running
``torchrun --nnodes=2 --node-rank=R --nproc-per-node=1 -m trainer train`` on the real toy
stack. The leader claims, the follower joins; one driver trains, the follower's rank makes
every backend call, the checkpoint holds both ranks' shards, and the job succeeds."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from services.processes import free_port
from services.swerl_cli.client import ApiClient
from services.toy_train_job import start_job_services, start_trainer_service
from tests.support.toy_jobs import toy_job_stack
from trainer.checkpoint import read_manifest

pytestmark = pytest.mark.slow

STEPS = 2


def node_env(base: dict[str, str], rank: int, port: int) -> dict[str, str]:
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2",
                f"--node-rank={rank}", "--nproc-per-node=1", "--master-addr=127.0.0.1",
                f"--master-port={port}", "-m", "trainer", "train"]  # fmt: skip
    return {**base, "SWERL_TRAINER_SERVICE__NNODES": "2",
            "SWERL_TRAINER_SERVICE__NODE_RANK": str(rank),
            "SWERL_TRAINER_SERVICE__COMMAND": json.dumps(torchrun)}  # fmt: skip


def test_a_job_spans_two_nodes_with_one_driver(tmp_path: Path) -> None:
    with toy_job_stack(tmp_path, STEPS) as toy:
        stack, run_dir = toy.stack, toy.run_dir
        port = free_port()
        leader = node_env(toy.env, 0, port)
        url = start_job_services(stack, run_dir, toy.base, toy.redis_url, leader, toy.token)
        api = ApiClient(url, toy.token)
        job_id = api.submit("train", toy.spec, None)["id"]
        time.sleep(2.0)  # the leader polls every 0.5 s: without its follower it must not claim
        assert api.job(job_id)["state"] == "queued"
        start_trainer_service(stack, "trainer-follower", run_dir, toy.redis_url,
                              node_env(toy.env, 1, port))  # fmt: skip
        deadline = time.monotonic() + 300
        while api.job(job_id)["state"] not in ("succeeded", "failed", "cancelled"):
            assert time.monotonic() < deadline, "the job did not end within 300 s"
            time.sleep(0.5)
        job = api.job(job_id)
        deadline = time.monotonic() + 30  # the follower logs its exit after the leader's end
        lines: list[str] = []
        while not any("node 1: training exited" in m for m in lines):
            assert time.monotonic() < deadline, lines
            time.sleep(0.5)
            lines = [x["message"] for x in api.logs(job_id, 0)[0]]
        api.close()
    job_dir = run_dir / "jobs" / job_id
    leader_log = (job_dir / "attempt-1.log").read_text()
    follower_log = (job_dir / "attempt-1.node1.log").read_text()
    assert job["state"] == "succeeded", (job, leader_log[-2000:], follower_log[-2000:])
    assert "rank 0 of 2: driving" in leader_log
    assert "rank 1 of 2: following rank 0" in follower_log
    # a train step, an export and the publish's logprob probe per step, the final checkpoint
    assert f"rank 1: stop after {3 * STEPS + 1} calls" in follower_log
    assert any("node 1: training exited with 0" in m for m in lines), lines
    rows = [json.loads(line) for line in (job_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    files = set(read_manifest(toy.checkpoints / f"step-{STEPS}")["files"])
    assert {"rng-0.pt", "rng-1.pt"} <= files
