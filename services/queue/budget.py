"""Dispatch budget: how many pending tasks each node gets right now (pure logic).

Backpressure rule (DESIGN.md): a node never has more than ``slots + prefetch`` tasks
outstanding (queued on its stream or running). Within that budget, free slots are filled first
and spread over the nodes (most free slots first, one task at a time) so that a small batch runs
in parallel on many nodes instead of queueing behind one; only then does each node get its
prefetch, which lets a worker start its next task the moment a slot frees, without waiting for
a manager round trip. The dispatch script re-checks the bound atomically, so a stale view here
can only under-fill, never overfill.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class NodeLoad:
    name: str
    slots: int
    outstanding: int  # dispatched and not yet reported

    def __post_init__(self) -> None:
        if self.slots < 0 or self.outstanding < 0:
            raise ValueError(f"node {self.name!r}: slots and outstanding must be >= 0")


def max_outstanding(slots: int, prefetch: int) -> int:
    """The most tasks a node may hold at once (a node without slots gets no prefetch either)."""
    if slots < 0 or prefetch < 0:
        raise ValueError(f"slots ({slots}) and prefetch ({prefetch}) must be >= 0")
    return slots + prefetch if slots > 0 else 0


def _spread(room: dict[str, int], n: int, plan: dict[str, int]) -> int:
    """Give up to n tasks, one at a time, to the node with the most room left; return given."""
    heap = [(-r, name) for name, r in room.items() if r > 0]
    heapq.heapify(heap)
    given = 0
    while given < n and heap:
        neg, name = heapq.heappop(heap)
        plan[name] = plan.get(name, 0) + 1
        given += 1
        if neg + 1 < 0:
            heapq.heappush(heap, (neg + 1, name))
    return given


def plan_dispatch(nodes: Sequence[NodeLoad], pending: int, prefetch: int) -> dict[str, int]:
    """Tasks to send to each node now; nodes that get none are absent from the result."""
    if pending < 0:
        raise ValueError(f"pending must be >= 0, got {pending}")
    if prefetch < 0:
        raise ValueError(f"prefetch must be >= 0, got {prefetch}")
    names = [n.name for n in nodes]
    if len(set(names)) != len(names):
        raise ValueError(f"duplicate node names in {names}")
    plan: dict[str, int] = {}
    free = {n.name: max(0, n.slots - n.outstanding) for n in nodes}
    given = _spread(free, pending, plan)
    extra = {
        n.name: max(0, max_outstanding(n.slots, prefetch) - n.outstanding - plan.get(n.name, 0))
        for n in nodes
    }
    _spread(extra, pending - given, plan)
    return plan
