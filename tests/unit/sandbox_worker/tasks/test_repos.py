"""The mini repositories materialise deterministically and match instances.jsonl."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from sandbox_worker.tasks import repos
from tests.support.paths import TEST_DATA

INSTANCES = TEST_DATA / "instances.jsonl"


def git(repo: Path, *args: str) -> str:
    env = {"PATH": os.environ["PATH"], "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull}
    return subprocess.run(
        ["git", *args], cwd=repo, env=env, capture_output=True, text=True, check=True
    ).stdout


@pytest.fixture(scope="module")
def materialized(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[str, Path]]:
    root = tmp_path_factory.mktemp("repos")
    return {
        name: (repos.materialize_repo(name, root / name), root / name)
        for name in repos.available_repos()
    }


def test_there_are_at_least_three_repositories() -> None:
    assert len(repos.available_repos()) >= 3


def test_same_hash_twice(materialized: dict[str, tuple[str, Path]], tmp_path: Path) -> None:
    for name, (commit, _) in materialized.items():
        assert repos.materialize_repo(name, tmp_path / name) == commit
        assert len(commit) == 40


def test_base_commits_match_instances_jsonl(materialized: dict[str, tuple[str, Path]]) -> None:
    records = [json.loads(line) for line in INSTANCES.read_text().splitlines()]
    assert records
    for record in records:
        name = record["repo"].rsplit("/", 1)[-1]
        assert record["base_commit"] == materialized[name][0], record["instance_id"]
        assert record["environment_setup_commit"] == record["base_commit"]


def test_repository_state(materialized: dict[str, tuple[str, Path]]) -> None:
    for name, (commit, path) in materialized.items():
        assert git(path, "rev-parse", "HEAD").strip() == commit
        assert git(path, "status", "--porcelain") == ""
        assert git(path, "branch", "--show-current").strip() == "main"
        history = git(path, "log", "--format=%an|%ae|%aI|%cI|%s").splitlines()
        assert len(history) >= 2, f"{name} should have some history"
        assert all("@example.com" in line for line in history)
        # Every file is tracked with mode 644, and the tree equals the stored source tree.
        modes = {line.split()[0] for line in git(path, "ls-files", "-s").splitlines()}
        assert modes == {"100644"}
        stored = {
            p.relative_to(repos.REPOS_DIR / name).as_posix()
            for p in (repos.REPOS_DIR / name).rglob("*")
            if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
        }
        assert set(git(path, "ls-files").splitlines()) == stored


def test_intermediate_commits_are_consistent(materialized: dict[str, tuple[str, Path]]) -> None:
    """Older commits import cleanly: history files make each commit a working package."""
    for name, (_, path) in materialized.items():
        first = git(path, "rev-list", "--max-parents=0", "HEAD").strip()
        init = git(path, "show", f"{first}:{name}/__init__.py")
        for line in init.splitlines():
            if line.startswith("from ") and " import " in line:
                module = line.split()[1].replace(".", "/") + ".py"
                git(path, "cat-file", "-e", f"{first}:{module}")


def test_accepts_the_instance_repo_field(tmp_path: Path) -> None:
    assert repos.materialize_repo("swerl/tinyini", tmp_path / "a") == repos.materialize_repo(
        "tinyini", tmp_path / "b"
    )
    assert repos.repo_name_of("swerl/spanlib") == "spanlib"


def test_errors(tmp_path: Path) -> None:
    with pytest.raises(repos.RepoError, match="unknown mini repository 'nope'"):
        repos.materialize_repo("nope", tmp_path / "x")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "file").write_text("x")
    with pytest.raises(repos.RepoError, match="not an empty directory"):
        repos.materialize_repo("strkit", tmp_path / "full")
    with pytest.raises(repos.RepoError, match="is not a mini repository"):
        repos.repo_name_of("django/django")


def test_inconsistent_manifest_is_detected(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    manifest = json.loads(repos.MANIFEST.read_text())
    manifest["strkit"]["commits"] = manifest["strkit"]["commits"][:1]  # later files never added
    fake = tmp_path / "manifest.json"
    fake.write_text(json.dumps(manifest))
    monkeypatch.setattr(repos, "MANIFEST", fake)
    with pytest.raises(repos.RepoError, match="never committed"):
        repos.materialize_repo("strkit", tmp_path / "repo")
    manifest["strkit"]["commits"][0]["paths"].append("strkit/missing.py")
    fake.write_text(json.dumps(manifest))
    with pytest.raises(repos.RepoError, match="absent from"):
        repos.materialize_repo("strkit", tmp_path / "repo2")
