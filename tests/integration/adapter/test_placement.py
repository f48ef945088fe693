"""Placement through the running adapter: opening a trajectory pins sample k to engine k mod n.

Opening a trajectory calls no engine, so the engine URLs here need no server behind them.
"""

from __future__ import annotations

from tests.integration.adapter.conftest import AdapterFactory, RunningAdapter

ENGINES = ["http://127.0.0.1:9", "http://127.0.0.1:10"]


def open_sample(a: RunningAdapter, trajectory_id: str, sample_index: object) -> int:
    body = {"trajectory_id": trajectory_id, "extra": {"sample_index": sample_index}}
    return a.http.post(f"{a.url}/trajectories", json=body).status_code


def test_sample_index_placement_pins_each_sample_at_open(adapter: AdapterFactory) -> None:
    with adapter(engines=ENGINES, placement="sample_index") as a:
        first, second = (e.url for e in a.service.router.engines)
        for k in range(3):
            assert open_sample(a, f"b:0:{k}.a1", k) == 201
        sticky = a.call(lambda: dict(a.service.router.sticky))
        assert sticky == {"b:0:0.a1": first, "b:0:1.a1": second, "b:0:2.a1": first}
        # A malformed sample index is refused before anything is recorded.
        response = a.http.post(
            f"{a.url}/trajectories",
            json={"trajectory_id": "b:0:3.a1", "extra": {"sample_index": -1}},
        )
        assert response.status_code == 400
        assert "sample_index must be an integer" in response.json()["error"]["message"]
        assert a.http.get(f"{a.url}/trajectories/b:0:3.a1").status_code == 404
        assert "b:0:3.a1" not in a.call(lambda: dict(a.service.router.sticky))


def test_least_busy_placement_pins_nothing_at_open(adapter: AdapterFactory) -> None:
    with adapter(engines=ENGINES) as a:
        assert open_sample(a, "b:1:1.a1", 1) == 201
        assert open_sample(a, "b:1:2.a1", "not read") == 201  # metadata it does not use
        assert a.call(lambda: dict(a.service.router.sticky)) == {}
