"""The training loop: collect -> build -> train -> publish -> gate -> log -> checkpoint.

One step (docs/training.md "The loop"):

1. top the in-flight budget up with requests of the phase's shape (the next batch is always
   being collected while this one trains: one batch ahead);
2. wait for the pool's next batch (:meth:`Collector.next_batch`; aborted results dropped,
   over-lag trajectories dropped, whole groups in group phases, any ``B`` in the single phase);
3. tell the phase controller the batch was taken; right after the prefetched bootstrap batch
   of a switch, cancel every leftover bootstrap request, then top up with ``B x 1`` requests;
4. build the padded batch (``trainer.data.build_batch``), one backend ``train_step`` with the
   phase's objective, publish the new version (the backend owns the version counter);
5. feed the readiness values of the step to the gate (bootstrap only), log, and checkpoint
   every ``checkpoint_every`` steps with the loop state as the checkpoint's extra state.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

from services.manager.client import RolloutManager
from trainer.backends import StepObjective, TrainerBackend
from trainer.checkpoint import CheckpointError, latest_checkpoint, save_and_prune
from trainer.config import TrainerConfig
from trainer.data import BatchError, build_batch
from trainer.loop.collector import Collector
from trainer.loop.config import (
    TrainConfig,
    resolve_schedule,
    uses_dynamic_sampling,
    warmup_steps,
)
from trainer.loop.evaluation import PeriodicEval
from trainer.loop.metrics import METRICS_FILE, MetricsLog
from trainer.loop.phases import PhaseController
from trainer.loop.pool import Selection
from trainer.loop.prompts import make_cursor, same_dataset
from trainer.loop.step_metrics import engine_metrics, rollout_metrics, step_record
from trainer.publish import Publisher, publish_metrics

log = logging.getLogger("swerl.train")
STATE_KEY = "loop"


@dataclass
class LoopParts:
    """What the loop runs on: a backend, the manager client, a store connection
    (``decode_responses=False``), a publisher (None: versions are not published) and, with
    it, ``served_version``: the newest version the adapter or an engine serves."""

    backend: TrainerBackend
    manager: RolloutManager
    store: redis.Redis
    publisher: Publisher | None = None
    served_version: Callable[[], int] | None = None


class TrainLoop:
    """The driver (see the module docstring); ``run()`` trains until ``train.steps``."""

    def __init__(
        self, train: TrainConfig, trainer: TrainerConfig, parts: LoopParts, *, resume: bool
    ) -> None:
        self.train = train
        self.trainer = trainer
        self.parts = parts
        self.backend = parts.backend
        self.phases = PhaseController(
            resolve_schedule(train, trainer.algorithm), train.bootstrap, train.single, train.gate
        )
        self.warmup = warmup_steps(train, trainer.algorithm)
        self.mixed_only = uses_dynamic_sampling(train, trainer.algorithm)
        cursor = make_cursor(train.dataset)
        self.collector = Collector(parts.manager, parts.store, cursor, train)
        self.step = 0
        self.skipped = 0
        self.checkpoint_dir = Path(trainer.checkpoint.dir or Path(train.run_dir) / "checkpoints")
        problem = self.backend.checkpoint_problem()
        if problem is not None:  # a run checkpoints (checkpoint_every, its last step): fail now
            raise CheckpointError(f"this run cannot checkpoint: {problem}")
        resume_step = self._resume() if resume else self._check_fresh()
        self.log = MetricsLog(train.run_dir, tensorboard=train.tensorboard, resume_step=resume_step)
        self.evaluator = PeriodicEval(parts.manager, train, writer=self.log.writer)
        self.evaluator.check_held_out(cursor.ids)
        if resume:
            self.evaluator.resume(self.step)

    # -- state ------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "version": self.backend.version,
            "phases": self.phases.state_dict(),
            "collector": self.collector.state_dict(),
            "counts": dict(self.collector.pool.counts),
        }

    def _resume(self) -> int:
        path = latest_checkpoint(self.checkpoint_dir)
        if path is None:
            raise CheckpointError(f"--resume: no complete checkpoint in {self.checkpoint_dir}")
        extra = self.backend.load(path)
        state = extra.get(STATE_KEY)
        if not isinstance(state, dict):
            raise CheckpointError(f"{path} holds no training-loop state (key {STATE_KEY!r})")
        self.step = int(state["step"])
        self.phases.load_state_dict(state["phases"])
        collector = state["collector"]
        mine = self.collector.cursor.fingerprint()
        if same_dataset(path, collector.get("dataset"), mine, self.train.dataset.on_change):
            self.collector.cursor.position = int(collector["cursor"])
        self.collector.pool.counts.update(state.get("counts", {}))
        cancelled = self.collector.recover(list(collector["active"]), int(collector["seq"]))
        self.collector.pool.counts["cancelled_tasks"] += cancelled
        log.info(
            "resumed from %s: step %d, phase %s, version %d; cancelled %d tasks of the dead run",
            path, self.step, self.phases.phase, self.backend.version, cancelled,
        )  # fmt: skip
        if self.parts.publisher is not None:
            self._republish()
        return self.step

    def _republish(self) -> None:
        """Serve the restored weights again. If the dead run published versions after its
        checkpoint -- served, or exported and killed before the refresh -- the restored
        weights become a new version above all of them (versions only increase; a number is
        never reused for other weights, and an exported directory is never replaced)."""
        publisher = self.parts.publisher
        assert publisher is not None
        served = self.parts.served_version() if self.parts.served_version else None
        newest = max((v for v in (served, publisher.newest_exported()) if v is not None),
                     default=None)  # fmt: skip
        if newest is not None and newest > self.backend.version:
            log.warning(
                "version %d was published after the checkpoint (version %d; served: %s): "
                "the restored weights are published as version %d",
                newest, self.backend.version, served, newest + 1,
            )  # fmt: skip
            self.backend.version = newest + 1
        publisher.publish(self.backend)

    def _check_fresh(self) -> None:
        """A new run must not reuse another run's directory or rollout batch ids (it would
        overwrite its metrics, or be handed that run's results)."""
        metrics = Path(self.train.run_dir) / METRICS_FILE
        if metrics.is_file() and metrics.stat().st_size > 0:
            raise CheckpointError(
                f"{self.train.run_dir} already holds a run ({METRICS_FILE}): continue it with "
                "--resume, or choose another train.run_dir"
            )
        first = self.collector.batch_id(0)
        try:
            self.parts.manager.progress(first)
        except KeyError:  # services.queue.submitter.UnknownBatchError: the ids are free
            return
        raise CheckpointError(
            f"rollout batch {first} exists already: train.run_id {self.train.run_id!r} was used "
            "on this Redis; continue that run with --resume, or choose another run_id"
        )

    def checkpoint(self) -> Path:
        keep = self.trainer.checkpoint.keep_last
        return save_and_prune(
            self.backend, self.checkpoint_dir, keep, {STATE_KEY: self.state_dict()}
        )

    # -- the loop ---------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        """Train to ``train.steps``; leftover requests are cancelled at the end (or on error)."""
        try:
            while self.step < self.train.steps:
                self.step_once()
            self.collector.cancel_all()  # the training rollouts first: the eval gets the slots
            self.evaluator.finish()
        finally:
            self.evaluator.cancel_all()
            self.collector.cancel_all()
            self.collector.feed.join()
            self.log.close()
        return self.state_dict()

    def _take_batch(self) -> tuple[Selection, str, str, float, int]:
        """Wait for the next batch; apply the switch's cancel; refill the budget."""
        version = self.backend.version
        phases, collector = self.phases, self.collector
        collector.top_up(phases.request_shape, version)
        max_lag = self.trainer.batch.max_policy_lag
        selection, wait = collector.next_batch(
            phases.batch_shape, version, max_lag, phases.request_shape, mixed_only=self.mixed_only
        )
        phase, objective_phase = phases.phase, phases.objective_phase
        phases.batch_taken()
        cancelled = collector.cancel_all() if phases.take_cancel() else 0
        collector.top_up(phases.request_shape, version)  # collected while this batch trains
        return selection, phase, objective_phase, wait.seconds, cancelled

    def step_once(self) -> dict[str, Any] | None:
        """One step; returns its metrics row (None: the batch had no trainable row)."""
        t0 = time.monotonic()
        self.evaluator.poll()
        selection, phase, objective_phase, waited, cancelled = self._take_batch()
        version = self.backend.version
        backend = self.backend
        t_build = time.monotonic()
        try:
            batch, report = build_batch(
                [m.record for m in selection.members],
                version,
                self.trainer.batch,
                pad_id=getattr(backend, "pad_id", 0),
                vocab_size=getattr(backend, "vocab_size", None),
            )
        except BatchError as exc:
            self.skipped += 1
            log.warning("step %d: batch skipped: %s", self.step + 1, exc)
            return None
        t_train = time.monotonic()
        objective = StepObjective(
            algorithm=self.trainer.algorithm,  # type: ignore[arg-type]
            phase=objective_phase,  # type: ignore[arg-type]
            config=self.trainer.objective,
            update_actor=self.step >= self.warmup,
        )
        metrics = backend.train_step(batch, objective)
        t_publish = time.monotonic()
        published = self._publish(version)
        t_end = time.monotonic()
        self.step += 1
        self.phases.after_step(
            self.step,
            metrics.get("readiness/explained_variance"),
            metrics.get("readiness/ranking_accuracy"),
        )
        row = step_record(
            phase=phase,
            rollouts={
                **rollout_metrics(selection, batch, version),
                **report.metrics(),
                **engine_metrics(m.record for m in selection.members),
            },
            backend=metrics,
            counts=self.collector.pool.counts,
            timings={
                "wait_rollouts": waited,
                "build": t_train - t_build,
                "train": t_publish - t_train,
                "publish": t_end - t_publish,
                "step": t_end - t0,
            },
            gate=self.phases.gate,
            publish=published,
        )
        row["switch_cancelled_tasks"] = cancelled
        row["version"] = backend.version
        self.log.log(self.step, row, self._batch_line(selection, phase, version))
        self.evaluator.after_step(self.step, backend.version)  # before the checkpoint: resume
        if self.step % self.train.checkpoint_every == 0 or self.step == self.train.steps:
            self.checkpoint()
        return row

    def _publish(self, version_before: int) -> dict[str, float] | None:
        """Publish the new version (nothing when the actor did not move: a warm-up step)."""
        publisher = self.parts.publisher
        if publisher is None or self.backend.version == version_before:
            return None
        result = publisher.publish(self.backend)
        return None if result is None else publish_metrics(result)

    @staticmethod
    def _batch_line(selection: Selection, phase: str, version: int) -> dict[str, Any]:
        members = selection.members
        return {
            "phase": phase,
            "trainer_version": version,
            "group_size": selection.group_size,
            "group_sizes": selection.group_sizes,
            "trajectory_ids": [m.result.trajectory_id for m in members],
            "task_ids": [m.result.task_id for m in members],
            "batch_ids": sorted({m.result.batch_id for m in members}),
        }
