"""The collector: requests through the rollout manager, results as they land, the next batch.

* :class:`ResultFeed` follows every submitted request with one thread iterating
  ``RolloutManager.results(batch_id)`` (each result exactly once, in finishing order) into one
  queue; a thread ends when its request finishes (a cancelled request finishes at once).
* :class:`Collector` keeps the in-flight budget full (``top_up``: requests of the phase's shape
  while ``in_flight + request <= budget``; the default budget of two batches is the design's
  "one batch ahead"), loads each trainable result's record from the trajectory store, and hands
  the pool's next batch to the loop (``next_batch``), timing the wait.

Request ids are ``<run_id>-r<seq>`` with a sequence number that is part of the loop state, so a
resumed run can find and cancel what the dead run left in flight (:meth:`Collector.recover`).
"""

from __future__ import annotations

import functools
import queue
import threading
import time
from dataclasses import dataclass, replace
from typing import Any

import redis

from services.manager.client import RolloutManager
from services.protocol import RolloutRequest, TaskResult, TrajectoryRecord
from services.store.trajectories import TrajectoryNotFoundError, load_trajectory
from trainer.loop.config import TrainConfig
from trainer.loop.phases import BatchShape
from trainer.loop.pool import RolloutPool, Selection
from trainer.loop.prompts import MixtureCursor, PromptCursor


class CollectorError(RuntimeError):
    """The rollouts for a batch did not arrive (timeout) or a result feed failed."""


class ResultFeed:
    """One thread per followed request, all feeding one queue (see the module docstring)."""

    def __init__(self, manager: RolloutManager) -> None:
        self.manager = manager
        self.queue: queue.Queue[TaskResult | BaseException] = queue.Queue()
        self._threads: dict[str, threading.Thread] = {}

    def follow(self, batch_id: str) -> None:
        thread = threading.Thread(
            target=self._run, args=(batch_id,), name=f"feed-{batch_id}", daemon=True
        )
        self._threads[batch_id] = thread
        thread.start()

    def _run(self, batch_id: str) -> None:
        try:
            for result in self.manager.results(batch_id, wait=True):
                self.queue.put(result)
        except BaseException as exc:  # handed to the loop's thread, which raises it
            self.queue.put(exc)

    def get(self, timeout_s: float) -> TaskResult | None:
        try:
            item = self.queue.get(timeout=timeout_s)
        except queue.Empty:
            return None
        if isinstance(item, BaseException):
            raise CollectorError(f"a result feed failed: {item!r}") from item
        return item

    def join(self, timeout_s: float = 10.0) -> None:
        deadline = time.monotonic() + timeout_s
        for thread in self._threads.values():
            thread.join(max(0.0, deadline - time.monotonic()))


@dataclass
class Wait:
    """Seconds the loop spent waiting for a batch, and how many results landed meanwhile."""

    seconds: float = 0.0
    results: int = 0


