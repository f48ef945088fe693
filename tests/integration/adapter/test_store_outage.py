"""Redis going away mid-trajectory: answers continue, turns are kept and written later."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.integration.adapter.conftest import AdapterFactory, EnginePool
from tests.support.redis import RedisServer

pytestmark = pytest.mark.engines("a")


def test_turns_survive_a_redis_outage(
    adapter: AdapterFactory, engines: EnginePool, fresh_redis: RedisServer
) -> None:
    with adapter([engines.a.url], redis_url=fresh_redis.url) as a:
        messages: list[dict[str, Any]] = [{"role": "user", "content": "start"}]

        def step() -> httpx.Response:
            r = a.chat("outage", {"messages": messages, "max_tokens": 4})
            if r.status_code == 200:
                messages.extend(
                    [r.json()["choices"][0]["message"], {"role": "user", "content": "more"}]
                )
            return r

        assert step().status_code == 200
        ready = a.http.get(f"{a.url}/readyz")
        assert ready.status_code == 200 and ready.json()["redis"] == "ok"
        fresh_redis.stop()
        assert step().status_code == 200  # answered; the turn waits in memory
        fetch = a.http.get(f"{a.url}/trajectories/outage")
        assert fetch.status_code == 503
        assert fetch.json()["error"]["code"] == "store_unavailable"
        closing = a.http.post(f"{a.url}/trajectories/outage/close")
        assert closing.status_code == 503
        metrics = a.http.get(f"{a.url}/metrics").text.splitlines()
        failed = [line for line in metrics if line.startswith("swerl_adapter_store_errors_total ")]
        assert float(failed[0].split()[1]) >= 3  # the turn, the fetch and the close attempts
        unready = a.http.get(f"{a.url}/readyz")  # not ready for new work, but alive
        assert unready.status_code == 503
        assert unready.json()["redis"] == "unavailable"
        assert a.http.get(f"{a.url}/health").status_code == 200
        fresh_redis.start()  # same data directory (AOF): the first turn is still there
        assert step().status_code == 200
        record = a.record("outage")
        assert [len(s["turns"]) for s in record["segments"]] == [3]
        assert record["counters"]["turns"] == 3
        assert a.http.post(f"{a.url}/trajectories/outage/close").status_code == 200
        assert a.http.get(f"{a.url}/readyz").json()["status"] == "ready"
