"""``python -m trainer train``: a user's mistake in the run's paths (the model directory, the
instance-id files) is one ``error:`` line naming the key and the fix, exit 2, before anything
starts and under ``--print-config`` too; never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from trainer.loop.cli import main

DATASET = {"instance_ids": ["a", "b"]}


def model_dir(tmp_path: Path) -> Path:
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text("{}")
    return model


def run_file(tmp_path: Path, model: str, dataset: dict | None = None, **train: object) -> Path:
    sections = {
        "train": {"run_dir": str(tmp_path / "run"), "steps": 2, "publish": False,
                  "dataset": dataset or DATASET, **train},
        "trainer": {"model": model},
        "manager": {"redis_url": "redis://127.0.0.1:1/0"},  # never reached: nothing starts
    }  # fmt: skip
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(sections))
    return path


def errors(capsys: pytest.CaptureFixture[str]) -> list[str]:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err.splitlines()


@pytest.mark.parametrize("print_config", [False, True])
@pytest.mark.parametrize("problem", ["missing", "a file", "no config.json", "unset"])
def test_a_model_that_is_not_a_model_directory_is_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], problem: str, print_config: bool
) -> None:
    model = {"missing": tmp_path / "nope", "a file": tmp_path / "weights.bin",
             "no config.json": tmp_path / "empty", "unset": None}[problem]  # fmt: skip
    if problem == "a file":
        model.write_text("x")  # type: ignore[union-attr]
    if problem == "no config.json":
        model.mkdir()  # type: ignore[union-attr]
    argv = ["--config", str(run_file(tmp_path, str(model or "")))]
    assert main(argv + (["--print-config"] if print_config else [])) == 2
    (line,) = errors(capsys)
    assert line.startswith("error: trainer.model ")
    assert str(model or "is not set") in line
    assert "set trainer.model (or $SWERL_TRAINER__MODEL)" in line


def test_missing_instance_files_are_named_by_their_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = str(model_dir(tmp_path))
    ids = {"instances_file": str(tmp_path / "ids.txt")}
    assert main(["--config", str(run_file(tmp_path, model, ids)), "--print-config"]) == 2
    (line,) = errors(capsys)
    assert line.startswith(f"error: train.dataset.instances_file {tmp_path / 'ids.txt'}: ")
    (tmp_path / "ids.txt").write_text("a\nb\n")
    held_out = {"instances_file": str(tmp_path / "held.txt")}
    path = run_file(tmp_path, model, ids, eval_interval=1, eval=held_out, publish=True)
    publish = {"adapter_url": "http://127.0.0.1:1", "admin_token": "t", "weights_dir": "/w"}
    path.write_text(yaml.safe_dump({**yaml.safe_load(path.read_text()), "publish": publish}))
    assert main(["--config", str(path), "--print-config"]) == 2
    (line,) = errors(capsys)
    assert line.startswith(f"error: train.eval.instances_file {tmp_path / 'held.txt'}: ")


def test_a_good_run_file_still_prints_its_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = model_dir(tmp_path)
    assert main(["--config", str(run_file(tmp_path, str(model))), "--print-config"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["trainer"]["model"] == str(model)
