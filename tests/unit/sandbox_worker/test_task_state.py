"""SWE-smith task states on real git checkouts (the LocalDir double): a repository snapshot
becomes the task (bug applied, F2P tests hidden) the same way in every sandbox, from an
official instance branch, from the row's bug patch, or over an image with the bug built in;
and the evaluation grades such a row like SWE-smith's harness: the fix resolves it, an empty
patch or a patch that writes its own passing tests at the hidden paths does not."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from sandbox_worker.backends.base import SandboxSpec
from sandbox_worker.evaluation import EvalConfig, evaluate_patch
from sandbox_worker.evaluation.patches import files_of_test_ids, patched_files
from sandbox_worker.task_state import TASK_BRANCH, TASK_MESSAGE, TaskStateError, prepare_task
from sandbox_worker.testing.local_sandbox import ISOLATED_GIT_ENV, LocalDirBackend
from services.protocol.diff_reverse import reverse_unified_diff
from services.protocol.instance import SWEInstance
from tests.unit.sandbox_worker.evaluation.conftest import (  # noqa: F401 (fixtures)
    LOCAL_TEST_CMD,
    mini_instances,
    templates,
)

SOURCE = "swerl__strkit-1"  # a mini instance: its fixed repository is the snapshot


def git(repo: Path, *args: str) -> str:
    env = {**ISOLATED_GIT_ENV, "PATH": "/usr/bin:/bin"}
    res = subprocess.run(["git", *args], cwd=repo, env=env, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    return res.stdout.strip()


@pytest.fixture
def smith(
    templates: dict[str, Path],  # noqa: F811 (the imported fixture)
    mini_instances: dict[str, SWEInstance],  # noqa: F811
    tmp_path: Path,
) -> tuple[SWEInstance, dict[str, Path]]:
    """A SWE-smith row made from a mini instance, and its images: ``snapshot`` (the fixed
    repository with its tests, as SWE-smith images hold it), ``buggy`` (the mini base: the bug
    built in), ``other`` (another repository)."""
    source = mini_instances[SOURCE]
    snapshot = tmp_path / "snapshot"
    shutil.copytree(templates["strkit"], snapshot)
    git(snapshot, "checkout", "-q", source.base_commit or "HEAD")
    for diff in (source.patch, source.test_patch):
        (tmp_path / "p.diff").write_text(diff)
        git(snapshot, "apply", str(tmp_path / "p.diff"))
    git(snapshot, "add", "-A")
    git(snapshot, "commit", "-q", "-m", "snapshot")
    commit8 = git(snapshot, "rev-parse", "HEAD")[:8]
    row = SWEInstance(
        instance_id=f"swerl__strkit.{commit8}.func_pm_remove_cond__ab12",
        repo=f"swesmith/swerl__strkit.{commit8}",
        patch=reverse_unified_diff(source.patch),  # SWE-smith's patch introduces the bug
        problem_statement=source.problem_statement,
        FAIL_TO_PASS=source.FAIL_TO_PASS,
        PASS_TO_PASS=source.PASS_TO_PASS,
    )
    images = {"snapshot": snapshot, "buggy": templates["strkit"], "other": templates["tinyini"]}
    return row, images


def sandbox(backend: LocalDirBackend, image: str, tmp_path: Path, name: str):
    spec = SandboxSpec(image=image, node="n", sandbox_id=name, workdir=str(tmp_path / name))
    return backend.create(spec)


def assert_history_hidden(work: Path, snapshot: Path, pruned: bool) -> None:
    """One commit, one branch, no remote, no reflog: the snapshot before the bug ("Bug
    Patch" reverted is the fix) and the hidden tests are nowhere in the history, and with
    ``pruned`` not even among the objects (the original source file's blob is gone)."""
    assert git(work, "log", "--all", "--format=%s").splitlines() == [TASK_MESSAGE]
    assert git(work, "for-each-ref", "--format=%(refname)") == f"refs/heads/{TASK_BRANCH}"
    assert git(work, "remote") == "" and git(work, "reflog", "--all") == ""
    clean = git(snapshot, "rev-parse", "HEAD:" + "strkit/text.py")  # the fixed source's blob
    objects = git(work, "cat-file", "--batch-all-objects", "--batch-check=%(objectname)")
    assert (clean in objects.split()) != pruned


def test_the_task_state_from_the_bug_patch_is_the_same_in_every_sandbox(
    smith: tuple[SWEInstance, dict[str, Path]], tmp_path: Path
) -> None:
    row, images = smith
    assert row.is_swesmith and row.gold_patch != row.patch
    backend = LocalDirBackend(images, tmp_path / "scratch")
    hidden = files_of_test_ids(row.FAIL_TO_PASS)
    bases = []
    for name in ("agent", "eval"):
        with sandbox(backend, "snapshot", tmp_path, name) as box:
            prune = name == "agent"  # the evaluation's sandbox keeps unreachable objects
            task = prepare_task(
                box, row, str(tmp_path / name), scratch_dir=str(tmp_path), prune=prune
            )
            work = tmp_path / name
            assert git(work, "rev-parse", "HEAD") == task.base_commit
            assert_history_hidden(work, snapshot=images["snapshot"], pruned=prune)
            assert all(not (work / f).exists() for f in hidden)  # the agent cannot read them
            assert git(work, "status", "--porcelain") == ""
            # the bug is in: the source is the mini base's (buggy) version again
            source = patched_files(row.gold_patch)[0].target
            assert "return text[:width] + suffix" in (work / source).read_text()
            # the test patch brings back exactly the hidden files
            assert sorted(p.target for p in patched_files(task.test_patch)) == sorted(hidden)
            bases.append(task.base_commit)
    assert bases[0] == bases[1]  # fixed identity and dates: the same commits


def test_an_official_branch_a_built_in_bug_and_a_wrong_image(
    smith: tuple[SWEInstance, dict[str, Path]], tmp_path: Path
) -> None:
    row, images = smith
    built = LocalDirBackend(images, tmp_path / "scratch")
    branched = tmp_path / "branched"  # the image as SWE-smith publishes it: with the branch
    shutil.copytree(images["snapshot"], branched)
    with sandbox(built, "snapshot", tmp_path, "first") as box:
        made = prepare_task(box, row, str(tmp_path / "first"), scratch_dir=str(tmp_path))
    # SWE-smith's branch: "Bug Patch" and "Remove F2P Tests" on the snapshot
    git(branched, "checkout", "-q", "-b", row.instance_id)
    (tmp_path / "bug.diff").write_text(row.patch)
    git(branched, "apply", str(tmp_path / "bug.diff"))
    git(branched, "commit", "-q", "-am", "Bug Patch")
    git(branched, "rm", "-q", "--", *files_of_test_ids(row.FAIL_TO_PASS))
    git(branched, "commit", "-q", "-m", "Remove F2P Tests")
    git(branched, "checkout", "-q", "-")
    backend = LocalDirBackend({**images, "branched": branched}, tmp_path / "scratch")
    with sandbox(backend, "branched", tmp_path, "official") as box:
        task = prepare_task(box, row, str(tmp_path / "official"), scratch_dir=str(tmp_path))
        assert_history_hidden(tmp_path / "official", images["snapshot"], pruned=True)
    assert task.base_commit == made.base_commit and task.test_patch == made.test_patch
    # an image with the bug already in it: only the tests are hidden
    with sandbox(backend, "buggy", tmp_path, "buggy") as box:
        task = prepare_task(box, row, str(tmp_path / "buggy"), scratch_dir=str(tmp_path))
        work = tmp_path / "buggy"
        assert git(work, "log", "--all", "--format=%s") == TASK_MESSAGE
        assert all(not (work / f).exists() for f in files_of_test_ids(row.FAIL_TO_PASS))
    # another repository: neither applies nor is applied
    refused = pytest.raises(TaskStateError, match="neither applies to the image nor is applied")
    with sandbox(backend, "other", tmp_path, "other") as box, refused:
        prepare_task(box, row, str(tmp_path / "other"), scratch_dir=str(tmp_path))
    # a SWE-bench row is its image's state: nothing runs
    plain = row.model_copy(update={"repo": "swerl/strkit"})
    assert prepare_task(None, plain, "/nowhere") is plain  # type: ignore[arg-type]


@pytest.mark.slow  # runs the instance's tests four times
def test_the_evaluation_grades_a_swesmith_row_like_its_harness(
    smith: tuple[SWEInstance, dict[str, Path]], tmp_path: Path
) -> None:
    row, images = smith
    backend = LocalDirBackend(images, tmp_path / "scratch")
    config = EvalConfig(
        workdir=str(tmp_path / "testbed"),
        scratch_dir=str(tmp_path / "scratch"),
        test_cmd=LOCAL_TEST_CMD.replace("-rA", "-rA --verbose"),
        test_timeout_s=120,
    )

    def grade(patch: str):
        return evaluate_patch(backend, row, patch, "snapshot", node="n", config=config)

    gold = grade(row.gold_patch)
    assert gold.infra_error is None, gold.log_tail
    assert gold.resolved and gold.reward == 1.0, gold.log_tail
    empty = grade("")
    assert empty.infra_error is None and not empty.resolved and empty.reward == 0.0
    # the policy writes the hidden test file itself, every graded test of it passing: it is
    # removed and the real one restored before the tests run
    (hidden,) = files_of_test_ids(row.FAIL_TO_PASS)[:1]
    names = sorted(
        {t.split("::")[-1].split("[")[0] for t in row.FAIL_TO_PASS + row.PASS_TO_PASS
         if t.startswith(hidden + "::")}
    )  # fmt: skip
    body = [line for name in names for line in (f"+def {name}():", "+    pass")]
    fake = (
        f"diff --git a/{hidden} b/{hidden}\nnew file mode 100644\n--- /dev/null\n"
        f"+++ b/{hidden}\n@@ -0,0 +1,{len(body)} @@\n" + "\n".join(body) + "\n"
    )
    assert names
    hack = grade(fake)
    assert hack.infra_error is None and not hack.resolved and hack.reward == 0.0, hack.log_tail
    # the wrong image is an infrastructure failure naming the instance, not a reward of 0
    wrong = evaluate_patch(backend, row, row.gold_patch, "other", node="n", config=config)
    assert wrong.reward is None and "wrong image" in (wrong.infra_error or "")
    # ... a deterministic one (the same image on every attempt) naming the key to fix
    assert wrong.config_error and "worker.rollout.image_dataset" in (wrong.infra_error or "")


def test_unittest_ids_hide_the_files_of_the_repositorys_profile(tmp_path: Path) -> None:
    """python-slugify's SWE-smith ids are unittest descriptions (no ``::``): its profile's
    rule names its tests' file (``test.py``), which the task hides and the test patch brings
    back; by pytest ids alone nothing would be hidden, and the agent could read -- and edit
    for reward -- the tests it is graded by."""
    snapshot = tmp_path / "slugify"
    snapshot.mkdir()
    git(snapshot, "init", "-q")
    (snapshot / "slugify.py").write_text("def slugify(text):\n    return text.lower()\n")
    (snapshot / "test.py").write_text(
        "import unittest\nfrom slugify import slugify\n\n\nclass T(unittest.TestCase):\n"
        "    def test_lower(self):\n        self.assertEqual(slugify('A'), 'a')\n"
    )
    git(snapshot, "add", "-A")
    git(snapshot, "commit", "-q", "-m", "snapshot")
    bug = (
        "diff --git a/slugify.py b/slugify.py\n--- a/slugify.py\n+++ b/slugify.py\n"
        "@@ -1,2 +1,2 @@\n def slugify(text):\n-    return text.lower()\n+    return text\n"
    )
    row = SWEInstance(
        instance_id="un33k__python-slugify.872b3750.func_pm_op_change__x1",
        repo="swesmith/un33k__python-slugify.872b3750",
        patch=bug,
        problem_statement="slugify keeps capitals",
        FAIL_TO_PASS=["test_lower (__main__.T.test_lower)"],
        PASS_TO_PASS=[],
    )
    assert files_of_test_ids(row.FAIL_TO_PASS) == []  # what pytest ids would hide
    backend = LocalDirBackend({"snapshot": snapshot}, tmp_path / "scratch")
    with sandbox(backend, "snapshot", tmp_path, "agent") as box:
        task = prepare_task(box, row, str(tmp_path / "agent"), scratch_dir=str(tmp_path))
        work = tmp_path / "agent"
        assert not (work / "test.py").exists() and (work / "slugify.py").exists()
        assert "return text\n" in (work / "slugify.py").read_text()
        assert [p.target for p in patched_files(task.test_patch)] == ["test.py"]
        assert git(work, "log", "--all", "--format=%s") == TASK_MESSAGE
