"""``python -m services.manager --status`` against a real Redis: nodes, pending, batches."""

from __future__ import annotations

import json
import socket

import pytest

from services.manager.__main__ import main
from tests.support.queue_sides import NODE, QueueSides, beat, submit


def test_status_prints_nodes_pending_and_batches(
    q: QueueSides, redis_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    beat(q, slots=3)
    submit(q, 2)
    assert main(["--redis", redis_url, "--prefix", q.cfg.prefix, "--status"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert [(n["name"], n["alive"], n["slots"]) for n in status["nodes"]] == [(NODE, True, 3)]
    assert status["pending"] == 2
    [batch] = status["batches"]
    assert (batch["batch_id"], batch["total"], batch["queued"]) == ("b1", 2, 2)


def test_status_with_redis_down_is_a_message_not_a_traceback(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert main(["--redis", f"redis://127.0.0.1:{port}/0", "--status"]) == 1
    err = capsys.readouterr().err
    assert f"redis://127.0.0.1:{port}/0" in err and "SWERL_MANAGER__REDIS_URL" in err
    assert "Traceback" not in err
