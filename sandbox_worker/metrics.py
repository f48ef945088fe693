"""The sandbox worker's Prometheus metrics, in a registry of its own (``worker.metrics_port``
serves them; :mod:`services.metrics_server`).

The worker calls the hooks where the events happen: :meth:`WorkerMetrics.started` when a task
takes a slot, :meth:`WorkerMetrics.finished` when it leaves it, :meth:`WorkerMetrics.heartbeat`
after each heartbeat Redis accepted.
"""

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from services.metrics_server import HeartbeatGauges

# Trajectories last minutes to hours; sandboxes start in a second to a few minutes.
TRAJECTORY_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200, 14400)
SANDBOX_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
HANDED_BACK = "handed_back"  # outcome label of a task stopped by a shutdown and queued again
SANDBOX_START = "sandbox_create"  # the runner's duration key of the sandbox start


class WorkerMetrics:
    """Every metric the worker exports (``swerl_worker_*``)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.slots = Gauge("swerl_worker_slots", "Trajectory slots of this node.", registry=r)
        self.busy = Gauge("swerl_worker_busy_slots", "Slots running a trajectory.", registry=r)
        self.trajectories_started = Counter(
            "swerl_worker_trajectories_started_total", "Trajectories started.", registry=r
        )
        self.trajectories_finished = Counter(
            "swerl_worker_trajectories_finished_total",
            "Trajectories finished, by outcome (completed, timeout, error, aborted, handed_back).",
            ("outcome",),
            registry=r,
        )
        self.trajectory_seconds = Histogram(
            "swerl_worker_trajectory_seconds", "Wall time of one trajectory, by outcome.",
            ("outcome",), registry=r, buckets=TRAJECTORY_BUCKETS,
        )  # fmt: skip
        self.sandbox_start_seconds = Histogram(
            "swerl_worker_sandbox_start_seconds", "Time to create and start a sandbox.",
            registry=r, buckets=SANDBOX_BUCKETS,
        )  # fmt: skip
        self.heartbeats = HeartbeatGauges(r, "swerl_worker", "the last heartbeat Redis accepted")

    def set_slots(self, slots: int) -> None:
        self.slots.set(slots)

    def started(self) -> None:
        """A task took a slot."""
        self.trajectories_started.inc()
        self.busy.inc()

    def finished(self, outcome: str, seconds: float, durations: Mapping[str, float]) -> None:
        """A task left its slot with ``outcome`` (an ``OutcomeStatus`` or ``handed_back``)
        after ``seconds``; ``durations``: the runner's phase timings."""
        self.busy.dec()
        self.trajectories_finished.labels(outcome).inc()
        self.trajectory_seconds.labels(outcome).observe(max(0.0, seconds))
        if SANDBOX_START in durations:
            self.sandbox_start_seconds.observe(durations[SANDBOX_START])

    def heartbeat(self, now: float | None = None) -> None:
        """Redis accepted a heartbeat at ``now`` (default: the current time)."""
        self.heartbeats.beat(now)

    def value(self, sample: str, **labels: str) -> float:
        """The current value of one exposed sample, 0 if it was never set."""
        found = self.registry.get_sample_value(sample, labels)
        return 0.0 if found is None else found

    def render(self) -> bytes:
        return generate_latest(self.registry)
