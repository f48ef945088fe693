"""Prometheus text exposition of the adapter's metrics."""

from __future__ import annotations

import pytest

from adapter.metrics import AdapterMetrics, Counter, Histogram


def test_counter_with_labels_and_escaping() -> None:
    c = Counter("x_total", "help text", ["route"])
    c.inc(route='a"b')
    c.inc(2, route='a"b')
    assert c.lines() == ['x_total{route="a\\"b"} 3']
    with pytest.raises(ValueError, match="takes labels"):
        c.inc(other="x")


def test_histogram_buckets_are_cumulative() -> None:
    h = Histogram("lat_seconds", "latency", buckets=(0.1, 1.0))
    for v in (0.05, 0.5, 0.7, 3.0):
        h.observe(v)
    assert h.lines() == [
        'lat_seconds_bucket{le="0.1"} 1',
        'lat_seconds_bucket{le="1"} 3',
        'lat_seconds_bucket{le="+Inf"} 4',
        "lat_seconds_sum 4.25",
        "lat_seconds_count 4",
    ]


def test_render_has_help_and_type_for_every_metric() -> None:
    m = AdapterMetrics()
    m.segments.inc(reason="history_mismatch")
    text = m.render()
    names = [line.split()[2] for line in text.splitlines() if line.startswith("# TYPE")]
    assert len(names) == len(m.all()) and len(set(names)) == len(names)
    assert 'swerl_adapter_segments_opened_total{reason="history_mismatch"} 1' in text
    assert text.endswith("\n")
