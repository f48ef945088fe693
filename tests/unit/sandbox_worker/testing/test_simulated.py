"""The SIMULATED runner (test machinery) and its directive language."""

from __future__ import annotations

import logging
import statistics
import threading
import time

import pytest

from sandbox_worker.config import SimulatedRunnerConfig
from sandbox_worker.runner import CancelToken, RunContext, TrajectoryRunner
from sandbox_worker.testing.simulated import SimulatedRunner, parse_directives
from services.protocol import RolloutTask
from services.protocol.trajectory import OutcomeStatus


def task(instance: str = "i", attempt: int = 1, tid: str = "b:0:0") -> RolloutTask:
    return RolloutTask(
        task_id=tid, batch_id="b", group_id="g", instance_id=instance, attempt=attempt
    )


def ctx(token: CancelToken | None = None) -> RunContext:
    return RunContext(node="n", cancel=token or CancelToken(), log=logging.getLogger("t"))


def test_directives_from_the_instance_id() -> None:
    d = parse_directives("repo.sleep250.abort2.reward0.timeout")
    assert (d.sleep_s, d.abort_attempts, d.reward, d.status) == (
        0.25,
        2,
        0.0,
        OutcomeStatus.TIMEOUT,
    )
    assert parse_directives("x.abort").abort_attempts == -1
    plain = parse_directives("django__django-11099")
    assert (plain.sleep_s, plain.abort_attempts, plain.reward, plain.crash) == (
        None,
        0,
        None,
        False,
    )
    assert parse_directives("a.raise").crash and parse_directives("a.error").status == "error"


def test_simulated_runner_outcomes() -> None:
    runner = SimulatedRunner(SimulatedRunnerConfig(reward=1.0))
    assert isinstance(runner, TrajectoryRunner)
    ok = runner.run(task("x.reward0"), ctx())
    assert (ok.status, ok.reward) == (OutcomeStatus.COMPLETED, 0.0)
    assert runner.run(task("x.timeout"), ctx()).status is OutcomeStatus.TIMEOUT
    failed = runner.run(task("x.abort1", attempt=1), ctx())
    assert failed.status is OutcomeStatus.ABORTED and failed.reward is None
    assert failed.abort_reason == "simulated infrastructure failure (attempt 1)"
    assert runner.run(task("x.abort1", attempt=2), ctx()).status is OutcomeStatus.COMPLETED
    with pytest.raises(RuntimeError, match="simulated runner crash"):
        runner.run(task("x.raise"), ctx())


def test_simulated_runner_stops_promptly_on_cancel() -> None:
    runner = SimulatedRunner(SimulatedRunnerConfig())
    tok = CancelToken()
    threading.Timer(0.1, tok.cancel, args=("cancelled",)).start()
    t0 = time.monotonic()
    out = runner.run(task("x.sleep30000"), ctx(tok))
    assert time.monotonic() - t0 < 2
    assert (out.status, out.abort_reason, out.reward) == (OutcomeStatus.ABORTED, "cancelled", None)


def test_lognormal_durations_are_deterministic_per_task_and_seed() -> None:
    cfg = SimulatedRunnerConfig(lognormal_median_s=2.0, lognormal_sigma=1.0, seed=7)
    runner = SimulatedRunner(cfg)
    d = parse_directives("plain")
    values = [runner.duration_for(task(tid=f"b:{k}:0"), d) for k in range(4000)]
    assert values[:5] == [runner.duration_for(task(tid=f"b:{k}:0"), d) for k in range(5)]
    assert 1.8 < statistics.median(values) < 2.2  # median of LogNormal(ln 2, 1) is 2
    assert max(values) / min(values) > 100  # long-tailed
    other = SimulatedRunner(cfg.model_copy(update={"seed": 8}))
    assert other.duration_for(task(tid="b:0:0"), d) != values[0]
    assert runner.duration_for(task("x.sleep5"), parse_directives("x.sleep5")) == 0.005
