"""One-phase schedules through the loop (real Redis, manager, simulated worker, torch backend):
LiSAO streams single rollouts from the start, its first steps critic-only (no version moves)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import redis

from services.manager.client import RolloutManager
from services.queue.submitter import SubmitterQueue
from tests.support.execution import Procs, wait_nodes
from tests.support.loop_rollouts import records_for_run, write_records
from trainer.backends import create_backend
from trainer.config import TrainerConfig
from trainer.loop.config import TrainConfig
from trainer.loop.driver import LoopParts, TrainLoop
from trainer.loop.metrics import read_jsonl


@pytest.mark.slow
def test_lisao_streams_single_rollouts_after_critic_only_warmup(
    tmp_path: Path,
    redis_url: str,
    manager: RolloutManager,
    queue: SubmitterQueue,
    procs: Procs,
    model_dir: Path,
) -> None:
    budget_s, t0 = 180, time.monotonic()  # measured 15 s on the loaded 2-core machine
    procs.worker(redis_url, "n1", slots=4)
    wait_nodes(queue, {"n1"}, procs)
    write_records(redis_url, records_for_run("ls", 20, 3, 1))
    train = TrainConfig(
        run_dir=str(tmp_path / "run"), run_id="ls", steps=4, critic_warmup_steps=2,
        single={"batch_size": 3, "in_flight": 6}, publish=False, tensorboard=False,
        dataset={"instance_ids": [f"q{n}.sleep{50 + 30 * (n % 4)}" for n in range(40)]},
    )  # fmt: skip
    trainer = TrainerConfig(model=str(model_dir), algorithm="lisao", batch={"max_policy_lag": 100})
    store = redis.Redis.from_url(redis_url, decode_responses=False)
    try:
        loop = TrainLoop(
            train, trainer, LoopParts(create_backend(trainer), manager, store), resume=False
        )
        assert loop.phases.schedule == "single" and loop.phases.gate is None
        loop.run()
    finally:
        store.close()
    rows = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert [r["phase"] for r in rows] == ["single"] * 4
    assert [r["loop/group_size"] for r in rows] == [1] * 4
    assert [r["version"] for r in rows] == [0, 0, 1, 2]  # two critic-only steps, then the actor
    assert [r["actor/estimator_is_grpo"] for r in rows] == [0] * 4
    assert all("gate/counter" not in r for r in rows)
    assert time.monotonic() - t0 < budget_s
