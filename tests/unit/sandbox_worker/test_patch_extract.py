"""The host-side patch extraction on real git repositories in temp dirs (no sandbox).

Each attack test sets up what an agent can write in its sandbox (``.git/config``, attributes,
hooks, ``.git`` itself), shows that the old in-sandbox command (:func:`old_diff`:
``git add -A && git diff --cached --binary <base>`` run in the agent's repository, as
``Sandbox.diff`` did) is fooled by it, and that :func:`diff_snapshot` on a copy of the same
tree (a tar of it extracted by ``copy_out``'s own extraction: symlinks and fifos stay what
they are) gives the tree's real
patch, runs none of the agent's programs, or refuses the tree with a reason.
"""

from __future__ import annotations

import io
import os
import shutil
import stat
import subprocess
import tarfile
from pathlib import Path

import pytest

from sandbox_worker.backends._common import extract_single_tree, tar_host_path
from sandbox_worker.patch_extract import (
    PatchRefusedError,
    PatchTooLargeError,
    diff_snapshot,
    validate_base,
)

GIT_ID = {
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@example.com",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@example.com",
    "GIT_AUTHOR_DATE": "2024-01-01T00:00:00+00:00",
    "GIT_COMMITTER_DATE": "2024-01-01T00:00:00+00:00",
}
FORGED = "diff --git a/calc.py b/calc.py\n--- a/calc.py\n+++ b/calc.py\n@@ forged by the agent @@\n"
BASE_FILES = {
    "calc.py": "def add(a, b):\n    return a + b\n",
    "README.md": "A tiny repository.\n",
    "old name.txt": "one\ntwo\nthree\nfour\nfive\n",
    "gone.txt": "to be deleted\n",
}


def git_env(home: Path) -> dict[str, str]:
    """git as in a fresh sandbox: no system or global config, a HOME of its own."""
    return {"PATH": "/usr/bin:/bin", "HOME": str(home), "GIT_CONFIG_NOSYSTEM": "1",
            "GIT_CONFIG_GLOBAL": os.devnull, "LANG": "C.UTF-8", **GIT_ID}  # fmt: skip


def git(repo: Path, *args: str) -> str:
    home = repo.parent / "git-home"
    home.mkdir(exist_ok=True)
    res = subprocess.run(["git", *args], cwd=repo, env=git_env(home), capture_output=True)
    assert res.returncode == 0, res.stderr.decode()
    return res.stdout.decode().strip()


def make_repo(root: Path, *, sha256: bool = False, files: dict[str, str] | None = None) -> str:
    """A committed repository at ``root``; returns its base commit."""
    root.mkdir(parents=True)
    git(root, "init", "-q", *(["--object-format=sha256"] if sha256 else []))
    for rel, text in (files or BASE_FILES).items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    (root / "data.bin").write_bytes(bytes(range(256)) * 4)
    os.symlink("calc.py", root / "link")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "base")
    return git(root, "rev-parse", "HEAD")


def old_diff(repo: Path) -> tuple[int, str]:
    """The old in-sandbox extraction (``Sandbox.diff`` before this change), run in ``repo``."""
    home = repo.parent / "old-home"
    home.mkdir(exist_ok=True)
    base = (repo.parent / "BASE").read_text()
    g = "git -c core.fileMode=false -c core.quotePath=false"
    cmd = f"{g} add -A && {g} diff --cached --no-color --binary {base}"
    res = subprocess.run(cmd, shell=True, cwd=repo, env=git_env(home), capture_output=True)
    return res.returncode, res.stdout.decode("utf-8", "replace")


def new_diff(repo: Path, *, max_bytes: int = 2 << 20) -> str:
    """The host extraction on a copy of ``repo`` made the way ``copy_out`` makes it."""
    base = (repo.parent / "BASE").read_text()
    work = repo.parent / f"extract-{len(list(repo.parent.glob('extract-*')))}"
    work.mkdir()
    stream = io.BytesIO(tar_host_path(repo, "testbed"))
    with tarfile.open(fileobj=stream, mode="r:") as tar:  # as copy_out extracts its tar stream
        extract_single_tree(tar, work / "tree")
    return diff_snapshot(work / "tree", base, work, max_bytes=max_bytes)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    path = tmp_path / "testbed"
    (tmp_path / "BASE").write_text(make_repo(path))
    return path


