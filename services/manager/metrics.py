"""The rollout manager's Prometheus metrics, in a registry of its own (``manager.metrics_port``
serves them; :mod:`services.metrics_server`).

The dispatcher calls the hooks where the events happen: :meth:`ManagerMetrics.cluster` with
each pass's view of the queue, :meth:`ManagerMetrics.dispatched`, :meth:`ManagerMetrics.reclaimed`
(tasks of a dead node taken back: their leases expired) and :meth:`ManagerMetrics.rebalanced`.
"""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from services.queue.models import NodeStatus


class ManagerMetrics:
    """Every metric the manager exports (``swerl_manager_*``)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.pending = Gauge(
            "swerl_manager_pending_tasks", "Tasks waiting to be dispatched to a node.", registry=r
        )
        self.nodes_alive = Gauge(
            "swerl_manager_nodes_alive", "Worker nodes with a live heartbeat.", registry=r
        )
        self.slots = Gauge("swerl_manager_slots", "Slots of the live nodes.", registry=r)
        self.busy = Gauge("swerl_manager_busy_slots", "Busy slots of the live nodes.", registry=r)
        self.dispatched_total = Counter(
            "swerl_manager_dispatched_total", "Tasks moved onto a node's stream.", registry=r
        )
        self.reclaimed_total = Counter(
            "swerl_manager_reclaimed_total",
            "Tasks taken back from dead nodes (heartbeat expired) and queued again.",
            registry=r,
        )
        self.rebalanced_total = Counter(
            "swerl_manager_rebalanced_total",
            "Queued (prefetched) tasks moved back from a busy node to free slots.",
            registry=r,
        )

    def cluster(self, pending: int, nodes: Sequence[NodeStatus]) -> None:
        """One dispatch pass's view: the pending count and every known node."""
        alive = [n for n in nodes if n.alive]
        self.pending.set(pending)
        self.nodes_alive.set(len(alive))
        self.slots.set(sum(n.slots for n in alive))
        self.busy.set(sum(n.busy for n in alive))

    def dispatched(self, n: int) -> None:
        self.dispatched_total.inc(n)

    def reclaimed(self, n: int) -> None:
        self.reclaimed_total.inc(n)

    def rebalanced(self, n: int) -> None:
        self.rebalanced_total.inc(n)

    def value(self, sample: str, **labels: str) -> float:
        """The current value of one exposed sample, 0 if it was never set."""
        found = self.registry.get_sample_value(sample, labels)
        return 0.0 if found is None else found

    def render(self) -> bytes:
        return generate_latest(self.registry)
