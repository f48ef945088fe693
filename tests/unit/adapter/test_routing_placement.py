"""Where a new trajectory starts: least busy by default, or pinned by its sample index."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from adapter.config import AdapterConfig, Placement
from adapter.engines.sglang import SGLangClient
from adapter.errors import APIError
from adapter.metrics import AdapterMetrics
from adapter.routing import Engine, Router, sample_index_of
from services.protocol import TrajectoryMeta


def router(n: int, placement: Placement) -> Router:
    urls = [f"http://127.0.0.1:{9100 + i}" for i in range(n)]
    engines = [Engine(url=url, client=SGLangClient(url)) for url in urls]
    return Router(engines=engines, metrics=AdapterMetrics(), placement=placement)


def test_sample_index_placement_pins_sample_k_to_engine_k_mod_n_whatever_the_load() -> None:
    r = router(2, Placement.SAMPLE_INDEX)
    scripted, sampling = r.engines
    scripted.inflight = 5  # the busier engine still gets every sample 0
    for group in ("g0", "g1"):
        for k in range(4):
            meta = TrajectoryMeta(trajectory_id=f"{group}:{k}", extra={"sample_index": k})
            r.place(meta.trajectory_id, r.placement_index(meta))
    for group in ("g0", "g1"):
        assert [r.pick(f"{group}:{k}") for k in range(4)] == [scripted, sampling] * 2
    assert (scripted.assigned, sampling.assigned) == (4, 4)
    # Without a sample index the trajectory is placed as usual (least busy, at its first call).
    assert r.placement_index(TrajectoryMeta(trajectory_id="untracked")) is None
    r.place("untracked", None)
    assert r.pick("untracked") is sampling
    # A pinned engine out of rotation: the trajectory goes elsewhere, as any sticky one does.
    r.mark_unhealthy(scripted, "down")
    assert r.pick("g0:0") is sampling
    r.forget("g0:0")
    assert scripted.assigned == 3


def test_least_busy_placement_ignores_the_sample_index() -> None:
    r = router(2, Placement.LEAST_BUSY)
    busy, idle = r.engines
    busy.inflight = 1
    meta = TrajectoryMeta(trajectory_id="t", extra={"sample_index": 0})
    assert r.placement_index(meta) is None
    r.place("t", r.placement_index(meta))
    assert (busy.assigned, idle.assigned) == (0, 0)
    assert r.pick("t") is idle
    # Metadata it does not read is not its to refuse.
    odd = TrajectoryMeta(trajectory_id="u", extra={"sample_index": "first"})
    assert r.placement_index(odd) is None


def test_sample_index_is_read_from_the_open_metadata_and_checked() -> None:
    meta = TrajectoryMeta(trajectory_id="b:0:1.a1", extra={"sample_index": 1})
    assert sample_index_of(meta) == 1
    assert sample_index_of(TrajectoryMeta(trajectory_id="t")) is None
    for bad in (-1, "1", 1.0, True):
        with pytest.raises(APIError, match="sample_index must be an integer") as info:
            sample_index_of(TrajectoryMeta(trajectory_id="t", extra={"sample_index": bad}))
        assert info.value.status == 400


def test_placement_config_is_checked() -> None:
    config = AdapterConfig(engines=["http://e"], model="m", placement="sample_index")
    assert config.placement is Placement.SAMPLE_INDEX
    assert AdapterConfig(engines=["http://e"], model="m").placement is Placement.LEAST_BUSY
    with pytest.raises(ValidationError, match="placement"):
        AdapterConfig(engines=["http://e"], model="m", placement="round_robin")
