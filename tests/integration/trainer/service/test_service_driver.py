"""The trainer service with the real training driver (``python -m trainer train``): a train
job submitted through the API runs Li2SAO's bootstrap on the tiny model, against real Redis,
``python -m services.manager`` and a simulated ``python -m sandbox_worker`` (the test writes the
token records into the store first, as the loop's own tests do), and ends succeeded with the
driver's progress and reward."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from services.processes import ManagedProcess
from services.queue.submitter import SubmitterQueue
from tests.support.api_server import ApiServer
from tests.support.execution import Procs, wait_for, wait_nodes
from tests.support.loop_rollouts import records_for_run, write_records
from trainer.checkpoint import latest_checkpoint
from trainer.loop.metrics import read_jsonl

STEPS = 2


@pytest.mark.slow
def test_a_train_job_runs_the_real_driver(
    api: ApiServer,
    start_service: Callable[..., ManagedProcess],
    redis_url: str,
    queue: SubmitterQueue,
    procs: Procs,
    model_dir: Path,
    tmp_path: Path,
) -> None:
    budget_s, t0 = 240, time.monotonic()
    procs.manager(redis_url)
    procs.worker(redis_url, "n1", slots=4)
    wait_nodes(queue, {"n1"}, procs)
    dataset = tmp_path / "ids.txt"
    dataset.write_text("".join(f"p{n}.sleep{60 + 20 * (n % 3)}\n" for n in range(40)))
    body = {"model": str(model_dir), "dataset": str(dataset), "steps": STEPS,
            "batch": {"prompts_per_step": 2, "samples_per_prompt": 2},
            "checkpoint_dir": str(tmp_path / "ckpt")}  # fmt: skip
    with api.client() as http:
        job_id = http.post("/v1/jobs/train", json=body).json()["id"]
        write_records(redis_url, records_for_run(job_id, 20, 2, 2))  # the loop's batch ids
        base = {"train": {"publish": False, "tensorboard": False,
                          "dataset": {"shuffle": False},
                          "rollout": {"max_attempts": 1, "wait_timeout_s": 120}},
                "trainer": {"batch": {"max_policy_lag": 1000}}}  # fmt: skip
        service = start_service(command=[sys.executable, "-m", "trainer", "train"], base=base)
        wait_for(lambda: http.get(f"/v1/jobs/{job_id}").json()["state"] not in
                 ("queued", "running"), 200, "the train job", service.log_tail)  # fmt: skip
        got = http.get(f"/v1/jobs/{job_id}").json()
    run = tmp_path / "runs" / job_id
    log = (run / "attempt-1.log").read_text() if (run / "attempt-1.log").exists() else ""
    assert got["state"] == "succeeded", (got, log[-3000:])
    rows = read_jsonl(run / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    assert got["progress"] == {"done": STEPS, "total": STEPS, "current_step": STEPS,
                               "phase": rows[-1]["phase"]}  # fmt: skip
    assert rows[-1]["phase"] == "bootstrap" and rows[-1]["loop/group_size"] == 2
    assert got["metrics"]["reward/mean"] == rows[-1]["reward/mean"]
    assert latest_checkpoint(tmp_path / "ckpt") == (tmp_path / "ckpt" / f"step-{STEPS}").resolve()
    assert time.monotonic() - t0 < budget_s
