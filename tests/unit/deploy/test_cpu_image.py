"""deploy/cpu_image.py's pure parts: tags follow content, the env file, the tar layout.
(The real build runs in tests/e2e/test_compose_cpu.py.)"""

from __future__ import annotations

import dataclasses
import subprocess
from pathlib import Path

import pytest

from tests.support.deploy_scripts import DEPLOY, load

ci = load("cpu_image")


def _repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / ".gitignore").write_text("ignored/\n")
    (repo / "a.py").write_text("print(1)\n")
    (repo / "ignored").mkdir()
    (repo / "ignored" / "big.bin").write_text("x")
    return repo


def _inputs(repo: Path) -> object:
    paths = [Path(p) for p in ("/r", "/py", "/venv", "/redis")]
    return ci.Inputs(paths[0], "img", *paths[1:], repo, Path("/m"))


def test_repo_files_are_tracked_and_unignored_ones(tmp_path: Path) -> None:
    repo = _repo(tmp_path)
    assert ci.repo_files(repo) == [".gitignore", "a.py"]


def test_the_code_tag_changes_with_a_file_and_only_then(tmp_path: Path) -> None:
    repo = _repo(tmp_path)
    inputs = _inputs(repo)
    first = ci.code_hash(inputs)
    assert ci.code_hash(inputs) == first
    (repo / "ignored" / "big.bin").write_text("changed")  # ignored: no new image
    assert ci.code_hash(inputs) == first
    (repo / "a.py").write_text("print(2)\n")
    assert ci.code_hash(inputs) != first


def test_pyvenv_home_is_read_or_refused() -> None:
    text = "home = /root/.pyenv/versions/3.12.1/bin\nversion = 3.12.1\n"
    assert ci._pyvenv_home(text) == Path("/root/.pyenv/versions/3.12.1/bin")
    with pytest.raises(ci.ImageBuildError, match="no 'home' line"):
        ci._pyvenv_home("version = 3.12.1\n")


def test_a_missing_venv_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ci.ImageBuildError, match="no venv at"):
        ci.Inputs.from_environment(tmp_path)


def test_redis_server_libraries_are_found() -> None:
    libs = ci.shared_libraries(Path("/usr/bin/redis-server"))
    names = {p.name for p in libs}
    assert "libc.so.6" in names and any(n.startswith("libjemalloc") for n in names)
    assert all(p.is_absolute() for p in libs)


def test_the_venv_comes_first_on_path(tmp_path: Path) -> None:
    changes = ci.import_changes(_inputs(tmp_path), "abc")
    assert changes[0] == f"ENV PATH=/venv/bin:{ci.SYSTEM_PATH}"
    assert f"WORKDIR {ci.SRC_IN_IMAGE}" in changes


def test_the_env_file_is_cpu_env_with_this_machines_values(tmp_path: Path) -> None:
    inputs = dataclasses.replace(_inputs(tmp_path), venv=Path("/cache/venv-x"))
    out = tmp_path / "cpu.env"
    ci.write_env(out, {**ci.compose_env(inputs, "swerl/cpu:t"), "EXTRA": "1"})
    lines = out.read_text().splitlines()
    assert "SWERL_IMAGE=swerl/cpu:t" in lines and "SWERL_VENV=/cache/venv-x" in lines
    assert "SWERL_IMAGE=swerl/cpu:latest" not in lines  # replaced, not duplicated
    assert lines[-1] == "EXTRA=1"
    template = (DEPLOY / "nodes" / "cpu.env").read_text().splitlines()
    assert len(lines) == len(template) + 1
    assert "SWERL_WEIGHTS_DIR=/m/compose/weights" in lines


def test_stale_tags_are_older_runtimes_and_code_layers() -> None:
    runtime, tag = "swerl/cpu-runtime:aaaaaaaaaaaaaaaa", "swerl/cpu:aaaaaaaaaa-cccc"
    tags = [
        runtime,
        tag,
        "swerl/cpu-runtime:bbbbbbbbbbbbbbbb",  # an older environment
        "swerl/cpu:aaaaaaaaaa-dddd",  # older code on this runtime
        "swerl/cpu:bbbbbbbbbb-cccc",  # code on the older runtime
        "swerl/cpu:latest",  # a hand-made tag: not ours to remove
        "swerl/base:bookworm",
    ]
    assert ci.stale_tags(tags, runtime, tag) == [
        "swerl/cpu-runtime:bbbbbbbbbbbbbbbb",
        "swerl/cpu:aaaaaaaaaa-dddd",
        "swerl/cpu:bbbbbbbbbb-cccc",
    ]


def test_every_bound_directory_is_made_the_sandbox_state_dir_included(tmp_path: Path) -> None:
    # compose refused `up -d` on a fresh machine: bind source path does not exist (the state dir)
    template = tmp_path / "t.env"
    template.write_text(
        f"# comment=not a value\nSWERL_SANDBOX_STATE={tmp_path / 'state'}\n"
        f"SWERL_RUNS_DIR={tmp_path / 'template-runs'}\n"
    )
    values = {"SWERL_CHECKPOINT_DIR": str(tmp_path / "c"), "SWERL_RUNS_DIR": str(tmp_path / "r")}
    made = ci.make_volume_dirs(values, template)
    assert {p.name for p in made} == {"c", "r", "state"}
    assert all(p.is_dir() for p in made)
    assert not (tmp_path / "template-runs").exists()  # the machine's value wins


def test_the_shipped_template_names_every_bound_directory() -> None:
    values = ci.template_values()
    assert all(values.get(key) for key in ci.BIND_DIRS)
    compose = (DEPLOY.parent / "compose.yaml").read_text()
    assert all("${" + key in compose for key in ci.BIND_DIRS)


MOUNTINFO = """\
22 1 0:21 / / rw,relatime - overlay overlay rw
30 22 0:30 / /var/lib/swerl rw,relatime shared:7 - tmpfs tmpfs rw
31 30 0:31 / /var/lib/swerl/private\\040dir rw,relatime - tmpfs tmpfs rw
"""


def test_shared_mount_is_read_from_the_longest_mount_point_above_the_path() -> None:
    assert ci.is_shared_mount(Path("/var/lib/swerl/compose-sandboxes"), MOUNTINFO)
    assert ci.is_shared_mount(Path("/var/lib/swerl"), MOUNTINFO)
    assert not ci.is_shared_mount(Path("/var/lib/swerl/private dir/x"), MOUNTINFO)
    assert not ci.is_shared_mount(Path("/var/lib/swerlx"), MOUNTINFO)  # a prefix, not a parent
    assert not ci.is_shared_mount(Path("/srv"), MOUNTINFO)
    advice = ci.shared_mount_advice(Path("/s"))
    assert "mount --bind /s /s && mount --make-rshared /s" in advice
