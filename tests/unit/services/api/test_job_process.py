"""The job-process services announce that they serve their kind and group (what a train
submission checks before warning), at most every ANNOUNCE_INTERVAL_S, busy or idle."""

from __future__ import annotations

import logging
import threading
from types import SimpleNamespace

import redis

from services.api.job_process import ProcessJobService
from services.api.schemas import JobKind


class Store:
    def __init__(self, fail: bool = False) -> None:
        self.calls: list[tuple[JobKind, str, str]] = []
        self.fail = fail

    def announce(self, kind: JobKind, group: str, holder: str) -> None:
        if self.fail:
            raise redis.ConnectionError("down")
        self.calls.append((kind, group, holder))


def service(store: Store) -> ProcessJobService:
    svc = ProcessJobService.__new__(ProcessJobService)  # no Redis: only what announce uses
    svc.kind, svc.holder = JobKind.TRAIN, "trainer:gpu-a:h:1"
    svc.cfg = SimpleNamespace(group="gpu-a")  # type: ignore[assignment]
    svc.store = store  # type: ignore[assignment]
    svc.stop_event = threading.Event()
    svc._announced = -float("inf")
    svc.log = logging.getLogger("test")
    return svc


def test_a_service_announces_its_kind_and_group_at_most_every_interval() -> None:
    store = Store()
    svc = service(store)
    svc.announce()
    svc.announce()  # within the interval: not again
    assert store.calls == [(JobKind.TRAIN, "gpu-a", "trainer:gpu-a:h:1")]
    svc._announced -= 3600  # the interval has passed
    svc.announce()
    assert len(store.calls) == 2


def test_a_redis_outage_while_busy_does_not_stop_the_job() -> None:
    svc = service(Store(fail=True))
    svc._announce_while_busy()  # no exception: the lease decides what happens to the job
