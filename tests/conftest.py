"""Shared fixtures: a private real Redis server per test session (flushed per test)."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator

import pytest
import redis

from tests.support.redis import RedisServer, start_redis, stop_redis

# LiteLLM (under OpenHands) would try to download a price table on import: never.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    server = start_redis()
    yield server
    stop_redis(server)


@pytest.fixture
def redis_url(redis_server: RedisServer) -> Iterator[str]:
    """URL of the session's Redis, emptied before each test."""
    if redis_server.proc is None or redis_server.proc.poll() is not None:
        redis_server.start()
    client = redis.Redis.from_url(redis_server.url)
    client.flushall()
    client.close()
    yield redis_server.url


@pytest.fixture
def fresh_redis() -> Iterator[RedisServer]:
    """A Redis of the test's own (for tests that kill or restart it)."""
    server = start_redis()
    yield server
    stop_redis(server)


def pytest_unconfigure(config: pytest.Config) -> None:
    """Quiet torch's loggers before its exit hook runs.

    Some tests configure logging at INFO in-process; torch would then dump its (empty)
    compile statistics into the end of every test run.
    """
    for name in list(logging.root.manager.loggerDict):
        if name == "torch" or name.startswith("torch."):
            logging.getLogger(name).setLevel(logging.WARNING)
