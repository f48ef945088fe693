"""The relay pieces on their own (host side + the in-sandbox script run on the host)."""

from __future__ import annotations

import socket
import socketserver
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandbox_worker.backends._common import RELAY_SCRIPT
from sandbox_worker.relay.host_relay import RelayError, RelayHub
from sandbox_worker.relay.http_filter import RelayBinding
from services.processes import free_port


class _Echo(socketserver.BaseRequestHandler):
    """Reads until EOF, then sends everything back reversed and closes (tests half-close)."""

    def handle(self) -> None:
        data = bytearray()
        while chunk := self.request.recv(65536):
            data += chunk
        self.request.sendall(bytes(reversed(data)))


@pytest.fixture
def echo_port() -> Iterator[int]:
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Echo)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


@pytest.fixture
def hub() -> Iterator[RelayHub]:
    h = RelayHub()
    yield h
    h.close()


def _roundtrip(sock: socket.socket, payload: bytes) -> bytes:
    sock.settimeout(20)
    sock.sendall(payload)
    sock.shutdown(socket.SHUT_WR)
    out = bytearray()
    while chunk := sock.recv(65536):
        out += chunk
    return bytes(out)


def _start_inner(args: list[str], ready: Path) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([sys.executable, str(RELAY_SCRIPT), *args, "--ready-file", str(ready)])
    deadline = time.monotonic() + 20
    while not ready.exists():
        assert proc.poll() is None, "inner relay exited"
        assert time.monotonic() < deadline
        time.sleep(0.02)
    return proc


class _Upload(socketserver.StreamRequestHandler):
    """A minimal HTTP/1.1 server: answers each POST with the reversed body."""

    def handle(self) -> None:
        length = 0
        while (line := self.rfile.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode().partition(":")
            if name.lower() == "content-length":
                length = int(value)
        body = bytes(reversed(self.rfile.read(length)))
        head = f"HTTP/1.1 200 OK\r\ncontent-length: {len(body)}\r\nconnection: close\r\n\r\n"
        self.wfile.write(head.encode() + body)


def test_inner_tcp_to_host_llm_relay_to_tcp_target(tmp_path: Path, hub: RelayHub) -> None:
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Upload)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    sock_path = tmp_path / "llm.sock"
    handle = hub.llm_relay(sock_path, "127.0.0.1", server.server_address[1], RelayBinding("traj-1"))
    port = free_port()
    inner = _start_inner(
        ["tcp2unix", "--listen", f"127.0.0.1:{port}", "--connect", str(sock_path)],
        tmp_path / "ready",
    )
    try:
        payload = bytes(range(256)) * 4096  # 1 MiB
        for body in (payload, b"abc"):
            head = (
                "POST /t/traj-1/v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                f"Content-Length: {len(body)}\r\n\r\n"
            )
            with socket.create_connection(("127.0.0.1", port)) as s:
                reply = _roundtrip(s, head.encode() + body)
            assert reply.startswith(b"HTTP/1.1 200 ")
            assert reply.endswith(b"\r\n\r\n" + bytes(reversed(body)))
    finally:
        inner.terminate()
        assert inner.wait(10) == 0
        handle.close()
        server.shutdown()
        server.server_close()
    assert not sock_path.exists()


def test_host_tcp_to_inner_unix_to_tcp(tmp_path: Path, hub: RelayHub, echo_port: int) -> None:
    sock_path = tmp_path / "port.sock"
    inner = _start_inner(
        ["unix2tcp", "--listen", str(sock_path), "--connect", f"127.0.0.1:{echo_port}"],
        tmp_path / "ready",
    )
    handle = hub.tcp_to_unix(sock_path)
    try:
        assert handle.port
        with socket.create_connection(("127.0.0.1", handle.port)) as s:
            assert _roundtrip(s, b"hello relay") == b"yaler olleh"
    finally:
        handle.close()
        inner.terminate()
        inner.wait(10)


def test_unreachable_target_answers_502_and_closes(tmp_path: Path, hub: RelayHub) -> None:
    sock_path = tmp_path / "dead.sock"
    handle = hub.llm_relay(sock_path, "127.0.0.1", free_port(), RelayBinding("traj-1"))
    try:
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(10)
            s.connect(str(sock_path))
            reply = _roundtrip(s, b"GET /t/traj-1/v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
            assert reply.startswith(b"HTTP/1.1 502 ")
    finally:
        handle.close()


def test_relay_errors(tmp_path: Path, hub: RelayHub) -> None:
    with pytest.raises(RelayError, match="too long"):
        hub.llm_relay(tmp_path / ("x" * 120), "127.0.0.1", 1, RelayBinding("t"))
    with pytest.raises(RelayError, match="does not exist"):
        hub.llm_relay(tmp_path / "missing" / "s.sock", "127.0.0.1", 1, RelayBinding("t"))
    res = subprocess.run(
        [sys.executable, str(RELAY_SCRIPT), "tcp2unix", "--listen", "nohost", "--connect", "/x"],
        capture_output=True,
        text=True,
    )
    assert res.returncode == 2 and "HOST:PORT" in res.stderr
    closed = RelayHub()
    closed.close()
    with pytest.raises(RelayError, match="closed"):
        closed.llm_relay(tmp_path / "s.sock", "127.0.0.1", 1, RelayBinding("t"))
