"""The held-out evaluation through the loop (real Redis, manager, simulated worker, a real
adapter and reference engine for the publishes): every ``eval_interval`` steps one request on
the version just published, scored without its aborted trajectories, never trained on; a
resumed run logs the dead run's evaluation exactly once."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from services.manager.client import RolloutManager
from services.queue.submitter import SubmitterQueue
from tests.integration.adapter.conftest import AdapterFactory
from tests.support.execution import Procs, wait_nodes
from tests.support.loop_rollouts import records_for_run, write_records
from tests.support.publishing_loop import publishing_stack
from trainer.config import TrainerConfig
from trainer.loop.config import TrainConfig
from trainer.loop.driver import TrainLoop
from trainer.loop.evaluation import EVAL_FILE
from trainer.loop.metrics import read_jsonl

# simulated-worker directives: solved, unsolved, and an infrastructure failure (never scored);
# the evaluation's tasks take seconds, so the dead run below cannot log its evaluation
HELD_OUT = ["h0.sleep3000.reward1", "h1.sleep3000.reward0", "h2.sleep500.abort"]


@pytest.mark.slow
def test_periodic_evaluation_scores_the_published_version_and_survives_a_resume(
    tmp_path: Path,
    redis_url: str,
    manager: RolloutManager,
    queue: SubmitterQueue,
    procs: Procs,
    adapter: AdapterFactory,
    model_dir: Path,
) -> None:
    budget_s, t0 = 240, time.monotonic()
    procs.worker(redis_url, "n1", slots=4)
    wait_nodes(queue, {"n1"}, procs)
    write_records(redis_url, records_for_run("ev", 20, 2, 2))
    train = TrainConfig(
        run_dir=str(tmp_path / "run"), run_id="ev", steps=4, checkpoint_every=2,
        bootstrap={"prompts": 2, "group_size": 2}, tensorboard=False,
        dataset={"instance_ids": [f"q{n}.sleep50" for n in range(30)], "shuffle": False},
        eval_interval=2, eval={"instance_ids": HELD_OUT, "n_samples": 2},
        rollout={"max_attempts": 1},
    )  # fmt: skip
    trainer = TrainerConfig(model=str(model_dir), algorithm="grpo", batch={"max_policy_lag": 100})
    with publishing_stack(adapter, model_dir, tmp_path / "weights", trainer, manager,
                          redis_url) as stack:  # fmt: skip
        dead = TrainLoop(train, trainer, stack.parts(), resume=False)
        for _ in range(3):  # the evaluation of step 2 is submitted, then "killed"
            dead.step_once()
        assert [p.step for p in dead.evaluator.pending] == [2]
        resumed = TrainLoop(train, trainer, stack.parts(), resume=True)
        assert [p.step for p in resumed.evaluator.pending] == [2]  # adopted, not redone
        resumed.run()
    run = tmp_path / "run"
    evals = read_jsonl(run / EVAL_FILE)
    assert [e["step"] for e in evals] == [2, 4]  # each once
    versions = {r["step"]: r["version"] for r in read_jsonl(run / "metrics.jsonl")}
    for e in evals:
        assert e["eval/version"] == versions[e["step"]]  # the version that step published
        assert e["eval/reward_mean"] == 0.5  # h0's two samples 1, h1's two 0
        assert e["eval/pass_at_n"] == 0.5  # h0 of h0, h1: h2 is never scored
        assert (e["eval/trajectories"], e["eval/aborted"]) == (4.0, 2.0)
    trained = {t for b in read_jsonl(run / "batches.jsonl") for t in b["trajectory_ids"]}
    assert trained and not any("-eval" in t for t in trained)  # never trained on
    assert time.monotonic() - t0 < budget_s
