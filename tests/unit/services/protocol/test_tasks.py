"""Validation and round trips of the execution-plane messages."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from services.protocol import RolloutRequest, RolloutTask, TaskResult
from services.protocol.trajectory import Outcome, OutcomeStatus


def test_request_defaults_groups_per_prompt() -> None:
    req = RolloutRequest(batch_id="b1", instance_ids=["a", "b"], n_samples=8)
    assert req.resolved_group_ids() == ["b1:0", "b1:1"]


def test_request_rejects_mismatched_group_ids() -> None:
    with pytest.raises(ValidationError, match="group_ids has 1 entries for 2 instance_ids"):
        RolloutRequest(instance_ids=["a", "b"], group_ids=["g"])


@pytest.mark.parametrize(
    "bad",
    [
        {"instance_ids": []},
        {"instance_ids": ["a"], "n_samples": 0},
        {"instance_ids": ["a"], "sampling": {"temperature": -1}},
        {"instance_ids": ["a"], "limits": {"max_steps": 0}},
        {"instance_ids": ["a"], "unknown_field": 1},
        {"instance_ids": ["bad id with spaces"]},
    ],
)
def test_request_rejects_bad_input(bad: dict) -> None:
    with pytest.raises(ValidationError):
        RolloutRequest.model_validate(bad)


def test_task_and_result_round_trip() -> None:
    task = RolloutTask(task_id="t1", batch_id="b", group_id="g", instance_id="i", attempt=2)
    assert task.trajectory_id == "t1.a2"
    assert RolloutTask.model_validate_json(task.model_dump_json()) == task
    res = TaskResult(
        task_id="t1", batch_id="b", trajectory_id=task.trajectory_id, node="n0", attempt=2,
        outcome=Outcome(status=OutcomeStatus.ABORTED, abort_reason="image swerl/x missing"),
    )  # fmt: skip
    back = TaskResult.model_validate_json(res.model_dump_json())
    assert back == res and back.outcome.reward is None


def test_kind_defaults_to_swe_and_round_trips() -> None:
    assert RolloutRequest(instance_ids=["a"]).kind == "swe"
    task = RolloutTask(
        task_id="t", batch_id="b", group_id="g", instance_id="toy-lookup-3", kind="toy"
    )
    back = RolloutTask.model_validate_json(task.model_dump_json())
    assert back.kind == "toy" and back == task
    old_payload = '{"task_id": "t", "batch_id": "b", "group_id": "g", "instance_id": "i"}'
    assert RolloutTask.model_validate_json(old_payload).kind == "swe"  # payloads before kinds


@pytest.mark.parametrize("model", [RolloutRequest, RolloutTask])
def test_an_unknown_kind_is_refused_naming_the_field(model: type) -> None:
    fields = {"instance_ids": ["a"]} if model is RolloutRequest else {
        "task_id": "t", "batch_id": "b", "group_id": "g", "instance_id": "a"}  # fmt: skip
    with pytest.raises(ValidationError, match=r"kind\n.*'swe' or 'toy'"):
        model.model_validate({**fields, "kind": "math"})


def test_a_toy_request_names_only_toy_instances() -> None:
    ok = RolloutRequest(kind="toy", instance_ids=["toy-lookup-0", "toy-lookup-41"], n_samples=8)
    assert ok.instance_ids == ["toy-lookup-0", "toy-lookup-41"]
    with pytest.raises(ValidationError, match="kind 'toy': 'swerl__spanlib-1' is not a toy"):
        RolloutRequest(kind="toy", instance_ids=["toy-lookup-0", "swerl__spanlib-1"])
    with pytest.raises(ValidationError, match="kind 'toy': 'toy-lookup-07' is not a toy"):
        RolloutTask(
            task_id="t", batch_id="b", group_id="g", instance_id="toy-lookup-07", kind="toy"
        )
    # A SWE request may use any id, even one that looks like a toy id.
    assert RolloutRequest(instance_ids=["toy-lookup-07"]).kind == "swe"
