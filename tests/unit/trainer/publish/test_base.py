"""The publish result's timings read from the adapter's refresh summary, for both modes."""

from __future__ import annotations

from trainer.publish.base import adapter_timings


def test_step_mode_drains_and_pauses_no_request() -> None:
    timings = adapter_timings(
        {"mode": "step", "gate_closed_s": 2.5, "drain_s": 2.0, "load_s": 0.4, "pause_s": 0.0}
    )
    assert timings == {
        "gate_closed": 2.5,
        "drain": 2.0,
        "engine_load": 0.4,
        "requests_paused": 0.0,
    }


def test_token_mode_pauses_requests_for_the_whole_closed_gate() -> None:
    timings = adapter_timings(
        {"mode": "token", "gate_closed_s": 0.09, "drain_s": 0.0, "load_s": 0.05}
    )
    assert timings["requests_paused"] == 0.09 and timings["drain"] == 0.0


def test_an_old_summary_without_the_fields_reads_as_zero() -> None:
    assert adapter_timings({}) == {
        "gate_closed": 0.0,
        "drain": 0.0,
        "engine_load": 0.0,
        "requests_paused": 0.0,
    }
