"""Periodic held-out evaluation (``train.eval_interval``, section ``train.eval``).

After every ``eval_interval``-th step, once its version is published, :class:`PeriodicEval`
submits one rollout request over the held-out instances (``n_samples`` each, the eval's
sampling and limits) through the rollout manager. The loop never waits for it: each step polls
the pending evaluations, and a finished one is written to ``eval.jsonl`` (one line per
evaluation, keyed by the step it evaluates) and to TensorBoard as ``eval/*`` at that step. At
the end of the run the last evaluations are awaited (``eval.wait_at_end_s``), then cancelled.
Nothing of an evaluation reaches a batch: its results are read by its own batch id, which the
collector never follows.

Scores: ``eval/reward_mean`` over the trainable outcomes and its standard error
``eval/reward_se`` (sqrt(p (1 - p) / n) over the n scored samples); aborted trajectories
(infrastructure) are counted in ``eval/aborted`` and never scored; ``eval/pass_at_n`` is the
fraction of instances with at least one sample at reward >= 1 (n = ``n_samples``), among the
instances with a scored sample; ``eval/version`` is the policy version that was evaluated. The
``eval.shifted`` set rides in the same request and is scored apart as ``eval/shifted/*``.

Request ids are ``<run_id>-eval<step>``: a resumed run adopts the evaluations the dead run
submitted and did not log (their steps are at or before the checkpoint and are not redone).
Evaluating needs ``train.publish``: the engines must serve the version that is evaluated.
"""

from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path
from statistics import fmean

from services.manager.client import RolloutManager, tasks_for_request
from services.protocol import RolloutRequest, TaskResult
from trainer.loop.config import TrainConfig
from trainer.loop.metrics import read_jsonl, truncate_steps
from trainer.loop.prompts import load_instance_ids

log = logging.getLogger("swerl.trainer.eval")
EVAL_FILE = "eval.jsonl"


@dataclass
class _Pending:
    step: int
    version: int
    request: RolloutRequest
    submitted: float


def eval_scores(
    results: list[TaskResult], instance_of: dict[str, str], prefix: str = "eval/"
) -> dict[str, float]:
    """``eval/*`` of one finished evaluation (``instance_of``: task id -> instance id)."""
    scored = [r for r in results if r.outcome.trainable]
    best: dict[str, float] = {}
    for r in scored:
        instance = instance_of[r.task_id]
        best[instance] = max(best.get(instance, 0.0), float(r.outcome.reward or 0.0))
    nan = float("nan")
    mean = fmean(float(r.outcome.reward or 0.0) for r in scored) if scored else nan
    return {
        f"{prefix}reward_mean": mean,
        # binomial standard error of the mean (rewards are 0/1 on the toy task)
        f"{prefix}reward_se": math.sqrt(mean * (1 - mean) / len(scored)) if scored else nan,
        # over the instances with a scored sample: infrastructure never counts as unsolved
        f"{prefix}pass_at_n": sum(v >= 1.0 for v in best.values()) / len(best) if best else nan,
        f"{prefix}trajectories": float(len(scored)),
        f"{prefix}aborted": float(len(results) - len(scored)),
    }


