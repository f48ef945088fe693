"""Agent-step weight refresh while trajectories are mid-conversation (2 engines, real weights)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
import torch
from transformers import AutoModelForCausalLM

from services.protocol import Segment
from services.store import load_trajectory
from tests.integration.adapter.conftest import AdapterFactory, EnginePool, RunningAdapter

pytestmark = pytest.mark.engines("a", "b")

N_TRAJECTORIES = 8
N_TURNS = 4


def logprobs_under(model_dir: Path, segment: Segment) -> list[torch.Tensor]:
    """Per turn, the logprobs ``model_dir``'s weights assign to that turn's output tokens."""
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    tokens = segment.token_ids()
    with torch.no_grad():
        logps = torch.log_softmax(model(torch.tensor([tokens])).logits[0], dim=-1)
    out, pos = [], len(segment.prompt_ids)
    for turn in segment.turns:
        pos += len(turn.observation_ids)
        ids = torch.tensor(list(turn.output_ids))
        out.append(logps[pos - 1 : pos - 1 + len(ids)].gather(1, ids[:, None])[:, 0])
        pos += len(ids)
    return out


def current_version(a: RunningAdapter) -> int:
    version: int = a.http.get(f"{a.url}/admin/versions", headers=a.admin()).json()[
        "current_version"
    ]
    return version


async def run_conversations(a: RunningAdapter, refresh: dict[str, Any]) -> list[list[int]]:
    """8 agents, each N_TURNS calls; returns every HTTP status seen per trajectory.

    Every agent finishes two turns before the refresh (so all are mid-conversation); the even
    agents' third calls are in flight when the gate closes, the odd agents' third calls are sent
    once it is closed (they must wait, then run on the new weights); every last call comes
    after the refresh.
    """
    two_done = [0]
    started = asyncio.Event()
    refreshed = asyncio.Event()
    statuses: list[list[int]] = [[] for _ in range(N_TRAJECTORIES)]

    async def agent(i: int, client: httpx.AsyncClient) -> None:
        messages: list[dict[str, Any]] = [{"role": "user", "content": f"task {i}"}]
        for turn in range(N_TURNS):
            if turn == 2:
                await started.wait()
                if i % 2:  # odd agents send their third call while the gate is closed
                    while a.service.gate.is_open and not refreshed.is_set():
                        await asyncio.sleep(0.001)
            if turn == N_TURNS - 1:
                await refreshed.wait()
            r = await client.post(
                f"{a.t(f'refresh-{i}')}/chat/completions",
                # Even agents' third steps are long, so the drain outlasts the odd arrivals.
                json={
                    "messages": messages,
                    "max_tokens": (48 if turn == 2 and i % 2 == 0 else 6) + 3 * i,
                    "temperature": 1.0,
                },
            )
            statuses[i].append(r.status_code)
            if r.status_code != 200:
                return
            messages += [r.json()["choices"][0]["message"], {"role": "user", "content": f"o{turn}"}]
            if turn == 1:
                two_done[0] += 1
                if two_done[0] == N_TRAJECTORIES:
                    started.set()

    async def trigger(client: httpx.AsyncClient) -> None:
        await started.wait()
        deadline = time.monotonic() + 30
        while a.service.gate.inflight == 0:  # close the gate on running agent steps
            assert time.monotonic() < deadline, "no agent step ever in flight"
            await asyncio.sleep(0.001)
        try:
            r = await client.post(f"{a.url}/admin/weights", json=refresh["body"], headers=a.admin())
            refresh["status"] = r.status_code
            refresh["response"] = r.json()
        finally:
            refreshed.set()

    async with httpx.AsyncClient(timeout=120) as client:
        await asyncio.gather(trigger(client), *(agent(i, client) for i in range(N_TRAJECTORIES)))
    return statuses


def test_refresh_between_agent_steps(
    adapter: AdapterFactory,
    engines: EnginePool,
    model_dir: Path,
    model_dir_seed1: Path,
    redis_url: str,
) -> None:
    with adapter([engines.a.url, engines.b.url]) as a:
        v0 = current_version(a)
        v1 = v0 + 1
        refresh: dict[str, Any] = {"body": {"model_path": str(model_dir_seed1), "version": v1}}
        try:
            statuses = asyncio.run(run_conversations(a, refresh))
            assert refresh["status"] == 200, refresh["response"]
            assert statuses == [[200] * N_TURNS] * N_TRAJECTORIES  # nothing failed or aborted
            summary = refresh["response"]
            assert summary["version"] == v1
            assert summary["inflight_at_close"] >= 1
            assert summary["gate_closed_s"] >= summary["drain_s"] + summary["load_s"] > 0
            assert set(summary["engines"]) == {engines.a.url, engines.b.url}
            versions = a.http.get(f"{a.url}/admin/versions", headers=a.admin()).json()
            assert [e["weight_version"] for e in versions["engines"]] == [str(v1), str(v1)]
            for engine in (engines.a, engines.b):
                info = httpx.get(f"{engine.url}/model_info").json()
                assert info["weight_version"] == str(v1)
        finally:
            restore = {"model_path": str(model_dir), "version": v1 + 1}
            restored = a.http.post(f"{a.url}/admin/weights", json=restore, headers=a.admin())
            assert restored.status_code == 200, restored.text

    client = redis.Redis.from_url(redis_url)
    waited_turns = 0
    engines_used = set()
    for i in range(N_TRAJECTORIES):
        record = load_trajectory(client, f"refresh-{i}")
        assert len(record.segments) == 1
        segment = record.segments[0]
        turns = segment.turns
        versions = [t.weight_version for t in turns]
        # Old version strictly before the refresh, new version after, for every agent.
        assert versions == sorted(versions)
        assert versions[:2] == [v0, v0] and versions[-1] == v1
        assert all(t.finish_reason in ("stop", "length") for t in turns)
        for turn in turns:
            engines_used.add(turn.engine)
            if turn.queue_wait_s > 0.001:  # arrived while the gate was closed: waited, then new
                waited_turns += 1
                assert turn.weight_version == v1
        # The weights that produced each turn are the ones its version names.
        old = logprobs_under(model_dir, segment)
        new = logprobs_under(model_dir_seed1, segment)
        for turn, lp_old, lp_new in zip(turns, old, new, strict=True):
            recorded = torch.tensor(list(turn.output_logprobs))
            expected = lp_old if turn.weight_version == v0 else lp_new
            assert torch.max(torch.abs(recorded - expected)).item() < 1e-4
    assert waited_turns >= 1  # some requests arrived during the refresh and waited
    assert engines_used == {engines.a.url, engines.b.url}


def test_engine_out_of_rotation_during_refresh_is_reloaded_before_readmission(
    adapter: AdapterFactory, engines: EnginePool, model_dir: Path
) -> None:
    with adapter([engines.a.url, engines.b.url]) as a:
        v = current_version(a) + 1
        router = a.service.router
        a.call(lambda: router.mark_unhealthy(router.engine(engines.b.url), "test: taken out"))
        r = a.http.post(
            f"{a.url}/admin/weights",
            json={"model_path": str(model_dir), "version": v},
            headers=a.admin(),
        )
        assert r.status_code == 200, r.text
        assert set(r.json()["engines"]) == {engines.a.url}  # only engines in rotation load
        deadline = time.monotonic() + 20
        while not a.http.get(f"{a.url}/health").json()["engines"][engines.b.url]:
            assert time.monotonic() < deadline, "engine b was not readmitted"
            time.sleep(0.1)
        # The prober loaded the current weights into b before putting it back.
        assert httpx.get(f"{engines.b.url}/model_info").json()["weight_version"] == str(v)
        response = a.chat(
            "after-readmission", {"messages": [{"role": "user", "content": "x"}], "max_tokens": 4}
        )
        assert response.headers["x-swerl-weight-version"] == str(v)


def test_an_engine_in_rotation_on_other_weights_is_taken_out_and_reloaded(
    adapter: AdapterFactory, engines: EnginePool, model_dir: Path
) -> None:
    """An engine that restarted between two calls serves its start-up weights while the
    adapter never saw it fail: the prober's audit of the engines in rotation takes it out
    and the readmission reloads the current version before it serves again."""
    with adapter([engines.a.url, engines.b.url]) as a:
        v = current_version(a) + 1
        body = {"model_path": str(model_dir), "version": v}
        refreshed = a.http.post(f"{a.url}/admin/weights", json=body, headers=a.admin())
        assert refreshed.status_code == 200, refreshed.text
        # b "restarts": its start-up weights again, version 0, behind the adapter's back
        fresh = {"model_path": str(model_dir), "weight_version": "0"}
        restarted = httpx.post(f"{engines.b.url}/update_weights_from_disk", json=fresh)
        assert restarted.status_code == 200, restarted.text
        assert httpx.get(f"{engines.b.url}/model_info").json()["weight_version"] == "0"
        deadline = time.monotonic() + 20
        while httpx.get(f"{engines.b.url}/model_info").json()["weight_version"] != str(v):
            assert time.monotonic() < deadline, "the engine on version 0 stayed in rotation"
            time.sleep(0.1)
        while not a.http.get(f"{a.url}/health").json()["engines"][engines.b.url]:
            assert time.monotonic() < deadline, "engine b was not readmitted"
            time.sleep(0.1)
        response = a.chat(
            "after-audit", {"messages": [{"role": "user", "content": "x"}], "max_tokens": 4}
        )
        assert response.headers["x-swerl-weight-version"] == str(v)


def test_bad_model_path_is_refused_before_anything_drains(
    adapter: AdapterFactory, engines: EnginePool, model_dir: Path, tmp_path: Path
) -> None:
    """A path that cannot load is a 400; the gate never closes, every engine keeps serving."""
    truncated = tmp_path / "truncated"
    truncated.mkdir()
    (truncated / "config.json").write_bytes((model_dir / "config.json").read_bytes())
    (truncated / "model.safetensors").write_bytes(
        (model_dir / "model.safetensors").read_bytes()[:64]
    )
    no_weights = tmp_path / "no-weights"
    no_weights.mkdir()
    (no_weights / "config.json").write_text("{}")
    with adapter([engines.a.url, engines.b.url]) as a:
        v = current_version(a)
        before = [
            httpx.get(f"{e.url}/model_info").json()["weight_version"]
            for e in (engines.a, engines.b)
        ]
        closes: list[bool] = []
        gate = a.service.gate
        original_close = gate.close
        gate.close = lambda: (closes.append(True), original_close())[1]  # type: ignore[method-assign]
        for bad, fragment in [
            (tmp_path / "nowhere", "does not exist"),
            (no_weights, "no weights"),
            (truncated, "does not fit the file"),
            ("relative/dir", "absolute"),
        ]:
            r = a.http.post(
                f"{a.url}/admin/weights",
                json={"model_path": str(bad), "version": v + 1},
                headers=a.admin(),
            )
            assert r.status_code == 400, r.text
            error = r.json()["error"]
            assert error["code"] == "invalid_model_path" and error["param"] == "model_path"
            assert fragment in error["message"] and "nothing was drained" in error["message"]
        assert closes == []
        health = a.http.get(f"{a.url}/health").json()
        assert health["engines"] == {engines.a.url: True, engines.b.url: True}
        assert current_version(a) == v
        after = [
            httpx.get(f"{e.url}/model_info").json()["weight_version"]
            for e in (engines.a, engines.b)
        ]
        assert after == before
        response = a.chat(None, {"messages": [{"role": "user", "content": "x"}], "max_tokens": 2})
        assert response.status_code == 200, response.text
