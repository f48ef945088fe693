"""Build one docker image per task instance, plus its bwrap tree. Run with the project venv.

    python deploy/images/build_instances.py [--instances tests/data/instances.jsonl]

The instances file is read with the dataset loader every swerl component uses
(``services.datasets.load_instances``: JSONL, JSON or parquet, each row a full SWE-bench-style
instance with ``base_commit``). For each instance: put the repository at its base commit into a
build context (outside the docker data root), then ``docker build`` (the classic builder through
the docker SDK, never pulling) an image ``FROM swerl/base:bookworm`` with the repository at
``/testbed``, labelled with the instance, repository, base commit and a content hash.

Where the repository comes from: a row's ``repo_path`` (a local git repository; relative paths
are taken from the instances file's directory) or ``repo_url`` (any URL git clones, e.g.
``file:///srv/git/tool.git``) is cloned and checked out at ``base_commit``: its history up to
the base is kept as it is, everything after it (later commits, other branches, later tags, the
remote, reflogs) is removed, so the agent cannot read the fix in the repository's history (see
:func:`clone_at`); without either, the ``--materializer`` puts it there (the mini set's).
Environment: an optional ``setup_commands`` list (shell commands) becomes ``RUN`` steps, and an
optional ``setup_script`` (the text of a bash script) runs once in ``/testbed``; the build has
no network (``network_mode="none"``, whatever the daemon's default), so they install from what
the base image or the repository holds (vendored wheels, ``pip install --no-index
--find-links``).

Idempotent: an image whose ``swerl.content_hash`` label matches is not rebuilt, and a bwrap tree
whose stamp names the current image id is not re-exported.

bwrap trees (see docs/sandboxes.md): an image that is the base image plus ``/testbed`` only
shares the base root filesystem (the debootstrap dir the base image was imported from) and gets
its own copy of ``/testbed``, taken from the built image; an image with ``RUN`` steps is exported
whole.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import hashlib
import importlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

import docker  # noqa: E402
import docker.errors  # noqa: E402

from sandbox_worker import images  # noqa: E402
from sandbox_worker.backends._common import extract_single_tree  # noqa: E402
from services.datasets import DatasetError  # noqa: E402
from services.datasets import load_instances as load_dataset  # noqa: E402
from services.protocol.instance import SWEInstance  # noqa: E402

# Bump when the Dockerfile recipe below changes: every image is then rebuilt once.
RECIPE_VERSION = "1"
DEFAULT_MATERIALIZER = "sandbox_worker.tasks.repos:materialize_repo"

Materializer = Callable[[str, Path], str]
SETUP_SCRIPT = "swerl-setup.sh"


class BuildError(RuntimeError):
    """An instance image could not be built; the message names the instance."""


@dataclass(frozen=True)
class Instance:
    instance_id: str
    repo: str
    base_commit: str
    setup_commands: tuple[str, ...]
    source: str | None = None  # repo_path (absolute) or repo_url to clone; None: materializer
    setup_script: str | None = None


def load_instances(path: Path) -> list[Instance]:
    """The build view of every row of a dataset file; errors are :class:`BuildError` messages
    naming the file, the row and the field."""
    try:
        rows = load_dataset(path)
    except DatasetError as exc:
        raise BuildError(str(exc)) from None
    return [_build_instance(path, row) for row in rows]


def _build_instance(path: Path, row: SWEInstance) -> Instance:
    extra = row.model_extra or {}
    who = f"{path}: instance {row.instance_id!r}"
    if not row.base_commit:
        raise BuildError(f"{who}: an image build needs base_commit")
    setup = extra.get("setup_commands") or []
    if not isinstance(setup, list) or not all(isinstance(c, str) for c in setup):
        raise BuildError(f"{who}: setup_commands must be a list of strings")
    script = extra.get("setup_script")
    if script is not None and (not isinstance(script, str) or not script.strip()):
        raise BuildError(f"{who}: setup_script must be the non-empty text of a bash script")
    repo_path, repo_url = extra.get("repo_path"), extra.get("repo_url")
    if repo_path is not None and repo_url is not None:
        raise BuildError(f"{who}: give repo_path or repo_url, not both")
    source = repo_url
    for name, value in (("repo_path", repo_path), ("repo_url", repo_url)):
        if value is not None and (not isinstance(value, str) or not value.strip()):
            raise BuildError(f"{who}: {name} must be a non-empty string")
    if isinstance(repo_path, str):
        local = Path(repo_path).expanduser()
        local = local if local.is_absolute() else (path.parent / local)
        if not (local / ".git").exists() and not (local / "HEAD").is_file():
            raise BuildError(f"{who}: repo_path {repo_path!r} is not a git repository ({local})")
        source = str(local.resolve())
    return Instance(
        row.instance_id, row.repo, row.base_commit, tuple(setup), source, script or None
    )


def clone_at(source: str, dest: Path, commit: str) -> str:
    """Clone ``source`` into ``dest`` at ``commit`` with its history up to that commit and
    nothing after it; returns the commit's hash.

    The clone brings every branch and tag, i.e. the fix and everything after the base: an
    agent that runs ``git log --all`` would read the answer. So the clone is cut back to the
    base: one branch (the source's default branch name) at ``commit``, only the tags on its
    ancestors, no remote, no reflog, and the unreachable objects pruned. The commits up to the
    base are kept as they are (nothing rewritten); the result is checked: no commit but the
    base's ancestors is left.
    """
    env = {**os.environ, "GIT_CONFIG_NOSYSTEM": "1", "GIT_TERMINAL_PROMPT": "0"}

    def git(step: str, *args: str, here: bool = True) -> str:
        res = subprocess.run(
            ["git", *(["-C", str(dest)] if here else []), *args], env=env, capture_output=True,
            text=True, timeout=1800, check=False,
        )  # fmt: skip
        if res.returncode != 0:
            raise BuildError(f"{step} failed: {res.stderr.strip()[-500:]}")
        return res.stdout.strip()

    git("git clone", "clone", "--quiet", "--no-hardlinks", "--no-checkout", source, str(dest),
        here=False)  # fmt: skip
    try:
        full = git("", "rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}")
    except BuildError:
        raise BuildError(f"base_commit {commit} is not a commit of the repository") from None
    try:
        branch = git("", "symbolic-ref", "--quiet", "--short", "HEAD") or "main"
    except BuildError:
        branch = "main"
    git("git checkout", "checkout", "--quiet", "-B", branch, full)
    for ref in git("git for-each-ref", "for-each-ref", "--format=%(refname)").splitlines():
        if ref == f"refs/heads/{branch}":
            continue
        if ref.startswith("refs/tags/"):
            is_ancestor = subprocess.run(
                ["git", "-C", str(dest), "merge-base", "--is-ancestor", ref, full],
                env=env, capture_output=True, check=False,
            ).returncode == 0  # fmt: skip
            if is_ancestor:
                continue
        git("git update-ref", "update-ref", "-d", ref)
    for remote in git("git remote", "remote").splitlines():
        git("git remote remove", "remote", "remove", remote)
    git("git reflog expire", "reflog", "expire", "--expire=now", "--all")
    git("git gc", "gc", "--quiet", "--prune=now")
    later = git("git rev-list", "rev-list", "--all", "--not", full)
    if later:
        raise BuildError(f"commits after base_commit {commit} are still in the clone: {later}")
    return git("git rev-parse", "rev-parse", "HEAD")


@functools.cache
def load_materializer(spec: str) -> Materializer:
    """Import ``MODULE:FUNCTION`` (only when an image really has to be built)."""
    module_name, _, func_name = spec.partition(":")
    if not module_name or not func_name:
        raise BuildError(f"--materializer must be MODULE:FUNCTION, got {spec!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise BuildError(f"cannot import materializer module {module_name}: {exc}") from exc
    func = getattr(module, func_name, None)
    if not callable(func):
        raise BuildError(f"{module_name} has no function {func_name}")
    return func


def content_hash(inst: Instance, base_id: str) -> str:
    """Everything the image content depends on (the repo tree is pinned by base_commit)."""
    key = {
        "recipe": RECIPE_VERSION,
        "base": base_id,
        "instance_id": inst.instance_id,
        "repo": inst.repo,
        "base_commit": inst.base_commit,
        "setup": list(inst.setup_commands),
    }
    # Only when set, so the images of rows without them keep their hash (no mass rebuild).
    if inst.setup_script is not None:
        key["setup_script"] = inst.setup_script
    if inst.source is not None:
        key["source"] = inst.source
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()


def dockerfile(inst: Instance, base: str) -> str:
    lines = [f"FROM {base}", "COPY testbed /testbed", "WORKDIR /testbed"]
    lines += [f"RUN {cmd}" for cmd in inst.setup_commands]
    if inst.setup_script:
        lines += [
            f"COPY {SETUP_SCRIPT} /tmp/{SETUP_SCRIPT}",
            f"RUN bash -eo pipefail /tmp/{SETUP_SCRIPT} && rm -f /tmp/{SETUP_SCRIPT}",
        ]
    return "\n".join(lines) + "\n"


def _existing_hash(client: docker.DockerClient, image: str) -> str | None:
    try:
        img = client.images.get(image)
    except docker.errors.ImageNotFound:
        return None
    return (img.labels or {}).get("swerl.content_hash")


def build_image(
    client: docker.DockerClient,
    inst: Instance,
    base: str,
    base_id: str,
    materializer: str,
    build_root: Path,
    *,
    force: bool,
) -> tuple[str, bool]:
    """Build the instance image unless an identical one exists; returns (image, built?)."""
    image = images.instance_image(inst.instance_id)
    chash = content_hash(inst, base_id)
    if not force and _existing_hash(client, image) == chash:
        return image, False
    previous = _image_id(client, image)
    build_root.mkdir(parents=True, exist_ok=True)
    ctx = Path(tempfile.mkdtemp(prefix=f"{images.rootfs_key(image)[:60]}-", dir=build_root))
    try:
        if inst.source is not None:
            try:
                commit = clone_at(inst.source, ctx / "testbed", inst.base_commit)
            except BuildError as exc:
                raise BuildError(f"{inst.instance_id}: cloning {inst.source}: {exc}") from None
        else:
            commit = load_materializer(materializer)(inst.repo, ctx / "testbed")
        if inst.setup_script:
            (ctx / SETUP_SCRIPT).write_text(inst.setup_script)
        if not commit.startswith(inst.base_commit):
            raise BuildError(
                f"{inst.instance_id}: materialised {inst.repo} is at {commit}, "
                f"but the instance's base_commit is {inst.base_commit}"
            )
        (ctx / "Dockerfile").write_text(dockerfile(inst, base))
        labels = {
            "swerl.owner": "swerl",
            "swerl.kind": "instance",
            "swerl.instance_id": inst.instance_id,
            "swerl.repo": inst.repo,
            "swerl.base_commit": inst.base_commit,
            "swerl.content_hash": chash,
            "swerl.has_setup": "1" if inst.setup_commands or inst.setup_script else "0",
        }
        try:
            client.images.build(
                path=str(ctx),
                tag=image,
                pull=False,
                rm=True,
                forcerm=True,
                labels=labels,
                network_mode="none",  # offline whatever the daemon's default network is
            )
        except docker.errors.BuildError as exc:
            log = "".join(str(c.get("stream", c.get("error", ""))) for c in exc.build_log)
            raise BuildError(
                f"{inst.instance_id}: docker build failed: {exc}\n{log[-2000:]}"
            ) from None
    finally:
        shutil.rmtree(ctx, ignore_errors=True)
    _remove_replaced(client, image, previous)
    return image, True


def _image_id(client: docker.DockerClient, image: str) -> str | None:
    try:
        return client.images.get(image).id
    except docker.errors.ImageNotFound:
        return None


def _remove_replaced(client: docker.DockerClient, image: str, previous: str | None) -> None:
    """A rebuild moves the tag to a new image: remove the old one so no dangling image stays
    behind (kept, with a warning, while a container still uses it)."""
    if previous is None or previous == _image_id(client, image):
        return
    try:
        client.images.remove(previous, noprune=False)
    except docker.errors.ImageNotFound:
        pass
    except docker.errors.APIError as exc:
        print(f"warning: the replaced image of {image} stays: {exc}", file=sys.stderr)


def _stamp_current(image: str, image_id: str, labels: dict[str, str] | None = None) -> bool:
    """Whether ``image``'s tree is registered for ``image_id``; a current stamp without the
    image's labels (written before trees carried them) gets them added, without a rebuild."""
    try:
        info = images.rootfs_info(image)
    except images.ImageNotFoundError:
        return False
    if info.image_id != image_id:
        return False
    if labels is not None and info.labels != labels:
        _write_stamp(dataclasses.replace(info, labels=labels))
    return True


def _write_stamp(info: images.RootfsInfo) -> None:
    stamp = images.rootfs_stamp(info.image)
    stamp.parent.mkdir(parents=True, exist_ok=True)
    tmp = stamp.with_suffix(".json.tmp")
    tmp.write_text(info.to_json())
    tmp.replace(stamp)


def _stream_tar(chunks: Iterator[bytes]) -> tarfile.TarFile:
    class _Reader:
        def __init__(self) -> None:
            self._buf = b""
            self._it = chunks

        def read(self, n: int = -1) -> bytes:
            while n < 0 or len(self._buf) < n:
                try:
                    self._buf += next(self._it)
                except StopIteration:
                    break
            if n < 0:
                data, self._buf = self._buf, b""
            else:
                data, self._buf = self._buf[:n], self._buf[n:]
            return data

    return tarfile.open(fileobj=_Reader(), mode="r|")  # type: ignore[call-overload]


def register_base_rootfs(client: docker.DockerClient, base: str) -> str:
    """The base image's tree is the debootstrap dir it was imported from."""
    img = client.images.get(base)
    suite = (img.labels or {}).get("swerl.suite", "bookworm")
    root = images.cache_dir() / "rootfs" / f"base-{suite}"
    if not (root / "usr").is_dir():
        raise BuildError(f"base root filesystem {root} missing: run deploy/images/build_base.sh")
    if not _stamp_current(base, img.id):
        cfg = img.attrs.get("Config") or {}
        _write_stamp(
            images.RootfsInfo(
                base, img.id, root, None, tuple(cfg.get("Env") or ()), cfg.get("WorkingDir") or "/"
            )
        )
    return str(root)


def build_rootfs(client: docker.DockerClient, image: str, base_root: str) -> bool:
    """Register the bwrap tree of ``image``; returns whether anything was (re)built."""
    img = client.images.get(image)
    labels = images.swerl_labels(img.labels)
    if _stamp_current(image, img.id, labels):
        return False
    key = images.rootfs_key(image)
    rootfs_dir = images.cache_dir() / "rootfs"
    cfg = img.attrs.get("Config") or {}
    env = tuple(cfg.get("Env") or ())
    workdir = cfg.get("WorkingDir") or "/"
    container = client.containers.create(image, command=["true"], network_mode="none")
    try:
        if (img.labels or {}).get("swerl.has_setup") == "0":
            dest = rootfs_dir / f"{key}.testbed"
            bits, _ = container.get_archive("/testbed")
            shutil.rmtree(dest, ignore_errors=True)
            with _stream_tar(iter(bits)) as tar:
                extract_single_tree(tar, dest)
            info = images.RootfsInfo(image, img.id, Path(base_root), dest, env, workdir, labels)
        else:
            dest = rootfs_dir / key
            tmp = rootfs_dir / f"{key}.tmp"
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
            with _stream_tar(iter(container.export())) as tar:
                tar.extractall(tmp, filter="fully_trusted")  # our own image, built just now
            shutil.rmtree(dest, ignore_errors=True)
            tmp.replace(dest)
            info = images.RootfsInfo(image, img.id, dest, None, env, workdir, labels)
    finally:
        container.remove(force=True)
    _write_stamp(info)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--instances",
        type=Path,
        default=images.DEFAULT_INSTANCES,
        help="dataset file of the instances to build images for (default: the mini set)",
    )
    parser.add_argument("--materializer", default=DEFAULT_MATERIALIZER, help="MODULE:FUNCTION")
    parser.add_argument("--no-bwrap", action="store_true", help="skip the bwrap trees")
    parser.add_argument("--force", action="store_true", help="rebuild even if up to date")
    args = parser.parse_args(argv)
    if not args.instances.is_file():
        parser.error(f"instances file not found: {args.instances}")
    started = time.monotonic()
    try:
        instances = load_instances(args.instances)
        client = docker.DockerClient(base_url=images.docker_host(), timeout=600)
        base = images.base_image()
        try:
            base_id = client.images.get(base).id
        except docker.errors.ImageNotFound:
            raise BuildError(
                f"base image {base} missing: run deploy/images/build_base.sh"
            ) from None
        base_root = register_base_rootfs(client, base) if not args.no_bwrap else ""
        build_root = images.cache_dir() / "build"
        built = exported = 0
        for inst in instances:
            image, did_build = build_image(
                client, inst, base, base_id, args.materializer, build_root, force=args.force
            )
            built += did_build
            if not args.no_bwrap:
                exported += build_rootfs(client, image, base_root)
            print(f"{inst.instance_id}: {image} {'built' if did_build else 'up to date'}")
    except (BuildError, docker.errors.DockerException) as exc:
        print(f"build_instances: {exc}", file=sys.stderr)
        return 1
    print(
        f"build_instances: {len(instances)} instances, {built} images built, "
        f"{exported} bwrap trees written, {time.monotonic() - started:.1f}s"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