def honest_edits(repo: Path) -> None:
    """What an agent's honest work leaves: edits, new, deleted, renamed, binary, symlink,
    executable, unicode and space names, nested dirs, ignored files."""
    (repo / "calc.py").write_text("def add(a, b):\n    return a + b  # fixed\n")
    (repo / "gone.txt").unlink()
    (repo / "old name.txt").rename(repo / "new näme.txt")
    (repo / "data.bin").write_bytes(bytes(range(255, -1, -1)) * 4)
    (repo / "link").unlink()
    os.symlink("README.md", repo / "link")
    (repo / "pkg" / "sub").mkdir(parents=True)
    (repo / "pkg" / "sub" / "módulo nuevo.py").write_text("x = 1\n")
    (repo / "run.sh").write_text("#!/bin/sh\necho hi\n")
    (repo / "run.sh").chmod(0o755)
    (repo / "empty").write_text("")
    (repo / ".gitignore").write_text("*.pyc\nbuild/\n")
    (repo / "cached.pyc").write_bytes(b"\x00junk")
    (repo / "build").mkdir()
    (repo / "build" / "out.o").write_bytes(b"obj")
    (repo / ".git" / "info").mkdir(exist_ok=True)
    (repo / ".git" / "info" / "exclude").write_text("local-notes.txt\n")
    (repo / "local-notes.txt").write_text("mine\n")


def test_honest_tree_gives_the_old_patch_byte_for_byte(repo: Path) -> None:
    honest_edits(repo)
    new = new_diff(repo)
    code, old = old_diff(repo)
    assert code == 0 and new == old
    assert "rename from old name.txt\nrename to new näme.txt" in new
    assert "GIT binary patch" in new and "diff --git a/run.sh b/run.sh\nnew file mode" in new
    assert "a/cached.pyc" not in new and "a/build/" not in new and "a/local-notes" not in new


def test_no_change_is_an_empty_patch(repo: Path) -> None:
    assert new_diff(repo) == ""


def test_sha256_repository(tmp_path: Path) -> None:
    repo = tmp_path / "testbed"
    base = make_repo(repo, sha256=True)
    assert len(base) == 64
    (tmp_path / "BASE").write_text(base)
    honest_edits(repo)
    new = new_diff(repo)
    assert new == old_diff(repo)[1] and "+    return a + b  # fixed" in new


def _script(path: Path, body: str) -> str:
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return str(path)


def _fix(repo: Path) -> None:
    (repo / "calc.py").write_text("def add(a, b):\n    return a + b  # real\n")


def _set(repo: Path, key: str, value: str) -> None:
    git(repo, "config", key, value)


def _forge(repo: Path) -> str:
    forged = repo.parent / "forged.diff"
    forged.write_text(FORGED)
    marker = repo.parent / "ran"
    return _script(repo.parent / "evil.sh", f"touch {marker}; cat {forged}")


def attack_diff_external(repo: Path) -> None:
    _set(repo, "diff.external", _forge(repo))


def attack_textconv(repo: Path) -> None:
    (repo / ".gitattributes").write_text("*.py diff=evil\n")
    _set(repo, "diff.evil.textconv", _script(repo.parent / "conv.sh", f"touch {repo.parent}/ran"))


def attack_filter_clean(repo: Path) -> None:
    (repo / ".gitattributes").write_text("*.py filter=evil\n")
    script = _script(repo.parent / "clean.sh", f"touch {repo.parent}/ran; echo 'print(1)'")
    _set(repo, "filter.evil.clean", script)
    _set(repo, "filter.evil.required", "true")


def attack_info_attributes(repo: Path) -> None:
    (repo / ".git" / "info").mkdir(exist_ok=True)
    (repo / ".git" / "info" / "attributes").write_text("* filter=evil\n")
    _set(repo, "filter.evil.clean", _script(repo.parent / "c.sh", f"touch {repo.parent}/ran; cat"))


def attack_fsmonitor(repo: Path) -> None:
    _set(repo, "core.fsmonitor", _script(repo.parent / "fsm.sh", f"touch {repo.parent}/ran"))


def attack_hooks_path(repo: Path) -> None:
    hooks = repo.parent / "hooks"
    hooks.mkdir()
    _script(hooks / "post-index-change", f"touch {repo.parent}/ran")
    _set(repo, "core.hooksPath", str(hooks))


def attack_hook_in_git_dir(repo: Path) -> None:
    _script(repo / ".git" / "hooks" / "post-index-change", f"touch {repo.parent}/ran")


def attack_include_path(repo: Path) -> None:
    included = repo.parent / "evil.cfg"
    included.write_text(f"[diff]\n\texternal = {_forge(repo)}\n")
    _set(repo, "include.path", str(included))


def attack_alias(repo: Path) -> None:
    # git never lets an alias shadow a built-in command; the test keeps it that way.
    _set(repo, "alias.diff", f"!{_forge(repo)}")
    _set(repo, "alias.add", f"!{_forge(repo)}")


def attack_replace_ref(repo: Path) -> None:
    """``refs/replace/<base>``: every git run in the repository diffs against another tree."""
    base = (repo.parent / "BASE").read_text()
    (repo / "calc.py").write_text("forged base\n")
    git(repo, "commit", "-q", "-am", "decoy")
    decoy = git(repo, "rev-parse", "HEAD")
    git(repo, "reset", "-q", "--soft", base)
    git(repo, "replace", base, decoy)


