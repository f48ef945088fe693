"""Every bad input gets a 4xx with a clear OpenAI-style JSON error, and nothing recorded is lost."""

from __future__ import annotations

from typing import Any

import pytest

from tests.integration.adapter.conftest import AdapterFactory, EnginePool

pytestmark = pytest.mark.engines("a")

GOOD = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}


def error_of(response: Any, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error: dict[str, Any] = response.json()["error"]
    assert set(error) == {"message", "type", "code", "param"}
    assert error["message"]
    return error


@pytest.mark.parametrize(
    ("payload", "fragment", "code"),
    [
        (b"{not json", "not valid JSON", "invalid_json"),
        (b"", "request body is empty", "invalid_request"),
        (b"[1, 2]", "must be a JSON object", "invalid_request"),
        (b'{"model": "x"}', "messages: field required", "invalid_request"),
        (b'{"messages": []}', "messages must be a non-empty list", "invalid_request"),
        (b'{"messages": [{"role": "user", "content": "x"}], "n": 3}', "n=3", "invalid_request"),
        (
            b'{"messages": [{"role": "user", "content": "x"}], "tool_choice": "required"}',
            "tool_choice",
            "invalid_request",
        ),
        (
            b'{"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}',
            "only text parts are supported",
            "invalid_request",
        ),
        (
            b'{"messages": [{"role": "user", "content": "x"}], "temperature": -0.5}',
            "temperature",
            "invalid_request",
        ),
    ],
)
def test_malformed_requests(
    adapter: AdapterFactory, engines: EnginePool, payload: bytes, fragment: str, code: str
) -> None:
    with adapter([engines.a.url]) as a:
        for base in (f"{a.url}/v1", a.t("bad-input")):
            response = a.http.post(
                f"{base}/chat/completions",
                content=payload,
                headers={"content-type": "application/json"},
            )
            error = error_of(response, 400)
            assert fragment in error["message"]
            assert error["code"] == code
            assert error["type"] == "invalid_request_error"


def test_errors_in_a_trajectory_lose_nothing(adapter: AdapterFactory, engines: EnginePool) -> None:
    """Rejected requests between good turns leave the record unchanged; the segment continues."""
    with adapter([engines.a.url], context_length=400) as a:
        messages: list[dict[str, Any]] = [{"role": "user", "content": "start"}]
        r = a.chat("keep", {**GOOD, "messages": messages})
        messages += [r.json()["choices"][0]["message"], {"role": "user", "content": "next"}]
        before = a.record("keep")

        too_long = [*messages[:-1], {"role": "user", "content": "word " * 600}]
        error = error_of(a.chat("keep", {**GOOD, "messages": too_long}), 400)
        assert error["code"] == "context_length_exceeded"
        assert "context window is 400 tokens" in error["message"]
        error_of(a.chat("keep", {**GOOD, "messages": messages, "n": 2}), 400)
        error_of(
            a.http.post(
                f"{a.t('keep')}/chat/completions",
                content=b"{oops",
                headers={"content-type": "application/json"},
            ),
            400,
        )
        assert a.record("keep") == before

        r = a.chat("keep", {**GOOD, "messages": messages})
        assert r.status_code == 200
        after = a.record("keep")
        assert after["segments"][0]["turns"][0] == before["segments"][0]["turns"][0]
        assert [len(s["turns"]) for s in after["segments"]] == [2]


def test_trajectory_route_errors(adapter: AdapterFactory, engines: EnginePool) -> None:
    with adapter([engines.a.url]) as a:
        error = error_of(a.http.post(f"{a.url}/trajectories/unknown-id/close"), 404)
        assert "unknown trajectory" in error["message"]
        error_of(a.http.get(f"{a.url}/trajectories/unknown-id"), 404)
        error_of(a.http.get(f"{a.url}/trajectories/unknown-id/raw"), 404)
        bad_id = error_of(a.chat("bad id!", GOOD), 400)
        assert "invalid trajectory id" in bad_id["message"]
        error_of(a.http.post(f"{a.url}/trajectories", json={"task_id": "no id"}), 400)
        error_of(a.http.post(f"{a.url}/trajectories", json={"trajectory_id": "x y"}), 400)
        assert a.http.post(f"{a.url}/trajectories", json={"trajectory_id": "c1"}).status_code == 201
        bad_outcome = a.http.post(
            f"{a.url}/trajectories/c1/close", json={"outcome": {"status": "aborted", "reward": 0}}
        )
        assert "never a 0" in error_of(bad_outcome, 400)["message"]


def test_admin_routes_need_the_token(adapter: AdapterFactory, engines: EnginePool) -> None:
    with adapter([engines.a.url]) as a:
        body = {"model_path": "/nowhere", "version": 99}
        missing = error_of(a.http.post(f"{a.url}/admin/weights", json=body), 401)
        assert "admin bearer token" in missing["message"]
        wrong = {"authorization": "Bearer not-the-token"}
        error_of(a.http.post(f"{a.url}/admin/weights", json=body, headers=wrong), 401)
        error_of(a.http.get(f"{a.url}/admin/versions", headers=wrong), 401)
        error_of(a.http.post(f"{a.url}/admin/weights", json={"version": 1}, headers=a.admin()), 400)
        current = a.http.get(f"{a.url}/admin/versions", headers=a.admin()).json()
        stale = {"model_path": "/nowhere", "version": current["current_version"]}
        error = error_of(a.http.post(f"{a.url}/admin/weights", json=stale, headers=a.admin()), 409)
        assert "version must increase" in error["message"]
    with adapter([engines.a.url], admin_token=None) as a:
        error = error_of(a.http.get(f"{a.url}/admin/versions"), 403)
        assert "admin routes are disabled" in error["message"]
