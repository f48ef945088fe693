"""Path confinement: each way out of the roots (``..``, symlinks, sibling prefixes, relative,
empty and NUL paths, mixtures with one bad part) is refused naming the field and the roots;
paths inside are accepted. Real directories and symlinks under ``tmp_path``."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from services.api.config import PathRoots
from services.api.paths import Access, PathPolicy, PathRefused, path_fields, within
from services.api.schemas import EvalSpec, RolloutSpec, TrainSpec


@pytest.fixture
def roots(tmp_path: Path) -> tuple[Path, Path]:
    """(input root, output root), both existing directories."""
    data, out = tmp_path / "data", tmp_path / "out"
    (data / "sets").mkdir(parents=True)
    out.mkdir()
    return data, out


@pytest.fixture
def policy(roots: tuple[Path, Path]) -> PathPolicy:
    data, out = roots
    return PathPolicy.from_config(PathRoots(inputs=(str(data),), outputs=(str(out),)))


def train(data: Path, out: Path, **over: str) -> TrainSpec:
    spec = {"model": str(data / "model"), "dataset": str(data / "ids.txt"), "steps": 1,
            "checkpoint_dir": str(out / "ck"), **over}  # fmt: skip
    return TrainSpec.model_validate(spec)


def test_paths_inside_the_roots_are_accepted(policy: PathPolicy, roots: tuple[Path, Path]) -> None:
    data, out = roots
    policy.check_spec(train(data, out))
    assert policy.check(str(data), Access.INPUT, "f") == str(data)  # the root itself
    assert policy.check(f"{data}/sets/../x.jsonl", Access.INPUT, "f") == str(data / "x.jsonl")
    # An input may be read where outputs go (an eval of a checkpoint a train job wrote).
    assert policy.check(str(out / "ck" / "step-3"), Access.INPUT, "f") == str(out / "ck/step-3")


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("checkpoint_dir", "/etc/cron.d"),
        ("checkpoint_dir", "{data}/../../../../root/.ssh"),
        ("checkpoint_dir", "{data}/ck"),  # an input root is not writable
        ("dataset", "/etc/shadow"),
        ("dataset", "{data}/../data2/ids.txt"),
        ("model", "{data}2/model"),  # a sibling that shares the prefix: /x/data2 vs /x/data
        ("model", "../../root/.ssh"),  # relative
        ("dataset", "{data}/a.jsonl:0.5,/etc/passwd.jsonl:0.5"),  # one bad mixture part
        ("dataset", "{data}/a.jsonl,rel.jsonl"),  # a relative mixture part
    ],
)
def test_paths_out_of_the_roots_are_refused_naming_field_and_roots(
    policy: PathPolicy, roots: tuple[Path, Path], field: str, value: str
) -> None:
    data, out = roots
    spec = train(data, out, **{field: value.format(data=data)})
    with pytest.raises(PathRefused) as err:
        policy.check_spec(spec)
    assert err.value.field == f"body.{field}"
    allowed = str(out) if field == "checkpoint_dir" else str(data)
    assert allowed in err.value.message or "relative" in err.value.message


def test_a_symlink_inside_a_root_pointing_out_is_refused(
    policy: PathPolicy, roots: tuple[Path, Path], tmp_path: Path
) -> None:
    data, out = roots
    outside = tmp_path / "secret"
    outside.mkdir()
    (data / "link").symlink_to(outside)
    (out / "cron").symlink_to("/etc/cron.d")
    with pytest.raises(PathRefused, match="resolves to"):
        policy.check(str(data / "link" / "ids.txt"), Access.INPUT, "body.dataset")
    with pytest.raises(PathRefused, match=r"resolves to /etc/cron\.d"):
        policy.check(str(out / "cron"), Access.OUTPUT, "body.checkpoint_dir")
    # A symlink that stays inside is fine, and judged by its target.
    (data / "inner").symlink_to(data / "sets")
    assert policy.check(str(data / "inner"), Access.INPUT, "f") == str(data / "sets")


@pytest.mark.parametrize("value", ["", "a\x00b", "/x\x00/../etc"])
def test_empty_and_nul_paths_are_refused(policy: PathPolicy, value: str) -> None:
    with pytest.raises(PathRefused, match="not a usable path"):
        policy.check(value, Access.INPUT, "body.dataset")


def test_url_encoded_dots_are_plain_names(policy: PathPolicy, roots: tuple[Path, Path]) -> None:
    """Bodies are JSON, never URL-decoded: ``%2e%2e`` is a directory name inside the root,
    which is also what the trainer opens."""
    data, _ = roots
    value = f"{data}/%2e%2e/%2e%2e/etc/passwd"
    assert policy.check(value, Access.INPUT, "f") == value


def test_component_wise_not_string_prefix() -> None:
    assert within("/data/x", "/data") and within("/data", "/data")
    assert not within("/data2", "/data") and not within("/data2/x", "/data")
    assert not within("/", "/data")


def test_eval_paths_and_the_gold_word(policy: PathPolicy, roots: tuple[Path, Path]) -> None:
    data, out = roots
    ok = EvalSpec(predictions="gold", dataset=str(data / "d.jsonl"))
    policy.check_spec(ok)
    policy.check_spec(EvalSpec(checkpoint=str(out / "ck"), dataset=str(data / "d.jsonl")))
    for spec, field in [
        (EvalSpec(predictions="/etc/shadow", dataset=str(data / "d.jsonl")), "body.predictions"),
        (EvalSpec(checkpoint="/root", dataset=str(data / "d.jsonl")), "body.checkpoint"),
        (EvalSpec(predictions="gold", dataset="/etc/passwd"), "body.dataset"),
    ]:
        with pytest.raises(PathRefused) as err:
            policy.check_spec(spec)
        assert err.value.field == field


def test_path_fields_are_declared_in_the_schemas() -> None:
    """Every field the services read or write as a path is declared (and so confined); the
    rollout's ``model`` is a label the services never open."""
    declared = {(m.__name__, f.name, f.access) for m in (TrainSpec, EvalSpec, RolloutSpec)
                for f in path_fields(m)}  # fmt: skip
    assert declared == {
        ("TrainSpec", "model", Access.INPUT),
        ("TrainSpec", "dataset", Access.INPUT),
        ("TrainSpec", "checkpoint_dir", Access.OUTPUT),
        ("EvalSpec", "checkpoint", Access.INPUT),
        ("EvalSpec", "predictions", Access.INPUT),
        ("EvalSpec", "dataset", Access.INPUT),
    }
    schema = TrainSpec.model_json_schema()["properties"]["checkpoint_dir"]
    assert schema["x-swerl-path"]["access"] == "output"


def test_roots_are_compared_resolved(tmp_path: Path) -> None:
    """A root reached through a symlink matches paths given through either name."""
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "alias").symlink_to(real)
    policy = PathPolicy.from_config(PathRoots(inputs=(str(tmp_path / "alias"),), outputs=()))
    assert policy.inputs == (os.path.realpath(real),)
    assert policy.check(str(real / "x"), Access.INPUT, "f") == str(real / "x")
    assert policy.check(str(tmp_path / "alias" / "x"), Access.INPUT, "f") == str(real / "x")
    with pytest.raises(PathRefused, match="none configured"):
        policy.check(str(real / "x"), Access.OUTPUT, "f")
