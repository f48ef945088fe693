"""deploy/healthcheck.py's Redis checks against a real Redis: PING, and a worker's heartbeat
key as the sandbox worker writes it (services/queue)."""

from __future__ import annotations

import pytest
import redis

from services.queue.keys import Keys
from tests.support.deploy_scripts import load

hc = load("healthcheck")
pytestmark = pytest.mark.slow


def test_redis_ping(redis_url: str) -> None:
    assert hc.main(["redis", redis_url]) == 0
    with pytest.raises(hc.Unhealthy, match=r"redis 127\.0\.0\.1:1/0"):
        hc.check_redis("redis://:secret@127.0.0.1:1/0", 1.0)


def test_worker_is_healthy_while_its_heartbeat_key_exists(redis_url: str) -> None:
    env = {"SWERL_WORKER__REDIS_URL": redis_url, "SWERL_WORKER__NODE": "node5"}
    with pytest.raises(hc.Unhealthy, match="no heartbeat at swerl:node:node5"):
        hc.check_worker(env)
    client = redis.Redis.from_url(redis_url)
    client.hset(Keys("swerl:").node("node5"), mapping={"slots": 4})
    client.close()
    hc.check_worker(env)
