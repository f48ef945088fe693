"""The job store on real Redis: idempotent submission, pagination and filters, cancel."""

from __future__ import annotations

import threading

import pytest
import redis

from services.api.schemas import JobKind, JobState
from services.api.store import IdempotencyConflict, JobStore, QuotaExceeded

SPEC = {"instance_ids": ["a"], "n_samples": 1}


def test_idempotency_key_returns_the_first_job(store: JobStore) -> None:
    first = store.submit(JobKind.ROLLOUT, SPEC, "alice", idempotency_key="k")
    again = store.submit(JobKind.ROLLOUT, dict(SPEC), "alice", idempotency_key="k")
    assert first.created and not again.created and again.job_id == first.job_id
    assert store.count() == 1


def test_idempotency_key_with_another_request_conflicts(store: JobStore) -> None:
    store.submit(JobKind.ROLLOUT, SPEC, "alice", idempotency_key="k")
    with pytest.raises(IdempotencyConflict, match="different request"):
        store.submit(JobKind.ROLLOUT, {**SPEC, "n_samples": 2}, "alice", idempotency_key="k")
    with pytest.raises(IdempotencyConflict):
        store.submit(JobKind.EVAL, SPEC, "alice", idempotency_key="k")


def test_idempotency_keys_belong_to_their_submitter(store: JobStore) -> None:
    a = store.submit(JobKind.ROLLOUT, SPEC, "alice", idempotency_key="k")
    b = store.submit(JobKind.ROLLOUT, SPEC, "bob", idempotency_key="k")
    assert a.job_id != b.job_id and b.created


def test_without_a_key_every_submission_is_a_new_job(store: JobStore) -> None:
    ids = {store.submit(JobKind.ROLLOUT, SPEC, "alice").job_id for _ in range(3)}
    assert len(ids) == 3


def test_pages_walk_every_job_newest_first(store: JobStore) -> None:
    ids = [store.submit(JobKind.ROLLOUT, SPEC, "alice").job_id for _ in range(7)]
    seen, cursor = [], None
    while True:
        jobs, cursor = store.list_jobs(limit=3, cursor=cursor)
        seen += [j.id for j in jobs]
        assert len(jobs) <= 3
        if cursor is None:
            break
    assert seen == ids[::-1]


def test_filters_by_kind_and_state(store: JobStore) -> None:
    r1 = store.submit(JobKind.ROLLOUT, SPEC, "alice").job_id
    r2 = store.submit(JobKind.ROLLOUT, SPEC, "alice").job_id
    e1 = store.submit(JobKind.EVAL, {"checkpoint": "c", "dataset": "d"}, "bob").job_id
    assert store.cancel(r1, "alice") is JobState.CANCELLED
    assert [j.id for j in store.list_jobs(kind=JobKind.ROLLOUT)[0]] == [r2, r1]
    assert [j.id for j in store.list_jobs(state=JobState.QUEUED)[0]] == [e1, r2]
    cancelled = store.list_jobs(kind=JobKind.ROLLOUT, state=JobState.CANCELLED)[0]
    assert [j.id for j in cancelled] == [r1]
    assert store.list_jobs(kind=JobKind.TRAIN)[0] == []
    eval_job = store.get(e1)
    assert eval_job is not None and "evaluator service" in eval_job.message


def test_cancel_unknown_and_finished_jobs(store: JobStore) -> None:
    assert store.cancel("missing", "alice") is None
    job = store.submit(JobKind.ROLLOUT, SPEC, "alice").job_id
    assert store.cancel(job, "alice") is JobState.CANCELLED
    assert store.cancel(job, "alice") is JobState.CANCELLED  # unchanged
    got = store.get(job)
    assert got is not None and got.finished_at is not None and "alice" in got.message


def test_logs_are_paged_by_offset(store: JobStore) -> None:
    job = store.submit(JobKind.ROLLOUT, SPEC, "alice").job_id
    for i in range(5):
        store.log(job, f"line {i}")
    lines, nxt = store.logs(job, 0, 3)
    assert [ln.message for ln in lines] == ["line 0", "line 1", "line 2"] and nxt == 3
    lines, nxt = store.logs(job, nxt, 10)
    assert [ln.message for ln in lines] == ["line 3", "line 4"] and nxt == 5


def test_only_the_newest_log_lines_are_kept(rclient: redis.Redis) -> None:
    store = JobStore(rclient, log_lines_kept=3)
    job = store.submit(JobKind.ROLLOUT, SPEC, "alice").job_id
    for i in range(5):
        store.log(job, f"line {i}")
    assert [ln.message for ln in store.logs(job, 0, 10)[0]] == ["line 2", "line 3", "line 4"]


def test_the_in_flight_quota_is_exact_under_racing_submissions(
    store: JobStore, rclient: redis.Redis
) -> None:
    """32 threads submit at once against a limit of 4: exactly 4 jobs exist afterwards."""
    start = threading.Barrier(32)
    outcomes: list[str] = []

    def one() -> None:
        start.wait()
        try:
            store.submit(JobKind.ROLLOUT, SPEC, "alice", max_in_flight=4)
            outcomes.append("new")
        except QuotaExceeded as exc:
            assert (exc.in_flight, exc.limit) == (4, 4)
            outcomes.append("quota")

    threads = [threading.Thread(target=one) for _ in range(32)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert sorted(outcomes) == ["new"] * 4 + ["quota"] * 28
    assert store.count() == 4 == store.in_flight("alice")


def test_a_refused_submission_writes_nothing_and_keeps_its_idempotency_key(
    store: JobStore,
) -> None:
    store.submit(JobKind.ROLLOUT, SPEC, "alice", max_in_flight=1)
    with pytest.raises(QuotaExceeded):
        store.submit(JobKind.ROLLOUT, SPEC, "alice", idempotency_key="k", max_in_flight=1)
    assert store.count() == 1
    other = store.submit(JobKind.ROLLOUT, SPEC, "bob", max_in_flight=1)  # bob counts apart
    assert other.created


def test_the_in_flight_count_heals_from_jobs_that_vanished(
    store: JobStore, rclient: redis.Redis
) -> None:
    """A member whose job hash is gone (or ended by an older script version) is dropped
    when it would refuse a submission, instead of blocking the token for ever."""
    old = store.submit(JobKind.ROLLOUT, SPEC, "alice", max_in_flight=1).job_id
    rclient.delete(store.key("job", old))
    again = store.submit(JobKind.ROLLOUT, SPEC, "alice", max_in_flight=1)
    assert again.created and store.in_flight("alice") == 1
