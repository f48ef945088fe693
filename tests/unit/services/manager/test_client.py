"""``tasks_for_request``: one task per (prompt, sample), carrying the request's settings."""

from __future__ import annotations

from services.manager.client import tasks_for_request
from services.protocol import RolloutRequest, SamplingConfig


def test_every_task_carries_the_request_kind_and_settings() -> None:
    request = RolloutRequest(
        batch_id="b7",
        kind="toy",
        instance_ids=["toy-lookup-0", "toy-lookup-1"],
        n_samples=3,
        policy_version=4,
        sampling=SamplingConfig(max_tokens=32),
    )
    tasks = tasks_for_request(request)
    assert [t.task_id for t in tasks] == [f"b7:{i}:{s}" for i in range(2) for s in range(3)]
    assert {t.kind for t in tasks} == {"toy"}
    assert {(t.policy_version, t.sampling.max_tokens) for t in tasks} == {(4, 32)}
    assert [t.instance_id for t in tasks[:4]] == ["toy-lookup-0"] * 3 + ["toy-lookup-1"]


def test_a_request_without_a_kind_makes_swe_tasks() -> None:
    [task] = tasks_for_request(RolloutRequest(batch_id="b8", instance_ids=["swerl__strkit-1"]))
    assert task.kind == "swe"
