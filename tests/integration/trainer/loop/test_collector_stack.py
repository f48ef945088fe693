"""The collector against real Redis, the real rollout manager and a real (simulated) worker:
prefetch, aborted results dropped, the switch's cancel of leftover bootstrap work, streaming.

The simulated worker reports outcomes but writes no token records, so the test writes each
task's record into the trajectory store first (what the adapter would have recorded).
"""

from __future__ import annotations

import pytest
import redis

from services.manager.client import RolloutManager
from services.queue.models import BatchState
from services.queue.submitter import SubmitterQueue
from tests.support.execution import Procs, wait_nodes
from tests.support.loop_rollouts import records_for_run, write_records
from trainer.loop.collector import Collector
from trainer.loop.config import GateSettings, GroupShape, SingleShape, TrainConfig
from trainer.loop.phases import PhaseController
from trainer.loop.prompts import PromptCursor

# Request k of the run draws prompts 2k, 2k+1 (no shuffling). r0: one normal, one always
# aborted prompt; r1: two quick prompts; r2: one quick, one slow (still running at the switch).
IDS = [
    "i0.sleep50",
    "i1.sleep50.abort",
    "i2.sleep100",
    "i3.sleep100",
    "i4.sleep150",
    "i5.sleep8000",
    *[f"s{n}.sleep50" for n in range(20)],
]


@pytest.mark.slow
def test_prefetch_abort_drop_and_cancel_on_switch(
    redis_url: str, manager: RolloutManager, queue: SubmitterQueue, procs: Procs
) -> None:
    budget_s = 60  # measured 2-3 s (the test's call) on the loaded 2-core machine
    procs.worker(redis_url, "n1", slots=6)
    wait_nodes(queue, {"n1"}, procs)
    write_records(redis_url, records_for_run("c", 12, 2, 2))
    config = TrainConfig(
        run_dir="/unused", run_id="c", steps=3, dataset={"instance_ids": IDS},
        rollout={"max_attempts": 1, "wait_timeout_s": budget_s},
    )  # fmt: skip
    store = redis.Redis.from_url(redis_url, decode_responses=False)
    collector = Collector(manager, store, PromptCursor(IDS, shuffle=False), config)
    gate = GateSettings(t_min=0, t_max=1)
    ctl = PhaseController("switch", GroupShape(prompts=2, group_size=2), SingleShape(
        batch_size=2, in_flight=4), gate)  # fmt: skip
    try:
        # one batch ahead: two bootstrap requests before any result is read
        assert collector.top_up(ctl.request_shape, 0) == ["c-r00000", "c-r00001"]
        assert manager.progress("c-r00001").total == 4

        first, wait = collector.next_batch(ctl.batch_shape, 0, 4, ctl.request_shape)
        assert wait.seconds > 0 and first.group_size == 2
        assert all(size == 2 for size in first.group_sizes) and len(first.group_sizes) == 2
        assert not any(m.group_id == "c-r00000:1" for m in first.members)  # the aborted group
        ctl.batch_taken()
        assert collector.top_up(ctl.request_shape, 0) == ["c-r00002"]
        assert ctl.after_step(1, None, None)  # t_max = 1: the gate switches after step 1

        # the prefetched batch: bootstrap groups, nothing new is requested meanwhile
        second, _ = collector.next_batch(ctl.batch_shape, 1, 4, ctl.request_shape)
        assert all(size == 2 for size in second.group_sizes) and len(second.group_sizes) == 2
        assert collector.seq == 3
        ctl.batch_taken()
        assert ctl.take_cancel()
        cancelled = collector.cancel_all()
        assert cancelled == 2  # i5's two samples were still running
        assert manager.progress("c-r00002").state is BatchState.CANCELLED
        assert collector.pool.counts["aborted"] == 2  # both samples of i1: dropped, not scored

        assert collector.top_up(ctl.request_shape, 1) == ["c-r00003", "c-r00004"]
        third, _ = collector.next_batch(ctl.batch_shape, 1, 4, ctl.request_shape)
        assert third.group_sizes == [1, 1]
        assert {m.result.batch_id for m in third.members} <= {"c-r00003", "c-r00004"}

        trained = [m.result.trajectory_id for b in (first, second, third) for m in b.members]
        assert len(trained) == len(set(trained)) == 4 + 4 + 2  # nothing trained twice
        assert not any(t.startswith("c-r00002:1:") for t in trained)  # cancelled leftovers
        assert not any(t.startswith("c-r00000:1:") for t in trained)  # aborted
    finally:
        collector.cancel_all()
        collector.feed.join()
        store.close()
