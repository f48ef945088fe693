"""Capacity of the trajectory store: many concurrent trajectories wait for Redis connections.

redis-py's default async pool holds 100 connections and *raises* past them, so with 256
concurrent trajectories 156 used to get ``503 store_unavailable``. The adapter's pool blocks:
a call waits for a free connection, and only a wait longer than ``redis_pool_timeout_s`` is a
503 that says so.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
import redis

from services.protocol import TrajectoryMeta
from services.store import TrajectoryStore
from tests.integration.adapter.conftest import AdapterFactory, EnginePool

pytestmark = pytest.mark.engines("a")

N_TRAJECTORIES = 256


async def _run_trajectories(url: str, n: int) -> list[httpx.Response]:
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=n)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:

        async def one(i: int) -> httpx.Response:
            body = {"messages": [{"role": "user", "content": f"task {i}"}], "max_tokens": 1}
            return await client.post(f"{url}/t/cap-{i}/v1/chat/completions", json=body)

        return await asyncio.gather(*(one(i) for i in range(n)))


def test_256_concurrent_trajectories_are_all_recorded(
    adapter: AdapterFactory, engines: EnginePool
) -> None:
    with adapter([engines.a.url]) as a:
        responses = asyncio.run(_run_trajectories(a.url, N_TRAJECTORIES))
        failed = [(r.status_code, r.text[:200]) for r in responses if r.status_code != 200]
        assert failed == []
        for i in range(N_TRAJECTORIES):
            record = a.record(f"cap-{i}")
            assert record["counters"]["turns"] == 1


def test_store_waits_for_a_free_connection(redis_url: str) -> None:
    """64 concurrent writes through a pool of 2 connections: all succeed, never a 3rd socket."""
    probe = redis.Redis.from_url(redis_url)
    before = int(probe.info("clients")["connected_clients"])

    async def scenario() -> int:
        store = TrajectoryStore.from_url(redis_url, "cap:", max_connections=2, pool_timeout_s=60)
        try:
            await asyncio.gather(
                *(store.open(TrajectoryMeta(trajectory_id=f"w-{i}")) for i in range(64))
            )
            opened = int(probe.info("clients")["connected_clients"]) - before
            for i in range(64):
                assert await store.status(f"w-{i}") == "open"
            return opened
        finally:
            await store.close_connection()

    assert asyncio.run(scenario()) <= 2


def test_pool_timeout_is_a_clear_503(adapter: AdapterFactory, engines: EnginePool) -> None:
    """With every connection busy past the pool timeout, the answer is a 503 naming the cause;
    once a connection is free again the same call succeeds."""
    with adapter([engines.a.url], redis_max_connections=1, redis_pool_timeout_s=0.2) as a:
        pool = a.service.store.client.connection_pool
        # Take the only connection out of the pool (on the adapter's loop) and keep it.
        held = asyncio.run_coroutine_threadsafe(pool.get_connection(), a.loop).result(timeout=60)
        try:
            response = a.http.post(f"{a.url}/trajectories", json={"trajectory_id": "cap-busy"})
            assert response.status_code == 503, response.text
            error: dict[str, Any] = response.json()["error"]
            assert error["code"] == "store_unavailable"
            assert "no Redis connection became free within 0.2 s" in error["message"]
        finally:
            asyncio.run_coroutine_threadsafe(pool.release(held), a.loop).result(timeout=60)
        response = a.http.post(f"{a.url}/trajectories", json={"trajectory_id": "cap-busy"})
        assert response.status_code == 201, response.text
