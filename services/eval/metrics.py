"""The evaluator service's Prometheus metrics, in a registry of its own
(``eval_service.metrics_port`` serves them; :mod:`services.metrics_server`).

The service calls the hooks where the events happen: :meth:`EvalMetrics.claimed` when it takes
a job, :meth:`EvalMetrics.job_ended` when its evaluation returns, :meth:`EvalMetrics.finished`
when it ends the job in a state, :meth:`EvalMetrics.graded` with the run report's per-instance
statuses.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

# An eval job grades one instance in minutes, a whole benchmark in hours.
JOB_BUCKETS = (10, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200, 14400, 28800, 86400)


class EvalMetrics:
    """Every metric the evaluator service exports (``swerl_evaluator_*``)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.jobs_claimed = Counter(
            "swerl_evaluator_jobs_claimed_total", "Eval jobs claimed (attempts).", registry=r
        )
        self.jobs_finished = Counter(
            "swerl_evaluator_jobs_finished_total",
            "Eval jobs ended by this service, by state (succeeded, failed, cancelled; queued: "
            "given back when the service stopped).",
            ("state",),
            registry=r,
        )
        self.running = Gauge(
            "swerl_evaluator_jobs_running", "Eval jobs this service runs now.", registry=r
        )
        self.instances = Counter(
            "swerl_evaluator_instances_graded_total",
            "Instances in finished run reports, by verdict (resolved, unresolved, error, "
            "empty_patch, incomplete).",
            ("verdict",),
            registry=r,
        )
        self.grading_seconds = Histogram(
            "swerl_evaluator_grading_seconds",
            "Wall time of one claimed eval job's evaluation (generation included).",
            registry=r,
            buckets=JOB_BUCKETS,
        )

    def claimed(self) -> None:
        self.jobs_claimed.inc()
        self.running.inc()

    def job_ended(self, seconds: float) -> None:
        """The claimed job's evaluation returned after ``seconds`` (whatever its end)."""
        self.running.dec()
        self.grading_seconds.observe(max(0.0, seconds))

    def finished(self, state: str) -> None:
        self.jobs_finished.labels(state).inc()

    def graded(self, verdicts: Iterable[str]) -> None:
        for verdict in verdicts:
            self.instances.labels(verdict).inc()

    def value(self, sample: str, **labels: str) -> float:
        """The current value of one exposed sample, 0 if it was never set."""
        found = self.registry.get_sample_value(sample, labels)
        return 0.0 if found is None else found

    def render(self) -> bytes:
        return generate_latest(self.registry)
