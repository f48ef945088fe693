"""``python -m trainer train`` on the real stack (Redis, ``python -m services.manager``, a
simulated ``python -m sandbox_worker``, the tiny model on the torch backend, and on the megatron
backend as two pipeline stages): Li2SAO's switch,
then a SIGKILL and ``--resume``: every step exactly once, the same phases, nothing trained twice,
the dead run's in-flight requests cancelled; ``python -m trainer report`` on the finished run.

The simulated worker writes no token records: the test writes every task's record into the
trajectory store first (two turns of version 0, so ``max_policy_lag`` is raised here; the lag
filter has its own tests). Publishing is off (no adapter in this test).
"""

from __future__ import annotations

import json
import re
import signal
import sys
import time
from pathlib import Path

import pytest
import yaml

from services.manager.client import RolloutManager
from services.processes import ManagedProcess, launch
from services.queue.models import BatchState
from services.queue.submitter import SubmitterQueue
from tests.support.execution import Procs, wait_for, wait_nodes
from tests.support.loop_rollouts import records_for_run, write_records
from tests.support.paths import REPO_ROOT
from trainer.loop.metrics import read_jsonl
from trainer.report.cli import main as report_main

# No shuffling: request k draws p(2k), p(2k+1). Bootstrap requests r0-r3 (p0-p7) are sent by
# step 2 whatever the timing (each taken batch frees 4 of the budget of 8), the first single
# requests r4, r5 (p8-p11) right after the switch. p1 always aborts. p11 runs for a minute: the
# dead run still has it running when the resumed run starts (and cancels it), and the resumed
# run draws it again in the single phase, where a straggler blocks nothing (its draining
# request, which replaces the cancelled prefetched one, is p8, p9).
IDS = [f"p{n}.sleep{100 + 40 * (n % 5)}" for n in range(40)]
IDS[1] += ".abort"
IDS[11] = "p11.sleep60000"
STEPS = 6


# The trainer backends under test: the torch backend (FSDP2 under two ranks), and the megatron
# backend with the tiny model's two layers as two pipeline stages (each rank its stage's shard).
BACKENDS = {
    "torch": {},
    "megatron-pp2": {"backend": "megatron", "megatron": {"pipeline_parallel": 2}},
}


def run_config(tmp: Path, redis_url: str, model_dir: Path, backend: str = "torch") -> Path:
    sections = {
        "train": {
            "run_dir": str(tmp / "run"),
            "run_id": "t",
            "steps": STEPS,
            "bootstrap": {"prompts": 2, "group_size": 2},
            "single": {"batch_size": 2, "in_flight": 4},
            "gate": {"t_min": 0, "t_max": 2},  # toy window: the switch comes after step 2
            "checkpoint_every": 2,
            "publish": False,
            "dataset": {"instance_ids": IDS, "shuffle": False},
            "rollout": {"max_attempts": 1, "wait_timeout_s": 120},
        },
        "trainer": {
            "model": str(model_dir),
            "algorithm": "li2sao",
            "batch": {"max_policy_lag": 1000},
            "checkpoint": {"keep_last": 2},
            **BACKENDS[backend],
        },
        "manager": {"redis_url": redis_url},
    }
    path = tmp / "run.yaml"
    path.write_text(yaml.safe_dump(sections))
    return path


def trainer(tmp: Path, config: Path, nproc: int, *args: str) -> ManagedProcess:
    """``python -m trainer train``; with ``nproc > 1`` under torchrun (rank 0 drives)."""
    ranks = ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]
    argv = [sys.executable, *(ranks if nproc > 1 else []), "-m", "trainer", "train",
            "--config", str(config), *args]  # fmt: skip
    return launch("trainer", argv, tmp / f"trainer{len(args)}.log", cwd=REPO_ROOT, grace_s=0)


