"""Task image naming, the bwrap root filesystem registry, and the one build entry point.

Naming follows the SWE-bench harness (``swebench.harness.test_spec.TestSpec.instance_image_key``
with a namespace): ``<namespace>/sweb.eval.<arch>.<instance id, lower-cased, "__" ->
"_1776_">:<tag>``. Production nodes pre-pull the official images under the ``swebench``
namespace (``deploy/images/prepull_swebench.sh``); images built locally for the mini task set use
the ``swerl`` namespace. ``SWERL_IMAGE_NAMESPACE`` switches the default.

bwrap root filesystems: the bwrap backend runs over the *same tree* as the docker image. Each
image the build registers has a JSON stamp ``<cache>/rootfs/<key>.json`` saying where its root
filesystem is and, when the image is the base image plus ``/testbed`` only, where its
``/testbed`` tree is (so the base tree is shared by all instances, see docs/sandboxes.md).

``python -m sandbox_worker.images build [--instances PATH]`` builds everything (base image,
instance images, bwrap root filesystems); it is idempotent and fast when nothing changed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from sandbox_worker.backends.base import ImageNotFoundError

DEFAULT_DOCKER_HOST = "unix:///run/swerl/docker.sock"
DEFAULT_CACHE = "/var/cache/swerl"
DEFAULT_NAMESPACE = "swerl"
DEFAULT_ARCH = "x86_64"
REPO_ROOT = Path(__file__).resolve().parent.parent
IMAGES_DIR = REPO_ROOT / "deploy" / "images"
DEFAULT_INSTANCES = REPO_ROOT / "tests" / "data" / "instances.jsonl"

_INSTANCE_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,200}$")
_TAG_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
_NAMESPACE_RE = re.compile(r"^[a-z0-9]+(?:[._-][a-z0-9]+)*(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)*$")


def docker_host() -> str:
    """The Docker endpoint every swerl component uses (``DOCKER_HOST`` overrides)."""
    return os.environ.get("DOCKER_HOST") or DEFAULT_DOCKER_HOST


def cache_dir() -> Path:
    return Path(os.environ.get("SWERL_CACHE") or DEFAULT_CACHE)


def base_image() -> str:
    return os.environ.get("SWERL_BASE_IMAGE") or "swerl/base:bookworm"


def instance_image(
    instance_id: str,
    *,
    namespace: str | None = None,
    arch: str = DEFAULT_ARCH,
    tag: str = "latest",
) -> str:
    """The image of one task instance, SWE-bench's naming rule under ``namespace``.

    >>> instance_image("django__django-11099", namespace="swebench")
    'swebench/sweb.eval.x86_64.django_1776_django-11099:latest'
    """
    if not isinstance(instance_id, str) or not _INSTANCE_ID_RE.match(instance_id):
        raise ValueError(f"invalid instance id {instance_id!r}")
    ns = namespace if namespace is not None else os.environ.get("SWERL_IMAGE_NAMESPACE")
    ns = ns or DEFAULT_NAMESPACE
    if not _NAMESPACE_RE.match(ns):
        raise ValueError(f"invalid image namespace {ns!r}")
    if arch not in ("x86_64", "arm64"):
        raise ValueError(f"invalid arch {arch!r} (x86_64 or arm64)")
    if not _TAG_RE.match(tag):
        raise ValueError(f"invalid image tag {tag!r}")
    name = instance_id.lower().replace("__", "_1776_")
    return f"{ns}/sweb.eval.{arch}.{name}:{tag}"


def rootfs_key(image: str) -> str:
    """A file-name-safe, collision-free key for an image reference."""
    if not image:
        raise ValueError("empty image reference")
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", image)[:150]
    return f"{safe}-{hashlib.sha256(image.encode()).hexdigest()[:10]}"


@dataclass(frozen=True)
class RootfsInfo:
    """Where the bwrap backend finds an image's tree (written by the image build)."""

    image: str
    image_id: str
    root: Path  # the root filesystem (read-only in sandboxes)
    testbed: Path | None  # the image's /testbed tree when it is not root/testbed
    env: tuple[str, ...]  # the image's ENV, "KEY=value"
    workdir: str

    def to_json(self) -> str:
        return json.dumps(
            {
                "image": self.image,
                "image_id": self.image_id,
                "root": str(self.root),
                "testbed": str(self.testbed) if self.testbed else None,
                "env": list(self.env),
                "workdir": self.workdir,
            },
            indent=1,
        )


