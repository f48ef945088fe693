"""TEST MACHINERY: the SIMULATED trajectory runner (see :mod:`sandbox_worker.testing`).

:class:`SimulatedRunner` stands for :class:`sandbox_worker.sandbox_runner.SandboxTrajectoryRunner`
behind the same :class:`~sandbox_worker.runner.TrajectoryRunner` protocol, with no sandbox, no
agent and no tests: it sleeps, honours the cancel token, and returns the outcome the task's
instance id asks for (:class:`SimulatedDirectives`). The worker runs it with
``--backend simulated`` (scheduling tests, benchmarks); its durations otherwise follow
``WorkerConfig.simulated`` (fixed, or a seeded log-normal per task).
"""

from __future__ import annotations

import hashlib
import math
import random
import time
from dataclasses import dataclass

from sandbox_worker.config import SimulatedRunnerConfig
from sandbox_worker.runner import CANCELLED, RunContext
from sandbox_worker.testing.probe import SimulatedProbe
from services.protocol.tasks import RolloutTask
from services.protocol.trajectory import Outcome, OutcomeStatus


@dataclass(frozen=True)
class SimulatedDirectives:
    """Behaviour requested through dot-separated tokens of the instance id (other tokens are
    ignored): ``sleep<ms>`` run that long; ``abort`` every attempt fails as infrastructure;
    ``abort<k>`` attempts 1..k fail, later ones succeed; ``reward0``/``reward1`` the reward;
    ``timeout``/``error`` that outcome status; ``raise`` the runner raises an exception.
    Example: ``task7.sleep250.abort1``."""

    sleep_s: float | None = None
    abort_attempts: int = 0  # -1: every attempt
    reward: float | None = None
    status: OutcomeStatus | None = None
    crash: bool = False


def parse_directives(instance_id: str) -> SimulatedDirectives:
    sleep_s: float | None = None
    abort = 0
    reward: float | None = None
    status: OutcomeStatus | None = None
    crash = False
    for tok in instance_id.split("."):
        if tok.startswith("sleep") and tok[5:].isdigit():
            sleep_s = int(tok[5:]) / 1000.0
        elif tok == "abort":
            abort = -1
        elif tok.startswith("abort") and tok[5:].isdigit():
            abort = int(tok[5:])
        elif tok in ("reward0", "reward1"):
            reward = float(tok[-1])
        elif tok == "timeout":
            status = OutcomeStatus.TIMEOUT
        elif tok == "error":
            status = OutcomeStatus.ERROR
        elif tok == "raise":
            crash = True
    return SimulatedDirectives(sleep_s, abort, reward, status, crash)


class SimulatedRunner:
    """A runner that only sleeps (SIMULATED: no sandbox, no agent, no tests are involved)."""

    def __init__(self, cfg: SimulatedRunnerConfig, probe: SimulatedProbe | None = None) -> None:
        self.cfg = cfg
        self.probe = probe

    def duration_for(self, task: RolloutTask, directives: SimulatedDirectives) -> float:
        if directives.sleep_s is not None:
            return directives.sleep_s
        if self.cfg.lognormal_median_s is None:
            return self.cfg.duration_s
        digest = hashlib.sha256(f"{self.cfg.seed}:{task.task_id}".encode()).digest()
        rng = random.Random(int.from_bytes(digest[:8], "little"))
        value = rng.lognormvariate(math.log(self.cfg.lognormal_median_s), self.cfg.lognormal_sigma)
        return min(value, self.cfg.max_duration_s)

    def run(self, task: RolloutTask, ctx: RunContext) -> Outcome:
        d = parse_directives(task.instance_id)
        duration = self.duration_for(task, d)
        t0 = self.probe.started(ctx.node, task) if self.probe else time.time()
        cancelled = ctx.cancel.wait(duration) if duration > 0 else ctx.cancel.is_set()
        elapsed = time.time() - t0
        if cancelled:
            outcome = Outcome(
                status=OutcomeStatus.ABORTED,
                abort_reason=ctx.cancel.reason or CANCELLED,
                durations={"run": elapsed},
            )
        elif d.abort_attempts == -1 or task.attempt <= d.abort_attempts:
            outcome = Outcome(
                status=OutcomeStatus.ABORTED,
                abort_reason=f"simulated infrastructure failure (attempt {task.attempt})",
                durations={"run": elapsed},
            )
        else:
            reward = self.cfg.reward if d.reward is None else d.reward
            outcome = Outcome(
                status=d.status or OutcomeStatus.COMPLETED,
                reward=reward,
                n_turns=1,
                durations={"run": elapsed},
            )
        if self.probe:
            self.probe.ended(ctx.node, task, t0, outcome)
        if d.crash and not cancelled:
            raise RuntimeError("simulated runner crash")
        return outcome
