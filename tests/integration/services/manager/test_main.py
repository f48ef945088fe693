"""``python -m services.manager --status`` against a real Redis: nodes, pending, batches."""

from __future__ import annotations

import json

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
