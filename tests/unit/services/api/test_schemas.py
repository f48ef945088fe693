"""The job specs: defaults, bounds, and unknown fields refused by name."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from services.api.schemas import (
    ALGORITHM_NAMES,
    SPECS,
    EvalSpec,
    JobKind,
    JobState,
    RolloutSpec,
    TrainSpec,
    TrajectoryCounts,
)


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


def test_the_apis_algorithm_names_are_the_trainers_registry() -> None:
    """The API cannot import the trainer (torch): its list must follow the registry."""
    from trainer.algorithms import ALGORITHM_REGISTRY  # baselines register on import

    assert sorted(ALGORITHM_NAMES) == sorted(ALGORITHM_REGISTRY.names())


def test_an_unknown_algorithm_is_refused_with_the_known_ones() -> None:
    body = {"model": "m", "dataset": "d", "steps": 1, "checkpoint_dir": "/c"}
    with pytest.raises(ValidationError) as err:
        TrainSpec.model_validate({**body, "algorithm": "li2sa0"})
    error = err.value.errors()[0]
    assert error["loc"] == ("algorithm",)
    assert "did you mean 'li2sao'" in error["msg"]
    assert all(name in error["msg"] for name in ALGORITHM_NAMES)
    for name in ALGORITHM_NAMES:
        assert TrainSpec.model_validate({**body, "algorithm": name}).algorithm == name


def test_trajectory_counts_come_from_a_rollout_runners_metrics() -> None:
    """Graded: every status with a reward (a 0 included); aborted: the infrastructure's."""
    metrics = {"n_completed": 3.0, "n_error": 1.0, "n_timeout": 1.0, "n_aborted": 2.0,
               "mean_reward": 0.4, "resolved_rate": 2 / 5}  # fmt: skip
    counts = TrajectoryCounts.from_metrics(metrics)
    assert counts == TrajectoryCounts(total=7, graded=5, resolved=2, aborted=2)
    assert TrajectoryCounts.from_metrics({}) is None  # no result yet
