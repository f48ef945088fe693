"""Build one docker image per task instance, plus its bwrap tree. Run with the project venv.

    python deploy/images/build_instances.py [--instances tests/data/instances.jsonl]

For each instance of a SWE-bench-format JSONL file (``instance_id``, ``repo``, ``base_commit``
required): materialise the repository at its base commit into a build context (outside the
docker data root), then ``docker build`` (the classic builder through the docker SDK, never
pulling) an image ``FROM swerl/base:bookworm`` with the repository at ``/testbed``, labelled with
a content hash. An optional ``setup_commands`` list (shell commands) becomes ``RUN`` steps that
install the instance's dependencies.

Idempotent: an image whose ``swerl.content_hash`` label matches is not rebuilt, and a bwrap tree
whose stamp names the current image id is not re-exported.

bwrap trees (see docs/sandboxes.md): an image that is the base image plus ``/testbed`` only
shares the base root filesystem (the debootstrap dir the base image was imported from) and gets
its own copy of ``/testbed``, taken from the built image; an image with ``RUN`` steps is exported
whole.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import importlib
import json
import shutil
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

# Bump when the Dockerfile recipe below changes: every image is then rebuilt once.
RECIPE_VERSION = "1"
DEFAULT_MATERIALIZER = "sandbox_worker.tasks.repos:materialize_repo"
REQUIRED_FIELDS = ("instance_id", "repo", "base_commit")

Materializer = Callable[[str, Path], str]


class BuildError(RuntimeError):
    """An instance image could not be built; the message names the instance."""


@dataclass(frozen=True)
class Instance:
    instance_id: str
    repo: str
    base_commit: str
    setup_commands: tuple[str, ...]


def load_instances(path: Path) -> list[Instance]:
    out: list[Instance] = []
    seen: set[str] = set()
    for lineno, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            raise BuildError(f"{path}:{lineno}: not valid JSON: {exc}") from None
        if not isinstance(rec, dict):
            raise BuildError(f"{path}:{lineno}: expected a JSON object")
        missing = [f for f in REQUIRED_FIELDS if not isinstance(rec.get(f), str) or not rec[f]]
        if missing:
            raise BuildError(f"{path}:{lineno}: missing or empty field(s): {', '.join(missing)}")
        setup = rec.get("setup_commands") or []
        if not isinstance(setup, list) or not all(isinstance(c, str) for c in setup):
            raise BuildError(f"{path}:{lineno}: setup_commands must be a list of strings")
        if rec["instance_id"] in seen:
            raise BuildError(f"{path}:{lineno}: duplicate instance_id {rec['instance_id']}")
        seen.add(rec["instance_id"])
        out.append(Instance(rec["instance_id"], rec["repo"], rec["base_commit"], tuple(setup)))
    if not out:
        raise BuildError(f"{path}: no instances")
    return out


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
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()


def dockerfile(inst: Instance, base: str) -> str:
    lines = [f"FROM {base}", "COPY testbed /testbed", "WORKDIR /testbed"]
    lines += [f"RUN {cmd}" for cmd in inst.setup_commands]
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
        commit = load_materializer(materializer)(inst.repo, ctx / "testbed")
        if commit != inst.base_commit:
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
            "swerl.has_setup": "1" if inst.setup_commands else "0",
        }
        try:
            client.images.build(
                path=str(ctx), tag=image, pull=False, rm=True, forcerm=True, labels=labels
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


def _stamp_current(image: str, image_id: str) -> bool:
    try:
        info = images.rootfs_info(image)
    except images.ImageNotFoundError:
        return False
    return info.image_id == image_id


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
    if _stamp_current(image, img.id):
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
            info = images.RootfsInfo(image, img.id, Path(base_root), dest, env, workdir)
        else:
            dest = rootfs_dir / key
            tmp = rootfs_dir / f"{key}.tmp"
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
            with _stream_tar(iter(container.export())) as tar:
                tar.extractall(tmp, filter="fully_trusted")  # our own image, built just now
            shutil.rmtree(dest, ignore_errors=True)
            tmp.replace(dest)
            info = images.RootfsInfo(image, img.id, dest, None, env, workdir)
    finally:
        container.remove(force=True)
    _write_stamp(info)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--instances", type=Path, default=images.DEFAULT_INSTANCES)
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
