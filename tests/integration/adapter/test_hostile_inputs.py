"""Hostile inputs get a 4xx with a JSON error, and the keep-alive connection stays usable.

Each request goes over one raw HTTP/1.1 keep-alive connection (http.client never retries or
reconnects silently: a closed connection shows as a new local port or an error), and the next
request on the same connection must succeed.
"""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import pytest

from tests.integration.adapter.conftest import AdapterFactory, EnginePool, RunningAdapter

pytestmark = pytest.mark.engines("a")

MESSAGES = '[{"role": "user", "content": "hello"}]'


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    def error(self) -> dict[str, Any]:
        error: dict[str, Any] = json.loads(self.body)["error"]
        assert set(error) == {"message", "type", "code", "param"}
        assert error["message"]
        return error


class KeepAlive:
    """One HTTP/1.1 connection; :meth:`send` fails if the server dropped it in between."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
        self.conn.connect()
        self.local = self.conn.sock.getsockname()

    def send(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> Answer:
        assert self.conn.sock is not None, "the server closed the connection"
        assert self.conn.sock.getsockname() == self.local, "the connection was replaced"
        all_headers = {"content-type": "application/json", **(headers or {})}
        self.conn.request(method, path, body=body, headers=all_headers)
        response = self.conn.getresponse()
        data = response.read()
        answer = Answer(response.status, {k.lower(): v for k, v in response.getheaders()}, data)
        assert answer.headers.get("connection", "").lower() != "close", answer
        return answer

    def still_healthy(self) -> None:
        answer = self.send("GET", "/v1/models")
        assert answer.status == 200, answer
        assert self.conn.sock is not None and self.conn.sock.getsockname() == self.local


@contextmanager
def keepalive(a: RunningAdapter) -> Iterator[KeepAlive]:
    client = KeepAlive(a.url)
    try:
        yield client
    finally:
        client.conn.close()


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


HOSTILE_BODIES: list[tuple[str, str, bytes, str]] = [
    (
        "lone surrogate in content",
        "/v1/chat/completions",
        b'{"messages": [{"role": "user", "content": "a\\ud800b"}], "max_tokens": 2}',
        "surrogate",
    ),
    (
        "lone surrogate on a trajectory route",
        "/t/hostile-1/v1/chat/completions",
        b'{"messages": [{"role": "user", "content": "\\udfff"}], "max_tokens": 2}',
        "surrogate",
    ),
    (
        "lone surrogate as raw UTF-8 bytes",
        "/v1/chat/completions",
        b'{"messages": [{"role": "user", "content": "a\xed\xa0\x80"}]}',
        "surrogate",
    ),
    (
        "lone surrogate in a key",
        "/trajectories",
        b'{"trajectory_id": "s1", "extra": {"\\ud800": 1}}',
        "surrogate",
    ),
    (
        "JSON nested 5,000 deep",
        "/v1/chat/completions",
        f'{{"messages": {nested(5000)}}}'.encode(),
        "nested",
    ),
    (
        "JSON nested 5,000 deep (trajectory open)",
        "/trajectories",
        f'{{"trajectory_id": "d1", "extra": {{"x": {nested(5000)}}}}}'.encode(),
        "nested",
    ),
    (
        "meta.extra nested 1,000 deep",
        "/trajectories",
        ('{"trajectory_id": "d2", "extra": ' + '{"a": ' * 1000 + "1" + "}" * 1000 + "}").encode(),
        "nested",
    ),
    (
        "NaN in meta.extra",
        "/trajectories",
        b'{"trajectory_id": "n1", "extra": {"x": NaN}}',
        "NaN is not a JSON number",
    ),
    (
        "a number that overflows a float",
        "/v1/chat/completions",
        f'{{"messages": {MESSAGES}, "temperature": 1e400}}'.encode(),
        "overflows",
    ),
    (
        "an integer past Python's digit limit",
        "/v1/chat/completions",
        f'{{"messages": {MESSAGES}, "max_tokens": {"9" * 5000}}}'.encode(),
        "not valid JSON",
    ),
    (
        "invalid UTF-8",
        "/v1/chat/completions",
        b'{"messages": [{"role": "user", "content": "\xff\xfe"}]}',
        "not valid JSON",
    ),
]


@pytest.mark.parametrize(
    ("path", "payload", "fragment"),
    [pytest.param(p, b, f, id=name) for name, p, b, f in HOSTILE_BODIES],
)
def test_hostile_bodies_are_4xx_and_the_connection_survives(
    adapter: AdapterFactory, engines: EnginePool, path: str, payload: bytes, fragment: str
) -> None:
    with adapter([engines.a.url]) as a, keepalive(a) as conn:
        answer = conn.send("POST", path, payload)
        assert answer.status == 400, answer
        error = answer.error()
        assert fragment in error["message"]
        assert error["type"] == "invalid_request_error"
        conn.still_healthy()


def test_non_ascii_bearer_token_is_401(adapter: AdapterFactory, engines: EnginePool) -> None:
    with adapter([engines.a.url]) as a, keepalive(a) as conn:
        # http.client sends str headers as latin-1: these are the raw bytes b"t\xf6k\xe9n".
        answer = conn.send("GET", "/admin/versions", headers={"authorization": "Bearer tökén"})
        assert answer.status == 401, answer
        assert answer.error()["type"] == "authentication_error"
        raw = conn.send(
            "GET", "/admin/versions", headers={"authorization": "Bearer \u00ff\u00fe\u00fd"}
        )
        assert raw.status == 401, raw
        conn.still_healthy()


def test_wrong_method_is_a_typed_405(adapter: AdapterFactory, engines: EnginePool) -> None:
    with adapter([engines.a.url]) as a, keepalive(a) as conn:
        answer = conn.send("GET", "/v1/chat/completions")
        assert answer.status == 405, answer
        error = answer.error()
        assert error["type"] == "invalid_request_error"
        assert error["code"] == "method_not_allowed"
        assert "POST" in answer.headers["allow"]
        conn.still_healthy()


def test_an_unexpected_error_is_a_json_500_that_keeps_the_connection(
    adapter: AdapterFactory, engines: EnginePool
) -> None:
    """The last-resort handler itself: a bug answers a JSON 500 and the connection lives on."""
    with adapter([engines.a.url]) as a, keepalive(a) as conn:

        def broken() -> dict[str, Any]:
            raise RuntimeError("injected fault")

        a.service.health = broken  # type: ignore[method-assign]
        answer = conn.send("GET", "/health")
        assert answer.status == 500, answer
        error = answer.error()
        assert error["type"] == "server_error" and "injected fault" in error["message"]
        conn.still_healthy()


@pytest.mark.parametrize(
    ("trajectory_id", "where"),
    [("..", "path"), ("-", "path"), (":", "path"), ("a..b", "path"), ("..", "body"), ("-", "body")],
)
def test_ids_follow_the_protocol_rule(
    adapter: AdapterFactory, engines: EnginePool, trajectory_id: str, where: str
) -> None:
    with adapter([engines.a.url]) as a, keepalive(a) as conn:
        if where == "path":
            body = f'{{"messages": {MESSAGES}, "max_tokens": 2}}'.encode()
            answer = conn.send("POST", f"/t/{trajectory_id}/v1/chat/completions", body)
        else:
            answer = conn.send(
                "POST", "/trajectories", json.dumps({"trajectory_id": trajectory_id}).encode()
            )
        assert answer.status == 400, answer
        assert "trajectory_id" in (answer.error()["param"] or answer.error()["message"])
        conn.still_healthy()
    assert a.service.trajectories == {}


@pytest.mark.parametrize(
    ("meta", "fragment"),
    [
        ({"trajectory_id": "k1", "task_idd": "t"}, "task_idd"),
        ({"trajectory_id": "k1", "created_at": "5"}, "created_at"),
        ({"trajectory_id": "k1", "created_at": True}, "created_at"),
        ({"trajectory_id": "k1", "batch_id": 7}, "batch_id"),
        ({"trajectory_id": "k1", "group_id": ".."}, "group_id"),
    ],
)
def test_trajectory_meta_refuses_unknown_keys_and_coercion(
    adapter: AdapterFactory, engines: EnginePool, meta: dict[str, Any], fragment: str
) -> None:
    with adapter([engines.a.url]) as a:
        response = a.http.post(f"{a.url}/trajectories", json=meta)
        assert response.status_code == 400, response.text
        assert fragment in response.json()["error"]["message"]
        assert a.http.get(f"{a.url}/trajectories/k1").status_code == 404


@pytest.mark.parametrize("value", ['"5"', "true", "5.5"])
def test_max_tokens_is_not_coerced(
    adapter: AdapterFactory, engines: EnginePool, value: str
) -> None:
    with adapter([engines.a.url]) as a, keepalive(a) as conn:
        body = f'{{"messages": {MESSAGES}, "max_tokens": {value}}}'.encode()
        answer = conn.send("POST", "/v1/chat/completions", body)
        assert answer.status == 400, answer
        assert answer.error()["param"] == "max_tokens"
        conn.still_healthy()
