"""The claim / lease / heartbeat protocol on real Redis (runners and trainers)."""

from __future__ import annotations

import time

import pytest

from services.api.claims import JobClaims, LeaseKeeper
from services.api.schemas import JobKind, JobState, Progress
from services.api.store import JobStore, QuotaExceeded

TRAIN = {"model": "m", "dataset": "d", "steps": 2, "checkpoint_dir": "/c"}


def submit_train(store: JobStore, group: str = "g1") -> str:
    return store.submit(JobKind.TRAIN, TRAIN, "alice", group=group).job_id


def test_one_active_train_job_per_group_fifo(store: JobStore, claims: JobClaims) -> None:
    first, second = submit_train(store), submit_train(store)
    other = submit_train(store, "g2")
    got = claims.claim(JobKind.TRAIN, "g1", "trainer-a", ttl_s=30)
    assert got is not None and (got.job_id, got.attempt) == (first, 1)
    assert claims.claim(JobKind.TRAIN, "g1", "trainer-b", ttl_s=30) is None  # g1 is busy
    g2 = claims.claim(JobKind.TRAIN, "g2", "trainer-c", ttl_s=30)
    assert g2 is not None and g2.job_id == other
    assert claims.finish(first, "trainer-a", JobState.SUCCEEDED, "done")
    nxt = claims.claim(JobKind.TRAIN, "g1", "trainer-b", ttl_s=30)
    assert nxt is not None and nxt.job_id == second
    job = store.get(first)
    assert job is not None and job.state is JobState.SUCCEEDED and job.finished_at


def test_heartbeat_publishes_progress(store: JobStore, claims: JobClaims) -> None:
    job_id = submit_train(store)
    claims.claim(JobKind.TRAIN, "g1", "t", ttl_s=30)
    prog = Progress(done=1, total=2, current_step=1, phase="actor")
    assert claims.heartbeat(job_id, "t", 30, prog, {"loss": 0.5}) is JobState.RUNNING
    job = store.get(job_id)
    assert job is not None and job.progress == prog and job.metrics == {"loss": 0.5}
    assert job.state is JobState.RUNNING and job.started_at is not None


def test_expired_lease_is_taken_over_and_the_old_holder_is_fenced(
    store: JobStore, claims: JobClaims
) -> None:
    job_id = submit_train(store)
    assert claims.claim(JobKind.TRAIN, "g1", "crashed", ttl_s=0.2) is not None
    time.sleep(0.3)
    taken = claims.claim(JobKind.TRAIN, "g1", "successor", ttl_s=30)
    assert taken is not None and (taken.job_id, taken.attempt) == (job_id, 2)
    assert claims.heartbeat(job_id, "crashed", 30) is None
    assert not claims.finish(job_id, "crashed", JobState.FAILED, "late")
    job = store.get(job_id)
    assert job is not None and job.state is JobState.RUNNING and job.attempt == 2


def test_cancel_of_a_running_job_goes_through_its_holder(
    store: JobStore, claims: JobClaims
) -> None:
    job_id = submit_train(store)
    claims.claim(JobKind.TRAIN, "g1", "t", ttl_s=30)
    assert store.cancel(job_id, "bob") is JobState.CANCELLING
    assert claims.heartbeat(job_id, "t", 30) is JobState.CANCELLING
    assert claims.finish(job_id, "t", JobState.CANCELLED, "stopped")
    job = store.get(job_id)
    assert job is not None and job.state is JobState.CANCELLED
    assert store.list_jobs(state=JobState.CANCELLING)[0] == []


def test_giving_back_requeues_at_the_front(store: JobStore, claims: JobClaims) -> None:
    first, second = submit_train(store), submit_train(store)
    claims.claim(JobKind.TRAIN, "g1", "t", ttl_s=30)
    assert claims.finish(first, "t", JobState.QUEUED, "trainer shutting down")
    again = claims.claim(JobKind.TRAIN, "g1", "t2", ttl_s=30)
    assert again is not None and again.job_id == first and again.attempt == 2
    assert [j.id for j in store.list_jobs(state=JobState.QUEUED)[0]] == [second]


