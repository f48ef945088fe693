"""Token-mode weight refresh: 16 trajectories mid-generation on 2 engines (real weights).

The refresh lands while every trajectory's long first turn is being decoded: the engines are
paused (abort mode), load other weights and continue; the adapter continues each interrupted
request from its prefix. Nothing fails, every answer is complete, the recorded versions switch
exactly once at the refresh point, and a forward pass with the weights each span names
reproduces every recorded logprob.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
import torch

from services.store import load_trajectory
from tests.integration.adapter.conftest import AdapterFactory, EnginePool, RunningAdapter
from tests.integration.adapter.test_refresh import current_version, logprobs_under

pytestmark = [pytest.mark.engines("a", "b"), pytest.mark.slow]

N_TRAJECTORIES = 16
# First-turn budget: long enough that every agent is still decoding when the last one starts
# and when the refresh lands (an answer of ~100 tokens could finish first on a quiet machine).
LONG = 1000
TOKENS_BEFORE_REFRESH = 8  # decoded per request (on average) before the refresh starts


def decoded(urls: list[str]) -> tuple[int, int]:
    """(decoded tokens, running requests) summed over the engines."""
    infos = [httpx.get(f"{u}/get_server_info", timeout=10).json() for u in urls]
    return sum(i["decoded_tokens"] for i in infos), sum(i["num_running_reqs"] for i in infos)


async def run_agents(a: RunningAdapter, urls: list[str], body: dict[str, Any]) -> dict[str, Any]:
    """16 agents: a long first turn (in flight at the refresh), a short second one after it."""
    refreshed = asyncio.Event()
    out: dict[str, Any] = {"statuses": [[] for _ in range(N_TRAJECTORIES)], "usage": {}}
    start_tokens, _ = await asyncio.to_thread(decoded, urls)

    async def agent(i: int, client: httpx.AsyncClient) -> None:
        messages: list[dict[str, Any]] = [{"role": "user", "content": f"long task {i}"}]
        for turn, budget in enumerate((LONG + i, 4)):
            if turn == 1:
                await refreshed.wait()
            r = await client.post(
                f"{a.t(f'token-{i}')}/chat/completions",
                # ignore_eos on the long turn: a sampled end-of-sequence would end it before
                # every agent is in flight, and the trigger would wait in vain.
                json={
                    "messages": messages,
                    "max_tokens": budget,
                    "temperature": 1.0,
                    "ignore_eos": turn == 0,
                },
            )
            out["statuses"][i].append(r.status_code)
            if r.status_code != 200:
                return
            answer = r.json()
            out["usage"][(i, turn)] = (answer["usage"]["completion_tokens"], budget)
            out["usage"][(i, turn, "finish")] = answer["choices"][0]["finish_reason"]
            messages += [answer["choices"][0]["message"], {"role": "user", "content": "next"}]

    async def trigger(client: httpx.AsyncClient) -> None:
        deadline = time.monotonic() + 120
        while True:  # every first turn running and a few tokens into its answer
            tokens, running = await asyncio.to_thread(decoded, urls)
            if running == N_TRAJECTORIES and tokens - start_tokens >= (
                N_TRAJECTORIES * TOKENS_BEFORE_REFRESH
            ):
                break
            assert time.monotonic() < deadline, f"agents never all in flight ({running} running)"
            await asyncio.sleep(0.01)
        try:
            r = await client.post(f"{a.url}/admin/weights", json=body, headers=a.admin())
            out["refresh"] = (r.status_code, r.json())
        finally:
            refreshed.set()

    async with httpx.AsyncClient(timeout=300) as client:
        await asyncio.gather(trigger(client), *(agent(i, client) for i in range(N_TRAJECTORIES)))
    return out


def test_token_refresh_mid_generation(
    adapter: AdapterFactory,
    engines: EnginePool,
    model_dir: Path,
    model_dir_seed1: Path,
    redis_url: str,
) -> None:
    urls = [engines.a.url, engines.b.url]
    with adapter(urls, refresh_mode="token") as a:
        v0 = current_version(a)
        v1 = v0 + 1
        try:
            out = asyncio.run(
                run_agents(a, urls, {"model_path": str(model_dir_seed1), "version": v1})
            )
            status, summary = out["refresh"]
            assert status == 200, summary
            assert out["statuses"] == [[200, 200]] * N_TRAJECTORIES  # no request failed
            assert summary["mode"] == "token" and summary["drain_s"] == 0.0
            assert summary["inflight_at_close"] >= N_TRAJECTORIES - 2  # (nearly) all running
            assert all(r["ok"] for r in summary["engines"].values())
            continued = a.service.weights.barrier.continued
        finally:
            restore = {"model_path": str(model_dir), "version": v1 + 1}
            restored = a.http.post(f"{a.url}/admin/weights", json=restore, headers=a.admin())
            assert restored.status_code == 200, restored.text

    # Every answer is complete: the whole budget (the long turn ignores end-of-sequence), or
    # a natural stop before it.
    for i in range(N_TRAJECTORIES):
        for turn in (0, 1):
            produced, budget = out["usage"][(i, turn)]
            finish = out["usage"][(i, turn, "finish")]
            natural_stop = turn == 1 and produced < budget and finish == "stop"
            assert produced == budget or natural_stop, (i, turn, produced, budget, finish)

    client = redis.Redis.from_url(redis_url)
    interrupted = 0
    for i in range(N_TRAJECTORIES):
        segment = load_trajectory(client, f"token-{i}").segments[0]
        first, second = segment.turns
        assert second.weight_version == v1 and second.version_runs == []
        if first.version_runs:  # interrupted: one switch, old version first, at the pause
            interrupted += 1
            (start0, old), (switch, new) = first.version_runs
            assert (start0, old, new) == (0, v0, v1)
            assert 0 < switch < len(first.output_ids)
        else:  # finished before the pause reached it (all old), or had no token yet (all new)
            assert first.weight_version in (v0, v1), first
        # A forward pass with the weights each span names reproduces every recorded logprob.
        old_lp = logprobs_under(model_dir, segment)
        new_lp = logprobs_under(model_dir_seed1, segment)
        for turn, lp_old, lp_new in zip(segment.turns, old_lp, new_lp, strict=True):
            versions = torch.tensor(turn.token_versions())
            expected = torch.where(versions == v0, lp_old, lp_new)
            recorded = torch.tensor(list(turn.output_logprobs))
            assert torch.max(torch.abs(recorded - expected)).item() < 1e-5, (i, turn)
    assert interrupted >= N_TRAJECTORIES - 2  # the refresh landed mid-turn for (nearly) all
    assert continued == interrupted


def test_a_restarted_engine_is_synced_to_the_latest_version_before_it_joins(
    adapter: AdapterFactory,
    engines: EnginePool,
    model_dir: Path,
    model_dir_seed1: Path,
    tmp_path: Path,
) -> None:
    """An engine down at a token-mode refresh leaves rotation (its pause fails); restarted, it
    serves its start-up weights, and the prober loads the current version before it rejoins."""
    from services.processes import launch
    from tests.support.engines import launch_reference_server
    from tests.support.paths import REPO_ROOT

    spare = launch_reference_server(model_dir, None, "0", (), tmp_path)
    restarted = None
    # a and b too: every session engine ends at the same version (other tests rely on it).
    urls = [engines.a.url, engines.b.url, spare.url]
    with adapter(urls, refresh_mode="token") as a:
        v1 = current_version(a) + 1
        try:
            spare.stop()  # the engine goes down
            body = {"model_path": str(model_dir_seed1), "version": v1}
            r = a.http.post(f"{a.url}/admin/weights", json=body, headers=a.admin())
            assert r.status_code == 200, r.text
            assert set(r.json()["engines"]) == {engines.a.url, engines.b.url}
            health = a.http.get(f"{a.url}/health").json()["engines"]
            assert health == {engines.a.url: True, engines.b.url: True, spare.url: False}
            # Restart on the same port: start-up weights, version "0".
            restarted = launch(
                "restarted reference engine",
                spare.args,
                tmp_path / "restarted.log",
                ready=f"{spare.url}/health",
                timeout_s=300,
                env={"PYTHONPATH": str(REPO_ROOT), "TOKENIZERS_PARALLELISM": "false"},
                cwd=REPO_ROOT,
            )
            deadline = time.monotonic() + 60
            while not a.http.get(f"{a.url}/health").json()["engines"][spare.url]:
                assert time.monotonic() < deadline, "the restarted engine never rejoined"
                time.sleep(0.1)
            info = httpx.get(f"{spare.url}/model_info", timeout=10).json()
            assert info["weight_version"] == str(v1)  # synced before it joined
        finally:
            restore = {"model_path": str(model_dir), "version": v1 + 1}
            restored = a.http.post(f"{a.url}/admin/weights", json=restore, headers=a.admin())
            assert restored.status_code == 200, restored.text
            if restarted is not None:
                restarted.stop()
