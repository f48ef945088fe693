"""The rollout manager's dispatcher: the loop that dispatches with backpressure and takes back
dead nodes' work (``python -m services.manager`` runs it, or ``RolloutManager.start()``).

The loop is stateless: everything lives in Redis, so the manager can be restarted (or briefly
run twice) at any time. Each pass reads the live nodes' heartbeats and outstanding counts,
computes a budget with :func:`plan_dispatch` and moves pending tasks onto node streams with
the dispatch script, which re-checks the bound atomically. The loop sleeps on the wake list,
which submissions, completions, retries and new workers push to, so a freed slot is refilled
within milliseconds; ``poll_interval_s`` only bounds the wait when nothing happens.
"""

from __future__ import annotations

import logging
import threading
import time

from services.manager.config import ManagerConfig
from services.manager.metrics import ManagerMetrics
from services.queue.budget import NodeLoad, max_outstanding, plan_dispatch
from services.queue.connection import TRANSIENT_ERRORS, backoff_sleep
from services.queue.dispatcher import DispatcherQueue
from services.queue.models import NodeStatus

log = logging.getLogger("swerl.manager")


class Dispatcher:
    def __init__(
        self, queue: DispatcherQueue, cfg: ManagerConfig, metrics: ManagerMetrics | None = None
    ) -> None:
        self.queue = queue
        self.cfg = cfg
        self.metrics = metrics or ManagerMetrics()
        self._last_reclaim = 0.0
        # No reclaim until live workers have had one heartbeat TTL to show up: after a Redis
        # outage (or a manager start) heartbeat keys may have expired and entries look idle
        # although their workers are fine; reclaiming then would re-run their tasks.
        self._reclaim_not_before = time.monotonic() + cfg.queue.heartbeat_ttl_s
        self._last_step = time.monotonic()
        self._last_summary = time.monotonic()
        self.dispatched = 0
        self._node_names: list[str] = []
        self._names_at = -1e9
        self.reclaimed = 0

    def _state(self) -> tuple[int, list[NodeStatus]]:
        """Pending count and node status; node names are re-read only when their number
        changed (a new worker) or every few seconds."""
        now = time.monotonic()
        if now - self._names_at > 5.0:
            self._node_names, self._names_at = self.queue.node_names(), now
        pending, nodes, known = self.queue.cluster_state(self._node_names)
        if known != len(self._node_names):
            self._node_names, self._names_at = self.queue.node_names(), now
            pending, nodes, _ = self.queue.cluster_state(self._node_names)
        self.metrics.cluster(pending, nodes)
        return pending, nodes

    def dispatch_once(self) -> int:
        """One dispatch pass (repeated while it makes progress); returns tasks sent."""
        total = 0
        for _ in range(1000):  # bounded: each round consumes pending ids or stops
            pending, nodes = self._state()
            live = [n for n in nodes if n.alive and not n.draining]
            if pending == 0:
                if self._rebalance(live):
                    continue
                break
            plan = plan_dispatch(
                [NodeLoad(n.name, n.slots, n.outstanding) for n in live], pending, self.cfg.prefetch
            )
            if not plan:
                break
            slots = {n.name: n.slots for n in live}
            sent_round = 0
            for name, k in plan.items():
                sent, _left = self.queue.dispatch(
                    name, max_outstanding(slots[name], self.cfg.prefetch), k
                )
                sent_round += sent
            total += sent_round
            # Another round only if stale ids (cancelled tasks) used up part of the plan.
            if sent_round == 0 or sent_round == sum(plan.values()):
                break
        if total:
            log.debug("dispatched %d task(s)", total)
        self.dispatched += total
        self.metrics.dispatched(total)
        return total

    def _rebalance(self, live: list[NodeStatus]) -> int:
        """Nothing is pending but a node has a free slot while others hold queued (prefetched)
        entries: move those entries back so the free slot gets them. Without this, a task
        prefetched behind long-running ones would wait while other nodes idle."""
        free = sum(max(0, n.slots - n.outstanding) for n in live)
        if free == 0:
            return 0
        moved = 0
        for donor in sorted(live, key=lambda n: n.slots - n.outstanding):
            excess = donor.outstanding - donor.slots
            if excess <= 0 or moved >= free:
                continue
            moved += self.queue.take_back_undelivered(
                donor.name, min(excess, free - moved), f"rebalanced from busy node {donor.name}"
            )
        if moved:
            log.debug("rebalanced %d queued task(s) to free slots", moved)
        self.metrics.rebalanced(moved)
        return moved

    def reclaim_once(self) -> int:
        """Take back the work of every node whose heartbeat has expired."""
        n = 0
        for node in self.queue.nodes():
            if node.alive:
                continue
            got = self.queue.reclaim_node(
                node.name,
                f"node {node.name} lost (no heartbeat for {self.cfg.queue.heartbeat_ttl_s:g} s)",
            )
            if got:
                log.warning("took back %d task(s) of dead node %s", got, node.name)
            n += got
        self.reclaimed += n
        self.metrics.reclaimed(n)
        return n

    def _reclaim_allowed(self, now: float) -> bool:
        """Reclaim only once live workers have had a heartbeat TTL to show up.

        Heartbeat keys expire and stream entries go idle during a Redis outage although the
        workers are fine, so after one (a long gap between passes, or a freshly restarted
        Redis) the manager waits one TTL before it treats missing heartbeats as dead nodes.
        """
        ttl = self.cfg.queue.heartbeat_ttl_s
        if now < self._reclaim_not_before:
            return False
        uptime = self.queue.server_uptime_s()
        if uptime < ttl:
            self._reclaim_not_before = now + ttl - uptime
            log.info("Redis restarted %d s ago: no reclaim for %.1f s", uptime, ttl - uptime)
            return False
        return True

    def step(self) -> None:
        now = time.monotonic()
        if now - self._last_step > self.cfg.queue.heartbeat_ttl_s / 2:  # an outage, or a stall
            self._reclaim_not_before = max(
                self._reclaim_not_before, now + self.cfg.queue.heartbeat_ttl_s
            )
        self._last_step = now
        if now - self._last_reclaim >= self.cfg.reclaim_interval_s and self._reclaim_allowed(now):
            self._last_reclaim = now
            self.reclaim_once()
        self.dispatch_once()
        if now - self._last_summary >= self.cfg.summary_interval_s:
            self._last_summary = now
            self._log_summary()

    def _log_summary(self) -> None:
        pending, nodes, _known = self.queue.cluster_state(self.queue.node_names())
        alive = [n for n in nodes if n.alive]
        log.info(
            "pending=%d nodes=%d slots=%d busy=%d dispatched=%d reclaimed=%d",
            pending,
            len(alive),
            sum(n.slots for n in alive),
            sum(n.busy for n in alive),
            self.dispatched,
            self.reclaimed,
        )

    def run(self, stop: threading.Event) -> None:
        """Run until ``stop`` is set, riding out Redis outages with backoff."""
        log.info("rollout manager running (prefix %s)", self.cfg.queue.prefix)
        failures = 0
        while not stop.is_set():
            try:
                self.step()
                if failures:
                    log.info("Redis reachable again")
                    self._reclaim_not_before = time.monotonic() + self.cfg.queue.heartbeat_ttl_s
                failures = 0
                self.queue.wait_wake(self.cfg.poll_interval_s)
            except TRANSIENT_ERRORS as exc:
                failures += 1
                if failures == 1 or failures % 20 == 0:
                    log.warning("Redis unreachable (%s); retrying", exc)
                backoff_sleep(failures, stop, self.cfg.queue.backoff_cap_s)
        log.info("rollout manager stopped")
