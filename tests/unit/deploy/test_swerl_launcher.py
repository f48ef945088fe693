"""``.venv/bin/swerl`` (deploy/dev/swerl.sh, installed by ``deploy/dev/setup.sh launcher``): the
CLI of the checkout it is called in, else of $SWERL_HOME, else of the checkout set up last."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.support.paths import REPO_ROOT

LAUNCHER = REPO_ROOT / ".venv" / "bin" / "swerl"


@pytest.fixture(scope="module")
def launcher() -> Path:
    subprocess.run(["deploy/dev/setup.sh", "launcher"], cwd=REPO_ROOT, check=True, timeout=60)
    assert os.access(LAUNCHER, os.X_OK)
    return LAUNCHER


def fake_checkout(root: Path, marker: str) -> Path:
    """A directory that looks like a swerl checkout whose CLI prints ``marker`` and its args."""
    cli = root / "services" / "swerl_cli"
    cli.mkdir(parents=True)
    (root / "services" / "__init__.py").write_text("")
    (cli / "__init__.py").write_text("")
    (cli / "main.py").write_text("")
    (cli / "__main__.py").write_text(f"import sys\nprint({marker!r}, sys.argv[1:])\n")
    return root


def run(launcher: Path, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k not in ("SWERL_HOME", "PYTHONPATH")}
    return subprocess.run(
        [str(launcher), "status", "--json"],
        cwd=cwd,
        env={**environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_outside_any_checkout_it_runs_the_checkout_set_up_last(launcher, tmp_path):
    out = subprocess.run(
        [str(launcher), "--help"],
        cwd=tmp_path,
        env={k: v for k, v in os.environ.items() if k != "SWERL_HOME"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("usage: swerl")
    assert "submit" in out.stdout


def test_the_checkout_you_are_in_wins_over_swerl_home(launcher, tmp_path):
    inside = fake_checkout(tmp_path / "mine", "MINE")
    other = fake_checkout(tmp_path / "other", "OTHER")
    (inside / "docs").mkdir()
    out = run(launcher, inside / "docs", SWERL_HOME=str(other))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "MINE ['status', '--json']"


def test_swerl_home_names_the_checkout_outside_one(launcher, tmp_path):
    other = fake_checkout(tmp_path / "other", "OTHER")
    (tmp_path / "elsewhere").mkdir()
    out = run(launcher, tmp_path / "elsewhere", SWERL_HOME=str(other))
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("OTHER")


def test_a_swerl_home_that_is_no_checkout_is_a_usage_error(launcher, tmp_path):
    out = run(launcher, tmp_path, SWERL_HOME=str(tmp_path / "missing"))
    assert out.returncode == 2
    assert "is not a swerl checkout" in out.stderr and "SWERL_HOME" in out.stderr
    assert "Traceback" not in out.stderr
