"""Credentials of the adapter in training mode (``worker_token`` set), attacked directly.

The attacker is the policy inside a sandbox: it may hold its own trajectory's token (the relay
adds it to its calls) and wants reward 1 or an excluded failure instead of a 0. Against the
adapter directly (without the relay in front) every one of these must fail with 401/403:
reading another record, writing turns into another trajectory, closing another trajectory or its
own, opening records, untracked completions. The worker's own calls keep working.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import redis

from adapter.config import AdapterConfig
from tests.integration.adapter.conftest import (
    ADMIN_TOKEN,
    AdapterFactory,
    EnginePool,
    RunningAdapter,
)
from tests.support.redis import RedisServer

pytestmark = pytest.mark.engines("a")

WORKER_TOKEN = "worker-token-for-tests-0123456789"
CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}


def bearer(token: str) -> dict[str, Any]:
    return {"authorization": f"Bearer {token}"}


WORKER = bearer(WORKER_TOKEN)


def open_trajectory(a: RunningAdapter, tid: str) -> str:
    r = a.http.post(f"{a.url}/trajectories", json={"trajectory_id": tid}, headers=WORKER)
    assert r.status_code == 201, r.text
    token = r.json()["token"]
    assert isinstance(token, str) and token.startswith("swt_")
    return token


def chat(a: RunningAdapter, tid: str, headers: dict[str, Any]) -> httpx.Response:
    return a.http.post(f"{a.t(tid)}/chat/completions", json=CHAT, headers=headers)


def record(a: RunningAdapter, tid: str) -> dict[str, Any]:
    r = a.http.get(f"{a.url}/trajectories/{tid}", headers=WORKER)
    assert r.status_code == 200, r.text
    data: dict[str, Any] = r.json()
    return data


def assert_refused(r: httpx.Response) -> None:
    assert r.status_code in (401, 403), (r.status_code, r.text)
    assert r.json()["error"]["type"] in ("authentication_error", "permission_error")


def test_a_trajectory_token_opens_nothing_but_its_own_routes(
    adapter: AdapterFactory, engines: EnginePool, redis_server: RedisServer
) -> None:
    with adapter([engines.a.url], worker_token=WORKER_TOKEN) as a:
        mine, other = "auth-mine", "auth-other"
        my_token = open_trajectory(a, mine)
        other_token = open_trajectory(a, other)
        me = bearer(my_token)
        # own routes work, and are recorded
        assert chat(a, mine, me).status_code == 200
        assert a.http.get(f"{a.t(mine)}/models", headers=me).status_code == 200
        assert chat(a, other, bearer(other_token)).status_code == 200
        before = record(a, other)
        # -- attacks with my own token (what a sandbox could add), or none ------------------
        for headers in (
            me,
            {},
            bearer("swt_guess"),
            {"authorization": "Bearer \u00e9\u00e9".encode()},
        ):
            assert_refused(chat(a, other, headers))  # inject turns into another trajectory
            assert_refused(a.http.get(f"{a.t(other)}/models", headers=headers))
            for path in (f"/trajectories/{other}", f"/trajectories/{other}/raw"):
                assert_refused(a.http.get(f"{a.url}{path}", headers=headers))
            assert_refused(
                a.http.post(
                    f"{a.url}/trajectories/{other}/close",
                    json={"outcome": {"status": "completed", "reward": 1.0}},
                    headers=headers,
                )
            )
            # ... and its own: an "aborted" would turn a 0 into an excluded failure
            assert_refused(
                a.http.post(
                    f"{a.url}/trajectories/{mine}/close",
                    json={"outcome": {"status": "aborted", "abort_reason": "x"}},
                    headers=headers,
                )
            )
            assert_refused(
                a.http.post(
                    f"{a.url}/trajectories", json={"trajectory_id": "forged"}, headers=headers
                )
            )
            assert_refused(a.http.post(f"{a.url}/v1/chat/completions", json=CHAT, headers=headers))
            assert_refused(a.http.get(f"{a.url}/admin/versions", headers=headers))
        # no token is accepted for a trajectory it was not issued for, nor for an unknown one
        assert_refused(chat(a, "auth-never-opened", me))
        # the worker token is not a trajectory token, nor the admin token
        assert_refused(chat(a, mine, WORKER))
        assert_refused(a.http.get(f"{a.url}/admin/versions", headers=WORKER))
        assert a.http.get(f"{a.url}/admin/versions", headers=bearer(ADMIN_TOKEN)).status_code == 200
        # nothing of the other trajectory changed; no forged record exists
        after = record(a, other)
        assert after["segments"] == before["segments"] and after["status"] == "open"
        missing = a.http.get(f"{a.url}/trajectories/forged", headers=WORKER)
        assert missing.status_code == 404
        # -- the worker closes with the real outcome: that is what is kept -------------------
        zero = {"status": "completed", "reward": 0.0}
        closed = a.http.post(
            f"{a.url}/trajectories/{mine}/close", json={"outcome": zero}, headers=WORKER
        )
        assert closed.status_code == 200, closed.text
        assert closed.json()["outcome"]["reward"] == 0.0
        assert closed.json()["outcome"]["status"] == "completed"
        assert record(a, mine)["counters"]["turns"] == 1
        # untracked completions with the worker token (default policy in training mode)
        assert a.http.post(f"{a.url}/v1/chat/completions", json=CHAT, headers=WORKER).is_success
    # only a digest of the tokens is stored
    client = redis.Redis.from_url(redis_server.url)
    try:
        info = client.hgetall(f"swerl:traj:{mine}:info")
    finally:
        client.close()
    assert my_token.encode() not in b"".join(info.values())
    assert len(info[b"token_sha256"]) == 64


def test_open_mode_and_policies(adapter: AdapterFactory, engines: EnginePool) -> None:
    """Without a worker token nothing but /admin is checked (development); the untracked
    policy can switch the untracked route off."""
    with adapter([engines.a.url], untracked_completions="off") as a:
        r = a.http.post(f"{a.url}/trajectories", json={"trajectory_id": "auth-open"})
        assert r.status_code == 201 and r.json()["token"].startswith("swt_")
        assert chat(a, "auth-open", {}).status_code == 200
        assert a.http.get(f"{a.url}/trajectories/auth-open").status_code == 200
        refused = a.http.post(f"{a.url}/v1/chat/completions", json=CHAT)
        assert refused.status_code == 403 and "untracked" in refused.json()["error"]["message"]
    with adapter([engines.a.url], worker_token=WORKER_TOKEN, untracked_completions="open") as a:
        assert a.http.post(f"{a.url}/v1/chat/completions", json=CHAT).status_code == 200


def test_training_mode_config_validation(model_dir: Any) -> None:
    base = {"engines": ["http://127.0.0.1:1"], "model": str(model_dir)}
    cfg = AdapterConfig(**base, worker_token=WORKER_TOKEN)
    assert cfg.auto_open_trajectories is False
    assert cfg.untracked_completions == "worker_token"
    open_cfg = AdapterConfig(**base)
    assert open_cfg.auto_open_trajectories is True and open_cfg.untracked_completions == "open"
    bad = [
        {"worker_token": WORKER_TOKEN, "auto_open_trajectories": True},  # unauthenticated records
        {"worker_token": WORKER_TOKEN, "admin_token": WORKER_TOKEN},  # one role per token
        {"worker_token": "short"},
        {"untracked_completions": "worker_token"},  # no worker token to check
        {"untracked_completions": "anyone"},
    ]
    for extra in bad:
        with pytest.raises(ValueError):
            AdapterConfig(**base, **extra)