def rootfs_stamp(image: str, cache: Path | None = None) -> Path:
    return (cache or cache_dir()) / "rootfs" / f"{rootfs_key(image)}.json"


def rootfs_info(image: str, cache: Path | None = None) -> RootfsInfo:
    """The registered tree of ``image``; :class:`ImageNotFoundError` if it was never built."""
    stamp = rootfs_stamp(image, cache)
    try:
        data = json.loads(stamp.read_text())
    except FileNotFoundError:
        raise ImageNotFoundError(
            f"no bwrap root filesystem for image {image!r} (expected {stamp}); build it with "
            "`python -m sandbox_worker.images build`"
        ) from None
    except (OSError, ValueError) as exc:
        raise ImageNotFoundError(f"unreadable root filesystem stamp {stamp}: {exc}") from exc
    info = RootfsInfo(
        image=data["image"],
        image_id=data["image_id"],
        root=Path(data["root"]),
        testbed=Path(data["testbed"]) if data.get("testbed") else None,
        env=tuple(data.get("env") or ()),
        workdir=data.get("workdir") or "/",
    )
    if not (info.root / "usr").is_dir() or (info.testbed and not info.testbed.is_dir()):
        raise ImageNotFoundError(f"root filesystem of {image!r} is incomplete: {info.root}")
    return info


def build(instances: Path, *, bwrap: bool = True, force: bool = False) -> None:
    """Base image, instance images and bwrap trees; every stage is skipped when up to date."""
    env = {**os.environ, "DOCKER_HOST": docker_host()}
    if force:
        env["FORCE"] = "1"
    subprocess.run(["bash", str(IMAGES_DIR / "build_base.sh")], check=True, env=env)
    cmd = [sys.executable, str(IMAGES_DIR / "build_instances.py"), "--instances", str(instances)]
    if not bwrap:
        cmd.append("--no-bwrap")
    if force:
        cmd.append("--force")
    subprocess.run(cmd, check=True, env=env)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m sandbox_worker.images",
        description="Task images: build the base image, one image per instance and their bwrap "
        "trees on this node's Docker engine ($DOCKER_HOST), or print image names. Images are "
        "never pulled at run time.",
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    p_build = sub.add_parser(
        "build",
        help="build base + instance images + bwrap trees",
        description="Build what is missing or out of date (content-hashed; reruns are fast).",
    )
    p_build.add_argument(
        "--instances",
        type=Path,
        default=DEFAULT_INSTANCES,
        help="SWE-bench-format JSONL of the instances (default: the mini set)",
    )
    p_build.add_argument("--no-bwrap", action="store_true", help="skip the bwrap trees")
    p_build.add_argument("--force", action="store_true", help="rebuild everything")
    p_name = sub.add_parser(
        "name",
        help="print the image name of instance ids",
        description="Print the image each instance id runs in (one per line).",
    )
    p_name.add_argument("instance_ids", nargs="+", help="instance ids, e.g. owner__repo-123")
    p_name.add_argument(
        "--namespace",
        default=None,
        help="image namespace (default: $SWERL_IMAGE_NAMESPACE or swerl)",
    )
    args = parser.parse_args(argv)
    if args.cmd == "name":
        try:
            names = [instance_image(iid, namespace=args.namespace) for iid in args.instance_ids]
        except ValueError as exc:
            parser.error(str(exc))
        print("\n".join(names))
        return 0
    if not args.instances.is_file():
        parser.error(f"instances file not found: {args.instances}")
    try:
        build(args.instances, bwrap=not args.no_bwrap, force=args.force)
    except subprocess.CalledProcessError as exc:
        print(f"image build failed: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
