"""The in-sandbox scripts, run with the host's bash in throwaway git repositories."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import time
from pathlib import Path

import pytest

from sandbox_worker.evaluation import grading
from sandbox_worker.evaluation.infra import TreeState
from sandbox_worker.evaluation.patches import directives_of_test_patch, modified_files, new_files
from sandbox_worker.evaluation.script import (
    EvalScriptSpec,
    PreludeSpec,
    capture_tree_script,
    eval_script,
    git_state_script,
    prelude_script,
    reset_script,
    restore_script,
    safe_pytest_command,
)
from sandbox_worker.evaluation.specs import spec_for
from sandbox_worker.testing.local_sandbox import ISOLATED_GIT_ENV
from services.protocol.instance import SWEInstance

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


def test_prelude_restores_protected_files_and_quotes_everything(repo: Path, tmp_path: Path) -> None:
    base = git(repo, "rev-parse", "HEAD")
    (repo / TRICKY).write_text("tampered\n")
    (repo / "tests" / "created.py").write_text("planted\n")
    spec = PreludeSpec(str(repo), base, None, [TRICKY], ["tests/created.py"])
    res = sh(repo, prelude_script(spec))
    assert res.returncode == 0, res.stdout + res.stderr
    assert not (repo / "pwned").exists() and not (tmp_path / "pwned").exists()
    assert (repo / TRICKY).read_text() == "original\n"
    assert not (repo / "tests" / "created.py").exists()


def test_prelude_runs_nothing_the_repository_configures(repo: Path, tmp_path: Path) -> None:
    """A .git/config that names commands (fsmonitor, hooks, external diff, textconv) runs
    none of them under the harness's git isolation."""
    base = git(repo, "rev-parse", "HEAD")
    marker = tmp_path / "ran"
    hook = f"touch {marker}"
    with (repo / ".git" / "config").open("a") as fh:
        fh.write(f'[core]\n\tfsmonitor = "{hook}; echo"\n\thooksPath = hooks\n')
        fh.write(f'[diff]\n\texternal = "{hook}"\n[diff "x"]\n\ttextconv = "{hook}; cat"\n')
    (repo / "hooks").mkdir()
    (repo / "hooks" / "post-checkout").write_text(f"#!/bin/sh\n{hook}\n")
    (repo / "hooks" / "post-checkout").chmod(0o755)
    (repo / ".gitattributes").write_text("*.py diff=x\n")
    (repo / "a.py").write_text("x = 2\n")
    spec = PreludeSpec(str(repo), base, None, ["a.py"], [])
    # Without the isolation the same commands do run (the attack is real).
    unsafe = prelude_script(spec).split("\n", 1)[1]
    sh(repo, unsafe)
    assert marker.exists()
    marker.unlink()
    (repo / "a.py").write_text("x = 2\n")
    res = sh(repo, prelude_script(spec))
    assert res.returncode == 0, res.stdout + res.stderr
    assert not marker.exists(), res.stdout
    assert (repo / "a.py").read_text() == "x = 1\n"


def test_git_state_sees_config_hooks_and_a_replaced_git_dir(repo: Path, tmp_path: Path) -> None:
    def state() -> str:
        res = sh(repo, git_state_script(str(repo)))
        assert res.returncode == 0, res.stderr
        return res.stdout

    before = state()
    (repo / "a.py").write_text("changed\n")  # the working tree is not .git's state
    git(repo, "add", "a.py")  # nor is the index
    assert state() == before
    with (repo / ".git" / "config").open("a") as fh:
        fh.write("[core]\n\tfsmonitor = true\n")
    assert state() != before
    git(repo, "config", "--unset", "core.fsmonitor")
    (repo / ".git" / "hooks" / "post-checkout").write_text("#!/bin/sh\n")
    assert state() != before


def test_eval_script_runs_the_tests_only(repo: Path, tmp_path: Path) -> None:
    out = tmp_path / "run" / "out"
    hidden = tmp_path / "run" / "git"
    spec = EvalScriptSpec(
        workdir=str(repo),
        test_command=(
            f"cat {repo / 'tests'}/*.py; git status >/dev/null 2>&1 && echo GIT-VISIBLE;"
            " echo 'PASSED t.py::a'; exit 1"
        ),
        test_timeout_s=30,
        output_path=str(out),
        hidden_git=str(hidden),
    )
    script = eval_script(spec)
    # No git command of the harness's own: the prelude ran them before the tree was inspected.
    harness_part = script.replace(shlex.quote(spec.test_command), "")
    assert not re.search(r"(?:^|[\s;&|(])git\s", harness_part), harness_part
    res = sh(repo, script)
    tests_part = res.stdout.split("Start Test Output")[1]
    printed = tests_part.splitlines()
    assert "original" in printed and "GIT-VISIBLE" not in printed
    assert (repo / ".git").is_dir() and not hidden.exists()  # .git is back after the run
    status_map, valid = grading.get_logs_eval(res.stdout)
    # The command exited 1 while reporting no failure: the log is not trusted.
    assert grading.parse_test_exit_code(res.stdout) == 1 and not valid and status_map == {}


