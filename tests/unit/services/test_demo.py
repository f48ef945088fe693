"""``python -m services.demo --model``: which policy directory the engines serve."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.demo import main, resolve_model


def _model(directory: Path) -> Path:
    directory.mkdir(parents=True)
    (directory / "config.json").write_text("{}")
    return directory


def test_an_hf_model_directory_is_served_as_it_is(tmp_path: Path) -> None:
    model = _model(tmp_path / "m")
    assert resolve_model(model) == model


def test_a_weights_directory_serves_its_newest_published_version(tmp_path: Path) -> None:
    weights = tmp_path / "weights"
    for name in ("v9", "v10", "v2"):
        _model(weights / name)
    (weights / "v11").mkdir()  # an export still being written: no config.json
    (weights / "vx").mkdir()
    assert resolve_model(weights) == weights / "v10"  # numeric order, not lexical


@pytest.mark.parametrize("make", ["missing", "empty"])
def test_a_directory_without_a_model_is_refused(tmp_path: Path, make: str) -> None:
    path = tmp_path / "nothing"
    if make == "empty":
        path.mkdir()
    with pytest.raises(ValueError, match="nothing"):
        resolve_model(path)


def test_the_cli_refuses_a_bad_model_with_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["--model", str(tmp_path / "absent"), "--run-dir", str(tmp_path / "run")])
    assert code == 2
    assert "--model" in capsys.readouterr().err
