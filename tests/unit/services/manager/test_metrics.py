"""The rollout manager's Prometheus metrics: the registry, the dispatcher's hooks (a dispatch
pass, a dead node's tasks taken back, a rebalance) on a stub queue, and the endpoint."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import httpx
import pytest

from services.manager.__main__ import main as manager_main
from services.manager.config import ManagerConfig
from services.manager.dispatcher import Dispatcher
from services.manager.metrics import ManagerMetrics
from services.metrics_server import start_metrics_server
from services.queue.models import NodeStatus

ALIVE = NodeStatus(name="a", alive=True, slots=4, busy=1, outstanding=1, draining=False)
DEAD = NodeStatus(name="d", alive=False, slots=8, busy=8, outstanding=8, draining=False)


@dataclass
class StubQueue:
    """The DispatcherQueue calls of one dispatch pass and one reclaim."""

    pending: int
    statuses: list[NodeStatus] = field(default_factory=lambda: [ALIVE, DEAD])
    queued: dict[str, int] = field(default_factory=dict)  # undelivered entries per node

    def nodes(self) -> list[NodeStatus]:
        return list(self.statuses)

    def node_names(self) -> list[str]:
        return [n.name for n in self.statuses]

    def cluster_state(self, names: list[str]) -> tuple[int, list[NodeStatus], int]:
        return self.pending, list(self.statuses), len(names)

    def dispatch(self, node: str, bound: int, k: int) -> tuple[int, int]:
        sent = min(k, self.pending)
        self.pending -= sent
        self.statuses = [replace(n, outstanding=n.outstanding + sent) if n.name == node else n
                         for n in self.statuses]  # fmt: skip
        return sent, self.pending

    def reclaim_node(self, node: str, reason: str) -> int:
        return 5 if node == "d" else 0

    def take_back_undelivered(self, node: str, n: int, reason: str) -> int:
        moved = min(n, self.queued.get(node, 0))
        self.queued[node] = self.queued.get(node, 0) - moved
        return moved


def test_a_dispatch_pass_sets_the_cluster_gauges_and_counts_what_it_sent() -> None:
    queue = StubQueue(pending=7)
    d = Dispatcher(queue, ManagerConfig(prefetch=1))  # type: ignore[arg-type]
    sent = d.dispatch_once()
    assert sent > 0
    m = d.metrics
    assert m.value("swerl_manager_dispatched_total") == sent
    assert m.value("swerl_manager_pending_tasks") == 7  # as the pass found it
    assert m.value("swerl_manager_nodes_alive") == 1  # the dead node's slots do not count
    assert (m.value("swerl_manager_slots"), m.value("swerl_manager_busy_slots")) == (4, 1)


def test_tasks_of_a_dead_node_and_rebalanced_ones_are_counted() -> None:
    d = Dispatcher(StubQueue(pending=0), ManagerConfig())  # type: ignore[arg-type]
    assert d.reclaim_once() == 5
    assert d.metrics.value("swerl_manager_reclaimed_total") == 5
    busy = replace(ALIVE, name="b", slots=1, outstanding=3)  # 2 queued behind its one slot
    free = replace(ALIVE, name="f", slots=2, busy=0, outstanding=0)
    queue = StubQueue(pending=0, statuses=[busy, free], queued={"b": 2})
    d2 = Dispatcher(queue, ManagerConfig())  # type: ignore[arg-type]
    assert d2._rebalance([busy, free]) == 2
    assert d2.metrics.value("swerl_manager_rebalanced_total") == 2


def test_the_endpoint_serves_the_manager_metrics() -> None:
    m = ManagerMetrics()
    m.cluster(3, [ALIVE, DEAD])
    m.dispatched(2)
    server = start_metrics_server(m.registry, 0, "127.0.0.1")
    try:
        text = httpx.get(f"http://127.0.0.1:{server.port}/metrics", timeout=10).text
    finally:
        server.close()
    assert "swerl_manager_pending_tasks 3.0" in text
    assert "swerl_manager_dispatched_total 2.0" in text


def test_the_flag_sets_the_port_and_zero_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert manager_main(["--metrics-port", "9301", "--print-config"]) == 0
    assert "metrics_port: 9301" in capsys.readouterr().out
    assert manager_main(["--metrics-port", "0", "--print-config"]) == 2
    assert "manager.metrics_port" in capsys.readouterr().err
