"""The job specs: defaults, bounds, and unknown fields refused by name."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from services.api.schemas import SPECS, EvalSpec, JobKind, JobState, RolloutSpec, TrainSpec


def test_one_spec_per_kind() -> None:
    assert {JobKind.TRAIN: TrainSpec, JobKind.ROLLOUT: RolloutSpec, JobKind.EVAL: EvalSpec} == SPECS


def test_train_spec_defaults_and_required_fields() -> None:
    spec = TrainSpec(model="m", dataset="d", steps=3, checkpoint_dir="/ckpt")
    assert (spec.algorithm, spec.trainer_group, spec.resume) == ("li2sao", "default", False)
    with pytest.raises(ValidationError) as err:
        TrainSpec.model_validate({"model": "m"})
    missing = {e["loc"][0] for e in err.value.errors()}
    assert missing == {"dataset", "steps", "checkpoint_dir"}


@pytest.mark.parametrize(
    ("model", "body", "field"),
    [
        (RolloutSpec, {"instance_ids": ["a"], "n_sample": 2}, "n_sample"),
        (RolloutSpec, {"instance_ids": []}, "instance_ids"),
        (RolloutSpec, {"instance_ids": ["a b"]}, "instance_ids"),
        (RolloutSpec, {"instance_ids": ["a"], "sampling": {"top_p": 0}}, "sampling"),
        (TrainSpec, {"model": "m", "dataset": "d", "steps": 0, "checkpoint_dir": "c"}, "steps"),
        (TrainSpec, {"model": "m\n", "dataset": "d", "steps": 1, "checkpoint_dir": "c"}, "model"),
        (
            TrainSpec,
            {"model": "m", "dataset": "a.jsonl:-1", "steps": 1, "checkpoint_dir": "c"},
            "dataset",
        ),
        (RolloutSpec, {"instance_ids": ["gym/a/b"]}, "instance_ids"),
        (EvalSpec, {"checkpoint": "c", "dataset": "d", "max_instances": 0}, "max_instances"),
    ],
)
def test_bad_specs_name_the_field(model: type, body: dict, field: str) -> None:
    with pytest.raises(ValidationError) as err:
        model.model_validate(body)
    assert err.value.errors()[0]["loc"][0] == field


def test_terminal_states() -> None:
    assert {s for s in JobState if s.terminal} == {"succeeded", "failed", "cancelled"}


def test_a_mixture_dataset_is_checked_at_submission() -> None:
    """Its syntax here (the files are read on the trainer's host), and mixture keys are
    instance ids a rollout job may name."""
    spec = TrainSpec(model="m", dataset="gym=/x/a.jsonl:0.7,smith=/x/b.parquet:0.3", steps=1,
                     checkpoint_dir="/c")  # fmt: skip
    assert spec.dataset.startswith("gym=")
    with pytest.raises(ValidationError, match="dataset name 'a' is used for both"):
        TrainSpec(model="m", dataset="a=/x/a.jsonl,a=/y/b.jsonl", steps=1, checkpoint_dir="/c")
    assert RolloutSpec(instance_ids=["gym/swerl__strkit-2"]).instance_ids == ["gym/swerl__strkit-2"]
