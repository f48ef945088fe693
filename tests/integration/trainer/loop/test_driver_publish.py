"""The loop publishing every version through a real adapter to a real reference engine, and a
resume after the dead run published past its checkpoint (and exported one more version it was
killed before serving): the restored weights are published as a new version above both, never
under a number the engines already had or a directory that exists.

Rollouts come from the simulated worker with records the test writes (version 0); publishing
goes the real way: export v<N>/, POST /admin/weights, the engine loads it.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import pytest
import torch

from services.manager.client import RolloutManager
from services.queue.submitter import SubmitterQueue
from tests.integration.adapter.conftest import AdapterFactory
from tests.support.execution import Procs, wait_nodes
from tests.support.loop_rollouts import records_for_run, write_records
from tests.support.publishing_loop import publishing_stack
from trainer.config import TrainerConfig
from trainer.loop.config import TrainConfig
from trainer.loop.driver import TrainLoop
from trainer.loop.metrics import read_jsonl
from trainer.publish.versions import export_version


def engine_version(url: str) -> str:
    return str(httpx.get(f"{url}/model_info", timeout=30).json()["weight_version"])


@pytest.mark.slow
def test_every_step_publishes_and_a_resume_publishes_above_the_served_version(
    tmp_path: Path,
    redis_url: str,
    manager: RolloutManager,
    queue: SubmitterQueue,
    procs: Procs,
    adapter: AdapterFactory,
    model_dir: Path,
) -> None:
    budget_s, t0 = 180, time.monotonic()  # measured 19 s on the loaded 2-core machine
    procs.worker(redis_url, "n1", slots=4)
    wait_nodes(queue, {"n1"}, procs)
    write_records(redis_url, records_for_run("pub", 20, 2, 2))
    train = TrainConfig(
        run_dir=str(tmp_path / "run"), run_id="pub", steps=4, checkpoint_every=2,
        bootstrap={"prompts": 2, "group_size": 2}, tensorboard=False,
        dataset={"instance_ids": [f"q{n}.sleep50" for n in range(30)], "shuffle": False},
    )  # fmt: skip
    trainer = TrainerConfig(model=str(model_dir), algorithm="grpo", batch={"max_policy_lag": 100})
    weights = tmp_path / "weights"
    with publishing_stack(adapter, model_dir, weights, trainer, manager,
                          redis_url) as stack:  # fmt: skip
        dead = TrainLoop(train, trainer, stack.parts(), resume=False)
        for _ in range(3):  # three steps, a checkpoint after step 2, then "killed"
            dead.step_once()
            assert engine_version(stack.engine_url) == str(dead.backend.version)
        assert dead.backend.version == 3
        # ... and killed after exporting version 4, before the adapter refreshed to it: v4/
        # holds other weights than the checkpoint's and no engine ever served it
        with torch.no_grad():
            next(dead.backend.actor.parameters()).add_(1.0)  # surely not the checkpoint's
        orphan = export_version(dead.backend, weights, 4)
        orphan_sha = json.loads((orphan / "manifest.json").read_text())["weights_sha256"]

        resumed = TrainLoop(train, trainer, stack.parts(), resume=True)
        # restored at version 2 while the engine serves 3 and v4/ exists: published as 5
        assert resumed.step == 2 and resumed.backend.version == 5
        assert engine_version(stack.engine_url) == "5"
        assert json.loads((orphan / "manifest.json").read_text())["weights_sha256"] == orphan_sha
        resumed.run()
        assert engine_version(stack.engine_url) == "7"
    rows = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert [r["version"] for r in rows] == [1, 2, 6, 7]
    assert all(r["publish/total"] > 0 for r in rows)  # every step published
    assert time.monotonic() - t0 < budget_s
