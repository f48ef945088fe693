"""The in-sandbox scripts, run with the host's bash in throwaway git repositories."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from sandbox_worker.evaluation import grading
from sandbox_worker.evaluation.infra import TreeState
from sandbox_worker.evaluation.script import (
    EvalScriptSpec,
    capture_tree_script,
    eval_script,
    reset_script,
    restore_script,
)
from sandbox_worker.testing.local_sandbox import ISOLATED_GIT_ENV

GIT_ENV = {
    "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
    "HOME": "/nonexistent",
    **ISOLATED_GIT_ENV,
}
TRICKY = "tests/we'ird $(touch pwned) name.py"


def sh(cwd: Path, script: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-c", script], cwd=cwd, env=GIT_ENV, capture_output=True, text=True
    )


def git(cwd: Path, *args: str) -> str:
    res = subprocess.run(["git", *args], cwd=cwd, env=GIT_ENV, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    return res.stdout.strip()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    (root / "tests").mkdir(parents=True)
    (root / TRICKY).write_text("original\n")
    (root / "a.py").write_text("x = 1\n")
    git(root, "init", "-q", "-b", "main")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "base")
    return root


def test_eval_script_restores_protected_files_and_quotes_everything(
    repo: Path, tmp_path: Path
) -> None:
    base = git(repo, "rev-parse", "HEAD")
    (repo / TRICKY).write_text("tampered\n")
    (repo / "tests" / "created.py").write_text("planted\n")
    spec = EvalScriptSpec(
        workdir=str(repo),
        base_ref=base,
        test_patch_path=None,
        modified_files=[TRICKY],
        new_files=["tests/created.py"],
        test_command=f"cat {repo / 'tests'}/*.py; echo 'PASSED t.py::a'; exit 1",
        test_timeout_s=30,
    )
    res = sh(repo, eval_script(spec))
    assert not (repo / "pwned").exists() and not (tmp_path / "pwned").exists()
    assert "original" in res.stdout and "tampered" not in res.stdout.split("Start Test")[1]
    assert "planted" not in res.stdout.split("Start Test")[1]
    assert (repo / TRICKY).read_text() == "original\n"  # reverted again after the run
    status_map, valid = grading.get_logs_eval(res.stdout)
    # The command exited 1 while reporting no failure: the log is not trusted.
    assert grading.parse_test_exit_code(res.stdout) == 1 and not valid and status_map == {}


@pytest.mark.slow  # waits for a test timeout
def test_eval_script_times_out_the_tests(repo: Path) -> None:
    spec = EvalScriptSpec(
        workdir=str(repo),
        base_ref="HEAD",
        test_patch_path=None,
        modified_files=[],
        new_files=[],
        test_command="sleep 30",
        test_timeout_s=1,
    )
    res = sh(repo, eval_script(spec))
    assert ">>>>> Tests Timed Out" in res.stdout
    assert grading.parse_test_exit_code(res.stdout) == 124
    assert grading.get_logs_eval(res.stdout) == ({}, False)


def test_reset_keeps_a_setup_commit_on_top_of_the_base(repo: Path) -> None:
    base = git(repo, "rev-parse", "HEAD")
    (repo / "a.py").write_text("x = 2\n")
    git(repo, "commit", "-q", "-am", "environment setup")
    setup = git(repo, "rev-parse", "HEAD")
    (repo / "a.py").write_text("dirty\n")
    (repo / "untracked.py").write_text("junk\n")
    res = sh(repo, reset_script(base))
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.strip().splitlines()[-1] == setup
    assert (repo / "a.py").read_text() == "x = 2\n" and not (repo / "untracked.py").exists()


def test_reset_checks_out_the_base_when_head_is_elsewhere(repo: Path) -> None:
    base = git(repo, "rev-parse", "HEAD")
    git(repo, "checkout", "-q", "--orphan", "other")
    git(repo, "rm", "-rfq", ".")
    (repo / "b.py").write_text("y\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "unrelated")
    res = sh(repo, reset_script(base))
    assert res.returncode == 0 and res.stdout.strip().splitlines()[-1] == base
    assert (repo / "a.py").exists() and not (repo / "b.py").exists()


def test_reset_fails_for_an_unknown_base(repo: Path) -> None:
    res = sh(repo, reset_script("f" * 40))
    assert res.returncode == 3 and "is not in the repository" in res.stdout
    res = sh(repo, reset_script("main; touch pwned"))
    assert res.returncode == 3 and not (repo / "pwned").exists()


def test_capture_and_restore_scripts_are_byte_exact(repo: Path, tmp_path: Path) -> None:
    """Tree listing and restore with a tricky tracked name and an untracked snapshot file."""
    work = tmp_path / "work dir"
    base = git(repo, "rev-parse", "HEAD")
    (repo / "x.egg-info").mkdir()
    (repo / "x.egg-info" / "entry_points.txt").write_text("[pytest11]\n")
    assert sh(repo, capture_tree_script(str(work), "before", tracked=True)).returncode == 0
    before = TreeState.parse((work / "before").read_bytes())
    assert before.entries == {TRICKY: "f", "a.py": "f", "x.egg-info/entry_points.txt": "f"}
    assert (work / "tracked").read_bytes().split(b"\0")[:-1] == [b"a.py", TRICKY.encode()]
    (work / "snaplist").write_bytes(b"x.egg-info/entry_points.txt\0")
    assert sh(repo, f"tar --null -T '{work}/snaplist' -cf '{work}/snap.tar'").returncode == 0
    # The "patch": tampers with both, adds a symlink and a file named like an option.
    (repo / TRICKY).write_text("tampered\n")
    (repo / "x.egg-info" / "entry_points.txt").write_text("[pytest11]\nevil = evil\n")
    (repo / "--force").write_text("planted\n")
    os.symlink("/etc", repo / "link")
    (work / "rm").write_bytes(b"".join(p + b"\0" for p in [TRICKY.encode(), b"--force", b"link"]))
    (work / "checkout").write_bytes(TRICKY.encode() + b"\0")
    (work / "extract").write_bytes(b"x.egg-info/entry_points.txt\0")
    res = sh(repo, restore_script(str(work), base))
    assert res.returncode == 0, res.stderr
    assert (repo / TRICKY).read_text() == "original\n"
    assert (repo / "x.egg-info" / "entry_points.txt").read_text() == "[pytest11]\n"
    assert not (repo / "--force").exists() and not (repo / "link").is_symlink()
    assert not (repo / "pwned").exists() and not (work.parent / "pwned").exists()


def test_eval_script_with_a_structured_report(tmp_path: Path) -> None:
    spec = EvalScriptSpec(
        workdir="/testbed",
        base_ref="abc",
        test_patch_path=None,
        modified_files=[],
        new_files=[],
        test_command="python3 -m pytest -rA",
        test_timeout_s=5,
        report_dir="/tmp/swerl-0123",
        report_plugin="swerl_report_ab12",
    )
    script = eval_script(spec)
    exports = 'export PYTEST_ADDOPTS="-p swerl_report_ab12 ${PYTEST_ADDOPTS:-}"'
    assert exports in script and 'export PYTHONPATH=/tmp/swerl-0123"${PYTHONPATH:+' in script
    assert script.index(exports) < script.index(">>>>> Start Test Output")
    assert 'echo "$SWEBENCH_TEST_EXIT_CODE" > /tmp/swerl-0123/exit_code' in script
    plain = eval_script(EvalScriptSpec(**{**spec.__dict__, "report_dir": None}))
    assert "PYTEST_ADDOPTS" not in plain and "exit_code" not in plain
