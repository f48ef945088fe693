"""The dispatch budget: backpressure bound, free slots before prefetch, spreading."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.queue.budget import NodeLoad, max_outstanding, plan_dispatch


def test_small_batch_is_spread_over_nodes() -> None:
    nodes = [NodeLoad("a", 4, 0), NodeLoad("b", 4, 0), NodeLoad("c", 4, 0)]
    assert plan_dispatch(nodes, 3, prefetch=1) == {"a": 1, "b": 1, "c": 1}


def test_free_slots_are_filled_before_any_prefetch() -> None:
    # a has 1 free slot, b has 3: 4 tasks fill the free slots, none goes to prefetch.
    nodes = [NodeLoad("a", 2, 1), NodeLoad("b", 3, 0)]
    assert plan_dispatch(nodes, 4, prefetch=2) == {"a": 1, "b": 3}


def test_prefetch_on_top_of_slots_and_never_beyond() -> None:
    nodes = [NodeLoad("a", 2, 0), NodeLoad("b", 2, 2)]
    # a: 2 free + 1 prefetch; b: full slots + 1 prefetch; the rest stays pending.
    assert plan_dispatch(nodes, 100, prefetch=1) == {"a": 3, "b": 1}
    assert plan_dispatch(nodes, 100, prefetch=0) == {"a": 2}


def test_node_over_its_budget_or_without_slots_gets_nothing() -> None:
    nodes = [NodeLoad("a", 2, 5), NodeLoad("z", 0, 0)]
    assert plan_dispatch(nodes, 10, prefetch=1) == {}
    assert max_outstanding(0, 3) == 0
    assert max_outstanding(4, 3) == 7


def test_no_pending_no_nodes() -> None:
    assert plan_dispatch([NodeLoad("a", 2, 0)], 0, prefetch=1) == {}
    assert plan_dispatch([], 5, prefetch=1) == {}


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: plan_dispatch([NodeLoad("a", 1, 0)], -1, 1), "pending must be >= 0"),
        (lambda: plan_dispatch([NodeLoad("a", 1, 0)], 1, -1), "prefetch must be >= 0"),
        (lambda: plan_dispatch([NodeLoad("a", 1, 0)] * 2, 1, 1), "duplicate node names"),
        (lambda: NodeLoad("a", -1, 0), "must be >= 0"),
        (lambda: max_outstanding(1, -2), "must be >= 0"),
    ],
)
def test_bad_input_is_rejected(call: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        call()  # type: ignore[operator]


loads = st.lists(st.tuples(st.integers(0, 8), st.integers(0, 12)), min_size=0, max_size=6).map(
    lambda xs: [NodeLoad(f"n{i}", s, o) for i, (s, o) in enumerate(xs)]
)


@given(nodes=loads, pending=st.integers(0, 60), prefetch=st.integers(0, 3))
def test_plan_properties(nodes: list[NodeLoad], pending: int, prefetch: int) -> None:
    plan = plan_dispatch(nodes, pending, prefetch)
    room = {n.name: max(0, (n.slots + prefetch if n.slots else 0) - n.outstanding) for n in nodes}
    # Never beyond slots + prefetch, never more than pending, and as much as fits.
    assert all(0 < k <= room[name] for name, k in plan.items())
    assert sum(plan.values()) == min(pending, sum(room.values()))
    # Free slots first: if any node got prefetch work, every node's slots are full.
    after = {n.name: n.outstanding + plan.get(n.name, 0) for n in nodes}
    if any(after[n.name] > n.slots and plan.get(n.name, 0) for n in nodes):
        assert all(after[n.name] >= n.slots for n in nodes)
