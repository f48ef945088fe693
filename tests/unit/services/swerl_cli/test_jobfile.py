"""Job files: ``kind:`` and ``spec:``, anything else a usage error with the file's name."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.swerl_cli.errors import EXIT_USAGE, CliError
from services.swerl_cli.jobfile import load_job_file


def test_a_job_file(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text("kind: rollout\nspec:\n  instance_ids: [a, b]\n  n_samples: 4\n")
    assert load_job_file(str(path)) == ("rollout", {"instance_ids": ["a", "b"], "n_samples": 4})


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("kind: nope\nspec: {}\n", "kind must be one of"),
        ("kind: eval\nspecs: {}\n", "unknown keys"),
        ("- a\n", "must hold a mapping"),
        ("kind: eval\nspec: [1]\n", "spec must be a mapping"),
        ("kind: [\n", "not valid YAML"),
    ],
)
def test_bad_job_files(tmp_path: Path, text: str, problem: str) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(text)
    with pytest.raises(CliError, match=problem) as err:
        load_job_file(str(path))
    assert err.value.code == EXIT_USAGE


def test_a_missing_file(tmp_path: Path) -> None:
    with pytest.raises(CliError, match="cannot read job file"):
        load_job_file(str(tmp_path / "absent.yaml"))
