"""What a job counts against ``api.quotas.max_tasks_per_job``, by kind."""

from __future__ import annotations

import pytest

from services.api.schemas import EvalSpec, RolloutSpec, Spec, TrainSpec
from services.api.service import task_count

TRAIN = {"model": "/m", "dataset": "/d", "steps": 9, "checkpoint_dir": "/c"}


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        (RolloutSpec(instance_ids=["a", "b", "c"], n_samples=7), (21, "body.instance_ids")),
        (TrainSpec.model_validate({**TRAIN, "batch": {"prompts_per_step": 6,
                                                       "samples_per_prompt": 5}}),
         (30, "body.batch")),
        (EvalSpec(predictions="gold", dataset="/d", instance_ids=["a", "b"]),
         (2, "body.instance_ids")),
        (EvalSpec(predictions="gold", dataset="/d", instance_ids=["a", "b"], max_instances=1),
         (1, "body.instance_ids")),
        (EvalSpec(predictions="gold", dataset="/d", max_instances=40), (40, "body.max_instances")),
        (EvalSpec(predictions="gold", dataset="/d"), None),  # the dataset's size: unknown here
    ],
)  # fmt: skip
def test_task_count(spec: Spec, expected: tuple[int, str] | None) -> None:
    assert task_count(spec) == expected