def steps_logged(run: Path) -> list[int]:
    return [row["step"] for row in read_jsonl(run / "metrics.jsonl")]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("nproc", "backend"),
    [(1, "torch"), (2, "torch"), (2, "megatron-pp2")],
    ids=["one-process", "two-ranks", "megatron-two-stages"],
)
def test_li2sao_switch_kill_and_resume(
    tmp_path: Path, redis_url: str, queue: SubmitterQueue, procs: Procs, model_dir: Path,
    nproc: int, backend: str,
) -> None:  # fmt: skip
    """Two ranks (torchrun, gloo): the same run; the kill takes every rank, the resume loads
    the sharded checkpoint on both (rank 0 broadcasts the load): FSDP2 shards of the torch
    backend, or the megatron backend's two pipeline stages."""
    budget_s = 300  # measured 59-73 s on the loaded 2-core machine (two trainer start-ups)
    t0 = time.monotonic()
    procs.manager(redis_url)
    procs.worker(redis_url, "n1", slots=4)
    wait_nodes(queue, {"n1"}, procs)
    write_records(redis_url, records_for_run("t", 40, 2, 2))
    config, run = run_config(tmp_path, redis_url, model_dir, backend), tmp_path / "run"

    first = trainer(tmp_path, config, nproc)
    try:
        wait_for(lambda: 3 in steps_logged(run), 180, "step 3 of the first run", first.log_tail)
        first.signal_group(signal.SIGKILL)  # the trainer (under torchrun: every rank) dies
        first.popen.wait(timeout=10)
    finally:
        first.stop(grace_s=0)
    ckpts = sorted((run / "checkpoints").glob("step-*/manifest.json"))
    state = json.loads(ckpts[-1].read_text())["extra"]["loop"]
    killed_step, dead_seq = state["step"], state["collector"]["seq"]
    assert killed_step in (2, 4)

    second = trainer(tmp_path, config, nproc, "--resume")
    try:
        wait_for(lambda: second.popen.poll() is not None, 180, "the resumed run", second.log_tail)
    finally:
        second.stop(grace_s=0)
    assert second.popen.returncode == 0, second.log_tail()

    if nproc > 1:  # one driver; rank 1 loaded the checkpoint with it and trained to the end
        assert "rank 0 of 2: driving" in second.log()
        assert re.search(r"rank 1: stop after \d+ calls", second.log()), second.log_tail()
        manifest = json.loads((run / "checkpoints" / f"step-{STEPS}" / "manifest.json").read_text())
        assert {"rng-0.pt", "rng-1.pt"} <= set(manifest["files"])
        assert manifest["backend"] == backend.split("-")[0]
    rows = read_jsonl(run / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))  # no step lost or twice
    assert [r["phase"] for r in rows] == ["bootstrap"] * 2 + ["draining"] + ["single"] * 3
    assert [r["loop/group_size"] for r in rows] == [2, 2, 2, 1, 1, 1]
    # the estimator follows the batch: GRPO for groups (the prefetched batch too), then GAE
    assert [r["actor/estimator_is_grpo"] for r in rows] == [1, 1, 1, 0, 0, 0]
    assert ["critic/rank_loss" in r for r in rows] == [True, True] + [False] * 4
    assert rows[-1]["gate/switch_step"] == 2 and rows[-1]["version"] == STEPS
    batches = read_jsonl(run / "batches.jsonl")
    assert [b["step"] for b in batches] == list(range(1, STEPS + 1))
    for b in batches:
        assert set(b["group_sizes"]) == {b["group_size"]}  # a batch never mixes sizes
    trained = [t for b in batches for t in b["trajectory_ids"]]
    assert len(trained) == len(set(trained))  # no trajectory trained twice
    assert not any(t.startswith("t-r00000:1:") for t in trained)  # the aborted prompt

    # every request of the dead run (in flight at its checkpoint, or sent after it) was
    # cancelled by the resume (or had finished), and none reaches a step after the checkpoint
    assert f"resumed from {run / 'checkpoints'}/step-{killed_step}" in second.log()
    after = [t for b in batches[killed_step:] for t in b["trajectory_ids"]]
    first_new = min(b for batch in batches[killed_step:] for b in batch["batch_ids"])
    dead = set(state["collector"]["active"])
    dead |= {b for b in queue.batch_ids() if f"t-r{dead_seq:05d}" <= b < first_new}
    assert any(b >= f"t-r{dead_seq:05d}" for b in dead)  # the dead run had sent more
    cancelled = re.search(r"cancelled (\d+) tasks of the dead run", second.log())
    assert cancelled and int(cancelled[1]) >= 1  # p11 at least was still running
    mgr = RolloutManager(redis_url)
    try:
        states = {b: mgr.progress(b).state for b in sorted(dead)}
        assert set(states.values()) <= {BatchState.CANCELLED, BatchState.DONE}
        assert BatchState.CANCELLED in states.values()
        for batch_id in dead:
            assert not any(t.startswith(batch_id + ":") for t in after), batch_id
    finally:
        mgr.close()

    # the report of the finished run: every record is of version 0, so the lag of step k is
    # its trainer version k - 1 (steps 1-2: 0, 1; after the switch, steps 3-6: 2..5)
    assert report_main([str(run)]) == 0
    summary = (run / "report.txt").read_text()
    assert "steps: 6 (steps 1-6; phases: bootstrap 2, draining 1, single 3)" in summary
    assert "switch: after step 2" in summary
    assert "before the switch (steps <= 2): mean 0.50, max 1 (2 steps)" in summary
    assert "after the switch (steps > 2): mean 3.50, max 5 (4 steps)" in summary
    assert (run / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert time.monotonic() - t0 < budget_s
