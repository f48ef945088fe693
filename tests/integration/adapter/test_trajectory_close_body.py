"""A trajectory close carrying the largest patch the worker grades is never a 413.

The worker caps the agent's patch (``worker.rollout.max_patch_bytes``, at most
:data:`MAX_PATCH_BYTES_LIMIT`) and sends it in the close body; the adapter's general body limit
follows the context window (``max_body_bytes``: about 1 MiB for a small model), so the close
route has a limit of its own (``max_close_body_bytes``). A 413 there used to turn the policy's
large patch into an aborted, excluded trajectory. The real worker client
(:class:`AdapterClient`) closes against a real in-process adapter with a small context window.
"""

from __future__ import annotations

import httpx
import pytest

from sandbox_worker.adapter_client import AdapterClient
from sandbox_worker.patch_extract import MAX_PATCH_BYTES_LIMIT
from services.protocol.trajectory import Outcome, OutcomeStatus, TrajectoryMeta
from tests.integration.adapter.conftest import AdapterFactory, EnginePool

pytestmark = pytest.mark.engines("a")


def _worst_case_patch(size: int) -> str:
    """``size`` bytes of patch text whose JSON is as long as it gets (control characters
    escape to six bytes each)."""
    line = "+" + "\x01" * 78 + "\n"
    return (line * (size // len(line) + 1))[:size]


def test_a_close_with_a_patch_at_the_cap_is_recorded(
    adapter: AdapterFactory, engines: EnginePool
) -> None:
    with adapter([engines.a.url], context_length=512) as a:
        assert a.service.max_body_bytes < 2 << 20  # the general limit is small ...
        patch = _worst_case_patch(MAX_PATCH_BYTES_LIMIT)
        report = {"patch_refused": None, "evaluation": {"log_tail": "x" * 100_000}}
        outcome = Outcome(status=OutcomeStatus.COMPLETED, reward=0.0, patch=patch,
                          test_report=report)  # fmt: skip
        client = AdapterClient(a.url, attempts=1, timeout_s=120)
        try:
            client.open(TrajectoryMeta(trajectory_id="big-patch-1"))
            kept = client.close("big-patch-1", outcome)  # ... the close body is not bound by it
        finally:
            client.close_connection()
        assert kept.outcome is not None and kept.outcome.patch == patch
        # Other routes keep the context-sized limit.
        body = {"messages": [{"role": "user", "content": "x" * (2 << 20)}]}
        chat = httpx.post(f"{a.t('big-patch-2')}/chat/completions", json=body, timeout=120)
        assert chat.status_code == 413


def test_the_close_limit_is_configurable_and_never_below_the_general_one(
    adapter: AdapterFactory, engines: EnginePool
) -> None:
    with adapter([engines.a.url], context_length=512, max_close_body_bytes=4096) as a:
        client = AdapterClient(a.url, attempts=1)
        try:
            client.open(TrajectoryMeta(trajectory_id="small-close-1"))
            fits = Outcome(status=OutcomeStatus.COMPLETED, reward=0.0, patch="p" * 500_000)
            assert client.close("small-close-1", fits).outcome is not None
            response = httpx.post(f"{a.url}/trajectories/small-close-1/close",
                                  content=b"{" + b" " * (a.service.max_body_bytes + 1) + b"}",
                                  headers={"content-type": "application/json"})  # fmt: skip
            assert response.status_code == 413
        finally:
            client.close_connection()
