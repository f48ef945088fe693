"""The job API's Prometheus metrics (``GET /metrics``), in a registry of the app's own."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4

from services.api.schemas import JobKind, JobState

CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4
BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)


class ApiMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "swerl_api_requests_total",
            "HTTP requests by route template, method and status.",
            ("route", "method", "status"),
            registry=self.registry,
        )
        self.latency = Histogram(
            "swerl_api_request_seconds",
            "Request latency by route template.",
            ("route",),
            registry=self.registry,
            buckets=BUCKETS,
        )
        self.jobs = Gauge(
            "swerl_api_jobs", "Jobs in Redis by kind and state.", ("kind", "state"),
            registry=self.registry,
        )  # fmt: skip

    def set_jobs(self, counts: dict[tuple[JobKind, JobState], int]) -> None:
        for (kind, state), n in counts.items():
            self.jobs.labels(kind.value, state.value).set(n)

    def render(self) -> bytes:
        return generate_latest(self.registry)