class Collector:
    """Submits requests, collects results into the pool, returns batches."""

    def __init__(
        self,
        manager: RolloutManager,
        store: redis.Redis,
        cursor: PromptCursor | MixtureCursor,
        config: TrainConfig,
        pool: RolloutPool | None = None,
    ) -> None:
        self.manager = manager
        self.store = store
        self.cursor = cursor
        self.config = config
        self.pool = pool or RolloutPool()
        self.feed = ResultFeed(manager)
        self.seq = 0

    # -- requests ---------------------------------------------------------------------------
    def batch_id(self, seq: int) -> str:
        return f"{self.config.run_id}-r{seq:05d}"

    def request(self, shape: BatchShape, version: int) -> RolloutRequest:
        rollout = self.config.rollout
        extra: dict[str, Any] = {}
        if self.config.dataset.kind is not None:  # the task-kind seam (docs/training.md)
            extra["kind"] = self.config.dataset.kind
        return RolloutRequest(
            batch_id=self.batch_id(self.seq),
            job_id=rollout.job_id,
            instance_ids=self.cursor.take(shape.prompts),
            n_samples=shape.group_size,
            policy_version=version,
            limits=rollout.limits,
            sampling=rollout.sampling,
            max_attempts=rollout.max_attempts,
            **extra,
        )

    def top_up(self, shape: BatchShape | None, version: int) -> list[str]:
        """Submit requests of ``shape`` while they fit the budget (None: submit nothing)."""
        submitted: list[str] = []
        while shape is not None and self.pool.in_flight + shape.trajectories <= shape.budget:
            submitted.append(self.submit(shape, version))
        return submitted

    def submit(self, shape: BatchShape, version: int) -> str:
        """Submit one request of ``shape`` and follow its results; returns its batch id."""
        request = self.request(shape, version)
        self.manager.submit(request)
        self.seq += 1
        self.pool.register(request.batch_id, shape.prompts, shape.group_size)
        self.feed.follow(request.batch_id)
        return request.batch_id

    def cancel_all(self) -> int:
        """Cancel every request in flight and discard what it landed; returns the number of
        tasks the manager cancelled."""
        cancelled = 0
        for batch_id in list(self.pool.requests):
            cancelled += self.manager.cancel(batch_id)
            self.pool.discard(batch_id)
        self.pool.counts["cancelled_tasks"] += cancelled
        return cancelled

    def recover(self, active: list[str], next_seq: int) -> int:
        """After a restart: cancel the dead run's requests (``active`` at its checkpoint, and
        every ``<run_id>-r<seq>`` from ``next_seq`` on that exists), and continue the sequence
        after the last one found. Returns the number of tasks cancelled."""
        cancelled = 0
        for batch_id in active:
            cancelled += self._cancel_if_known(batch_id)
        seq = next_seq
        while (n := self._cancel_if_known(self.batch_id(seq))) >= 0:
            cancelled += n
            seq += 1
        self.seq = seq
        return cancelled

    def _cancel_if_known(self, batch_id: str) -> int:
        try:
            return self.manager.cancel(batch_id)
        except KeyError:  # services.queue.submitter.UnknownBatchError
            return -1

    # -- results ----------------------------------------------------------------------------
    def _record(self, result: TaskResult) -> TrajectoryRecord | None:
        """The trajectory's record with the result's outcome (the worker reports the outcome
        the adapter kept), or None for an aborted result or a record the store lacks."""
        if not result.outcome.trainable:
            return None
        try:
            record = load_trajectory(self.store, result.trajectory_id, self.config.store_prefix)
        except TrajectoryNotFoundError:
            return None
        return replace(record, outcome=result.outcome)

    def _land(self, result: TaskResult) -> None:
        record = self._record(result) if result.batch_id in self.pool.requests else None
        self.pool.add(result, record)

    def drain(self) -> int:
        """Move every result that has landed into the pool without waiting."""
        count = 0
        while (result := self.feed.get(0.0)) is not None:
            self._land(result)
            count += 1
        return count

    def next_batch(
        self,
        shape: BatchShape,
        version: int,
        max_policy_lag: int,
        request_shape: BatchShape | None,
        *,
        mixed_only: bool = False,
    ) -> tuple[Selection, Wait]:
        """Wait for the pool's next batch of ``shape`` (rollout.wait_timeout_s at most),
        topping the budget up with requests of ``request_shape`` as results leave the pool
        (aborted or over-lag ones free room). ``request_shape`` None (draining) sends nothing
        new, unless nothing at all is in flight: then one request of ``shape`` is sent."""
        wait = Wait()
        t0 = time.monotonic()
        deadline = t0 + self.config.rollout.wait_timeout_s
        wait.results += self.drain()
        select = functools.partial(self.pool.select, mixed_only=mixed_only)
        while (selection := select(shape, version, max_policy_lag)) is None:
            self.top_up(request_shape, version)
            if not self.pool.requests:
                # draining with nothing left (a resumed run cancelled the prefetched request,
                # or aborts emptied it): one request of the batch's own shape replaces it
                self.submit(shape, version)
            if time.monotonic() > deadline:
                raise CollectorError(
                    f"no batch of {shape.prompts} x {shape.group_size} within "
                    f"{self.config.rollout.wait_timeout_s} s ({self.pool.in_flight} in flight, "
                    f"counts {dict(self.pool.counts)})"
                )
            result = self.feed.get(0.5)
            if result is not None:
                self._land(result)
                wait.results += 1 + self.drain()
        wait.seconds = time.monotonic() - t0
        return selection, wait

    def state_dict(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "active": sorted(self.pool.requests),
            "cursor": self.cursor.position,
            "dataset": self.cursor.fingerprint(),
        }
