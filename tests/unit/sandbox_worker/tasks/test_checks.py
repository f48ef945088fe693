"""The adversarial patches: the tamper hunk really breaks a protected file, the broken patch
really cannot be applied by any of the harness's commands."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sandbox_worker.evaluation.constants import GIT_APPLY_CMDS
from sandbox_worker.evaluation.patches import modified_files, new_files, patched_files
from sandbox_worker.tasks import checks
from sandbox_worker.tasks.repos import available_repos, materialize_repo
from services.datasets import load_instances
from services.protocol.instance import SWEInstance
from tests.support.paths import TEST_DATA

INSTANCES = load_instances(TEST_DATA / "instances.jsonl")
ENV = {
    "PATH": os.environ["PATH"],
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": os.devnull,
    "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
    "PYTHONDONTWRITEBYTECODE": "1",
}


@pytest.fixture(scope="module")
def templates(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tpl")
    for name in available_repos():
        materialize_repo(name, root / name)
    return {name: root / name for name in available_repos()}


def checkout(templates: dict[str, Path], inst: SWEInstance, dest: Path) -> Path:
    shutil.copytree(templates[inst.repo.rsplit("/", 1)[-1]], dest, symlinks=True)
    return dest


def run(cwd: Path, *cmd: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=cwd, input=stdin, env=ENV, capture_output=True, text=True)


@pytest.mark.parametrize("inst", INSTANCES, ids=lambda i: i.instance_id)
@pytest.mark.slow  # runs each instance's test suite
def test_tamper_breaks_a_protected_file(
    inst: SWEInstance, templates: dict[str, Path], tmp_path: Path
) -> None:
    hunk = checks.tamper_hunk(inst.test_patch)
    (target,) = [f.target for f in patched_files(hunk)]
    assert target in modified_files(inst.test_patch) + new_files(inst.test_patch)
    repo = checkout(templates, inst, tmp_path / "repo")
    assert run(repo, "git", "apply", "-", stdin=checks.tampered_patch(inst)).returncode == 0
    # If it were not restored, the test patch could not be applied over it...
    assert run(repo, "git", "apply", "--check", "-", stdin=inst.test_patch).returncode != 0
    # ...and the tampered module itself no longer loads.
    load = f"import runpy, sys; sys.path.insert(0, '.'); runpy.run_path({target!r})"
    res = run(repo, sys.executable, "-c", load)
    assert res.returncode != 0
    assert "tampered with" in res.stderr or "IndentationError" in res.stderr, res.stderr


@pytest.mark.parametrize("inst", INSTANCES, ids=lambda i: i.instance_id)
def test_broken_patch_defeats_every_apply_command(
    inst: SWEInstance, templates: dict[str, Path], tmp_path: Path
) -> None:
    broken = checks.broken_patch(inst)
    assert broken.count("swerl-missing/") >= 3
    (tmp_path / "p.diff").write_text(broken)
    repo = checkout(templates, inst, tmp_path / "repo")
    for command in GIT_APPLY_CMDS:
        res = run(repo, *command.split(), str(tmp_path / "p.diff"))
        assert res.returncode != 0, f"{command} applied the broken patch"
        assert run(repo, "git", "status", "--porcelain").stdout == ""


def test_patches_without_material_are_refused() -> None:
    inst = INSTANCES[0]
    creation_only = (
        "diff --git a/new.py b/new.py\nnew file mode 100644\n--- /dev/null\n+++ b/new.py\n"
        "@@ -0,0 +1 @@\n+x = 1\n"
    )
    with pytest.raises(checks.CheckPatchError, match="modifies no existing file"):
        checks.broken_patch(inst.model_copy(update={"patch": creation_only}))
    deletion_only = (
        "diff --git a/t.py b/t.py\ndeleted file mode 100644\n--- a/t.py\n+++ /dev/null\n"
    )
    with pytest.raises(checks.CheckPatchError, match="no file to tamper with"):
        checks.tamper_hunk(deletion_only)


def test_tamper_prefers_a_modified_file_over_a_new_one() -> None:
    both = (
        "diff --git a/tests/new.py b/tests/new.py\nnew file mode 100644\n--- /dev/null\n"
        "+++ b/tests/new.py\n@@ -0,0 +1 @@\n+x = 1\n"
        "diff --git a/tests/old.py b/tests/old.py\n--- a/tests/old.py\n+++ b/tests/old.py\n"
        "@@ -5,3 +5,4 @@\n a\n b\n+c\n d\n"
    )
    hunk = checks.tamper_hunk(both)
    assert hunk.startswith("diff --git a/tests/old.py b/tests/old.py\n")
    assert "@@ -5,3 +5,4 @@\n a\n+raise RuntimeError(" in hunk
    assert hunk.endswith('tampered with")\n b\n d\n')
