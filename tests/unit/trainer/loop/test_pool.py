"""The rollout pool: whole groups, streaming singles, aborted and over-lag drops, no mixing."""

from __future__ import annotations

import pytest

from tests.support.loop_rollouts import record_of, result
from trainer.loop.phases import BatchShape
from trainer.loop.pool import RolloutPool

GROUPS = BatchShape(prompts=2, group_size=3, budget=12)
SINGLES = BatchShape(prompts=3, group_size=1, budget=6)


def land(pool: RolloutPool, batch: str, prompt: int, sample: int = 0, **kw: object) -> None:
    res = result(batch, prompt, sample, aborted=bool(kw.get("aborted")))
    versions = kw.get("versions", (0,))
    pool.add(res, None if kw.get("aborted") or kw.get("missing") else record_of(res, versions))


def test_only_whole_groups_enter_a_group_batch_and_aborted_members_are_dropped() -> None:
    pool = RolloutPool()
    pool.register("r0", prompts=3, group_size=3)
    assert pool.in_flight == 9
    for s in range(3):
        land(pool, "r0", 0, s)
    land(pool, "r0", 1, 0)
    land(pool, "r0", 1, 1, aborted=True)
    assert pool.select(GROUPS, 0, 4) is None  # group 1 is missing a result, group 2 is empty
    land(pool, "r0", 2, 0)
    land(pool, "r0", 1, 2)  # group 1 completes before group 2
    sel = pool.select(GROUPS, 0, 4)
    assert sel is not None
    assert sorted(m.group_id for m in sel.members) == ["r0:0"] * 3 + ["r0:1"] * 2
    assert sorted(sel.group_sizes) == [2, 3] and sel.group_size == 3
    assert pool.counts["aborted"] == 1 and pool.counts["trained"] == 5
    assert pool.in_flight == 3  # group 2: one landed (not trained yet), two running


def test_singles_stream_in_landing_order_across_requests_without_a_barrier() -> None:
    pool = RolloutPool()
    pool.register("r0", prompts=3, group_size=1)
    pool.register("r1", prompts=3, group_size=1)
    land(pool, "r1", 0)
    land(pool, "r0", 2)
    assert pool.select(SINGLES, 0, 4) is None
    land(pool, "r0", 0)
    land(pool, "r1", 2)
    sel = pool.select(SINGLES, 0, 4)
    assert [m.result.task_id for m in sel.members] == ["r1:0:0", "r0:2:0", "r0:0:0"]
    assert sel.group_sizes == [1, 1, 1]
    assert pool.in_flight == 3  # r1:2 landed, r0:1 and r1:1 still running
    assert sorted(pool.requests) == ["r0", "r1"]


def test_stragglers_train_later_within_the_lag_and_are_dropped_beyond_it() -> None:
    pool = RolloutPool()
    pool.register("r0", prompts=4, group_size=1)
    land(pool, "r0", 0, versions=(1,))
    land(pool, "r0", 1, versions=(2, 5))  # a turn at version 2, one at 5: version 2 decides
    land(pool, "r0", 2, versions=(5,))
    land(pool, "r0", 3, versions=(6,))
    one = BatchShape(prompts=1, group_size=1, budget=2)
    # trainer at version 6, max lag 4: the version-1 straggler (lag 5) is dropped
    sel = pool.select(one, 6, 4)
    assert [m.result.task_id for m in sel.members] == ["r0:1:0"] and sel.lags == (4,)
    assert pool.counts["over_lag"] == 1
    # at version 7 the version-2 trajectory would lag 5 too; the others still fit
    sel = pool.select(BatchShape(prompts=2, group_size=1, budget=4), 7, 4)
    assert [m.result.task_id for m in sel.members] == ["r0:2:0", "r0:3:0"]
    assert sel.lags == (2, 1)
    assert not pool.requests  # every trajectory of r0 left the pool


def test_tokens_from_a_future_version_are_dropped_and_counted() -> None:
    pool = RolloutPool()
    pool.register("r0", prompts=2, group_size=1)
    land(pool, "r0", 0, versions=(3,))
    land(pool, "r0", 1, versions=(1,))
    sel = pool.select(BatchShape(prompts=1, group_size=1, budget=2), 2, 4)
    assert [m.result.task_id for m in sel.members] == ["r0:1:0"]
    assert pool.counts["future_version"] == 1


def test_a_discarded_request_never_reaches_a_batch() -> None:
    pool = RolloutPool()
    pool.register("boot", prompts=2, group_size=3)
    for s in range(3):
        land(pool, "boot", 0, s)
    land(pool, "boot", 1, 0)
    assert pool.discard("boot") == 6
    assert pool.counts["discarded_landed"] == 4
    pool.register("single", prompts=2, group_size=1)
    land(pool, "boot", 1, 1)  # a late (cancelled) result of the discarded request
    land(pool, "single", 0)
    land(pool, "single", 1)
    sel = pool.select(BatchShape(prompts=2, group_size=1, budget=4), 0, 4)
    assert {m.result.batch_id for m in sel.members} == {"single"}
    assert pool.counts["ignored_results"] == 1


def test_a_batch_never_mixes_group_sizes() -> None:
    pool = RolloutPool()
    pool.register("boot", prompts=1, group_size=3)
    pool.register("single", prompts=2, group_size=1)
    with pytest.raises(RuntimeError, match="must not mix"):
        pool.select(SINGLES, 0, 4)


def test_missing_records_are_counted_and_free_the_budget() -> None:
    pool = RolloutPool()
    pool.register("r0", prompts=2, group_size=1)
    land(pool, "r0", 0, missing=True)
    land(pool, "r0", 1, aborted=True)
    assert (pool.counts["missing_record"], pool.counts["aborted"]) == (1, 1)
    assert pool.in_flight == 0 and not pool.requests and not pool.groups
    with pytest.raises(ValueError, match="already in the pool"):
        pool.register("r1", 1, 1) or pool.register("r1", 1, 1)


def test_dynamic_sampling_drops_uniform_groups_until_enough_mixed_ones() -> None:
    pool = RolloutPool()
    pool.register("r0", prompts=3, group_size=2)
    rewards = {0: (1.0, 1.0), 1: (0.0, 1.0), 2: (0.0, 0.0)}  # only group 1 is mixed
    for prompt, pair in rewards.items():
        for sample, reward in enumerate(pair):
            res = result("r0", prompt, sample, reward)
            pool.add(res, record_of(res))
    two = BatchShape(prompts=2, group_size=2, budget=8)
    assert pool.select(two, 0, 4, mixed_only=True) is None  # one mixed group is not enough
    assert (pool.counts["uniform_groups"], pool.counts["filtered_uniform"]) == (2, 4)
    assert pool.in_flight == 2  # the budget the uniform groups held is free for new draws
    pool.register("r1", prompts=1, group_size=2)
    for sample, reward in enumerate((1.0, 0.0)):
        res = result("r1", 0, sample, reward)
        pool.add(res, record_of(res))
    sel = pool.select(two, 0, 4, mixed_only=True)
    assert sorted({m.group_id for m in sel.members}) == ["r0:1", "r1:0"]
    # without dynamic sampling a uniform group trains like any other
    plain = RolloutPool()
    plain.register("r0", prompts=1, group_size=2)
    for sample in (0, 1):
        res = result("r0", 0, sample, 1.0)
        plain.add(res, record_of(res))
    assert plain.select(BatchShape(1, 2, 4), 0, 4) is not None