def test_a_process_left_behind_does_not_hold_the_run_open(repo: Path, tmp_path: Path) -> None:
    """Tests that leave a detached process holding their output cannot keep the eval script
    from ending (the run would end as an exec timeout, an excluded infrastructure abort)."""
    spec = EvalScriptSpec(
        workdir=str(repo),
        test_command="setsid sleep 30 & echo 'PASSED t.py::a'; exit 0",
        test_timeout_s=20,
        output_path=str(tmp_path / "out"),
    )
    started = time.monotonic()
    res = sh(repo, eval_script(spec))
    elapsed = time.monotonic() - started
    assert grading.parse_test_exit_code(res.stdout) == 0
    assert elapsed < 20, elapsed


@pytest.mark.slow  # waits for a test timeout
def test_eval_script_times_out_the_tests(repo: Path, tmp_path: Path) -> None:
    spec = EvalScriptSpec(
        workdir=str(repo),
        test_command="sleep 30",
        test_timeout_s=1,
        output_path=str(tmp_path / "out"),
    )
    res = sh(repo, eval_script(spec))
    assert ">>>>> Tests Timed Out" in res.stdout
    assert grading.parse_test_exit_code(res.stdout) == 124
    assert grading.get_logs_eval(res.stdout) == ({}, False)


def test_safe_pytest_command_forms() -> None:
    launcher = "/tmp/w/safe_pytest.py"
    cmd = safe_pytest_command("python3 -m pytest -rA -p no:cacheprovider a.py", launcher, "/t")
    expected = "SWERL_REPO=/t SWERL_CWD_ON_PATH=1 python3 /tmp/w/safe_pytest.py"
    assert cmd == f"{expected} -rA -p no:cacheprovider a.py"
    cmd = safe_pytest_command("pytest --no-header -rA", launcher, "/t")
    assert cmd is not None and "SWERL_CWD_ON_PATH=0" in cmd and cmd.endswith(" --no-header -rA")
    assert "command -v pytest" in cmd
    assert safe_pytest_command("./tests/runtests.py --verbosity 2", launcher, "/t") is None
    assert safe_pytest_command("python3 -m pytester x", launcher, "/t") is None


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
        test_command="python3 -m pytest -rA",
        test_timeout_s=5,
        output_path="/tmp/swerl-run/out",
        report_dir="/tmp/swerl-0123",
        report_plugin="swerl_report_ab12",
    )
    script = eval_script(spec)
    exports = 'export PYTEST_ADDOPTS="-p swerl_report_ab12 ${PYTEST_ADDOPTS:-} --maxfail=0"'
    assert exports in script and 'export PYTHONPATH=/tmp/swerl-0123"${PYTHONPATH:+' in script
    assert script.index(exports) < script.index(">>>>> Start Test Output")
    assert 'echo "$SWEBENCH_TEST_EXIT_CODE" > /tmp/swerl-0123/exit_code' in script
    plain = eval_script(EvalScriptSpec(**{**spec.__dict__, "report_dir": None}))
    assert "PYTEST_ADDOPTS" not in plain and "exit_code" not in plain


def test_the_hardened_scripts_build_for_every_verified_fixture_row(tmp_path: Path) -> None:
    """The 14 published SWE-bench Verified fixture rows: their test patches parse, and swerl's
    hardened prelude and eval script (launcher included where the spec's runner is pytest) are
    valid bash. Resolution itself needs the rows' images, which come from a registry."""
    rows_file = Path(__file__).parents[3] / "data" / "swebench_verified" / "rows.jsonl"
    rows = [SWEInstance(**json.loads(line)) for line in rows_file.read_text().splitlines() if line]
    assert len(rows) >= 10
    launched = 0
    for row in rows:
        spec = spec_for(row.repo, row.version)
        files = [shlex.quote(f) for f in directives_of_test_patch(row.test_patch)]
        command = " ".join([spec.test_cmd, *files])
        safe = safe_pytest_command(command, "/tmp/w/safe_pytest.py", "/testbed")
        launched += safe is not None
        prelude = prelude_script(
            PreludeSpec(
                "/testbed",
                row.base_ref,
                "/tmp/swerl-test.diff",
                modified_files(row.test_patch),
                new_files(row.test_patch),
            )
        )
        script = eval_script(
            EvalScriptSpec(
                workdir="/testbed",
                test_command=safe or command,
                test_timeout_s=1800,
                output_path="/tmp/run/out",
                report_dir="/tmp/w",
                report_plugin="swerl_report_x",
                hidden_git="/tmp/run/git",
            )
        )
        for text in (prelude, script):
            check = subprocess.run(["bash", "-n"], input=text, capture_output=True, text=True)
            assert check.returncode == 0, (row.instance_id, check.stderr)
    # every row whose runner is pytest (not django's runtests.py, sympy's bin/test, sphinx's tox)
    pytest_rows = [r for r in rows if spec_for(r.repo, r.version).test_cmd.startswith("pytest")]
    assert launched == len(pytest_rows) >= 9
