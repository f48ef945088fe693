"""The one id rule (services.protocol.ids), as the adapter and the queue payloads apply it."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from services.protocol import RolloutRequest, RolloutTask, TaskResult, TrajectoryMeta, check_id
from services.protocol.trajectory import Outcome, OutcomeStatus

# Real ids: batch "b-<hex>", group "<batch>:<prompt>", task "<batch>:<prompt>:<sample>",
# trajectory "<task>.a<attempt>", SWE-bench instance ids.
VALID = [
    "b-1a2b3c4d5e6f:3:7.a1",
    "b-1a2b3c4d5e6f:3",
    "django__django-11099",
    "traj_1",
    "A",
    "9.a2",
    "x" * 200,
]
INVALID = [
    "",
    "..",
    ".",
    "-",
    ":",
    "_x",
    "-rf",
    ".hidden",
    ":0:1",
    "a..b",
    "a/../b",
    "ok..",
    "has space",
    "a/b",
    "tab\tx",
    "é",
    "x" * 201,
]


@pytest.mark.parametrize("good", VALID)
def test_real_ids_pass(good: str) -> None:
    assert check_id(good) == good
    assert TrajectoryMeta(trajectory_id=good).trajectory_id == good


@pytest.mark.parametrize("bad", INVALID)
def test_ids_must_start_alphanumeric_without_dot_dot(bad: str) -> None:
    with pytest.raises(ValueError, match="invalid id"):
        check_id(bad)
    with pytest.raises(ValidationError):
        TrajectoryMeta(trajectory_id=bad)


@pytest.mark.parametrize("bad", ["..", "-", ":", "a..b"])
def test_queue_payloads_apply_the_same_rule(bad: str) -> None:
    with pytest.raises(ValidationError, match="task_id"):
        RolloutTask(task_id=bad, batch_id="b", group_id="g", instance_id="i")
    with pytest.raises(ValidationError, match="instance_ids"):
        RolloutRequest(instance_ids=[bad])
    with pytest.raises(ValidationError, match="node"):
        TaskResult(
            task_id="t",
            batch_id="b",
            trajectory_id="t.a1",
            node=bad,
            attempt=1,
            outcome=Outcome(status=OutcomeStatus.COMPLETED, reward=1.0),
        )
    with pytest.raises(ValidationError, match="group_id"):
        TrajectoryMeta(trajectory_id="t.a1", group_id=bad)


def test_meta_refuses_unknown_keys_and_coercion() -> None:
    with pytest.raises(ValidationError, match="task_idd"):
        TrajectoryMeta.model_validate({"trajectory_id": "t1", "task_idd": "x"})
    with pytest.raises(ValidationError, match="created_at"):
        TrajectoryMeta.model_validate({"trajectory_id": "t1", "created_at": "5"})
    with pytest.raises(ValidationError, match="created_at"):
        TrajectoryMeta.model_validate({"trajectory_id": "t1", "created_at": True})
    with pytest.raises(ValidationError, match="trajectory_id"):
        TrajectoryMeta.model_validate({"trajectory_id": 5})
    meta = TrajectoryMeta.model_validate({"trajectory_id": "t1", "created_at": 5, "batch_id": ""})
    assert meta.created_at == 5.0 and meta.batch_id == ""
    # What the store wrote reads back (JSON mode).
    assert TrajectoryMeta.model_validate_json(meta.model_dump_json()) == meta
