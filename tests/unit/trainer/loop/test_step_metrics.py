"""Per-engine rollout figures of a step: tokens, turns and tokens per second of the span."""

from __future__ import annotations

import math

from services.protocol import Turn
from services.protocol.packing import float_array, int_array
from tests.support.trajectory_records import record
from trainer.loop.step_metrics import engine_metrics, engine_name


def served(engine: str, n_out: int, started: float, latency: float) -> Turn:
    return Turn(output_ids=int_array(range(n_out)), output_logprobs=float_array([-1.0] * n_out),
                engine=engine, started_at=started, latency_s=latency)  # fmt: skip


def test_tokens_turns_and_throughput_per_engine_over_the_span_of_its_turns() -> None:
    a, b = "http://10.0.0.1:30000", "http://10.0.0.2:30000"
    one = record("t1", [([1], [served(a, 10, 100.0, 2.0), served(b, 4, 101.0, 1.0)])])
    two = record("t2", [([1], [served(a, 30, 101.0, 3.0)]), ([1, 2], [served(a, 0, 105.0, 1.0)])])
    m = engine_metrics([one, two])
    assert m["engine/10.0.0.1:30000/tokens"] == 40.0 and m["engine/10.0.0.1:30000/turns"] == 3.0
    assert m["engine/10.0.0.1:30000/tokens_per_s"] == 40 / 6.0  # turns span 100.0 .. 106.0
    assert m["engine/10.0.0.2:30000/tokens"] == 4.0
    assert m["engine/10.0.0.2:30000/tokens_per_s"] == 4.0
    assert len(m) == 6


def test_a_zero_length_span_has_no_throughput_and_names_fall_back() -> None:
    m = engine_metrics([record("t", [([1], [served("", 3, 5.0, 0.0)])])])
    assert m["engine/unknown/tokens"] == 3.0 and math.isnan(m["engine/unknown/tokens_per_s"])
    assert engine_name("http://h:1/x") == "h:1" and engine_name("engine-a") == "engine-a"
    assert engine_metrics([]) == {}
