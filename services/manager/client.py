"""The rollout manager's client: the Python API the trainer (and the job API) use to run rollouts.

``RolloutManager`` turns a :class:`RolloutRequest` into one task per trajectory, queues them,
and reads back progress and results; it can also run the dispatch loop in a background thread
(``start()``) when no separate ``python -m services.manager`` process is deployed. Every method
is a few Redis round trips, so any number of clients may use the same batches.

    with RolloutManager("redis://head:6379/0") as mgr:
        batch = mgr.submit(RolloutRequest(instance_ids=ids, n_samples=8, policy_version=v))
        for result in mgr.results(batch):           # yields each TaskResult once, as it lands
            ...
        mgr.cancel(batch)                            # drops pending, stops running trajectories
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any

from services.manager.config import ManagerConfig
from services.manager.dispatcher import Dispatcher
from services.protocol.tasks import RolloutRequest, RolloutTask, TaskResult
from services.queue.dispatcher import DispatcherQueue
from services.queue.models import BatchProgress, DeadLetter, NodeStatus
from services.queue.submitter import SubmitterQueue

#: Longest task id: trajectory ids (``<task_id>.a<attempt>``) must fit in 200 characters.
MAX_TASK_ID = 190


def tasks_for_request(request: RolloutRequest) -> list[RolloutTask]:
    """One task per (prompt, sample); task ids are ``<batch_id>:<prompt index>:<sample>``."""
    longest = f"{request.batch_id}:{len(request.instance_ids) - 1}:{request.n_samples - 1}"
    if len(longest) > MAX_TASK_ID:
        raise ValueError(
            f"batch_id is too long ({len(request.batch_id)} characters): task ids such as "
            f"{longest[:40]}... must stay within {MAX_TASK_ID} characters"
        )
    groups = request.resolved_group_ids()
    return [
        RolloutTask(
            task_id=f"{request.batch_id}:{i}:{s}",
            batch_id=request.batch_id,
            job_id=request.job_id,
            group_id=groups[i],
            instance_id=instance_id,
            sample_index=s,
            policy_version=request.policy_version,
            max_attempts=request.max_attempts,
            limits=request.limits,
            sampling=request.sampling,
            kind=request.kind,
        )
        for i, instance_id in enumerate(request.instance_ids)
        for s in range(request.n_samples)
    ]


class RolloutManager:
    def __init__(
        self,
        redis_url: str | None = None,
        cfg: ManagerConfig | None = None,
        *,
        queue: SubmitterQueue | None = None,
    ) -> None:
        self.cfg = cfg or ManagerConfig()
        if queue is None:
            queue = SubmitterQueue(redis_url or self.cfg.redis_url, self.cfg.queue)
        self.queue = queue
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- lifecycle --------------------------------------------------------------------------
    def start(self) -> None:
        """Run the dispatch/reclaim loop in a background thread of this process (over this
        client's Redis connection pool)."""
        if self._thread is not None:
            return
        self._stop.clear()
        dispatcher = Dispatcher(DispatcherQueue(self.queue.redis, self.queue.cfg), self.cfg)
        self._thread = threading.Thread(
            target=dispatcher.run, args=(self._stop,), name="rollout-manager", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.cfg.poll_interval_s + 5)
            self._thread = None

    def close(self) -> None:
        self.stop()
        self.queue.close()

    def __enter__(self) -> RolloutManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- batches ----------------------------------------------------------------------------
    def submit(self, request: RolloutRequest | Mapping[str, Any]) -> str:
        """Queue a batch; returns its id. Re-submitting the identical request is a no-op."""
        if not isinstance(request, RolloutRequest):
            request = RolloutRequest.model_validate(request)
        self.queue.submit_batch(
            request.batch_id,
            request.job_id,
            request.model_dump_json(),
            tasks_for_request(request),
        )
        return request.batch_id

    def request(self, batch_id: str) -> RolloutRequest:
        return RolloutRequest.model_validate_json(self.queue.batch_request(batch_id))

    def progress(self, batch_id: str) -> BatchProgress:
        return self.queue.progress(batch_id)

    def cancel(self, batch_id: str) -> int:
        """Cancel a batch: every unfinished task is reported aborted ("cancelled") now and the
        workers stop its running trajectories; returns how many tasks were cancelled."""
        return self.queue.cancel(batch_id)

    def results(
        self, batch_id: str, *, wait: bool = True, timeout_s: float | None = None
    ) -> Iterator[TaskResult]:
        """Yield the batch's results, each task exactly once, in the order they finished.

        With ``wait`` the iterator blocks until every task of the batch has a result (a
        cancelled batch finishes at once); ``timeout_s`` bounds the whole wait and raises
        :class:`TimeoutError`. Without ``wait`` it yields what is there and returns.
        """
        total = self.queue.progress(batch_id).total  # raises for an unknown batch
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        after, seen = "0", 0
        while seen < total:
            block: int | None = None
            if wait:
                left = 1.0 if deadline is None else deadline - time.monotonic()
                block = max(1, int(min(left, 1.0) * 1000))
            after, got = self.queue.read_batch_results(batch_id, after, 500, block)
            seen += len(got)
            yield from got
            if got:
                continue
            if not wait:
                return
            if self.queue.progress(batch_id).finished:
                # Results are written atomically with the counters: this read gets the rest
                # (fewer than total only if an invalid entry was dead-lettered).
                yield from self.queue.read_batch_results(batch_id, after, 10_000, None)[1]
                return
            if deadline is not None and time.monotonic() >= deadline:
                prog = self.queue.progress(batch_id)
                raise TimeoutError(
                    f"batch {batch_id}: {prog.done}/{prog.total} results after {timeout_s} s"
                )

    def collect(self, batch_id: str, timeout_s: float | None = None) -> list[TaskResult]:
        return list(self.results(batch_id, wait=True, timeout_s=timeout_s))

    def wait(
        self, batch_id: str, timeout_s: float | None = None, poll_s: float = 0.2
    ) -> BatchProgress:
        """Block until the batch has finished; returns its final progress."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            prog = self.queue.progress(batch_id)
            if prog.finished:
                return prog
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(
                    f"batch {batch_id}: {prog.done}/{prog.total} after {timeout_s} s"
                )
            time.sleep(poll_s)

    def forget(self, batch_id: str) -> int:
        """Delete a finished batch's keys from Redis."""
        return self.queue.forget(batch_id)

    # -- cluster ----------------------------------------------------------------------------
    def nodes(self) -> list[NodeStatus]:
        return self.queue.nodes()

    def dead_letters(self, count: int = 100) -> list[DeadLetter]:
        return self.queue.dead_letters(count)
