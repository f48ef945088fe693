"""The host side of the LLM relay as a sandbox sees it: an HTTP/1.1 filter bound to one
trajectory (``sandbox_worker.relay.http_filter``), in front of a real HTTP server.

Raw bytes are written to the relay's unix socket, as a hostile agent could; the upstream server
records every request that reaches it, so "refused" means "never reached the adapter".
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import h11
import pytest

from sandbox_worker.relay.host_relay import RelayHandle, RelayHub
from sandbox_worker.relay.http_filter import RelayBinding, check_request

TID = "batch-1:0:0.a1"
OTHER = "batch-1:0:1.a1"
TOKEN = "swt_the-trajectory-token"
OWN = f"/t/{TID}/v1"


@dataclass
class Seen:
    method: str
    path: str
    headers: list[tuple[str, str]]
    body: bytes


@dataclass
class Upstream:
    port: int
    seen: list[Seen] = field(default_factory=list)
    release: threading.Event = field(default_factory=threading.Event)  # SSE: send the rest


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    upstream: Upstream

    def log_message(self, *args: object) -> None:
        pass

    def _record(self) -> Seen:
        if self.headers.get("transfer-encoding", "").lower() == "chunked":
            body = bytearray()
            while True:
                size = int(self.rfile.readline().strip(), 16)
                if size == 0:
                    self.rfile.readline()
                    break
                body += self.rfile.read(size)
                self.rfile.readline()
            data = bytes(body)
        else:
            data = self.rfile.read(int(self.headers.get("content-length", "0")))
        seen = Seen(self.command, self.path, list(self.headers.items()), data)
        self.upstream.seen.append(seen)
        return seen

    def do_GET(self) -> None:
        self._answer(self._record())

    def do_POST(self) -> None:
        seen = self._record()
        if b'"stream": true' in seen.body:
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.send_header("transfer-encoding", "chunked")
            self.end_headers()
            for i in range(3):
                event = f'data: {{"i": {i}}}\n\n'.encode()
                self.wfile.write(f"{len(event):x}\r\n".encode() + event + b"\r\n")
                self.wfile.flush()
                self.upstream.release.wait(20)
            self.wfile.write(b"0\r\n\r\n")
            return
        self._answer(seen)

    def _answer(self, seen: Seen) -> None:
        body = json.dumps({"path": seen.path, "n": len(seen.body)}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def upstream() -> Iterator[Upstream]:
    up = Upstream(0)
    handler = type("H", (_Handler,), {"upstream": up})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    up.port = server.server_address[1]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield up
    server.shutdown()
    server.server_close()


@pytest.fixture
def relay(tmp_path: Path, upstream: Upstream) -> Iterator[tuple[Path, RelayHandle]]:
    hub = RelayHub()
    sock = tmp_path / "llm.sock"
    handle = hub.llm_relay(sock, "127.0.0.1", upstream.port, RelayBinding(TID, TOKEN))
    yield sock, handle
    handle.close()
    hub.close()


def _connect(sock_path: Path) -> socket.socket:
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(20)
    s.connect(str(sock_path))
    return s


def _exchange(sock_path: Path, raw: bytes) -> bytes:
    """Send raw bytes, read until the relay closes the connection."""
    with _connect(sock_path) as s:
        s.sendall(raw)
        out = bytearray()
        while chunk := s.recv(65536):
            out += chunk
    return bytes(out)


def _responses(data: bytes) -> list[tuple[int, bytes]]:
    """Parse the responses of a byte stream (status, body) with h11 as a client would."""
    conn = h11.Connection(h11.CLIENT)
    conn.send(h11.Request(method="GET", target="/", headers=[("host", "x")]))
    conn.send(h11.EndOfMessage())
    conn.receive_data(data)  # no EOF: every answer of the relay is length-delimited
    out: list[tuple[int, bytes]] = []
    status, body = 0, bytearray()
    while True:
        event = conn.next_event()
        if isinstance(event, h11.Response):
            status, body = event.status_code, bytearray()
        elif isinstance(event, h11.Data):
            body += event.data
        elif isinstance(event, h11.EndOfMessage):
            out.append((status, bytes(body)))
            if conn.our_state is h11.MUST_CLOSE or conn.their_state is h11.MUST_CLOSE:
                return out
            conn.start_next_cycle()
            conn.send(h11.Request(method="GET", target="/", headers=[("host", "x")]))
            conn.send(h11.EndOfMessage())
        elif event is h11.NEED_DATA or isinstance(event, h11.ConnectionClosed):
            return out


def _post(target: str, body: bytes = b"{}", extra: str = "") -> bytes:
    return (
        f"POST {target} HTTP/1.1\r\nHost: 127.0.0.1:18080\r\n{extra}"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body


CHAT = f"{OWN}/chat/completions"

ATTACKS: dict[str, bytes] = {
    "other trajectory chat": _post(f"/t/{OTHER}/v1/chat/completions"),
    "other trajectory models": f"GET /t/{OTHER}/v1/models HTTP/1.1\r\nHost: a\r\n\r\n".encode(),
    "read own record": f"GET /trajectories/{TID} HTTP/1.1\r\nHost: a\r\n\r\n".encode(),
    "read other record": f"GET /trajectories/{OTHER} HTTP/1.1\r\nHost: a\r\n\r\n".encode(),
    "read other raw": f"GET /trajectories/{OTHER}/raw HTTP/1.1\r\nHost: a\r\n\r\n".encode(),
    "close other": _post(f"/trajectories/{OTHER}/close", b'{"outcome": {"reward": 1}}'),
    "close own aborted": _post(f"/trajectories/{TID}/close", b'{"outcome": {"status": "aborted"}}'),
    "create record": _post("/trajectories", b'{"trajectory_id": "x"}'),
    "untracked chat": _post("/v1/chat/completions"),
    "admin": _post("/admin/weights", b'{"model_path": "/x", "version": 1}'),
    "health": b"GET /health HTTP/1.1\r\nHost: a\r\n\r\n",
    "dot segments": _post(f"{OWN}/../../{OTHER}/v1/chat/completions"),
    "dot segments to records": _post(f"/t/{TID}/../../trajectories/{OTHER}/close"),
    "percent dots": _post(f"/t/{TID}/%2e%2e/%2e%2e/trajectories/{OTHER}/close"),
    "percent slash": _post(f"/t/{TID}%2F..%2F{OTHER}/v1/chat/completions"),
    "percent-encoded own path": _post(f"/t/{TID}/v1/chat%2Fcompletions"),
    "query string": _post(f"{CHAT}?x=1"),
    "fragment": _post(f"{CHAT}#x"),
    "double slash": _post(f"/t/{TID}//v1/chat/completions"),
    "trailing slash": _post(f"{CHAT}/"),
    "absolute form": _post(f"http://127.0.0.1:8100/trajectories/{OTHER}/close"),
    "absolute form own path": _post(f"http://127.0.0.1:8100{CHAT}"),
    "asterisk form": b"OPTIONS * HTTP/1.1\r\nHost: a\r\n\r\n",
    "connect": b"CONNECT 127.0.0.1:8100 HTTP/1.1\r\nHost: 127.0.0.1:8100\r\n\r\n",
    "wrong method on own chat": f"GET {CHAT} HTTP/1.1\r\nHost: a\r\n\r\n".encode(),
    "delete own chat": f"DELETE {CHAT} HTTP/1.1\r\nHost: a\r\n\r\n".encode(),
    "duplicate host": _post(CHAT, extra="Host: adapter\r\n"),
    "duplicate authorization": _post(CHAT, extra="Authorization: a\r\nAuthorization: b\r\n"),
    "duplicate content-type": _post(CHAT, extra="Content-Type: text/plain\r\n"),
    "smuggling CL+TE": (
        f"POST {CHAT} HTTP/1.1\r\nHost: a\r\nContent-Length: 4\r\n"
        "Transfer-Encoding: chunked\r\n\r\n"
        f"0\r\n\r\nGET /trajectories/{OTHER} HTTP/1.1\r\nHost: a\r\n\r\n"
    ).encode(),
    "conflicting content-lengths": (
        f"POST {CHAT} HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\nContent-Length: 40\r\n\r\n{{}}"
    ).encode(),
    "transfer-encoding other than chunked": (
        f"POST {CHAT} HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n"
    ).encode(),
    "upgrade": f"GET {OWN}/models HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\n\r\n".encode(),
    "expect other": _post(CHAT, extra="Expect: something\r\n"),
    "no host (HTTP/1.1)": f"GET {OWN}/models HTTP/1.1\r\n\r\n".encode(),
    "garbage": b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 64 + b"\r\n\r\n",
    "bare LF request line": f"GET {OWN}/models HTTP/1.1\nHost: a\n\n".encode()
    + f"GET /trajectories/{OTHER} HTTP/1.1\nHost: a\n\n".encode(),
}


@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_every_other_request_is_refused_before_the_adapter(
    name: str, relay: tuple[Path, RelayHandle], upstream: Upstream
) -> None:
    sock, handle = relay
    reply = _exchange(sock, ATTACKS[name])
    answers = _responses(reply)
    if name == "bare LF request line":  # h11 accepts bare LF: the first request is our own
        assert [s for s, _ in answers] == [200, 403], reply
        assert [s.path for s in upstream.seen] == [f"{OWN}/models"]
        return
    assert len(answers) == 1, reply
    status, body = answers[0]
    assert status in (400, 403), reply
    assert json.loads(body)["error"]["code"] == "relay_refused"
    assert upstream.seen == [], f"{name} reached the upstream: {upstream.seen}"
    assert handle.filter is not None and handle.filter.forwarded == 0


def test_own_calls_pass_with_the_token_added_and_client_credentials_dropped(
    relay: tuple[Path, RelayHandle], upstream: Upstream
) -> None:
    sock, _ = relay
    body = b'{"model": "m", "messages": []}'
    raw = _post(
        CHAT, body, extra="Authorization: Bearer stolen-or-guessed\r\nX-Forwarded-For: 1.2.3.4\r\n"
    ).replace(b"Host: 127.0.0.1:18080", b"Host: adapter.example")
    raw = raw.replace(b"HTTP/1.1\r\n", b"HTTP/1.1\r\nConnection: close\r\n", 1)
    [(status, answer)] = _responses(_exchange(sock, raw))
    assert status == 200 and json.loads(answer) == {"path": CHAT, "n": len(body)}
    [seen] = upstream.seen
    headers = {k.lower(): v for k, v in seen.headers}
    assert len(seen.headers) == len(headers)
    assert headers["authorization"] == f"Bearer {TOKEN}"
    assert headers["host"] == f"127.0.0.1:{upstream.port}"
    assert "x-forwarded-for" not in headers and "connection" not in headers
    assert seen.body == body


def test_keep_alive_chunked_bodies_and_pipelining(
    relay: tuple[Path, RelayHandle], upstream: Upstream
) -> None:
    sock, handle = relay
    chunked = (
        f"POST {CHAT} HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
        '5\r\n{"a":\r\n3\r\n 1}\r\n0\r\n\r\n'
    ).encode()
    models = f"GET {OWN}/models HTTP/1.1\r\nHost: a\r\n\r\n".encode()
    with _connect(sock) as s:
        # three requests one after the other on one connection
        for raw in (_post(CHAT, b'{"x": 1}'), chunked, models):
            s.sendall(raw)
            data = bytearray()
            while not data.endswith(b"}"):
                data += s.recv(65536)
            [(status, _)] = _responses(bytes(data))
            assert status == 200
        # pipelined: both in one write, answered in order; then a refused one closes it
        s.sendall(models + _post(CHAT, b"{}") + _post(f"/trajectories/{OTHER}/close"))
        out = bytearray()
        while chunk := s.recv(65536):
            out += chunk
    assert [st for st, _ in _responses(bytes(out))] == [200, 200, 403]
    assert [(x.method, x.path) for x in upstream.seen] == [
        ("POST", CHAT),
        ("POST", CHAT),
        ("GET", f"{OWN}/models"),
        ("GET", f"{OWN}/models"),
        ("POST", CHAT),
    ]
    assert upstream.seen[1].body == b'{"a": 1}'
    assert handle.filter is not None and handle.filter.forwarded == 5


def test_sse_events_arrive_as_they_are_sent(
    relay: tuple[Path, RelayHandle], upstream: Upstream
) -> None:
    sock, _ = relay
    with _connect(sock) as s:
        s.sendall(_post(CHAT, b'{"stream": true}'))
        # The upstream holds the other events back until the first has come through the
        # relay: a relay that buffered the stream would hang here.
        first = bytearray()
        while b'data: {"i": 0}' not in first:
            first += s.recv(65536)
        upstream.release.set()
        rest = bytearray()
        while not (first + rest).endswith(b"0\r\n\r\n"):
            rest += s.recv(65536)
    assert b'{"i": 1}' not in first
    [(status, body)] = _responses(bytes(first + rest))
    assert status == 200
    assert body == b"".join(f'data: {{"i": {i}}}\n\n'.encode() for i in range(3))


def test_http10_and_expect_100_continue(relay: tuple[Path, RelayHandle], upstream: Upstream):
    sock, _ = relay
    [(status, _)] = _responses(_exchange(sock, f"GET {OWN}/models HTTP/1.0\r\n\r\n".encode()))
    assert status == 200
    with _connect(sock) as s:
        head = _post(CHAT, b"", extra="Expect: 100-continue\r\n")
        s.sendall(head.replace(b"Content-Length: 0", b"Content-Length: 2"))
        assert s.recv(65536).startswith(b"HTTP/1.1 100 ")
        s.sendall(b"{}")
        data = bytearray()
        while not data.endswith(b"}"):
            data += s.recv(65536)
    assert _responses(bytes(data))[0][0] == 200
    assert [x.body for x in upstream.seen] == [b"", b"{}"]


def test_a_dead_adapter_is_a_502(tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        dead = probe.getsockname()[1]
    hub = RelayHub()
    try:
        handle = hub.llm_relay(tmp_path / "l.sock", "127.0.0.1", dead, RelayBinding(TID))
        [(status, body)] = _responses(_exchange(tmp_path / "l.sock", _post(CHAT)))
        assert status == 502 and b"cannot connect" in body
        handle.close()
    finally:
        hub.close()


def test_binding_validation_and_canonical_targets() -> None:
    for bad in ("", "../x", "a..b", "-x", "a/b", "a%2fb", "x" * 201, "a b"):
        with pytest.raises(ValueError):
            RelayBinding(bad)
    with pytest.raises(ValueError):
        RelayBinding(TID, "two words")
    assert "swt_" not in repr(RelayBinding(TID, TOKEN))
    req = h11.Request(method="POST", target=CHAT, headers=[("host", "a")])
    assert check_request(RelayBinding(TID), req) == CHAT.encode()