class PeriodicEval:
    """Submits, polls and logs the held-out evaluations of one run (module docstring)."""

    def __init__(self, manager: RolloutManager, config: TrainConfig, writer: object = None) -> None:
        self.manager = manager
        self.config = config
        self.interval = config.eval_interval
        self.ids = load_instance_ids(config.eval, "eval") if self.interval else []
        shifted = config.eval.shifted if self.interval else None
        self.shifted_ids = load_instance_ids(shifted, "eval.shifted") if shifted else []
        overlap = sorted(set(self.ids) & set(self.shifted_ids))
        if overlap:
            raise ValueError(f"eval.shifted repeats held-out instances: {overlap[:3]}")
        self.path = Path(config.run_dir) / EVAL_FILE
        self.writer = writer  # a TensorBoard SummaryWriter, or None
        self.pending: list[_Pending] = []

    def batch_id(self, step: int) -> str:
        return f"{self.config.run_id}-eval{step:05d}"

    def check_held_out(self, training_ids: list[str]) -> None:
        """ValueError when an eval instance is also a training prompt (files included; a
        mixture's ``<dataset>/<id>`` prompt also by its instance id)."""
        bare = {key.rpartition("/")[2] for key in training_ids}
        shared = sorted(set(self.ids + self.shifted_ids) & (set(training_ids) | bare))
        if shared:
            raise ValueError(f"eval instances must be held out, but {shared[:3]} are training "
                             "prompts")  # fmt: skip

    def resume(self, step: int) -> int:
        """Drop ``eval.jsonl`` lines after ``step`` (those steps are redone) and adopt every
        evaluation of a step at or before it that the dead run submitted but did not log
        (finished or still running, it is logged when done); returns how many."""
        truncate_steps(self.path, step)
        if not self.interval:
            return 0
        logged = {int(r["step"]) for r in read_jsonl(self.path) if "step" in r}
        for s in range(self.interval, step + 1, self.interval):
            if s in logged:
                continue
            try:
                request = self.manager.request(self.batch_id(s))
            except KeyError:  # never submitted (killed before it)
                continue
            self.pending.append(_Pending(s, request.policy_version, request, time.monotonic()))
        return len(self.pending)

    def after_step(self, step: int, version: int) -> None:
        """Submit the evaluation of ``version`` when ``step`` is an interval step."""
        if not self.interval or step % self.interval:
            return
        settings, rollout = self.config.eval, self.config.rollout
        request = RolloutRequest(
            batch_id=self.batch_id(step),
            job_id=f"{rollout.job_id}-eval",
            instance_ids=self.ids + self.shifted_ids,
            n_samples=settings.n_samples,
            policy_version=version,
            limits=settings.limits or rollout.limits,
            sampling=settings.sampling or rollout.sampling,
            max_attempts=rollout.max_attempts,
            **({"kind": self.config.dataset.kind} if self.config.dataset.kind else {}),
        )
        self.manager.submit(request)
        self.pending.append(_Pending(step, version, request, time.monotonic()))
        log.info("step %d: evaluating version %d on %d held-out instances (+%d shifted) x %d",
                 step, version, len(self.ids), len(self.shifted_ids),
                 settings.n_samples)  # fmt: skip

    def poll(self) -> list[dict[str, float]]:
        """Log every pending evaluation that has finished; returns their rows."""
        rows = []
        for item in list(self.pending):
            progress = self.manager.progress(item.request.batch_id)
            if progress.done < progress.total:
                continue
            rows.append(self._finish(item))
        return rows

    def finish(self) -> list[dict[str, float]]:
        """At the end of the run: wait (``eval.wait_at_end_s`` in all) for the pending
        evaluations, log them, cancel what is still unfinished."""
        deadline = time.monotonic() + self.config.eval.wait_at_end_s
        rows = []
        while self.pending:
            rows += self.poll()
            if not self.pending or time.monotonic() >= deadline:
                break
            time.sleep(0.5)
        self.cancel_all()
        return rows

    def cancel_all(self) -> None:
        for item in self.pending:
            log.warning("evaluation of step %d not finished: cancelled", item.step)
            self.manager.cancel(item.request.batch_id)
        self.pending.clear()

    def _finish(self, item: _Pending) -> dict[str, float]:
        results = self.manager.collect(item.request.batch_id, timeout_s=60)
        instance_of = {t.task_id: t.instance_id for t in tasks_for_request(item.request)}
        shifted = set(self.shifted_ids)
        main = [r for r in results if instance_of[r.task_id] not in shifted]
        row = {
            **eval_scores(main, instance_of),
            "eval/version": float(item.version),
            "eval/seconds": time.monotonic() - item.submitted,
        }
        if shifted:
            moved = [r for r in results if instance_of[r.task_id] in shifted]
            row.update(eval_scores(moved, instance_of, "eval/shifted/"))
        self.pending.remove(item)
        clean = {k: (None if v != v else v) for k, v in row.items()}  # NaN -> null
        with self.path.open("a") as f:
            f.write(json.dumps({"step": item.step, **clean}, sort_keys=True) + "\n")
        if self.writer is not None:
            for key, value in row.items():
                if value == value:
                    self.writer.add_scalar(key, value, item.step)  # type: ignore[attr-defined]
            self.writer.flush()  # type: ignore[attr-defined]
        log.info("evaluation of step %d (version %d): reward %.3f +- %.3f, pass@%d %.3f%s",
                 item.step, item.version, row["eval/reward_mean"], row["eval/reward_se"],
                 self.config.eval.n_samples, row["eval/pass_at_n"],
                 f", shifted {row['eval/shifted/reward_mean']:.3f}" if shifted
                 else "")  # fmt: skip
        return row