ATTACKS = {
    "diff.external": attack_diff_external,
    "textconv": attack_textconv,
    "filter.clean": attack_filter_clean,
    "info/attributes": attack_info_attributes,
    "fsmonitor": attack_fsmonitor,
    "hooksPath": attack_hooks_path,
    "hook in .git/hooks": attack_hook_in_git_dir,
    "include.path": attack_include_path,
    "alias": attack_alias,
    "replace ref": attack_replace_ref,
}
# Attacks the old in-sandbox command fell for (alias does not work on git itself).
FOOLED_THE_OLD_DIFF = set(ATTACKS) - {"alias"}


@pytest.mark.parametrize("name", list(ATTACKS))
def test_the_agents_git_configuration_cannot_shape_the_patch(
    tmp_path: Path, repo: Path, name: str
) -> None:
    pristine = tmp_path / "pristine.git"
    shutil.copytree(repo / ".git", pristine, symlinks=True)
    ATTACKS[name](repo)
    _fix(repo)
    # The reference: the same working tree (with any .gitattributes the attack wrote) under
    # the repository's own .git as it was before the attack.
    reference = tmp_path / "reference"
    shutil.copytree(repo, reference, symlinks=True, ignore=shutil.ignore_patterns(".git"))
    shutil.copytree(pristine, reference / ".git", symlinks=True)
    real = new_diff(reference)
    assert "+    return a + b  # real" in real
    marker = tmp_path / "ran"

    new = new_diff(repo)
    assert not marker.exists(), f"{name}: the agent's program ran on the host"
    assert _same_changes(new, real)

    code, old = old_diff(repo)
    if name in FOOLED_THE_OLD_DIFF:
        assert code != 0 or old != new or marker.exists(), f"{name}: the old diff was not fooled"


def _same_changes(one: str, two: str) -> bool:
    """Equal but for the ``index`` lines (a hook or filter run may leave extra objects, which
    can lengthen the abbreviated ids)."""

    def strip(text: str) -> list[str]:
        return [line for line in text.splitlines() if not line.startswith("index ")]

    return strip(one) == strip(two)


def test_in_tree_attributes_naming_drivers_run_nothing(
    tmp_path: Path, repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``.gitattributes`` may still name filter and diff drivers (it is part of the tree), but
    nothing the extraction reads defines them: not the worker's own environment either."""
    (repo / ".gitattributes").write_text("* filter=evil diff=evil merge=evil\n")
    script = _script(tmp_path / "x.sh", f"touch {tmp_path}/ran; echo forged")
    worker_home = tmp_path / "worker-home"
    (worker_home / ".config" / "git").mkdir(parents=True)
    config = f'[filter "evil"]\n\tclean = {script}\n\trequired = true\n[diff "evil"]\n'
    config += f"\ttextconv = {script}\n\tcommand = {script}\n[diff]\n\texternal = {script}\n"
    (worker_home / ".gitconfig").write_text(config)
    (worker_home / ".config" / "git" / "config").write_text(config)
    _fix(repo)
    monkeypatch.setenv("HOME", str(worker_home))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(worker_home / ".config"))
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(worker_home / ".gitconfig"))
    monkeypatch.setenv("GIT_CONFIG_PARAMETERS", f"'diff.external'='{script}'")
    monkeypatch.setenv("GIT_DIR", str(tmp_path))
    patch = new_diff(repo)
    assert not (tmp_path / "ran").exists()
    assert "+    return a + b  # real" in patch and "forged" not in patch


def test_git_dir_as_a_gitdir_file_pointing_at_a_host_repository(tmp_path: Path, repo: Path) -> None:
    other = tmp_path / "host-repo"
    shutil.copytree(repo / ".git", other)
    shutil.rmtree(repo / ".git")
    (repo / ".git").write_text(f"gitdir: {other}\n")
    _fix(repo)
    assert "# real" in old_diff(repo)[1]  # the old diff read the host's repository
    with pytest.raises(PatchRefusedError) as info:
        new_diff(repo)
    assert info.value.code == "git_dir_invalid" and "not a directory" in info.value.detail


def test_symlinked_git_dir_is_refused(tmp_path: Path, repo: Path) -> None:
    other = tmp_path / "elsewhere"
    (repo / ".git").rename(other)
    os.symlink(other, repo / ".git")
    with pytest.raises(PatchRefusedError) as info:
        new_diff(repo)
    assert info.value.code == "git_dir_invalid" and "symlink" in info.value.detail


def test_symlinked_object_store_is_refused(tmp_path: Path, repo: Path) -> None:
    (repo / ".git" / "objects").rename(tmp_path / "objects")
    os.symlink(tmp_path / "objects", repo / ".git" / "objects")
    with pytest.raises(PatchRefusedError) as info:
        new_diff(repo)
    assert info.value.code == "git_dir_invalid"


