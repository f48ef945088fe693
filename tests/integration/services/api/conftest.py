"""Job store and claims over the session's real Redis (flushed per test)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from services.api.claims import JobClaims
from services.api.store import JobStore


@pytest.fixture
def rclient(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


@pytest.fixture
def store(rclient: redis.Redis) -> JobStore:
    return JobStore(rclient)


@pytest.fixture
def claims(rclient: redis.Redis) -> JobClaims:
    return JobClaims(rclient)
