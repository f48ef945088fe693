"""Benchmark of the job API: request latency under many concurrent clients.

Usage (from the repository root)::

    .venv/bin/python bench/bench_api.py            # 100 clients x 60 requests
    .venv/bin/python bench/bench_api.py --quick    # 100 clients x 10 requests, seconds
    .venv/bin/python bench/bench_api.py --clients 200 --json out.json

Real processes: a private ``redis-server`` (AOF on, ``appendfsync everysec``, the production
setting) and ``python -m services.api`` with tokens and no job runner (the figures are the
API's own: auth, validation, Redis round trips, JSON). Each client is an asyncio task with
its own keep-alive connection: it connects (timed apart as ``connect``: the first request of
a new connection), waits until every client has connected, then issues a mix in a loop: 20%
submit a rollout job, 40% read a job, 30% list a page of 20 jobs, 10% read a job's logs. The
store is seeded with jobs first.
Printed: p50 / p99 / max latency per operation and overall, and requests per second.
Nothing here asserts; ``tests/unit/services/api/test_bench_api.py`` runs a tiny smoke run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import ssl
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import redis

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.api_server import bearer, start_api  # noqa: E402
from tests.support.redis import start_redis, stop_redis  # noqa: E402

MIX = (("submit", 0.2), ("get", 0.4), ("list", 0.3), ("logs", 0.1))
SPEC = {"instance_ids": ["django__django-11099", "astropy__astropy-12907"], "n_samples": 4}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def client_loop(
    url: str,
    n: int,
    job_ids: list[str],
    seed: int,
    out: dict[str, list[float]],
    ready: asyncio.Barrier,
    tls: ssl.SSLContext,
) -> None:
    rng = random.Random(seed)
    ops, weights = zip(*MIX, strict=True)
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    async with httpx.AsyncClient(
        base_url=url, headers=bearer("alice"), limits=limits, timeout=60, verify=tls
    ) as http:
        start = time.perf_counter()
        await http.get("/healthz")  # connect first: set-up is timed apart from the requests
        out["connect"].append(time.perf_counter() - start)
        await ready.wait()  # every client connected: the timed run starts together
        for _ in range(n):
            op = rng.choices(ops, weights)[0]
            job = rng.choice(job_ids)
            start = time.perf_counter()
            if op == "submit":
                got = await http.post("/v1/jobs/rollout", json=SPEC)
            elif op == "get":
                got = await http.get(f"/v1/jobs/{job}")
            elif op == "list":
                got = await http.get("/v1/jobs", params={"limit": 20})
            else:
                got = await http.get(f"/v1/jobs/{job}/logs")
            out[op].append(time.perf_counter() - start)
            if got.status_code >= 400:
                out["errors"].append(float(got.status_code))


async def run_clients(url: str, clients: int, per_client: int, job_ids: list[str]) -> Any:
    out: dict[str, list[float]] = {op: [] for op, _ in MIX} | {"errors": [], "connect": []}
    ready = asyncio.Barrier(clients + 1)
    # One TLS context for all (unused on http://, but httpx would build one per client, which
    # costs the bench process tens of ms of CPU each and would show up as connect time).
    tls = ssl.create_default_context()
    tasks = [
        asyncio.create_task(client_loop(url, per_client, job_ids, seed, out, ready, tls))
        for seed in range(clients)
    ]
    await ready.wait()
    start = time.perf_counter()
    await asyncio.gather(*tasks)
    return out, time.perf_counter() - start


def seed_jobs(url: str, n: int) -> list[str]:
    with httpx.Client(base_url=url, headers=bearer("alice"), timeout=60) as http:
        return [http.post("/v1/jobs/rollout", json=SPEC).json()["id"] for _ in range(n)]


def figures(out: dict[str, list[float]], wall_s: float) -> dict[str, Any]:
    result: dict[str, Any] = {}
    every = [v for op, _ in MIX for v in out[op]]
    for name, values in [*((op, out[op]) for op, _ in MIX), ("all", every)]:
        if values:
            result[name] = {
                "n": len(values),
                "p50_ms": round(statistics.median(values) * 1000, 2),
                "p99_ms": round(percentile(values, 0.99) * 1000, 2),
                "max_ms": round(max(values) * 1000, 2),
            }
    connect = out["connect"]
    result["connect"] = {
        "n": len(connect),
        "p50_ms": round(statistics.median(connect) * 1000, 2),
        "p99_ms": round(percentile(connect, 0.99) * 1000, 2),
    }
    result["requests_per_s"] = round(len(every) / wall_s, 1)
    result["errors"] = len(out["errors"])
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true", help="10 requests per client (seconds)")
    p.add_argument("--clients", type=int, default=100, help="concurrent clients (100)")
    p.add_argument("--requests", type=int, help="requests per client (60; --quick 10)")
    p.add_argument("--seed-jobs", type=int, default=200, help="jobs stored before the run (200)")
    p.add_argument("--json", type=Path, help="also write the figures to this file")
    args = p.parse_args(argv)
    per_client = args.requests or (10 if args.quick else 60)
    server = start_redis()
    client = redis.Redis.from_url(server.url)
    client.config_set("appendfsync", "everysec")
    client.close()
    # Every submission stays queued (no runner): no in-flight quota for the bench's token.
    quota = {"SWERL_API__QUOTAS__MAX_JOBS_IN_FLIGHT": "0"}
    api = start_api(server.url, server.data_dir, runner_threads=0, env=quota)
    try:
        job_ids = seed_jobs(api.url, max(1, args.seed_jobs))
        out, wall = asyncio.run(run_clients(api.url, args.clients, per_client, job_ids))
    finally:
        api.stop()
        stop_redis(server)
    result = {"clients": args.clients, "requests_per_client": per_client,
              "cpus": os.cpu_count(), **figures(out, wall)}  # fmt: skip
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
