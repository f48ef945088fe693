"""The adapter's metrics: prometheus_client's exposition, one registry per adapter."""

from __future__ import annotations

import prometheus_client
from prometheus_client.parser import text_string_to_metric_families

from adapter.metrics import AdapterMetrics

# The exported names and labels (docs/adapter.md, "Metrics"); dashboards depend on them.
EXPECTED = {
    "swerl_adapter_requests": ("counter", {"route", "status"}),
    "swerl_adapter_prompt_tokens": ("counter", set()),
    "swerl_adapter_generated_tokens": ("counter", set()),
    "swerl_adapter_observation_tokens": ("counter", set()),
    "swerl_adapter_segments_opened": ("counter", {"reason"}),
    "swerl_adapter_request_seconds": ("histogram", {"route"}),
    "swerl_adapter_engine_seconds": ("histogram", {"engine"}),
    "swerl_adapter_gate_wait_seconds": ("histogram", set()),
    "swerl_adapter_refresh_gate_closed_seconds": ("histogram", set()),
    "swerl_adapter_refresh_load_seconds": ("histogram", set()),
    "swerl_adapter_engine_healthy": ("gauge", {"engine"}),
    "swerl_adapter_engine_inflight": ("gauge", {"engine"}),
    "swerl_adapter_engine_failures": ("counter", {"engine"}),
    "swerl_adapter_retries": ("counter", set()),
    "swerl_adapter_outage_waits": ("counter", set()),
    "swerl_adapter_store_errors": ("counter", set()),
    "swerl_adapter_weight_version": ("gauge", set()),
    "swerl_adapter_open_trajectories": ("gauge", set()),
}


def _touch_every_labelled_metric(m: AdapterMetrics) -> None:
    m.requests.labels(route="untracked", status="ok").inc()
    m.segments.labels(reason="history_mismatch").inc()
    m.request_latency.labels(route="trajectory").observe(0.3)
    m.engine_latency.labels(engine="http://e:1").observe(0.2)
    m.engine_healthy.labels(engine="http://e:1").set(1)
    m.engine_inflight.labels(engine="http://e:1").set(0)
    m.engine_failures.labels(engine="http://e:1").inc()


def _families(m: AdapterMetrics) -> dict[str, prometheus_client.Metric]:
    text = m.render().decode("utf-8")
    return {f.name: f for f in text_string_to_metric_families(text)}


def test_exposition_parses_with_every_name_type_and_label() -> None:
    m = AdapterMetrics()
    _touch_every_labelled_metric(m)
    families = _families(m)
    for name, (kind, labels) in EXPECTED.items():
        assert name in families, name
        family = families[name]
        assert family.type == kind, name
        assert family.documentation, name
        seen = {k for s in family.samples for k in s.labels if k != "le"}
        assert seen == labels, name


def test_counters_and_histograms_move() -> None:
    m = AdapterMetrics()
    m.requests.labels(route="untracked", status="ok").inc()
    m.requests.labels(route="untracked", status="ok").inc()
    m.requests.labels(route="trajectory", status="409").inc()
    m.prompt_tokens.inc(7)
    for value in (0.05, 0.5, 0.7, 3.0):
        m.gate_wait.observe(value)
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(m.render().decode())
        for s in f.samples
    }
    requests = "swerl_adapter_requests_total"
    assert samples[(requests, (("route", "untracked"), ("status", "ok")))] == 2
    assert samples[(requests, (("route", "trajectory"), ("status", "409")))] == 1
    assert samples[("swerl_adapter_prompt_tokens_total", ())] == 7
    # Cumulative buckets: 0.05 <= 0.1, three values <= 1, all four <= +Inf.
    assert samples[("swerl_adapter_gate_wait_seconds_bucket", (("le", "0.1"),))] == 1
    assert samples[("swerl_adapter_gate_wait_seconds_bucket", (("le", "1.0"),))] == 3
    assert samples[("swerl_adapter_gate_wait_seconds_bucket", (("le", "+Inf"),))] == 4
    assert samples[("swerl_adapter_gate_wait_seconds_sum", ())] == 4.25
    assert m.value("swerl_adapter_gate_wait_seconds_count") == 4
    assert m.value(requests, route="untracked", status="ok") == 2
    assert m.value(requests, route="never", status="seen") == 0


def test_label_values_are_escaped() -> None:
    m = AdapterMetrics()
    m.engine_healthy.labels(engine='a"b\\c\nd').set(1)
    family = _families(m)["swerl_adapter_engine_healthy"]
    assert [s.labels["engine"] for s in family.samples] == ['a"b\\c\nd']


def test_each_adapter_has_its_own_registry() -> None:
    first, second = AdapterMetrics(), AdapterMetrics()  # a second one does not clash
    first.retries.inc()
    assert first.value("swerl_adapter_retries_total") == 1
    assert second.value("swerl_adapter_retries_total") == 0
    # Nothing lands in the process-global registry.
    assert prometheus_client.REGISTRY.get_sample_value("swerl_adapter_retries_total") is None
