"""Materialise the mini task set's repositories as real git repositories, deterministically.

Git repositories cannot be nested inside swerl's own repository, so each mini repository is
stored as a plain, readable source tree (``tests/data/repos/<name>/``, the tree at the base
commit) plus a small history manifest (``tests/data/repos/manifest.json``). Earlier versions of
files that changed along the history live under ``tests/data/repo_history/<name>/<i>/``.

:func:`materialize_repo` replays that history with fixed author/committer identities and dates
in an isolated git environment (no system or user config), writing every file with mode 0644
and no line-ending conversion, so the base commit hash is the same on every machine. The hash
is what ``tests/data/instances.jsonl`` records as ``base_commit`` (a unit test checks it), and
the image build scripts call this function to put the repository into ``/testbed``.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

DATA_DIR = Path(__file__).resolve().parents[2] / "tests" / "data"
REPOS_DIR = DATA_DIR / "repos"
HISTORY_DIR = DATA_DIR / "repo_history"
MANIFEST = REPOS_DIR / "manifest.json"

# Build products that may appear in a source tree after running its tests in place; they are
# never part of a repository.
_IGNORED_NAMES = frozenset({"__pycache__", ".pytest_cache"})
_IGNORED_SUFFIXES = (".pyc", ".pyo")
_COMMIT_SPACING = timedelta(hours=5, minutes=17)


class RepoError(RuntimeError):
    """A mini repository is unknown, inconsistent with its manifest, or git failed."""


@dataclass(frozen=True)
class CommitSpec:
    message: str
    paths: tuple[str, ...]  # files taken from the final tree in this commit


@dataclass(frozen=True)
class RepoSpec:
    name: str
    author_name: str
    author_email: str
    start: datetime
    commits: tuple[CommitSpec, ...]


def available_repos() -> list[str]:
    """Names of the mini repositories, sorted."""
    return sorted(_load_manifest())


def repo_name_of(repo: str) -> str:
    """The mini repository of an instance's ``repo`` field: ``"swerl/strkit"`` -> ``"strkit"``."""
    name = repo.rsplit("/", 1)[-1]
    if name not in _load_manifest():
        raise RepoError(
            f"{repo!r} is not a mini repository (known: {', '.join(available_repos())})"
        )
    return name


def materialize_repo(name: str, dest: Path) -> str:
    """Create the git repository ``name`` at ``dest`` and return its base (HEAD) commit hash.

    ``name`` is a mini repository name (``"strkit"``) or an instance's ``repo`` field
    (``"swerl/strkit"``). ``dest`` must not exist or be an empty directory. The result has
    branch ``main`` checked out at the base commit with a clean working tree.
    """
    name = name.rsplit("/", 1)[-1]
    spec = _load_manifest().get(name)
    if spec is None:
        raise RepoError(f"unknown mini repository {name!r} (known: {', '.join(available_repos())})")
    dest = Path(dest)
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise RepoError(f"destination {dest} exists and is not an empty directory")
    final_files = _tree_files(REPOS_DIR / name)
    dest.mkdir(parents=True, exist_ok=True)
    _git(dest, spec, None, "init", "-q", "-b", "main")
    written: dict[str, bytes] = {}
    for index, commit in enumerate(spec.commits, start=1):
        for path in commit.paths:
            if path not in final_files:
                raise RepoError(
                    f"{name}: commit {index} lists {path!r}, absent from {REPOS_DIR / name}"
                )
            written[path] = final_files[path]
        history = HISTORY_DIR / name / str(index)
        if history.is_dir():
            written.update(_tree_files(history))
        for path, data in written.items():
            _write(dest / path, data)
        when = spec.start + _COMMIT_SPACING * (index - 1)
        _git(dest, spec, when, "add", "-A")
        _git(dest, spec, when, "commit", "-q", "--no-verify", "-m", commit.message)
    if written != final_files:
        missing = sorted(set(final_files) - set(written))
        differing = sorted(p for p in written if final_files.get(p) != written[p])
        raise RepoError(
            f"{name}: the manifest's history does not end at the source tree "
            f"(never committed: {missing}; differing at the end: {differing})"
        )
    return _git(dest, spec, None, "rev-parse", "HEAD").strip()


def _load_manifest() -> dict[str, RepoSpec]:
    try:
        raw = json.loads(MANIFEST.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise RepoError(f"cannot read {MANIFEST}: {exc}") from exc
    specs = {}
    for name, entry in raw.items():
        author_name, _, email = entry["author"].partition(" <")
        specs[name] = RepoSpec(
            name=name,
            author_name=author_name,
            author_email=email.rstrip(">"),
            start=datetime.fromisoformat(entry["start"]),
            commits=tuple(CommitSpec(c["message"], tuple(c["paths"])) for c in entry["commits"]),
        )
    return specs


def _tree_files(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` (relative POSIX path -> bytes), build products excluded."""
    if not root.is_dir():
        raise RepoError(f"source tree {root} is missing")
    files = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in _IGNORED_NAMES)
        for filename in sorted(filenames):
            if filename.endswith(_IGNORED_SUFFIXES):
                continue
            path = Path(dirpath) / filename
            files[path.relative_to(root).as_posix()] = path.read_bytes()
    return files


def _write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    path.chmod(0o644)


def _git(repo: Path, spec: RepoSpec, when: datetime | None, *args: str) -> str:
    """Run git in ``repo`` isolated from any system/user configuration."""
    stamp = (when or spec.start).isoformat()
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(repo),
        "LANG": "C",
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_AUTHOR_NAME": spec.author_name,
        "GIT_AUTHOR_EMAIL": spec.author_email,
        "GIT_AUTHOR_DATE": stamp,
        "GIT_COMMITTER_NAME": spec.author_name,
        "GIT_COMMITTER_EMAIL": spec.author_email,
        "GIT_COMMITTER_DATE": stamp,
    }
    config = ["-c", "core.autocrlf=false", "-c", "commit.gpgsign=false", "-c", "core.fileMode=true"]
    try:
        proc = subprocess.run(
            ["git", *config, *args], cwd=repo, env=env, capture_output=True, text=True, check=False
        )
    except OSError as exc:
        raise RepoError(f"cannot run git: {exc}") from exc
    if proc.returncode != 0:
        raise RepoError(f"git {' '.join(args)} failed in {repo}: {proc.stderr.strip()}")
    return proc.stdout
