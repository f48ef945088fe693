"""The trainer service's Prometheus metrics, in a registry of its own
(``trainer_service.metrics_port`` serves them; :mod:`services.metrics_server`).

The service calls the hooks where the events happen: :meth:`TrainerServiceMetrics.claimed` when
it takes a job, :meth:`TrainerServiceMetrics.heartbeat` each time the job's lease heartbeat
reads the run's progress, :meth:`TrainerServiceMetrics.job_ended` when the job's process is
done, :meth:`TrainerServiceMetrics.finished` when it ends the job in a state.
"""

from __future__ import annotations

import math

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from services.metrics_server import HeartbeatGauges


class TrainerServiceMetrics:
    """Every metric the trainer service exports (``swerl_trainer_service_*``)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.jobs_claimed = Counter(
            "swerl_trainer_service_jobs_claimed_total", "Train jobs claimed (attempts).", registry=r
        )
        self.jobs_finished = Counter(
            "swerl_trainer_service_jobs_finished_total",
            "Train jobs ended by this service, by state (succeeded, failed, cancelled; queued: "
            "given back to run again).",
            ("state",),
            registry=r,
        )
        self.running = Gauge(
            "swerl_trainer_service_jobs_running", "Train jobs this service runs now.", registry=r
        )
        self.step = Gauge(
            "swerl_trainer_service_step",
            "Training step of the running job, from its metrics.jsonl (NaN: no job runs).",
            registry=r,
        )
        self.step.set(math.nan)
        self.heartbeats = HeartbeatGauges(
            r, "swerl_trainer_service", "the running job's last lease heartbeat"
        )

    def claimed(self) -> None:
        self.jobs_claimed.inc()
        self.running.inc()

    def heartbeat(self, step: int, now: float | None = None) -> None:
        """The lease heartbeat of the running job read its progress: ``step``."""
        self.heartbeats.beat(now)
        self.step.set(step)

    def job_ended(self) -> None:
        """The claimed job's process is done (whatever its end): no job runs."""
        self.running.dec()
        self.step.set(math.nan)
        self.heartbeats.clear()

    def finished(self, state: str) -> None:
        self.jobs_finished.labels(state).inc()

    def value(self, sample: str, **labels: str) -> float:
        """The current value of one exposed sample, 0 if it was never set."""
        found = self.registry.get_sample_value(sample, labels)
        return 0.0 if found is None else found

    def render(self) -> bytes:
        return generate_latest(self.registry)