def test_a_cancelled_queued_job_is_never_claimed(store: JobStore, claims: JobClaims) -> None:
    job_id = submit_train(store)
    store.cancel(job_id, "alice")
    assert claims.claim(JobKind.TRAIN, "g1", "t", ttl_s=30) is None


def test_results_are_written_only_by_the_holder(store: JobStore, claims: JobClaims) -> None:
    job_id = store.submit(JobKind.ROLLOUT, {"instance_ids": ["a"]}, "alice").job_id
    claims.claim(JobKind.ROLLOUT, "default", "r1", ttl_s=30, max_active=8)
    assert store.append_results(job_id, "r1", [{"i": 0}, {"i": 1}])
    assert not store.append_results(job_id, "intruder", [{"i": 9}])
    rows, total = store.results(job_id, 1, 10)
    assert rows == [{"i": 1}] and total == 2
    assert store.append_results(job_id, "r1", [{"i": 2}], reset=True)
    assert store.results(job_id, 0, 10) == ([{"i": 2}], 1)


@pytest.mark.slow
def test_a_lease_keeper_keeps_a_short_lease_and_reports(store: JobStore, claims: JobClaims) -> None:
    job_id = submit_train(store)
    claims.claim(JobKind.TRAIN, "g1", "trainer-a", ttl_s=1.0)
    step = {"n": 0}

    def report() -> tuple[Progress, dict[str, float]]:
        step["n"] += 1
        return Progress(current_step=step["n"], phase="actor"), {"loss": 1.0 / step["n"]}

    with LeaseKeeper(claims, job_id, "trainer-a", ttl_s=1.0, interval_s=0.1, report=report):
        time.sleep(2.0)  # well past the ttl: only the heartbeats keep the lease
        assert claims.claim(JobKind.TRAIN, "g1", "trainer-b", ttl_s=5) is None
        job = store.get(job_id)
        assert job is not None and job.state is JobState.RUNNING
        assert job.progress.current_step is not None and job.progress.current_step > 3
    time.sleep(1.2)  # stopped: the lease runs out and another trainer takes over
    taken = claims.claim(JobKind.TRAIN, "g1", "trainer-b", ttl_s=5)
    assert taken is not None and taken.attempt == 2


def test_a_lease_keeper_sees_cancel_and_loss(store: JobStore, claims: JobClaims) -> None:
    job_id = submit_train(store)
    claims.claim(JobKind.TRAIN, "g1", "t", ttl_s=5)
    with LeaseKeeper(claims, job_id, "t", ttl_s=5, interval_s=0.05) as lease:
        assert not lease.cancel_requested.is_set()
        store.cancel(job_id, "alice")
        assert lease.cancel_requested.wait(2)
        claims.finish(job_id, "t", JobState.CANCELLED, "stopped")
        assert lease.lost.wait(2)  # a finished job has no lease any more


def test_every_end_of_a_job_frees_its_place_in_the_quota(
    store: JobStore, claims: JobClaims
) -> None:
    """Finished (by its holder), cancelled while queued, and cancelled after its holder was
    lost: each leaves the submitter's in-flight set; given back (queued again) it stays."""
    done, queued, lost, given = (submit_train(store, g) for g in ("a", "b", "c", "d"))
    assert store.in_flight("alice") == 4
    for group in ("a", "c", "d"):
        assert claims.claim(JobKind.TRAIN, group, f"t-{group}", ttl_s=0.05) is not None
    assert claims.finish(done, "t-a", JobState.SUCCEEDED, "ok")
    store.cancel(queued, "alice")
    assert claims.finish(given, "t-d", JobState.QUEUED, "shutting down")
    store.cancel(lost, "alice")  # running: cancelling until its holder or its lease ends
    assert store.in_flight("alice") == 2
    time.sleep(0.1)
    assert claims.claim(JobKind.TRAIN, "c", "t-other", ttl_s=30) is None  # expired: cancelled
    assert store.get(lost).state == JobState.CANCELLED  # type: ignore[union-attr]
    assert store.in_flight("alice") == 1
    with pytest.raises(QuotaExceeded):
        store.submit(JobKind.TRAIN, TRAIN, "alice", max_in_flight=1)
