"""deploy/healthcheck.py: the container health checks of compose.yaml (http, process, usage);
the Redis-backed ones run against a real Redis in tests/integration/deploy/."""

from __future__ import annotations

import http.server
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest

from tests.support.deploy_scripts import load

hc = load("healthcheck")


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        code = int(self.path.strip("/") or 200)
        self.send_response(code)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def test_http_is_healthy_on_2xx_only(server: str) -> None:
    assert hc.main(["http", f"{server}/200"]) == 0
    assert hc.main(["http", f"{server}/204"]) == 0
    with pytest.raises(hc.Unhealthy, match="answered 503"):
        hc.check_http(f"{server}/503")
    assert hc.main(["http", f"{server}/503"]) == 1


def test_http_unreachable_is_unhealthy(server: str) -> None:
    port = server.rsplit(":", 1)[1]
    with pytest.raises(hc.Unhealthy, match="unreachable"):
        hc.check_http(f"http://127.0.0.1:{int(port) + 1 if int(port) < 65535 else 1}/x", 1.0)


def test_process_check_finds_a_running_command() -> None:
    marker = "swerl-healthcheck-marker-4242"
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", marker])
    try:
        deadline = time.monotonic() + 10.0  # the child may still be starting on a busy machine
        while True:
            try:
                hc.check_process(marker)
                break
            except hc.Unhealthy:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise
                time.sleep(0.05)
    finally:
        proc.kill()
        proc.wait()
    with pytest.raises(hc.Unhealthy, match="no process running"):
        hc.check_process(marker)


def test_worker_check_needs_the_worker_environment() -> None:
    env = {"SWERL_WORKER__REDIS_URL": "redis://h:6379/0", "SWERL_WORKER__NODE": "node3"}
    assert hc.heartbeat_key(env) == ("redis://h:6379/0", "swerl:node:node3")
    env["SWERL_WORKER__QUEUE__PREFIX"] = "x:"
    assert hc.heartbeat_key(env)[1] == "x:node:node3"
    with pytest.raises(hc.Unhealthy, match="SWERL_WORKER__NODE is not set"):
        hc.heartbeat_key({"SWERL_WORKER__REDIS_URL": "redis://h"})


@pytest.mark.parametrize("argv", [[], ["http"], ["nosuch", "x"], ["worker", "extra"]])
def test_bad_usage_exits_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert hc.main(argv) == 2
    assert "usage: healthcheck.py" in capsys.readouterr().err