def test_deleted_object_store_makes_the_base_unavailable(repo: Path) -> None:
    for entry in (repo / ".git" / "objects").iterdir():
        shutil.rmtree(entry)
    _fix(repo)
    with pytest.raises(PatchRefusedError) as info:
        new_diff(repo)
    assert info.value.code == "base_unavailable"


def test_alternates_pointing_at_a_host_directory_are_not_followed(
    tmp_path: Path, repo: Path
) -> None:
    """The objects live only in a host directory named by ``objects/info/alternates``."""
    host_objects = tmp_path / "host-objects"
    shutil.copytree(repo / ".git" / "objects", host_objects)
    for entry in (repo / ".git" / "objects").iterdir():
        shutil.rmtree(entry)
    (repo / ".git" / "objects" / "info").mkdir()
    (repo / ".git" / "objects" / "info" / "alternates").write_text(f"{host_objects}\n")
    _fix(repo)
    assert "# real" in old_diff(repo)[1]  # the old diff read the host directory's objects
    with pytest.raises(PatchRefusedError) as info:
        new_diff(repo)
    assert info.value.code == "base_unavailable"


def test_commondir_is_not_followed(tmp_path: Path, repo: Path) -> None:
    common = tmp_path / "common"
    shutil.copytree(repo / ".git", common)
    for entry in (repo / ".git" / "objects").iterdir():
        shutil.rmtree(entry)
    (repo / ".git" / "commondir").write_text(f"{common}\n")
    with pytest.raises(PatchRefusedError) as info:
        new_diff(repo)
    assert info.value.code == "base_unavailable"


def test_nested_repositories_run_no_git_of_the_agents(tmp_path: Path, repo: Path) -> None:
    """A repository inside the tree (a submodule, one the agent made) is never entered: its
    config could name an fsmonitor or filters; its files are the agent's new files."""
    nested = repo / "vendored"
    nested.mkdir()
    git(nested, "init", "-q")
    (nested / "lib.py").write_text("y = 2\n")
    git(nested, "add", "-A")
    git(nested, "commit", "-q", "-m", "n")
    _set(nested, "core.fsmonitor", _script(tmp_path / "fsm.sh", f"touch {tmp_path}/ran"))
    patch = new_diff(repo)
    assert not (tmp_path / "ran").exists()
    assert "diff --git a/vendored/lib.py b/vendored/lib.py\nnew file mode 100644" in patch
    assert "Subproject commit" not in patch


def test_special_files_are_dropped_not_opened(repo: Path) -> None:
    os.mkfifo(repo / "pipe")
    (repo / "README.md").unlink()
    os.mkfifo(repo / "README.md")  # a tracked file replaced by a fifo: git would block / fail
    patch = new_diff(repo)
    assert "diff --git a/README.md b/README.md\ndeleted file mode 100644" in patch
    assert "pipe" not in patch


def test_patch_over_the_cap_is_refused_never_truncated(repo: Path) -> None:
    (repo / "big.txt").write_text("".join(f"line {i}\n" for i in range(400)))
    full = new_diff(repo)
    size = len(full.encode())
    assert new_diff(repo, max_bytes=size) == full  # exactly at the cap: kept whole
    with pytest.raises(PatchTooLargeError) as info:
        new_diff(repo, max_bytes=size - 1)
    assert info.value.code == "patch_too_large" and info.value.limit == size - 1


def test_a_huge_patch_is_stopped_at_the_cap(repo: Path) -> None:
    """git is stopped once its output passes the cap: nothing near the tree's size is held."""
    (repo / "huge.bin").write_bytes(os.urandom(8 << 20))
    with pytest.raises(PatchTooLargeError):
        new_diff(repo, max_bytes=64 * 1024)


@pytest.mark.parametrize("bad", ["HEAD", "main", "abc123", "0" * 39, "g" * 40, "a" * 40 + " "])
def test_the_base_must_be_a_full_commit_id(bad: str) -> None:
    with pytest.raises(ValueError, match="invalid base commit"):
        validate_base(bad)


def test_the_snapshot_working_tree_must_be_a_directory(tmp_path: Path) -> None:
    (tmp_path / "tree").write_text("not a dir")
    with pytest.raises(PatchRefusedError) as info:
        diff_snapshot(tmp_path / "tree", "a" * 40, tmp_path)
    assert info.value.code == "git_dir_invalid"


def test_executable_bits_follow_the_old_diff(repo: Path) -> None:
    """core.fileMode=false, as before: a chmod alone is no change."""
    (repo / "calc.py").chmod((repo / "calc.py").stat().st_mode | stat.S_IXUSR)
    assert new_diff(repo) == "" == old_diff(repo)[1]
