"""The request body cap (``api.max_body_bytes``) over real HTTP, with raw sockets so the test
controls what is sent: a huge ``Content-Length`` is refused before its body is read, a chunked
body without ``Content-Length`` is cut off as soon as it passes the cap, a body under the cap
is served, and the server keeps serving afterwards."""

from __future__ import annotations

import json
import select
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from tests.support.api_server import ApiServer, bearer, start_api
from tests.support.redis import RedisServer

pytestmark = pytest.mark.slow

CAP = 256 * 1024  # the module's server's api.max_body_bytes
HUGE = 200 * 1024 * 1024  # what an attacker claims / streams: 200 MB


@pytest.fixture(scope="module")
def api(redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiServer]:
    env = {"SWERL_API__MAX_BODY_BYTES": str(CAP)}
    server = start_api(redis_server.url, Path(tmp_path_factory.mktemp("api")), env=env)
    yield server
    server.stop()


def connect(api: ApiServer) -> socket.socket:
    url = urlsplit(api.url)
    sock = socket.create_connection((url.hostname, url.port), timeout=30)
    sock.setblocking(False)
    return sock


def head(api: ApiServer, extra: str) -> bytes:
    auth = bearer("alice")["Authorization"]
    lines = [
        "POST /v1/jobs/rollout HTTP/1.1",
        f"Host: {urlsplit(api.url).netloc}",
        f"Authorization: {auth}",
        "Content-Type: application/json",
    ]
    return ("\r\n".join(lines) + f"\r\n{extra}\r\n").encode()


def read_response(sock: socket.socket, timeout_s: float = 30) -> tuple[int, dict[str, Any]]:
    """The status and JSON body of the response (read until the connection closes or the
    body is complete)."""
    data = b""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        ready, _, _ = select.select([sock], [], [], 1)
        if not ready:
            continue
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            break
        if not chunk:
            break
        data += chunk
        header, sep, body = data.partition(b"\r\n\r\n")
        length = [ln for ln in header.split(b"\r\n") if ln.lower().startswith(b"content-length:")]
        if sep and length and len(body) >= int(length[0].split(b":")[1]):
            break
    header, _, body = data.partition(b"\r\n\r\n")
    return int(header.split(b" ")[1]), json.loads(body)


def stream_until_answered(sock: socket.socket, chunk: bytes, limit: int) -> int:
    """Send ``chunk`` (already framed) until the server answers or ``limit`` bytes went
    out; returns the bytes sent."""
    sent = 0
    while sent < limit:
        readable, writable, _ = select.select([sock], [sock], [], 5)
        if readable:
            return sent
        if writable:
            try:
                sent += sock.send(chunk)
            except (BrokenPipeError, ConnectionResetError, BlockingIOError):
                return sent
    return sent


def test_a_huge_content_length_is_413_before_the_body_is_read(api: ApiServer) -> None:
    with connect(api) as sock:
        sock.sendall(head(api, f"Content-Length: {HUGE}\r\n") + b'{"instance_ids": [')
        status, body = read_response(sock)
    assert status == 413
    err = body["error"]
    assert (err["type"], err["field"]) == ("body_too_large", "body")
    assert str(HUGE) in err["message"] and "api.max_body_bytes" in err["message"]


def test_a_chunked_body_without_length_is_cut_off_at_the_cap(api: ApiServer) -> None:
    payload = b" " * 65536
    chunk = f"{len(payload):x}\r\n".encode() + payload + b"\r\n"
    with connect(api) as sock:
        sock.sendall(head(api, "Transfer-Encoding: chunked\r\n") + b'5\r\n{"a":\r\n')
        sent = stream_until_answered(sock, chunk, HUGE)
        status, body = read_response(sock)
    assert status == 413 and body["error"]["type"] == "body_too_large"
    assert "streamed" in body["error"]["message"]
    assert sent < HUGE // 4  # refused long before the 200 MB were sent (socket buffers aside)


def test_a_body_under_the_cap_is_served_and_the_server_lives_on(api: ApiServer) -> None:
    spec = {"instance_ids": ["inst-1"], "n_samples": 1}
    padded = json.dumps(spec) + " " * (CAP - 1000)  # valid JSON just under the cap
    with httpx.Client(base_url=api.url, headers=bearer("alice"), timeout=30) as http:
        got = http.post("/v1/jobs/rollout", content=padded,
                        headers={"Content-Type": "application/json"})  # fmt: skip
        assert got.status_code == 201, got.text
        over = http.post("/v1/jobs/rollout", content=padded + " " * 2000,
                         headers={"Content-Type": "application/json"})  # fmt: skip
        assert over.status_code == 413
        assert http.get("/healthz").status_code == 200


def test_the_cap_holds_before_auth(api: ApiServer) -> None:
    """A caller without a token cannot make the server read a big body either."""
    with connect(api) as sock:
        raw = head(api, f"Content-Length: {HUGE}\r\n").replace(b"Authorization", b"X-None")
        sock.sendall(raw)
        status, _ = read_response(sock)
    assert status == 413
