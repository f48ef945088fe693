"""Engine failure: stickiness, retry on another engine, 503 + infrastructure failure record."""

from __future__ import annotations

from typing import Any

import pytest

from services.processes import free_port
from tests.integration.adapter.conftest import AdapterFactory, EnginePool

pytestmark = pytest.mark.engines("a", "spare")


def turn(a: Any, tid: str, messages: list[dict[str, Any]]) -> Any:
    response = a.chat(tid, {"messages": messages, "max_tokens": 5})
    if response.status_code == 200:
        messages += [
            response.json()["choices"][0]["message"],
            {"role": "user", "content": "continue"},
        ]
    return response


def test_engine_killed_mid_run(adapter: AdapterFactory, engines: EnginePool) -> None:
    doomed = engines.spare
    assert doomed.process.poll() is None, doomed.log()
    try:
        with (
            adapter([doomed.url, engines.a.url]) as pair,
            adapter([doomed.url], key_prefix="solo:", engine_outage_wait_s=0.3) as solo,
        ):
            x: list[dict[str, Any]] = [{"role": "user", "content": "x"}]
            y: list[dict[str, Any]] = [{"role": "user", "content": "y"}]
            d: list[dict[str, Any]] = [{"role": "user", "content": "d"}]
            assert turn(pair, "fail-x", x).headers["x-swerl-engine"] == doomed.url
            # The next new trajectory goes to the less busy engine; x sticks to its engine.
            assert turn(pair, "fail-y", y).headers["x-swerl-engine"] == engines.a.url
            assert turn(pair, "fail-x", x).headers["x-swerl-engine"] == doomed.url
            assert turn(solo, "fail-d", d).status_code == 200
            before_d = solo.record("fail-d")

            doomed.process.kill()
            doomed.process.wait(timeout=10)

            # x's engine is gone before any token: retried on the other engine, same segment.
            retried = turn(pair, "fail-x", x)
            assert retried.status_code == 200, retried.text
            assert retried.headers["x-swerl-engine"] == engines.a.url
            assert retried.headers["x-swerl-segment"] == "0"
            record = pair.record("fail-x")
            assert [t["engine"] for t in record["segments"][0]["turns"]] == [
                doomed.url,
                doomed.url,
                engines.a.url,
            ]
            assert record["outcome"] is None  # served: not an infrastructure failure
            assert (
                turn(pair, "fail-z", [{"role": "user", "content": "z"}]).headers["x-swerl-engine"]
                == engines.a.url
            )
            health = pair.http.get(f"{pair.url}/health").json()
            assert health["engines"] == {doomed.url: False, engines.a.url: True}
            metrics = pair.http.get(f"{pair.url}/metrics").text
            assert "swerl_adapter_retries_total 1" in metrics
            assert f'swerl_adapter_engine_failures_total{{engine="{doomed.url}"}} 1' in metrics

            # No engine left: 503, the trajectory is marked as an infrastructure failure, and
            # its recorded turns are kept.
            down = turn(solo, "fail-d", d)
            assert down.status_code == 503
            error = down.json()["error"]
            assert error["code"] == "engine_unavailable"
            assert "no inference engine could serve the request" in error["message"]
            after_d = solo.record("fail-d")
            assert after_d["segments"] == before_d["segments"]
            assert after_d["outcome"]["status"] == "aborted"
            assert after_d["outcome"]["reward"] is None
            assert "no inference engine" in after_d["outcome"]["abort_reason"]
            assert after_d["counters"]["infra_failures"] == 1
            assert solo.http.get(f"{solo.url}/health").status_code == 503
            # It waited for a re-admission first (the engine stayed dead).
            assert "swerl_adapter_outage_waits_total 1" in solo.http.get(f"{solo.url}/metrics").text
            # A later close with a score cannot turn the infrastructure failure into a 0/1.
            closed = solo.http.post(
                f"{solo.url}/trajectories/fail-d/close",
                json={"outcome": {"status": "completed", "reward": 0.0}},
            )
            assert closed.json()["outcome"]["status"] == "aborted"
    finally:
        doomed.stop()


@pytest.mark.parametrize("stream", [False, True])
def test_all_engines_unreachable_is_503(adapter: AdapterFactory, stream: bool) -> None:
    dead = [f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}"]
    with adapter(dead, engine_outage_wait_s=0) as a:
        body = {"messages": [{"role": "user", "content": "x"}], "stream": stream}
        for tid in (None, "unreachable"):
            response = a.chat(tid, body)
            assert response.status_code == 503
            assert response.json()["error"]["type"] == "server_error"
        assert a.record("unreachable")["outcome"]["status"] == "aborted"
